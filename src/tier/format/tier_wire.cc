// TeRM tiered memory wire codec (tier_wire.h): encoders and the checks every decoder makes before
// a byte of a request is trusted. Pure functions, any thread.
#include "tier/format/tier_wire.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace farmem::tier {
namespace {

template <typename T>
void Append(std::vector<std::byte>& out, const T& v) {
  static_assert(std::is_trivially_copyable_v<T>);
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

template <typename T>
T Load(std::span<const std::byte> bytes) {
  T v;
  std::memcpy(&v, bytes.data(), sizeof(T));
  return v;
}

std::string N(uint64_t v) {
  return std::to_string(v);
}

Status CheckLength(const char* op, uint64_t length, uint64_t max_length) {
  if (length == 0) return Status::InvalidArgument(std::string(op) + ": length must be at least 1");
  if (length > max_length) {
    return Status::InvalidArgument(std::string(op) + ": length " + N(length) +
                                   " exceeds the largest request of " + N(max_length) + " bytes");
  }
  return Status::OK();
}

}  // namespace

std::vector<std::byte> EncodeTierInfoReply(const TierInfoReply& info) {
  std::vector<std::byte> out;
  Append(out, info);
  return out;
}

std::vector<std::byte> EncodeTierReadRequest(uint64_t offset, uint32_t length,
                                             std::span<const uint64_t> mask) {
  std::vector<std::byte> out;
  out.reserve(sizeof(TierReadHead) + mask.size_bytes());
  Append(out, TierReadHead{offset, length, static_cast<uint32_t>(mask.size())});
  for (uint64_t w : mask) Append(out, w);
  return out;
}

std::vector<std::byte> EncodeTierWriteRequest(uint64_t offset, std::span<const std::byte> data) {
  std::vector<std::byte> out;
  out.reserve(sizeof(TierWriteHead) + data.size());
  Append(out, TierWriteHead{offset, static_cast<uint32_t>(data.size()), 0});
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<std::byte> EncodeTierCounters(std::span<const TierCounterEntry> entries) {
  std::vector<std::byte> out;
  out.reserve(sizeof(TierCountersHead) + entries.size_bytes());
  Append(out, TierCountersHead{static_cast<uint32_t>(entries.size()), 0});
  for (const TierCounterEntry& e : entries) Append(out, e);
  return out;
}

Result<TierInfoReply> DecodeTierInfoReply(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(TierInfoReply)) {
    return Status::Protocol("TIER_INFO reply must be " + N(sizeof(TierInfoReply)) + " bytes, got " +
                            N(bytes.size()));
  }
  const auto r = Load<TierInfoReply>(bytes);
  if (r.reserved[0] != 0 || r.reserved[1] != 0 || r.reserved[2] != 0) {
    return Status::Protocol("TIER_INFO reply: reserved bytes must be 0");
  }
  if (r.mode > static_cast<uint8_t>(TierWireMode::kFull)) {
    return Status::Protocol("TIER_INFO reply: unknown mode " + N(r.mode));
  }
  Result<TierGeometry> g = TierGeometry::Make(r.geometry.capacity, r.geometry.unit_size);
  if (!g.ok()) return Status::Protocol("TIER_INFO reply: " + std::string(g.status().message()));
  if (std::memcmp(&*g, &r.geometry, sizeof(TierGeometry)) != 0) {
    return Status::Protocol("TIER_INFO reply: derived geometry fields disagree with capacity " +
                            N(r.geometry.capacity) + " and unit " + N(r.geometry.unit_size));
  }
  if (!IsValidMagic(r.magic_word)) {
    return Status::Protocol("TIER_INFO reply: invalid pattern word");
  }
  const bool has_bitmap = r.mode == static_cast<uint8_t>(TierWireMode::kFull);
  if (has_bitmap ? r.bitmap_bytes != g->bitmap_bytes() : r.bitmap_bytes != 0) {
    return Status::Protocol("TIER_INFO reply: bitmap of " + N(r.bitmap_bytes) +
                            " bytes, geometry needs " + N(has_bitmap ? g->bitmap_bytes() : 0));
  }
  if (r.period_ms == 0) return Status::Protocol("TIER_INFO reply: period 0");
  return r;
}

Result<TierReadRequest> DecodeTierReadRequest(std::span<const std::byte> bytes,
                                              const TierGeometry& geo, uint64_t max_length) {
  if (bytes.size() < sizeof(TierReadHead)) {
    return Status::Protocol("TIER_READ request must be at least " + N(sizeof(TierReadHead)) +
                            " bytes, got " + N(bytes.size()));
  }
  const auto h = Load<TierReadHead>(bytes);
  const uint64_t body = bytes.size() - sizeof(TierReadHead);
  if (body != uint64_t{h.mask_words} * kWordBytes) {
    return Status::Protocol("TIER_READ request: " + N(h.mask_words) + " mask words announced, " +
                            N(body) + " bytes follow");
  }
  FARMEM_RETURN_IF_ERROR(CheckLength("TIER_READ", h.length, max_length));
  FARMEM_RETURN_IF_ERROR(geo.CheckRange(h.offset, h.length));
  const uint64_t want = MaskWords(PagesSpanned(h.offset, h.length));
  if (h.mask_words != want) {
    return Status::Protocol("TIER_READ request: page mask of " + N(h.mask_words) +
                            " words, the range needs " + N(want));
  }
  TierReadRequest r;
  r.offset = h.offset;
  r.length = h.length;
  r.mask.resize(h.mask_words);
  if (h.mask_words != 0) {
    std::memcpy(r.mask.data(), bytes.data() + sizeof(TierReadHead), body);
  }
  if (Status st = CheckPageMask(r.offset, r.length, r.mask); !st.ok()) {
    return st.WithContext("TIER_READ request");
  }
  return r;
}

Result<TierWriteRequest> DecodeTierWriteRequest(std::span<const std::byte> bytes,
                                                const TierGeometry& geo, uint64_t max_length) {
  if (bytes.size() < sizeof(TierWriteHead)) {
    return Status::Protocol("TIER_WRITE request must be at least " + N(sizeof(TierWriteHead)) +
                            " bytes, got " + N(bytes.size()));
  }
  const auto h = Load<TierWriteHead>(bytes);
  if (h.reserved != 0) return Status::Protocol("TIER_WRITE request: reserved field must be 0");
  const uint64_t body = bytes.size() - sizeof(TierWriteHead);
  if (body != h.length) {
    return Status::Protocol("TIER_WRITE request: length " + N(h.length) + ", " + N(body) +
                            " bytes follow");
  }
  FARMEM_RETURN_IF_ERROR(CheckLength("TIER_WRITE", h.length, max_length));
  FARMEM_RETURN_IF_ERROR(geo.CheckRange(h.offset, h.length));
  return TierWriteRequest{h.offset, bytes.subspan(sizeof(TierWriteHead))};
}

Result<std::vector<TierCounterEntry>> DecodeTierCounters(std::span<const std::byte> bytes,
                                                         uint64_t unit_count) {
  if (bytes.size() < sizeof(TierCountersHead)) {
    return Status::Protocol("TIER_COUNTERS request must be at least " +
                            N(sizeof(TierCountersHead)) + " bytes, got " + N(bytes.size()));
  }
  const auto h = Load<TierCountersHead>(bytes);
  if (h.reserved != 0) return Status::Protocol("TIER_COUNTERS request: reserved field must be 0");
  const uint64_t body = bytes.size() - sizeof(TierCountersHead);
  if (body != uint64_t{h.entries} * sizeof(TierCounterEntry)) {
    return Status::Protocol("TIER_COUNTERS request: " + N(h.entries) + " entries announced, " +
                            N(body) + " bytes follow");
  }
  std::vector<TierCounterEntry> out(h.entries);
  if (h.entries != 0) std::memcpy(out.data(), bytes.data() + sizeof(TierCountersHead), body);
  for (const TierCounterEntry& e : out) {
    if (e.unit >= unit_count) {
      return Status::OutOfRange("TIER_COUNTERS request: unit " + N(e.unit) +
                                " outside the region's " + N(unit_count) + " units");
    }
  }
  return out;
}

uint64_t TierReadReplyBytes(uint64_t offset, uint64_t length, std::span<const uint64_t> mask) {
  if (length == 0) return 0;
  const uint64_t first = offset / kPageSize;
  const uint64_t pages = PagesSpanned(offset, length);
  const uint64_t end = offset + length;
  uint64_t n = 0;
  for (uint64_t i = 0; i < pages; ++i) {
    if (i / kBitsPerWord >= mask.size()) break;
    if ((mask[i / kBitsPerWord] >> (i % kBitsPerWord) & 1) == 0) continue;
    const uint64_t lo = std::max(offset, (first + i) * kPageSize);
    const uint64_t hi = std::min(end, (first + i + 1) * kPageSize);
    n += hi - lo;
  }
  return n;
}

}  // namespace farmem::tier
