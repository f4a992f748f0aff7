// RawAllocator: hands out byte ranges of one memory pool (ALLOC_RAW / FREE_RAW of farmemd).
// Kept behind this small interface so the CoRM size-class allocator can replace the first-fit one
// without touching the pool set or the RPC layer.
#pragma once

#include <cstdint>
#include <memory>

#include "farmem/status.h"

namespace farmem {

// Every allocation starts on, and is rounded up to, this many bytes (one cache line).
inline constexpr uint64_t kRawAlignment = 64;

struct RawAllocatorStats {
  uint64_t capacity = 0;         // bytes managed
  uint64_t allocated_bytes = 0;  // sum of live allocation lengths (rounded)
  uint64_t free_bytes = 0;       // capacity - allocated_bytes
  uint64_t allocations = 0;      // live allocations
  uint64_t largest_free = 0;     // longest free range (what one allocation can get at most)
  uint64_t free_ranges = 0;      // number of free ranges (fragmentation indicator)
};

// Offsets are relative to the start of the managed range. Implementations are thread-safe.
class RawAllocator {
 public:
  virtual ~RawAllocator() = default;

  // A kRawAlignment-aligned offset of at least `len` bytes (rounded up to kRawAlignment).
  // InvalidArgument for len 0 or len > capacity; ResourceExhausted when no free range fits.
  virtual Result<uint64_t> allocate(uint64_t len) = 0;
  // Length of the allocation starting at `offset` (rounded), or InvalidArgument if `offset` is not
  // the start of a live allocation.
  virtual Result<uint64_t> allocation_length(uint64_t offset) const = 0;
  // Releases the allocation starting at `offset`; returns its (rounded) length. Double frees and
  // offsets that are not the start of a live allocation are InvalidArgument and change nothing.
  virtual Result<uint64_t> free(uint64_t offset) = 0;

  virtual RawAllocatorStats stats() const = 0;
};

// First-fit over a free list ordered by offset; adjacent free ranges are coalesced on free.
std::unique_ptr<RawAllocator> NewFirstFitAllocator(uint64_t capacity);

}  // namespace farmem
