// Wire format of the object (CoRM) RPCs between ObjectClient and farmemd: opcodes and the
// fixed-size request/reply structs (documented in docs/objects.md, "RPC wire format").
// All integers little-endian; structs travel as raw bytes, so their layout is pinned below.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "farmem/node.h"
#include "farmem/objects.h"

namespace farmem::object_wire {

// The objects service owns kObjectsOpcodes (farmem/opcodes.h).
inline constexpr uint16_t kOpInfo = kObjectsOpcodes.first + 0;    // -> InfoReply + classes
inline constexpr uint16_t kOpAlloc = kObjectsOpcodes.first + 1;   // AllocRequest -> PtrReply
inline constexpr uint16_t kOpFree = kObjectsOpcodes.first + 2;    // PtrRequest -> empty
inline constexpr uint16_t kOpRead = kObjectsOpcodes.first + 3;    // ReadRequest -> PtrReply + bytes
inline constexpr uint16_t kOpWrite = kObjectsOpcodes.first + 4;   // PtrRequest + bytes -> PtrReply
inline constexpr uint16_t kOpLocate = kObjectsOpcodes.first + 5;  // PtrRequest -> PtrReply
inline constexpr uint16_t kOpRelease = kObjectsOpcodes.first + 6;  // PtrRequest -> PtrReply
inline constexpr uint16_t kOpCompact = kObjectsOpcodes.first + 7;  // CompactRequest -> JSON text
inline constexpr uint16_t kLastObjectsOpcode = kObjectsOpcodes.last;

// A pointer as the server sees it: slot offset inside the object region, ID, size class and
// generation (which allocation of the slot it names; docs/objects.md, "Pointer identity").
// (The client's Ptr::server and flags are client-side only and never sent.)
struct WirePtr {
  uint64_t offset;
  uint16_t id;
  uint16_t size_class;  // < corm::kMaxSizeClasses (Ptr::size_class is 8 bits)
  uint16_t gen;
  uint16_t reserved;  // 0
};
static_assert(sizeof(WirePtr) == 16 && std::is_trivially_copyable_v<WirePtr>);

// OBJ_INFO reply: this header, then `num_classes` WireClass entries.
struct InfoReply {
  uint64_t region_key;
  uint64_t region_length;
  uint32_t block_size;  // base block: every block is a whole number of them
  uint8_t id_bits;
  uint8_t hybrid;  // 0/1
  uint16_t num_classes;
};
struct WireClass {
  uint32_t slot_size;
  uint32_t payload_capacity;
  uint32_t id_mask;      // 0 = offset-only class
  uint32_t block_bytes;  // the class's blocks: a multiple of block_size (corm::SizeClass)
};
static_assert(sizeof(InfoReply) == 24 && std::is_trivially_copyable_v<InfoReply>);
static_assert(sizeof(WireClass) == 16 && std::is_trivially_copyable_v<WireClass>);

// OBJ_ALLOC: an object of `size` bytes owned by the client session `session_id` (SESSION_OPEN:
// freed when the session ends) or persistent when 0 (docs/sessions.md). Unknown or expired
// session: NotFound.
struct AllocRequest {
  uint64_t size;
  uint64_t session_id;
};
static_assert(sizeof(AllocRequest) == 16 && std::is_trivially_copyable_v<AllocRequest>);

// FREE, LOCATE, RELEASE: exactly this; WRITE: this followed by the object bytes.
struct PtrRequest {
  WirePtr ptr;
};
static_assert(sizeof(PtrRequest) == 16);

struct ReadRequest {
  WirePtr ptr;
  uint32_t max_bytes;  // copy at most this many payload bytes
  uint32_t reserved;   // 0
};
static_assert(sizeof(ReadRequest) == 24 && std::is_trivially_copyable_v<ReadRequest>);

// ALLOC, WRITE, LOCATE, RELEASE reply: exactly this; READ reply: this followed by the bytes.
struct PtrReply {
  WirePtr ptr;  // the (corrected / new) pointer
};
static_assert(sizeof(PtrReply) == 16);

inline constexpr uint16_t kAllClasses = 0xffff;
struct CompactRequest {
  uint16_t size_class;  // kAllClasses or one class
  uint16_t reserved[3];
};
static_assert(sizeof(CompactRequest) == 8 && std::is_trivially_copyable_v<CompactRequest>);

inline WirePtr ToWire(const Ptr& p) {
  return WirePtr{p.offset, p.id, p.size_class, p.gen, 0};
}

}  // namespace farmem::object_wire
