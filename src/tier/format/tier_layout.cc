// TeRM region layout: geometry checks, pattern drawing, missing-page detection and page-mask
// checks (see tier_layout.h). Pure functions; any thread.
#include "tier/format/tier_layout.h"

#include <algorithm>
#include <random>
#include <string>

namespace farmem::tier {

Result<TierGeometry> TierGeometry::Make(uint64_t capacity, uint64_t unit_size) {
  if (unit_size < kMinUnitSize || unit_size > kMaxUnitSize || (unit_size & (unit_size - 1)) != 0) {
    return Status::InvalidArgument(
        "tier unit size must be a power of two in [4096, 16777216], got " +
        std::to_string(unit_size));
  }
  if (capacity == 0 || capacity % unit_size != 0) {
    return Status::InvalidArgument("tier capacity must be a non-zero multiple of the unit size (" +
                                   std::to_string(unit_size) + "), got " +
                                   std::to_string(capacity));
  }
  if (capacity / unit_size > kMaxUnits) {
    return Status::InvalidArgument("tier capacity has more than 2^31 units of " +
                                   std::to_string(unit_size) + " bytes");
  }
  TierGeometry g;
  g.capacity = capacity;
  g.unit_size = unit_size;
  g.unit_count = capacity / unit_size;
  g.page_count = capacity / kPageSize;
  g.pages_per_unit = unit_size / kPageSize;
  g.bitmap_words = BitmapWords(g.page_count);
  return g;
}

Status TierGeometry::CheckRange(uint64_t offset, uint64_t len) const {
  if (len == 0) return Status::InvalidArgument("empty tier range");
  if (offset >= capacity || len > capacity - offset) {
    return Status::OutOfRange("tier range [" + std::to_string(offset) + ", +" +
                              std::to_string(len) + ") is outside the region of " +
                              std::to_string(capacity) + " bytes");
  }
  return Status::OK();
}

uint64_t DrawMagicWord() {
  std::random_device rd;
  for (;;) {
    const uint64_t w = (uint64_t{rd()} << 32) ^ uint64_t { rd() };
    if (IsValidMagic(w)) return w;
  }
}

Result<std::vector<uint64_t>> FindMissingPages(uint64_t offset, std::span<const uint8_t> data,
                                               uint64_t pattern) {
  if (data.empty() || offset % kWordBytes != 0 || data.size() % kWordBytes != 0) {
    return Status::InvalidArgument(
        "missing-page detection needs a non-empty, 8-byte aligned range (widen the read)");
  }
  if (offset + data.size() < offset) return Status::OutOfRange("range overflows");
  const uint64_t first_page = offset / kPageSize;
  std::vector<uint64_t> mask(MaskWords(PagesSpanned(offset, data.size())), 0);
  size_t i = 0;
  while (i < data.size()) {
    const uint64_t page = (offset + i) / kPageSize;
    const size_t part_end =
        static_cast<size_t>(std::min<uint64_t>((page + 1) * kPageSize - offset, data.size()));
    for (size_t j = i; j < part_end; j += kWordBytes) {
      if (WordIsMagic(LoadWord(data.data() + j), pattern)) {
        const uint64_t rel = page - first_page;
        mask[BitmapWordOf(rel)] |= BitmapMaskOf(rel);
        break;
      }
    }
    i = part_end;
  }
  return mask;
}

Result<std::vector<uint64_t>> ResidentPagesOf(std::span<const uint64_t> bitmap, uint64_t offset,
                                              uint64_t len) {
  if (len == 0) return Status::InvalidArgument("empty range");
  if (offset + len < offset || (offset + len - 1) / kPageSize >= bitmap.size() * kBitsPerWord) {
    return Status::InvalidArgument("range runs past the page bitmap");
  }
  const uint64_t first = offset / kPageSize;
  const uint64_t pages = PagesSpanned(offset, len);
  std::vector<uint64_t> mask(MaskWords(pages), 0);
  for (uint64_t i = 0; i < pages; ++i) {
    if (BitmapTest(bitmap, first + i)) mask[BitmapWordOf(i)] |= BitmapMaskOf(i);
  }
  return mask;
}

Status CheckPageMask(uint64_t offset, uint64_t len, std::span<const uint64_t> mask) {
  const uint64_t pages = PagesSpanned(offset, len);
  if (mask.size() != MaskWords(pages)) {
    return Status::InvalidArgument("page mask has " + std::to_string(mask.size()) +
                                   " words, the range spans " + std::to_string(pages) + " pages (" +
                                   std::to_string(MaskWords(pages)) + " words)");
  }
  if (pages % kBitsPerWord != 0 && !mask.empty() && (mask.back() >> (pages % kBitsPerWord)) != 0) {
    return Status::InvalidArgument("page mask names pages past the end of the range");
  }
  return Status::OK();
}

}  // namespace farmem::tier
