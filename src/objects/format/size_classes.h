// CoRM size classes: 8-byte-aligned slot sizes whose rounding waste is bounded (kMaxRoundingWaste),
// and each class's block geometry: how many base blocks (4 KiB by default) its blocks span and how
// many slots they hold. A slot holds the header, the payload and the version bytes
// (object_layout.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "farmem/status.h"

namespace farmem::corm {

// Base block: the unit of the object region's virtual address space, of remapping and of the
// slot header's home index. Every block of every class is a whole number of base blocks.
inline constexpr size_t kMinBlockSize = 4096;
inline constexpr size_t kMaxBlockSize = 1 << 20;
inline constexpr size_t kMinSlotSize = 16;
// The largest slot of any class (so the largest object is PayloadCapacity(kMaxSlotSize)).
inline constexpr size_t kMaxSlotSize = 1 << 20;

// Rounding waste: an object of payload p costs its class's block_bytes / slots_per_block bytes
// against need(p), the smallest 8-aligned slot that holds p (header and version bytes included).
// Class slots step by at most 17/16 up to max_block_size / min_slots_per_block and widen to tile
// their blocks, so with the default geometry (cost - need) / cost <= kMaxRoundingWaste for every
// payload up to 8 KiB (measured worst 12.4 %; 9.1 % up to 4 KiB). Above that one-slot blocks are
// whole base blocks and multi-slot blocks powers of two: up to 20 % for 12-16 KiB objects
// (size_classes_test.cc measures both).
inline constexpr double kMaxRoundingWaste = 0.125;

// Smallest 8-aligned slot size whose PayloadCapacity is >= payload (0 if payload is 0).
size_t NeededSlotSize(size_t payload);

// Block geometry per class (docs/objects.md, "Block geometry"). A block's bytes past its last
// whole slot are never used, a block of one slot never merges, and a block of few slots packs
// badly, so one block size for every class either wastes up to half of each large object's
// block (2 KiB objects in 4 KiB blocks) or gives small objects huge blocks. Each class therefore
// gets its own block:
//  - a *multi-slot* block is a power-of-two number of base blocks, at most max_block_size, and is
//    aligned to its own size in the region (so a slot's block starts at offset - offset % block);
//    the class takes the smallest such block holding >= min_slots_per_block slots that fills at
//    least kMinBlockFill of it;
//  - if no power of two up to max_block_size does both, the class takes, among those blocks and
//    a *one-slot* block (the slot rounded up to whole base blocks, aligned to a base block), the
//    one its slots fill best (more slots on a tie).
inline constexpr double kMinBlockFill = 0.875;

struct GeometryOptions {
  size_t base_block_size = 4096;             // power of two, 4 KiB .. 1 MiB
  size_t max_block_size = size_t{64} << 10;  // power of two, base_block_size .. 1 MiB
  uint32_t min_slots_per_block = 16;         // >= 1
  bool operator==(const GeometryOptions&) const = default;
};

// InvalidArgument naming the bad field, else OK.
Status ValidateGeometry(const GeometryOptions& g);

struct SizeClass {
  uint32_t slot_size = 0;         // bytes, multiple of 8
  uint32_t payload_capacity = 0;  // PayloadCapacity(slot_size)
  uint32_t slots_per_block = 0;   // block_bytes / slot_size (>= 1)
  uint32_t block_bytes = 0;       // a whole number of base blocks
};

// Offset (in the object region) of the block holding the slot at `slot_offset`, for a slot of
// class `c`; assumes the offset is a valid slot start of that class (see SlotInBlock).
inline uint64_t BlockStartOf(uint64_t slot_offset, const SizeClass& c) {
  return c.slots_per_block == 1 ? slot_offset : slot_offset - slot_offset % c.block_bytes;
}
// True when `offset` can be the start of a slot of class `c` in a region of base blocks of
// `base_block_size` bytes: one-slot blocks start at base-block boundaries, multi-slot blocks are
// aligned to their size and their slots tile them from the start.
inline bool IsSlotStart(uint64_t offset, const SizeClass& c, size_t base_block_size) {
  if (c.slots_per_block == 1) return offset % base_block_size == 0;
  const uint64_t in_block = offset % c.block_bytes;
  return in_block % c.slot_size == 0 && in_block / c.slot_size < c.slots_per_block;
}

class SizeClasses {
 public:
  static Result<SizeClasses> Create(const GeometryOptions& geometry);

  const GeometryOptions& geometry() const { return geometry_; }
  size_t base_block_size() const { return geometry_.base_block_size; }
  size_t count() const { return classes_.size(); }
  const SizeClass& at(size_t c) const { return classes_[c]; }
  const std::vector<SizeClass>& all() const { return classes_; }
  // Largest payload any class holds.
  size_t max_payload() const { return classes_.back().payload_capacity; }
  // Largest block of any class (bytes).
  size_t max_block_bytes() const { return max_block_bytes_; }
  // Class index for a payload of `payload` bytes; OutOfRange for 0 or > max_payload().
  Result<uint32_t> ClassFor(size_t payload) const;
  // Fraction of class c's block its slots fill (slots_per_block * slot_size / block_bytes).
  double BlockFill(uint32_t c) const;

 private:
  GeometryOptions geometry_;
  size_t max_block_bytes_ = 0;
  std::vector<SizeClass> classes_;
  // payload size / 8 -> first class index that may fit (speeds up ClassFor).
  std::vector<uint16_t> lookup_;
};

}  // namespace farmem::corm
