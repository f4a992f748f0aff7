// RPC opcode ranges: one per node layer and per farmemd service, written down once so that two
// services never collide. A service registers only opcodes inside its own range (ServiceHost
// refuses anything else); the wire headers of each design define their opcodes as first + n.
#pragma once

#include <cstdint>

namespace farmem {

// An inclusive range of RPC opcodes [first, last].
struct OpcodeRange {
  uint16_t first = 0;
  uint16_t last = 0;
  constexpr bool contains(uint16_t opcode) const { return opcode >= first && opcode <= last; }
};

// Opcodes 1..31 belong to the node itself (kOpListRegions, ...); everything from here up is for
// layers above the node. Node::register_rpc refuses lower ones.
inline constexpr uint16_t kFirstUserOpcode = 32;

inline constexpr OpcodeRange kNodeOpcodes{1, kFirstUserOpcode - 1};
inline constexpr OpcodeRange kServerOpcodes{32, 63};     // farmemd's own (STAT, SESSION_*)
inline constexpr OpcodeRange kPoolsOpcodes{64, 79};      // raw pools: ALLOC_RAW, FREE_RAW
inline constexpr OpcodeRange kObjectsOpcodes{80, 111};   // CoRM objects
inline constexpr OpcodeRange kTierOpcodes{112, 127};     // TeRM tiered memory
inline constexpr OpcodeRange kTxOpcodes{128, 159};       // Storm transactions
inline constexpr OpcodeRange kChannelOpcodes{160, 191};  // LOCO channels
inline constexpr OpcodeRange kRegionsOpcodes{192, 223};  // remote regions

// Node-internal opcode: list this node's exported regions (reply: the bootstrap region list).
inline constexpr uint16_t kOpListRegions = kNodeOpcodes.first;
// farmemd's STAT: empty request; the reply is UTF-8 JSON text (docs/server.md). Every farmemd
// answers it whichever services it runs.
inline constexpr uint16_t kOpStat = kServerOpcodes.first;
// Client sessions (docs/sessions.md; wire structs in src/node/session_wire.h): an allocation
// made inside a session is freed when the session ends (closed, or its lease ran out).
inline constexpr uint16_t kOpSessionOpen = kServerOpcodes.first + 1;
inline constexpr uint16_t kOpSessionKeepalive = kServerOpcodes.first + 2;
inline constexpr uint16_t kOpSessionClose = kServerOpcodes.first + 3;

static_assert(kNodeOpcodes.last < kServerOpcodes.first);
static_assert(kServerOpcodes.last < kPoolsOpcodes.first);
static_assert(kPoolsOpcodes.last < kObjectsOpcodes.first);
static_assert(kObjectsOpcodes.last < kTierOpcodes.first);
static_assert(kTierOpcodes.last < kTxOpcodes.first);
static_assert(kTxOpcodes.last < kChannelOpcodes.first);
static_assert(kChannelOpcodes.last < kRegionsOpcodes.first);

}  // namespace farmem
