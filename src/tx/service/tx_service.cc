// TxService (tx_service.h): parsing of --tx-table, the tx RPC handlers over TxTable, the reaper
// thread, STAT and metrics. Handlers run on RPC workers / the progress thread; the reaper on its
// own thread; STAT from any thread.
#include "tx/service/tx_service.h"

#include <charconv>
#include <chrono>
#include <set>
#include <string>
#include <string_view>

#include "service/flags.h"

namespace farmem {
namespace {

using tx::AbortReason;
namespace wire = tx_wire;

constexpr const char* kReasonNames[] = {"none",       "locked",       "exists",
                                        "validation", "stale_commit", "not_lock_holder"};

bool ParseU32(std::string_view s, uint32_t* out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size() && !s.empty();
}

}  // namespace

Result<TxTableSpec> ParseTxTableSpec(const std::string& text, const TxConfig& config) {
  std::vector<std::string_view> parts;
  std::string_view rest = text;
  while (true) {
    const size_t colon = rest.find(':');
    parts.push_back(rest.substr(0, colon));
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  const auto bad = [&](std::string_view why) {
    return Status::InvalidArgument("--tx-table '" + text + "': " + std::string(why) +
                                   " (NAME:KEY_BYTES:VALUE_BYTES:BUCKETS[:WIDTH])");
  };
  if (parts.size() != 4 && parts.size() != 5) return bad("expected 4 or 5 fields");
  TxTableSpec spec;
  spec.name = std::string(parts[0]);
  if (spec.name.empty() || spec.name.size() > wire::kMaxTableName) return bad("bad name length");
  for (char c : spec.name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return bad("name may hold only [A-Za-z0-9_.-]");
  }
  tx::TxGeometry& g = spec.geometry;
  uint32_t width = 4;
  if (!ParseU32(parts[1], &g.key_size) || !ParseU32(parts[2], &g.value_size) ||
      !ParseU32(parts[3], &g.num_buckets) || (parts.size() == 5 && !ParseU32(parts[4], &width))) {
    return bad("sizes must be unsigned integers");
  }
  g.width = width;
  g.overflow_buckets = std::max<uint32_t>(
      1, static_cast<uint32_t>(uint64_t{g.num_buckets} * config.overflow_percent / 100));
  g.partition = static_cast<uint16_t>(config.partition);
  g.num_partitions = static_cast<uint16_t>(config.partitions);
  g.hash_seed = 0;
  if (Status st = tx::ValidateGeometry(g); !st.ok()) return bad(st.message());
  return spec;
}

Status ValidateTxConfig(const ServerConfig& config) {
  const TxConfig& t = config.tx;
  if (t.partitions == 0 || t.partitions > 65535 || t.partition >= t.partitions) {
    return Status::InvalidArgument("--tx-partition must be < --tx-partitions (1..65535)");
  }
  if (t.lease_ms == 0 || t.lease_ms > 60000) {
    return Status::InvalidArgument("--tx-lease-ms must be in 1..60000");
  }
  if (t.overflow_percent > 1000) {
    return Status::InvalidArgument("--tx-overflow-percent must be in 0..1000");
  }
  if (t.tables.size() > wire::kMaxTables) {
    return Status::InvalidArgument("at most 64 --tx-table");
  }
  std::set<std::string> names;
  for (const std::string& text : t.tables) {
    FARMEM_ASSIGN_OR_RETURN(TxTableSpec spec, ParseTxTableSpec(text, t));
    if (!names.insert(spec.name).second) {
      return Status::InvalidArgument("--tx-table: table '" + spec.name + "' given twice");
    }
  }
  return Status::OK();
}

Result<std::unique_ptr<TxService>> TxService::Create(const ServerConfig& config, Node& node,
                                                     tx::TxTableOptions table_options) {
  FARMEM_RETURN_IF_ERROR(ValidateTxConfig(config));
  std::unique_ptr<TxService> s(new TxService());
  s->config_ = config.tx;
  s->max_lease_ns_ = uint64_t{config.tx.lease_ms} * 1'000'000;
  tx::TwoPhaseOptions two_phase;
  two_phase.now_ns = table_options.now_ns;
  two_phase.max_lease_ns = s->max_lease_ns_;
  two_phase.self = node.bootstrap_address();
  two_phase.no_learned_outcome = table_options.faults.no_learned_outcome;
  two_phase.no_prepare_fence = table_options.faults.no_prepare_fence;
  s->two_phase_ = std::make_unique<tx::TwoPhaseParticipant>(
      node, static_cast<tx::TwoPhaseWrites&>(*s), std::move(two_phase));
  for (const std::string& text : config.tx.tables) {
    FARMEM_ASSIGN_OR_RETURN(TxTableSpec spec, ParseTxTableSpec(text, config.tx));
    auto table = tx::TxTable::Create(spec.geometry, table_options);
    if (!table.ok()) return table.status().WithContext("creating tx table " + spec.name);
    auto region = node.export_region("tx." + spec.name, (*table)->region(),
                                     (*table)->region_bytes(), Access::kReadOnly);
    if (!region.ok()) return region.status().WithContext("exporting tx table " + spec.name);
    s->tables_.push_back(Table{spec.name, std::move(*table), *region});
  }
  return s;
}

TxService::~TxService() {
  stop();
}

const char* TxService::OpName(uint16_t opcode) {
  switch (opcode) {
    case wire::kOpTableInfo:
      return "tx_table_info";
    case wire::kOpLookup:
      return "tx_lookup";
    case wire::kOpLock:
      return "tx_lock";
    case wire::kOpLockInsert:
      return "tx_lock_insert";
    case wire::kOpValidate:
      return "tx_validate";
    case wire::kOpCommit:
      return "tx_commit";
    case wire::kOpUnlock:
      return "tx_unlock";
    case wire::kOpPrepare:
      return "tx_prepare";
    case wire::kOpDecide:
      return "tx_decide";
    case wire::kOpStatus:
      return "tx_status";
    default:
      return nullptr;
  }
}

std::vector<ServiceMethod> TxService::methods() {
  std::vector<ServiceMethod> out;
  for (uint16_t op = wire::kOpTableInfo; op <= wire::kLastTxOpcode; ++op) {
    // Lookups are short (one stripe, one item copy): inline, like Storm's dispatch requests.
    const RpcExecution ex = op == wire::kOpLookup ? RpcExecution::kInline : RpcExecution::kWorker;
    out.push_back({op, OpName(op), ex, [this](const RpcCall& call, std::vector<std::byte>& reply) {
                     return Handle(call, reply);
                   }});
  }
  return out;
}

Status TxService::Handle(const RpcCall& call, std::vector<std::byte>& reply) {
  switch (call.opcode) {
    case wire::kOpTableInfo:
      return TableInfo(call, reply);
    case wire::kOpLookup:
      return Lookup(call, reply);
    case wire::kOpLock:
      return Lock(call, reply);
    case wire::kOpLockInsert:
      return LockInsert(call, reply);
    case wire::kOpValidate:
      return Validate(call, reply);
    case wire::kOpCommit:
      return Commit(call, reply);
    case wire::kOpUnlock:
      return Unlock(call, reply);
    case wire::kOpPrepare:
      return Prepare(call, reply);
    case wire::kOpDecide:
      return Decide(call, reply);
    case wire::kOpStatus:
      return TxStatus(call, reply);
    default:
      return Status::Protocol("tx: unknown opcode " + std::to_string(call.opcode));
  }
}

Result<TxService::Table*> TxService::TableOf(uint16_t id, size_t key_len) {
  if (id >= tables_.size()) {
    return Status::NotFound("tx: unknown table id " + std::to_string(id));
  }
  Table& t = tables_[id];
  if (key_len != t.table->geometry().key_size) {
    return Status::InvalidArgument("tx: table " + t.name + " has " +
                                   std::to_string(t.table->geometry().key_size) +
                                   "-byte keys, got " + std::to_string(key_len));
  }
  return &t;
}

Status TxService::Count(Status st) {
  if (st.code() == Code::kAborted) {
    const auto r = static_cast<size_t>(tx::AbortReasonOf(st));
    if (r < std::size(counters_.aborts))
      counters_.aborts[r].fetch_add(1, std::memory_order_relaxed);
  } else if (st.code() == Code::kNotFound) {
    counters_.not_found.fetch_add(1, std::memory_order_relaxed);
  }
  return st;
}

Status TxService::TableInfo(const RpcCall& call, std::vector<std::byte>& reply) {
  if (!call.request.empty()) return Status::Protocol("TX_TABLE_INFO: request must be empty");
  std::vector<wire::TableInfo> infos;
  for (const Table& t : tables_) {
    infos.push_back({t.name, t.region.key, t.table->region_bytes(), t.table->geometry()});
  }
  reply = wire::EncodeTableInfoReply(infos);
  return Status::OK();
}

namespace {
void AppendItem(std::vector<std::byte>& reply, const wire::ItemReply& r) {
  const auto* p = reinterpret_cast<const std::byte*>(&r);
  reply.insert(reply.begin(), p, p + sizeof(r));
}
}  // namespace

Status TxService::Lookup(const RpcCall& call, std::vector<std::byte>& reply) {
  FARMEM_ASSIGN_OR_RETURN(wire::KeyOp op, wire::DecodeKeyRequest(call.request, false));
  FARMEM_ASSIGN_OR_RETURN(Table * t, TableOf(op.table, op.key.size()));
  counters_.lookups.fetch_add(1, std::memory_order_relaxed);
  reply.resize(t->table->geometry().value_size);
  auto got = t->table->Lookup(op.key, reply);
  if (!got.ok()) return Count(got.status());
  AppendItem(reply, {got->offset, got->version, got->lock_txid});
  return Status::OK();
}

Status TxService::Lock(const RpcCall& call, std::vector<std::byte>& reply) {
  FARMEM_ASSIGN_OR_RETURN(wire::KeyOp op, wire::DecodeKeyRequest(call.request, true));
  FARMEM_ASSIGN_OR_RETURN(Table * t, TableOf(op.table, op.key.size()));
  counters_.locks.fetch_add(1, std::memory_order_relaxed);
  reply.resize(t->table->geometry().value_size);
  auto got = t->table->LockForUpdate(op.key, op.txid, std::min(op.lease_ns, max_lease_ns_), reply);
  if (!got.ok()) return Count(got.status());
  AppendItem(reply, {got->offset, got->version, got->lock_txid});
  return Status::OK();
}

Status TxService::LockInsert(const RpcCall& call, std::vector<std::byte>& reply) {
  FARMEM_ASSIGN_OR_RETURN(wire::KeyOp op, wire::DecodeKeyRequest(call.request, true));
  FARMEM_ASSIGN_OR_RETURN(Table * t, TableOf(op.table, op.key.size()));
  counters_.lock_inserts.fetch_add(1, std::memory_order_relaxed);
  auto got = t->table->LockForInsert(op.key, op.txid, std::min(op.lease_ns, max_lease_ns_));
  if (!got.ok()) return Count(got.status());
  AppendItem(reply, {*got, 0, op.txid});
  return Status::OK();
}

Status TxService::Validate(const RpcCall& call, std::vector<std::byte>& reply) {
  (void)reply;
  FARMEM_ASSIGN_OR_RETURN(wire::ValidateOp op, wire::DecodeValidateRequest(call.request));
  FARMEM_ASSIGN_OR_RETURN(Table * t, TableOf(op.table, op.items[0].key.size()));
  counters_.validates.fetch_add(1, std::memory_order_relaxed);
  for (const wire::ValidateItem& i : op.items) {
    if (Status st = t->table->Validate(i.key, i.version, op.txid); !st.ok()) return Count(st);
  }
  return Status::OK();
}

Status TxService::Commit(const RpcCall& call, std::vector<std::byte>& reply) {
  (void)reply;
  FARMEM_ASSIGN_OR_RETURN(wire::BatchOpRequest req, wire::DecodeBatchRequest(call.request, true));
  FARMEM_ASSIGN_OR_RETURN(Table * t, TableOf(req.table, req.items[0].key.size()));
  std::vector<tx::TxTable::TxWrite> writes;
  for (const wire::BatchEntry& e : req.items) {
    if (e.key.size() != t->table->geometry().key_size) {
      return Status::InvalidArgument("TX_COMMIT: items of different key sizes");
    }
    writes.push_back({e.key, e.op == wire::kRemove, e.value});
  }
  counters_.commits.fetch_add(1, std::memory_order_relaxed);
  counters_.commit_items.fetch_add(writes.size(), std::memory_order_relaxed);
  return Count(t->table->CommitAll(req.txid, writes));
}

Status TxService::Unlock(const RpcCall& call, std::vector<std::byte>& reply) {
  (void)reply;
  FARMEM_ASSIGN_OR_RETURN(wire::BatchOpRequest req, wire::DecodeBatchRequest(call.request, false));
  FARMEM_ASSIGN_OR_RETURN(Table * t, TableOf(req.table, req.items[0].key.size()));
  counters_.unlocks.fetch_add(1, std::memory_order_relaxed);
  Status first = Status::OK();
  for (const wire::BatchEntry& e : req.items) {
    if (e.key.size() != t->table->geometry().key_size) {
      if (first.ok()) first = Status::InvalidArgument("TX_UNLOCK: items of different key sizes");
      continue;
    }
    Status st = t->table->Unlock(e.key, req.txid);
    if (!st.ok() && first.ok()) first = st;
  }
  return Count(first);
}

// ---- Multi-participant commit ------------------------------------------------------------------

uint64_t TxService::Now() const {
  return two_phase_->Now();
}

Result<TxService::Groups> TxService::Group(std::span<const wire::TwoPhaseEntry> items) {
  Groups groups;
  for (const wire::TwoPhaseEntry& e : items) {
    FARMEM_ASSIGN_OR_RETURN(Table * t, TableOf(e.table, e.key.size()));
    (void)t;
    groups[e.table].push_back({e.key, e.op == wire::kRemove, e.value});
  }
  return groups;
}

Status TxService::PinAll(uint64_t txid, const Groups& groups) {
  for (const auto& [table, writes] : groups) {
    Status st = tables_[table].table->PrepareAll(txid, writes);
    if (st.ok()) continue;
    // This table released its locks; release the other tables' too (pinned or not): the
    // transaction is aborted here, nothing of it may stay locked.
    for (const auto& [other, w] : groups) {
      if (other == table) continue;
      for (const auto& item : w) (void)tables_[other].table->Unlock(item.key, txid);
    }
    return st;
  }
  return Status::OK();
}

Status TxService::CommitGroups(uint64_t txid, const Groups& groups) {
  if (groups.size() == 1) {
    return tables_[groups.begin()->first].table->CommitAll(txid, groups.begin()->second);
  }
  // Several tables: pinned first, so no lease can run out between two tables' installs.
  FARMEM_RETURN_IF_ERROR(PinAll(txid, groups));
  for (const auto& [table, writes] : groups) {
    Status st = tables_[table].table->CommitAll(txid, writes);
    if (!st.ok()) return Status::Internal("tx: commit of a pinned table refused: " + st.ToString());
  }
  return Status::OK();
}

void TxService::UnlockGroups(uint64_t txid, const Groups& groups) {
  for (const auto& [table, writes] : groups) {
    for (const auto& w : writes) (void)tables_[table].table->Unlock(w.key, txid);
  }
}

Status TxService::Check(std::span<const wire::TwoPhaseEntry> items) {
  return Group(items).status();
}

Status TxService::Pin(uint64_t txid, std::span<const wire::TwoPhaseEntry> items) {
  FARMEM_ASSIGN_OR_RETURN(Groups groups, Group(items));
  return PinAll(txid, groups);
}

void TxService::Apply(uint64_t txid, std::span<const wire::TwoPhaseEntry> items, bool commit) {
  // The items were checked when they were prepared; Group cannot fail now.
  Result<Groups> groups = Group(items);
  if (!groups.ok()) return;
  if (!commit) {
    UnlockGroups(txid, *groups);
    return;
  }
  for (const auto& [table, writes] : *groups) {
    (void)Count(tables_[table].table->CommitAll(txid, writes));
  }
}

Status TxService::Prepare(const RpcCall& call, std::vector<std::byte>& reply) {
  (void)reply;
  return Count(two_phase_->Prepare(call.request));
}

Status TxService::Decide(const RpcCall& call, std::vector<std::byte>& reply) {
  (void)reply;
  FARMEM_ASSIGN_OR_RETURN(wire::TwoPhaseRequest req,
                          wire::DecodeTwoPhaseRequest(call.request, false));
  const bool commit = req.decision == wire::kDecideCommit;
  // A prepared participant's outcome.
  if (req.num_participants == 0) return two_phase_->DecidePrepared(req.txid, commit);
  // The first participant: its own writes (none when it only keeps the decision). With one
  // participant there is nothing to record.
  FARMEM_ASSIGN_OR_RETURN(Groups groups, Group(req.items));
  counters_.commit_items.fetch_add(req.items.size(), std::memory_order_relaxed);
  if (req.num_participants == 1) {
    two_phase_->CountDecide();
    return Count(CommitGroups(req.txid, groups));
  }
  return Count(two_phase_->DecideFirst(
      req.txid, [&] { return groups.empty() ? Status::OK() : CommitGroups(req.txid, groups); },
      [&] { UnlockGroups(req.txid, groups); }));
}

Status TxService::TxStatus(const RpcCall& call, std::vector<std::byte>& reply) {
  FARMEM_ASSIGN_OR_RETURN(wire::StatusRequest req, wire::DecodeStatusRequest(call.request));
  reply = EncodeStruct(two_phase_->StatusOf(req.txid));
  return Status::OK();
}

Status TxService::start() {
  std::lock_guard lock(reaper_mu_);
  if (reaper_.joinable() || tables_.empty()) return Status::OK();
  stopping_ = false;
  reaper_ = std::thread([this] { ReaperLoop(); });
  return Status::OK();
}

void TxService::stop() {
  {
    std::lock_guard lock(reaper_mu_);
    stopping_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
}

void TxService::ReaperLoop() {
  const auto period = std::chrono::microseconds(std::max<uint64_t>(1, config_.lease_ms * 500));
  std::unique_lock lock(reaper_mu_);
  while (!stopping_) {
    reaper_cv_.wait_for(lock, period, [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    uint64_t freed = 0;
    for (Table& t : tables_) freed += t.table->ReapExpired();
    counters_.reaped.fetch_add(freed, std::memory_order_relaxed);
    two_phase_->Recover();
    lock.lock();
  }
}

nlohmann::json TxService::Stats() const {
  const auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  nlohmann::json j;
  j["lease_ms"] = config_.lease_ms;
  j["partition"] = config_.partition;
  j["partitions"] = config_.partitions;
  j["lookups"] = get(counters_.lookups);
  j["locks"] = get(counters_.locks);
  j["lock_inserts"] = get(counters_.lock_inserts);
  j["validates"] = get(counters_.validates);
  j["commits"] = get(counters_.commits);
  j["commit_items"] = get(counters_.commit_items);
  j["unlocks"] = get(counters_.unlocks);
  j["not_found"] = get(counters_.not_found);
  j["reaped_locks"] = get(counters_.reaped);
  j["prepares"] = get(two_phase_->counters().prepares);
  j["decides"] = get(two_phase_->counters().decides);
  j["statuses"] = get(two_phase_->counters().statuses);
  j["recovered_commits"] = get(two_phase_->counters().recovered_commits);
  j["recovered_aborts"] = get(two_phase_->counters().recovered_aborts);
  j["recovery_unreachable"] = get(two_phase_->counters().recovery_unreachable);
  j["recovered_from_peers"] = get(two_phase_->counters().recovered_from_peers);
  j["prepared"] = two_phase_->prepared();
  j["decisions"] = two_phase_->decisions();
  nlohmann::json aborts = nlohmann::json::object();
  for (size_t r = 1; r < std::size(counters_.aborts); ++r) {
    aborts[kReasonNames[r]] = get(counters_.aborts[r]);
  }
  j["aborts"] = aborts;
  nlohmann::json tables = nlohmann::json::array();
  for (const Table& t : tables_) {
    const tx::TxTableStats ts = t.table->Stats();
    const tx::TxGeometry& g = t.table->geometry();
    tables.push_back({{"name", t.name},
                      {"region", t.region.name},
                      {"region_bytes", t.table->region_bytes()},
                      {"key_size", g.key_size},
                      {"value_size", g.value_size},
                      {"width", g.width},
                      {"buckets", g.num_buckets},
                      {"overflow_buckets", g.overflow_buckets},
                      {"overflow_used", ts.overflow_buckets_used},
                      {"live_items", ts.live_items},
                      {"locked_items", ts.locked_items}});
  }
  j["tables"] = tables;
  return j;
}

void TxService::stats(nlohmann::json& doc) const {
  doc["tx"] = Stats();
}

void TxService::metrics(MetricsWriter& w) const {
  const auto get = [](const std::atomic<uint64_t>& a) {
    return static_cast<double>(a.load(std::memory_order_relaxed));
  };
  w.counter("farmem_tx_lookups_total", "TX_LOOKUP requests served.", get(counters_.lookups));
  w.counter("farmem_tx_locks_total", "TX_LOCK (read-for-update) requests served.",
            get(counters_.locks));
  w.counter("farmem_tx_lock_inserts_total", "TX_LOCK_INSERT requests served.",
            get(counters_.lock_inserts));
  w.counter("farmem_tx_validates_total", "TX_VALIDATE requests served.", get(counters_.validates));
  w.counter("farmem_tx_commits_total", "TX_COMMIT requests served.", get(counters_.commits));
  w.counter("farmem_tx_unlocks_total", "TX_UNLOCK (abort) requests served.",
            get(counters_.unlocks));
  w.counter("farmem_tx_reaped_locks_total", "Locks freed by the reaper after their lease.",
            get(counters_.reaped));
  w.counter("farmem_tx_prepares_total", "TX_PREPARE requests served.",
            get(two_phase_->counters().prepares));
  w.counter("farmem_tx_decides_total", "TX_DECIDE requests served.",
            get(two_phase_->counters().decides));
  w.family("farmem_tx_recoveries_total", MetricsWriter::Kind::kCounter,
           "Prepared transactions resolved by asking the participants, by outcome.");
  w.sample({{"outcome", "commit"}}, get(two_phase_->counters().recovered_commits));
  w.sample({{"outcome", "abort"}}, get(two_phase_->counters().recovered_aborts));
  w.sample({{"outcome", "unreachable"}}, get(two_phase_->counters().recovery_unreachable));
  w.counter("farmem_tx_recoveries_from_peers_total",
            "Prepared transactions resolved by a participant other than the unreachable first.",
            get(two_phase_->counters().recovered_from_peers));
  w.family("farmem_tx_aborts_total", MetricsWriter::Kind::kCounter,
           "Tx requests refused with an abort, by reason.");
  for (size_t r = 1; r < std::size(counters_.aborts); ++r) {
    w.sample({{"reason", kReasonNames[r]}}, get(counters_.aborts[r]));
  }
}

const ServiceDescriptor& TxServiceDescriptor() {
  static const ServiceDescriptor d{
      "tx",
      "Storm transaction tables: TX_* RPCs, one read-only region 'tx.<NAME>' per table",
      [](FlagSet& flags, ServerConfig& c) {
        TxConfig& t = c.tx;
        flags.add_list("tx-table", &t.tables,
                       "tables to serve, NAME:KEY_BYTES:VALUE_BYTES:BUCKETS[:WIDTH], comma "
                       "separated (a table's id is its place in this list)");
        flags.add("tx-partition", &t.partition, "this server's partition of every tx table");
        flags.add("tx-partitions", &t.partitions, "partitions (servers) of every tx table");
        flags.add("tx-lease-ms", &t.lease_ms,
                  "longest lock lease granted (ms); the reaper runs every lease/2");
        flags.add("tx-overflow-percent", &t.overflow_percent,
                  "overflow buckets per table, percent of its buckets");
      },
      [](ServerConfig& c) { return ValidateTxConfig(c); },
      [](const ServerConfig& c, ServiceEnv& env) -> Result<std::unique_ptr<Service>> {
        FARMEM_ASSIGN_OR_RETURN(std::unique_ptr<TxService> s, TxService::Create(c, env.node));
        return std::unique_ptr<Service>(std::move(s));
      },
      [](const ServerConfig& c) { return !c.tx.tables.empty(); },
  };
  return d;
}

}  // namespace farmem
