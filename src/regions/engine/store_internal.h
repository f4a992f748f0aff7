// Internals shared by the region store's two source files (region_store.cc: the file-system
// operations; region_store_mirror.cc: the mirror of the cluster store and the multi-mount
// protocol): the inode and unit structures, the FARMEM_REGIONS_FAULT switch, errno statuses.
// Not part of any public interface.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <list>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>

#include "regions/engine/region_store.h"

namespace farmem::regions::internal {

// Test-only protections that FARMEM_REGIONS_FAULT removes (read once per process; the list is in
// region_store.cc and docs/regions.md "Tests").
bool Fault(std::string_view name);
// A status whose message starts with the errno's name (ErrnoOf maps it back).
Status Err(int e, std::string_view what);
int64_t NowNs();
// Field 22 of /proc/<pid>/stat (start time in clock ticks after boot), "" if there is no such
// process or it is a zombie.
std::string ProcStartTime(int32_t pid);
// The thread group (process) of thread `tid`, from /proc/<tid>/status; `tid` when unreadable.
int32_t TgidOf(int32_t tid);
Status CheckName(std::string_view name);
// "inode/<ino>" and the other keys of the store's prefix (docs/regions.md "Several mounts").
std::string InodeKey(uint64_t ino);
std::string DirentKey(uint64_t parent, std::string_view name);
std::string DirentValue(uint64_t child);
std::string OpenKey(uint64_t ino, std::string_view mount);
std::string OpenPrefix(uint64_t ino);
std::string FreePrefix(uint64_t ino);
inline constexpr uint32_t kNoServer = UINT32_MAX;  // a unit on a server this store was not given
inline constexpr int kMaxConflicts = 64;           // transactions retried this often, then EIO

}  // namespace farmem::regions::internal

namespace farmem::regions {

struct RegionStore::Inode {
  InodeRecord rec;         // header (size, mode, ...), map, symlink target: as the store has it
  std::string raw;         // the record's exact bytes in the store (what a compare-and-set checks)
  bool stored = true;      // the store has a record (false: it went while this mount has it open)
  bool reclaimed = false;  // gone from this store
  uint32_t opens = 0;      // this mount's handles
  uint32_t writers = 0;
  // Guards publishing this mount's open record and ONEWRITER claim (held across those store
  // calls, before io and mu_); `published` / `writer_claimed` say what the store holds.
  std::mutex open_mu;
  std::atomic<bool> published{false};
  std::atomic<bool> writer_claimed{false};
  // Writes in flight: the bytes each claimed (its own, widened to whole chunks where it allocated:
  // its zeroing covers them) and the chunks it allocated, which are not in `rec` until the write
  // records them (readers see holes there). A write waits until no claimed span overlaps its own.
  struct Claim {
    uint64_t from = 0, to = 0;
  };
  std::list<Claim> claims;
  std::shared_mutex io;
  bool Overlaps(uint64_t from, uint64_t to) const {
    for (const Claim& c : claims)
      if (c.from < to && from < c.to) return true;
    return false;
  }
  bool revoked() const { return rec.h.attr_flags & kStateRevoked; }
  bool is_dir() const { return (rec.h.mode & S_IFMT) == S_IFDIR; }
  bool is_reg() const { return (rec.h.mode & S_IFMT) == S_IFREG; }
};

struct RegionStore::Unit {
  uint32_t server = 0;  // internal::kNoServer: not one of this store's servers
  RemoteRef base;
  uint16_t used = 0;  // bit i: chunk i is in some region's map, a free record or a write in flight
  // Bit i: chunk i was handed out since ALLOC_RAW granted the unit, so it may hold a freed
  // region's bytes. A chunk never handed out reads zero (ALLOC_RAW gives zeroed memory,
  // docs/server.md) and needs no zeroing. Units loaded from metadata: all set (unknown history).
  uint16_t touched = 0xffff;
  // This mount allocates from the unit (unitowner/<gid> is its own) once the watch has delivered
  // this revision: an adopted unit's chunks are all known by then.
  int64_t usable_rev = 0;
};

struct RegionStore::Server {
  std::string address;
  std::unique_ptr<RawClient> client;
};

}  // namespace farmem::regions
