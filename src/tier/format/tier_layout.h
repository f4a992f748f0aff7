// TeRM tiered region layout, shared by the server engine (src/tier/engine) and, later, the client:
// geometry (capacity, unit, 4 KiB pages), the resident-page bitmap, the magic pattern and the
// missing-page detection a one-sided reader runs on what it copied. Pure functions, no threads.
// Documented in docs/tier.md ("Layout"); keep both in step.
//
// Data structures:
//   region   [0, capacity) bytes, cut into units of `unit_size` (the promotion granule, a power of
//            two, 4 KiB .. 16 MiB) and into 4 KiB pages (the detection and sparse-fetch granule).
//            A unit is either resident (mapped onto a DRAM frame) or cold (mapped onto the magic
//            memfd, every 8-byte word of which is the magic pattern).
//   bitmap   one bit per page, packed into 64-bit words: page p is bit (p % 64) of word p / 64;
//            bit set = the page's unit is resident. The array lives in page-aligned memory that
//            is registered for one-sided pulls; a unit's pages are set and cleared together.
//   pattern  one 64-bit word drawn at server start, never 0 and never one byte repeated (so pages
//            of zeros or of 0xff are never taken for it). A cold page reads as this word at every
//            8-aligned offset.
//   page mask  the pages a range touches, relative to its first page (bit i = page
//            offset / 4096 + i), packed like the bitmap: the "missing pages" a reader found and
//            the "pages to read" of a sparse fetch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "farmem/status.h"

namespace farmem::tier {

inline constexpr uint64_t kPageSize = 4096;
inline constexpr uint64_t kWordBytes = 8;
inline constexpr uint64_t kBitsPerWord = 64;
inline constexpr uint64_t kWordsPerPage = kPageSize / kWordBytes;
inline constexpr uint64_t kMinUnitSize = kPageSize;
inline constexpr uint64_t kMaxUnitSize = uint64_t{16} << 20;
// 64 KiB: the spec's simulation (scrambled Zipf 0.99, 85 % fill of a 50 % budget) gives an oracle
// hit ratio of 0.85 against 0.74 for the paper's 1 MiB units.
inline constexpr uint64_t kDefaultUnitSize = uint64_t{64} << 10;
// Unit indices are 32-bit in the engine and in counter pushes.
inline constexpr uint64_t kMaxUnits = uint64_t{1} << 31;

static_assert((kPageSize & (kPageSize - 1)) == 0);
static_assert(kPageSize % kWordBytes == 0 && kWordsPerPage == 512);
static_assert(kMinUnitSize % kPageSize == 0 && kMaxUnitSize % kPageSize == 0);
static_assert(sizeof(uint64_t) == kWordBytes);

// The geometry of one tiered region. Plain 64-bit fields, no padding: it is sent as is (TIER_INFO)
// once the wire format exists.
struct TierGeometry {
  uint64_t capacity = 0;        // bytes; a non-zero multiple of unit_size
  uint64_t unit_size = 0;       // bytes; power of two in [kMinUnitSize, kMaxUnitSize]
  uint64_t unit_count = 0;      // capacity / unit_size, <= kMaxUnits
  uint64_t page_count = 0;      // capacity / kPageSize
  uint64_t pages_per_unit = 0;  // unit_size / kPageSize
  uint64_t bitmap_words = 0;    // ceil(page_count / 64)

  // Checks and derives the geometry: InvalidArgument on a unit that is not a power of two in
  // range, a zero capacity or one that is not a multiple of the unit, or too many units.
  static Result<TierGeometry> Make(uint64_t capacity, uint64_t unit_size);

  uint64_t bitmap_bytes() const { return bitmap_words * kWordBytes; }
  // InvalidArgument for len == 0, OutOfRange when [offset, offset + len) is not inside the region
  // (including offsets whose sum overflows).
  Status CheckRange(uint64_t offset, uint64_t len) const;
};
static_assert(sizeof(TierGeometry) == 6 * 8, "TierGeometry: six 64-bit fields, no padding");

// ---- bitmap ------------------------------------------------------------------------------------

constexpr uint64_t BitmapWords(uint64_t pages) {
  return (pages + kBitsPerWord - 1) / kBitsPerWord;
}
constexpr uint64_t BitmapWordOf(uint64_t page) {
  return page / kBitsPerWord;
}
constexpr uint64_t BitmapMaskOf(uint64_t page) {
  return uint64_t{1} << (page % kBitsPerWord);
}
inline bool BitmapTest(std::span<const uint64_t> words, uint64_t page) {
  return (words[BitmapWordOf(page)] & BitmapMaskOf(page)) != 0;
}
static_assert(BitmapWords(1) == 1 && BitmapWords(64) == 1 && BitmapWords(65) == 2);
static_assert(BitmapWordOf(130) == 2 && BitmapMaskOf(130) == 4);

// The bits of unit `unit`'s pages inside bitmap word `word` (0 when the unit has no page there).
// A unit's pages are contiguous: pages_per_unit is a power of two, so a unit covers either a
// power-of-two aligned part of one word (units < 256 KiB) or whole words.
constexpr uint64_t UnitBitsInWord(uint64_t unit, uint64_t pages_per_unit, uint64_t word) {
  const uint64_t first = unit * pages_per_unit;
  const uint64_t end = first + pages_per_unit;
  const uint64_t wfirst = word * kBitsPerWord;
  const uint64_t wend = wfirst + kBitsPerWord;
  const uint64_t lo = first > wfirst ? first : wfirst;
  const uint64_t hi = end < wend ? end : wend;
  if (lo >= hi) return 0;
  const uint64_t n = hi - lo;
  const uint64_t ones = n == kBitsPerWord ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
  return ones << (lo - wfirst);
}
static_assert(UnitBitsInWord(1, 16, 0) == 0xFFFF0000ull);
static_assert(UnitBitsInWord(3, 16, 0) == 0xFFFF000000000000ull);
static_assert(UnitBitsInWord(4, 16, 0) == 0 && UnitBitsInWord(4, 16, 1) == 0xFFFF);
static_assert(UnitBitsInWord(1, 256, 4) == ~0ull && UnitBitsInWord(1, 256, 3) == 0);

// ---- page masks of a range
// -----------------------------------------------------------------------

// Pages [offset, offset + len) touches (0 for len == 0).
constexpr uint64_t PagesSpanned(uint64_t offset, uint64_t len) {
  return len == 0 ? 0 : (offset + len - 1) / kPageSize - offset / kPageSize + 1;
}
static_assert(PagesSpanned(4095, 2) == 2 && PagesSpanned(0, 4096) == 1 &&
              PagesSpanned(1, 4096) == 2);

// ---- magic pattern
// -------------------------------------------------------------------------------

// A usable pattern: not 0 and not one byte repeated (0x0000..., 0xffff..., 0xfdfd... as in the
// paper's artifact), so all-zero and all-0xff pages never look cold.
constexpr bool IsValidMagic(uint64_t pattern) {
  return pattern != 0 && pattern != (pattern & 0xFF) * 0x0101010101010101ull;
}
static_assert(!IsValidMagic(0) && !IsValidMagic(~0ull) && !IsValidMagic(0xfdfdfdfdfdfdfdfdull));
static_assert(IsValidMagic(0x0123456789abcdefull));

// Draws a valid pattern from std::random_device.
uint64_t DrawMagicWord();

// The pattern appears at every 8-aligned offset of a cold page (one word repeated), so "the
// pattern at that position" is the same word everywhere.
constexpr bool WordIsMagic(uint64_t word, uint64_t pattern) {
  return word == pattern;
}

// The 8-byte word at `p` in host order (what a one-sided copy of the pattern word yields).
inline uint64_t LoadWord(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof(w));
  return w;
}

// Missing-page detection on a copy of [offset, offset + data.size()) of the region: a page part
// counts as missing if ANY of its 8-byte words equals the pattern. "Any", not "all": a remap in the
// middle of a copy leaves whole pattern words next to data words (copies go word by word), and a
// part that straddled must be fetched again. Real data equal to the pattern is a false positive:
// one extra fetch, never a wrong result. offset and size must be multiples of 8 (a reader widens
// its range first: a partial word cannot be checked) and size > 0; else InvalidArgument.
// Returns the page mask of the range (MaskWords(PagesSpanned(offset, size)) words, bit i = page
// offset / 4096 + i is missing).
Result<std::vector<uint64_t>> FindMissingPages(uint64_t offset, std::span<const uint8_t> data,
                                               uint64_t pattern);

// The page mask of [offset, offset + len) with the bits of the pages `bitmap` marks resident (a
// reader's "pages worth a one-sided read"; the others it fetches by RPC without reading them).
// InvalidArgument when len == 0 or the range runs past the bitmap.
Result<std::vector<uint64_t>> ResidentPagesOf(std::span<const uint64_t> bitmap, uint64_t offset,
                                              uint64_t len);

// Words of a page mask over `pages` pages.
constexpr uint64_t MaskWords(uint64_t pages) {
  return BitmapWords(pages);
}
// Checks a page mask for [offset, offset + len): exactly MaskWords(PagesSpanned(...)) words and no
// bit past the last page. InvalidArgument otherwise (the server's check of a client's list).
Status CheckPageMask(uint64_t offset, uint64_t len, std::span<const uint64_t> mask);

}  // namespace farmem::tier
