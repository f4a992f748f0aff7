// RawOwners: the pools service's PoolSet plus which client session owns each raw allocation
// (docs/sessions.md). Allocations with owner kPersistentIndex are not recorded; a session's end
// frees its recorded ones. Threads: pools RPC workers and the session reaper; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>

#include "farmem/status.h"
#include "pools/pool_set.h"
#include "service/session_registry.h"

namespace farmem {

class RawOwners {
 public:
  explicit RawOwners(PoolSet& pools) : pools_(pools) {}
  RawOwners(const RawOwners&) = delete;
  RawOwners& operator=(const RawOwners&) = delete;

  PoolSet& pools() { return pools_; }

  // PoolSet::allocate, recording `owner` unless it is kPersistentIndex.
  Result<PoolAllocation> allocate(uint64_t len, SessionIndex owner);
  // PoolSet::free, forgetting the owner, then PoolSet::release_pages (freed memory leaves RSS).
  // Errors as PoolSet::free.
  Result<uint64_t> free(RegionKey key, uint64_t offset);
  // Frees every allocation `owner` still holds (a session end listener).
  SessionFreed free_owned(SessionIndex owner);

  struct Owned {
    uint64_t allocations = 0;
    uint64_t bytes = 0;
  };
  // Allocations (and their bytes) owned by some session now; the rest of the pools' are persistent.
  Owned owned() const;

 private:
  using Key = std::pair<RegionKey, uint64_t>;  // pool key, offset
  PoolSet& pools_;
  // Held across the PoolSet call and the map update, so the map and the pools never disagree:
  // otherwise a FREE_RAW racing a session end could free a range twice — the second time after
  // another client got it. It serializes raw ALLOC/FREE (RPC-rate operations, not data access).
  mutable std::mutex mu_;
  std::map<Key, std::pair<SessionIndex, uint64_t>> owner_of_;  // -> owner, length
  std::unordered_map<SessionIndex, std::set<Key>> by_owner_;
  Owned owned_;
};

}  // namespace farmem
