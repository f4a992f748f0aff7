// Remote regions library (issue 14; docs/regions_sync.md): synchronization by name over one-sided
// atomics (rbarrier, rmutex, rbell, rdelete), and rmalloc/rfree, a buddy allocator whose whole
// state lives inside a shared byte range. A RegionSync is used by one thread at a time; a
// RegionHeap handle by any thread or process sharing the range (it locks inside the range).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "farmem/client.h"
#include "farmem/cluster.h"
#include "farmem/node.h"
#include "farmem/status.h"

namespace farmem {

// ---- Synchronization by name --------------------------------------------------------------------

struct RegionSyncOptions {
  // Names live in the cluster store under this prefix (keys "<prefix><name>").
  std::string prefix = "regions/sync/";
  // Polling backoff while waiting: starts at min, doubles up to max (Scheduler::sleep_for).
  std::chrono::microseconds backoff_min{1};
  std::chrono::microseconds backoff_max{1000};
};

// Names resolve through `cluster` (put-if-absent: racing inits agree on one cell) to a 64-byte
// cell in a farmemd raw range; every operation is one-sided (read, FAA, CAS) on that cell. `node`
// (started), `cluster` and `raw` must outlive the RegionSync. `raw` is the farmemd where cells this
// process creates are allocated (persistent: a name outlives its creator until rdelete); it may be
// null for a process that only uses names others created. Not thread-safe: one per thread.
class RegionSync {
 public:
  static Result<std::unique_ptr<RegionSync>> Open(Node& node, Cluster& cluster, RawClient* raw,
                                                  RegionSyncOptions options = {});
  ~RegionSync();
  RegionSync(const RegionSync&) = delete;
  RegionSync& operator=(const RegionSync&) = delete;

  // Creates the name, or agrees with an existing one of the same kind (and, for a barrier, the
  // same n >= 1); FailedPrecondition if it exists as another kind or with another n.
  Status rbarrier_init(std::string_view name, uint32_t n);
  // Arrives and waits until all n of this round arrived (round k of a reusable barrier is
  // arrivals k*n .. k*n+n-1). TimedOut after `timeout`: the arrival stays counted (the round
  // cannot be retried; the other parties may pass it once the arrivals are there).
  Status rbarrier_wait(std::string_view name, std::chrono::milliseconds timeout);

  // A FIFO ticket lock. lock: TimedOut after `timeout` (its ticket is abandoned and skipped, so
  // the lock keeps working); at most 64 waiters at once. unlock: FailedPrecondition unless this
  // RegionSync holds it. A holder that crashes leaves the lock held until rdelete.
  Status rmutex_init(std::string_view name);
  Status rmutex_lock(std::string_view name, std::chrono::milliseconds timeout);
  Status rmutex_unlock(std::string_view name);

  // A doorbell: starts at 0, ring adds 1 (returns the new value); wait returns the value once it
  // differs from the one this RegionSync's last wait on the name returned (0 before the first).
  Status rbell_init(std::string_view name);
  Result<uint64_t> rbell_ring(std::string_view name);
  Result<uint64_t> rbell_wait(std::string_view name, std::chrono::milliseconds timeout);

  // Removes the name: waiters anywhere then get NotFound ("deleted") at their next poll, and the
  // cell's memory is freed. NotFound for an unknown name.
  Status rdelete(std::string_view name);

 private:
  struct Impl;
  explicit RegionSync(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- rmalloc / rfree
// ------------------------------------------------------------------------------

struct RegionHeapStats {
  uint64_t capacity = 0;     // bytes the buddy allocator manages (after its header and map)
  uint64_t allocated = 0;    // bytes in allocated blocks (block sizes, headers included)
  uint64_t allocations = 0;  // live allocations
};

// A handle on a buddy-allocator heap whose whole state is inside `region` (docs/regions_sync.md,
// "rmalloc"): a magic number at offset 0 marks it initialised, a lock word in the header
// serialises every process and thread using it. Attach formats a zeroed range (first user) or
// checks an initialised one; the range (a memfd shared by processes, later an rmmap'ed region)
// may sit at different addresses in different processes: the heap stores only offsets.
class RegionHeap {
 public:
  // InvalidArgument: not 64-byte aligned, too small (< 4 KiB), not zeroed and not a heap, or a
  // heap formatted for a larger range than `region`.
  static Result<RegionHeap> Attach(std::span<std::byte> region);
  // 16-byte aligned memory of at least `len` (>= 1) bytes inside the region. ResourceExhausted
  // when no block fits; TimedOut if the heap's lock stays held for 5 s (a holder died).
  Result<void*> rmalloc(size_t len);
  // InvalidArgument for a pointer rmalloc did not return in this heap, or one already freed.
  Status rfree(void* ptr);
  Result<RegionHeapStats> stats();

 private:
  explicit RegionHeap(std::span<std::byte> region) : region_(region) {}
  std::span<std::byte> region_;
};

// The paper's shape: rmalloc/rfree on a region given as its mapped bytes (Attach on each call).
Result<void*> rmalloc(std::span<std::byte> region, size_t len);
Status rfree(std::span<std::byte> region, void* ptr);

// ---- rmmap: a region mapped as a write-back cache ---------------------------------------------
// (docs/regions_mmap.md). No coherence: a writer rsyncs, a reader rclearcaches.

namespace regions {
class RegionStore;
}

struct RmmapStats {
  uint64_t faults = 0;         // missing-page faults served
  uint64_t zero_fills = 0;     // of those, filled with zeros (holes, past the end, zero pages)
  uint64_t fetch_errors = 0;   // store reads that failed: the access got SIGBUS
  uint64_t pages_written = 0;  // pages rsync wrote back
  uint64_t prefetched = 0;     // pages rprefetch installed (they take no fault later)
  bool write_protect = false;  // plain stores mark pages dirty (userfaultfd write-protect)
};

// Maps `length` bytes (0: the region's current size) of the region at `path` (from the store's
// root) into the process. Each first touch of a 4 KiB page is fetched from the store by a handler
// thread (userfaultfd); a page that cannot be fetched (region gone, server dead: the store read
// fails within its op_timeout) makes the faulting access raise SIGBUS. `store` must outlive the
// mapping. Any thread may use the mapping and call the functions below.
Result<void*> rmmap(regions::RegionStore& store, std::string_view path, size_t length = 0);
// Maps a file of a farmem mount (`farmem mount DIR`) from any process: the mount answers the
// read-only xattr "user.region.map" (to root and the mount's user only) with the file's size,
// where its chunks live and the servers' cluster token; faults are then read one-sidedly from
// farmemd through a process-wide client Node (one per token), exactly as the store-backed rmmap.
// The mapping keeps the file open (its chunks stay pinned as for any open file). rsync writes
// pages over allocated chunks one-sidedly, pages over holes or past the size through the file
// (pwrite: the mount allocates), then re-reads the descriptor. rclearcache re-reads it too.
// Errors: InvalidArgument (not a regular file of a farmem mount, an empty file and no length,
// a file whose descriptor exceeds an xattr: about 1.5 GiB of chunks), PermissionDenied (another
// user than the mount's or root), Unavailable / TimedOut (servers unreachable, within the
// transport's connect timeout), the errno of open(2) otherwise. The file is opened read-write
// when allowed, else read-only (rsync then returns PermissionDenied). Mappings are not inherited
// by fork.
Result<void*> rmmap(std::string_view path, size_t length = 0);
// The same for an open file of a mount (`fd` stays the caller's: the mapping reopens the file
// through /proc/self/fd).
Result<void*> rmmap(int fd, size_t length = 0);
// Ends the handler and unmaps (dirty pages not rsync'ed are lost). NotFound unless `addr` is a
// start rmmap returned.
Status rmunmap(void* addr);
// Marks the pages of [addr, addr+len) dirty for the next rsync (with write_protect, plain stores
// do that too: the first store to a clean page takes one write-protect fault). `zero`: also sets
// the bytes to zero, without fetching pages wholly inside the range.
Status rmarkdirty(void* addr, size_t len, bool zero);
// Fetches the pages of [addr, addr+len) that are not present yet, without faults: each run of
// missing pages (up to 4 MiB at a time) is one store read, whose 128 KiB chunks are read
// one-sidedly in parallel, installed with UFFDIO_COPY; pages already present (fetched, written or
// prefetched before) are skipped, so nothing cached or dirty is overwritten. A read that fails
// returns its error and installs nothing for that run (a later access faults as usual).
Status rprefetch(void* addr, size_t len);
// Writes the dirty pages of [addr, addr+len) back to the store and marks them clean.
Status rsync(void* addr, size_t len);
// Evicts the pages of [addr, addr+len): the next access fetches them again. FailedPrecondition if
// one is dirty.
Status rclearcache(void* addr, size_t len);
Result<RmmapStats> rmmap_stats(void* addr);

}  // namespace farmem
