// Grace periods for lock-free copiers: a thread that copies shared memory without a lock brackets
// each copy with a CopyEpoch; a thread about to change what that memory shows (CoRM's remap of a
// merged block) first publishes a marker the copies check, then waits for the copies in progress.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <thread>
#include <vector>

namespace farmem {

// Polls `done` until it holds (true) or `deadline` passes (false): yields for the first 64 polls
// of a wait, then sleeps 50 us at a time (what is waited for is short, but on a busy machine its
// thread may be preempted in the middle). `spins` counts the polls of one wait across calls.
template <typename Done>
bool PollUntil(Done&& done, std::chrono::steady_clock::time_point deadline, int& spins) {
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    if (++spins < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  return true;
}

// One per copying thread (its only writer). Even value: idle; odd: inside a copy.
//
// Protocol (store buffering; every access named below is seq_cst, no fences, so GCC's TSan, which
// lacks fences, models it exactly):
//   copier:   Enter() [value odd, seq_cst RMW]   load the marker (seq_cst) ... copy ...   Exit()
//   changer:  store the marker (seq_cst store or RMW)   WaitForCopies(): snapshot (seq_cst), then
//             wait while a snapshot is odd and unchanged   ...   change the memory
// In the single order of seq_cst operations, if the copier's marker load did not see the marker,
// it precedes the marker store, so Enter precedes the snapshot, which therefore sees the copy's
// odd value (or a later one): the changer waits for that copy to Exit. A copy that entered after
// the snapshot sees the marker. Exit is a release store, so once the changer (acquire) sees it,
// every load of the copy happened before whatever the changer does next.
// A CoRM copy's "marker load" is its load of a slot header (ReadSlotWords and the TCP NIC thread's
// CopyForRead load every word seq_cst; on x86 and ARMv8 that is the same instruction as acquire).
class CopyEpoch {
 public:
  void Enter() { value_.fetch_add(1, std::memory_order_seq_cst); }
  void Exit() {
    value_.store(value_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  uint64_t Snapshot() const { return value_.load(std::memory_order_seq_cst); }
  // True once the copy that was in progress at `snapshot` (if any) has exited.
  bool PassedSince(uint64_t snapshot) const {
    return (snapshot & 1) == 0 || value_.load(std::memory_order_acquire) != snapshot;
  }

  // Brackets one copy.
  class Scope {
   public:
    explicit Scope(CopyEpoch& e) : e_(e) { e_.Enter(); }
    ~Scope() { e_.Exit(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CopyEpoch& e_;
  };

 private:
  // Own cache line: the copier writes it twice per copy; waiters only read it.
  alignas(64) std::atomic<uint64_t> value_{0};
};

// Waits until every copy that was inside one of `epochs` when this was called has exited. Call it
// after storing the marker. False at `deadline` with a copy still running (a copier preempted for
// that long, or stuck); the caller then abandons its change (undoing the marker).
// Waits by yielding first, then sleeping 50 us at a time: copies are short, but on a busy machine
// the copier may be preempted in the middle of one.
inline bool WaitForCopies(std::span<const CopyEpoch* const> epochs,
                          std::chrono::steady_clock::time_point deadline) {
  std::vector<uint64_t> snapshots;
  snapshots.reserve(epochs.size());
  for (const CopyEpoch* e : epochs) snapshots.push_back(e->Snapshot());
  int spins = 0;
  for (size_t i = 0; i < epochs.size(); ++i) {
    if (!PollUntil([&] { return epochs[i]->PassedSince(snapshots[i]); }, deadline, spins)) {
      return false;
    }
  }
  return true;
}

}  // namespace farmem
