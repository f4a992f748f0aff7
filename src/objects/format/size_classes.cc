// Size-class table generation and lookup (see size_classes.h for the rounding-waste bound).

#include "objects/format/size_classes.h"

#include <algorithm>
#include <string>

#include "objects/format/object_layout.h"

namespace farmem::corm {

size_t NeededSlotSize(size_t payload) {
  if (payload == 0) return 0;
  // Capacity grows by 7 or 8 per 8 bytes of slot, so the answer is within a few steps of this.
  size_t s = std::max(kMinSlotSize, (payload + kHeaderBytes + 1 + 7) / 8 * 8);
  while (PayloadCapacity(s) < payload) s += kSlotAlign;
  return s;
}

Result<SizeClasses> SizeClasses::Create(size_t block_size) {
  if (block_size < kMinBlockSize || block_size > kMaxBlockSize ||
      (block_size & (block_size - 1)) != 0) {
    return Status::InvalidArgument("block size must be a power of two in [4096, 1048576], got " +
                                   std::to_string(block_size));
  }
  SizeClasses sc;
  sc.block_size_ = block_size;
  std::vector<size_t> slots;
  for (size_t s = kMinSlotSize; s <= std::min<size_t>(128, block_size); s += kSlotAlign) {
    slots.push_back(s);
  }
  while (slots.back() < block_size) {
    const size_t prev = slots.back();
    size_t next = prev * 9 / 8 / kSlotAlign * kSlotAlign;  // <= 9/8 * prev, 8-aligned
    if (next <= prev) next = prev + kSlotAlign;
    slots.push_back(std::min(next, block_size));
  }
  // Rule 1 (size_classes.h): slot sizes that tile the block. Adding classes only lowers the
  // rounding waste, so kMaxRoundingWaste still holds.
  for (size_t n = 1; n <= kTilingSlots; ++n) {
    slots.push_back(block_size / n / kSlotAlign * kSlotAlign);
  }
  std::sort(slots.begin(), slots.end());
  slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
  for (size_t s : slots) {
    sc.classes_.push_back(SizeClass{static_cast<uint32_t>(s),
                                    static_cast<uint32_t>(PayloadCapacity(s)),
                                    static_cast<uint32_t>(block_size / s)});
  }
  // Slot headers store the class in 7 bits (object_layout.h); 1 MiB blocks need ~92 classes.
  if (sc.classes_.size() > kMaxSizeClasses) {
    return Status::Internal("block size " + std::to_string(block_size) + " needs " +
                            std::to_string(sc.classes_.size()) + " size classes, more than " +
                            std::to_string(kMaxSizeClasses));
  }
  sc.lookup_.resize(sc.max_payload() / 8 + 1);
  size_t c = 0;
  for (size_t i = 0; i < sc.lookup_.size(); ++i) {
    // First class that can hold the smallest payload of bucket i (i*8, or 1 for bucket 0).
    const size_t p = std::max<size_t>(1, i * 8);
    while (sc.classes_[c].payload_capacity < p) ++c;
    sc.lookup_[i] = static_cast<uint16_t>(c);
  }
  return sc;
}

double BlockFill(const SizeClasses& classes, uint32_t c) {
  const SizeClass& k = classes.at(c);
  return double(uint64_t{k.slots_per_block} * k.slot_size) / double(classes.block_size());
}

Result<size_t> RecommendedBlockSize(size_t max_payload, size_t min_block_size) {
  if (min_block_size < kMinBlockSize || min_block_size > kMaxBlockSize ||
      (min_block_size & (min_block_size - 1)) != 0) {
    return Status::InvalidArgument("block size must be a power of two in [4096, 1048576], got " +
                                   std::to_string(min_block_size));
  }
  if (max_payload == 0) return Status::OutOfRange("object size 0");
  size_t first_fit = 0;
  for (size_t bs = min_block_size; bs <= kMaxBlockSize; bs *= 2) {
    FARMEM_ASSIGN_OR_RETURN(SizeClasses sc, SizeClasses::Create(bs));
    if (max_payload > sc.max_payload()) continue;
    if (first_fit == 0) first_fit = bs;
    if (bs > kMaxGeometryBlock) break;
    FARMEM_ASSIGN_OR_RETURN(uint32_t c, sc.ClassFor(max_payload));
    if (BlockFill(sc, c) >= kMinBlockFill) return bs;
  }
  if (first_fit != 0) return first_fit;
  return Status::OutOfRange("an object of " + std::to_string(max_payload) +
                            " B does not fit in a 1 MiB block");
}

Result<uint32_t> SizeClasses::ClassFor(size_t payload) const {
  if (payload == 0 || payload > max_payload()) {
    return Status::OutOfRange("object size " + std::to_string(payload) + " outside [1, " +
                              std::to_string(max_payload()) + "] for block size " +
                              std::to_string(block_size_));
  }
  size_t c = lookup_[payload / 8];
  while (classes_[c].payload_capacity < payload) ++c;
  return static_cast<uint32_t>(c);
}

}  // namespace farmem::corm
