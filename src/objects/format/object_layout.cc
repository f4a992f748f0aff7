// CoRM slot encoding: payload placement around absolute-cacheline version bytes, the one-sided
// consistency check, re-lay on move, and the word-atomic writer protocol (see object_layout.h).

#include "objects/format/object_layout.h"

#include "objects/format/size_classes.h"

#include <algorithm>
#include <cassert>

namespace farmem::corm {

std::string_view SlotCheckName(SlotCheck c) {
  switch (c) {
    case SlotCheck::kOk:
      return "ok";
    case SlotCheck::kTorn:
      return "torn";
    case SlotCheck::kLocked:
      return "locked";
    case SlotCheck::kMoved:
      return "moved";
    case SlotCheck::kFreed:
      return "freed";
    case SlotCheck::kWrongClass:
      return "wrong size class";
  }
  return "unknown";
}

void EncodeSlot(std::span<uint8_t> image, uint64_t addr, const Header& h,
                std::span<const uint8_t> payload) {
  const size_t size = image.size();
  assert(size % kSlotAlign == 0 && size > kHeaderBytes && addr % kSlotAlign == 0);
  const uint64_t word = h.Pack();
  std::memcpy(image.data(), &word, kHeaderBytes);
  size_t p = 0;
  for (size_t i = kHeaderBytes; i < size; ++i) {
    if (IsVersionByte(addr, size, i)) {
      image[i] = h.version;
    } else {
      image[i] = p < payload.size() ? payload[p] : 0;
      ++p;
    }
  }
}

size_t DecodePayload(std::span<const uint8_t> image, uint64_t addr, std::span<uint8_t> out) {
  const size_t size = image.size();
  const size_t n = std::min(out.size(), PayloadCapacity(size));
  // Copies the runs between version bytes (each cacheline start inside the slot, then the tail
  // byte) with memcpy: a per-byte IsVersionByte test cost ~3 % of a 32 B direct_read.
  // The first line start after an 8-aligned addr is at least kHeaderBytes into the slot.
  size_t copied = 0;
  size_t i = kHeaderBytes;
  size_t line = static_cast<size_t>((addr / kCacheLine + 1) * kCacheLine - addr);
  while (copied < n && i < size - 1) {
    const size_t stop = std::min(line, size - 1);  // the next version byte
    const size_t run = std::min(stop - i, n - copied);
    std::memcpy(out.data() + copied, image.data() + i, run);
    copied += run;
    i = stop + 1;
    line += kCacheLine;
  }
  assert(copied == n);
  return n;
}

SlotCheck CheckSlot(std::span<const uint8_t> image, uint64_t addr, uint16_t expected_tag,
                    uint16_t tag_mask, uint32_t size_class) {
  const size_t size = image.size();
  if (size <= kHeaderBytes) return SlotCheck::kTorn;
  uint64_t word;
  std::memcpy(&word, image.data(), kHeaderBytes);
  const Header h = Header::Unpack(word);
  if (!h.allocated) return SlotCheck::kFreed;
  if (h.locked || h.compacting) return SlotCheck::kLocked;
  if (h.size_class != size_class) return SlotCheck::kWrongClass;
  if ((h.tag & tag_mask) != (expected_tag & tag_mask)) return SlotCheck::kMoved;
  if (image[size - 1] != h.version) return SlotCheck::kTorn;
  // Line starts strictly inside the slot: the first one at or after addr + 8.
  for (uint64_t a = (addr / kCacheLine + 1) * kCacheLine; a < addr + size; a += kCacheLine) {
    if (image[a - addr] != h.version) return SlotCheck::kTorn;
  }
  return SlotCheck::kOk;
}

void ReLaySlot(std::span<const uint8_t> src, uint64_t src_addr, std::span<uint8_t> dst,
               uint64_t dst_addr) {
  assert(src.size() == dst.size());
  const size_t size = src.size();
  std::memcpy(dst.data(), src.data(), kHeaderBytes);
  const uint8_t version = Header::Unpack([&] {
                            uint64_t w;
                            std::memcpy(&w, src.data(), kHeaderBytes);
                            return w;
                          }())
                              .version;
  // Walk both layouts in lockstep over payload positions; payload counts are equal per slot
  // size only up to PayloadCapacity, beyond which bytes are padding (zero).
  size_t si = kHeaderBytes;
  for (size_t di = kHeaderBytes; di < size; ++di) {
    if (IsVersionByte(dst_addr, size, di)) {
      dst[di] = version;
      continue;
    }
    while (si < size && IsVersionByte(src_addr, size, si)) ++si;
    dst[di] = si < size ? src[si++] : 0;
  }
}

void PublishSlot(void* slot, std::span<const uint8_t> image) {
  const size_t size = image.size();
  const uint64_t addr = reinterpret_cast<uint64_t>(slot);
  auto* words = static_cast<uint64_t*>(slot);
  const size_t nwords = size / 8;
  auto word_has_version = [&](size_t w) {
    if (w == nwords - 1) return true;  // tail byte
    const uint64_t a = addr + w * 8;
    return w > 0 && a % kCacheLine == 0;
  };
  auto store = [&](size_t w, std::memory_order order) {
    uint64_t v;
    std::memcpy(&v, image.data() + w * 8, 8);
    std::atomic_ref<uint64_t>(words[w]).store(v, order);
  };
  for (size_t w = 1; w < nwords; ++w) {
    if (word_has_version(w)) store(w, std::memory_order_relaxed);
  }
  // Release stores (not a fence: GCC's TSan does not support fences) order the version words
  // before every payload word a reader might observe.
  for (size_t w = 1; w < nwords; ++w) {
    if (!word_has_version(w)) store(w, std::memory_order_release);
  }
  uint64_t header;
  std::memcpy(&header, image.data(), 8);
  StoreHeader(slot, header);
}

SlotCheck OneSidedReadSlot(uint64_t addr, uint16_t expected_tag, uint16_t tag_mask,
                           uint32_t size_class, std::span<uint8_t> copy) {
  ReadSlotWords(reinterpret_cast<const void*>(addr), copy.data(), copy.size());
  return CheckSlot(copy, addr, expected_tag, tag_mask, size_class);
}

int64_t ScanBlockImage(std::span<const uint8_t> block, uint32_t slot_size, uint16_t tag,
                       uint16_t tag_mask, uint32_t size_class, uint32_t home) {
  if (slot_size < kMinSlotSize) return -1;
  for (size_t off = 0; off + slot_size <= block.size(); off += slot_size) {
    uint64_t w;
    std::memcpy(&w, block.data() + off, 8);
    const Header h = Header::Unpack(w);
    if (h.allocated && h.size_class == size_class && (h.tag & tag_mask) == (tag & tag_mask) &&
        (home == kAnyHome || h.home_block == home)) {
      return static_cast<int64_t>(off);
    }
  }
  return -1;
}

}  // namespace farmem::corm
