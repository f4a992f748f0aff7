// TeRM tiered memory RPC wire format (opcodes kTierOpcodes of farmem/opcodes.h): TIER_INFO,
// TIER_READ (sparse fetch), TIER_WRITE, TIER_COUNTERS; encoders and the decoders both sides run.
// Pure functions, no threads. Documented in docs/wire-format.md ("Tiered memory"); keep in step.
//
// All integers little-endian; fixed parts are sent as raw structs (static_asserts pin them).
//   TIER_INFO      request empty; reply TierInfoReply.
//   TIER_READ      request TierReadHead + mask_words x uint64 (page mask of [offset, offset +
//                  length), tier_layout.h); reply: for every set page, in ascending order, the
//                  bytes of that page inside [offset, offset + length) (nothing else).
//   TIER_WRITE     request TierWriteHead + length bytes; reply empty.
//   TIER_COUNTERS  request TierCountersHead + entries x TierCounterEntry (unit, accesses since
//                  the last push); reply empty.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "farmem/opcodes.h"
#include "farmem/status.h"
#include "tier/format/tier_layout.h"

namespace farmem::tier {

static_assert(std::endian::native == std::endian::little, "farmem wire format is little-endian");

inline constexpr uint16_t kOpTierInfo = kTierOpcodes.first + 0;
inline constexpr uint16_t kOpTierRead = kTierOpcodes.first + 1;
inline constexpr uint16_t kOpTierWrite = kTierOpcodes.first + 2;
inline constexpr uint16_t kOpTierCounters = kTierOpcodes.first + 3;
static_assert(kOpTierCounters <= kTierOpcodes.last);

// Largest TIER_READ / TIER_WRITE range (the transport's max_rpc_bytes may bound it further).
inline constexpr uint64_t kMaxTierIoBytes = uint64_t{1} << 20;

// The ablation ladder (docs/tier.md "Modes"); the numeric values are on the wire.
enum class TierWireMode : uint8_t {
  kRpc = 0,
  kRpcDirect = 1,
  kTiering = 2,
  kHotspot = 3,
  kFull = 4
};

struct TierInfoReply {
  TierGeometry geometry;  // 48 bytes
  uint64_t magic_word;    // the pattern every 8-aligned word of a cold page reads as
  uint64_t data_key;      // region key of [0, capacity) (read-only); 0 in the rpc modes
  uint64_t bitmap_key;    // region key of the page bitmap; 0 when the mode has no bitmap
  uint64_t bitmap_bytes;  // bytes a client pulls (geometry.bitmap_words * 8) ; 0 without bitmap
  uint32_t period_ms;     // server period: bitmap pulls and counter pushes
  uint8_t mode;           // TierWireMode
  uint8_t reserved[3];    // 0
};
static_assert(sizeof(TierInfoReply) == 48 + 4 * 8 + 8 &&
              std::is_trivially_copyable_v<TierInfoReply>);

struct TierReadHead {
  uint64_t offset;
  uint32_t length;      // 1 .. kMaxTierIoBytes
  uint32_t mask_words;  // == MaskWords(PagesSpanned(offset, length))
};
static_assert(sizeof(TierReadHead) == 16 && std::is_trivially_copyable_v<TierReadHead>);

struct TierWriteHead {
  uint64_t offset;
  uint32_t length;    // == bytes that follow, 1 .. kMaxTierIoBytes
  uint32_t reserved;  // 0
};
static_assert(sizeof(TierWriteHead) == 16 && std::is_trivially_copyable_v<TierWriteHead>);

struct TierCountersHead {
  uint32_t entries;   // TierCounterEntry that follow
  uint32_t reserved;  // 0
};
static_assert(sizeof(TierCountersHead) == 8 && std::is_trivially_copyable_v<TierCountersHead>);

struct TierCounterEntry {
  uint32_t unit;   // < geometry.unit_count
  uint32_t count;  // accesses since the last push
};
static_assert(sizeof(TierCounterEntry) == 8 && std::is_trivially_copyable_v<TierCounterEntry>);

// ---- decoded views ----------------------------------------------------------------------------

struct TierReadRequest {
  uint64_t offset = 0;
  uint32_t length = 0;
  std::vector<uint64_t> mask;
};
struct TierWriteRequest {
  uint64_t offset = 0;
  std::span<const std::byte> data;  // points into the request
};

// ---- encoders -----------------------------------------------------------------------------------

std::vector<std::byte> EncodeTierInfoReply(const TierInfoReply& info);
std::vector<std::byte> EncodeTierReadRequest(uint64_t offset, uint32_t length,
                                             std::span<const uint64_t> mask);
std::vector<std::byte> EncodeTierWriteRequest(uint64_t offset, std::span<const std::byte> data);
std::vector<std::byte> EncodeTierCounters(std::span<const TierCounterEntry> entries);

// ---- decoders (every malformed input is a clear error, never a crash) --------------------------

// Protocol on a wrong size, reserved bytes, an unknown mode, a geometry TierGeometry::Make would
// not derive, an invalid pattern, or a bitmap size that disagrees with the geometry.
Result<TierInfoReply> DecodeTierInfoReply(std::span<const std::byte> bytes);
// Protocol on a short request or a mask size that disagrees with mask_words or the range;
// InvalidArgument on length 0, a length above max_length or bits past the last page;
// OutOfRange when the range is outside the region (incl. overflowing sums).
Result<TierReadRequest> DecodeTierReadRequest(std::span<const std::byte> bytes,
                                              const TierGeometry& geo, uint64_t max_length);
// Protocol on a short request, reserved bytes or a length that disagrees with the bytes sent;
// InvalidArgument / OutOfRange as for reads.
Result<TierWriteRequest> DecodeTierWriteRequest(std::span<const std::byte> bytes,
                                                const TierGeometry& geo, uint64_t max_length);
// Protocol on a size that disagrees with `entries` or reserved bytes; OutOfRange on a unit >=
// unit_count.
Result<std::vector<TierCounterEntry>> DecodeTierCounters(std::span<const std::byte> bytes,
                                                         uint64_t unit_count);

// Bytes of a TIER_READ reply: for each set page of `mask`, that page's part of [offset, offset +
// length). The caller has checked the mask (CheckPageMask).
uint64_t TierReadReplyBytes(uint64_t offset, uint64_t length, std::span<const uint64_t> mask);

}  // namespace farmem::tier
