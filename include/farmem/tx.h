// Storm transactions over the hash tables of farmemd's tx service (docs/tx.md "Client"): TxClient
// connects to the servers holding the table partitions; Tx runs one transaction as coroutines on
// one Scheduler (one thread), BlockingTx wraps it for synchronous callers. A TxClient is shared
// by any number of threads; a Tx / BlockingTx belongs to one thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "farmem/coro.h"
#include "farmem/node.h"
#include "farmem/status.h"

namespace farmem {

class Cluster;     // farmem/cluster.h
class TxDsClient;  // farmem/tx_ds.h: a data structure's client callbacks

// The cluster role a farmemd running the tx service joins with (beside "memory"): how
// TxClient::Connect(node, cluster) finds the servers holding the table partitions.
inline constexpr std::string_view kTxMemberRole = "tx";

// Why a transaction aborted (TxClientStats::aborts is indexed by it).
enum class TxAbortReason : uint8_t {
  kNone = 0,
  kLocked,       // an item was locked by another transaction (NO_WAIT)
  kValidation,   // a read-set item changed or got locked before commit
  kNotFound,     // read / write / remove of a missing key (then abort())
  kExists,       // insert of a live key
  kStaleCommit,  // a lock's lease ran out before the commit reached its owner
  kUser,         // abort() without an earlier failure
  kOther,        // an error that is not an abort (transport, protocol): the tx was aborted
};
inline constexpr size_t kTxAbortReasons = 8;
const char* TxAbortReasonName(TxAbortReason r);
// The reason of a kAborted status made by the tx client or service (kNone for other statuses).
TxAbortReason TxAbortReasonOf(const Status& st);

// How a one-sided copy is checked (docs/transport.md "Copy order of one-sided reads").
enum class TxReadCheck : uint8_t {
  kAuto,     // word-ordered on the native TCP backend, seqlock recheck on every other
  kOrdered,  // one read; accept iff seq even and == tail
  kSeqlock,  // seq word, item, seq word again (SeqlockRecheck); validation by TX_VALIDATE
};

// Test-only: where a multi-participant commit() stops as if its client died there (nothing more
// is sent; commit() returns kInternal "test fault: ..."; the locks stay until the servers'
// leases and recovery deal with them).
enum class TxDieAt : uint8_t {
  kNever,
  kHoldingLocks,      // before any commit message (locks held)
  kAfterPrepare,      // every TX_PREPARE acknowledged, no decision sent
  kAfterFirstDecide,  // the first participant committed (the commit point), no other decision
};

// Test-only protocol steps to leave out (docs/tx.md "Tests"). Never set outside tests.
struct TxClientFaults {
  bool skip_validation = false;  // commit without validating the read set
  // Commit as before prepare / decide existed: one TX_COMMIT per (table, partition) in turn, so a
  // client dying between two of them leaves a partial commit (kAfterFirstDecide: after the first).
  bool one_phase_commit = false;
  TxDieAt die_at = TxDieAt::kNever;
  // One-sided reads stop at the main bucket (a key in an overflow chain is read by TX_LOOKUP).
  bool no_chain_follow = false;
};

struct TxClientOptions {
  std::chrono::milliseconds lease{2000};  // lock lease asked for (the server caps it)
  bool one_sided_reads = true;            // false: every read is a TX_LOOKUP RPC (RPC-only)
  // false: item addresses are never remembered, every one-sided read guesses the main bucket
  // (Storm's "oversub" configuration; `farmem bench tx` compares it with the warm cache).
  bool address_cache = true;
  TxReadCheck read_check = TxReadCheck::kAuto;
  TxClientFaults faults;
};

struct TxClientStats {
  uint64_t one_sided_hits = 0;        // reads served by one-sided copies
  uint64_t one_sided_chain_hits = 0;  // of those, served after following an overflow chain link
  uint64_t one_sided_misses = 0;      // one-sided attempts that fell back to TX_LOOKUP
  uint64_t rpc_lookups = 0;           // TX_LOOKUP RPCs
  uint64_t one_sided_validations = 0;
  uint64_t rpc_validations = 0;  // TX_VALIDATE RPCs
  uint64_t commits = 0;          // committed transactions
  uint64_t aborts[kTxAbortReasons] = {};
};

class TxClient {
 public:
  // Connects to every server (bootstrap "host:port"), reads TX_TABLE_INFO from each and checks
  // that every table is served by all servers with the same geometry and that its partitions
  // 0..n-1 are each held by exactly one of them.
  static Result<std::unique_ptr<TxClient>> Connect(Node& node,
                                                   const std::vector<std::string>& servers,
                                                   TxClientOptions options = {});
  // The same, with the servers found in the cluster's membership: every live member with role
  // kTxMemberRole (farmemd --cluster with the tx service), by name. NotFound, naming the
  // members there are, when none serves tx; a partition no member holds fails as above.
  static Result<std::unique_ptr<TxClient>> Connect(Node& node, Cluster& cluster,
                                                   TxClientOptions options = {});
  ~TxClient();
  TxClient(const TxClient&) = delete;
  TxClient& operator=(const TxClient&) = delete;

  // Makes a data structure of the user's own usable in transactions (docs/tx.md "User data
  // structures"): Tx reads it one-two-sidedly through `ds`'s callbacks, and locks, validates,
  // commits and unlocks through its owner's transaction RPCs. `ds` is shared by every thread's
  // transactions (so thread-safe) and must answer tx_opcode_base() and value_size(); `owner` is
  // the bootstrap address of the node that exports region `region` (read one-sidedly) and serves
  // the RPCs. Returns the id Tx calls take as `table` (after the hash tables' ids; table(name)
  // finds it too). Call before transactions run on this client (not synchronized with them).
  Result<uint16_t> add_data_structure(std::string name, std::shared_ptr<TxDsClient> ds,
                                      const std::string& owner, std::string_view region);
  // A table's (or data structure's) id by name (kNotFound), its key and value sizes (a data
  // structure's key size is 0: any multiple of 8 from 8 to 64 bytes).
  Result<uint16_t> table(std::string_view name) const;
  uint32_t key_size(uint16_t table) const;
  uint32_t value_size(uint16_t table) const;
  TxClientStats stats() const;

  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  TxClient() = default;
  std::unique_ptr<Impl> impl_;
};

// One transaction at a time, reused: start(), then reads / writes / inserts / removes, then
// commit() or abort(). Values returned are views valid until the next start().
class Tx {
 public:
  Tx(TxClient& client, Scheduler& sched);
  ~Tx();
  Tx(const Tx&) = delete;
  Tx& operator=(const Tx&) = delete;

  // Begins a new transaction (an unfinished one is abandoned: call abort() first).
  void start();
  uint64_t id() const;
  // The value of `key` (one-two-sided read; read-your-writes). kNotFound when absent, kAborted
  // "locked" when another transaction holds it (the transaction is then aborted).
  Task<Result<std::span<const std::byte>>> read(uint16_t table, std::span<const std::byte> key);
  // Read-for-update: locks `key` at its owner now and returns its value to change in place;
  // commit() installs it.
  Task<Result<std::span<std::byte>>> write(uint16_t table, std::span<const std::byte> key);
  // Reserves `key` (kAborted "exists" when live) and installs `value` at commit.
  Task<Status> insert(uint16_t table, std::span<const std::byte> key,
                      std::span<const std::byte> value);
  // Locks `key` and removes it at commit.
  Task<Status> remove(uint16_t table, std::span<const std::byte> key);
  // OK, or kAborted "<reason>: ..." (locks released). Read-only: validation only.
  Task<Status> commit();
  // Releases every lock; changes nothing. Idempotent.
  Task<Status> abort();
  // Why the transaction aborted (kNone while running or after a commit).
  TxAbortReason abort_reason() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Tx for synchronous callers: its own scheduler of the client's node, one thread at a time.
class BlockingTx {
 public:
  static Result<std::unique_ptr<BlockingTx>> Create(TxClient& client, Node& node);
  void start() { tx_->start(); }
  Result<std::vector<std::byte>> read(uint16_t table, std::span<const std::byte> key);
  // Locks key and returns its value to change in place (valid until start()); commit installs it.
  Result<std::span<std::byte>> write(uint16_t table, std::span<const std::byte> key);
  Status insert(uint16_t table, std::span<const std::byte> key, std::span<const std::byte> value);
  Status remove(uint16_t table, std::span<const std::byte> key);
  Status commit();
  Status abort();
  Tx& tx() { return *tx_; }

 private:
  BlockingTx() = default;
  std::unique_ptr<Scheduler> sched_;
  std::unique_ptr<Tx> tx_;
};

}  // namespace farmem
