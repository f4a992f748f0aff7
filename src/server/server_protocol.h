// farmemd RPC wire format: opcodes and fixed-size request/reply structs of ALLOC_RAW, FREE_RAW and
// STAT (documented in docs/server.md). All integers are little-endian; structs are sent as raw
// bytes (memcpy), so their layout is pinned by the static_asserts below.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "farmem/node.h"

namespace farmem::server_proto {

static_assert(std::endian::native == std::endian::little, "farmem wire format is little-endian");

// The memory server owns opcodes [kServerOpcodeBase, kServerOpcodeBase + 16) (see node.h).
inline constexpr uint16_t kOpAllocRaw = kServerOpcodeBase + 0;
inline constexpr uint16_t kOpFreeRaw = kServerOpcodeBase + 1;
inline constexpr uint16_t kOpStat = kServerOpcodeBase + 2;
inline constexpr uint16_t kLastServerOpcode = kServerOpcodeBase + 15;

// ALLOC_RAW: reserve `length` bytes (rounded up to 64) in some pool.
struct AllocRawRequest {
  uint64_t length;
};
struct AllocRawReply {
  uint64_t key;     // region key of the pool holding the range
  uint64_t offset;  // start of the range inside that pool (64-byte aligned)
  uint64_t length;  // usable length granted (>= requested)
};

// FREE_RAW: release the allocation that starts at `offset` of the pool with `key`.
struct FreeRawRequest {
  uint64_t key;
  uint64_t offset;
};
struct FreeRawReply {
  uint64_t length;  // bytes released
};

// STAT: empty request; the reply is UTF-8 JSON text (see docs/server.md for the keys).
inline constexpr size_t kStatRequestSize = 0;

static_assert(sizeof(AllocRawRequest) == 8 && std::is_trivially_copyable_v<AllocRawRequest>);
static_assert(sizeof(AllocRawReply) == 24 && std::is_trivially_copyable_v<AllocRawReply>);
static_assert(sizeof(FreeRawRequest) == 16 && std::is_trivially_copyable_v<FreeRawRequest>);
static_assert(sizeof(FreeRawReply) == 8 && std::is_trivially_copyable_v<FreeRawReply>);

// Encode a wire struct into bytes.
template <typename T>
std::vector<std::byte> Encode(const T& msg) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<std::byte> out(sizeof(T));
  std::memcpy(out.data(), &msg, sizeof(T));
  return out;
}

// Decode bytes that must be exactly one T (nullopt when the size is wrong: a malformed message).
template <typename T>
std::optional<T> Decode(std::span<const std::byte> bytes) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (bytes.size() != sizeof(T)) return std::nullopt;
  T msg;
  std::memcpy(&msg, bytes.data(), sizeof(T));
  return msg;
}

}  // namespace farmem::server_proto
