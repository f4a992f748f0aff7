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
  s->node_ = &node;
  s->now_ns_ = table_options.now_ns;
  s->faults_ = table_options.faults;
  s->decision_retention_ns_ = std::max<uint64_t>(60'000'000'000ull, 1000 * s->max_lease_ns_);
  s->runner_ = std::make_unique<BlockingRunner>(node, "tx recovery");
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
  if (now_ns_) return now_ns_();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
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

Status TxService::Prepare(const RpcCall& call, std::vector<std::byte>& reply) {
  (void)reply;
  FARMEM_ASSIGN_OR_RETURN(wire::TwoPhaseRequest req,
                          wire::DecodeTwoPhaseRequest(call.request, true));
  FARMEM_ASSIGN_OR_RETURN(Groups groups, Group(req.items));
  counters_.prepares.fetch_add(1, std::memory_order_relaxed);
  // prepared_mu_ throughout: a TX_STATUS (prepared_mu_, then decisions_mu_) finds txid either
  // prepared here (and answers "undecided") or not (and fences it, which refuses this prepare).
  std::lock_guard lock(prepared_mu_);
  if (prepared_.count(req.txid) != 0) return Status::OK();  // a repeated prepare
  if (!faults_.no_prepare_fence) {
    std::lock_guard dlock(decisions_mu_);
    if (auto it = decisions_.find(req.txid); it != decisions_.end()) {
      if (it->second) return Status::OK();  // a repeated prepare after the commit reached here
      // A peer asked for txid's outcome and was told "aborted": this vote would come too late.
      for (const auto& [table, writes] : groups) {
        for (const auto& w : writes) (void)tables_[table].table->Unlock(w.key, req.txid);
      }
      return Count(Status::Aborted("stale commit: transaction " + std::to_string(req.txid) +
                                   " was decided abort (a participant asked for its outcome)"));
    }
  }
  FARMEM_RETURN_IF_ERROR(Count(PinAll(req.txid, groups)));
  Prepared p;
  p.body.assign(call.request.begin(), call.request.end());
  p.deadline_ns = Now() + std::min(req.lease_ns, max_lease_ns_);
  prepared_[req.txid] = std::move(p);
  return Status::OK();
}

void TxService::RecordOutcome(uint64_t txid, bool committed) {
  if (faults_.no_learned_outcome) return;
  std::lock_guard lock(decisions_mu_);
  if (decisions_.emplace(txid, committed).second) decision_order_.emplace_back(Now(), txid);
}

void TxService::Apply(uint64_t txid, const Prepared& p, bool commit) {
  // The body was decoded when it was prepared; it cannot fail now.
  Result<wire::TwoPhaseRequest> req = wire::DecodeTwoPhaseRequest(p.body, true);
  if (!req.ok()) return;
  Result<Groups> groups = Group(req->items);
  if (!groups.ok()) return;
  for (const auto& [table, writes] : *groups) {
    if (commit) {
      (void)Count(tables_[table].table->CommitAll(txid, writes));
    } else {
      for (const auto& w : writes) (void)tables_[table].table->Unlock(w.key, txid);
    }
  }
}

Status TxService::Decide(const RpcCall& call, std::vector<std::byte>& reply) {
  (void)reply;
  FARMEM_ASSIGN_OR_RETURN(wire::TwoPhaseRequest req,
                          wire::DecodeTwoPhaseRequest(call.request, false));
  counters_.decides.fetch_add(1, std::memory_order_relaxed);
  const bool commit = req.decision == wire::kDecideCommit;
  if (req.items.empty()) {
    // A prepared participant's outcome.
    Prepared p;
    {
      std::lock_guard lock(prepared_mu_);
      auto it = prepared_.find(req.txid);
      if (it == prepared_.end()) {
        if (!commit) return Status::OK();  // never prepared here, or resolved already
        return Status::FailedPrecondition("TX_DECIDE: transaction " + std::to_string(req.txid) +
                                          " is not prepared here (resolved already?)");
      }
      p = std::move(it->second);
      prepared_.erase(it);
      // Learned before prepared_mu_ is let go: a TX_STATUS from a peer never sees this
      // transaction neither prepared nor decided (it would fence it and answer "aborted").
      RecordOutcome(req.txid, commit);
    }
    Apply(req.txid, p, commit);
    return Status::OK();
  }
  // The first participant's own writes. With one participant there is nothing to record.
  FARMEM_ASSIGN_OR_RETURN(Groups groups, Group(req.items));
  counters_.commit_items.fetch_add(req.items.size(), std::memory_order_relaxed);
  if (req.num_participants == 1) return Count(CommitGroups(req.txid, groups));
  // The commit point: the writes and the decision under decisions_mu_, so a TX_STATUS sees
  // either the commit recorded, or no record (and then fences txid, and this commit is refused).
  std::lock_guard lock(decisions_mu_);
  if (auto it = decisions_.find(req.txid); it != decisions_.end()) {
    if (it->second) return Status::OK();  // a repeated commit
    for (const auto& [table, writes] : groups) {
      for (const auto& w : writes) (void)tables_[table].table->Unlock(w.key, req.txid);
    }
    return Count(Status::Aborted("stale commit: transaction " + std::to_string(req.txid) +
                                 " was decided abort (a participant asked for its outcome)"));
  }
  Status st = CommitGroups(req.txid, groups);
  decisions_[req.txid] = st.ok();
  decision_order_.emplace_back(Now(), req.txid);
  return Count(st);
}

Status TxService::TxStatus(const RpcCall& call, std::vector<std::byte>& reply) {
  FARMEM_ASSIGN_OR_RETURN(wire::StatusRequest req, wire::DecodeStatusRequest(call.request));
  counters_.statuses.fetch_add(1, std::memory_order_relaxed);
  wire::StatusReply r{};
  {
    std::lock_guard plock(prepared_mu_);
    std::lock_guard lock(decisions_mu_);
    if (auto it = decisions_.find(req.txid); it != decisions_.end()) {
      r.outcome = it->second ? wire::kDecideCommit : wire::kDecideAbort;
    } else if (prepared_.count(req.txid) != 0) {
      r.outcome = wire::kOutcomeUndecided;  // voted yes here: only the outcome may decide
    } else {
      decisions_.emplace(req.txid, false);  // no record: fenced as aborted
      decision_order_.emplace_back(Now(), req.txid);
      r.outcome = wire::kDecideAbort;
    }
  }
  reply = EncodeStruct(r);
  return Status::OK();
}

Result<uint8_t> TxService::AskStatus(const std::string& address, uint64_t txid) {
  PeerId peer = kInvalidPeer;
  if (auto it = peers_.find(address); it != peers_.end()) {
    peer = it->second;
  } else {
    Result<PeerInfo> info = node_->connect(address);
    if (!info.ok()) return info.status().WithContext("tx recovery: connecting to " + address);
    peer = info->id;
    peers_[address] = peer;
  }
  Result<wire::StatusReply> r = runner_->run([&](Scheduler& s) {
    return CallStruct<wire::StatusReply>(s, peer, wire::kOpStatus, wire::StatusRequest{txid},
                                         "TX_STATUS to " + address);
  });
  if (!r.ok()) {
    peers_.erase(address);  // connect afresh next time (the peer may have restarted)
    return r.status();
  }
  const auto bytes = EncodeStruct(*r);
  FARMEM_ASSIGN_OR_RETURN(wire::StatusReply checked, wire::DecodeStatusReply(bytes));
  return checked.outcome;
}

void TxService::Recover() {
  std::vector<std::pair<uint64_t, std::vector<std::string>>> due;  // txid, participants
  {
    const uint64_t now = Now();
    std::lock_guard lock(prepared_mu_);
    for (auto& [txid, p] : prepared_) {
      if (p.resolving || p.deadline_ns > now) continue;
      Result<wire::TwoPhaseRequest> req = wire::DecodeTwoPhaseRequest(p.body, true);
      if (!req.ok()) continue;
      p.resolving = true;
      due.emplace_back(
          txid, std::vector<std::string>(req->participants.begin(), req->participants.end()));
    }
  }
  const std::string self = node_->bootstrap_address();
  for (const auto& [txid, participants] : due) {
    // The first participant decides; only when it does not answer, a peer that learned the
    // outcome (or fences txid, never having voted) settles it.
    Result<uint8_t> outcome = AskStatus(participants[0], txid);
    bool from_peer = false;
    if (!outcome.ok() || *outcome == wire::kOutcomeUndecided) {
      for (size_t i = 1; i < participants.size(); ++i) {
        if (participants[i] == self) continue;
        Result<uint8_t> o = AskStatus(participants[i], txid);
        if (o.ok() && *o != wire::kOutcomeUndecided) {
          outcome = o;
          from_peer = true;
          break;
        }
      }
    }
    const bool decided = outcome.ok() && *outcome != wire::kOutcomeUndecided;
    const bool committed = decided && *outcome == wire::kDecideCommit;
    Prepared p;
    {
      std::lock_guard lock(prepared_mu_);
      auto it = prepared_.find(txid);
      if (it == prepared_.end()) continue;  // a TX_DECIDE arrived meanwhile and applied it
      if (!decided) {
        // 2PC blocks here: without the first participant's answer, and with no peer knowing the
        // outcome, it is unknown, so the locks stay; ask again after half a lease.
        it->second.resolving = false;
        it->second.deadline_ns = Now() + max_lease_ns_ / 2;
        counters_.recovery_unreachable.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      p = std::move(it->second);
      prepared_.erase(it);
      RecordOutcome(txid, committed);  // before prepared_mu_ is let go, as in Decide
    }
    Apply(txid, p, committed);
    (committed ? counters_.recovered_commits : counters_.recovered_aborts)
        .fetch_add(1, std::memory_order_relaxed);
    if (from_peer) counters_.recovered_from_peers.fetch_add(1, std::memory_order_relaxed);
  }
  std::lock_guard lock(decisions_mu_);
  const uint64_t now = Now();
  while (!decision_order_.empty() && decision_order_.front().first + decision_retention_ns_ < now) {
    decisions_.erase(decision_order_.front().second);
    decision_order_.pop_front();
  }
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
    Recover();
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
  j["prepares"] = get(counters_.prepares);
  j["decides"] = get(counters_.decides);
  j["statuses"] = get(counters_.statuses);
  j["recovered_commits"] = get(counters_.recovered_commits);
  j["recovered_aborts"] = get(counters_.recovered_aborts);
  j["recovery_unreachable"] = get(counters_.recovery_unreachable);
  j["recovered_from_peers"] = get(counters_.recovered_from_peers);
  {
    std::lock_guard lock(prepared_mu_);
    j["prepared"] = prepared_.size();
  }
  {
    std::lock_guard lock(decisions_mu_);
    j["decisions"] = decisions_.size();
  }
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
  w.counter("farmem_tx_prepares_total", "TX_PREPARE requests served.", get(counters_.prepares));
  w.counter("farmem_tx_decides_total", "TX_DECIDE requests served.", get(counters_.decides));
  w.family("farmem_tx_recoveries_total", MetricsWriter::Kind::kCounter,
           "Prepared transactions resolved by asking the participants, by outcome.");
  w.sample({{"outcome", "commit"}}, get(counters_.recovered_commits));
  w.sample({{"outcome", "abort"}}, get(counters_.recovered_aborts));
  w.sample({{"outcome", "unreachable"}}, get(counters_.recovery_unreachable));
  w.counter("farmem_tx_recoveries_from_peers_total",
            "Prepared transactions resolved by a participant other than the unreachable first.",
            get(counters_.recovered_from_peers));
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
