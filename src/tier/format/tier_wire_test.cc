// Tests of the TIER_* wire codec (tier_wire.h): round trips, and every kind of malformed input
// (short bodies, mask sizes, bits past the range, lengths, overflowing ranges, unknown units,
// reserved bytes, bad TIER_INFO replies) refused with the documented code. Single-threaded.
#include "tier/format/tier_wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <limits>

namespace farmem::tier {
namespace {

TierGeometry Geo() {
  auto g = TierGeometry::Make(uint64_t{1} << 20, 64 << 10);  // 16 units, 256 pages
  EXPECT_TRUE(g.ok());
  return *g;
}

template <typename T>
std::vector<std::byte> Raw(const T& v) {
  std::vector<std::byte> out(sizeof(T));
  std::memcpy(out.data(), &v, sizeof(T));
  return out;
}

TEST(TierWire, ReadRequestRoundTripsAndReplySizeCountsOnlyMaskedPages) {
  const TierGeometry g = Geo();
  // [4000, +5000): pages 0, 1, 2 (4000..4095, 4096..8191, 8192..8999).
  std::vector<uint64_t> mask = {0b101};
  auto bytes = EncodeTierReadRequest(4000, 5000, mask);
  auto r = DecodeTierReadRequest(bytes, g, kMaxTierIoBytes);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->offset, 4000u);
  EXPECT_EQ(r->length, 5000u);
  EXPECT_EQ(r->mask, mask);
  EXPECT_EQ(TierReadReplyBytes(4000, 5000, mask), 96u + 808u);
  EXPECT_EQ(TierReadReplyBytes(4000, 5000, std::vector<uint64_t>{0b111}), 5000u);
}

TEST(TierWire, ReadRequestRejectsMalformedInput) {
  const TierGeometry g = Geo();
  std::vector<uint64_t> one = {1};
  // Shorter than the head.
  auto bytes = EncodeTierReadRequest(0, 10, one);
  EXPECT_EQ(DecodeTierReadRequest(std::span(bytes).first(15), g, kMaxTierIoBytes).status().code(),
            Code::kProtocol);
  // Mask words announced but not sent, and the other way round.
  bytes.pop_back();
  EXPECT_EQ(DecodeTierReadRequest(bytes, g, kMaxTierIoBytes).status().code(), Code::kProtocol);
  TierReadHead h{0, 10, 2};
  auto two = Raw(h);
  two.resize(two.size() + 16);
  EXPECT_EQ(DecodeTierReadRequest(two, g, kMaxTierIoBytes).status().code(), Code::kProtocol);
  // Mask size that disagrees with the range (1 page needs 1 word, 65 pages need 2).
  EXPECT_EQ(
      DecodeTierReadRequest(EncodeTierReadRequest(0, 65 * 4096, one), g, 1 << 20).status().code(),
      Code::kProtocol);
  // A bit past the last page.
  EXPECT_EQ(DecodeTierReadRequest(EncodeTierReadRequest(0, 10, std::vector<uint64_t>{0b10}), g,
                                  kMaxTierIoBytes)
                .status()
                .code(),
            Code::kInvalidArgument);
  // Length 0, above the limit.
  EXPECT_EQ(
      DecodeTierReadRequest(EncodeTierReadRequest(0, 0, {}), g, kMaxTierIoBytes).status().code(),
      Code::kInvalidArgument);
  EXPECT_EQ(DecodeTierReadRequest(EncodeTierReadRequest(0, 8192, std::vector<uint64_t>{3}), g, 4096)
                .status()
                .code(),
            Code::kInvalidArgument);
  // Outside the region, and an offset whose sum with the length overflows.
  EXPECT_EQ(DecodeTierReadRequest(EncodeTierReadRequest(g.capacity - 4, 8, one), g, kMaxTierIoBytes)
                .status()
                .code(),
            Code::kOutOfRange);
  EXPECT_EQ(
      DecodeTierReadRequest(EncodeTierReadRequest(std::numeric_limits<uint64_t>::max() - 3, 8, one),
                            g, kMaxTierIoBytes)
          .status()
          .code(),
      Code::kOutOfRange);
  // A mask word count so large that its byte size would overflow 32 bits is just a mismatch.
  TierReadHead huge{0, 10, 0xffffffffu};
  EXPECT_EQ(DecodeTierReadRequest(Raw(huge), g, kMaxTierIoBytes).status().code(), Code::kProtocol);
}

TEST(TierWire, WriteRequestRoundTripsAndRejectsMalformedInput) {
  const TierGeometry g = Geo();
  std::vector<std::byte> data(100, std::byte{7});
  auto bytes = EncodeTierWriteRequest(5, data);
  auto r = DecodeTierWriteRequest(bytes, g, kMaxTierIoBytes);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->offset, 5u);
  EXPECT_EQ(r->data.size(), 100u);
  EXPECT_EQ(r->data[99], std::byte{7});
  auto short_body = bytes;
  short_body.pop_back();
  EXPECT_EQ(DecodeTierWriteRequest(short_body, g, kMaxTierIoBytes).status().code(),
            Code::kProtocol);
  EXPECT_EQ(DecodeTierWriteRequest(std::span(bytes).first(8), g, kMaxTierIoBytes).status().code(),
            Code::kProtocol);
  auto reserved = bytes;
  reserved[12] = std::byte{1};
  EXPECT_EQ(DecodeTierWriteRequest(reserved, g, kMaxTierIoBytes).status().code(), Code::kProtocol);
  EXPECT_EQ(
      DecodeTierWriteRequest(EncodeTierWriteRequest(0, {}), g, kMaxTierIoBytes).status().code(),
      Code::kInvalidArgument);
  EXPECT_EQ(DecodeTierWriteRequest(bytes, g, 99).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(
      DecodeTierWriteRequest(EncodeTierWriteRequest(g.capacity - 50, data), g, kMaxTierIoBytes)
          .status()
          .code(),
      Code::kOutOfRange);
  EXPECT_EQ(
      DecodeTierWriteRequest(EncodeTierWriteRequest(~uint64_t{0} - 10, data), g, kMaxTierIoBytes)
          .status()
          .code(),
      Code::kOutOfRange);
}

TEST(TierWire, CountersRoundTripAndRejectUnknownUnitsAndBadSizes) {
  std::vector<TierCounterEntry> e = {{0, 5}, {15, 1}};
  auto bytes = EncodeTierCounters(e);
  auto r = DecodeTierCounters(bytes, 16);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[1].unit, 15u);
  EXPECT_EQ((*r)[1].count, 1u);
  EXPECT_EQ(DecodeTierCounters(bytes, 15).status().code(), Code::kOutOfRange);
  auto cut = bytes;
  cut.pop_back();
  EXPECT_EQ(DecodeTierCounters(cut, 16).status().code(), Code::kProtocol);
  EXPECT_EQ(DecodeTierCounters(std::span(bytes).first(4), 16).status().code(), Code::kProtocol);
  TierCountersHead h{0x20000000u, 0};  // 2^29 entries announced: a mismatch, no allocation
  EXPECT_EQ(DecodeTierCounters(Raw(h), 16).status().code(), Code::kProtocol);
  EXPECT_TRUE(DecodeTierCounters(EncodeTierCounters({}), 16).ok());
}

TEST(TierWire, InfoReplyChecksGeometryPatternAndBitmapSize) {
  TierInfoReply info{};
  info.geometry = Geo();
  info.magic_word = 0x0123456789abcdefull;
  info.data_key = 11;
  info.bitmap_key = 12;
  info.bitmap_bytes = info.geometry.bitmap_bytes();
  info.period_ms = 1000;
  info.mode = static_cast<uint8_t>(TierWireMode::kFull);
  auto r = DecodeTierInfoReply(EncodeTierInfoReply(info));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->geometry.unit_count, 16u);

  auto bad = info;
  bad.geometry.page_count += 1;
  EXPECT_EQ(DecodeTierInfoReply(EncodeTierInfoReply(bad)).status().code(), Code::kProtocol);
  bad = info;
  bad.magic_word = 0xffffffffffffffffull;
  EXPECT_EQ(DecodeTierInfoReply(EncodeTierInfoReply(bad)).status().code(), Code::kProtocol);
  bad = info;
  bad.bitmap_bytes = 8;
  EXPECT_EQ(DecodeTierInfoReply(EncodeTierInfoReply(bad)).status().code(), Code::kProtocol);
  bad = info;
  bad.mode = 9;
  EXPECT_EQ(DecodeTierInfoReply(EncodeTierInfoReply(bad)).status().code(), Code::kProtocol);
  bad = info;
  bad.reserved[1] = 1;
  EXPECT_EQ(DecodeTierInfoReply(EncodeTierInfoReply(bad)).status().code(), Code::kProtocol);
  auto bytes = EncodeTierInfoReply(info);
  bytes.push_back(std::byte{0});
  EXPECT_EQ(DecodeTierInfoReply(bytes).status().code(), Code::kProtocol);
}

}  // namespace
}  // namespace farmem::tier
