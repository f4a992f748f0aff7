// CoRM object store core: per-worker thread allocators that own blocks per size class, and the
// process-wide Store façade (alloc, free, write, RPC-path read, pointer correction, release_ptr).
// No networking here: farmemd's RPC handlers call the Store; clients read slots one-sidedly.
//
// ---- Locking and ordering protocol (read before changing anything) --------------------------
// Lock order (never acquire an earlier lock while holding a later one):
//   0. Store::merge_gate_ (shared: one compaction merge, taken before its block locks;
//                         exclusive: one FreeOwned sweep, see Store::FreeOwned)
//   1. Worker::mu        (one per thread allocator: its allocations, block creation/recycling,
//                         its ID RNG)
//   2. Block::mu         (reader/writer lock per logical block; two blocks: lower address first)
//   3. Worker::lists_mu  (the owner's per-class block lists, free-slot lists and dead list; at
//                         most one worker's at a time; held only for O(1) list edits or a walk
//                         of one class's list (Stats, compaction's Collect))
//   4. StructSlab::mu_   (inside Store::structs_, the block structs; leaf)
//   5. BlockAllocator::mu_ (inside BlockAllocator; leaf)
//   5. MetaArena::mu_      (inside the metadata arena; leaf, never held with BlockAllocator::mu_)
// Block::mu protects a block's metadata (occupancy, ID -> slot table, virtual blocks, owning
// worker, per-slot owners):
//   - exclusive: alloc into the block, free, free_owned, set_owner, release_ptr, compaction (both
//     blocks), retirement;
//   - shared:    write and RPC read (location lookup + slot access), pointer correction.
//   Every acquisition has a deadline (StoreOptions::op_timeout) and fails with TimedOut. The lock
//   prefers writers so a compaction is not starved by a steady stream of reads.
// Slot memory is NOT protected by Block::mu for one-sided readers: they copy slots with atomic
// word loads and run CheckSlot (object_layout.h). Writers hold the header lock bit (CAS) while
// publishing; the compactor sets the compaction bit on every object it moves before copying and
// clears it (on the destination copy) after the remap, so one-sided readers retry meanwhile.
// Block::dead / Block::live are atomics so stats and compaction can read them without locking.
// Store::table_[vblock] (atomic Block*) maps the head of every mapped virtual block (a block of a
// class may span several base blocks: size_classes.h) to the logical block whose pages it shows; it
// is written only under the block's exclusive lock. A thread that loads it, locks the block and
// finds the entry changed (compaction, retirement) retries. Owner lists (per worker and class,
// under Worker::lists_mu): `blocks` = every live block the worker owns, `avail` = the live blocks
// with a free slot; each block stores its index in both (swap-remove in O(1)). Invariant:
// Block::in_avail == (!dead && live < capacity), and in_avail
// <=> the block is in its owner's `avail`. Whoever changes live or dead (alloc, free, merge,
// retirement; all under the block's exclusive lock) restores it before unlocking
// (Store::SyncAvailLocked / MarkDeadLocked), taking the owner's lists_mu after Block::mu.
// Block structs are never freed while the Store lives. A block that dies (emptied or merged
// away) leaves both lists at once and goes to its owner's `dead` list; only the owner recycles
// it (generation bumped), in Alloc under Worker::mu + Block::mu. A block's per-slot arrays and
// ID table are freed when it dies (only the struct waits), so a stale Block* is always safe
// to lock and re-validate (and must be re-validated before its arrays are touched), and a Block*
// Alloc read from `avail` cannot be recycled before Alloc locks it (Alloc holds Worker::mu).
// `generation` changes only while the struct is in no list, so reading it under lists_mu for a
// listed block is race-free. Invariant (virtual-address reuse): every live object homed at virtual
// block v lives in the logical block that v maps to, and v is in that block's `vblocks`. Compaction
// moves all objects of a block together with all its virtual blocks, so the invariant holds across
// merges; a virtual block is released only when its home count is 0.
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
#include <vector>

#include "farmem/status.h"
#include "objects/engine/block_allocator.h"
#include "objects/engine/lazy_array.h"
#include "objects/engine/meta_arena.h"
#include "objects/engine/struct_grace.h"
#include "objects/engine/struct_slab.h"
#include "objects/format/object_layout.h"
#include "objects/format/size_classes.h"

namespace farmem::corm {

// Owner of an allocation: 0 = persistent (nobody's; freed only by free()), 1..65535 = a session
// index (farmemd frees a session's objects when it ends; docs/objects.md, "Ownership (engine)").
using OwnerId = uint16_t;
inline constexpr OwnerId kPersistentOwner = 0;

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
  // Block geometry (size_classes.h, docs/objects.md "Block geometry"): the base block (4 KiB ..
  // 1 MiB, power of two: the unit of virtual addresses, remaps and home indexes), the largest
  // multi-slot block, and how many slots a class's block should hold at least.
  size_t block_size = 4096;
  size_t max_block_size = size_t{64} << 10;
  uint32_t min_slots_per_block = 16;
  int id_bits = 16;  // 0, 8, 12 or 16
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
  // A released virtual block is handed out again only once this many others were released after
  // it (or no never-used block is left): stale pointers into it have time to be noticed before
  // their addresses show new objects (BlockAllocatorOptions::vblock_quarantine).
  size_t vblock_quarantine = 1024;
};

// Server-side pointer information (what a client's 128-bit pointer carries).
struct ObjectPtr {
  uint64_t addr = 0;        // slot address: home virtual block + (last known) offset
  uint16_t id = 0;          // object ID (0 in offset-only classes)
  uint32_t size_class = 0;  // index into SizeClasses
  uint32_t block = 0;       // home virtual block index (== (addr - base) / block_size)
  // Generation of the allocation: together with the home block and the slot it names one
  // allocation (docs/objects.md, "Pointer identity"); a freed-and-reused slot has another one.
  uint16_t gen = 0;

  bool operator==(const ObjectPtr&) const = default;
};

struct ClassStats {
  uint64_t blocks = 0;
  uint64_t live_objects = 0;
  uint64_t capacity_slots = 0;  // usable slots in the class's blocks
  double fragmentation = 0;     // 1 - live / capacity (0 when no blocks)
  uint64_t slot_size = 0;
};

// Memory the store keeps outside its blocks, in the malloc heap (bytes; vector capacities and
// struct sizes, without malloc's own per-chunk overhead). physical_bytes_held counts only the
// blocks; this is the rest a server pays for the same objects (issue 15: it was 2-4 MiB at 4 KiB
// blocks on the objects-memory traces, often more than the live data, and counted nowhere).
struct MetadataStats {
  // Block struct chunks (spare and pooled structs too: never freed) + the pool's vectors.
  uint64_t block_structs = 0;
  // per-slot tables (SlotTable: IDs, generations, owners, occupancy) and vblocks arrays, and
  // merges' rename entries
  uint64_t per_slot = 0;
  uint64_t id_tables = 0;    // IdTable entries and used bits
  uint64_t owner_lists = 0;  // per worker and class `blocks` / `avail` lists, dead lists
  // table_, next_gen_ and the block allocator's per-virtual-block arrays (lazily zeroed tables
  // sized by reserve_bytes / block_size, counted in whole pages up to the highest virtual block
  // ever used), plus the allocator's per-physical-block array and free lists.
  uint64_t per_vblock = 0;
  // owned_ and owner_pending_ (65536 entries each, lazily zeroed): the pages holding an entry of
  // a session that had objects.
  uint64_t per_owner = 0;
  // The metadata arena's cost beyond per_slot and id_tables: the free parts of its resident
  // pages and its bitmap / per-page counts (MetaArena).
  uint64_t arena_slack = 0;
  // What grows with the objects (everything but the fixed tables).
  uint64_t dynamic() const {
    return block_structs + per_slot + id_tables + owner_lists + arena_slack;
  }
  uint64_t total() const { return dynamic() + per_vblock + per_owner; }
  bool operator==(const MetadataStats&) const = default;
};

struct StoreStats {
  uint64_t live_objects = 0;
  uint64_t live_blocks = 0;
  uint64_t live_payload_slot_bytes = 0;  // live objects * their slot size
  uint64_t owned_objects = 0;            // live objects with an owner != kPersistentOwner
  uint64_t persistent_objects = 0;       // live objects owned by kPersistentOwner
  BlockAllocatorStats blocks;
  MetadataStats metadata;
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

// ID -> slot index of one block with IDs. It stores only slot numbers (uint16: a block has at
// most 65536 slots) and reads each entry's key through the block's per-slot `slot_id` array, so
// it costs 2 B + 1 bit per entry; open addressing (linear probing, Fibonacci hash, no
// tombstones: erase shifts entries back) with a power-of-two size >= 2 x capacity (load <= 1/2).
// It replaced an unordered_map<uint16, uint32> that cost ~40 B per live object (t2 trace: 136 MiB
// RSS for 114 MiB of blocks).
// Blocks of <= kScanMaxSlots slots keep no table and scan slot_id instead: measured (2 cores
// under load) 70-170 ns per lookup for 8-32 slots vs 40-80 ns with a table, negligible next to an
// RPC, while the table would cost ~200 B (with vector and malloc overhead) per small block.
class IdTable {
 public:
  static constexpr uint32_t kScanMaxSlots = 256;
  static constexpr uint32_t kNotFound = UINT32_MAX;

  // Empties the table and sizes it for a block of `slots` slots holding at most `capacity` IDs
  // (capacity 0: no IDs, no table), in arena `a`. Memory of another previous size is released.
  // False when the arena is full (the table is then released).
  bool Reset(MetaArena& a, uint32_t slots, uint32_t capacity);
  // Moves the table's memory down in the arena when a lower run is free (ArenaArray::Relocate).
  void Relocate(MetaArena& a) {
    entries_.Relocate(a);
    used_.Relocate(a);
  }
  // Drops every entry, keeps the size.
  void Clear();
  // Slot holding `id`, or kNotFound. slot_id is the block's per-slot ID array, occupied(s) says
  // whether slot s holds an object.
  template <typename Occupied>
  uint32_t Find(uint16_t id, std::span<const uint16_t> slot_id, Occupied occupied) const {
    if (entries_.empty()) {
      // Compare IDs first (a free slot keeps its last ID, so a match is checked for occupancy):
      // the loop over slot_id alone vectorises.
      const uint32_t n = std::min<uint32_t>(slots_, static_cast<uint32_t>(slot_id.size()));
      for (uint32_t s = 0; s < n; ++s) {
        if (slot_id[s] == id && occupied(s)) return s;
      }
      return kNotFound;
    }
    // At least half the entries are free, so the probe ends; the bound is belt and braces.
    uint32_t i = Home(id);
    for (uint32_t n = 0; n <= mask_ && Used(i); ++n, i = (i + 1) & mask_) {
      if (slot_id[entries_[i]] == id) return entries_[i];
    }
    return kNotFound;
  }
  // Indexes `slot`, whose ID slot_id[slot] must not be indexed yet. False (nothing changed) when
  // the table is full, which the callers' live <= capacity bound rules out.
  bool Insert(uint32_t slot, std::span<const uint16_t> slot_id);
  // Removes `slot`'s entry (slot_id[slot] still holds its ID). False if it was not indexed.
  bool Erase(uint32_t slot, std::span<const uint16_t> slot_id);
  bool scanning() const { return entries_.empty(); }
  size_t size() const { return count_; }
  size_t MemoryBytes() const { return entries_.MemoryBytes() + used_.MemoryBytes(); }

 private:
  uint32_t Home(uint16_t id) const { return (uint32_t{id} * 2654435769u) >> shift_; }
  bool Used(uint32_t i) const { return (used_[i >> 6] >> (i & 63)) & 1; }
  void SetUsed(uint32_t i, bool on) {
    if (on) {
      used_[i >> 6] |= uint64_t{1} << (i & 63);
    } else {
      used_[i >> 6] &= ~(uint64_t{1} << (i & 63));
    }
  }

  uint32_t slots_ = 0;  // scan bound when there is no table
  uint32_t mask_ = 0;   // entries_.size() - 1
  int shift_ = 32;      // 32 - log2(entries_.size())
  size_t count_ = 0;
  ArenaArray<uint16_t> entries_;  // slot numbers
  ArenaArray<uint64_t> used_;     // bit per entry
};

inline constexpr uint32_t kNoPos = UINT32_MAX;

// A block's per-slot metadata in one arena allocation (one allocation, not four: each is rounded
// up to the arena's 16 B unit, and each handle costs the block struct 16 B). Layout, in 16-bit
// words: slots IDs (valid when occupied), slots generations (of the object in the slot, of the
// last one when free; they move with the object in a merge, and the header holds only their low
// bits: TagOf), slots owners (OwnerId, kPersistentOwner when free; moved like generations), then
// the occupancy bitmap (bit s of word s / 16). 6 B + 1 bit per slot.
class SlotTable {
 public:
  // All slots free, IDs and generations 0, owners kPersistentOwner (0). False when the arena is
  // full (the table is then empty).
  bool Assign(MetaArena& a, uint32_t slots) {
    slots_ = slots;
    if (!words_.Assign(a, Words(slots), 0)) {
      slots_ = 0;
      return false;
    }
    return true;
  }
  void Release(MetaArena& a) {
    words_.Release(a);
    slots_ = 0;
  }
  void Relocate(MetaArena& a) { words_.Relocate(a); }
  uint64_t MemoryBytes() const { return words_.MemoryBytes(); }
  uint32_t size() const { return slots_; }

  std::span<uint16_t> ids() { return {words_.data(), slots_}; }
  std::span<const uint16_t> ids() const { return {words_.data(), slots_}; }
  std::span<uint16_t> gens() { return {words_.data() + slots_, slots_}; }
  std::span<const uint16_t> gens() const { return {words_.data() + slots_, slots_}; }
  std::span<uint16_t> owners() { return {words_.data() + 2 * size_t{slots_}, slots_}; }
  std::span<const uint16_t> owners() const { return {words_.data() + 2 * size_t{slots_}, slots_}; }
  bool occupied(uint32_t s) const { return (Bits()[s / 16] >> (s % 16)) & 1; }
  void set_occupied(uint32_t s, bool on) {
    uint16_t& w = const_cast<uint16_t*>(Bits())[s / 16];
    w = static_cast<uint16_t>(on ? w | (1u << (s % 16)) : w & ~(1u << (s % 16)));
  }

 private:
  static size_t Words(uint32_t slots) { return 3 * size_t{slots} + (size_t{slots} + 15) / 16; }
  const uint16_t* Bits() const { return words_.data() + 3 * size_t{slots_}; }
  ArenaArray<uint16_t> words_;
  uint32_t slots_ = 0;
};

// An ID a merge re-drew (docs/objects.md, "Merges that re-draw IDs"): pointers made before the
// re-draw carry (home, old_id, gen); the object now has ID `id` (kept current when it is re-drawn
// again). Kept in the block that holds the object, moved with it by merges, dropped when the
// object is freed or re-homed. Invariant: no live object homed at `home` has ID `old_id`, so an
// old pointer never passes a one-sided tag + home check on another object (and the RPC paths
// resolve it here to the renamed object).
struct Rename {
  uint32_t home;
  uint16_t old_id;
  uint16_t gen;
  uint16_t id;
};
static_assert(sizeof(Rename) == 12, "Rename entries are counted as per-slot metadata");

// The renames of one block. Usually there are none, and block structs live as long as the
// Store, so a block holds one pointer (8 B) rather than an empty vector (24 B: 12 KiB per chunk
// of 512 structs, measurable on the objects-memory traces).
class RenameList {
 public:
  bool empty() const { return v_ == nullptr || v_->empty(); }
  const Rename* begin() const { return v_ ? v_->data() : nullptr; }
  const Rename* end() const { return v_ ? v_->data() + v_->size() : nullptr; }
  Rename* begin() { return v_ ? v_->data() : nullptr; }
  Rename* end() { return v_ ? v_->data() + v_->size() : nullptr; }
  void push_back(const Rename& r) {
    if (!v_) v_ = std::make_unique<std::vector<Rename>>();
    v_->push_back(r);
  }
  void Append(const RenameList& other) {
    if (other.empty()) return;
    if (!v_) v_ = std::make_unique<std::vector<Rename>>();
    v_->insert(v_->end(), other.begin(), other.end());
  }
  // Drops the entries whose object has ID `id` (its renames).
  void EraseId(uint16_t id) {
    if (v_) std::erase_if(*v_, [id](const Rename& r) { return r.id == id; });
  }
  void Release() { v_.reset(); }  // drops every entry and frees the memory
  // Heap bytes (the vector object and its capacity).
  uint64_t MemoryBytes() const {
    return v_ ? sizeof(std::vector<Rename>) + v_->capacity() * sizeof(Rename) : 0;
  }

 private:
  std::unique_ptr<std::vector<Rename>> v_;
};

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
  // Changed under mu (exclusive) AND the owner's lists_mu; read under either. (Placed next to
  // `mode` to fill its padding: block structs live as long as the Store.)
  bool in_avail = false;  // in the owner's free-slot list
  uint32_t owner = 0;     // worker index
  uint32_t pblock = 0;
  uint32_t first_free = 0;  // no free slot below this index (first-fit search start)
  // Per-block arrays live in the Store's MetaArena (docs/objects.md, "Metadata accounting").
  ArenaArray<uint32_t> vblocks;  // [0] = primary (used for new allocations), then aliases
  // Per slot: ID, generation (the RPC paths compare all 16 bits), owner (release_ptr, same slot,
  // keeps it) and occupancy.
  SlotTable slot_table;
  bool occupied(uint32_t s) const { return slot_table.occupied(s); }
  std::span<uint16_t> slot_id() { return slot_table.ids(); }
  std::span<const uint16_t> slot_id() const { return slot_table.ids(); }
  std::span<uint16_t> slot_gen() { return slot_table.gens(); }
  std::span<const uint16_t> slot_gen() const { return slot_table.gens(); }
  std::span<uint16_t> slot_owner() { return slot_table.owners(); }
  std::span<const uint16_t> slot_owner() const { return slot_table.owners(); }
  IdTable ids;  // kIds only
  // IDs re-drawn by merges whose objects still live here (kIds only; usually empty).
  RenameList renames;
  // Guarded by the owner's lists_mu: positions in the owner's lists (kNoPos: not listed).
  uint32_t list_pos = kNoPos;
  uint32_t avail_pos = kNoPos;
  // Guarded by mu: the per-slot and ID-table bytes last added to the Store's metadata counters
  // (Store::CountMetadataLocked), so a resize adds only its difference.
  uint64_t counted_slot_bytes = 0;
  uint64_t counted_id_bytes = 0;

  uint32_t primary() const { return vblocks.front(); }
  // Slot of the object with this ID (kIds), or IdTable::kNotFound.
  uint32_t FindSlot(uint16_t id) const {
    return ids.Find(id, slot_id(), [this](uint32_t s) { return occupied(s); });
  }
  // Records an object in a free slot (exclusive lock held; live and the per-owner counts are
  // the caller's business).
  void AddObject(uint32_t slot, uint16_t id, uint16_t gen, uint16_t owner);

  // Forgets the object in an occupied slot (exclusive lock held), and its renames.
  void RemoveObject(uint32_t slot);
  // Current ID of the object that pointers (home, old_id, gen) name after a re-draw, or -1.
  int32_t FindRenamed(uint32_t home, uint16_t old_id, uint16_t gen) const;
  // Drops the renames of the object whose current ID is `id` (freed or re-homed).
  void DropRenames(uint16_t id);

  // Heap bytes of the per-slot arrays (vblocks included) and of the ID table (lock held).
  uint64_t SlotArrayBytes() const;
  uint64_t IdTableBytes() const { return ids.MemoryBytes(); }
};

}  // namespace detail

// One worker's allocator: the blocks it owns, per size class. Only the Store touches it.
class ThreadAllocator {
 public:
  ThreadAllocator(uint32_t index, size_t num_classes, uint64_t seed)
      : index_(index), rng_(seed), lists_(num_classes) {}
  uint32_t index() const { return index_; }

 private:
  friend class Store;
  friend class Compactor;
  // Random ID unique within `b` (caller holds Worker mu and b's exclusive lock).
  uint16_t PickId(const detail::Block& b, uint32_t id_space);

  // Per class. Alloc takes avail.back(): O(1), and LIFO order refills the block that most
  // recently regained a slot. Such a block was full until a free, so this fills holes in nearly
  // full blocks first (what "fullest first" would mostly pick too) and keeps one fresh block
  // filling until it is full, while blocks that drain further are left to compaction. An
  // occupancy-ordered set would cost O(log n) on every alloc and free (the key changes on each),
  // for a placement that differs only when several blocks regained slots at once.
  struct ClassLists {
    std::vector<detail::Block*> blocks;  // every live block of the class (Block::list_pos)
    std::vector<detail::Block*> avail;   // live blocks with a free slot (Block::avail_pos)
  };

  const uint32_t index_;
  std::mutex mu_;  // Worker::mu
  std::mt19937_64 rng_;
  std::mutex lists_mu_;  // Worker::lists_mu: lists_, dead_, Block::list_pos / avail_pos
  std::vector<ClassLists> lists_;
  std::vector<detail::Block*> dead_;  // died, not yet recycled (owner recycles them)
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
  // Where the per-block arrays live (stats; tests switch its page release off).
  MetaArena& meta_arena() { return *meta_; }
  const BlockAllocator& blocks() const { return *ba_; }
  uint32_t workers() const { return static_cast<uint32_t>(workers_.size()); }
  ClassMode ModeOf(uint32_t size_class) const { return class_mode_[size_class]; }
  // Mask of the ID bits checked for objects of this class (0 in offset-only classes).
  uint16_t IdMask(uint32_t size_class) const;
  uint32_t SlotSize(uint32_t size_class) const { return classes_.at(size_class).slot_size; }
  // Bytes of each block of the class (a whole number of base blocks; size_classes.h).
  uint32_t BlockBytes(uint32_t size_class) const { return classes_.at(size_class).block_bytes; }

  // A uniformly random worker (the "random" worker-selection policy; by-connection callers pass
  // their own index).
  uint32_t PickWorker();

  // Allocates a zero-filled object of `size` payload bytes in worker `worker`'s blocks, owned by
  // `owner`.
  Result<ObjectPtr> Alloc(size_t size, uint32_t worker, OwnerId owner = kPersistentOwner);
  Status Free(const ObjectPtr& p);
  // Frees every live object whose owner is `owner` (!= kPersistentOwner); returns how many. Safe
  // concurrently with alloc/free/write/read/locate/release_ptr/compaction by other threads. The
  // caller guarantees no new allocation (or SetOwner) for `owner` starts after the call began;
  // objects allocated for `owner` before the call started (also allocations still in flight then)
  // are all freed when it returns OK, even ones a concurrent compaction moves between blocks.
  // TimedOut if a block lock (or an in-flight allocation) takes longer than op_timeout: the
  // objects freed so far stay freed, and the call may be repeated.
  Result<uint64_t> FreeOwned(OwnerId owner);
  // Changes the owner of p's object (e.g. to kPersistentOwner: "persist"); NotFound as for Free
  // if p is stale.
  Status SetOwner(const ObjectPtr& p, OwnerId owner);
  // Live objects owned by `owner` (kPersistentOwner: persistent ones). Exact when no operation is
  // in flight.
  uint64_t OwnedObjects(OwnerId owner) const;
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
  // Metadata bytes from the running counters (cheap; what Stats() reports).
  MetadataStats Metadata();
  // The same figures recomputed by visiting every block struct under its lock: what the counters
  // must equal whenever no operation is in flight (tests check it after every kind of change).
  // TimedOut if a block lock is not taken within op_timeout.
  Result<MetadataStats> RecountMetadata();

  // Packs the structs of live blocks into the lowest free slots (at most `max_moves` of them)
  // and gives back the pages of block structs left with no struct in use, once no thread can
  // still hold a pointer loaded before (a grace period ending by `deadline`; pages stay when it
  // does not). Compaction rounds call it. Safe concurrently with every other operation.
  struct StructCompaction {
    uint64_t moved = 0;           // structs moved to lower slots
    uint64_t pages_released = 0;  // pages given back
    bool grace_timed_out = false;
  };
  Result<StructCompaction> CompactBlockStructs(std::chrono::steady_clock::time_point deadline,
                                               uint32_t max_moves = 4096);
  // TEST ONLY (FARMEM_OBJECTS_FAULT=no_struct_grace / no_struct_moves in the engine tests):
  // give struct pages back without waiting for the grace period / never move structs.
  void set_struct_faults(bool no_grace, bool no_moves) {
    fault_no_struct_grace_ = no_grace;
    fault_no_struct_moves_ = no_moves;
  }
  // Block structs in use and pages of them the process holds (tests, stats).
  StructSlabStats StructStats() const { return structs_.Stats(); }
  // TEST ONLY: the grace period a stale struct pointer holds (a test plays a stale user).
  StructGrace& grace_for_testing() { return grace_; }

  // Called (without locks held) when a block allocation fails for lack of memory, before one
  // retry; the Compactor installs itself here.
  void SetAllocFailureHook(std::function<void(uint32_t size_class)> hook);

 private:
  friend class Compactor;
  explicit Store(const StoreOptions& options, SizeClasses classes);

  // Validates p's shape and returns its block locked (shared or exclusive) and re-validated
  // against table_. The caller unlocks.
  Result<detail::Block*> LockBlockOf(const ObjectPtr& p, bool exclusive);
  // Slot of p's object inside locked block b (ID map or offset; then the block's renames, for
  // an ID a merge re-drew), checking home and generation.
  Result<uint32_t> ResolveSlotLocked(const detail::Block& b, const ObjectPtr& p) const;
  Result<uint32_t> ScanSlotLocked(const detail::Block& b, const ObjectPtr& p) const;
  // The slot of p's object after a merge re-drew its ID (b's renames), else `missing`.
  Result<uint32_t> RenamedSlotLocked(const detail::Block& b, const ObjectPtr& p,
                                     const Status& missing) const;
  // The ID the object in occupied `slot` of b has now (p.id unless a merge re-drew it; 0 in
  // offset-only classes, as in pointers).
  uint16_t CurrentIdLocked(const detail::Block& b, uint32_t slot) const {
    return b.mode == ClassMode::kIds ? b.slot_id()[slot] : 0;
  }
  // Frees an emptied rename list's memory (exclusive lock held).
  void ShrinkRenamesLocked(detail::Block& b);
  // NotFound unless `slot` of locked block b holds p's allocation: homed at p.block, with p's
  // generation.
  Result<uint32_t> CheckIdentityLocked(const detail::Block& b, const ObjectPtr& p,
                                       uint32_t slot) const;
  uint8_t* SlotAddr(uint32_t vblock, uint32_t slot, uint32_t slot_size) const {
    return ba_->VAddr(vblock) + size_t{slot} * slot_size;
  }
  // Allocates a slot in b for `owner` (exclusive lock held); b has room.
  Result<ObjectPtr> AllocInBlockLocked(ThreadAllocator& w, detail::Block& b, OwnerId owner);
  // Frees the object in occupied `slot` of b (exclusive lock held): header, metadata, live and
  // owner counts, free-slot list, home reference; retires b when it empties (then b is dead) and
  // releases an alias virtual block nobody homes at any more. Free and FreeOwned both use it.
  Status FreeSlotLocked(detail::Block& b, uint32_t slot);
  // One FreeOwned pass over every block struct (merge_gate_ held exclusively); adds the objects
  // it freed to *freed.
  Status SweepOwnedLocked(OwnerId owner, uint64_t* freed);
  // Per-owner live counts; changed under the block lock of the object concerned.
  void CountOwner(OwnerId owner, int64_t delta);
  // New logical block for class c owned by w (Worker mu held).
  Result<detail::Block*> NewBlockLocked(ThreadAllocator& w, uint32_t c);
  // Releases an empty block's pages and virtual blocks (exclusive lock held).
  Status RetireBlockLocked(detail::Block& b);
  // Marks b dead (exclusive lock held): it leaves its owner's lists for the owner's dead list.
  void MarkDeadLocked(detail::Block& b);
  // Puts b in or takes it out of its owner's free-slot list after its live count changed
  // (exclusive lock held; see the invariant at the top of this file).
  void SyncAvailLocked(detail::Block& b);
  // Recycles w's dead block structs (Worker mu held); a busy one waits for the next call.
  void RecycleDeadLocked(ThreadAllocator& w);
  // The generation of a new allocation (or re-homing) homed at virtual block v, which is the
  // primary of a block whose exclusive lock the caller holds. `prev_tag` is the header tag the
  // slot showed before (the previous occupant): a generation that would give the new object
  // the same tag is skipped, so the most likely stale pointer, one to the slot's previous
  // object, fails even the one-sided tag check (docs/objects.md, "Pointer identity").
  uint16_t IssueGenLocked(uint32_t v, uint16_t id, uint16_t id_mask, uint16_t prev_tag);
  // Frees a dead block's per-slot arrays, vblocks and ID table (exclusive lock held, b dead).
  void DropSlotMetadataLocked(detail::Block& b);
  // Moves b's per-block arrays to lower free runs of the metadata arena (exclusive lock held;
  // compaction calls it for a merge's destination).
  void RelocateMetadataLocked(detail::Block& b);
  // Brings the metadata counters up to date with b's per-slot arrays and ID table after they
  // were resized (exclusive lock held). Every resize site calls it (docs/objects.md, "Metadata").
  void CountMetadataLocked(detail::Block& b);
  // Releases alias vblock v of b if its home count is 0 (exclusive lock held).
  Status MaybeReleaseAliasLocked(detail::Block& b, uint32_t v);
  detail::Block* TakeBlockStruct() { return structs_.Take(); }
  void RecycleBlockStruct(detail::Block* b) { structs_.Put(b); }
  // Moves live block `old` (exclusive lock held, its owner's Worker::mu held, merge_gate_ held
  // shared) into free struct `nb` (lower address; exclusive lock held): fields, arrays, table_
  // entries and owner-list positions; `old` is then dead and unreachable.
  void MoveBlockStructLocked(detail::Block& old, detail::Block& nb);
  Status TimedOutLocking() const;

  StoreOptions options_;
  SizeClasses classes_;
  std::vector<ClassMode> class_mode_;
  std::vector<uint32_t> class_capacity_;
  std::unique_ptr<BlockAllocator> ba_;
  // Per-block arrays (Block::occupied .. vblocks, IdTable): address-ordered, pages returned as
  // they empty (meta_arena.h).
  std::unique_ptr<MetaArena> meta_;
  // Per virtual block (lazily zeroed: a large reservation costs only the part in use): the
  // logical block a block head shows (nullptr elsewhere).
  LazyArray<std::atomic<detail::Block*>> table_;
  // Per virtual block: the next generation of an object homed there. One sequence per virtual
  // block, never reset (it survives the block's release and reuse), so (home, generation) names
  // one allocation until 2^16 more were homed there. Used under the exclusive lock of the block
  // whose primary the virtual block is; a released virtual block passes to its next block
  // through BlockAllocator's mutex.
  LazyArray<uint16_t> next_gen_;
  std::vector<std::unique_ptr<ThreadAllocator>> workers_;

  // Per OwnerId: live objects it owns (changed together with a slot_owner entry, under that
  // block's exclusive lock; a merge moves objects without changing owners, so the counts are
  // exact whenever nothing is in flight), and allocations / SetOwner calls for it in flight
  // (FreeOwned waits for them to finish; not kept for kPersistentOwner). 65536 x (8 + 4) B =
  // 768 KiB per Store, instead of a map whose lock and nodes every alloc and free would pay for.
  LazyArray<std::atomic<uint64_t>> owned_;
  LazyArray<std::atomic<uint32_t>> owner_pending_;
  std::atomic<uint32_t> owner_high_{0};  // highest OwnerId counted (metadata figures)
  // Excludes compaction merges from FreeOwned's sweep (lock order 0): a merge holds it shared
  // (Compactor::TryMerge, before the block locks, skipped as busy after lock_timeout), a sweep
  // exclusively. Why: a merge moves objects from a block the sweep has not visited into one it
  // already visited; with no merge running, objects change blocks never, so one pass over every
  // block struct sees each object of the owner exactly where it stays.
  RwLock merge_gate_;

  // Every block struct, at a fixed address while its page is resident (StructSlab: lowest free
  // slot first, pages with no struct in use given back after a grace period; leaf lock). Why not
  // malloc: a struct may be locked by a thread that loaded a stale pointer to it, so it must stay
  // valid memory after its block died, and structs sized for the peak of blocks (never freed) were
  // most of the metadata left after compaction (issue 15, docs/objects.md "Block structs").
  StructSlab<detail::Block> structs_;
  // Uses of struct pointers loaded from table_ (LockBlockOf, Compactor::Snapshot) run inside a
  // scope; pages of free structs are given back only after Synchronize() (struct_grace.h).
  StructGrace grace_;
  // Block struct generations, never repeated (a struct constructed again after its page was
  // given back starts from zero otherwise).
  std::atomic<uint64_t> next_generation_{0};
  bool fault_no_struct_grace_ = false;
  bool fault_no_struct_moves_ = false;
  uint64_t NextGeneration() { return next_generation_.fetch_add(1) + 1; }
  // Metadata counters (MetadataStats::per_slot, id_tables), changed by CountMetadataLocked.
  std::atomic<uint64_t> slot_meta_bytes_{0};
  std::atomic<uint64_t> id_meta_bytes_{0};

  std::mutex hook_mu_;
  std::function<void(uint32_t)> alloc_failure_hook_;
};

}  // namespace farmem::corm
