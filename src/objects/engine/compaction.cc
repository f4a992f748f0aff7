// CoRM compaction: collection of low-occupancy blocks, the merge predicate, and the merge itself
// (lock objects with the compaction bit, copy + re-lay, remap, merge metadata, punch the source).

#include "objects/engine/compaction.h"

#include <algorithm>
#include <string>

#include "common/log.h"

namespace farmem::corm {
namespace {

constexpr std::chrono::milliseconds kPaceBatch{10};

BlockSnapshot SnapshotLocked(const detail::Block& b) {
  BlockSnapshot s;
  s.mode = b.mode;
  s.capacity = b.capacity;
  s.occupied = b.occupied;
  if (b.mode == ClassMode::kIds) {
    s.ids.reserve(b.live.load(std::memory_order_relaxed));
    for (uint32_t slot = 0; slot < b.slots; ++slot) {
      if (b.occupied[slot]) s.ids.push_back(b.slot_id[slot]);
    }
  }
  return s;
}

}  // namespace

uint32_t BlockSnapshot::live() const {
  return static_cast<uint32_t>(std::count(occupied.begin(), occupied.end(), uint8_t{1}));
}

bool Compactor::CanMerge(const BlockSnapshot& src, const BlockSnapshot& dst) {
  if (src.mode != dst.mode || src.occupied.size() != dst.occupied.size()) return false;
  if (src.live() + dst.live() > dst.capacity) return false;
  if (src.mode == ClassMode::kOffsetOnly) {
    for (size_t i = 0; i < src.occupied.size(); ++i) {
      if (src.occupied[i] && dst.occupied[i]) return false;
    }
    return true;
  }
  // ID sets are small (<= slots per block); a sorted copy keeps this O(b log b).
  std::vector<uint16_t> d = dst.ids;
  std::sort(d.begin(), d.end());
  for (uint16_t id : src.ids) {
    if (std::binary_search(d.begin(), d.end(), id)) return false;
  }
  return true;
}

Compactor::Compactor(Store& store, CompactionOptions options)
    : store_(store), options_(std::move(options)) {
  stats_.classes.resize(store_.classes().count());
  if (options_.compact_on_alloc_failure) {
    store_.SetAllocFailureHook([this](uint32_t size_class) {
      // Merge blocks of the failing class first, then everything else: any freed physical
      // block serves the retry. Unpaced, and a paced round in progress is sped up.
      urgent_.fetch_add(1);
      { std::lock_guard<std::mutex> lk(thread_mu_); }
      cv_.notify_all();
      {
        std::lock_guard<std::mutex> lock(round_mu_);
        auto r = CompactClassLocked(size_class, /*paced=*/false);
        if (r.ok() && *r == 0) {
          for (uint32_t c = 0; c < store_.classes().count(); ++c) {
            (void)CompactClassLocked(c, /*paced=*/false);
          }
        }
      }
      urgent_.fetch_sub(1);
    });
  }
}

Compactor::~Compactor() {
  Stop();
  if (options_.compact_on_alloc_failure) store_.SetAllocFailureHook(nullptr);
}

double Compactor::Threshold(uint32_t size_class) const {
  if (size_class < options_.class_thresholds.size()) return options_.class_thresholds[size_class];
  return options_.default_threshold;
}

CompactionStats Compactor::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

Result<BlockSnapshot> Compactor::Snapshot(uint32_t vblock) {
  if (vblock >= store_.ba_->num_virtual_blocks()) {
    return Status::OutOfRange("virtual block out of range");
  }
  detail::Block* b = store_.table_[vblock].load(std::memory_order_acquire);
  if (b == nullptr) return Status::NotFound("virtual block not in use");
  if (!b->mu.LockShared(options_.lock_timeout)) return Status::TimedOut("block busy");
  Result<BlockSnapshot> r = Status::NotFound("virtual block not in use");
  if (store_.table_[vblock].load(std::memory_order_acquire) == b && !b->dead.load()) {
    r = SnapshotLocked(*b);
  }
  b->mu.UnlockShared();
  return r;
}

std::vector<Compactor::Candidate> Compactor::Collect(uint32_t size_class) {
  std::vector<Candidate> out;
  // Ask every worker for its low-occupancy blocks of the class (under its lists lock, so the
  // generation read is stable: it only changes while the struct is in no list).
  for (auto& w : store_.workers_) {
    std::lock_guard<std::mutex> lock(w->lists_mu_);
    for (detail::Block* b : w->lists_[size_class].blocks) {
      if (b->dead.load(std::memory_order_acquire)) continue;
      const uint32_t live = b->live.load(std::memory_order_relaxed);
      const uint32_t cap = store_.class_capacity_[size_class];
      if (live == 0 || live > options_.max_candidate_occupancy * cap) continue;
      out.push_back(Candidate{b, b->generation, live});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const Candidate& a, const Candidate& b) { return a.live < b.live; });
  return out;
}

Result<uint32_t> Compactor::CompactClass(uint32_t size_class, Deadline deadline) {
  if (size_class >= store_.classes().count()) {
    return Status::InvalidArgument("size class " + std::to_string(size_class) + " does not exist");
  }
  std::lock_guard<std::mutex> lock(round_mu_);
  return CompactClassLocked(size_class, /*paced=*/true, deadline);
}

void Compactor::Pace() {
  if (options_.max_merges_per_second == 0) return;
  std::unique_lock<std::mutex> lk(thread_mu_);
  // Merges run in batches of about kPaceBatch worth of the rate: one wake-up per batch instead of
  // one per merge. On a loaded machine each wake-up preempts a busy thread (a reader or the NIC
  // thread), and that costs clients more than the merge itself.
  const auto now = std::chrono::steady_clock::now();
  if (next_merge_ <= now) return;
  cv_.wait_until(lk, next_merge_ + kPaceBatch, [this] { return stop_ || urgent_.load() > 0; });
}

void Compactor::MergeDone() {
  if (options_.max_merges_per_second == 0) return;
  using Clock = std::chrono::steady_clock;
  const auto gap = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(1.0 / static_cast<double>(options_.max_merges_per_second)));
  std::lock_guard<std::mutex> lk(thread_mu_);
  // After an idle spell the schedule restarts one batch before now: at most one batch to
  // "catch up" (and the batch a Pace() oversleep leaves is not lost).
  next_merge_ = std::max(next_merge_, Clock::now() - kPaceBatch) + gap;
}

Result<uint32_t> Compactor::CompactClassLocked(uint32_t size_class, bool paced, Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.rounds;
  }
  std::vector<Candidate> cands = Collect(size_class);
  const uint32_t cap = store_.class_capacity_[size_class];
  std::vector<bool> gone(cands.size(), false);
  uint32_t merges = 0;
  Status first_error;
  // Least-occupied block first as the source; its partner is the fullest block it still fits
  // into, which packs destinations densely.
  for (size_t i = 0; i < cands.size() && merges < options_.max_merges_per_round; ++i) {
    if (gone[i]) continue;
    uint32_t attempts = 0;
    for (size_t j = cands.size(); j-- > i + 1 && attempts < options_.max_attempts_per_source;) {
      if (gone[j] || cands[i].live + cands[j].live > cap) continue;
      ++attempts;
      // Only merges count against the pace: a rejected attempt is cheap and invisible to
      // clients.
      if (paced) Pace();
      if (deadline && std::chrono::steady_clock::now() >= *deadline) return merges;
      auto r = TryMerge(cands[i], cands[j]);
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        ClassMergeStats& cm = stats_.classes[size_class];
        ++cm.attempts;
        if (r.ok() && *r) ++cm.merges;
      }
      if (!r.ok()) {
        if (first_error.ok()) first_error = r.status();
        continue;
      }
      if (*r) {
        gone[i] = true;
        cands[j].live += cands[i].live;
        ++merges;
        if (paced) MergeDone();
        break;
      }
    }
  }
  if (merges == 0 && !first_error.ok()) return first_error;
  if (!first_error.ok()) FARMEM_LOG_WARN("CoRM compaction: {}", first_error.ToString());
  return merges;
}

Result<uint32_t> Compactor::CompactAll(Deadline deadline) {
  std::lock_guard<std::mutex> lock(round_mu_);
  uint32_t total = 0;
  Status first_error;
  for (uint32_t c = 0; c < store_.classes().count(); ++c) {
    if (deadline && std::chrono::steady_clock::now() >= *deadline) break;
    auto r = CompactClassLocked(c, /*paced=*/true, deadline);
    if (r.ok()) {
      total += *r;
    } else if (first_error.ok()) {
      first_error = r.status();
    }
  }
  if (total == 0 && !first_error.ok()) return first_error;
  return total;
}

Result<uint32_t> Compactor::RunOnce() {
  std::lock_guard<std::mutex> lock(round_mu_);
  uint32_t total = 0;
  for (uint32_t c = 0; c < store_.classes().count(); ++c) {
    const ClassStats cs = store_.Stats(c);
    if (cs.blocks < 2 || cs.fragmentation <= Threshold(c)) continue;
    auto r = CompactClassLocked(c, /*paced=*/true);
    if (r.ok()) total += *r;
  }
  return total;
}

Status Compactor::Start() {
  std::lock_guard<std::mutex> lock(thread_mu_);
  if (leader_.joinable()) return Status::InvalidArgument("compaction leader already running");
  stop_ = false;
  leader_ = std::thread([this] {
    std::unique_lock<std::mutex> lk(thread_mu_);
    while (!stop_) {
      cv_.wait_for(lk, options_.interval, [this] { return stop_; });
      if (stop_) break;
      lk.unlock();
      auto r = RunOnce();
      if (!r.ok()) FARMEM_LOG_WARN("CoRM compaction round failed: {}", r.status().ToString());
      lk.lock();
    }
  });
  return Status::OK();
}

void Compactor::Stop() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(thread_mu_);
    stop_ = true;
    t = std::move(leader_);
  }
  cv_.notify_all();
  if (t.joinable()) t.join();
}

Result<bool> Compactor::TryMerge(const Candidate& src, const Candidate& dst) {
  detail::Block* a = src.block;
  detail::Block* b = dst.block;
  if (a == b) return false;
  detail::Block* first = a < b ? a : b;
  detail::Block* second = a < b ? b : a;
  // Shared: merges run in parallel with each other but never during a FreeOwned sweep, which
  // relies on objects not changing blocks (Store::merge_gate_). Taken before the block locks.
  if (!store_.merge_gate_.LockShared(options_.lock_timeout)) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.skipped_busy;
    return false;
  }
  if (!first->mu.Lock(options_.lock_timeout)) {
    store_.merge_gate_.UnlockShared();
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.skipped_busy;
    return false;
  }
  if (!second->mu.Lock(options_.lock_timeout)) {
    first->mu.Unlock();
    store_.merge_gate_.UnlockShared();
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.skipped_busy;
    return false;
  }
  Result<bool> r = false;
  if (!a->dead.load() && !b->dead.load() && a->generation == src.generation &&
      b->generation == dst.generation && a->size_class == b->size_class) {
    r = MergeLocked(*a, *b);
  }
  second->mu.Unlock();
  first->mu.Unlock();
  store_.merge_gate_.UnlockShared();
  return r;
}

Result<bool> Compactor::MergeLocked(detail::Block& src, detail::Block& dst) {
  if (!CanMerge(SnapshotLocked(src), SnapshotLocked(dst))) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.collisions;
    ++stats_.classes[src.size_class].collisions;
    return false;
  }
  BlockAllocator& ba = *store_.ba_;
  const uint32_t size = src.slot_size;
  // Plan: keep the offset when the destination slot is free; otherwise (IDs only) take the next
  // free destination slot — the object keeps its ID, readers find it by scan or by asking.
  struct Move {
    uint32_t from, to;
  };
  std::vector<Move> plan;
  std::vector<uint8_t> taken = dst.occupied;
  std::vector<uint8_t> planned(src.slots, 0);
  for (uint32_t s = 0; s < src.slots; ++s) {
    if (src.occupied[s] && !taken[s]) {
      plan.push_back({s, s});
      taken[s] = 1;
      planned[s] = 1;
    }
  }
  uint32_t next_free = 0;
  for (uint32_t s = 0; s < src.slots; ++s) {
    if (!src.occupied[s] || planned[s]) continue;
    while (next_free < dst.slots && taken[next_free]) ++next_free;
    if (next_free == dst.slots || src.mode == ClassMode::kOffsetOnly) {
      return Status::Internal("CoRM merge plan found no destination slot");
    }
    plan.push_back({s, next_free});
    taken[next_free] = 1;
  }

  // 1. Lock every source object with the compaction bit. Writers hold the block lock for their
  //    whole critical section, so no lock bit can be set here.
  uint8_t* src_base = ba.VAddr(src.primary());
  uint8_t* dst_base = ba.VAddr(dst.primary());
  for (size_t k = 0; k < plan.size(); ++k) {
    uint8_t* slot = src_base + size_t{plan[k].from} * size;
    uint64_t h = LoadHeader(slot);
    if ((h & (hdr::kLockBit | hdr::kCompactionBit)) != 0 || (h & hdr::kAllocatedBit) == 0 ||
        !CasHeader(slot, h, h | hdr::kCompactionBit)) {
      for (size_t u = 0; u < k; ++u) {
        uint8_t* s2 = src_base + size_t{plan[u].from} * size;
        StoreHeader(s2, LoadHeader(s2) & ~hdr::kCompactionBit);
      }
      return Status::Internal("CoRM source object header in unexpected state during merge");
    }
  }
  // 2. Copy into the destination, re-laying version bytes for the new cacheline alignment. The
  //    copies keep the compaction bit, so readers that reach them retry until step 6.
  std::vector<uint8_t> in(size), out(size);
  std::vector<uint64_t> dst_old_headers(plan.size());
  uint64_t relocated = 0;
  for (size_t k = 0; k < plan.size(); ++k) {
    uint8_t* from = src_base + size_t{plan[k].from} * size;
    uint8_t* to = dst_base + size_t{plan[k].to} * size;
    ReadSlotWords(from, in.data(), size);
    ReLaySlot(in, reinterpret_cast<uint64_t>(from), out, reinterpret_cast<uint64_t>(to));
    dst_old_headers[k] = LoadHeader(to);
    PublishSlot(to, out);
    if (plan[k].from != plan[k].to) ++relocated;
  }
  // Undoes steps 1-2: source headers, destination slots.
  auto unlock_and_forget_copies = [&] {
    for (size_t u = 0; u < plan.size(); ++u) {
      uint8_t* s2 = src_base + size_t{plan[u].from} * size;
      StoreHeader(s2, LoadHeader(s2) & ~hdr::kCompactionBit);
      StoreHeader(dst_base + size_t{plan[u].to} * size, dst_old_headers[u]);
    }
  };
  // 3. Grace period. A one-sided copy that loaded a source header before step 1 may still be
  //    running; after the remap its remaining loads would read the destination, which can hold
  //    another object at that offset whose version bytes happen to match (1 in 256): the copy
  //    would pass every check with the wrong bytes. Copies that start now see the compaction bit.
  if (options_.wait_for_readers) {
    const auto start = std::chrono::steady_clock::now();
    const bool passed = options_.wait_for_readers(start + options_.lock_timeout);
    const auto waited = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                  std::chrono::steady_clock::now() - start)
                                                  .count());
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.grace_wait_ns += waited;
    stats_.grace_wait_max_ns = std::max(stats_.grace_wait_max_ns, waited);
    if (!passed) {
      unlock_and_forget_copies();
      ++stats_.skipped_busy;
      return false;
    }
  }
  // 4. Remap every virtual block showing the source onto the destination's physical pages.
  for (size_t k = 0; k < src.vblocks.size(); ++k) {
    Status st = ba.Remap(src.vblocks[k], dst.pblock);
    if (!st.ok()) {
      // Roll back: source mappings, then steps 1-2.
      for (size_t u = 0; u < k; ++u) (void)ba.Remap(src.vblocks[u], src.pblock);
      unlock_and_forget_copies();
      return st.WithContext("CoRM merge remap");
    }
  }
  // 5. Metadata: the source's virtual blocks and objects now belong to the destination.
  for (uint32_t v : src.vblocks) {
    store_.table_[v].store(&dst, std::memory_order_release);
    dst.vblocks.push_back(v);
  }
  store_.CountMetadataLocked(dst);  // dst.vblocks may have grown
  for (const Move& m : plan) {
    // The object keeps its generation (its pointers carry it) and its owner (FreeOwned must
    // still find it; the per-owner counts do not change).
    dst.AddObject(m.to, src.slot_id[m.from], src.slot_gen[m.from], src.slot_owner[m.from]);
  }
  dst.live.fetch_add(static_cast<uint32_t>(plan.size()), std::memory_order_relaxed);
  store_.SyncAvailLocked(dst);  // dst may be full now: off its owner's free-slot list
  // 6. Release the moved objects.
  for (const Move& m : plan) {
    uint8_t* to = dst_base + size_t{m.to} * size;
    StoreHeader(to, LoadHeader(to) & ~hdr::kCompactionBit);
  }
  // 7. The source's physical pages are unreachable now: punch them.
  const uint32_t src_pblock = src.pblock;
  src.vblocks.clear();
  store_.MarkDeadLocked(src);
  store_.DropSlotMetadataLocked(src);
  Status punch = ba.ReleasePhysical(src_pblock);
  if (!punch.ok()) FARMEM_LOG_WARN("CoRM compaction: {}", punch.ToString());
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.compactions;
    ++stats_.blocks_freed;
    stats_.objects_copied += plan.size();
    stats_.objects_relocated += relocated;
    stats_.bytes_moved += uint64_t{plan.size()} * size;
  }
  return true;
}

}  // namespace farmem::corm
