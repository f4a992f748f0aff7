// StructGrace: grace periods for pointers to block structs. A thread that loads a struct pointer
// from a shared table (the store's virtual-block table) brackets its use with a Scope;
// Synchronize() returns once every use that began before it has ended. The store calls it before
// giving struct memory back to the kernel (StructSlab), so no thread can still touch a struct
// whose page is gone. Two counters and an epoch bit (sleepable-RCU style); every operation named
// below is seq_cst.
//
//   user:     e = epoch; active[e] += 1; if epoch != e: active[e] -= 1, start again  ... use ...
//             active[e] -= 1
//   waiter:   e = epoch; wait until active[e ^ 1] == 0; epoch = e + 1; wait until active[e] == 0
// In the single seq_cst order, a user whose re-check read e came before the waiter's flip, so its
// increment did too and the waiter's later loads of active[e] see it: the waiter waits for that
// use. A user whose re-check came after the flip saw the new epoch and counts in the other
// counter, which the next Synchronize waits for. A call that gives up at its deadline after the
// flip leaves users in the old counter; the next call drains that counter before it flips again.
// Synchronize calls must not overlap (the store makes them from its compaction rounds, one at a
// time).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#include "common/copy_epoch.h"  // PollUntil

namespace farmem::corm {

class StructGrace {
 public:
  class Scope {
   public:
    explicit Scope(StructGrace& g) : g_(g), e_(g.Enter()) {}
    ~Scope() { g_.active_[e_].fetch_sub(1, std::memory_order_seq_cst); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StructGrace& g_;
    int e_;
  };

  // False at `deadline` with a use that began before the call still running.
  bool Synchronize(std::chrono::steady_clock::time_point deadline) {
    const int e = static_cast<int>(epoch_.load(std::memory_order_seq_cst) & 1);
    // Uses still counted in the other epoch began before an earlier call that gave up at its
    // deadline: they began before this call too, and must end first (new uses never enter it
    // until the flip below).
    if (!Drain(e ^ 1, deadline)) return false;
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    return Drain(e, deadline);
  }

 private:
  bool Drain(int e, std::chrono::steady_clock::time_point deadline) {
    int spins = 0;
    return PollUntil([&] { return active_[e].load(std::memory_order_seq_cst) == 0; }, deadline,
                     spins);
  }
  int Enter() {
    for (;;) {
      const int e = static_cast<int>(epoch_.load(std::memory_order_seq_cst) & 1);
      active_[e].fetch_add(1, std::memory_order_seq_cst);
      if (static_cast<int>(epoch_.load(std::memory_order_seq_cst) & 1) == e) return e;
      active_[e].fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  alignas(64) std::atomic<uint64_t> epoch_{0};
  alignas(64) std::atomic<int64_t> active_[2] = {0, 0};
};

}  // namespace farmem::corm
