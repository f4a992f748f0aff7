// Tests of the TeRM region layout: geometry checks, bitmap math, pattern validity, missing-page
// detection (incl. data equal to the pattern, zero and 0xff pages) and page-mask checks.
// Single-threaded.
#include "tier/format/tier_layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace farmem::tier {
namespace {

constexpr uint64_t kPattern = 0x5a17c0de9e3779b9ull;

TEST(TierLayout, GeometryDerivesCounts) {
  auto g = TierGeometry::Make(uint64_t{1} << 30, kDefaultUnitSize);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->unit_count, 16384u);
  EXPECT_EQ(g->page_count, 262144u);
  EXPECT_EQ(g->pages_per_unit, 16u);
  EXPECT_EQ(g->bitmap_words, 4096u);
  EXPECT_EQ(g->bitmap_bytes(), 32768u);
  // The paper's figure: the bitmap is 1/32768 of the region (0.003 %).
  EXPECT_EQ(g->capacity / g->bitmap_bytes(), 32768u);
  auto odd = TierGeometry::Make(5 * kPageSize, kPageSize);
  ASSERT_TRUE(odd.ok());
  EXPECT_EQ(odd->bitmap_words, 1u);
}

TEST(TierLayout, GeometryRefusesBadInput) {
  for (uint64_t unit : {uint64_t{0}, uint64_t{2048}, uint64_t{3 * 4096}, uint64_t{32} << 20}) {
    auto g = TierGeometry::Make(uint64_t{1} << 30, unit);
    EXPECT_EQ(g.status().code(), Code::kInvalidArgument) << unit;
  }
  EXPECT_EQ(TierGeometry::Make(0, kPageSize).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(TierGeometry::Make(kDefaultUnitSize + kPageSize, kDefaultUnitSize).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(TierGeometry::Make((kMaxUnits + 1) * kPageSize, kPageSize).status().code(),
            Code::kInvalidArgument);
  EXPECT_TRUE(TierGeometry::Make(kMaxUnits * kPageSize, kPageSize).ok());
}

TEST(TierLayout, CheckRangeRefusesEmptyOutsideAndOverflowingRanges) {
  auto g = TierGeometry::Make(1 << 20, kPageSize);
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->CheckRange(0, 1 << 20).ok());
  EXPECT_TRUE(g->CheckRange((1 << 20) - 1, 1).ok());
  EXPECT_EQ(g->CheckRange(0, 0).code(), Code::kInvalidArgument);
  EXPECT_EQ(g->CheckRange(1 << 20, 1).code(), Code::kOutOfRange);
  EXPECT_EQ(g->CheckRange(1, 1 << 20).code(), Code::kOutOfRange);
  EXPECT_EQ(g->CheckRange(~uint64_t{0} - 2, 8).code(), Code::kOutOfRange);
  EXPECT_EQ(g->CheckRange(8, ~uint64_t{0} - 2).code(), Code::kOutOfRange);
}

TEST(TierLayout, UnitBitsCoverExactlyTheUnitsPages) {
  for (uint64_t ppu : {uint64_t{1}, uint64_t{2}, uint64_t{16}, uint64_t{64}, uint64_t{256}}) {
    const uint64_t units = 8;
    const uint64_t pages = units * ppu;
    for (uint64_t u = 0; u < units; ++u) {
      std::vector<uint64_t> words(BitmapWords(pages), 0);
      for (uint64_t w = 0; w < words.size(); ++w) words[w] = UnitBitsInWord(u, ppu, w);
      for (uint64_t p = 0; p < pages; ++p) {
        EXPECT_EQ(BitmapTest(words, p), p / ppu == u)
            << "ppu " << ppu << " unit " << u << " page " << p;
      }
    }
  }
}

TEST(TierLayout, PatternValidity) {
  EXPECT_FALSE(IsValidMagic(0));
  EXPECT_FALSE(IsValidMagic(~uint64_t{0}));
  EXPECT_FALSE(IsValidMagic(0xfdfdfdfdfdfdfdfdull));
  EXPECT_TRUE(IsValidMagic(kPattern));
  for (int i = 0; i < 100; ++i) {
    const uint64_t w = DrawMagicWord();
    EXPECT_TRUE(IsValidMagic(w));
    EXPECT_TRUE(WordIsMagic(w, w));
    EXPECT_FALSE(WordIsMagic(w ^ 1, w));
  }
}

std::vector<uint8_t> Filled(size_t n, uint8_t b) {
  return std::vector<uint8_t>(n, b);
}

void PutWord(std::vector<uint8_t>& v, size_t at, uint64_t w) {
  std::memcpy(v.data() + at, &w, 8);
}

TEST(TierLayout, FindMissingPagesFlagsAPagePartWithAnyPatternWord) {
  // Range [4096 - 64, 3 * 4096 + 64): four page parts.
  const uint64_t off = kPageSize - 64;
  const size_t len = 2 * kPageSize + 128;
  auto data = Filled(len, 0x11);
  auto m = FindMissingPages(off, data, kPattern);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->size(), 1u);
  EXPECT_EQ((*m)[0], 0u);
  // One pattern word at the start of page 2 (relative page 1) and the last word of the range
  // (relative page 3): a copy that straddled a remap.
  PutWord(data, 64, kPattern);
  PutWord(data, len - 8, kPattern);
  m = FindMissingPages(off, data, kPattern);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)[0], 0b1010u);
  // A pattern word that is not 8-aligned in the region is data, not the pattern.
  auto shifted = Filled(len, 0x11);
  std::memcpy(shifted.data() + 68, &kPattern, 8);
  m = FindMissingPages(off, shifted, kPattern);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)[0], 0u);
}

TEST(TierLayout, ZeroAndFfPagesAreNeverMissingAndPatternDataIsAFalsePositive) {
  const size_t len = 3 * kPageSize;
  std::vector<uint8_t> data(len);
  std::memset(data.data(), 0, kPageSize);
  std::memset(data.data() + kPageSize, 0xff, kPageSize);
  for (size_t i = 2 * kPageSize; i < len; i += 8) PutWord(data, i, kPattern);  // real data
  auto m = FindMissingPages(0, data, kPattern);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ((*m)[0], 0b100u) << "all-zero and all-0xff pages are data; the pattern page is "
                                "reported missing (a false positive the sparse fetch resolves)";
}

TEST(TierLayout, FindMissingPagesMaskSpansManyWords) {
  const size_t pages = 130;
  std::vector<uint8_t> data(pages * kPageSize, 0x22);
  for (size_t p : {size_t{0}, size_t{63}, size_t{64}, size_t{129}}) {
    PutWord(data, p * kPageSize + 4088, kPattern);
  }
  auto m = FindMissingPages(kPageSize * 7, data, kPattern);
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->size(), 3u);
  EXPECT_EQ((*m)[0], (uint64_t{1} << 63) | 1);
  EXPECT_EQ((*m)[1], 1u);
  EXPECT_EQ((*m)[2], uint64_t{1} << 1);
  EXPECT_TRUE(CheckPageMask(kPageSize * 7, data.size(), *m).ok());
}

TEST(TierLayout, FindMissingPagesRefusesUnwidenedRanges) {
  std::vector<uint8_t> data(16, 0);
  EXPECT_EQ(FindMissingPages(4, data, kPattern).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(
      FindMissingPages(0, std::span<const uint8_t>(data.data(), 12), kPattern).status().code(),
      Code::kInvalidArgument);
  EXPECT_EQ(FindMissingPages(0, std::span<const uint8_t>(), kPattern).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(FindMissingPages(~uint64_t{0} - 7, data, kPattern).status().code(), Code::kOutOfRange);
}

TEST(TierLayout, CheckPageMaskRefusesWrongSizesAndBitsPastTheRange) {
  // [100, 100 + 2 * 4096): 3 pages, 1 word.
  std::vector<uint64_t> ok = {0b101};
  EXPECT_TRUE(CheckPageMask(100, 2 * kPageSize, ok).ok());
  std::vector<uint64_t> past = {0b1001};
  EXPECT_EQ(CheckPageMask(100, 2 * kPageSize, past).code(), Code::kInvalidArgument);
  std::vector<uint64_t> two = {0, 0};
  EXPECT_EQ(CheckPageMask(100, 2 * kPageSize, two).code(), Code::kInvalidArgument);
  EXPECT_EQ(CheckPageMask(100, 2 * kPageSize, {}).code(), Code::kInvalidArgument);
  std::vector<uint64_t> full = {~uint64_t{0}};  // exactly 64 pages
  EXPECT_TRUE(CheckPageMask(0, 64 * kPageSize, full).ok());
}

TEST(TierLayout, ResidentPagesOfShiftsTheBitmapToTheRange) {
  std::vector<uint64_t> bitmap = {0xF0F0F0F0F0F0F0F0ull, 0x1ull};
  // [4 pages + 100, +61 pages): pages 4..65 relative 0..61.
  auto m = ResidentPagesOf(bitmap, 4 * kPageSize + 100, 61 * kPageSize);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->size(), 1u);
  uint64_t want = 0;
  for (uint64_t i = 0; i < 62; ++i) {
    if (BitmapTest(bitmap, 4 + i)) want |= uint64_t{1} << i;
  }
  EXPECT_EQ((*m)[0], want);
  EXPECT_TRUE(CheckPageMask(4 * kPageSize + 100, 61 * kPageSize, *m).ok());
  EXPECT_EQ(ResidentPagesOf(bitmap, 0, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ResidentPagesOf(bitmap, 127 * kPageSize, kPageSize + 1).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(ResidentPagesOf(bitmap, ~uint64_t{0} - 5, 10).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(ResidentPagesOf(bitmap, 127 * kPageSize, kPageSize).ok());
}

}  // namespace
}  // namespace farmem::tier
