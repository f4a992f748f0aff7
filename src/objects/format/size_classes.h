// CoRM size classes: 8-byte-aligned slot sizes whose rounding waste is bounded (kMaxRoundingWaste),
// and the per-block geometry (slots per block) for a configurable block size (4 KiB .. 1 MiB).
// A slot holds the header, the payload and the version bytes (see object_layout.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "farmem/status.h"

namespace farmem::corm {

inline constexpr size_t kMinBlockSize = 4096;
inline constexpr size_t kMaxBlockSize = 1 << 20;
inline constexpr size_t kMinSlotSize = 16;

// Bound on internal fragmentation from class rounding: for every payload size p, with need(p) the
// smallest 8-aligned slot that holds p bytes of payload, the chosen class slot S satisfies
// (S - need(p)) / S <= 1/8 (12.5 %). Classes are every multiple of 8 up to 128 B, then grow by at
// most 9/8 per step, which gives (S - need)/S < 1 - 8/9 ≈ 11.1 %.
inline constexpr double kMaxRoundingWaste = 0.125;

// Smallest 8-aligned slot size whose PayloadCapacity is >= payload (0 if payload is 0).
size_t NeededSlotSize(size_t payload);

// Block geometry for large objects (docs/objects.md, "Block geometry"). A block's bytes past its
// last whole slot are never used, so a class whose slot is a large fraction of the block wastes
// up to half of it (a 2 KiB object needs a 2,096 B slot: one per 4 KiB block, 49 % wasted; a
// 4 KiB object one 4.2+ KiB slot per 8 KiB block), and a block of one slot can never be merged.
// Two rules bound that waste:
//  1. Every class table also holds the slot sizes block_size / n (8-aligned down) for
//     n = 1 .. kTilingSlots, so a class with few slots per block tiles the block up to < 8 B
//     per slot instead of leaving up to one slot's size unused.
//  2. RecommendedBlockSize picks, for the largest payload a store must hold, the smallest
//     power-of-two block in [min_block_size, kMaxGeometryBlock] whose class for that payload
//     uses at least kMinBlockFill of the block; larger payloads (or none reaching the fill by
//     kMaxGeometryBlock) get the smallest block that holds them at all.
inline constexpr uint32_t kTilingSlots = 16;
inline constexpr double kMinBlockFill = 0.875;
inline constexpr size_t kMaxGeometryBlock = size_t{64} << 10;
static_assert(kMaxGeometryBlock >= kMinBlockSize && kMaxGeometryBlock <= kMaxBlockSize);
static_assert((kMaxGeometryBlock & (kMaxGeometryBlock - 1)) == 0);
// Rule 1 keeps every tiling slot at least kMinSlotSize at the smallest block size.
static_assert(kMinBlockSize / kTilingSlots >= kMinSlotSize);

struct SizeClass {
  uint32_t slot_size = 0;         // bytes, multiple of 8
  uint32_t payload_capacity = 0;  // PayloadCapacity(slot_size)
  uint32_t slots_per_block = 0;   // block_size / slot_size
};

class SizeClasses;

// Fraction of a block of `classes` filled by the slots of class `c` (slots_per_block *
// slot_size / block_size).
double BlockFill(const SizeClasses& classes, uint32_t c);

// Rule 2 above. InvalidArgument for a bad min_block_size, OutOfRange for 0 or a payload no
// block up to 1 MiB holds.
Result<size_t> RecommendedBlockSize(size_t max_payload, size_t min_block_size);

class SizeClasses {
 public:
  // block_size: power of two in [4 KiB, 1 MiB].
  static Result<SizeClasses> Create(size_t block_size);

  size_t block_size() const { return block_size_; }
  size_t count() const { return classes_.size(); }
  const SizeClass& at(size_t c) const { return classes_[c]; }
  const std::vector<SizeClass>& all() const { return classes_; }
  // Largest payload any class holds.
  size_t max_payload() const { return classes_.back().payload_capacity; }
  // Class index for a payload of `payload` bytes; OutOfRange for 0 or > max_payload().
  Result<uint32_t> ClassFor(size_t payload) const;

 private:
  size_t block_size_ = 0;
  std::vector<SizeClass> classes_;
  // payload size / 8 -> first class index that may fit (speeds up ClassFor).
  std::vector<uint16_t> lookup_;
};

}  // namespace farmem::corm
