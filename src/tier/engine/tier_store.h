// TeRM tiered store (server engine): a region of `capacity` bytes whose contents live in a file on
// SSD, at most `dram_budget` bytes of it resident in DRAM frames, all of it mapped in one virtual
// range that one-sided readers copy from directly. Threads: RPC workers call Read/ReadPages/Write;
// one period thread (the service's, or a test's) calls Promote/Demote/RunPeriod; transports copy
// from base() without any lock. Layout constants: src/tier/format/tier_layout.h, docs/tier.md.
//
// Data structures:
//   range    capacity bytes reserved once; unit u lives at base() + u * unit_size and is mapped
//            MAP_SHARED|MAP_FIXED|PROT_READ onto either
//              - the magic memfd: ONE unit-sized, sealed (F_SEAL_WRITE|GROW|SHRINK|SEAL) memfd
//                whose every word is the pattern, shared by all cold units, or
//              - frame f of the frame memfd (budget bytes, frames of unit_size each).
//            A cold page therefore reads as the pattern; nothing in the range ever faults.
//   frames   the frame memfd is also mapped once read-write (`frames_rw_`): the store's own
//            writes go there, never through the range. Free frames are on `free_frames_`; frames
//            of demoted units wait on `quarantine_` while their grace period fails.
//   units    per unit: a shared_mutex, the frame it occupies (-1 = cold) and a dirty flag.
//   bitmap   one bit per 4 KiB page (tier_layout.h), page-aligned memory to be registered for
//            one-sided pulls; a unit's bits are set after it is mapped in and cleared before it
//            is mapped out.
//   stripes  hashed per-4 KiB-block shared_mutexes serialising file IO of a block (read-modify-
//            write of unaligned cold writes against each other and against cold reads).
//
// Invariants:
//   I1 budget: a resident unit owns exactly one frame; frames = min(budget, capacity) / unit_size,
//      so resident + quarantined <= frames at every instant, by construction.
//   I2 demotion order: exclusive unit lock -> clear bitmap bits -> write back if dirty (still
//      mapped; on failure set the bits again, stay resident, return the error) -> map the magic
//      memfd over the unit (one MAP_FIXED: a reader sees the old frame or the pattern, never a
//      hole) -> mark cold, unlock -> grace hook -> punch the frame -> frame becomes free.
//      Why: until the grace hook returns, a copy that started before the remap (the NIC thread in
//      the middle of a READ, a transport that translated the address earlier) may still be taking
//      bytes from the frame; until the punch, a transport that pinned the frame's pages (CMA, GUP)
//      still sees them. Reusing the frame for another unit before both would hand that unit's
//      bytes to a copy of this one, with no pattern to detect it. Write-back comes before the
//      unit is marked cold because from then on cold Reads go to the file.
//   I3 promotion order: exclusive unit lock -> free frame -> read the unit from the file into the
//      frame -> map the frame over the unit (MAP_FIXED|MAP_POPULATE) -> mark resident -> set the
//      bits. A client that sees a bit finds data; a stale bit costs only a pattern detection.
//   I4 no lost write: Write holds the unit's lock shared for the whole write. Resident: a
//      word-atomic copy into the frame and `dirty` set before unlocking, so the demotion that
//      follows (exclusive) writes it back. Cold: IO to the file, so the promotion that follows
//      (exclusive) reads it. Without the lock a cold write could land after a promotion read the
//      file and be overwritten by that frame's write-back.
//   Lock order: `heat_mu_` (RunPeriod only, outermost) -> one unit lock at a time (never two) ->
//   block stripes in ascending index -> an io ring's mutex; `frames_mu_` is a leaf held for list
//   operations only. The grace hook is called with no lock held, so it may wait for readers that
//   themselves call Read.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "farmem/status.h"
#include "tier/engine/io_ring.h"
#include "tier/engine/tier_policy.h"
#include "tier/format/tier_layout.h"

namespace farmem::tier {

// Test-only: each field removes one protection, so tests can show that they catch its absence
// (docs/tier.md, "Tests"; FARMEM_TIER_FAULT in the tests). Never set outside tests.
struct TierStoreFaults {
  // A demotion whose write-back failed (ENOSPC, EIO) goes on: the unit is mapped cold and its
  // frame freed, losing the only copy of the dirty data (I2 keeps it resident instead).
  bool demote_despite_failed_writeback = false;
  // Demotions never call the grace hook: a frame is punched and reused while a one-sided copy
  // may still be taking bytes from it (I2).
  bool skip_grace = false;
  // SIMULATED device errors, not a real device: while the value is non-zero every file read and
  // write of the io rings completes with -value (e.g. EIO) in place of the kernel's result, and
  // takes the same error path a real one would (IoRings::Rw). The test keeps the pointer to flip
  // it. Nothing here can produce a real EIO (no device-mapper in the test containers).
  std::shared_ptr<std::atomic<int>> simulated_io_errno;
  // A SIMULATED slow device: while the value is true, every io-ring operation whose completion
  // arrives waits (before it is reaped) until the test sets it false again. Lets a test hold one
  // miss "in the device" for as long as it likes, without timing.
  std::shared_ptr<std::atomic<bool>> hold_io;
  // Read by TierService, not the store: TIER_READ misses run their file IO on the RPC worker that
  // received them (the behaviour before asynchronous miss IO), so a slow miss blocks the worker
  // and every RPC queued behind it (FARMEM_TIER_FAULT=sync_miss).
  bool sync_miss_io = false;
  // Read by TierService too: TIER_WRITEs to cold units run their file IO on the RPC worker
  // (the behaviour before deferred write misses; FARMEM_TIER_FAULT=sync_write).
  bool sync_write_io = false;
  // SIMULATED short transfers (IoRingFaults::short_io): every io-ring read or write of more than
  // one page moves only half of it per completion; IoRings::Rw must continue until all is moved.
  bool short_io = false;
  // The protection removed (FARMEM_TIER_FAULT=accept_short): a short completion is taken as the
  // whole operation, so a read returns a stale tail and a write loses its tail.
  bool accept_short_io = false;
  // The protection removed (FARMEM_TIER_FAULT=ignore_io_errors, IoRingFaults::ignore_errors): a
  // file read or write that the kernel failed (EIO, ENOSPC) is taken as complete, so a cold read
  // returns the bounce buffer's bytes, a cold write or write-back is lost and a promotion maps
  // a frame the file never filled.
  bool ignore_io_errors = false;
};

struct TierOptions {
  std::string path;          // backing file (created, extended to capacity; not tmpfs)
  uint64_t capacity = 0;     // bytes, multiple of unit_size
  uint64_t dram_budget = 0;  // bytes, non-zero multiple of unit_size (may exceed capacity)
  uint64_t unit_size = kDefaultUnitSize;  // power of two, 4 KiB .. 16 MiB
  bool direct_io = true;                  // O_DIRECT: the page cache never becomes a second tier
  // The paper's hybrid tiering IO (docs/tier.md "Cached reads"): a cold read first tries a
  // buffered read with RWF_NOWAIT on a second, buffered descriptor, which succeeds only when every
  // page of it is in the page cache; otherwise (EAGAIN, short) the O_DIRECT read. Writes stay
  // O_DIRECT (they invalidate cached pages). Only with direct_io. Off by default: see the docs.
  bool cached_reads = false;
  uint32_t fill_percent = 95;  // RunPeriod keeps at most this share of the budget resident
  // Hotspot policy (tier_policy.h): share of a unit's heat kept from one period to the next
  // (0..99; 0 = the last period's counts only) and the resident units' bonus at the cut, relative
  // (0..1000 %) and absolute (heat, i.e. accesses). All 0 is the artifact's memoryless rule,
  // which churns under a stable Zipf set. A moved hot set drops both for one period (TierHeat).
  uint32_t heat_keep_percent = 88;
  uint32_t hysteresis_percent = 100;
  uint64_t hysteresis_heat = 4;
  // Free-room fill (docs/tier.md "Filling free frames"): after the policy's moves, RunPeriod also
  // promotes cold units nobody has counted yet (heat 0, in index order from where the last fill
  // stopped) while fewer than the policy's target are resident, so that a budget which holds the
  // whole region ends up holding all of it, and an idle server fills its frames before the first
  // access. Filled units rank last at the next cut (heat 0 gets no hysteresis bonus), so any
  // counted unit displaces them. false: only counted units are promoted (the paper's rule).
  bool fill_free_frames = true;
  uint64_t magic_word = 0;  // 0: drawn at Open (DrawMagicWord); else IsValidMagic
  // Called after a demoted unit's magic mapping is in place and before its frame is punched and
  // reused: waits until every one-sided copy that was in progress has finished (the service passes
  // Transport::wait_for_read_copies with a deadline). An error keeps the frame out of use; the
  // next demotion retries. Empty: no copier to wait for.
  std::function<Status()> grace;
  unsigned io_rings = 2;  // io_uring instances (concurrent file IOs)
  TierStoreFaults faults;
};

// Counters, each read on its own (not one consistent snapshot while promotions run).
struct TierStats {
  uint64_t capacity = 0;
  uint64_t unit_size = 0;
  uint64_t unit_count = 0;
  uint64_t budget_units = 0;  // frames
  uint64_t resident_units = 0;
  uint64_t quarantined_frames = 0;  // demoted, grace period not passed yet
  uint64_t free_frames = 0;
  uint64_t promotions = 0;  // every promotion, fills included
  uint64_t fills = 0;       // promotions of uncounted units into free room (fill_free_frames)
  uint64_t demotions = 0;
  uint64_t writebacks = 0;  // dirty units written back (demotion or Sync)
  uint64_t grace_failures = 0;
  uint64_t io_read_bytes = 0;   // file bytes read, incl. alignment padding and promotions
  uint64_t io_write_bytes = 0;  // file bytes written, incl. write-backs
  uint64_t reads_dram = 0;      // unit parts of Read/ReadPages served from a frame
  uint64_t reads_file = 0;      // ... served from the file
  uint64_t read_bytes_dram = 0;
  uint64_t read_bytes_file = 0;
  uint64_t writes_dram = 0;           // unit parts of Write copied into a frame
  uint64_t writes_file = 0;           // ... written to the file
  uint64_t cached_read_hits = 0;      // cold reads served by a buffered RWF_NOWAIT read
  uint64_t cached_read_misses = 0;    // ... that fell back to O_DIRECT (not all pages cached)
  uint64_t io_short_completions = 0;  // file IOs that moved fewer bytes than asked (continued)
  uint64_t io_errors = 0;  // file IOs that failed (EIO, ENOSPC, a cut file); the caller got it
};

// What RunPeriod did.
struct TierPeriodReport {
  std::vector<uint32_t> demoted;
  std::vector<uint32_t> promoted;  // by the policy, hottest first
  std::vector<uint32_t> filled;    // uncounted units promoted into free room, in index order
  bool fill_cut = false;           // the fill stopped at its deadline with room left
  bool uniform = false;
  bool shifted = false;    // the hot set moved: no hysteresis this period (TierHeat)
  bool following = false;  // a period after a shift, not caught up yet: no hysteresis either
  uint64_t target_units = 0;
  Status error;  // first failure (IO, grace, no frame); the rest of the period still ran
};

class TierStore {
 public:
  // Checks every option (InvalidArgument with the reason): geometry, budget, fill, pattern, a
  // tmpfs/ramfs backing file, vm.max_map_count against the unit count. IoError for OS failures.
  static Result<std::unique_ptr<TierStore>> Open(const TierOptions& options);
  // Writes back dirty units (best effort), unmaps, closes.
  ~TierStore();
  TierStore(const TierStore&) = delete;
  TierStore& operator=(const TierStore&) = delete;

  const TierGeometry& geometry() const { return geo_; }
  uint64_t magic_word() const { return magic_; }
  uint64_t budget_units() const { return frames_; }
  // The mapped range (capacity bytes, read-only): what a transport exports.
  const uint8_t* base() const { return base_; }
  // The page bitmap (geometry().bitmap_words words); load words atomically.
  const uint64_t* bitmap() const { return bitmap_; }
  size_t bitmap_alloc_bytes() const { return bitmap_len_; }  // page-aligned, for registration

  // Server-local reads of any range (unaligned, across units): resident parts from the frame,
  // cold parts from the file. InvalidArgument on an empty range, OutOfRange outside the region.
  Status Read(uint64_t offset, std::span<uint8_t> out);
  // Sparse fetch: reads only the pages set in `page_mask` (tier_layout.h page mask of
  // [offset, offset + out.size())) into the matching bytes of `out`; the other bytes are left as
  // they are. InvalidArgument on a malformed mask.
  Status ReadPages(uint64_t offset, std::span<uint8_t> out, std::span<const uint64_t> page_mask);
  // Writes any range: resident parts into the frame (unit marked dirty), cold parts to the file
  // (read-modify-write of partial blocks under the block's stripe lock). Not atomic across units.
  Status Write(uint64_t offset, std::span<const uint8_t> data);

  // Makes `unit` resident (OK if it is). ResourceExhausted when every frame is in use (frames
  // in quarantine get another grace period first).
  Status Promote(uint32_t unit);
  // Makes `unit` cold (OK if it is), writing it back if dirty. An error from the grace hook is
  // returned after the unit is cold (its frame then waits in quarantine).
  Status Demote(uint32_t unit);
  // One hotspot period: `counts` (one per unit) folded into the decayed heat, TierPolicy on the
  // heat, demotions first, then promotions, then (fill_free_frames) uncounted units into the
  // room left below the policy's target, until `fill_until` passes (the fill continues in the
  // next period). All counts 0: the policy moves nothing; only the fill runs. InvalidArgument
  // when counts has the wrong size. Concurrent calls are serialised.
  Result<TierPeriodReport> RunPeriod(std::span<const uint64_t> counts,
                                     std::chrono::steady_clock::time_point fill_until =
                                         std::chrono::steady_clock::time_point::max());
  // Writes back every dirty resident unit (they stay resident).
  Status Sync();

  bool IsResident(uint32_t unit) const;
  std::vector<uint8_t> Residency() const;  // one byte per unit, 1 = resident
  TierStats Stats() const;

 private:
  struct Unit {
    std::shared_mutex mu;
    std::atomic<int32_t> frame{-1};  // written under mu held exclusively
    std::atomic<bool> dirty{false};
  };

  TierStore() = default;
  Status Init(const TierOptions& options);
  uint8_t* FrameRw(int32_t f) const { return frames_rw_ + uint64_t(f) * geo_.unit_size; }
  uint8_t* UnitAddr(uint32_t u) const { return base_ + uint64_t(u) * geo_.unit_size; }
  Status MapMagic(uint32_t u);
  void SetBits(uint32_t u, bool resident);
  Status WriteBackLocked(uint32_t u, Unit& s);
  // Steps of I2 up to "mark cold" (caller holds s.mu exclusively); returns the detached frame.
  Result<int32_t> DetachLocked(uint32_t u, Unit& s);
  // Steps of I2 from the grace hook on, for `frames` plus any quarantined ones.
  Status ReleaseFrames(std::vector<int32_t> frames);
  // ReleaseFrames({}) when no frame is free but some wait in quarantine. Called with no lock held.
  void RetryQuarantine();
  // The free-room fill of RunPeriod (TierOptions::fill_free_frames); caller holds heat_mu_.
  void FillFreeRoom(TierPeriodReport& rep, std::chrono::steady_clock::time_point until);
  Status ReadRange(uint64_t offset, uint8_t* out, size_t n);
  Status ColdRead(uint64_t offset, uint8_t* out, size_t n);
  Status ColdWrite(uint64_t offset, const uint8_t* data, size_t n);

  TierGeometry geo_;
  uint64_t magic_ = 0;
  uint64_t frames_ = 0;
  uint32_t fill_percent_ = 95;
  uint32_t hysteresis_percent_ = 100;
  uint64_t hysteresis_heat_ = 4;
  bool fill_free_frames_ = true;
  std::mutex heat_mu_;  // one RunPeriod at a time: heat_ is its state between periods
  TierHeat heat_;
  uint32_t fill_cursor_ = 0;  // under heat_mu_: the unit the next fill looks at first
  // Under heat_mu_: 1 = brought in by the fill and not counted since (ranked without the
  // hysteresis bonus: TierPolicyInput::resident 2). Cleared when counted or found cold.
  std::vector<uint8_t> filled_;
  std::function<Status()> grace_;
  TierStoreFaults faults_;
  int file_fd_ = -1;
  int cached_fd_ = -1;  // buffered, read-only; only with cached_reads
  int magic_fd_ = -1;
  int frame_fd_ = -1;
  uint8_t* base_ = nullptr;
  uint8_t* frames_rw_ = nullptr;
  uint64_t* bitmap_ = nullptr;
  size_t bitmap_len_ = 0;
  std::unique_ptr<IoRings> io_;
  std::unique_ptr<Unit[]> units_;
  static constexpr size_t kStripes = 256;
  std::unique_ptr<std::shared_mutex[]> stripes_;

  mutable std::mutex frames_mu_;
  std::vector<int32_t> free_frames_;
  std::vector<int32_t> quarantine_;

  std::atomic<uint64_t> resident_{0};
  std::atomic<uint64_t> promotions_{0}, fills_{0}, demotions_{0}, writebacks_{0},
      grace_failures_{0};
  std::atomic<uint64_t> io_read_bytes_{0}, io_write_bytes_{0};
  std::atomic<uint64_t> reads_dram_{0}, reads_file_{0}, read_bytes_dram_{0}, read_bytes_file_{0};
  std::atomic<uint64_t> writes_dram_{0}, writes_file_{0};
  std::atomic<uint64_t> cached_read_hits_{0}, cached_read_misses_{0};
};

}  // namespace farmem::tier
