// Pools service RPC wire format: opcodes and fixed-size request/reply structs of ALLOC_RAW and
// FREE_RAW, and farmemd's STAT (documented in docs/server.md). All integers are little-endian;
// structs are sent as raw bytes (memcpy), so their layout is pinned by the static_asserts below.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include "common/wire_struct.h"
#include "farmem/node.h"

namespace farmem::server_proto {

static_assert(std::endian::native == std::endian::little, "farmem wire format is little-endian");

// The pools service owns kPoolsOpcodes (farmem/opcodes.h). STAT is farmemd's own (kOpStat there).
inline constexpr uint16_t kOpAllocRaw = kPoolsOpcodes.first + 0;
inline constexpr uint16_t kOpFreeRaw = kPoolsOpcodes.first + 1;
inline constexpr uint16_t kOpStat = ::farmem::kOpStat;

// ALLOC_RAW: reserve `length` bytes (rounded up to 64) in some pool, owned by the client session
// `session_id` (SESSION_OPEN, node/session_wire.h: freed when the session ends) or persistent
// when it is 0 (docs/sessions.md). An unknown or expired session is NotFound.
struct AllocRawRequest {
  uint64_t length;
  uint64_t session_id;
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

static_assert(sizeof(AllocRawRequest) == 16 && std::is_trivially_copyable_v<AllocRawRequest>);
static_assert(sizeof(AllocRawReply) == 24 && std::is_trivially_copyable_v<AllocRawReply>);
static_assert(sizeof(FreeRawRequest) == 16 && std::is_trivially_copyable_v<FreeRawRequest>);
static_assert(sizeof(FreeRawReply) == 8 && std::is_trivially_copyable_v<FreeRawReply>);

// The shared raw-struct codec (common/wire_struct.h) under this header's names.
template <typename T>
std::vector<std::byte> Encode(const T& msg) {
  return EncodeStruct(msg);
}
template <typename T>
std::optional<T> Decode(std::span<const std::byte> bytes) {
  return DecodeStruct<T>(bytes);
}

}  // namespace farmem::server_proto
