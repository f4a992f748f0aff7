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

struct SizeClass {
  uint32_t slot_size = 0;         // bytes, multiple of 8
  uint32_t payload_capacity = 0;  // PayloadCapacity(slot_size)
  uint32_t slots_per_block = 0;   // block_size / slot_size
};

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
