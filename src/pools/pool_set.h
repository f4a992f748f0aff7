// PoolSet: farmemd's memory. One PROT_NONE virtual reservation of the whole budget; pools are
// memfd files mapped MAP_FIXED|MAP_SHARED into consecutive slots of it, created lazily and each
// registered as one region (few regions keeps NIC MR tables small; memfd pages enable remapping).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "farmem/status.h"
#include "farmem/transport.h"
#include "pools/raw_allocator.h"

namespace farmem {

// Makes a new pool reachable by peers (MemoryServer: Node::export_region) and returns its key.
using RegisterPoolFn =
    std::function<Result<RegionKey>(const std::string& name, void* addr, size_t len)>;

// One pool: a memfd file of `length` bytes mapped at `addr`. Immutable after creation except for
// the allocator (which is thread-safe).
struct Pool {
  int index = 0;
  std::string name;  // "pool-<index>"
  int fd = -1;       // the memfd (kept open: compaction will remap its pages)
  std::byte* addr = nullptr;
  uint64_t length = 0;
  RegionKey key = 0;
  std::unique_ptr<RawAllocator> allocator;
};

struct PoolSnapshot {
  std::string name;
  uint64_t length = 0;
  RawAllocatorStats stats;
};

// A granted range: the pool's region key and the range's offset inside that pool.
struct PoolAllocation {
  RegionKey key = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

class PoolSet {
 public:
  // memory_bytes: the budget (rounded down to whole pools); pool_bytes: a multiple of the page
  // size. Reserves the virtual range only; no pool exists until the first allocation.
  static Result<std::unique_ptr<PoolSet>> Create(uint64_t memory_bytes, uint64_t pool_bytes,
                                                 RegisterPoolFn register_pool);
  ~PoolSet();
  PoolSet(const PoolSet&) = delete;
  PoolSet& operator=(const PoolSet&) = delete;

  // First fit over existing pools, then a new pool while the budget allows.
  // InvalidArgument: len 0 or > pool_bytes. ResourceExhausted: budget used up.
  Result<PoolAllocation> allocate(uint64_t len);
  // Frees the allocation starting at `offset` of the pool with `key`; returns its length.
  // NotFound: no pool has that key. InvalidArgument: not the start of a live allocation.
  Result<uint64_t> free(RegionKey key, uint64_t offset);

  // Gives the whole pages inside the free range [offset, offset + len) of pool `key` back to the
  // kernel (FALLOC_FL_PUNCH_HOLE on the memfd; they read as zeros afterwards), so freed raw memory
  // stops counting in the process's RSS, and zeroes the bytes of the range in pages it shares with
  // neighbours. Invariant: every free byte of a pool reads zero (a new memfd does), so an
  // allocation is zeroed memory — unless a client wrote one-sidedly into a range after freeing it.
  // The caller guarantees the range is free and is not allocated again before this returns
  // (RawOwners holds its lock across both). A failed punch is logged and the pages are zeroed.
  void release_pages(RegionKey key, uint64_t offset, uint64_t len);

  uint64_t pool_bytes() const { return pool_bytes_; }
  size_t max_pools() const { return max_pools_; }
  uint64_t reserved_bytes() const { return reserved_bytes_; }
  size_t pool_count() const;
  // Pool `i` (< pool_count()); pools live as long as the set.
  const Pool* pool(size_t i) const;
  std::vector<PoolSnapshot> snapshot() const;

 private:
  PoolSet(std::byte* base, uint64_t reserved, uint64_t pool_bytes, size_t max_pools,
          RegisterPoolFn register_pool);
  // Creates pool number pools_.size(); caller holds grow_mu_.
  Status AddPool();

  std::byte* const base_;
  const uint64_t reserved_bytes_;
  const uint64_t pool_bytes_;
  const size_t max_pools_;
  RegisterPoolFn register_pool_;

  std::mutex grow_mu_;     // serializes pool creation
  mutable std::mutex mu_;  // guards pools_ and by_key_ (the Pool objects themselves are stable)
  std::vector<std::unique_ptr<Pool>> pools_;
  std::map<RegionKey, Pool*> by_key_;
};

}  // namespace farmem
