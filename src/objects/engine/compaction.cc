// CoRM compaction: collection of low-occupancy blocks, the merge predicate, and the merge itself
// (lock objects with the compaction bit, copy + re-lay, remap, merge metadata, punch the source).

#include "objects/engine/compaction.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>

#include "common/log.h"

namespace farmem::corm {
namespace {

constexpr std::chrono::milliseconds kPaceBatch{10};

BlockSnapshot SnapshotLocked(const detail::Block& b) {
  BlockSnapshot s;
  s.mode = b.mode;
  s.capacity = b.capacity;
  s.occupied.resize(b.slots);
  for (uint32_t slot = 0; slot < b.slots; ++slot) s.occupied[slot] = b.occupied(slot) ? 1 : 0;
  if (b.mode == ClassMode::kIds) {
    s.ids.reserve(b.live.load(std::memory_order_relaxed));
    for (uint32_t slot = 0; slot < b.slots; ++slot) {
      if (b.occupied(slot)) s.ids.push_back(b.slot_id()[slot]);
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
    : store_(store),
      options_(std::move(options)),
      rng_(store.options().seed != 0
               ? store.options().seed ^ 0x6A09E667F3BCC909ull
               : (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()) {
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
        CompactStructsLocked();
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
  StructGrace::Scope grace(store_.grace_);  // the struct's page stays while we use it
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
  auto r = CompactClassLocked(size_class, /*paced=*/true, deadline);
  if (r.ok() && *r > 0) CompactStructsLocked();
  return r;
}

void Compactor::CompactStructsLocked() {
  auto r = store_.CompactBlockStructs(std::chrono::steady_clock::now() + options_.lock_timeout);
  if (!r.ok()) {
    FARMEM_LOG_WARN("CoRM block struct compaction: {}", r.status().ToString());
    return;
  }
  std::lock_guard<std::mutex> lock(stats_mu_);
  stats_.structs_moved += r->moved;
  stats_.struct_pages_released += r->pages_released;
  stats_.struct_grace_timeouts += r->grace_timed_out ? 1 : 0;
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
  // One attempt: merges cands[i] into cands[j]. False at the deadline (the round ends).
  auto attempt = [&](size_t i, size_t j) -> bool {
    // Only merges count against the pace: a rejected attempt is cheap and invisible to clients.
    if (paced) Pace();
    if (deadline && std::chrono::steady_clock::now() >= *deadline) return false;
    auto r = TryMerge(cands[i], cands[j]);
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ClassMergeStats& cm = stats_.classes[size_class];
      ++cm.attempts;
      if (r.ok() && *r) ++cm.merges;
    }
    if (!r.ok()) {
      if (first_error.ok()) first_error = r.status();
    } else if (*r) {
      gone[i] = true;
      cands[j].live += cands[i].live;
      ++merges;
      if (paced) MergeDone();
    }
    return true;
  };
  // With IDs (any slot takes any object), plan the round as best-fit decreasing bin packing of
  // whole blocks: the fullest block first; each block goes into the fullest destination planned so
  // far that still has room for it, else it becomes a destination itself. Merges then run
  // destination by destination, so a round cut short by max_merges_per_round leaves finished
  // destinations and untouched blocks, which the next round plans again. Why not "emptiest block
  // into the fullest partner it fits" (the plan below, kept for offset-only classes and as the
  // fallback): once blocks are ~40 % full it pairs them into ~80 % full ones that nothing can top
  // up (simulated: 1.24x the ideal block count at 60 % freed against 1.02-1.10x; measured in
  // docs/objects.md, "Compaction").
  if (store_.ModeOf(size_class) == ClassMode::kIds &&
      options_.plan == MergePlan::kBestFitDecreasing) {
    std::vector<size_t> order(cands.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = cands.size() - 1 - i;  // fullest first
    std::multimap<uint32_t, size_t> dests;  // planned load -> destination candidate
    std::vector<std::vector<size_t>> plan(cands.size());
    std::vector<size_t> dest_order;
    for (size_t i : order) {
      const uint32_t x = cands[i].live;
      auto it = x <= cap ? dests.upper_bound(cap - x) : dests.begin();
      if (x <= cap && it != dests.begin()) {
        --it;  // the fullest destination with load <= cap - x
        const size_t d = it->second;
        const uint32_t load = it->first + x;
        dests.erase(it);
        if (plan[d].empty()) dest_order.push_back(d);
        plan[d].push_back(i);
        dests.emplace(load, d);
      } else {
        dests.emplace(x, i);
      }
    }
    for (size_t d : dest_order) {
      for (size_t i : plan[d]) {
        if (merges >= options_.max_merges_per_round) break;
        if (!attempt(i, d)) return merges;
      }
    }
    if (merges > 0 || !first_error.ok()) {
      if (merges == 0) return first_error;
      if (!first_error.ok()) FARMEM_LOG_WARN("CoRM compaction: {}", first_error.ToString());
      return merges;
    }
    // Nothing the plan tried merged (ID space full, busy blocks): fall back to the search below.
  }
  // Least-occupied block first as the source; its partner is the fullest block it still fits
  // into, up to max_attempts_per_source partners (offset-only blocks merge only when their
  // occupied offsets are disjoint, which the counts cannot tell).
  for (size_t i = 0; i < cands.size() && merges < options_.max_merges_per_round; ++i) {
    if (gone[i]) continue;
    uint32_t attempts = 0;
    for (size_t j = cands.size(); j-- > i + 1 && attempts < options_.max_attempts_per_source;) {
      if (gone[j] || cands[i].live + cands[j].live > cap) continue;
      ++attempts;
      if (!attempt(i, j)) return merges;
      if (gone[i]) break;
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
  if (total > 0) CompactStructsLocked();
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
  if (total > 0) CompactStructsLocked();
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

bool Compactor::PlanRedraws(const detail::Block& src, const detail::Block& dst,
                            std::vector<uint16_t>& ids, uint32_t& redrawn) {
  const uint32_t space = 1u << store_.options().id_bits;
  std::vector<uint64_t> used((space + 63) / 64, 0);
  auto is_used = [&](uint32_t id) { return (used[id >> 6] >> (id & 63)) & 1; };
  auto use = [&](uint32_t id) { used[id >> 6] |= uint64_t{1} << (id & 63); };
  for (uint32_t s = 0; s < dst.slots; ++s) {
    if (dst.occupied(s)) use(dst.slot_id()[s]);
  }
  // IDs of source objects the destination has too: those objects get new IDs. Source IDs are
  // unique among themselves, so a source ID already marked is a collision.
  std::vector<uint32_t> colliding;
  ids.assign(src.slots, 0);
  for (uint32_t s = 0; s < src.slots; ++s) {
    if (!src.occupied(s)) continue;
    ids[s] = src.slot_id()[s];
    if (is_used(src.slot_id()[s])) {
      colliding.push_back(s);
    } else {
      use(src.slot_id()[s]);
    }
  }
  // Old IDs that pointers still carry (renames of either block) are never handed out again
  // while their objects live: an old pointer must not pass a one-sided check on another object.
  // (Only entries of the same home could match, but the space is large and entries are few.)
  const bool fault = options_.fault_redraw_reuses_old_ids;
  for (const detail::Block* b : {&src, &dst}) {
    for (const detail::Rename& r : b->renames) {
      if (!fault || b != &src) use(r.old_id);
    }
  }
  // The ID table of the merged block holds at most `capacity` IDs, which callers checked.
  for (uint32_t s : colliding) {
    uint32_t id = space;
    if (fault) {
      // TEST ONLY: an old ID of the object's own home, the one choice the rule above forbids.
      const uint32_t home =
          Header::Unpack(LoadHeader(store_.SlotAddr(src.primary(), s, src.slot_size))).home_block;
      for (const detail::Rename& r : src.renames) {
        if (r.home == home && !is_used(r.old_id)) {
          id = r.old_id;
          break;
        }
      }
    }
    for (int i = 0; i < 16 && id == space; ++i) {
      const auto c = static_cast<uint32_t>(rng_() % space);
      if (!is_used(c)) id = c;
    }
    if (id == space) {  // nearly full ID space: a linear probe from a random start
      const auto start = static_cast<uint32_t>(rng_() % space);
      for (uint32_t i = 0; i < space && id == space; ++i) {
        if (!is_used((start + i) % space)) id = (start + i) % space;
      }
    }
    if (id == space) return false;
    use(id);
    ids[s] = static_cast<uint16_t>(id);
  }
  redrawn = static_cast<uint32_t>(colliding.size());
  return true;
}

Result<bool> Compactor::MergeLocked(detail::Block& src, detail::Block& dst) {
  // new_ids[s]: the ID source slot s's object has after the merge (empty: every object keeps its
  // ID). Re-drawn only on a collision, and only for the colliding objects.
  std::vector<uint16_t> new_ids;
  uint32_t redrawn = 0;
  if (!CanMerge(SnapshotLocked(src), SnapshotLocked(dst))) {
    const bool fits = src.mode == ClassMode::kIds && dst.mode == ClassMode::kIds &&
                      src.live.load() + dst.live.load() <= dst.capacity;
    if (!options_.redraw_ids || !fits || !PlanRedraws(src, dst, new_ids, redrawn)) {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.collisions;
      ++stats_.classes[src.size_class].collisions;
      return false;
    }
  }
  BlockAllocator& ba = *store_.ba_;
  const uint32_t size = src.slot_size;
  const uint16_t id_mask = store_.IdMask(src.size_class);
  // Plan: keep the offset when the destination slot is free; otherwise (IDs only) take the next
  // free destination slot — the object keeps its ID, readers find it by scan or by asking.
  struct Move {
    uint32_t from, to;
  };
  std::vector<Move> plan;
  std::vector<uint8_t> taken(dst.slots);
  for (uint32_t s = 0; s < dst.slots; ++s) taken[s] = dst.occupied(s) ? 1 : 0;
  std::vector<uint8_t> planned(src.slots, 0);
  for (uint32_t s = 0; s < src.slots; ++s) {
    if (src.occupied(s) && !taken[s]) {
      plan.push_back({s, s});
      taken[s] = 1;
      planned[s] = 1;
    }
  }
  uint32_t next_free = 0;
  for (uint32_t s = 0; s < src.slots; ++s) {
    if (!src.occupied(s) || planned[s]) continue;
    while (next_free < dst.slots && taken[next_free]) ++next_free;
    if (next_free == dst.slots || src.mode == ClassMode::kOffsetOnly) {
      return Status::Internal("CoRM merge plan found no destination slot");
    }
    plan.push_back({s, next_free});
    taken[next_free] = 1;
  }

  // Room for the source's virtual blocks in the destination's list, before anything changes
  // (step 5 must not fail).
  if (!dst.vblocks.Reserve(*store_.meta_, dst.vblocks.size() + src.vblocks.size())) {
    return Status::ResourceExhausted("CoRM metadata arena exhausted (merge)");
  }
  // 1. Lock every source object with the compaction bit. Writers hold the block lock for their
  //    whole critical section, so no lock bit can be set here.
  uint8_t* src_base = ba.VAddr(src.primary());
  uint8_t* dst_base = ba.VAddr(dst.primary());
  std::vector<uint32_t> homes(plan.size());  // each moving object's home virtual block
  for (size_t k = 0; k < plan.size(); ++k) {
    uint8_t* slot = src_base + size_t{plan[k].from} * size;
    uint64_t h = LoadHeader(slot);
    homes[k] = Header::Unpack(h).home_block;
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
    if (!new_ids.empty() && new_ids[plan[k].from] != src.slot_id()[plan[k].from]) {
      // A re-drawn ID: the copy carries the new tag, so a pointer with the old ID fails the
      // one-sided tag check everywhere (and is corrected by the server's rename entry).
      uint64_t word;
      std::memcpy(&word, out.data(), sizeof(word));
      Header h = Header::Unpack(word);
      h.tag = TagOf(new_ids[plan[k].from], src.slot_gen()[plan[k].from], id_mask);
      word = h.Pack();
      std::memcpy(out.data(), &word, sizeof(word));
    }
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
    (void)dst.vblocks.PushBack(*store_.meta_, v);  // reserved above
  }
  if (!new_ids.empty()) {
    // Renames: the source's entries follow their objects' new IDs, and every re-drawn object
    // gets one, so pointers made before (home, old ID, generation) still name it.
    for (detail::Rename& r : src.renames) {
      const uint32_t s = src.FindSlot(r.id);
      if (s != detail::IdTable::kNotFound) r.id = new_ids[s];
    }
    for (size_t k = 0; k < plan.size(); ++k) {
      const uint32_t s = plan[k].from;
      if (new_ids[s] != src.slot_id()[s]) {
        src.renames.push_back({homes[k], src.slot_id()[s], src.slot_gen()[s], new_ids[s]});
      }
    }
  }
  dst.renames.Append(src.renames);
  store_.CountMetadataLocked(dst);  // dst.vblocks and dst.renames may have grown
  for (const Move& m : plan) {
    // The object keeps its generation (its pointers carry it) and its owner (FreeOwned must
    // still find it; the per-owner counts do not change); its ID unless re-drawn.
    const uint16_t id = new_ids.empty() ? src.slot_id()[m.from] : new_ids[m.from];
    dst.AddObject(m.to, id, src.slot_gen()[m.from], src.slot_owner()[m.from]);
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
  src.vblocks.Clear();
  store_.MarkDeadLocked(src);
  store_.DropSlotMetadataLocked(src);
  // The source's arrays are free now: the destination's may move down into them or below.
  if (!options_.fault_no_meta_relocate) store_.RelocateMetadataLocked(dst);
  Status punch = ba.ReleasePhysical(src_pblock);
  if (!punch.ok()) FARMEM_LOG_WARN("CoRM compaction: {}", punch.ToString());
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.compactions;
    ++stats_.blocks_freed;
    stats_.physical_bytes_freed += store_.BlockBytes(src.size_class);
    stats_.objects_copied += plan.size();
    stats_.objects_relocated += relocated;
    stats_.bytes_moved += uint64_t{plan.size()} * size;
    stats_.ids_redrawn += redrawn;
    if (redrawn > 0) {
      ++stats_.classes[dst.size_class].redraw_merges;
      stats_.classes[dst.size_class].redraws += redrawn;
    }
  }
  return true;
}

}  // namespace farmem::corm
