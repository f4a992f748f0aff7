// CoRM object store core: per-worker thread allocators that own blocks per size class, and the
// process-wide Store façade (alloc, free, write, RPC-path read, pointer correction, release_ptr).
// No networking here: farmemd's RPC handlers call the Store; clients read slots one-sidedly.
//
// ---- Locking and ordering protocol (read before changing anything) --------------------------
// Lock order (never acquire an earlier lock while holding a later one):
//   1. Worker::mu        (one per thread allocator: its block lists, its ID RNG)
//   2. Block::mu         (reader/writer lock per logical block; two blocks: lower address first)
//   3. Store::pool_mu_   (the recycled Block structs)
//   4. BlockAllocator::mu_ (inside BlockAllocator; leaf)
// Block::mu protects a block's metadata (occupancy, ID -> slot map, virtual blocks, owner):
//   - exclusive: alloc into the block, free, release_ptr, compaction (both blocks), retirement;
//   - shared:    write and RPC read (location lookup + slot access), pointer correction.
//   Every acquisition has a deadline (StoreOptions::op_timeout) and fails with TimedOut. The lock
//   prefers writers so a compaction is not starved by a steady stream of reads.
// Slot memory is NOT protected by Block::mu for one-sided readers: they copy slots with atomic
// word loads and run CheckSlot (object_layout.h). Writers hold the header lock bit (CAS) while
// publishing; the compactor sets the compaction bit on every object it moves before copying and
// clears it (on the destination copy) after the remap, so one-sided readers retry meanwhile.
// Block::dead / Block::live are atomics so allocation can skip blocks without locking them.
// Store::table_[vblock] (atomic Block*) maps every mapped virtual block to the logical block
// whose pages it shows; it is written only under the block's exclusive lock. A thread that
// loads it, locks the block and finds the entry changed (compaction, retirement) retries.
// Block structs are never freed while the Store lives: dead blocks are recycled (generation
// bumped) only by their owner worker under Worker::mu + Block::mu, so a stale Block* is always
// safe to lock and re-validate.
// Invariant (virtual-address reuse): every live object homed at virtual block v lives in the
// logical block that v maps to, and v is in that block's `vblocks`. Compaction moves all objects
// of a block together with all its virtual blocks, so the invariant holds across merges; a
// virtual block is released only when its home count is 0.
#pragma once

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "farmem/status.h"
#include "server/corm/block_allocator.h"
#include "server/corm/object_layout.h"
#include "server/corm/size_classes.h"

namespace farmem::corm {

// How a pointer whose object moved is corrected.
enum class CorrectionMode : uint8_t {
  kAskOwner,  // look the ID up in the block's ID -> offset map (the owning thread's metadata)
  kScan,      // copy the whole (home) block and find the slot carrying the ID
};

// Per size class: whether objects carry IDs (and may move) or keep their offset forever.
enum class ClassMode : uint8_t {
  kIds,         // random per-block IDs; compaction may move objects and keeps their IDs
  kOffsetOnly,  // Mesh-style "CoRM-0": merge only when occupied offsets do not overlap
};

struct StoreOptions {
  size_t block_size = 4096;  // 4 KiB .. 1 MiB, power of two
  int id_bits = 16;          // 0, 8, 12 or 16
  // Classes with more slots per block than 2^id_bits: true -> offset-only (hybrid CoRM);
  // false -> blocks of those classes use only 2^id_bits slots (pure CoRM-k).
  bool hybrid = true;
  uint32_t workers = 1;
  CorrectionMode correction = CorrectionMode::kAskOwner;  // used by Read()
  size_t reserve_bytes = size_t{1} << 30;
  size_t pool_bytes = size_t{16} << 20;
  size_t max_physical_bytes = 0;               // 0 = unlimited
  std::chrono::milliseconds op_timeout{2000};  // lock waits and read retries
  uint64_t seed = 0;                           // 0 = random
};

// Server-side pointer information (what a client's 128-bit pointer carries).
struct ObjectPtr {
  uint64_t addr = 0;        // slot address: home virtual block + (last known) offset
  uint16_t id = 0;          // object ID (0 in offset-only classes)
  uint32_t size_class = 0;  // index into SizeClasses
  uint32_t block = 0;       // home virtual block index (== (addr - base) / block_size)

  bool operator==(const ObjectPtr&) const = default;
};

struct ClassStats {
  uint64_t blocks = 0;
  uint64_t live_objects = 0;
  uint64_t capacity_slots = 0;  // usable slots in the class's blocks
  double fragmentation = 0;     // 1 - live / capacity (0 when no blocks)
  uint64_t slot_size = 0;
};

struct StoreStats {
  uint64_t live_objects = 0;
  uint64_t live_blocks = 0;
  uint64_t live_payload_slot_bytes = 0;  // live objects * their slot size
  BlockAllocatorStats blocks;
};

// Reader/writer lock with deadlines and writer preference (pthread rwlock).
class RwLock {
 public:
  RwLock();
  ~RwLock();
  RwLock(const RwLock&) = delete;
  RwLock& operator=(const RwLock&) = delete;
  bool LockShared(std::chrono::milliseconds timeout);
  bool Lock(std::chrono::milliseconds timeout);
  bool TryLock();
  void UnlockShared() { pthread_rwlock_unlock(&rw_); }
  void Unlock() { pthread_rwlock_unlock(&rw_); }

 private:
  pthread_rwlock_t rw_;
};

namespace detail {

// A logical block: one physical block plus every virtual block currently showing it.
struct Block {
  RwLock mu;
  std::atomic<bool> dead{true};
  std::atomic<uint32_t> live{0};
  // Guarded by mu (exclusive to change):
  uint64_t generation = 0;  // bumped when the struct is recycled
  uint32_t size_class = 0;
  uint32_t slot_size = 0;
  uint32_t slots = 0;     // slots per block
  uint32_t capacity = 0;  // usable slots (== slots, or 2^id_bits in pure CoRM-k)
  ClassMode mode = ClassMode::kIds;
  uint32_t owner = 0;  // worker index
  uint32_t pblock = 0;
  std::vector<uint32_t> vblocks;  // [0] = primary (used for new allocations), then aliases
  std::vector<uint8_t> occupied;  // per slot
  std::vector<uint16_t> slot_id;  // per slot (valid when occupied)
  std::unordered_map<uint16_t, uint32_t> id_to_slot;  // kIds only

  uint32_t primary() const { return vblocks.front(); }
};

}  // namespace detail

// One worker's allocator: the blocks it owns, per size class. Only the Store touches it.
class ThreadAllocator {
 public:
  ThreadAllocator(uint32_t index, size_t num_classes, uint64_t seed)
      : index_(index), by_class_(num_classes), hint_(num_classes, 0), rng_(seed) {}
  uint32_t index() const { return index_; }

 private:
  friend class Store;
  friend class Compactor;
  // Random ID unique within `b` (caller holds Worker mu and b's exclusive lock).
  uint16_t PickId(const detail::Block& b, uint32_t id_space);

  const uint32_t index_;
  std::mutex mu_;
  std::vector<std::vector<detail::Block*>> by_class_;  // owned blocks (dead ones purged lazily)
  std::vector<size_t> hint_;                           // per class: last block allocated from
  std::mt19937_64 rng_;
  // Blocks of this worker that died (emptied or merged away) since the last purge; lets Alloc
  // skip the purge walk in the common case.
  std::atomic<uint32_t> dead_pending_{0};
};

class Store {
 public:
  static Result<std::unique_ptr<Store>> Create(const StoreOptions& options);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  const StoreOptions& options() const { return options_; }
  const SizeClasses& classes() const { return classes_; }
  BlockAllocator& blocks() { return *ba_; }
  const BlockAllocator& blocks() const { return *ba_; }
  uint32_t workers() const { return static_cast<uint32_t>(workers_.size()); }
  ClassMode ModeOf(uint32_t size_class) const { return class_mode_[size_class]; }
  // Mask of the ID bits checked for objects of this class (0 in offset-only classes).
  uint16_t IdMask(uint32_t size_class) const;
  uint32_t SlotSize(uint32_t size_class) const { return classes_.at(size_class).slot_size; }

  // A uniformly random worker (the "random" worker-selection policy; by-connection callers pass
  // their own index).
  uint32_t PickWorker();

  // Allocates a zero-filled object of `size` payload bytes in worker `worker`'s blocks.
  Result<ObjectPtr> Alloc(size_t size, uint32_t worker);
  Status Free(const ObjectPtr& p);
  // Replaces the payload (data.size() <= class capacity; the rest becomes zero). Corrects p.
  Status Write(ObjectPtr& p, std::span<const uint8_t> data);
  // RPC-path read: copies min(out.size(), capacity) payload bytes; corrects p in place. Locates
  // the object with options().correction, then copies + checks the slot, retrying with backoff on
  // torn/locked copies until op_timeout.
  Result<size_t> Read(ObjectPtr& p, std::span<uint8_t> out);
  // Pointer correction: the object's current slot address within its home virtual block.
  Result<ObjectPtr> Locate(const ObjectPtr& p, CorrectionMode mode);
  // Re-homes the object to the primary virtual block of the block that holds it now and drops
  // the old home reference (so the old virtual block can be reused). Returns the new pointer;
  // the old one must not be used afterwards.
  Result<ObjectPtr> ReleasePtr(const ObjectPtr& p);

  ClassStats Stats(uint32_t size_class);
  StoreStats Stats();

  // Called (without locks held) when a block allocation fails for lack of memory, before one
  // retry; the Compactor installs itself here.
  void SetAllocFailureHook(std::function<void(uint32_t size_class)> hook);

 private:
  friend class Compactor;
  explicit Store(const StoreOptions& options, SizeClasses classes);

  // Validates p's shape and returns its block locked (shared or exclusive) and re-validated
  // against table_. The caller unlocks.
  Result<detail::Block*> LockBlockOf(const ObjectPtr& p, bool exclusive);
  // Slot of p's object inside locked block b (ID map or offset), checking home and class.
  Result<uint32_t> ResolveSlotLocked(const detail::Block& b, const ObjectPtr& p) const;
  Result<uint32_t> ScanSlotLocked(const detail::Block& b, const ObjectPtr& p) const;
  uint8_t* SlotAddr(uint32_t vblock, uint32_t slot, uint32_t slot_size) const {
    return ba_->VAddr(vblock) + size_t{slot} * slot_size;
  }
  // Allocates a slot in b (exclusive lock held); b has room.
  Result<ObjectPtr> AllocInBlockLocked(ThreadAllocator& w, detail::Block& b);
  // New logical block for class c owned by w (Worker mu held).
  Result<detail::Block*> NewBlockLocked(ThreadAllocator& w, uint32_t c);
  // Releases an empty block's pages and virtual blocks (exclusive lock held).
  Status RetireBlockLocked(detail::Block& b);
  // Marks b dead (exclusive lock held) and tells its owner to purge it.
  void MarkDeadLocked(detail::Block& b);
  // Releases alias vblock v of b if its home count is 0 (exclusive lock held).
  Status MaybeReleaseAliasLocked(detail::Block& b, uint32_t v);
  detail::Block* TakeBlockStruct();
  void RecycleBlockStruct(detail::Block* b);
  Status TimedOutLocking() const;

  StoreOptions options_;
  SizeClasses classes_;
  std::vector<ClassMode> class_mode_;
  std::vector<uint32_t> class_capacity_;
  std::unique_ptr<BlockAllocator> ba_;
  std::unique_ptr<std::atomic<detail::Block*>[]> table_;  // per virtual block
  std::vector<std::unique_ptr<ThreadAllocator>> workers_;

  std::mutex pool_mu_;
  std::vector<std::unique_ptr<detail::Block>> all_blocks_;
  std::vector<detail::Block*> free_blocks_;

  std::mutex hook_mu_;
  std::function<void(uint32_t)> alloc_failure_hook_;
};

// One-sided helpers: what a client does with bytes it read over the transport.
// Copies the slot at `addr` (live memory, ascending atomic words) into `copy` and checks it.
SlotCheck OneSidedReadSlot(uint64_t addr, uint16_t expected_id, uint16_t id_mask,
                           std::span<uint8_t> copy);
// Finds the slot carrying `id` (allocated, ID match) in a copy of a whole block at block_addr;
// returns its offset or -1.
int64_t ScanBlockImage(std::span<const uint8_t> block, uint32_t slot_size, uint16_t id,
                       uint16_t id_mask);

}  // namespace farmem::corm
