// CoRM Store and thread allocators: slot allocation with random per-block IDs, free, write (lock
// bit + version bump), RPC-path read with retry, pointer correction, release_ptr and object
// ownership (free_owned, set_owner). The locking protocol is described at the top of store.h.

#include "objects/engine/store.h"

#include <time.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <string>
#include <thread>

namespace farmem::corm {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kOwnerIds = size_t{1} << (8 * sizeof(OwnerId));

// Counts an operation that may give an owner objects (Alloc, SetOwner) as in flight for that
// owner while it lives; FreeOwned waits for the count to reach 0. Nothing waits for the
// persistent owner (FreeOwned refuses it), so its operations skip the shared counter.
class PendingForOwner {
 public:
  PendingForOwner(std::atomic<uint32_t>* pending, OwnerId owner)
      : n_(owner == kPersistentOwner ? nullptr : &pending[owner]) {
    if (n_ != nullptr) n_->fetch_add(1, std::memory_order_seq_cst);
  }
  ~PendingForOwner() {
    if (n_ != nullptr) n_->fetch_sub(1, std::memory_order_release);
  }
  PendingForOwner(const PendingForOwner&) = delete;
  PendingForOwner& operator=(const PendingForOwner&) = delete;

 private:
  std::atomic<uint32_t>* n_;
};

timespec RealtimeDeadline(std::chrono::milliseconds timeout) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  const int64_t ns = ts.tv_nsec + static_cast<int64_t>(timeout.count() % 1000) * 1000000;
  ts.tv_sec += static_cast<time_t>(timeout.count() / 1000 + ns / 1000000000);
  ts.tv_nsec = static_cast<long>(ns % 1000000000);
  return ts;
}

// Exponential backoff for retries on torn/locked slots: spin-yield first, then short sleeps.
class Backoff {
 public:
  void Wait() {
    if (n_ < 8) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 1 << (n_ - 8))));
    }
    ++n_;
  }

 private:
  int n_ = 0;
};

std::string Hex(uint64_t v) {
  char buf[24];
  snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

// ---- RwLock ---------------------------------------------------------------------------------

RwLock::RwLock() {
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  // Writer preference: a waiting exclusive locker (compaction) blocks new shared lockers.
  pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&rw_, &attr);
  pthread_rwlockattr_destroy(&attr);
}

RwLock::~RwLock() {
  pthread_rwlock_destroy(&rw_);
}

bool RwLock::LockShared(std::chrono::milliseconds timeout) {
  const timespec ts = RealtimeDeadline(timeout);
  return pthread_rwlock_timedrdlock(&rw_, &ts) == 0;
}

bool RwLock::Lock(std::chrono::milliseconds timeout) {
  const timespec ts = RealtimeDeadline(timeout);
  return pthread_rwlock_timedwrlock(&rw_, &ts) == 0;
}

bool RwLock::TryLock() {
  return pthread_rwlock_trywrlock(&rw_) == 0;
}

// ---- one-sided helpers ----------------------------------------------------------------------

// ---- IdTable / Block -------------------------------------------------------------------------

namespace detail {

bool IdTable::Reset(MetaArena& a, uint32_t slots, uint32_t capacity) {
  slots_ = slots;
  count_ = 0;
  size_t size = 0;
  if (capacity > 0 && slots > kScanMaxSlots) size = std::bit_ceil(size_t{2} * capacity);
  // Assign reallocates only for another size (structs are recycled across classes).
  if (!entries_.Assign(a, size, 0) || !used_.Assign(a, (size + 63) / 64, 0)) {
    entries_.Release(a);
    used_.Release(a);
    size = 0;
    mask_ = 0;
    shift_ = 32;
    return false;
  }
  mask_ = size == 0 ? 0 : static_cast<uint32_t>(size - 1);
  shift_ = size == 0 ? 32 : 32 - std::countr_zero(size);
  return true;
}

void IdTable::Clear() {
  std::fill(used_.begin(), used_.end(), 0);
  count_ = 0;
}

bool IdTable::Insert(uint32_t slot, std::span<const uint16_t> slot_id) {
  if (entries_.empty()) {
    ++count_;
    return true;
  }
  if (count_ >= mask_) return false;  // keep one free entry so every probe ends
  uint32_t i = Home(slot_id[slot]);
  while (Used(i)) i = (i + 1) & mask_;
  entries_[i] = static_cast<uint16_t>(slot);
  SetUsed(i, true);
  ++count_;
  return true;
}

bool IdTable::Erase(uint32_t slot, std::span<const uint16_t> slot_id) {
  if (entries_.empty()) {
    if (count_ == 0) return false;
    --count_;
    return true;
  }
  uint32_t i = Home(slot_id[slot]);
  uint32_t n = 0;
  for (; n <= mask_ && Used(i) && entries_[i] != slot; ++n) i = (i + 1) & mask_;
  if (n > mask_ || !Used(i)) return false;
  // Backward-shift deletion: move later entries of the probe run into the hole when the hole
  // lies on their probe path (between their home and their position), so lookups never need
  // tombstones.
  for (uint32_t j = (i + 1) & mask_; Used(j); j = (j + 1) & mask_) {
    const uint32_t home = Home(slot_id[entries_[j]]);
    if (((j - home) & mask_) >= ((j - i) & mask_)) {
      entries_[i] = entries_[j];
      i = j;
    }
  }
  SetUsed(i, false);
  --count_;
  return true;
}

void Block::AddObject(uint32_t slot, uint16_t id, uint16_t gen, uint16_t owner) {
  slot_table.set_occupied(slot, true);
  slot_id()[slot] = id;
  slot_gen()[slot] = gen;
  slot_owner()[slot] = owner;
  if (mode == ClassMode::kIds) (void)ids.Insert(slot, slot_id());
}

void Block::RemoveObject(uint32_t slot) {
  if (mode == ClassMode::kIds) (void)ids.Erase(slot, slot_id());
  if (!renames.empty()) DropRenames(slot_id()[slot]);
  slot_table.set_occupied(slot, false);
  slot_owner()[slot] = kPersistentOwner;
  if (slot < first_free) first_free = slot;
}

uint64_t Block::SlotArrayBytes() const {
  return slot_table.MemoryBytes() + vblocks.MemoryBytes() + renames.MemoryBytes();
}

int32_t Block::FindRenamed(uint32_t home, uint16_t old_id, uint16_t gen) const {
  // Linear: entries exist only for objects whose ID collided in a merge (a few per merge), and
  // only pointers that missed by ID get here.
  for (const Rename& r : renames) {
    if (r.home == home && r.old_id == old_id && r.gen == gen) return r.id;
  }
  return -1;
}

void Block::DropRenames(uint16_t id) {
  renames.EraseId(id);
}

}  // namespace detail

// ---- ThreadAllocator ------------------------------------------------------------------------

uint16_t ThreadAllocator::PickId(const detail::Block& b, uint32_t id_space) {
  // A few random draws almost always succeed (capacity <= id_space); a linear probe from a
  // random start bounds the worst case when the block's ID space is nearly full.
  for (int i = 0; i < 8; ++i) {
    const auto id = static_cast<uint16_t>(rng_() % id_space);
    if (b.FindSlot(id) == detail::IdTable::kNotFound) return id;
  }
  const auto start = static_cast<uint32_t>(rng_() % id_space);
  for (uint32_t i = 0; i < id_space; ++i) {
    const auto id = static_cast<uint16_t>((start + i) % id_space);
    if (b.FindSlot(id) == detail::IdTable::kNotFound) return id;
  }
  return 0;  // unreachable: callers ensure live < capacity <= id_space
}

// ---- Store ----------------------------------------------------------------------------------

Store::Store(const StoreOptions& options, SizeClasses classes)
    : options_(options), classes_(std::move(classes)) {}

Store::~Store() = default;

Result<std::unique_ptr<Store>> Store::Create(const StoreOptions& options) {
  if (options.id_bits != 0 && options.id_bits != 8 && options.id_bits != 12 &&
      options.id_bits != 16) {
    return Status::InvalidArgument("id_bits must be 0, 8, 12 or 16");
  }
  if (options.workers == 0 || options.workers > 1024) {
    return Status::InvalidArgument("workers must be in [1, 1024]");
  }
  if (options.op_timeout.count() <= 0) {
    return Status::InvalidArgument("op_timeout must be positive");
  }
  // A base block larger than the default largest block raises the largest block with it.
  FARMEM_ASSIGN_OR_RETURN(
      SizeClasses classes,
      SizeClasses::Create(GeometryOptions{options.block_size,
                                          std::max(options.max_block_size, options.block_size),
                                          options.min_slots_per_block}));
  // A block lies inside one memfd pool: pools are at least as large as the largest block.
  const size_t min_pool = (classes.max_block_bytes() + options.block_size - 1) /
                          options.block_size * options.block_size;
  std::unique_ptr<Store> s(new Store(options, std::move(classes)));
  BlockAllocatorOptions bo;
  bo.block_size = options.block_size;
  bo.reserve_bytes = options.reserve_bytes;
  bo.pool_bytes = std::max(options.pool_bytes, min_pool);
  bo.max_physical_bytes = options.max_physical_bytes;
  bo.vblock_quarantine = options.vblock_quarantine;
  FARMEM_ASSIGN_OR_RETURN(s->ba_, BlockAllocator::Create(bo));
  // Per-block metadata never exceeds the block it describes (<= 11.25 B per slot of >= 16 B,
  // plus a few units), so a range as large as the block reservation holds it; untouched
  // address space costs nothing.
  FARMEM_ASSIGN_OR_RETURN(s->meta_, MetaArena::Create(options.reserve_bytes));
  if (s->ba_->num_virtual_blocks() > kMaxHomeBlocks) {
    return Status::InvalidArgument("reservation has more than 2^" + std::to_string(hdr::kHomeBits) +
                                   " blocks (slot headers name their home block in " +
                                   std::to_string(hdr::kHomeBits) + " bits): use larger blocks");
  }
  const uint32_t id_space = options.id_bits == 0 ? 1 : (1u << options.id_bits);
  for (const SizeClass& c : s->classes_.all()) {
    ClassMode mode = ClassMode::kIds;
    uint32_t cap = c.slots_per_block;
    if (options.id_bits == 0) {
      mode = ClassMode::kOffsetOnly;
    } else if (c.slots_per_block > id_space) {
      if (options.hybrid) {
        mode = ClassMode::kOffsetOnly;
      } else {
        cap = id_space;
      }
    }
    s->class_mode_.push_back(mode);
    s->class_capacity_.push_back(cap);
  }
  const uint32_t nv = s->ba_->num_virtual_blocks();
  FARMEM_RETURN_IF_ERROR(s->table_.Allocate(nv));  // all nullptr
  // A live block holds at least one virtual block: never more structs in use than those.
  FARMEM_RETURN_IF_ERROR(s->structs_.Init(nv));
  FARMEM_RETURN_IF_ERROR(s->next_gen_.Allocate(nv));      // generation 0 first
  FARMEM_RETURN_IF_ERROR(s->owned_.Allocate(kOwnerIds));  // all 0
  FARMEM_RETURN_IF_ERROR(s->owner_pending_.Allocate(kOwnerIds));
  std::random_device rd;
  const uint64_t seed = options.seed != 0 ? options.seed : (uint64_t{rd()} << 32 | rd());
  for (uint32_t w = 0; w < options.workers; ++w) {
    s->workers_.push_back(std::make_unique<ThreadAllocator>(
        w, s->classes_.count(), seed + 0x9E3779B97F4A7C15ull * (w + 1)));
  }
  return s;
}

uint16_t Store::IdMask(uint32_t size_class) const {
  if (class_mode_[size_class] == ClassMode::kOffsetOnly) return 0;
  return static_cast<uint16_t>((1u << options_.id_bits) - 1);
}

uint32_t Store::PickWorker() {
  thread_local std::mt19937 rng(std::random_device{}());
  return static_cast<uint32_t>(rng() % workers_.size());
}

void Store::SetAllocFailureHook(std::function<void(uint32_t)> hook) {
  std::lock_guard<std::mutex> lock(hook_mu_);
  alloc_failure_hook_ = std::move(hook);
}

Status Store::TimedOutLocking() const {
  return Status::TimedOut("CoRM block lock not acquired within " +
                          std::to_string(options_.op_timeout.count()) + " ms");
}

Result<detail::Block*> Store::NewBlockLocked(ThreadAllocator& w, uint32_t c) {
  const SizeClass& sc = classes_.at(c);
  FARMEM_ASSIGN_OR_RETURN(
      BlockGrant g, ba_->AllocBlock(static_cast<uint32_t>(sc.block_bytes / ba_->block_size())));
  detail::Block* b = TakeBlockStruct();
  // A recycled struct is dead and unreachable from table_, but a stale thread may still try to
  // lock it: initialise it under its lock.
  if (!b->mu.Lock(options_.op_timeout)) {
    RecycleBlockStruct(b);
    (void)ba_->ReleasePhysical(g.pblock);
    (void)ba_->ReleaseVirtual(g.vblock);
    return TimedOutLocking();
  }
  b->generation = NextGeneration();
  b->size_class = c;
  b->slot_size = sc.slot_size;
  b->slots = sc.slots_per_block;
  b->capacity = class_capacity_[c];
  b->mode = class_mode_[c];
  b->owner = w.index();
  b->pblock = g.pblock;
  b->first_free = 0;
  MetaArena& a = *meta_;
  static_assert(kPersistentOwner == 0, "SlotTable::Assign starts every owner at 0");
  const bool meta_ok = b->vblocks.Assign(a, 1, g.vblock) && b->slot_table.Assign(a, b->slots) &&
                       b->ids.Reset(a, b->slots, b->mode == ClassMode::kIds ? b->capacity : 0);
  b->renames.Release();  // (already freed when the struct's last block died)
  if (!meta_ok) {
    // The struct stays dead (never published); it goes back to the pool without arrays.
    DropSlotMetadataLocked(*b);
    b->mu.Unlock();
    RecycleBlockStruct(b);
    (void)ba_->ReleasePhysical(g.pblock);
    (void)ba_->ReleaseVirtual(g.vblock);
    return Status::ResourceExhausted("CoRM metadata arena exhausted");
  }
  CountMetadataLocked(*b);
  b->live.store(0, std::memory_order_relaxed);
  b->dead.store(false, std::memory_order_release);
  table_[g.vblock].store(b, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(w.lists_mu_);
    auto& lists = w.lists_[c];
    b->list_pos = static_cast<uint32_t>(lists.blocks.size());
    lists.blocks.push_back(b);
    b->avail_pos = static_cast<uint32_t>(lists.avail.size());
    lists.avail.push_back(b);
    b->in_avail = true;
  }
  b->mu.Unlock();
  return b;
}

Result<ObjectPtr> Store::AllocInBlockLocked(ThreadAllocator& w, detail::Block& b, OwnerId owner) {
  const uint32_t v = b.primary();
  uint32_t slot = UINT32_MAX;
  // First free slot; with IDs the offset carries no meaning, so first-fit keeps blocks dense.
  // first_free (raised here, lowered by frees) makes filling a block linear, not quadratic.
  for (uint32_t i = b.first_free; i < b.slots; ++i) {
    if (!b.occupied(i)) {
      slot = i;
      break;
    }
  }
  if (slot == UINT32_MAX) return Status::Internal("CoRM block has no free slot despite live count");
  if (b.mode == ClassMode::kIds && b.ids.size() >= b.capacity) {
    return Status::Internal("CoRM block's ID table is full despite live count");
  }
  uint8_t* addr = SlotAddr(v, slot, b.slot_size);
  uint64_t old = LoadHeader(addr);
  const Header prev = Header::Unpack(old);
  const uint16_t mask = IdMask(b.size_class);
  uint16_t id = 0;
  if (b.mode == ClassMode::kIds) {
    id = w.PickId(b, 1u << options_.id_bits);
    // Not the previous occupant's ID if another is free: a stale pointer to it then fails the
    // one-sided ID check whatever the generation bits say (few tries: a full ID space has one).
    const uint32_t id_space = 1u << options_.id_bits;
    for (int i = 0; i < 4 && id == (prev.tag & mask) && b.live.load() + 1 < id_space; ++i) {
      id = w.PickId(b, 1u << options_.id_bits);
    }
  }
  if (prev.allocated || prev.locked || prev.compacting) {
    return Status::Internal("free CoRM slot has header " + Hex(old));
  }
  if (!CasHeader(addr, old, old | hdr::kLockBit)) {
    return Status::Internal("free CoRM slot header changed under the block lock");
  }
  FARMEM_RETURN_IF_ERROR(ba_->AddHomeRef(v));
  const uint16_t gen = IssueGenLocked(v, id, mask, prev.tag);
  Header h;
  h.tag = TagOf(id, gen, mask);
  h.allocated = true;
  h.version = static_cast<uint8_t>(prev.version + 1);
  h.home_block = v;
  h.size_class = static_cast<uint8_t>(b.size_class);
  thread_local std::vector<uint8_t> image;  // no heap allocation per object
  image.assign(b.slot_size, 0);
  EncodeSlot(image, reinterpret_cast<uint64_t>(addr), h, {});
  PublishSlot(addr, image);
  b.AddObject(slot, id, gen, owner);
  b.first_free = slot + 1;
  b.live.fetch_add(1, std::memory_order_relaxed);
  CountOwner(owner, +1);
  return ObjectPtr{reinterpret_cast<uint64_t>(addr), id, b.size_class, v, gen};
}

Result<ObjectPtr> Store::Alloc(size_t size, uint32_t worker, OwnerId owner) {
  if (worker >= workers_.size()) {
    return Status::InvalidArgument("worker " + std::to_string(worker) + " out of range");
  }
  FARMEM_ASSIGN_OR_RETURN(uint32_t c, classes_.ClassFor(size));
  // In flight for `owner` until it returns: FreeOwned(owner) waits for it (see FreeOwned).
  PendingForOwner pending(owner_pending_.data(), owner);
  ThreadAllocator& w = *workers_[worker];
  for (int attempt = 0; attempt < 2; ++attempt) {
    Status failure;
    {
      std::lock_guard<std::mutex> lock(w.mu_);
      RecycleDeadLocked(w);
      // O(1) amortised: every pass either allocates or drops a full block from `avail` (only
      // possible if a merge filled it after SyncAvailLocked ran; kept as a safety net). The
      // bound only guards against a concurrent merge storm; then a new block is as good.
      for (int pass = 0; pass < 64; ++pass) {
        detail::Block* b = nullptr;
        {
          std::lock_guard<std::mutex> lists_lock(w.lists_mu_);
          const auto& avail = w.lists_[c].avail;
          if (!avail.empty()) b = avail.back();
        }
        if (b == nullptr) break;
        // b may die meanwhile (a free empties it) but is not recycled: that needs w.mu_.
        if (!b->mu.Lock(options_.op_timeout)) return TimedOutLocking();
        if (!b->dead.load(std::memory_order_relaxed) &&
            b->live.load(std::memory_order_relaxed) < b->capacity) {
          auto r = AllocInBlockLocked(w, *b, owner);
          SyncAvailLocked(*b);
          b->mu.Unlock();
          return r;
        }
        SyncAvailLocked(*b);
        b->mu.Unlock();
      }
      auto nb = NewBlockLocked(w, c);
      if (nb.ok()) {
        detail::Block* b = *nb;
        if (!b->mu.Lock(options_.op_timeout)) return TimedOutLocking();
        auto r = AllocInBlockLocked(w, *b, owner);
        SyncAvailLocked(*b);
        b->mu.Unlock();
        return r;
      }
      failure = nb.status();
    }
    if (failure.code() != Code::kResourceExhausted || attempt == 1) return failure;
    std::function<void(uint32_t)> hook;
    {
      std::lock_guard<std::mutex> lock(hook_mu_);
      hook = alloc_failure_hook_;
    }
    if (!hook) return failure;
    hook(c);  // e.g. compaction of the class; then retry once
  }
  return Status::Internal("unreachable");
}

Result<detail::Block*> Store::LockBlockOf(const ObjectPtr& p, bool exclusive) {
  if (p.size_class >= classes_.count()) {
    return Status::InvalidArgument("size class " + std::to_string(p.size_class) +
                                   " does not exist");
  }
  if ((p.id & ~IdMask(p.size_class)) != 0) {
    return Status::InvalidArgument("object ID " + std::to_string(p.id) +
                                   " has bits beyond the class's ID width");
  }
  FARMEM_RETURN_IF_ERROR(ba_->VBlockOf(p.addr).status());
  const SizeClass& sc = classes_.at(p.size_class);
  const uint64_t region_off = p.addr - reinterpret_cast<uint64_t>(ba_->base());
  if (!IsSlotStart(region_off, sc, ba_->block_size())) {
    return Status::InvalidArgument("pointer offset " + std::to_string(region_off) +
                                   " is not a slot of size class " + std::to_string(p.size_class));
  }
  const uint64_t head = BlockStartOf(region_off, sc) / ba_->block_size();
  if (head != p.block || region_off + sc.slot_size > ba_->reserve_bytes()) {
    return Status::InvalidArgument("pointer's block does not match its address");
  }
  const uint32_t v = p.block;
  // table_ changes only under the block's exclusive lock; re-check after locking. The bound on
  // retries only matters if blocks are merged continuously; each retry follows a completed merge.
  // The grace scope covers the struct pointer from its load until it is validated and locked
  // (or unlocked again): its page cannot be given back meanwhile (CompactBlockStructs).
  StructGrace::Scope grace(grace_);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    detail::Block* b = table_[v].load(std::memory_order_acquire);
    if (b == nullptr) {
      return Status::NotFound("no live object block at " + Hex(p.addr) +
                              " (freed, released or never allocated)");
    }
    const bool locked =
        exclusive ? b->mu.Lock(options_.op_timeout) : b->mu.LockShared(options_.op_timeout);
    if (!locked) return TimedOutLocking();
    if (table_[v].load(std::memory_order_acquire) == b &&
        !b->dead.load(std::memory_order_relaxed)) {
      if (b->size_class != p.size_class) {
        exclusive ? b->mu.Unlock() : b->mu.UnlockShared();
        return Status::InvalidArgument("size class mismatch: block holds class " +
                                       std::to_string(b->size_class) + ", pointer says " +
                                       std::to_string(p.size_class));
      }
      return b;
    }
    exclusive ? b->mu.Unlock() : b->mu.UnlockShared();
  }
  return Status::Aborted("block of " + Hex(p.addr) + " kept changing");
}

Result<uint32_t> Store::ResolveSlotLocked(const detail::Block& b, const ObjectPtr& p) const {
  uint32_t slot;
  if (b.mode == ClassMode::kIds) {
    // Most objects never moved: the slot at the pointer's offset first (the ID decides; the
    // identity check below then runs as for a slot found by ID).
    const auto at = static_cast<uint32_t>(
        (p.addr - reinterpret_cast<uint64_t>(ba_->VAddr(p.block))) / b.slot_size);
    if (at < b.slots && b.occupied(at) && b.slot_id()[at] == p.id) {
      Result<uint32_t> r = CheckIdentityLocked(b, p, at);
      if (r.ok()) return r;
    }
    slot = b.FindSlot(p.id);
    Result<uint32_t> r =
        slot == detail::IdTable::kNotFound
            ? Result<uint32_t>(Status::NotFound("object " + std::to_string(p.id) +
                                                " not found at " + Hex(p.addr) + " (freed?)"))
            : CheckIdentityLocked(b, p, slot);
    if (r.ok() || b.renames.empty()) return r;
    // A merge may have re-drawn the ID (the ID found, if any, is another object's).
    return RenamedSlotLocked(b, p, r.status());
  } else {
    slot = static_cast<uint32_t>((p.addr - reinterpret_cast<uint64_t>(ba_->VAddr(p.block))) /
                                 b.slot_size);
    if (!b.occupied(slot)) {
      return Status::NotFound("no object at " + Hex(p.addr) + " (freed?)");
    }
  }
  return CheckIdentityLocked(b, p, slot);
}

Result<uint32_t> Store::CheckIdentityLocked(const detail::Block& b, const ObjectPtr& p,
                                            uint32_t slot) const {
  const Header h = Header::Unpack(LoadHeader(SlotAddr(p.block, slot, b.slot_size)));
  if (!h.allocated) return Status::Internal("occupied CoRM slot has a free header");
  if (h.home_block != p.block) {
    return Status::NotFound("object at " + Hex(p.addr) +
                            " is homed in another virtual block (stale or forged pointer)");
  }
  // The ID (or, offset-only, the offset) names a live object; the generation says whether it is
  // the allocation the pointer was made for, or a later one in a reused slot.
  if (b.slot_gen()[slot] != p.gen) {
    return Status::NotFound("object at " + Hex(p.addr) + " is generation " +
                            std::to_string(b.slot_gen()[slot]) + ", the pointer's is " +
                            std::to_string(p.gen) + " (freed; the slot was reused)");
  }
  return slot;
}

Result<uint32_t> Store::ScanSlotLocked(const detail::Block& b, const ObjectPtr& p) const {
  if (b.mode == ClassMode::kOffsetOnly) return ResolveSlotLocked(b, p);  // offsets never move
  const size_t bs = BlockBytes(b.size_class);
  std::vector<uint8_t> image(bs);
  ReadSlotWords(ba_->VAddr(p.block), image.data(), bs);
  const int64_t off = ScanBlockImage(image, b.slot_size, TagOf(p.id, p.gen, IdMask(p.size_class)),
                                     hdr::kTagMask, p.size_class, p.block);
  if (off < 0) {
    const Status missing = Status::NotFound("object " + std::to_string(p.id) +
                                            " not found in block of " + Hex(p.addr) + " (freed?)");
    // The scan cannot follow an ID a merge re-drew; the block's renames can.
    return b.renames.empty() ? Result<uint32_t>(missing) : RenamedSlotLocked(b, p, missing);
  }
  return CheckIdentityLocked(b, p, static_cast<uint32_t>(off / b.slot_size));
}

Result<uint32_t> Store::RenamedSlotLocked(const detail::Block& b, const ObjectPtr& p,
                                          const Status& missing) const {
  const int32_t id = b.FindRenamed(p.block, p.id, p.gen);
  if (id < 0) return missing;
  const uint32_t slot = b.FindSlot(static_cast<uint16_t>(id));
  if (slot == detail::IdTable::kNotFound) {
    return Status::Internal("CoRM rename entry names ID " + std::to_string(id) +
                            ", which no object of the block has");
  }
  return CheckIdentityLocked(b, p, slot);
}

Result<ObjectPtr> Store::Locate(const ObjectPtr& p, CorrectionMode mode) {
  FARMEM_ASSIGN_OR_RETURN(detail::Block * b, LockBlockOf(p, /*exclusive=*/false));
  auto slot = mode == CorrectionMode::kScan ? ScanSlotLocked(*b, p) : ResolveSlotLocked(*b, p);
  ObjectPtr q = p;
  if (slot.ok()) q.id = CurrentIdLocked(*b, *slot);
  b->mu.UnlockShared();
  if (!slot.ok()) return slot.status();
  q.addr = reinterpret_cast<uint64_t>(SlotAddr(p.block, *slot, SlotSize(p.size_class)));
  return q;
}

Status Store::FreeSlotLocked(detail::Block& b, uint32_t slot) {
  uint8_t* addr = SlotAddr(b.primary(), slot, b.slot_size);
  uint64_t old = LoadHeader(addr);
  const Header h = Header::Unpack(old);
  if (h.locked || h.compacting) {
    // Writers and the compactor hold the block lock while they own the header.
    return Status::Internal("CoRM header locked under the exclusive block lock");
  }
  Header freed = h;
  freed.allocated = false;
  freed.version = static_cast<uint8_t>(h.version + 1);
  if (!CasHeader(addr, old, freed.Pack())) {
    return Status::Internal("CoRM header changed under the exclusive block lock");
  }
  CountOwner(b.slot_owner()[slot], -1);
  b.RemoveObject(slot);
  ShrinkRenamesLocked(b);
  b.live.fetch_sub(1, std::memory_order_relaxed);
  if (b.live.load(std::memory_order_relaxed) != 0) SyncAvailLocked(b);
  FARMEM_ASSIGN_OR_RETURN(uint32_t refs, ba_->DropHomeRef(h.home_block));
  if (b.live.load(std::memory_order_relaxed) == 0) return RetireBlockLocked(b);
  if (refs == 0) return MaybeReleaseAliasLocked(b, h.home_block);
  return Status::OK();
}

Status Store::Free(const ObjectPtr& p) {
  FARMEM_ASSIGN_OR_RETURN(detail::Block * b, LockBlockOf(p, /*exclusive=*/true));
  Status st = [&]() -> Status {
    FARMEM_ASSIGN_OR_RETURN(uint32_t slot, ResolveSlotLocked(*b, p));
    return FreeSlotLocked(*b, slot);
  }();
  b->mu.Unlock();
  return st;
}

void Store::CountOwner(OwnerId owner, int64_t delta) {
  owned_[owner].fetch_add(static_cast<uint64_t>(delta), std::memory_order_relaxed);
  // For the metadata figures only (the tables are lazily zeroed: pages up to the highest owner
  // used cost memory).
  uint32_t high = owner_high_.load(std::memory_order_relaxed);
  while (owner > high &&
         !owner_high_.compare_exchange_weak(high, owner, std::memory_order_relaxed)) {
  }
}

uint64_t Store::OwnedObjects(OwnerId owner) const {
  return owned_[owner].load(std::memory_order_acquire);
}

Status Store::SetOwner(const ObjectPtr& p, OwnerId owner) {
  // Giving an object to `owner` is like allocating for it: in flight for FreeOwned(owner).
  PendingForOwner pending(owner_pending_.data(), owner);
  FARMEM_ASSIGN_OR_RETURN(detail::Block * b, LockBlockOf(p, /*exclusive=*/true));
  Status st = [&]() -> Status {
    FARMEM_ASSIGN_OR_RETURN(uint32_t slot, ResolveSlotLocked(*b, p));
    const OwnerId old = b->slot_owner()[slot];
    if (old == owner) return Status::OK();
    b->slot_owner()[slot] = owner;
    CountOwner(old, -1);
    CountOwner(owner, +1);
    return Status::OK();
  }();
  b->mu.Unlock();
  return st;
}

Result<uint64_t> Store::FreeOwned(OwnerId owner) {
  if (owner == kPersistentOwner) {
    return Status::InvalidArgument("FreeOwned of the persistent owner (objects nobody owns)");
  }
  const auto deadline = Clock::now() + options_.op_timeout;
  // 1. No new allocation for `owner` starts (the caller's guarantee), so once the ones in flight
  //    have finished, the set of its objects can only shrink; every one of them is counted in
  //    owned_[owner] and sits in a live block.
  Backoff backoff;
  while (owner_pending_[owner].load(std::memory_order_acquire) != 0) {
    if (Clock::now() >= deadline) {
      return Status::TimedOut("allocations for owner " + std::to_string(owner) +
                              " still in flight after " +
                              std::to_string(options_.op_timeout.count()) + " ms");
    }
    backoff.Wait();
  }
  // 2. With merges excluded (merge_gate_), no object changes blocks, so a pass that locks every
  //    block struct once frees every object of `owner` (blocks created meanwhile hold none: only
  //    allocations or merges put objects into a new block). The count is then 0; the bounded
  //    repeat only covers a caller breaking its guarantee (an allocation or SetOwner for `owner`
  //    starting meanwhile), which gets an error instead of a silent leak.
  uint64_t freed = 0;
  for (int pass = 0; pass < 3 && OwnedObjects(owner) != 0; ++pass) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || !merge_gate_.Lock(left)) return TimedOutLocking();
    Status st = SweepOwnedLocked(owner, &freed);
    merge_gate_.Unlock();
    FARMEM_RETURN_IF_ERROR(st);
  }
  if (OwnedObjects(owner) != 0) {
    return Status::Aborted("owner " + std::to_string(owner) + " still has " +
                           std::to_string(OwnedObjects(owner)) +
                           " objects after 3 sweeps: an allocation or SetOwner for it raced with "
                           "FreeOwned, or per-slot owners disagree with the counts");
  }
  return freed;
}

Status Store::SweepOwnedLocked(OwnerId owner, uint64_t* freed) {
  const std::vector<detail::Block*> all = structs_.AllConstructed();
  for (detail::Block* b : all) {
    // A dead block holds no object; one revived after this check holds only objects allocated
    // after the call began, none of them `owner`'s (merges into it are excluded).
    if (b->dead.load(std::memory_order_acquire)) continue;
    if (!b->mu.Lock(options_.op_timeout)) return TimedOutLocking();
    Status st;
    for (uint32_t slot = 0; slot < b->slots && !b->dead.load(std::memory_order_relaxed); ++slot) {
      if (!b->occupied(slot) || b->slot_owner()[slot] != owner) continue;
      // A retirement (the block emptied) marks it dead and ends the loop.
      st = FreeSlotLocked(*b, slot);
      if (!st.ok()) break;
      ++*freed;
    }
    b->mu.Unlock();
    FARMEM_RETURN_IF_ERROR(st);
  }
  return Status::OK();
}

uint16_t Store::IssueGenLocked(uint32_t v, uint16_t id, uint16_t id_mask, uint16_t prev_tag) {
  uint16_t gen = next_gen_[v]++;
  // Consecutive generations differ in their low bits, so one skip suffices; with 16-bit IDs the
  // tag has no generation bits and nothing can be skipped.
  if (std::popcount(id_mask) < 16 && TagOf(id, gen, id_mask) == prev_tag) gen = next_gen_[v]++;
  return gen;
}

Status Store::RetireBlockLocked(detail::Block& b) {
  Status first;
  for (uint32_t v : b.vblocks) {
    table_[v].store(nullptr, std::memory_order_release);
    Status st = ba_->ReleaseVirtual(v);
    if (first.ok() && !st.ok()) first = st;
  }
  b.vblocks.Clear();
  Status st = ba_->ReleasePhysical(b.pblock);
  if (first.ok() && !st.ok()) first = st;
  MarkDeadLocked(b);
  DropSlotMetadataLocked(b);
  return first;
}

void Store::DropSlotMetadataLocked(detail::Block& b) {
  // A dead block holds no object, so its per-slot arrays and ID table go back to the heap at
  // once. They used to wait for the owner to recycle the struct on its next Alloc: after
  // compaction most blocks die together and their metadata stayed (issue 15: the 64 B trace at
  // 4 KiB blocks kept ~4 MiB of it for 0.6 MiB of blocks). A stale thread that locks the dead
  // struct re-checks `dead` or table_ before touching the arrays, as for a pooled struct.
  MetaArena& a = *meta_;
  b.slot_table.Release(a);
  b.vblocks.Release(a);
  b.renames.Release();
  (void)b.ids.Reset(a, 0, 0);  // releasing cannot fail
  CountMetadataLocked(b);
}

void Store::RelocateMetadataLocked(detail::Block& b) {
  // Lowest free runs first: after a merge the surviving block's arrays move into the holes its
  // dead neighbours left, so the arena's live part stays at the bottom and the pages above it
  // empty out (and go back to the OS).
  MetaArena& a = *meta_;
  b.vblocks.Relocate(a);
  b.slot_table.Relocate(a);
  b.ids.Relocate(a);
}

void Store::MarkDeadLocked(detail::Block& b) {
  b.live.store(0, std::memory_order_relaxed);
  b.dead.store(true, std::memory_order_release);
  ThreadAllocator& w = *workers_[b.owner];
  std::lock_guard<std::mutex> lock(w.lists_mu_);
  if (b.list_pos == detail::kNoPos) return;  // already dead
  auto& lists = w.lists_[b.size_class];
  // Swap-remove from both lists (O(1)); the owner recycles the struct on its next Alloc.
  if (b.in_avail) {
    detail::Block* last = lists.avail.back();
    lists.avail[b.avail_pos] = last;
    last->avail_pos = b.avail_pos;
    lists.avail.pop_back();
    b.avail_pos = detail::kNoPos;
    b.in_avail = false;
  }
  detail::Block* last = lists.blocks.back();
  lists.blocks[b.list_pos] = last;
  last->list_pos = b.list_pos;
  lists.blocks.pop_back();
  b.list_pos = detail::kNoPos;
  // After compaction most blocks are gone: lists sized for the peak would stay (issue 15).
  for (auto* v : {&lists.blocks, &lists.avail}) {
    if (v->capacity() > 64 && v->size() < v->capacity() / 4) v->shrink_to_fit();
  }
  w.dead_.push_back(&b);
}

void Store::SyncAvailLocked(detail::Block& b) {
  const bool want = !b.dead.load(std::memory_order_relaxed) &&
                    b.live.load(std::memory_order_relaxed) < b.capacity;
  if (want == b.in_avail) return;
  ThreadAllocator& w = *workers_[b.owner];
  std::lock_guard<std::mutex> lock(w.lists_mu_);
  auto& avail = w.lists_[b.size_class].avail;
  if (want) {
    b.avail_pos = static_cast<uint32_t>(avail.size());
    avail.push_back(&b);
  } else {
    detail::Block* last = avail.back();
    avail[b.avail_pos] = last;
    last->avail_pos = b.avail_pos;
    avail.pop_back();
    b.avail_pos = detail::kNoPos;
  }
  b.in_avail = want;
}

void Store::RecycleDeadLocked(ThreadAllocator& w) {
  std::vector<detail::Block*> dead;
  {
    std::lock_guard<std::mutex> lock(w.lists_mu_);
    if (w.dead_.empty()) return;
    dead.swap(w.dead_);
  }
  std::vector<detail::Block*> busy;
  for (detail::Block* b : dead) {
    // A stale thread may still hold the dead block's lock briefly: do not wait, retry later.
    if (!b->mu.TryLock()) {
      busy.push_back(b);
      continue;
    }
    b->generation = NextGeneration();
    // Its per-slot metadata went when it died (DropSlotMetadataLocked).
    b->mu.Unlock();
    RecycleBlockStruct(b);
  }
  if (!busy.empty()) {
    std::lock_guard<std::mutex> lock(w.lists_mu_);
    w.dead_.insert(w.dead_.end(), busy.begin(), busy.end());
  }
}

void Store::ShrinkRenamesLocked(detail::Block& b) {
  if (!b.renames.empty() || b.renames.MemoryBytes() == 0) return;
  b.renames.Release();
  CountMetadataLocked(b);
}

void Store::CountMetadataLocked(detail::Block& b) {
  const uint64_t slot_bytes = b.SlotArrayBytes();
  const uint64_t id_bytes = b.IdTableBytes();
  // Unsigned wrap-around adds the (possibly negative) difference.
  slot_meta_bytes_.fetch_add(slot_bytes - b.counted_slot_bytes, std::memory_order_relaxed);
  id_meta_bytes_.fetch_add(id_bytes - b.counted_id_bytes, std::memory_order_relaxed);
  b.counted_slot_bytes = slot_bytes;
  b.counted_id_bytes = id_bytes;
}

Status Store::MaybeReleaseAliasLocked(detail::Block& b, uint32_t v) {
  if (v == b.primary() || ba_->HomeRefs(v) != 0) return Status::OK();
  auto it = std::find(b.vblocks.begin(), b.vblocks.end(), v);
  if (it == b.vblocks.end()) return Status::Internal("alias virtual block not in its block");
  table_[v].store(nullptr, std::memory_order_release);
  b.vblocks.Erase(it);
  return ba_->ReleaseVirtual(v);
}

Status Store::Write(ObjectPtr& p, std::span<const uint8_t> data) {
  if (p.size_class < classes_.count() && data.size() > classes_.at(p.size_class).payload_capacity) {
    return Status::OutOfRange("write of " + std::to_string(data.size()) +
                              " bytes exceeds the object's capacity of " +
                              std::to_string(classes_.at(p.size_class).payload_capacity));
  }
  const auto deadline = Clock::now() + options_.op_timeout;
  Backoff backoff;
  std::vector<uint8_t> image;
  while (true) {
    FARMEM_ASSIGN_OR_RETURN(detail::Block * b, LockBlockOf(p, /*exclusive=*/false));
    auto slot = ResolveSlotLocked(*b, p);
    if (!slot.ok()) {
      b->mu.UnlockShared();
      return slot.status();
    }
    uint8_t* addr = SlotAddr(b->primary(), *slot, b->slot_size);
    uint64_t old = LoadHeader(addr);
    Header h = Header::Unpack(old);
    // Only another writer can hold the lock bit here (compaction needs the exclusive lock).
    if (!h.locked && !h.compacting && CasHeader(addr, old, old | hdr::kLockBit)) {
      h.version = static_cast<uint8_t>(h.version + 1);
      image.resize(b->slot_size);
      EncodeSlot(image, reinterpret_cast<uint64_t>(addr), h, data);
      PublishSlot(addr, image);
      p.addr = reinterpret_cast<uint64_t>(SlotAddr(p.block, *slot, b->slot_size));
      p.id = CurrentIdLocked(*b, *slot);  // a merge may have re-drawn it
      b->mu.UnlockShared();
      return Status::OK();
    }
    b->mu.UnlockShared();
    if (Clock::now() >= deadline) {
      return Status::TimedOut("object at " + Hex(p.addr) + " stayed locked by another writer");
    }
    backoff.Wait();
  }
}

Result<size_t> Store::Read(ObjectPtr& p, std::span<uint8_t> out) {
  const auto deadline = Clock::now() + options_.op_timeout;
  Backoff backoff;
  std::vector<uint8_t> copy;
  SlotCheck last = SlotCheck::kOk;
  while (true) {
    FARMEM_ASSIGN_OR_RETURN(detail::Block * b, LockBlockOf(p, /*exclusive=*/false));
    auto slot = options_.correction == CorrectionMode::kScan ? ScanSlotLocked(*b, p)
                                                             : ResolveSlotLocked(*b, p);
    if (!slot.ok()) {
      b->mu.UnlockShared();
      return slot.status();
    }
    p.id = CurrentIdLocked(*b, *slot);  // a merge may have re-drawn it
    // Read through the home virtual block, as a client's one-sided read would.
    uint8_t* addr = SlotAddr(p.block, *slot, b->slot_size);
    copy.resize(b->slot_size);
    last =
        OneSidedReadSlot(reinterpret_cast<uint64_t>(addr), TagOf(p.id, p.gen, IdMask(p.size_class)),
                         hdr::kTagMask, p.size_class, copy);
    b->mu.UnlockShared();
    if (last == SlotCheck::kOk) {
      p.addr = reinterpret_cast<uint64_t>(addr);
      return DecodePayload(copy, reinterpret_cast<uint64_t>(addr), out);
    }
    if (last == SlotCheck::kMoved || last == SlotCheck::kFreed || last == SlotCheck::kWrongClass) {
      // The block lock excludes free and compaction, so the metadata and the slot must agree.
      return Status::Internal(std::string("CoRM slot check says ") +
                              std::string(SlotCheckName(last)) + " under the block lock");
    }
    if (Clock::now() >= deadline) {
      return Status::TimedOut("object at " + Hex(p.addr) + " stayed " +
                              std::string(SlotCheckName(last)));
    }
    backoff.Wait();
  }
}

Result<ObjectPtr> Store::ReleasePtr(const ObjectPtr& p) {
  FARMEM_ASSIGN_OR_RETURN(detail::Block * b, LockBlockOf(p, /*exclusive=*/true));
  auto r = [&]() -> Result<ObjectPtr> {
    FARMEM_ASSIGN_OR_RETURN(uint32_t slot, ResolveSlotLocked(*b, p));
    const uint32_t primary = b->primary();
    ObjectPtr q = p;
    q.id = CurrentIdLocked(*b, slot);
    q.block = primary;
    q.addr = reinterpret_cast<uint64_t>(SlotAddr(primary, slot, b->slot_size));
    if (primary == p.block) return q;
    uint8_t* addr = SlotAddr(primary, slot, b->slot_size);
    uint64_t old = LoadHeader(addr);
    Header h = Header::Unpack(old);
    if (h.locked || h.compacting) {
      return Status::Internal("CoRM header locked under the exclusive block lock");
    }
    FARMEM_RETURN_IF_ERROR(ba_->AddHomeRef(primary));
    // A new name is a new identity: a generation of the primary's sequence, so the old pointer
    // fails the generation check as well as the home check.
    const uint16_t old_gen = b->slot_gen()[slot];
    q.gen = IssueGenLocked(primary, b->slot_id()[slot], IdMask(b->size_class), h.tag);
    h.home_block = primary;
    h.tag = TagOf(b->slot_id()[slot], q.gen, IdMask(b->size_class));
    // Only the home and tag change, not the payload: a copy mixing the old and the new header
    // word holds the same bytes, so no version bump is needed.
    b->slot_gen()[slot] = q.gen;
    if (!CasHeader(addr, old, h.Pack())) {
      b->slot_gen()[slot] = old_gen;
      (void)ba_->DropHomeRef(primary);
      return Status::Internal("CoRM header changed under the exclusive block lock");
    }
    // The old names are dead (a new home and generation): so are the renames they had.
    if (!b->renames.empty()) {
      b->DropRenames(b->slot_id()[slot]);
      ShrinkRenamesLocked(*b);
    }
    FARMEM_ASSIGN_OR_RETURN(uint32_t refs, ba_->DropHomeRef(p.block));
    if (refs == 0) FARMEM_RETURN_IF_ERROR(MaybeReleaseAliasLocked(*b, p.block));
    return q;
  }();
  b->mu.Unlock();
  return r;
}

ClassStats Store::Stats(uint32_t size_class) {
  ClassStats s;
  if (size_class >= classes_.count()) return s;
  s.slot_size = classes_.at(size_class).slot_size;
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> lock(w->lists_mu_);
    for (detail::Block* b : w->lists_[size_class].blocks) {
      if (b->dead.load(std::memory_order_acquire)) continue;
      ++s.blocks;
      s.live_objects += b->live.load(std::memory_order_relaxed);
      s.capacity_slots += class_capacity_[size_class];
    }
  }
  s.fragmentation =
      s.capacity_slots == 0 ? 0.0 : 1.0 - double(s.live_objects) / double(s.capacity_slots);
  return s;
}

StoreStats Store::Stats() {
  StoreStats s;
  for (uint32_t c = 0; c < classes_.count(); ++c) {
    const ClassStats cs = Stats(c);
    s.live_objects += cs.live_objects;
    s.live_blocks += cs.blocks;
    s.live_payload_slot_bytes += cs.live_objects * cs.slot_size;
  }
  // A sum over every session's count (~65 k loads, tens of µs) rather than one more counter
  // that every alloc and free of every worker would write.
  for (size_t o = 1; o < kOwnerIds; ++o)
    s.owned_objects += owned_[o].load(std::memory_order_relaxed);
  s.persistent_objects = OwnedObjects(kPersistentOwner);
  s.blocks = ba_->Stats();
  s.metadata = Metadata();
  return s;
}

namespace {

// The parts of MetadataStats that Metadata() and RecountMetadata() compute the same way.
void AddFixedAndListMetadata(MetadataStats& m, uint64_t struct_bytes, uint64_t slab_bookkeeping,
                             uint64_t list_bytes, uint64_t vblocks, uint64_t ba_bytes,
                             uint64_t owner_high) {
  m.block_structs = struct_bytes + slab_bookkeeping;
  m.owner_lists = list_bytes;
  // table_ and next_gen_ are lazily zeroed: the pages up to the highest virtual block used.
  auto pages = [](uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  m.per_vblock = pages(vblocks * sizeof(std::atomic<detail::Block*>)) +
                 pages(vblocks * sizeof(uint16_t)) + ba_bytes;
  m.per_owner = pages((owner_high + 1) * sizeof(std::atomic<uint64_t>)) +
                pages((owner_high + 1) * sizeof(std::atomic<uint32_t>));
}

}  // namespace

MetadataStats Store::Metadata() {
  uint64_t lists = 0;
  const StructSlabStats slab = structs_.Stats();
  for (auto& w : workers_) {
    std::lock_guard<std::mutex> lock(w->lists_mu_);
    for (const auto& l : w->lists_) {
      lists += (l.blocks.capacity() + l.avail.capacity()) * sizeof(detail::Block*);
    }
    lists += w->lists_.capacity() * sizeof(ThreadAllocator::ClassLists) +
             w->dead_.capacity() * sizeof(detail::Block*);
  }
  MetadataStats m;
  AddFixedAndListMetadata(m, slab.resident_pages * StructSlab<detail::Block>::kPage,
                          slab.bookkeeping_bytes, lists, ba_->virtual_high_water(),
                          ba_->Stats().metadata_bytes, owner_high_.load(std::memory_order_relaxed));
  m.per_slot = slot_meta_bytes_.load(std::memory_order_relaxed);
  m.id_tables = id_meta_bytes_.load(std::memory_order_relaxed);
  const MetaArenaStats as = meta_->Stats();
  m.arena_slack =
      (as.resident_bytes > as.allocated_bytes ? as.resident_bytes - as.allocated_bytes : 0) +
      as.bookkeeping_bytes;
  return m;
}

Result<MetadataStats> Store::RecountMetadata() {
  // Exclusive: no merge, struct move or page release while it walks every struct.
  if (!merge_gate_.Lock(options_.op_timeout)) return TimedOutLocking();
  struct GateRelease {
    RwLock& g;
    ~GateRelease() { g.Unlock(); }
  } gate{merge_gate_};
  MetadataStats m = Metadata();
  const std::vector<detail::Block*> all = structs_.AllConstructed();
  m.per_slot = 0;
  m.id_tables = 0;
  for (detail::Block* b : all) {
    // Shared lock: the arrays change only under the exclusive one.
    if (!b->mu.LockShared(options_.op_timeout)) return TimedOutLocking();
    m.per_slot += b->SlotArrayBytes();
    m.id_tables += b->IdTableBytes();
    b->mu.UnlockShared();
  }
  return m;
}

// ---- Block struct compaction ----------------------------------------------------------------

void Store::MoveBlockStructLocked(detail::Block& old, detail::Block& nb) {
  // Scalars and the arrays' storage (ArenaArray and IdTable are plain handles to arena memory):
  // the new struct takes them over, the old one is left with none.
  nb.generation = NextGeneration();
  nb.size_class = old.size_class;
  nb.slot_size = old.slot_size;
  nb.slots = old.slots;
  nb.capacity = old.capacity;
  nb.mode = old.mode;
  nb.owner = old.owner;
  nb.pblock = old.pblock;
  nb.first_free = old.first_free;
  nb.vblocks = old.vblocks;
  nb.slot_table = old.slot_table;
  nb.ids = old.ids;
  std::swap(nb.renames, old.renames);
  nb.counted_slot_bytes = old.counted_slot_bytes;
  nb.counted_id_bytes = old.counted_id_bytes;
  old.vblocks = {};
  old.slot_table = {};
  old.ids = {};
  old.counted_slot_bytes = 0;
  old.counted_id_bytes = 0;
  nb.live.store(old.live.load(std::memory_order_relaxed), std::memory_order_relaxed);
  nb.dead.store(false, std::memory_order_release);
  // Every path to the block goes through table_ (under the block lock) or the owner's lists
  // (under lists_mu): repoint both. A thread that loaded `old` re-validates after locking it,
  // finds it dead and retries through table_.
  for (uint32_t v : nb.vblocks) table_[v].store(&nb, std::memory_order_release);
  {
    ThreadAllocator& w = *workers_[nb.owner];
    std::lock_guard<std::mutex> lock(w.lists_mu_);
    auto& lists = w.lists_[nb.size_class];
    nb.list_pos = old.list_pos;
    lists.blocks[nb.list_pos] = &nb;
    nb.in_avail = old.in_avail;
    nb.avail_pos = old.avail_pos;
    if (nb.in_avail) lists.avail[nb.avail_pos] = &nb;
    old.list_pos = detail::kNoPos;
    old.avail_pos = detail::kNoPos;
    old.in_avail = false;
  }
  old.live.store(0, std::memory_order_relaxed);
  old.dead.store(true, std::memory_order_release);
  old.generation = NextGeneration();
}

Result<Store::StructCompaction> Store::CompactBlockStructs(
    std::chrono::steady_clock::time_point deadline, uint32_t max_moves) {
  StructCompaction out;
  auto left = [&deadline] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(
                        deadline - std::chrono::steady_clock::now()));
  };
  // Shared: excludes FreeOwned's sweep and RecountMetadata, which walk every struct; merges run
  // alongside (each holds both its blocks' locks, which a move takes too).
  if (!merge_gate_.LockShared(left())) return out;
  // 1. Moves: a live struct above the lowest free slot goes down into it, so the structs in use
  //    end up packed at the bottom and the pages above hold none.
  std::vector<detail::Block*> stay;  // live blocks whose structs stay where they are
  for (auto& wp : workers_) {
    ThreadAllocator& w = *wp;
    if (fault_no_struct_moves_) max_moves = 0;  // (dead structs are still recycled below)
    // Worker::mu: the worker's Alloc holds it while it uses a struct from its free-slot list
    // without a grace scope, so no Alloc of this worker runs while its structs move.
    std::lock_guard<std::mutex> wlock(w.mu_);
    // The structs of blocks that died (merged away, emptied) wait on their owner's dead list
    // for its next Alloc; free them now, or after compaction they would hold their pages.
    RecycleDeadLocked(w);
    // Only a struct above the number in use can always go lower; highest first.
    const size_t in_use = structs_.in_use();
    std::vector<detail::Block*> high, rest;
    {
      std::lock_guard<std::mutex> lock(w.lists_mu_);
      for (const auto& lists : w.lists_) {
        for (detail::Block* b : lists.blocks) {
          (structs_.IndexOf(b) >= in_use ? high : rest).push_back(b);
        }
      }
    }
    stay.insert(stay.end(), rest.begin(), rest.end());
    std::sort(high.begin(), high.end(), std::greater<>());
    for (detail::Block* b : high) {
      if (out.moved >= max_moves || std::chrono::steady_clock::now() >= deadline) break;
      detail::Block* nb = structs_.Take(b);
      if (nb == nullptr) break;  // no free slot below this one, nor below the rest
      // nb is free (no live path leads to it), but a stale thread may hold its lock briefly:
      // do not wait. Lower address first (store.h lock order).
      if (!nb->mu.TryLock()) {
        structs_.Put(nb);
        continue;
      }
      if (!b->mu.Lock(left())) {
        nb->mu.Unlock();
        structs_.Put(nb);
        continue;
      }
      const bool movable = !b->dead.load(std::memory_order_relaxed) && b->owner == w.index();
      if (movable) {
        MoveBlockStructLocked(*b, *nb);
        RelocateMetadataLocked(*nb);
      }
      nb->mu.Unlock();
      b->mu.Unlock();
      if (movable) {
        structs_.Put(b);
        ++out.moved;
      } else {
        structs_.Put(nb);
      }
    }
  }
  // The other live blocks' arrays move down in the metadata arena too: a merge relocates only
  // its destination's, so blocks that took no part in the last merges keep theirs where they
  // were allocated, among the holes of the blocks that died. Without Worker::mu (so allocations
  // go on meanwhile): these structs stay valid (only this function moves or gives back structs),
  // and one that died or was recycled since is skipped or is a live block again; busy blocks wait
  // for the next round.
  for (detail::Block* b : stay) {
    if (fault_no_struct_moves_ || std::chrono::steady_clock::now() >= deadline) break;
    if (!b->mu.TryLock()) continue;
    if (!b->dead.load(std::memory_order_relaxed)) RelocateMetadataLocked(*b);
    b->mu.Unlock();
  }
  // 2. Pages of free structs go back once every thread that could have loaded a pointer to one
  //    of them (before it was freed) is done with it.
  const std::vector<size_t> pages = structs_.BeginRelease();
  if (!pages.empty()) {
    if (fault_no_struct_grace_ || grace_.Synchronize(deadline)) {
      structs_.FinishRelease(pages);
      out.pages_released = pages.size();
    } else {
      structs_.AbortRelease(pages);
      out.grace_timed_out = true;
    }
  }
  merge_gate_.UnlockShared();
  return out;
}

}  // namespace farmem::corm
