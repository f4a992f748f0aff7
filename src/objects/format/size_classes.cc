// Size-class table generation, per-class block geometry and lookup (see size_classes.h for the
// rounding-waste bound and the geometry rule).

#include "objects/format/size_classes.h"

#include <algorithm>
#include <bit>
#include <string>

#include "objects/format/object_layout.h"

namespace farmem::corm {
namespace {

// Payloads up to this size are looked up in a table (one entry per 8 bytes); larger ones by
// binary search over the few large classes.
constexpr size_t kLookupPayload = 4096;

bool PowerOfTwoIn(size_t v, size_t lo, size_t hi) {
  return v >= lo && v <= hi && std::has_single_bit(v);
}

// The block of a class with slots of `slot` bytes (size_classes.h, "Block geometry").
SizeClass ChooseBlock(size_t slot, const GeometryOptions& g) {
  const size_t base = g.base_block_size;
  auto make = [slot](size_t block) {
    return SizeClass{static_cast<uint32_t>(slot), static_cast<uint32_t>(PayloadCapacity(slot)),
                     static_cast<uint32_t>(block / slot), static_cast<uint32_t>(block)};
  };
  auto fill = [slot](size_t block) { return double(block / slot * slot) / double(block); };
  for (size_t block = base; block <= g.max_block_size; block *= 2) {
    if (block / slot >= g.min_slots_per_block && fill(block) >= kMinBlockFill) return make(block);
  }
  // No power of two does both: the best-filled of them and the one-slot block.
  size_t best = (slot + base - 1) / base * base;  // one slot, whole base blocks
  for (size_t block = base; block <= g.max_block_size; block *= 2) {
    if (block < slot) continue;
    const double f = fill(block), fb = fill(best);
    if (f > fb + 1e-12 || (f >= fb - 1e-12 && block / slot > best / slot)) best = block;
  }
  return make(best);
}

// Slot sizes to build classes from, ascending (duplicates allowed). coarseness 0: every multiple
// of 8 up to 128 B; then steps of at most 17/16 while a block of the largest size holds
// min_slots_per_block slots; then every slot that tiles the largest block (max / n) and every
// whole number of base blocks up to it; then steps of 9/8 (rounded up to base blocks). 1: steps
// of 9/8 in the middle range and only the tiling slots. 2: steps of 9/8 everywhere (<= 94).
std::vector<size_t> CandidateSlots(const GeometryOptions& g, int coarseness) {
  std::vector<size_t> slots;
  for (size_t s = kMinSlotSize; s <= 128; s += kSlotAlign) slots.push_back(s);
  const size_t dense_end = std::max<size_t>(128, g.max_block_size / g.min_slots_per_block);
  auto grow = [&slots](size_t limit, size_t num, size_t den) {
    while (slots.back() < limit) {
      const size_t prev = slots.back();
      size_t next = prev * num / den / kSlotAlign * kSlotAlign;  // <= num/den * prev, 8-aligned
      if (next <= prev) next = prev + kSlotAlign;
      slots.push_back(std::min(next, limit));
    }
  };
  if (coarseness == 2) {
    grow(kMaxSlotSize, 9, 8);
    return slots;
  }
  if (coarseness == 0) {
    grow(dense_end, 17, 16);
  } else {
    grow(dense_end, 9, 8);
  }
  for (uint32_t n = g.min_slots_per_block; n >= 1; --n) {
    const size_t s = g.max_block_size / n / kSlotAlign * kSlotAlign;
    if (s > dense_end) slots.push_back(s);
  }
  // One-slot blocks of whole base blocks between the tilings: every one (0), or steps of 9/8 (1).
  for (size_t s = (dense_end / g.base_block_size + 1) * g.base_block_size; s <= g.max_block_size;) {
    slots.push_back(s);
    const size_t next = coarseness == 0 ? s : s * 9 / 8;
    s = (next / g.base_block_size + 1) * g.base_block_size;
  }
  std::sort(slots.begin(), slots.end());
  while (slots.back() < kMaxSlotSize) {
    const size_t prev = slots.back();
    const size_t next = (prev * 9 / 8 + g.base_block_size - 1) / g.base_block_size *
                        g.base_block_size;  // a one-slot block of whole base blocks
    slots.push_back(std::min(std::max(next, prev + kSlotAlign), kMaxSlotSize));
  }
  return slots;
}

}  // namespace

size_t NeededSlotSize(size_t payload) {
  if (payload == 0) return 0;
  // Capacity grows by 7 or 8 per 8 bytes of slot, so the answer is within a few steps of this.
  size_t s = std::max(kMinSlotSize, (payload + kHeaderBytes + 1 + 7) / 8 * 8);
  while (PayloadCapacity(s) < payload) s += kSlotAlign;
  return s;
}

Status ValidateGeometry(const GeometryOptions& g) {
  if (!PowerOfTwoIn(g.base_block_size, kMinBlockSize, kMaxBlockSize)) {
    return Status::InvalidArgument(
        "base block size must be a power of two in [4096, 1048576], got " +
        std::to_string(g.base_block_size));
  }
  if (!PowerOfTwoIn(g.max_block_size, g.base_block_size, kMaxBlockSize)) {
    return Status::InvalidArgument("largest multi-slot block must be a power of two in [" +
                                   std::to_string(g.base_block_size) + ", 1048576], got " +
                                   std::to_string(g.max_block_size));
  }
  if (g.min_slots_per_block == 0 || g.min_slots_per_block > 65536) {
    return Status::InvalidArgument("slots per block must be in [1, 65536], got " +
                                   std::to_string(g.min_slots_per_block));
  }
  return Status::OK();
}

Result<SizeClasses> SizeClasses::Create(const GeometryOptions& geometry) {
  FARMEM_RETURN_IF_ERROR(ValidateGeometry(geometry));
  SizeClasses sc;
  sc.geometry_ = geometry;
  // The finest class table that fits the header's 128 classes (a geometry with huge blocks and
  // many slots per block needs coarser steps).
  for (int coarseness = 0; coarseness < 3; ++coarseness) {
    sc.classes_.clear();
    sc.max_block_bytes_ = 0;
    for (size_t s : CandidateSlots(geometry, coarseness)) {
      SizeClass k = ChooseBlock(s, geometry);
      // The block's bytes past its last slot are paid for anyway: widen the slot to tile the
      // block (more payload at the same cost per object). A class that then does not grow past
      // the one before it is redundant.
      k.slot_size =
          static_cast<uint32_t>(k.block_bytes / k.slots_per_block / kSlotAlign * kSlotAlign);
      k.payload_capacity = static_cast<uint32_t>(PayloadCapacity(k.slot_size));
      if (!sc.classes_.empty() && k.slot_size <= sc.classes_.back().slot_size) continue;
      sc.classes_.push_back(k);
      sc.max_block_bytes_ = std::max<size_t>(sc.max_block_bytes_, k.block_bytes);
    }
    if (sc.classes_.size() <= kMaxSizeClasses) break;
  }
  // Slot headers store the class in 7 bits (object_layout.h).
  if (sc.classes_.size() > kMaxSizeClasses) {
    return Status::Internal(std::to_string(sc.classes_.size()) + " size classes, more than " +
                            std::to_string(kMaxSizeClasses));
  }
  sc.lookup_.resize(std::min(sc.max_payload(), kLookupPayload) / 8 + 1);
  size_t c = 0;
  for (size_t i = 0; i < sc.lookup_.size(); ++i) {
    // First class that can hold the smallest payload of bucket i (i*8, or 1 for bucket 0).
    const size_t p = std::max<size_t>(1, i * 8);
    while (sc.classes_[c].payload_capacity < p) ++c;
    sc.lookup_[i] = static_cast<uint16_t>(c);
  }
  return sc;
}

double SizeClasses::BlockFill(uint32_t c) const {
  const SizeClass& k = classes_.at(c);
  return double(uint64_t{k.slots_per_block} * k.slot_size) / double(k.block_bytes);
}

Result<uint32_t> SizeClasses::ClassFor(size_t payload) const {
  if (payload == 0 || payload > max_payload()) {
    return Status::OutOfRange("object size " + std::to_string(payload) + " outside [1, " +
                              std::to_string(max_payload()) + "]");
  }
  if (payload / 8 < lookup_.size()) {
    size_t c = lookup_[payload / 8];
    while (classes_[c].payload_capacity < payload) ++c;
    return static_cast<uint32_t>(c);
  }
  auto it = std::lower_bound(classes_.begin(), classes_.end(), payload,
                             [](const SizeClass& k, size_t p) { return k.payload_capacity < p; });
  return static_cast<uint32_t>(it - classes_.begin());
}

}  // namespace farmem::corm
