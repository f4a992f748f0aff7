// TxService: farmemd's Storm transaction tables behind the tx RPCs of tx/format/tx_wire.h. Owns
// one TxTable (partition of a hash table) per --tx-table, exports each region read-only as
// "tx.<NAME>" for one-sided reads, and runs a reaper thread freeing locks whose lease ran out and
// resolving prepared multi-participant commits whose coordinator went silent (it asks the first
// participant by TX_STATUS, and the other participants when the first does not answer). Handlers
// run on RPC worker threads (TX_LOOKUP inline on the progress thread); STAT and metrics from any
// thread. docs/tx.md ("Service", "Multi-participant commit").
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/node.h"
#include "farmem/server.h"
#include "farmem/status.h"
#include "node/rpc_call.h"
#include "service/service.h"
#include "tx/engine/tx_table.h"
#include "tx/format/tx_data_structure.h"
#include "tx/format/tx_wire.h"
#include "tx/service/tx_two_phase.h"

namespace farmem {

// The tx service as farmemd knows it: the --tx-* flags and the factory.
const ServiceDescriptor& TxServiceDescriptor();

// One --tx-table entry, parsed.
struct TxTableSpec {
  std::string name;
  tx::TxGeometry geometry;  // partition / num_partitions / overflow from TxConfig
};
// Parses NAME:KEY_BYTES:VALUE_BYTES:BUCKETS[:WIDTH] (WIDTH default 4) against `config`'s
// partition, partitions and overflow_percent; InvalidArgument naming the flag on any error.
Result<TxTableSpec> ParseTxTableSpec(const std::string& text, const TxConfig& config);
// Checks config.tx (every table spec, distinct names, partition < partitions, lease > 0).
Status ValidateTxConfig(const ServerConfig& config);

// The hash table's owner side of the data-structure callbacks (tx_data_structure.h):
// rpc_handler is Handle.
class TxService final : public Service, public tx::TxDsOwner, private tx::TwoPhaseWrites {
 public:
  // Builds every table of config.tx and exports each region read-only through `node` (which
  // must outlive the service and be stopped before it is destroyed). `table_options` is for
  // tests (clock, fault injection); farmemd uses the defaults.
  static Result<std::unique_ptr<TxService>> Create(const ServerConfig& config, Node& node,
                                                   tx::TxTableOptions table_options = {});
  ~TxService() override;
  TxService(const TxService&) = delete;
  TxService& operator=(const TxService&) = delete;

  // STAT name of a tx opcode ("tx_lookup", ...), nullptr for opcodes the service lacks.
  static const char* OpName(uint16_t opcode);
  // Serves one tx RPC. Thread-safe.
  Status Handle(const RpcCall& call, std::vector<std::byte>& reply);
  Status rpc_handler(uint16_t opcode, std::span<const std::byte> request,
                     std::vector<std::byte>& reply) override {
    return Handle(RpcCall{opcode, request, "rpc_handler"}, reply);
  }

  std::string_view name() const override { return "tx"; }
  OpcodeRange opcodes() const override { return kTxOpcodes; }
  std::vector<ServiceMethod> methods() override;
  // Starts the reaper thread (ReapExpired on every table each lease/2). Idempotent.
  Status start() override;
  void stop() override;
  // STAT key "tx" and the farmem_tx_* metrics.
  void stats(nlohmann::json& doc) const override;
  void metrics(MetricsWriter& out) const override;
  nlohmann::json Stats() const;

  size_t table_count() const { return tables_.size(); }
  tx::TxTable& table(size_t i) { return *tables_[i].table; }

 private:
  TxService() = default;

  struct Table {
    std::string name;
    std::unique_ptr<tx::TxTable> table;
    RegionInfo region;
  };
  // Counters (relaxed atomics; read by STAT / metrics).
  struct Counters {
    std::atomic<uint64_t> lookups{0}, locks{0}, lock_inserts{0}, validates{0}, commits{0},
        commit_items{0}, unlocks{0}, not_found{0}, reaped{0};
    // Aborts by reason, indexed by tx::AbortReason.
    std::atomic<uint64_t> aborts[6]{};
  };

  Result<Table*> TableOf(uint16_t id, size_t key_len);
  // Counts an abort of `st` (if it is one) and passes it on.
  Status Count(Status st);
  Status TableInfo(const RpcCall& call, std::vector<std::byte>& reply);
  Status Lookup(const RpcCall& call, std::vector<std::byte>& reply);
  Status Lock(const RpcCall& call, std::vector<std::byte>& reply);
  Status LockInsert(const RpcCall& call, std::vector<std::byte>& reply);
  Status Validate(const RpcCall& call, std::vector<std::byte>& reply);
  Status Commit(const RpcCall& call, std::vector<std::byte>& reply);
  Status Unlock(const RpcCall& call, std::vector<std::byte>& reply);
  Status Prepare(const RpcCall& call, std::vector<std::byte>& reply);
  Status Decide(const RpcCall& call, std::vector<std::byte>& reply);
  Status TxStatus(const RpcCall& call, std::vector<std::byte>& reply);
  void ReaperLoop();

  // ---- Multi-participant commit (docs/tx.md "Multi-participant commit") ----------------------
  // A participant's writes by table (views into a request body).
  using Groups = std::map<uint16_t, std::vector<tx::TxTable::TxWrite>>;
  Result<Groups> Group(std::span<const tx_wire::TwoPhaseEntry> items);
  // PrepareAll on every table, or none: after a refusal, txid's locks on all items are released.
  Status PinAll(uint64_t txid, const Groups& groups);
  // Installs every table's writes or none (one table: CommitAll; several: PinAll, then CommitAll).
  Status CommitGroups(uint64_t txid, const Groups& groups);
  void UnlockGroups(uint64_t txid, const Groups& groups);
  // tx::TwoPhaseWrites: the tables' side of a prepare and of its outcome.
  Status Check(std::span<const tx_wire::TwoPhaseEntry> items) override;
  Status Pin(uint64_t txid, std::span<const tx_wire::TwoPhaseEntry> items) override;
  void Apply(uint64_t txid, std::span<const tx_wire::TwoPhaseEntry> items, bool commit) override;
  uint64_t Now() const;

  TxConfig config_;
  uint64_t max_lease_ns_ = 0;
  std::vector<Table> tables_;
  mutable Counters counters_;
  // Prepare records, decisions, TX_STATUS and the recovery (tx_two_phase.h).
  std::unique_ptr<tx::TwoPhaseParticipant> two_phase_;

  std::mutex reaper_mu_;
  std::condition_variable reaper_cv_;
  bool stopping_ = false;
  std::thread reaper_;
};

}  // namespace farmem
