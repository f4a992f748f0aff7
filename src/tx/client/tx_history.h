// History checker for transactions (docs/tx.md "History checker"): given every committed
// transaction with the versions it read and overwrote, checks that each key's versions form one
// gap-free chain and that the dependency graph (ww, wr, rw edges) over committed transactions is
// acyclic — i.e. the history is serializable. Pure functions, any thread.
//
// Versions are named by the transaction that installed them (its "stamp": the workload stores the
// writer's transaction id next to the value, so any read shows whose version it saw); stamp 0 is
// a key's initial version. The chain order of a key's stamps gives the version numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "farmem/status.h"

namespace farmem::tx {

struct HistoryTx {
  uint64_t id = 0;  // unique, != 0: the stamp of the versions this transaction installed
  struct Read {
    uint64_t key = 0;
    uint64_t stamp = 0;  // version read (0 = initial)
  };
  struct Write {
    uint64_t key = 0;
    uint64_t prev_stamp = 0;  // version overwritten (seen under the lock)
  };
  std::vector<Read> reads;
  std::vector<Write> writes;  // at most one per key
};

struct HistoryStats {
  size_t transactions = 0;
  size_t versions = 0;  // installed versions (writes) on all chains
  size_t edges = 0;     // ww + wr + rw dependency edges between distinct transactions
};

// OK when the history is serializable. kFailedPrecondition naming the first problem found:
//   "lost update": two committed writes overwrote the same version of a key (a fork);
//   "gap": a committed write overwrote a version no committed transaction installed;
//   "unknown version": a read of a version no committed transaction installed (dirty read);
//   "cycle": a dependency cycle T1 -> T2 -> ... -> T1 (each edge named ww / wr / rw).
// kInvalidArgument: id 0, duplicate ids, two writes of one key in one transaction.
Status CheckHistory(std::span<const HistoryTx> committed, HistoryStats* stats = nullptr);

}  // namespace farmem::tx
