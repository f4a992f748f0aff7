// PoolSet implementation: virtual reservation, lazy memfd pools, allocation across pools.
// Invariant: pools_[i] is mapped at base_ + i * pool_bytes_; slots beyond pools_.size() stay
// PROT_NONE so a stray access faults instead of touching memory nobody owns.
#include "pools/pool_set.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "common/log.h"

namespace farmem {

Result<std::unique_ptr<PoolSet>> PoolSet::Create(uint64_t memory_bytes, uint64_t pool_bytes,
                                                 RegisterPoolFn register_pool) {
  const long page = sysconf(_SC_PAGESIZE);
  const uint64_t page_bytes = page > 0 ? static_cast<uint64_t>(page) : 4096;
  if (pool_bytes == 0 || pool_bytes % page_bytes != 0) {
    return Status::InvalidArgument("pool size " + std::to_string(pool_bytes) +
                                   " must be a positive multiple of the page size " +
                                   std::to_string(page_bytes));
  }
  if (memory_bytes < pool_bytes) {
    return Status::InvalidArgument("memory budget " + std::to_string(memory_bytes) +
                                   " is smaller than one pool (" + std::to_string(pool_bytes) +
                                   " bytes)");
  }
  if (!register_pool) return Status::InvalidArgument("pool set needs a register function");
  const size_t max_pools = memory_bytes / pool_bytes;
  const uint64_t reserved = max_pools * pool_bytes;
  void* base =
      mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    return Status::FromErrno("reserving " + std::to_string(reserved) + " bytes of address space",
                             errno);
  }
  return std::unique_ptr<PoolSet>(new PoolSet(static_cast<std::byte*>(base), reserved, pool_bytes,
                                              max_pools, std::move(register_pool)));
}

PoolSet::PoolSet(std::byte* base, uint64_t reserved, uint64_t pool_bytes, size_t max_pools,
                 RegisterPoolFn register_pool)
    : base_(base),
      reserved_bytes_(reserved),
      pool_bytes_(pool_bytes),
      max_pools_(max_pools),
      register_pool_(std::move(register_pool)) {}

PoolSet::~PoolSet() {
  for (auto& p : pools_) close(p->fd);
  // One munmap drops the reservation and every memfd mapping inside it.
  munmap(base_, reserved_bytes_);
}

Status PoolSet::AddPool() {
  const size_t index = pool_count();
  const std::string name = "pool-" + std::to_string(index);
  std::byte* slot = base_ + index * pool_bytes_;

  int fd = memfd_create(("farmem-" + name).c_str(), MFD_CLOEXEC);
  if (fd < 0) return Status::FromErrno("memfd_create for " + name, errno);
  if (ftruncate(fd, static_cast<off_t>(pool_bytes_)) != 0) {
    Status st = Status::FromErrno("sizing " + name, errno);
    close(fd);
    return st;
  }
  void* mapped = mmap(slot, pool_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
  if (mapped == MAP_FAILED) {
    Status st = Status::FromErrno("mapping " + name, errno);
    close(fd);
    return st;
  }
  // Put the slot back to an inaccessible reservation if registration fails.
  auto unmap_slot = [&] {
    mmap(slot, pool_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
         0);
    close(fd);
  };
  Result<RegionKey> key = register_pool_(name, slot, pool_bytes_);
  if (!key.ok()) {
    unmap_slot();
    return key.status().WithContext("registering " + name);
  }

  auto pool = std::make_unique<Pool>();
  pool->index = static_cast<int>(index);
  pool->name = name;
  pool->fd = fd;
  pool->addr = slot;
  pool->length = pool_bytes_;
  pool->key = *key;
  pool->allocator = NewFirstFitAllocator(pool_bytes_);
  std::lock_guard lock(mu_);
  by_key_[pool->key] = pool.get();
  pools_.push_back(std::move(pool));
  FARMEM_LOG_DEBUG("created {} ({} bytes at {})", name, pool_bytes_, static_cast<void*>(slot));
  return Status::OK();
}

Result<PoolAllocation> PoolSet::allocate(uint64_t len) {
  if (len == 0) return Status::InvalidArgument("allocation length must be > 0");
  if (len > pool_bytes_) {
    return Status::InvalidArgument("allocation length " + std::to_string(len) +
                                   " exceeds the pool size " + std::to_string(pool_bytes_));
  }
  size_t tried = 0;
  for (;;) {
    std::vector<Pool*> candidates;
    {
      std::lock_guard lock(mu_);
      for (size_t i = tried; i < pools_.size(); ++i) candidates.push_back(pools_[i].get());
    }
    for (Pool* p : candidates) {
      Result<uint64_t> off = p->allocator->allocate(len);
      if (off.ok()) {
        Result<uint64_t> got = p->allocator->allocation_length(*off);
        return PoolAllocation{p->key, *off, got.ok() ? *got : len};
      }
      if (off.status().code() != Code::kResourceExhausted) return off.status();
    }
    tried += candidates.size();

    std::lock_guard grow(grow_mu_);
    if (pool_count() > tried) continue;  // another thread added a pool meanwhile: try it
    if (tried >= max_pools_) {
      return Status::ResourceExhausted(
          "memory budget exhausted: all " + std::to_string(max_pools_) + " pools of " +
          std::to_string(pool_bytes_) + " bytes are in use and none has " + std::to_string(len) +
          " contiguous free bytes");
    }
    FARMEM_RETURN_IF_ERROR(AddPool());
  }
}

Result<uint64_t> PoolSet::free(RegionKey key, uint64_t offset) {
  Pool* pool = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = by_key_.find(key);
    if (it != by_key_.end()) pool = it->second;
  }
  if (!pool) {
    char hex[32];
    std::snprintf(hex, sizeof(hex), "%#llx", static_cast<unsigned long long>(key));
    return Status::NotFound(std::string("no pool has region key ") + hex);
  }
  Result<uint64_t> len = pool->allocator->free(offset);
  if (!len.ok()) return len.status().WithContext(pool->name);
  return len;
}

void PoolSet::release_pages(RegionKey key, uint64_t offset, uint64_t len) {
  Pool* pool = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = by_key_.find(key);
    if (it != by_key_.end()) pool = it->second;
  }
  if (!pool || offset >= pool->length) return;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t stop = std::min(offset + len, pool->length);
  const uint64_t first = std::min((offset + page - 1) / page * page, stop);
  const uint64_t end = std::max(stop / page * page, first);
  // The bytes in pages shared with neighbours are zeroed in place (at most two partial pages), so
  // every free byte of a pool reads zero and ALLOC_RAW hands out zeroed memory (docs/server.md).
  // TEST ONLY: FARMEM_POOLS_FAULT=no_edge_zero leaves them as they were.
  static const bool no_edge_zero = [] {
    const char* f = std::getenv("FARMEM_POOLS_FAULT");
    return f != nullptr && std::string_view(f) == "no_edge_zero";
  }();
  if (!no_edge_zero) {
    std::memset(pool->addr + offset, 0, first - offset);
    std::memset(pool->addr + end, 0, stop - end);
  }
  if (first >= end) return;  // no whole page: neighbours share them
  if (fallocate(pool->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(first),
                static_cast<off_t>(end - first)) != 0) {
    // The pages keep their bytes: zero them by hand, the promise above holds either way.
    FARMEM_LOG_WARN("{}: punching freed pages [{}, {}): {}", pool->name, first, end,
                    std::strerror(errno));
    std::memset(pool->addr + first, 0, end - first);
  }
}

size_t PoolSet::pool_count() const {
  std::lock_guard lock(mu_);
  return pools_.size();
}

const Pool* PoolSet::pool(size_t i) const {
  std::lock_guard lock(mu_);
  return i < pools_.size() ? pools_[i].get() : nullptr;
}

std::vector<PoolSnapshot> PoolSet::snapshot() const {
  std::vector<const Pool*> pools;
  {
    std::lock_guard lock(mu_);
    for (const auto& p : pools_) pools.push_back(p.get());
  }
  std::vector<PoolSnapshot> out;
  out.reserve(pools.size());
  for (const Pool* p : pools) out.push_back({p->name, p->length, p->allocator->stats()});
  return out;
}

}  // namespace farmem
