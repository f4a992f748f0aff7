// First-fit raw allocator: a free list (offset -> length) with coalescing and a map of live
// allocations, both std::map under one mutex. Invariant: free ranges and live allocations are
// disjoint, 64-byte aligned, and together tile [0, capacity).
#include "pools/raw_allocator.h"

#include <iterator>
#include <map>
#include <mutex>
#include <string>

namespace farmem {
namespace {

class FirstFitAllocator final : public RawAllocator {
 public:
  explicit FirstFitAllocator(uint64_t capacity) : capacity_(capacity & ~(kRawAlignment - 1)) {
    if (capacity_ > 0) free_[0] = capacity_;
  }

  Result<uint64_t> allocate(uint64_t len) override {
    if (len == 0) return Status::InvalidArgument("allocation length must be > 0");
    if (len > capacity_) {
      return Status::InvalidArgument("allocation length " + std::to_string(len) +
                                     " exceeds the pool size " + std::to_string(capacity_));
    }
    const uint64_t size = (len + kRawAlignment - 1) & ~(kRawAlignment - 1);
    std::lock_guard lock(mu_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < size) continue;
      const uint64_t offset = it->first;
      const uint64_t rest = it->second - size;
      free_.erase(it);
      if (rest > 0) free_[offset + size] = rest;
      used_[offset] = size;
      allocated_ += size;
      return offset;
    }
    return Status::ResourceExhausted("no free range of " + std::to_string(size) + " bytes");
  }

  Result<uint64_t> allocation_length(uint64_t offset) const override {
    std::lock_guard lock(mu_);
    auto it = used_.find(offset);
    if (it == used_.end()) return NotAnAllocation(offset);
    return it->second;
  }

  Result<uint64_t> free(uint64_t offset) override {
    std::lock_guard lock(mu_);
    auto used = used_.find(offset);
    if (used == used_.end()) return NotAnAllocation(offset);
    const uint64_t size = used->second;
    used_.erase(used);
    allocated_ -= size;

    uint64_t start = offset;
    uint64_t len = size;
    auto next = free_.lower_bound(offset);
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        start = prev->first;
        len += prev->second;
        free_.erase(prev);
      }
    }
    if (next != free_.end() && next->first == offset + size) {
      len += next->second;
      free_.erase(next);
    }
    free_[start] = len;
    return size;
  }

  RawAllocatorStats stats() const override {
    std::lock_guard lock(mu_);
    RawAllocatorStats s;
    s.capacity = capacity_;
    s.allocated_bytes = allocated_;
    s.free_bytes = capacity_ - allocated_;
    s.allocations = used_.size();
    s.free_ranges = free_.size();
    for (const auto& [off, len] : free_) s.largest_free = std::max(s.largest_free, len);
    return s;
  }

 private:
  // Explains why `offset` cannot be freed: already free (double free), inside an allocation, or
  // outside the pool. Caller holds mu_.
  Status NotAnAllocation(uint64_t offset) const {
    const std::string at = "offset " + std::to_string(offset);
    if (offset >= capacity_) {
      return Status::InvalidArgument(at + " is outside the pool (size " +
                                     std::to_string(capacity_) + ")");
    }
    auto f = free_.upper_bound(offset);
    if (f != free_.begin()) {
      --f;
      if (offset < f->first + f->second) {
        return Status::InvalidArgument(at + " is not allocated (double free?)");
      }
    }
    auto u = used_.upper_bound(offset);
    if (u != used_.begin()) {
      --u;
      if (offset < u->first + u->second) {
        return Status::InvalidArgument(at + " is inside the allocation at offset " +
                                       std::to_string(u->first) +
                                       ", not the start of an allocation");
      }
    }
    return Status::Internal(at + " is neither free nor allocated");
  }

  const uint64_t capacity_;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, coalesced
  std::map<uint64_t, uint64_t> used_;  // offset -> rounded length
  uint64_t allocated_ = 0;
};

}  // namespace

std::unique_ptr<RawAllocator> NewFirstFitAllocator(uint64_t capacity) {
  return std::make_unique<FirstFitAllocator>(capacity);
}

}  // namespace farmem
