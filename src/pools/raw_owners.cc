// RawOwners: the owner map kept in step with the PoolSet under one lock (see raw_owners.h).
#include "pools/raw_owners.h"

#include "common/log.h"

namespace farmem {

Result<PoolAllocation> RawOwners::allocate(uint64_t len, SessionIndex owner) {
  std::lock_guard lock(mu_);
  FARMEM_ASSIGN_OR_RETURN(PoolAllocation a, pools_.allocate(len));
  if (owner != kPersistentIndex) {
    const Key k{a.key, a.offset};
    owner_of_[k] = {owner, a.length};
    by_owner_[owner].insert(k);
    ++owned_.allocations;
    owned_.bytes += a.length;
  }
  return a;
}

Result<uint64_t> RawOwners::free(RegionKey key, uint64_t offset) {
  std::lock_guard lock(mu_);
  FARMEM_ASSIGN_OR_RETURN(uint64_t len, pools_.free(key, offset));
  pools_.release_pages(key, offset, len);  // under mu_: nobody allocates the range meanwhile
  if (auto it = owner_of_.find({key, offset}); it != owner_of_.end()) {
    auto set = by_owner_.find(it->second.first);
    set->second.erase(it->first);
    if (set->second.empty()) by_owner_.erase(set);
    --owned_.allocations;
    owned_.bytes -= it->second.second;
    owner_of_.erase(it);
  }
  return len;
}

SessionFreed RawOwners::free_owned(SessionIndex owner) {
  SessionFreed freed;
  std::lock_guard lock(mu_);
  auto set = by_owner_.find(owner);
  if (set == by_owner_.end()) return freed;
  for (const Key& k : set->second) {
    auto it = owner_of_.find(k);
    Result<uint64_t> len = pools_.free(k.first, k.second);
    if (!len.ok()) {
      // Cannot happen while every free goes through this class; say so loudly if it does.
      FARMEM_LOG_ERROR("freeing session {}'s raw range at offset {}: {}", owner, k.second,
                       len.status().ToString());
    } else {
      freed.raw_bytes += *len;
      pools_.release_pages(k.first, k.second, *len);
    }
    --owned_.allocations;
    owned_.bytes -= it->second.second;
    owner_of_.erase(it);
  }
  by_owner_.erase(set);
  return freed;
}

RawOwners::Owned RawOwners::owned() const {
  std::lock_guard lock(mu_);
  return owned_;
}

}  // namespace farmem
