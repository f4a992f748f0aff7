// Wire format of the native TCP transport: every frame exchanged between an initiator Context and a
// target's NIC thread. Packed little-endian structs; docs/wire-format.md documents each frame.
// Invariant: a frame is FrameHeader + `body_len` bytes; the body starts with the opcode's fixed
// part.
#pragma once

#include <bit>
#include <cstdint>

namespace farmem::tcpwire {

static_assert(std::endian::native == std::endian::little,
              "the TCP wire format is little-endian and is copied to/from memory as-is");

// "FMEM" as bytes on the wire ('F','M','E','M').
inline constexpr uint32_t kMagic = 0x4D454D46u;
inline constexpr uint16_t kVersion = 1;

// Limits every decoder enforces before buffering a frame, so a peer cannot make us allocate more.
inline constexpr uint32_t kMaxTokenBytes = 256;
inline constexpr uint32_t kMaxErrorMessageBytes = 1024;
// Largest READ/WRITE data length and largest RPC payload the wire can carry.
inline constexpr uint32_t kMaxIoBytes = 16u << 20;
inline constexpr uint32_t kMaxRpcBytes = 16u << 20;
// Largest body of any frame: the biggest fixed part plus the biggest variable part.
inline constexpr uint32_t kMaxFrameBody = kMaxIoBytes + 64;

enum class Opcode : uint8_t {
  // Initiator -> target.
  kHello = 1,  // first frame of every connection: magic, version, cluster token
  kRead = 2,
  kWrite = 3,
  kCompareSwap = 4,
  kFetchAdd = 5,
  kRpc = 6,
  // Target -> initiator.
  kReadResp = 16,    // body = the data
  kWriteResp = 17,   // empty body; sent for writes with kFlagDeliveryAck
  kAtomicResp = 18,  // body = AtomicResp
  kRpcResp = 19,     // body = RpcHeader + reply payload
  kError = 20,       // header.code = farmem::Code, body = UTF-8 message; seq 0 = whole connection
};

// FrameHeader::flags bits.
inline constexpr uint8_t kFlagDeliveryAck = 0x01;  // WRITE: answer with kWriteResp once applied

struct [[gnu::packed]] FrameHeader {
  uint32_t body_len;  // bytes after this header
  uint8_t opcode;     // Opcode
  uint8_t flags;      // kFlag* bits; 0 unless stated
  uint16_t code;      // kError: a farmem::Code (never kOk); 0 in every other frame
  uint64_t seq;  // chosen by the initiator, echoed in the response; 0 only for hello/conn errors
};
static_assert(sizeof(FrameHeader) == 16);

struct [[gnu::packed]] HelloBody {
  uint32_t magic;      // kMagic
  uint16_t version;    // kVersion
  uint16_t token_len;  // cluster token bytes that follow, <= kMaxTokenBytes
};
static_assert(sizeof(HelloBody) == 8);

struct [[gnu::packed]] ReadReq {
  uint64_t key;     // RegionKey
  uint64_t offset;  // from the region start
  uint32_t length;  // <= kMaxIoBytes
  uint32_t reserved;
};
static_assert(sizeof(ReadReq) == 24);

// Followed by the data (body_len - sizeof(WriteReq) bytes, <= kMaxIoBytes).
struct [[gnu::packed]] WriteReq {
  uint64_t key;
  uint64_t offset;
};
static_assert(sizeof(WriteReq) == 16);

// CAS: operand = expected, operand2 = desired. FAA: operand = addend, operand2 = 0.
struct [[gnu::packed]] AtomicReq {
  uint64_t key;
  uint64_t offset;  // absolute address must be 8-byte aligned
  uint64_t operand;
  uint64_t operand2;
};
static_assert(sizeof(AtomicReq) == 32);

struct [[gnu::packed]] AtomicResp {
  uint64_t old_value;
};
static_assert(sizeof(AtomicResp) == 8);

// Starts both RPC request and RPC reply bodies; the payload follows.
struct [[gnu::packed]] RpcHeader {
  uint32_t imm;
  uint32_t reserved;
};
static_assert(sizeof(RpcHeader) == 8);

}  // namespace farmem::tcpwire
