// A participant's side of the multi-participant commit (docs/tx.md "Multi-participant commit"),
// written once for farmemd's TxService and for a user data structure's owner (TxDsParticipant):
// prepare records, the decisions kept, TX_STATUS answers (and the fence), and the recovery that
// asks the first participant, then the others, when a coordinator falls silent. Handlers run on
// the owner's RPC threads; Recover on one thread at a time (the reaper); counters from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "farmem/node.h"
#include "farmem/status.h"
#include "node/rpc_call.h"
#include "tx/format/tx_wire.h"

namespace farmem::tx {

// What a participant pins at a prepare and applies once the outcome is known: TxService's
// tables, or a user data structure's records (TxDsPreparedWrites through TxDsParticipant).
class TwoPhaseWrites {
 public:
  virtual ~TwoPhaseWrites() = default;
  // Refuses items this participant cannot take (unknown table, wrong key size) before anything
  // is recorded.
  virtual Status Check(std::span<const tx_wire::TwoPhaseEntry> items) = 0;
  // Checks that txid holds every item's lock with a live lease and pins the locks (they no
  // longer expire, are never reaped or taken over) — all or none: a refusal (kAborted
  // "stale commit: ...") releases txid's locks on every item.
  virtual Status Pin(uint64_t txid, std::span<const tx_wire::TwoPhaseEntry> items) = 0;
  // commit: installs the writes and releases their locks (they are pinned: it cannot be
  // refused); abort: releases txid's locks on the items.
  virtual void Apply(uint64_t txid, std::span<const tx_wire::TwoPhaseEntry> items, bool commit) = 0;
};

struct TwoPhaseOptions {
  std::function<uint64_t()> now_ns;           // the lease clock; empty = steady clock
  uint64_t max_lease_ns = 10'000'000'000ull;  // caps a prepare's wait; a blocked recovery retries
                                              // every half of it
  std::string self;                           // this node's entry in participant lists (not asked)
  // Test-only faults (tx::TxTableFaults): a prepared participant keeps no learned outcome; a
  // prepare ignores a fence.
  bool no_learned_outcome = false;
  bool no_prepare_fence = false;
};

struct TwoPhaseCounters {
  std::atomic<uint64_t> prepares{0}, decides{0}, statuses{0}, recovered_commits{0},
      recovered_aborts{0}, recovery_unreachable{0}, recovered_from_peers{0};
};

// Invariants (docs/tx.md): the decisions map holds at most one outcome per txid; whoever removes
// a prepare record (a decision or the recovery) applies it, exactly once; a TX_STATUS finds a
// transaction prepared, decided, or neither (and then fences it) — never in between, because
// prepare records and decisions change under prepared_mu_ (lock order prepared_mu_ ->
// decisions_mu_).
class TwoPhaseParticipant {
 public:
  TwoPhaseParticipant(Node& node, TwoPhaseWrites& writes, TwoPhaseOptions options);
  TwoPhaseParticipant(const TwoPhaseParticipant&) = delete;
  TwoPhaseParticipant& operator=(const TwoPhaseParticipant&) = delete;

  // TX_PREPARE (the whole request body): pins the writes and records the prepare, or refuses.
  Status Prepare(std::span<const std::byte> body);
  // TX_DECIDE to a prepared participant: applies the outcome (commit without a prepare here:
  // kFailedPrecondition; abort without one: OK).
  Status DecidePrepared(uint64_t txid, bool commit);
  // The commit point at the first participant: unless a TX_STATUS fenced txid (then `release`
  // runs and kAborted "stale commit"), `install` runs under the decision lock and its success is
  // recorded as the outcome.
  Status DecideFirst(uint64_t txid, const std::function<Status()>& install,
                     const std::function<void()>& release);
  // TX_STATUS: the outcome known here, kOutcomeUndecided while prepared, else fences txid.
  tx_wire::StatusReply StatusOf(uint64_t txid);
  // Every prepare past its deadline asks its first participant, then (no answer) the others;
  // applies an outcome found, else keeps the locks and asks again after half a lease. Also
  // prunes decisions older than the retention. One caller at a time.
  void Recover();

  size_t prepared() const;
  size_t decisions() const;
  const TwoPhaseCounters& counters() const { return counters_; }
  // A first participant's decision that needs no record (the only participant).
  void CountDecide() { counters_.decides.fetch_add(1, std::memory_order_relaxed); }
  uint64_t Now() const;

 private:
  struct Prepared {
    std::vector<std::byte> body;  // the TX_PREPARE request: participants, writes
    uint64_t deadline_ns = 0;
    bool resolving = false;  // Recover is asking about it
  };
  void Apply(uint64_t txid, const Prepared& p, bool commit);
  // Keeps an outcome learned as a prepared participant (caller holds prepared_mu_).
  void RecordOutcome(uint64_t txid, bool committed);
  // TX_STATUS to `address`: kDecideCommit, kDecideAbort or kOutcomeUndecided.
  Result<uint8_t> AskStatus(const std::string& address, uint64_t txid);

  Node& node_;
  TwoPhaseWrites& writes_;
  const TwoPhaseOptions options_;
  const uint64_t retention_ns_;
  TwoPhaseCounters counters_;

  mutable std::mutex prepared_mu_;
  std::unordered_map<uint64_t, Prepared> prepared_;
  // Outcomes recorded as the first participant, learned as a prepared one, or fenced by a
  // TX_STATUS (true = committed), kept for retention_ns_ (max(60 s, 1000 leases), far longer
  // than any lease: a prepared participant asks one lease after its prepare), pruned oldest
  // first from decision_order_.
  mutable std::mutex decisions_mu_;
  std::unordered_map<uint64_t, bool> decisions_;
  std::deque<std::pair<uint64_t, uint64_t>> decision_order_;  // (recorded at ns, txid)
  // Peers asked, by bootstrap address (Recover only); its blocking calls on one scheduler.
  std::map<std::string, PeerId> peers_;
  BlockingRunner runner_;
};

}  // namespace farmem::tx
