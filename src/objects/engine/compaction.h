// CoRM compaction: per-class fragmentation ratio and triggers (threshold, allocation failure, on
// demand), block collection from every worker, and the merge of two blocks (ID-collision check,
// copy with compaction bits and re-laid versions, mmap remap, metadata merge, hole punch).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "farmem/status.h"
#include "objects/engine/store.h"

namespace farmem::corm {

// How a round picks which blocks merge into which (Compactor::CompactClassLocked).
enum class MergePlan : uint8_t {
  // Classes with IDs: best-fit decreasing bin packing of whole blocks (the default).
  kBestFitDecreasing,
  // Emptiest block first into the fullest partner it fits (the plan before issue 15; always
  // used for offset-only classes). For comparison runs and tests.
  kEmptiestIntoFullest,
};

struct CompactionOptions {
  // A class is compacted by RunOnce() when its fragmentation ratio exceeds its threshold.
  double default_threshold = 0.3;
  std::vector<double> class_thresholds;  // per class override (empty or one entry per class)
  // Blocks above this occupancy (live / capacity) are not collected.
  double max_candidate_occupancy = 0.9;
  uint32_t max_merges_per_round = 64;  // bound on blocks compacted per round (pause length)
  // Pace of threshold and on-demand rounds: merges are spread so that no more than this many
  // happen per second (0 = as fast as possible). Every merge costs clients something (TLB
  // shootdowns of the remap, first-touch faults, one pointer correction per moved object), so an
  // unpaced burst of thousands of merges shows up as a throughput dip. Allocation failures are
  // never paced: a waiting allocation makes a paced round run at full speed.
  uint32_t max_merges_per_second = 0;
  uint32_t max_attempts_per_source = 8;  // partner blocks tried per source (kEmptiestIntoFullest)
  MergePlan plan = MergePlan::kBestFitDecreasing;
  std::chrono::milliseconds interval{100};      // leader thread period
  std::chrono::milliseconds lock_timeout{100};  // a busy block is skipped this round
  bool compact_on_alloc_failure = true;
  // A merge's grace period (docs/objects.md, "Compaction"): called with both blocks locked, after
  // the compaction bits of the source objects are set and before the source is remapped. Must
  // return true once every one-sided copy of store memory that was in progress when it was called
  // has finished — such a copy may have loaded a source header before the bits, and would pair it
  // with destination bytes after the remap — or false at `deadline` (now + lock_timeout), which
  // abandons and rolls back the merge. Copiers bracket each copy with a CopyEpoch
  // (common/copy_epoch.h); farmemd waits for its TCP NIC thread (Transport::wait_for_read_copies).
  // Unset: no one copies store memory one-sidedly except under the block locks.
  std::function<bool(std::chrono::steady_clock::time_point deadline)> wait_for_readers;
  // Merges of blocks with IDs whose ID sets collide re-draw the IDs of the colliding source
  // objects (docs/objects.md, "Merges that re-draw IDs"). Without it such merges are rejected:
  // with 16-bit IDs two half-full blocks of ~1,500 slots (issue 15's t3) always collide.
  bool redraw_ids = true;
  // TEST ONLY (FARMEM_OBJECTS_FAULT=no_meta_relocate): a merge leaves the destination's
  // per-block arrays where they are instead of moving them down in the metadata arena.
  bool fault_no_meta_relocate = false;
  // TEST ONLY (FARMEM_OBJECTS_FAULT=reuse_old_ids in the tests): a re-draw prefers an ID that an
  // old pointer of the same home still carries, i.e. the rename invariant's protection removed
  // in its worst case. Old pointers then read another object's bytes. Never set outside tests.
  bool fault_redraw_reuses_old_ids = false;
};

// Merge attempts of one size class (issue 15: merges that fail on ID collisions leave
// half-empty blocks half empty; the success rate per class shows where).
struct ClassMergeStats {
  uint64_t attempts = 0;    // source/partner pairs tried (TryMerge calls)
  uint64_t merges = 0;      // of which merged
  uint64_t collisions = 0;  // of which rejected: ID or offset collision
  // The rest (attempts - merges - collisions) were skipped busy, changed meanwhile or failed.
  uint64_t redraw_merges = 0;  // merges that re-drew IDs (their ID sets collided)
  uint64_t redraws = 0;        // objects whose ID those merges re-drew
  double success_rate() const { return attempts == 0 ? 0.0 : double(merges) / double(attempts); }
};

struct CompactionStats {
  uint64_t rounds = 0;
  uint64_t compactions = 0;           // successful block merges
  uint64_t blocks_freed = 0;          // physical blocks released by merges
  uint64_t physical_bytes_freed = 0;  // their bytes (blocks of each class have their own size)
  uint64_t bytes_moved = 0;           // slot bytes copied into destination blocks
  uint64_t objects_copied = 0;
  uint64_t objects_relocated = 0;  // copied to a different offset (kept their ID)
  uint64_t collisions = 0;         // merge attempts rejected (ID or offset collision)
  uint64_t ids_redrawn = 0;        // objects whose ID a merge re-drew (redraw_ids)
  // Merge attempts skipped: a block lock not taken (or Store::FreeOwned's sweep excluding merges),
  // or a one-sided copy still running (grace period), within lock_timeout.
  uint64_t skipped_busy = 0;
  // Time merges spent in their grace period (waiting for one-sided copies in progress before the
  // remap; only with wait_for_readers set): total and longest single wait.
  uint64_t grace_wait_ns = 0;
  uint64_t grace_wait_max_ns = 0;
  // Block structs packed after rounds that merged (Store::CompactBlockStructs): structs moved to
  // lower slots, pages of free structs given back, grace periods that timed out (pages kept).
  uint64_t structs_moved = 0;
  uint64_t struct_pages_released = 0;
  uint64_t struct_grace_timeouts = 0;
  std::vector<ClassMergeStats> classes;  // one entry per size class
};

// What the merge predicate looks at in a block (also used by tests on real blocks).
struct BlockSnapshot {
  ClassMode mode = ClassMode::kIds;
  uint32_t capacity = 0;
  std::vector<uint8_t> occupied;  // per slot
  std::vector<uint16_t> ids;      // IDs of live objects (kIds)
  uint32_t live() const;
};

// Thread-safe; one round runs at a time (rounds from the leader thread, on-demand calls and the
// allocation-failure hook serialise on an internal mutex taken before any Store lock).
// The Compactor must be destroyed before the Store and while no Alloc is running (it removes its
// allocation-failure hook in the destructor).
class Compactor {
 public:
  Compactor(Store& store, CompactionOptions options);
  ~Compactor();
  Compactor(const Compactor&) = delete;
  Compactor& operator=(const Compactor&) = delete;

  double FragmentationRatio(uint32_t size_class) { return store_.Stats(size_class).fragmentation; }
  double Threshold(uint32_t size_class) const;

  // One compaction round for a class: collect low-occupancy blocks from every worker, merge
  // least-occupied first. Returns the number of merges. A round also ends at `deadline` (paced
  // rounds can be long; an RPC handler must answer within the client's timeout).
  using Deadline = std::optional<std::chrono::steady_clock::time_point>;
  Result<uint32_t> CompactClass(uint32_t size_class, Deadline deadline = std::nullopt);
  // On demand ("farmem compact"): one round for every class.
  Result<uint32_t> CompactAll(Deadline deadline = std::nullopt);
  // Classes above their threshold only (what the leader thread runs).
  Result<uint32_t> RunOnce();

  // Leader thread running RunOnce() every interval; Stop() joins it (also in the destructor).
  Status Start();
  void Stop();

  CompactionStats stats() const;

  // The merge predicate without re-draws: b1 + b2 <= capacity, and no ID collision (kIds) or no
  // occupied-offset overlap (kOffsetOnly). With redraw_ids, blocks with IDs merge whenever
  // b1 + b2 <= capacity and the ID space has room for the re-drawn IDs.
  static bool CanMerge(const BlockSnapshot& src, const BlockSnapshot& dst);
  // Snapshot of the block that virtual block `vblock` maps to (tests, diagnostics).
  Result<BlockSnapshot> Snapshot(uint32_t vblock);

 private:
  struct Candidate {
    detail::Block* block;
    uint64_t generation;
    uint32_t live;
  };
  std::vector<Candidate> Collect(uint32_t size_class);
  // Merges src into dst. false when the blocks changed, collide or are busy.
  Result<bool> TryMerge(const Candidate& src, const Candidate& dst);
  Result<bool> MergeLocked(detail::Block& src, detail::Block& dst);
  // New IDs for the source objects whose IDs the destination has (both blocks locked): entry s
  // is src.slot_id[s], or a re-drawn ID unique in the merged block and not the old ID of any
  // rename entry of either block. False if the ID space has no room.
  bool PlanRedraws(const detail::Block& src, const detail::Block& dst, std::vector<uint16_t>& ids,
                   uint32_t& redrawn);
  Result<uint32_t> CompactClassLocked(uint32_t size_class, bool paced,
                                      Deadline deadline = std::nullopt);
  // Waits until the next merge may start under max_merges_per_second. Does not wait while an
  // allocation failure waits for the round or once Stop() was called (the round then finishes
  // at full speed, bounded by max_merges_per_round as without pacing).
  void Pace();
  void MergeDone();  // a paced merge happened: the next one waits one gap
  // After a round that merged (round_mu_ held): pack the block structs and give back the pages
  // of dead ones (Store::CompactBlockStructs), counted in stats_.
  void CompactStructsLocked();

  Store& store_;
  const CompactionOptions options_;
  std::mutex round_mu_;  // one round at a time
  std::mt19937_64 rng_;  // re-drawn IDs; used under round_mu_ (merges run only inside rounds)

  mutable std::mutex stats_mu_;
  CompactionStats stats_;

  std::mutex thread_mu_;
  std::condition_variable cv_;  // leader period and pacing waits; both end on stop_ / urgent_
  bool stop_ = false;
  std::thread leader_;

  // Pacing state, guarded by thread_mu_: the earliest start of the next paced merge.
  std::chrono::steady_clock::time_point next_merge_{};
  // Allocation failures waiting for round_mu_: while > 0, paced rounds stop sleeping.
  std::atomic<uint32_t> urgent_{0};
};

}  // namespace farmem::corm
