// TxClient / Tx / BlockingTx (include/farmem/tx.h): connection and table discovery, the
// one-two-sided read (one-sided copy of the cached or guessed slot, checked per transport, else
// TX_LOOKUP), locks during execution, validation (one-sided re-reads or TX_VALIDATE) and commit
// per participant. TxClient's counters are atomics shared by all threads; a Tx runs on the thread
// of its Scheduler.
#include "farmem/tx.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "farmem/cluster.h"
#include "node/rpc_call.h"
#include "tx/client/address_cache.h"
#include "tx/client/tx_lookup.h"
#include "tx/format/tx_data_structure.h"
#include "tx/format/tx_layout.h"
#include "tx/format/tx_wire.h"

namespace farmem {

namespace wire = tx_wire;

const char* TxAbortReasonName(TxAbortReason r) {
  switch (r) {
    case TxAbortReason::kNone:
      return "none";
    case TxAbortReason::kLocked:
      return "locked";
    case TxAbortReason::kValidation:
      return "validation";
    case TxAbortReason::kNotFound:
      return "not found";
    case TxAbortReason::kExists:
      return "exists";
    case TxAbortReason::kStaleCommit:
      return "stale commit";
    case TxAbortReason::kUser:
      return "user";
    case TxAbortReason::kOther:
      return "other";
  }
  return "?";
}

TxAbortReason TxAbortReasonOf(const Status& st) {
  if (st.code() == Code::kNotFound) return TxAbortReason::kNotFound;
  if (st.code() != Code::kAborted) return TxAbortReason::kNone;
  // The owner's message starts with the reason; RPC context is prefixed as "what: ".
  const std::string_view m = st.message();
  const auto has = [&](std::string_view r) {
    const size_t at = m.find(r);
    return at != std::string_view::npos && (at == 0 || (at >= 2 && m.substr(at - 2, 2) == ": "));
  };
  if (has("stale commit")) return TxAbortReason::kStaleCommit;
  if (has("not lock holder")) return TxAbortReason::kStaleCommit;
  if (has("validation")) return TxAbortReason::kValidation;
  if (has("exists")) return TxAbortReason::kExists;
  if (has("locked")) return TxAbortReason::kLocked;
  if (has("not found")) return TxAbortReason::kNotFound;
  return TxAbortReason::kOther;
}

namespace {

Status AbortedFor(TxAbortReason r, std::string_view detail) {
  return Status::Aborted(std::string(TxAbortReasonName(r)) + ": " + std::string(detail));
}

constexpr int kCopyRetries = 4;

}  // namespace

struct TxClient::Impl {
  struct Server {
    PeerId peer = kInvalidPeer;
    std::string address;
  };
  struct Table {
    std::string name;
    tx::TxGeometry geometry;  // partition field: 0 (per partition below)
    // Per partition: server index and region key.
    std::vector<uint32_t> server;
    std::vector<RegionKey> region_key;
  };
  // A user data structure (add_data_structure): id kFirstUserDs + its index.
  static constexpr uint16_t kFirstUserDs = 0x4000;
  struct UserDs {
    std::string name;
    std::shared_ptr<tx::TxDsClient> ds;
    PeerId peer = kInvalidPeer;
    RegionKey region_key = 0;
    uint16_t opcode_base = 0;
    uint32_t value_size = 0;
    bool two_phase = false;         // its owner serves kTxDsPrepare / kTxDsDecide
    std::string participant_entry;  // "ds@owner" (two_phase only)
  };
  Node* node = nullptr;
  TxClientOptions options;
  bool ordered = true;  // one-sided copies are word-ordered (native TCP)
  uint32_t max_rpc_bytes = 0;
  std::vector<Server> servers;
  std::vector<Table> tables;
  std::vector<UserDs> user_ds;
  uint64_t txid_base = 0;
  std::atomic<uint64_t> next_tx{1};

  // Address cache: (table, key) -> item offset, shared by every thread's transactions
  // (address_cache.h: sharded; an entry is a guess the reader checks).
  tx::AddressCache cache;

  struct Counters {
    std::atomic<uint64_t> hits{0}, chain_hits{0}, misses{0}, rpc_lookups{0}, os_validations{0},
        rpc_validations{0}, commits{0};
    std::atomic<uint64_t> aborts[kTxAbortReasons]{};
  } counters;

  std::optional<uint64_t> Cached(uint16_t table, std::span<const std::byte> key) const {
    return cache.find(table, key);
  }
  void Cache(uint16_t table, std::span<const std::byte> key, uint64_t offset) {
    if (options.address_cache) cache.put(table, key, offset);
  }
  void Uncache(uint16_t table, std::span<const std::byte> key) { cache.erase(table, key); }
  // The key of an item in a transaction's read/write set (Tx::State::items): table id, then the
  // key bytes.
  static std::string SetKey(uint16_t table, std::span<const std::byte> key) {
    std::string k(2 + key.size(), '\0');
    std::memcpy(k.data(), &table, 2);
    std::memcpy(k.data() + 2, key.data(), key.size());
    return k;
  }
  const UserDs* UserDsOf(uint16_t id) const {
    if (id < kFirstUserDs) return nullptr;
    const size_t i = size_t{id} - kFirstUserDs;
    return i < user_ds.size() ? &user_ds[i] : nullptr;
  }
  uint32_t PartitionOf(const Table& t, std::span<const std::byte> key) const {
    return tx::PlaceKey(t.geometry, tx::HashKey(key, t.geometry.hash_seed)).partition;
  }
  uint32_t BucketOf(const Table& t, std::span<const std::byte> key) const {
    return tx::PlaceKey(t.geometry, tx::HashKey(key, t.geometry.hash_seed)).bucket;
  }
};

TxClient::~TxClient() = default;

Result<std::unique_ptr<TxClient>> TxClient::Connect(Node& node,
                                                    const std::vector<std::string>& servers,
                                                    TxClientOptions options) {
  if (servers.empty()) return Status::InvalidArgument("TxClient: no servers");
  if (options.lease.count() <= 0) return Status::InvalidArgument("TxClient: lease must be > 0");
  std::unique_ptr<TxClient> c(new TxClient());
  c->impl_ = std::make_unique<Impl>();
  Impl& impl = *c->impl_;
  impl.node = &node;
  impl.options = options;
  impl.max_rpc_bytes = node.config().transport.max_rpc_bytes;
  switch (options.read_check) {
    case TxReadCheck::kOrdered:
      impl.ordered = true;
      break;
    case TxReadCheck::kSeqlock:
      impl.ordered = false;
      break;
    case TxReadCheck::kAuto:
      // Exactly the native TCP backend copies word-ordered ("fabric:tcp;ofi_rxm" does not).
      impl.ordered = node.transport().name() == "tcp";
      break;
  }
  std::random_device rd;
  impl.txid_base = (uint64_t{rd()} << 32) | (uint64_t{rd()} << 12);
  BlockingRunner runner(node, "TxClient");
  std::vector<std::byte> reply(impl.max_rpc_bytes);
  for (const std::string& address : servers) {
    const std::string ctx = "connecting to farmemd tx at " + address;
    Result<PeerInfo> peer = node.connect(address);
    if (!peer.ok()) return peer.status().WithContext(ctx);
    Result<std::span<const std::byte>> r = runner.run([&](Scheduler& s) {
      return CallRpc(s, peer->id, wire::kOpTableInfo, {}, reply, ctx + ": TX_TABLE_INFO");
    });
    if (!r.ok()) return r.status();
    FARMEM_ASSIGN_OR_RETURN(std::vector<wire::TableInfo> infos, wire::DecodeTableInfoReply(*r));
    const uint32_t server = static_cast<uint32_t>(impl.servers.size());
    impl.servers.push_back({peer->id, address});
    if (server == 0) {
      for (const wire::TableInfo& t : infos) {
        Impl::Table table;
        table.name = t.name;
        table.geometry = t.geometry;
        table.geometry.partition = 0;
        table.server.assign(t.geometry.num_partitions, UINT32_MAX);
        table.region_key.assign(t.geometry.num_partitions, 0);
        impl.tables.push_back(std::move(table));
      }
    }
    if (infos.size() != impl.tables.size()) {
      return Status::FailedPrecondition(ctx + ": serves " + std::to_string(infos.size()) +
                                        " tx tables, the first server " +
                                        std::to_string(impl.tables.size()));
    }
    for (size_t i = 0; i < infos.size(); ++i) {
      Impl::Table& table = impl.tables[i];
      tx::TxGeometry g = infos[i].geometry;
      const uint16_t part = g.partition;
      g.partition = 0;
      if (infos[i].name != table.name || std::memcmp(&g, &table.geometry, sizeof(g)) != 0) {
        return Status::FailedPrecondition(ctx + ": table " + infos[i].name +
                                          " differs from the first server's table " +
                                          std::to_string(i));
      }
      if (table.server[part] != UINT32_MAX) {
        return Status::FailedPrecondition(ctx + ": partition " + std::to_string(part) +
                                          " of table " + table.name + " served twice");
      }
      table.server[part] = server;
      table.region_key[part] = infos[i].region_key;
    }
  }
  for (const Impl::Table& t : impl.tables) {
    for (size_t p = 0; p < t.server.size(); ++p) {
      if (t.server[p] == UINT32_MAX) {
        return Status::FailedPrecondition("TxClient: no server holds partition " +
                                          std::to_string(p) + " of table " + t.name);
      }
    }
  }
  return c;
}

Result<std::unique_ptr<TxClient>> TxClient::Connect(Node& node, Cluster& cluster,
                                                    TxClientOptions options) {
  const std::string where = "cluster '" + cluster.options().cluster_name + "'";
  Result<std::vector<ClusterMember>> members = cluster.members();
  if (!members.ok()) return members.status().WithContext("TxClient: members of " + where);
  std::sort(members->begin(), members->end(),
            [](const ClusterMember& a, const ClusterMember& b) { return a.name < b.name; });
  std::vector<std::string> addresses;
  std::string tx_names, others;
  for (const ClusterMember& m : *members) {
    // A tx server: role tx and an address to reach it at (a client may hold the role too).
    const bool server = !m.address.empty() &&
                        std::find(m.roles.begin(), m.roles.end(), kTxMemberRole) != m.roles.end();
    std::string& list = server ? tx_names : others;
    list += (list.empty() ? "" : ", ") + m.name;
    if (server) addresses.push_back(m.address);
  }
  if (addresses.empty()) {
    return Status::NotFound("TxClient: no member of " + where + " serves tx (role '" +
                            std::string(kTxMemberRole) +
                            "'; members: " + (others.empty() ? "none" : others) + ")");
  }
  auto c = Connect(node, addresses, options);
  if (!c.ok()) return c.status().WithContext("TxClient: tx members of " + where + ": " + tx_names);
  return c;
}

Result<uint16_t> TxClient::add_data_structure(std::string name, std::shared_ptr<tx::TxDsClient> ds,
                                              const std::string& owner, std::string_view region) {
  Impl& impl = *impl_;
  const std::string what = "tx data structure '" + name + "'";
  if (name.empty()) return Status::InvalidArgument("tx data structure: empty name");
  if (ds == nullptr) return Status::InvalidArgument(what + ": no callbacks");
  if (table(name).ok()) return Status::InvalidArgument(what + ": the name is taken");
  const uint16_t base = ds->tx_opcode_base();
  if (base == 0) {
    return Status::InvalidArgument(what +
                                   ": tx_opcode_base() is 0, so it serves lookups only "
                                   "(tx/client/tx_lookup.h), not transactions");
  }
  // With two_phase() it serves kTxDsPrepare / kTxDsDecide too: base + 6 must be an opcode.
  const bool two_phase = ds->two_phase();
  const uint16_t opcodes = two_phase ? kTxDsTwoPhaseOpcodes : wire::kDsOpcodes;
  if (base > UINT16_MAX - (opcodes - 1)) {
    return Status::InvalidArgument(what + ": tx_opcode_base() " + std::to_string(base) +
                                   " leaves no room for its " + std::to_string(opcodes) +
                                   " opcodes");
  }
  // Its entry in a multi-participant commit's participant list ("ds@" + owner, NUL-terminated).
  const std::string entry = std::string(wire::kDsParticipantPrefix) + owner;
  if (two_phase && entry.size() >= wire::kParticipantBytes) {
    return Status::InvalidArgument(
        what + ": owner address " + owner + " is longer than " +
        std::to_string(wire::kParticipantBytes - 1 - wire::kDsParticipantPrefix.size()) +
        " bytes (a two-phase participant's list entry)");
  }
  const uint32_t value_size = ds->value_size();
  if (value_size == 0 || value_size > tx::kMaxValueSize) {
    return Status::InvalidArgument(what + ": value_size() " + std::to_string(value_size) +
                                   " is not in 1.." + std::to_string(tx::kMaxValueSize));
  }
  if (impl.user_ds.size() >= size_t{UINT16_MAX} + 1 - Impl::kFirstUserDs) {
    return Status::ResourceExhausted(what + ": too many data structures");
  }
  Result<PeerInfo> peer = impl.node->connect(owner);
  if (!peer.ok()) return peer.status().WithContext(what + ": connecting to its owner at " + owner);
  Impl::UserDs u;
  std::string exported;
  for (const RegionInfo& r : peer->regions) {
    if (r.name == region) {
      u.region_key = r.key;
      u.peer = peer->id;
    }
    exported += (exported.empty() ? "" : ", ") + r.name;
  }
  if (u.peer == kInvalidPeer) {
    return Status::NotFound(what + ": its owner at " + owner + " exports no region '" +
                            std::string(region) +
                            "' (it exports: " + (exported.empty() ? "none" : exported) + ")");
  }
  u.name = std::move(name);
  u.ds = std::move(ds);
  u.opcode_base = base;
  u.value_size = value_size;
  u.two_phase = two_phase;
  u.participant_entry = two_phase ? entry : std::string();
  impl.user_ds.push_back(std::move(u));
  return static_cast<uint16_t>(Impl::kFirstUserDs + impl.user_ds.size() - 1);
}

Result<uint16_t> TxClient::table(std::string_view name) const {
  for (size_t i = 0; i < impl_->tables.size(); ++i) {
    if (impl_->tables[i].name == name) return static_cast<uint16_t>(i);
  }
  for (size_t i = 0; i < impl_->user_ds.size(); ++i) {
    if (impl_->user_ds[i].name == name) return static_cast<uint16_t>(Impl::kFirstUserDs + i);
  }
  return Status::NotFound("tx table '" + std::string(name) + "' not served");
}
uint32_t TxClient::key_size(uint16_t table) const {
  return table < impl_->tables.size() ? impl_->tables[table].geometry.key_size : 0;
}
uint32_t TxClient::value_size(uint16_t table) const {
  if (const auto* u = impl_->UserDsOf(table)) return u->value_size;
  return table < impl_->tables.size() ? impl_->tables[table].geometry.value_size : 0;
}

TxClientStats TxClient::stats() const {
  const auto& c = impl_->counters;
  const auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  TxClientStats s;
  s.one_sided_hits = ld(c.hits);
  s.one_sided_chain_hits = ld(c.chain_hits);
  s.one_sided_misses = ld(c.misses);
  s.rpc_lookups = ld(c.rpc_lookups);
  s.one_sided_validations = ld(c.os_validations);
  s.rpc_validations = ld(c.rpc_validations);
  s.commits = ld(c.commits);
  for (size_t i = 0; i < kTxAbortReasons; ++i) s.aborts[i] = ld(c.aborts[i]);
  return s;
}

// ---- Tx ----------------------------------------------------------------------------------------

struct Tx::State {
  TxClient::Impl* c = nullptr;
  Scheduler* sched = nullptr;
  uint64_t txid = 0;
  bool active = false;
  TxAbortReason reason = TxAbortReason::kNone;

  enum Kind : uint8_t { kRead, kUpdate, kInsert, kRemove };
  struct Item {
    Kind kind = kRead;
    uint16_t table = 0;
    uint32_t partition = 0;
    std::vector<std::byte> key;
    std::vector<std::byte> value;
    uint64_t offset = 0;  // item offset (validation re-reads it)
    uint64_t version = 0;
  };
  // (table, key) -> item; node-based so value spans stay valid until start().
  std::map<std::string, Item> items;
  std::vector<std::byte> rpc_reply;
  std::vector<std::byte> copy_buf;  // one-sided copies of the read path

  const TxClient::Impl::Table* TableOf(uint16_t table) const {
    return table < c->tables.size() ? &c->tables[table] : nullptr;
  }
  // Where the locks, validations and commits of (table, partition) go, under which opcodes.
  struct Owner {
    PeerId peer = kInvalidPeer;
    uint16_t lock = 0, lock_insert = 0, validate = 0, commit = 0, unlock = 0;
    uint32_t value_size = 0;
    std::string what;  // RPC context
  };
  Owner OwnerOf(uint16_t table, uint32_t part) const {
    if (const auto* u = c->UserDsOf(table)) {
      const uint16_t b = u->opcode_base;
      return {u->peer,
              static_cast<uint16_t>(b + wire::kDsLock),
              static_cast<uint16_t>(b + wire::kDsLockInsert),
              static_cast<uint16_t>(b + wire::kDsValidate),
              static_cast<uint16_t>(b + wire::kDsCommit),
              static_cast<uint16_t>(b + wire::kDsUnlock),
              u->value_size,
              "data structure '" + u->name + "'"};
    }
    const auto& t = *TableOf(table);
    return {PeerOf(t, part), wire::kOpLock,   wire::kOpLockInsert,   wire::kOpValidate,
            wire::kOpCommit, wire::kOpUnlock, t.geometry.value_size, "table '" + t.name + "'"};
  }
  uint32_t PartitionOf(uint16_t table, std::span<const std::byte> key) const {
    return c->UserDsOf(table) != nullptr ? 0 : c->PartitionOf(*TableOf(table), key);
  }
  Status CheckKey(uint16_t table, std::span<const std::byte> key, const char* what) const {
    if (const auto* u = c->UserDsOf(table)) {
      if (key.size() < tx::kMinKeySize || key.size() > tx::kMaxKeySize || key.size() % 8 != 0) {
        return Status::InvalidArgument(std::string(what) + ": key of " +
                                       std::to_string(key.size()) + " bytes; data structure " +
                                       u->name + " takes multiples of 8 from 8 to 64");
      }
      if (!active) {
        return Status::FailedPrecondition(std::string(what) + ": no transaction; start()");
      }
      return Status::OK();
    }
    const auto* t = TableOf(table);
    if (t == nullptr) return Status::NotFound(std::string(what) + ": unknown tx table id");
    if (key.size() != t->geometry.key_size) {
      return Status::InvalidArgument(std::string(what) + ": key of " + std::to_string(key.size()) +
                                     " bytes, table " + t->name + " has " +
                                     std::to_string(t->geometry.key_size));
    }
    if (!active) return Status::FailedPrecondition(std::string(what) + ": no transaction; start()");
    return Status::OK();
  }
  PeerId PeerOf(const TxClient::Impl::Table& t, uint32_t part) const {
    return c->servers[t.server[part]].peer;
  }
  RemoteRef Ref(const TxClient::Impl::Table& t, uint32_t part, uint64_t offset) const {
    return RemoteRef{PeerOf(t, part), t.region_key[part], offset};
  }
  // Test fault TxClientFaults::die_at: true when the commit stops at `at`, as if the client died
  // there (nothing more is sent, the locks stay).
  bool Died(TxDieAt at, size_t writes) {
    if (c->options.faults.die_at != at || writes == 0) return false;
    active = false;
    reason = TxAbortReason::kOther;
    return true;
  }
};

Tx::Tx(TxClient& client, Scheduler& sched) : s_(std::make_unique<State>()) {
  s_->c = &client.impl();
  s_->sched = &sched;
  s_->rpc_reply.resize(s_->c->max_rpc_bytes);
}
Tx::~Tx() = default;

void Tx::start() {
  s_->items.clear();
  s_->txid = s_->c->txid_base + s_->c->next_tx.fetch_add(1, std::memory_order_relaxed);
  s_->active = true;
  s_->reason = TxAbortReason::kNone;
}
uint64_t Tx::id() const {
  return s_->txid;
}
TxAbortReason Tx::abort_reason() const {
  return s_->reason;
}

namespace {

// A participant of a multi-participant commit: a tx server (its writes to every table it
// holds) or a user data structure's owner (TxDsClient::two_phase()), and where its TX_PREPARE /
// TX_DECIDE go.
struct CommitParticipant {
  PeerId peer = kInvalidPeer;
  uint16_t prepare_op = wire::kOpPrepare, decide_op = wire::kOpDecide;
  std::string entry;  // its participant-list entry: "host:port", or "ds@host:port"
  std::vector<wire::TwoPhaseEntry> items;
  std::string what;  // RPC context
};

// The decision for the prepared participants parts[1..upto) of a multi-participant commit.
// Errors are fine: a prepared participant that misses its decision asks participant 0.
Task<void> DecideOthers(Scheduler& sched, const std::vector<CommitParticipant>& parts, size_t upto,
                        uint64_t txid, uint8_t decision, std::vector<std::byte>& reply) {
  const auto req = wire::EncodeTwoPhaseRequest(txid, 0, decision, 0, {}, {});
  for (size_t i = 1; i < upto; ++i) {
    (void)co_await CallRpc(sched, parts[i].peer, parts[i].decide_op, req, reply,
                           "TX_DECIDE to " + parts[i].what);
  }
}

// The hash table as a Storm data structure (tx_data_structure.h), client side, for one read of
// one table: lookup_start guesses the cached item or the key's main bucket; lookup_end checks an
// item copy (CheckItemCopy), or locates the key in a bucket copy (ParseBucketCopy) and follows
// the overflow chain bucket by bucket ("continue at"); the RPC is TX_LOOKUP. The address cache
// is the client's (shared, sharded: address_cache.h).
class TxHashTableDs final : public tx::TxDsClient {
 public:
  TxHashTableDs(TxClient::Impl& c, uint16_t table, const tx::TxGeometry& g)
      : c_(c), table_(table), g_(g) {}

  tx::DsStep lookup_start(std::span<const std::byte> key) override {
    if (std::optional<uint64_t> off = c_.Cached(table_, key); off && tx::IsItemOffset(g_, *off)) {
      from_cache_ = true;
      return ReadItemAt(*off);
    }
    const uint32_t bucket = tx::PlaceKey(g_, tx::HashKey(key, g_.hash_seed)).bucket;
    return ReadBucket(bucket);
  }

  tx::DsStep lookup_end(std::span<const std::byte> copy, const tx::DsRead& read,
                        const tx::SeqlockRecheck* recheck,
                        std::span<const std::byte> key) override {
    tx::DsStep next;  // kRpc
    if (read.length == tx::ItemBytes(g_)) {
      switch (tx::CheckItemCopy(g_, copy, key, recheck, &next.view)) {
        case tx::ItemCheck::kOk:
          next.kind = tx::DsStep::kFound;
          next.address = read.offset;
          c_.Cache(table_, key, read.offset);
          return next;
        case tx::ItemCheck::kBusy:
        case tx::ItemCheck::kTorn:
          next.kind = tx::DsStep::kRetry;
          return next;
        default:
          // A cached address now holding nothing or another key (deleted, reused): forget it.
          if (from_cache_) c_.Uncache(table_, key);
          return next;
      }
    }
    const tx::BucketMatch m = tx::ParseBucketCopy(g_, copy, key);
    const uint64_t bucket = (read.offset - tx::BucketOffset(g_, 0)) / tx::BucketBytes(g_);
    if (m.kind == tx::BucketMatch::kFound) {
      const uint64_t off = tx::ItemOffset(g_, bucket, static_cast<uint32_t>(m.slot));
      if (!c_.ordered) return ReadItemAt(off);  // unordered: the bucket only locates the slot
      next.kind = tx::DsStep::kFound;           // ordered: a bucket copy is as good as an item's
      next.address = off;
      next.view = m.view;
      c_.Cache(table_, key, off);
      return next;
    }
    if (m.kind == tx::BucketMatch::kInconsistent) {
      next.kind = tx::DsStep::kRetry;
      return next;
    }
    // kMiss: continue at the chain's next bucket (an overflow bucket; the link is a hint read
    // without a check, so it is range-checked and the driver bounds the hops). Never "absent":
    // the owner decides that.
    if (m.next_bucket != 0 && !c_.options.faults.no_chain_follow) {
      const uint64_t nb = m.next_bucket - 1;
      if (nb >= g_.num_buckets && nb < tx::TotalBuckets(g_)) {
        followed_chain_ = true;
        return ReadBucket(nb);
      }
    }
    return next;
  }

  // Whether this read went past the key's main bucket.
  bool followed_chain() const { return followed_chain_; }

  uint16_t rpc_opcode() const override { return wire::kOpLookup; }
  std::vector<std::byte> rpc_request(std::span<const std::byte> key) override {
    return wire::EncodeKeyRequest(table_, key, 0, 0);
  }
  Result<tx::DsStep> rpc_lookup_end(std::span<const std::byte> reply,
                                    std::span<const std::byte> key) override {
    FARMEM_ASSIGN_OR_RETURN(wire::ItemResult ir, wire::DecodeItemReply(reply, g_.value_size));
    tx::DsStep found;
    found.kind = tx::DsStep::kFound;
    found.address = ir.item.offset;
    found.view.version = ir.item.version;
    found.view.lock_txid = ir.item.lock_txid;
    found.view.value = ir.value;
    if (tx::IsItemOffset(g_, found.address)) c_.Cache(table_, key, found.address);
    return found;
  }

 private:
  tx::DsStep ReadItemAt(uint64_t offset) const {
    tx::DsStep s;
    s.kind = tx::DsStep::kRead;
    s.read = {offset, static_cast<uint32_t>(tx::ItemBytes(g_)), !c_.ordered};
    return s;
  }
  tx::DsStep ReadBucket(uint64_t bucket) const {
    tx::DsStep s;
    s.kind = tx::DsStep::kRead;
    s.read = {tx::BucketOffset(g_, bucket), static_cast<uint32_t>(tx::BucketBytes(g_)), false};
    return s;
  }

  TxClient::Impl& c_;
  const uint16_t table_;
  const tx::TxGeometry& g_;
  bool from_cache_ = false;
  bool followed_chain_ = false;
};

// One consistent copy of an item at `offset` (ordered: one read; else seqlock). kOk fills *view
// pointing into *buf.
Task<Result<tx::ItemCheck>> ReadItem(Scheduler& sched, bool ordered, const tx::TxGeometry& g,
                                     RemoteRef ref, std::span<const std::byte> key,
                                     std::vector<std::byte>* buf, tx::ItemView* view) {
  buf->resize(tx::ItemBytes(g));
  if (ordered) {
    Status st = co_await sched.read(ref, buf->data(), buf->size());
    if (!st.ok()) co_return st;
    co_return tx::CheckItemCopy(g, *buf, key, nullptr, view);
  }
  // The item's first word is its seqlock version: read before and after the copy, in order (in
  // one system call on shm, Scheduler::read_ordered).
  uint64_t before = 0, after = 0;
  const ReadSegment segments[] = {
      {ref.offset, &before, 8}, {ref.offset, buf->data(), buf->size()}, {ref.offset, &after, 8}};
  Status st = co_await sched.read_ordered(ref.peer, ref.key, segments);
  if (!st.ok()) co_return st;
  const tx::SeqlockRecheck recheck{before, after};
  co_return tx::CheckItemCopy(g, *buf, key, &recheck, view);
}

// Validation of one read-set item of a user data structure: a one-sided copy of it where
// validate_start gives one (re-read while lookup_end says kRetry, up to kCopyRetries), else, or
// when the copy does not show the item at its address, the owner's kDsValidate. True when the
// item still has the version read and no other transaction holds its lock.
Task<Result<bool>> ValidateUserRead(Scheduler& sched, TxClient::Impl& c,
                                    const TxClient::Impl::UserDs& u, uint16_t table,
                                    uint64_t address, uint64_t version,
                                    std::span<const std::byte> key, uint64_t txid,
                                    std::vector<std::byte>* buf, std::vector<std::byte>* reply) {
  if (c.options.one_sided_reads) {
    const tx::DsStep start = u.ds->validate_start(address, key);
    const tx::DsRead read = start.read;
    const bool readable = start.kind == tx::DsStep::kRead && read.length >= 8 &&
                          read.length <= tx::kMaxDsRead && read.length % 8 == 0;
    for (int attempt = 0; readable && attempt < kCopyRetries; ++attempt) {
      tx::SeqlockRecheck recheck{};
      Status st =
          co_await tx::CopyDsRead(sched, RemoteRef{u.peer, u.region_key, 0}, read, buf, &recheck);
      if (!st.ok()) co_return st;
      const tx::DsStep got = u.ds->lookup_end(*buf, read, read.seqlock ? &recheck : nullptr, key);
      if (got.kind == tx::DsStep::kRetry) continue;
      if (got.kind != tx::DsStep::kFound || got.address != address) break;  // the owner decides
      c.counters.os_validations.fetch_add(1, std::memory_order_relaxed);
      co_return tx::ValidatesAgainst(got.view, version, txid);
    }
  }
  c.counters.rpc_validations.fetch_add(1, std::memory_order_relaxed);
  const std::vector<wire::ValidateItem> items{{version, key}};
  const auto req = wire::EncodeValidateRequest(table, txid, items);
  Result<std::span<const std::byte>> r =
      co_await CallRpc(sched, u.peer, static_cast<uint16_t>(u.opcode_base + wire::kDsValidate), req,
                       *reply, "TX_VALIDATE of data structure '" + u.name + "'");
  if (r.ok()) co_return true;
  if (r.status().code() == Code::kAborted) co_return false;
  co_return r.status();
}

}  // namespace

Task<Result<std::span<const std::byte>>> Tx::read(uint16_t table, std::span<const std::byte> key) {
  State& s = *s_;
  FARMEM_CO_RETURN_IF_ERROR(s.CheckKey(table, key, "tx read"));
  const std::string ck = TxClient::Impl::SetKey(table, key);
  if (auto it = s.items.find(ck); it != s.items.end()) {
    if (it->second.kind == State::kRemove)
      co_return Status::NotFound("tx read: removed by this tx");
    co_return std::span<const std::byte>(it->second.value);
  }
  TxClient::Impl& c = *s.c;
  State::Item item;
  item.kind = State::kRead;
  item.table = table;
  item.partition = s.PartitionOf(table, key);
  item.key.assign(key.begin(), key.end());
  tx::DsLookupOptions lo;
  lo.one_sided = c.options.one_sided_reads;
  // A copy of the main bucket, then one per overflow bucket of the chain, each retried a few
  // times when busy or torn (an unordered item read is one more).
  lo.max_reads = 2 * kCopyRetries + 16;
  lo.max_retries = kCopyRetries;
  // One-two-sided, through the data structure's callbacks (tx_lookup.h): the user's, or the hash
  // table's.
  Result<tx::DsLookup> got = Status::Internal("tx read: no lookup");
  bool chain = false;
  const TxClient::Impl::UserDs* user = c.UserDsOf(table);
  if (user != nullptr) {
    got = co_await tx::OneTwoSidedLookup(*s.sched, *user->ds,
                                         RemoteRef{user->peer, user->region_key, 0}, key, lo,
                                         &s.copy_buf, &s.rpc_reply);
    if (got.ok() && got->found.view.value.size() != user->value_size) {
      got = Status::Protocol("tx read: data structure " + user->name + " gave a value of " +
                             std::to_string(got->found.view.value.size()) + " bytes, not " +
                             std::to_string(user->value_size));
    }
  } else {
    const auto& t = *s.TableOf(table);
    TxHashTableDs ds(c, table, t.geometry);
    got = co_await tx::OneTwoSidedLookup(*s.sched, ds, s.Ref(t, item.partition, 0), key, lo,
                                         &s.copy_buf, &s.rpc_reply);
    chain = ds.followed_chain();
  }
  // A failed lookup came from the RPC when the owner said "not found" (a transport error of a
  // one-sided copy ends the read before it).
  const bool rpc = got.ok() ? got->tried_rpc : got.status().code() == Code::kNotFound;
  if (lo.one_sided) {
    const bool hit = got.ok() && got->one_sided;
    (hit ? c.counters.hits : c.counters.misses).fetch_add(1, std::memory_order_relaxed);
    if (hit && chain) c.counters.chain_hits.fetch_add(1, std::memory_order_relaxed);
  }
  if (rpc) c.counters.rpc_lookups.fetch_add(1, std::memory_order_relaxed);
  if (!got.ok()) {
    if (got.status().code() == Code::kNotFound) s.reason = TxAbortReason::kNotFound;
    co_return got.status();
  }
  item.value.assign(got->found.view.value.begin(), got->found.view.value.end());
  item.version = got->found.view.version;
  item.offset = got->found.address;
  const uint64_t lock_txid = got->found.view.lock_txid;
  if (lock_txid != 0 && lock_txid != s.txid) {
    Status st = AbortedFor(TxAbortReason::kLocked,
                           "tx read: held by transaction " + std::to_string(lock_txid));
    s.reason = TxAbortReason::kLocked;
    (void)co_await abort();
    co_return st;
  }
  auto [it, inserted] = s.items.emplace(ck, std::move(item));
  (void)inserted;
  co_return std::span<const std::byte>(it->second.value);
}

Task<Result<std::span<std::byte>>> Tx::write(uint16_t table, std::span<const std::byte> key) {
  State& s = *s_;
  FARMEM_CO_RETURN_IF_ERROR(s.CheckKey(table, key, "tx write"));
  const std::string ck = TxClient::Impl::SetKey(table, key);
  auto it = s.items.find(ck);
  if (it != s.items.end() && it->second.kind != State::kRead) {
    if (it->second.kind == State::kRemove)
      co_return Status::NotFound("tx write: removed by this tx");
    co_return std::span<std::byte>(it->second.value);
  }
  TxClient::Impl& c = *s.c;
  const uint32_t part = s.PartitionOf(table, key);
  const State::Owner owner = s.OwnerOf(table, part);
  const auto req = wire::EncodeKeyRequest(
      table, key, s.txid, static_cast<uint64_t>(std::chrono::nanoseconds(c.options.lease).count()));
  Result<std::span<const std::byte>> r = co_await CallRpc(*s.sched, owner.peer, owner.lock, req,
                                                          s.rpc_reply, "TX_LOCK of " + owner.what);
  if (!r.ok()) {
    Status st = r.status();
    const TxAbortReason reason = TxAbortReasonOf(st);
    if (st.code() == Code::kAborted) {
      s.reason = reason;
      (void)co_await abort();
    } else if (reason == TxAbortReason::kNotFound) {
      s.reason = reason;
    }
    co_return st;
  }
  Result<wire::ItemResult> ir = wire::DecodeItemReply(*r, owner.value_size);
  if (!ir.ok()) co_return ir.status();
  if (const auto* t = s.TableOf(table);
      t != nullptr && tx::IsItemOffset(t->geometry, ir->item.offset)) {
    c.Cache(table, key, ir->item.offset);
  }
  if (it != s.items.end() && it->second.version != ir->item.version) {
    // Read earlier at another version: the read is already invalid.
    s.reason = TxAbortReason::kValidation;
    (void)co_await abort();
    co_return AbortedFor(TxAbortReason::kValidation, "tx write: changed since this tx read it");
  }
  State::Item& item = s.items[ck];
  item.kind = State::kUpdate;
  item.table = table;
  item.partition = part;
  item.key.assign(key.begin(), key.end());
  item.value.assign(ir->value.begin(), ir->value.end());
  item.offset = ir->item.offset;
  item.version = ir->item.version;
  co_return std::span<std::byte>(item.value);
}

Task<Status> Tx::insert(uint16_t table, std::span<const std::byte> key,
                        std::span<const std::byte> value) {
  State& s = *s_;
  FARMEM_CO_RETURN_IF_ERROR(s.CheckKey(table, key, "tx insert"));
  TxClient::Impl& c = *s.c;
  const uint32_t part = s.PartitionOf(table, key);
  const State::Owner owner = s.OwnerOf(table, part);
  if (value.size() > owner.value_size) {
    co_return Status::InvalidArgument("tx insert: value of " + std::to_string(value.size()) +
                                      " bytes, " + owner.what + " holds " +
                                      std::to_string(owner.value_size));
  }
  const std::string ck = TxClient::Impl::SetKey(table, key);
  if (s.items.count(ck) != 0) {
    co_return Status::InvalidArgument("tx insert: key already used by this transaction");
  }
  const auto req = wire::EncodeKeyRequest(
      table, key, s.txid, static_cast<uint64_t>(std::chrono::nanoseconds(c.options.lease).count()));
  Result<std::span<const std::byte>> r = co_await CallRpc(
      *s.sched, owner.peer, owner.lock_insert, req, s.rpc_reply, "TX_LOCK_INSERT of " + owner.what);
  if (!r.ok()) {
    Status st = r.status();
    if (st.code() == Code::kAborted) {
      s.reason = TxAbortReasonOf(st);
      (void)co_await abort();
    }
    co_return st;
  }
  if (r->size() != sizeof(wire::ItemReply)) {
    co_return Status::Protocol("TX_LOCK_INSERT: reply of " + std::to_string(r->size()) + " bytes");
  }
  wire::ItemReply ir;
  std::memcpy(&ir, r->data(), sizeof(ir));
  State::Item& item = s.items[ck];
  item.kind = State::kInsert;
  item.table = table;
  item.partition = part;
  item.key.assign(key.begin(), key.end());
  item.value.assign(owner.value_size, std::byte{0});
  std::memcpy(item.value.data(), value.data(), value.size());
  item.offset = ir.offset;
  co_return Status::OK();
}

Task<Status> Tx::remove(uint16_t table, std::span<const std::byte> key) {
  Result<std::span<std::byte>> w = co_await write(table, key);
  if (!w.ok()) co_return w.status();
  s_->items[TxClient::Impl::SetKey(table, key)].kind = State::kRemove;
  co_return Status::OK();
}

Task<Status> Tx::abort() {
  State& s = *s_;
  if (!s.active) co_return Status::OK();
  s.active = false;
  if (s.reason == TxAbortReason::kNone) s.reason = TxAbortReason::kUser;
  TxClient::Impl& c = *s.c;
  // One TX_UNLOCK per (table, partition) holding locks.
  std::map<std::pair<uint16_t, uint32_t>, std::vector<wire::BatchEntry>> groups;
  for (auto& [ck, item] : s.items) {
    if (item.kind == State::kRead) continue;
    groups[{item.table, item.partition}].push_back({wire::kUnlockOnly, item.key, {}});
  }
  Status first = Status::OK();
  for (auto& [tp, entries] : groups) {
    const State::Owner owner = s.OwnerOf(tp.first, tp.second);
    for (size_t at = 0; at < entries.size(); at += wire::kMaxBatchItems) {
      const size_t n = std::min(wire::kMaxBatchItems, entries.size() - at);
      const auto req =
          wire::EncodeBatchRequest(tp.first, s.txid, std::span(entries).subspan(at, n));
      Result<std::span<const std::byte>> r = co_await CallRpc(
          *s.sched, owner.peer, owner.unlock, req, s.rpc_reply, "TX_UNLOCK of " + owner.what);
      // A lock already gone (lease ran out, reaped) is fine for an abort.
      if (!r.ok() && r.status().code() != Code::kAborted && first.ok()) first = r.status();
    }
  }
  c.counters.aborts[static_cast<size_t>(s.reason)].fetch_add(1, std::memory_order_relaxed);
  co_return first;
}

Task<Status> Tx::commit() {
  State& s = *s_;
  if (!s.active) co_return Status::FailedPrecondition("tx commit: no transaction; start()");
  TxClient::Impl& c = *s.c;
  size_t reads = 0, writes = 0;
  for (auto& [ck, item] : s.items) (item.kind == State::kRead ? reads : writes)++;
  // Writes to a user data structure alone commit by one RPC to its owner. Beside other writes
  // its owner must be a prepared participant (two_phase()); one that is not is refused.
  std::set<std::pair<uint16_t, uint32_t>> write_groups;
  bool ds_writes = false;
  const TxClient::Impl::UserDs* one_phase_ds = nullptr;
  for (auto& [ck, item] : s.items) {
    if (item.kind == State::kRead) continue;
    write_groups.insert({item.table, item.partition});
    if (const auto* u = c.UserDsOf(item.table)) {
      ds_writes = true;
      if (!u->two_phase) one_phase_ds = u;
    }
  }
  if (one_phase_ds != nullptr && write_groups.size() > 1) {
    s.reason = TxAbortReason::kOther;
    Status st = Status::FailedPrecondition(
        "tx commit: writes to data structure '" + one_phase_ds->name +
        "' and to another table or data structure: that needs a two-phase commit, and its owner "
        "takes no part in one (TxDsClient::two_phase() is false; docs/tx.md \"User data "
        "structures\")");
    (void)co_await abort();
    co_return st;
  }
  // Validation of the read set (writes hold their locks already). A read-only transaction of one
  // item needs none: its one consistent copy is its snapshot.
  const bool validate = !c.options.faults.skip_validation && !(writes == 0 && reads <= 1);
  if (validate && reads > 0) {
    if (c.ordered) {
      std::vector<std::byte> buf;
      for (auto& [ck, item] : s.items) {
        if (item.kind != State::kRead || c.UserDsOf(item.table) != nullptr) continue;
        const auto& t = *s.TableOf(item.table);
        bool ok = false, decided = false;
        for (int attempt = 0; attempt < kCopyRetries && !decided; ++attempt) {
          tx::ItemView view;
          Result<tx::ItemCheck> r =
              co_await ReadItem(*s.sched, true, t.geometry, s.Ref(t, item.partition, item.offset),
                                item.key, &buf, &view);
          if (!r.ok()) {
            s.reason = TxAbortReason::kOther;
            (void)co_await abort();
            co_return r.status();
          }
          if (*r == tx::ItemCheck::kBusy || *r == tx::ItemCheck::kTorn) continue;
          decided = true;
          ok = *r == tx::ItemCheck::kOk && tx::ValidatesAgainst(view, item.version, s.txid);
        }
        c.counters.os_validations.fetch_add(1, std::memory_order_relaxed);
        if (!ok) {
          s.reason = TxAbortReason::kValidation;
          Status st = AbortedFor(s.reason, "read set changed");
          (void)co_await abort();
          co_return st;
        }
      }
    } else {
      std::map<std::pair<uint16_t, uint32_t>, std::vector<wire::ValidateItem>> groups;
      for (auto& [ck, item] : s.items) {
        if (item.kind == State::kRead && c.UserDsOf(item.table) == nullptr) {
          groups[{item.table, item.partition}].push_back({item.version, item.key});
        }
      }
      for (auto& [tp, entries] : groups) {
        const auto& t = *s.TableOf(tp.first);
        for (size_t at = 0; at < entries.size(); at += wire::kMaxBatchItems) {
          const size_t n = std::min(wire::kMaxBatchItems, entries.size() - at);
          const auto req =
              wire::EncodeValidateRequest(tp.first, s.txid, std::span(entries).subspan(at, n));
          c.counters.rpc_validations.fetch_add(1, std::memory_order_relaxed);
          Result<std::span<const std::byte>> r = co_await CallRpc(
              *s.sched, s.PeerOf(t, tp.second), wire::kOpValidate, req, s.rpc_reply, "TX_VALIDATE");
          if (!r.ok()) {
            if (r.status().code() == Code::kAborted) {
              {
                s.reason = TxAbortReason::kValidation;
                Status st = AbortedFor(s.reason, std::string(r.status().message()));
                (void)co_await abort();
                co_return st;
              }
            }
            s.reason = TxAbortReason::kOther;
            (void)co_await abort();
            co_return r.status();
          }
        }
      }
    }
    // The user data structures' reads.
    for (auto& [ck, item] : s.items) {
      if (item.kind != State::kRead) continue;
      const auto* u = c.UserDsOf(item.table);
      if (u == nullptr) continue;
      Result<bool> valid =
          co_await ValidateUserRead(*s.sched, c, *u, item.table, item.offset, item.version,
                                    item.key, s.txid, &s.copy_buf, &s.rpc_reply);
      if (!valid.ok()) {
        s.reason = TxAbortReason::kOther;
        (void)co_await abort();
        co_return valid.status();
      }
      if (!*valid) {
        s.reason = TxAbortReason::kValidation;
        Status st = AbortedFor(s.reason, "read set changed (data structure " + u->name + ")");
        (void)co_await abort();
        co_return st;
      }
    }
  }
  const TxClientFaults& faults = c.options.faults;
  if (s.Died(TxDieAt::kHoldingLocks, writes)) {
    co_return Status::Internal("tx commit: test fault: client stopped holding its locks");
  }
  if (ds_writes && write_groups.size() == 1) {
    // The single-participant commit at the data structure's owner: installs every write and
    // releases the locks at once, or refuses (a lock whose lease ran out: kAborted).
    const auto [table, part] = *write_groups.begin();
    const State::Owner owner = s.OwnerOf(table, part);
    std::vector<wire::BatchEntry> entries;
    for (auto& [ck, item] : s.items) {
      if (item.kind == State::kRead) continue;
      const wire::BatchOp op = item.kind == State::kRemove ? wire::kRemove : wire::kWrite;
      entries.push_back(
          {op, item.key, op == wire::kRemove ? std::span<const std::byte>() : item.value});
    }
    if (entries.size() > wire::kMaxBatchItems) {
      s.reason = TxAbortReason::kOther;
      Status st = AbortedFor(s.reason, "more than 64 writes on one participant");
      (void)co_await abort();
      co_return st;
    }
    const auto req = wire::EncodeBatchRequest(table, s.txid, entries);
    Result<std::span<const std::byte>> r = co_await CallRpc(
        *s.sched, owner.peer, owner.commit, req, s.rpc_reply, "TX_COMMIT of " + owner.what);
    if (!r.ok()) {
      s.reason =
          r.status().code() == Code::kAborted ? TxAbortReasonOf(r.status()) : TxAbortReason::kOther;
      (void)co_await abort();
      co_return r.status();
    }
    s.active = false;
    c.counters.commits.fetch_add(1, std::memory_order_relaxed);
    co_return Status::OK();
  }
  // Writes by participant (the servers in ascending index, each with its writes to every table,
  // then the data structures' owners by id) and by (table, partition).
  std::map<uint32_t, size_t> part_of_server;
  std::map<uint16_t, size_t> part_of_ds;
  for (auto& [ck, item] : s.items) {
    if (item.kind == State::kRead) continue;
    if (c.UserDsOf(item.table) != nullptr) {
      part_of_ds[item.table];
    } else {
      part_of_server[s.TableOf(item.table)->server[item.partition]];
    }
  }
  // Only data structures write (two or more): server 0 keeps the decision, with no writes of
  // its own — the first participant is always a tx server, which answers TX_STATUS.
  if (part_of_server.empty() && part_of_ds.size() > 1) part_of_server[0];
  std::vector<CommitParticipant> parts;
  for (auto& [server, index] : part_of_server) {
    index = parts.size();
    CommitParticipant p;
    p.peer = c.servers[server].peer;
    p.entry = c.servers[server].address;
    p.what = "tx server " + p.entry;
    parts.push_back(std::move(p));
  }
  for (auto& [id, index] : part_of_ds) {
    index = parts.size();
    const auto& u = *c.UserDsOf(id);
    CommitParticipant p;
    p.peer = u.peer;
    p.prepare_op = static_cast<uint16_t>(u.opcode_base + kTxDsPrepare);
    p.decide_op = static_cast<uint16_t>(u.opcode_base + kTxDsDecide);
    p.entry = u.participant_entry;
    p.what = "data structure '" + u.name + "'";
    parts.push_back(std::move(p));
  }
  std::map<std::pair<uint16_t, uint32_t>, std::vector<wire::BatchEntry>> commit_groups;
  for (auto& [ck, item] : s.items) {
    if (item.kind == State::kRead) continue;
    const wire::BatchOp op = item.kind == State::kRemove ? wire::kRemove : wire::kWrite;
    const auto value = op == wire::kRemove ? std::span<const std::byte>() : item.value;
    if (c.UserDsOf(item.table) != nullptr) {
      parts[part_of_ds.at(item.table)].items.push_back({op, item.table, item.key, value});
      continue;
    }
    parts[part_of_server.at(s.TableOf(item.table)->server[item.partition])].items.push_back(
        {op, item.table, item.key, value});
    commit_groups[{item.table, item.partition}].push_back({op, item.key, value});
  }
  for (const auto& p : parts) {
    if (p.items.size() > wire::kMaxBatchItems || parts.size() > wire::kMaxParticipants) {
      s.reason = TxAbortReason::kOther;
      Status st =
          AbortedFor(s.reason, "more than 64 writes on one participant, or over 16 participants");
      (void)co_await abort();
      co_return st;
    }
  }
  if (part_of_ds.empty() && (commit_groups.size() <= 1 || faults.one_phase_commit)) {
    // Read-only: nothing to send. One (table, partition): the single-participant fast path, one
    // TX_COMMIT, atomic at its owner (CommitAll). Several only under the test fault
    // one_phase_commit: one TX_COMMIT each, in turn.
    size_t committed = 0;
    for (auto& [tp, entries] : commit_groups) {
      const auto& t = *s.TableOf(tp.first);
      if (committed == 1 && s.Died(TxDieAt::kAfterFirstDecide, writes)) {
        co_return Status::Internal("tx commit: test fault: client stopped after one TX_COMMIT");
      }
      const auto req = wire::EncodeBatchRequest(tp.first, s.txid, entries);
      Result<std::span<const std::byte>> r = co_await CallRpc(
          *s.sched, s.PeerOf(t, tp.second), wire::kOpCommit, req, s.rpc_reply, "TX_COMMIT");
      if (!r.ok()) {
        if (committed > 0) {
          s.active = false;
          s.reason = TxAbortReason::kOther;
          co_return Status::Internal("tx commit: partial commit (test fault one_phase_commit)");
        }
        s.reason = r.status().code() == Code::kAborted ? TxAbortReasonOf(r.status())
                                                       : TxAbortReason::kOther;
        (void)co_await abort();
        co_return r.status();
      }
      ++committed;
    }
  } else {
    // Several tables on one server, several servers, or data structures beside them: prepare ->
    // decide (docs/tx.md "Multi-participant commit"). Participant 0 (the lowest server index
    // with writes, or server 0 as the keeper) keeps the decision: its own writes travel in its
    // TX_DECIDE, installed together with the recorded decision — the commit point. The others
    // are prepared first and learn the outcome from a TX_DECIDE, or by asking participant 0
    // when this client falls silent.
    std::vector<std::string> addresses;
    for (const auto& p : parts) addresses.push_back(p.entry);
    const auto lease_ns = static_cast<uint64_t>(std::chrono::nanoseconds(c.options.lease).count());
    size_t asked = 1;
    Status failed = Status::OK();
    for (size_t i = 1; i < parts.size() && failed.ok(); ++i, ++asked) {
      const auto prep_req =
          wire::EncodeTwoPhaseRequest(s.txid, lease_ns, 0, 0, addresses, parts[i].items);
      Result<std::span<const std::byte>> prep_r =
          co_await CallRpc(*s.sched, parts[i].peer, parts[i].prepare_op, prep_req, s.rpc_reply,
                           "TX_PREPARE to " + parts[i].what);
      if (!prep_r.ok()) failed = prep_r.status();
    }
    if (!failed.ok()) {
      // Nothing is decided (participant 0 holds no record, so a prepared participant asking it
      // is told "abort"): release everything. The refusing participant may have prepared (a
      // transport error hides that): it gets the abort decision too.
      co_await DecideOthers(*s.sched, parts, asked, s.txid, wire::kDecideAbort, s.rpc_reply);
      s.reason = failed.code() == Code::kAborted ? TxAbortReasonOf(failed) : TxAbortReason::kOther;
      (void)co_await abort();
      co_return failed;
    }
    if (s.Died(TxDieAt::kAfterPrepare, writes)) {
      co_return Status::Internal("tx commit: test fault: client stopped after the prepares");
    }
    const std::vector<std::string> no_list;
    const auto first_req =
        wire::EncodeTwoPhaseRequest(s.txid, 0, wire::kDecideCommit,
                                    static_cast<uint16_t>(parts.size()), no_list, parts[0].items);
    Result<std::span<const std::byte>> first_r =
        co_await CallRpc(*s.sched, parts[0].peer, wire::kOpDecide, first_req, s.rpc_reply,
                         "TX_DECIDE to " + parts[0].what);
    if (!first_r.ok() && first_r.status().code() == Code::kAborted) {
      // Refused (a lease ran out, or a participant's question fenced the transaction): the
      // decision recorded is "abort"; tell the prepared ones.
      co_await DecideOthers(*s.sched, parts, parts.size(), s.txid, wire::kDecideAbort, s.rpc_reply);
      s.reason = TxAbortReasonOf(first_r.status());
      (void)co_await abort();
      co_return first_r.status();
    }
    if (!first_r.ok()) {
      // No answer: participant 0 may or may not have committed. The participants settle it
      // among themselves (the prepared ones ask participant 0 after their lease).
      s.active = false;
      s.reason = TxAbortReason::kOther;
      c.counters.aborts[static_cast<size_t>(s.reason)].fetch_add(1, std::memory_order_relaxed);
      co_return Status::Unavailable("tx commit: outcome unknown (the participants resolve it): " +
                                    first_r.status().ToString());
    }
    if (s.Died(TxDieAt::kAfterFirstDecide, writes)) {
      co_return Status::Internal("tx commit: test fault: client stopped after the first decide");
    }
    co_await DecideOthers(*s.sched, parts, parts.size(), s.txid, wire::kDecideCommit, s.rpc_reply);
  }
  for (auto& [tp, entries] : commit_groups) {
    for (auto& e : entries) {
      if (e.op == wire::kRemove) c.Uncache(tp.first, e.key);
    }
  }
  // Inserted items: their reservation offset is the item's address.
  for (auto& [ck, item] : s.items) {
    if (item.kind == State::kInsert && c.UserDsOf(item.table) == nullptr &&
        tx::IsItemOffset(s.TableOf(item.table)->geometry, item.offset)) {
      c.Cache(item.table, item.key, item.offset);
    }
  }
  s.active = false;
  c.counters.commits.fetch_add(1, std::memory_order_relaxed);
  co_return Status::OK();
}

// ---- BlockingTx --------------------------------------------------------------------------------

Result<std::unique_ptr<BlockingTx>> BlockingTx::Create(TxClient& client, Node& node) {
  std::unique_ptr<BlockingTx> b(new BlockingTx());
  FARMEM_ASSIGN_OR_RETURN(b->sched_, node.make_scheduler());
  b->tx_ = std::make_unique<Tx>(client, *b->sched_);
  return b;
}

Result<std::vector<std::byte>> BlockingTx::read(uint16_t table, std::span<const std::byte> key) {
  Result<std::span<const std::byte>> r = sched_->block_on(tx_->read(table, key));
  if (!r.ok()) return r.status();
  return std::vector<std::byte>(r->begin(), r->end());
}
Result<std::span<std::byte>> BlockingTx::write(uint16_t table, std::span<const std::byte> key) {
  return sched_->block_on(tx_->write(table, key));
}
Status BlockingTx::insert(uint16_t table, std::span<const std::byte> key,
                          std::span<const std::byte> value) {
  return sched_->block_on(tx_->insert(table, key, value));
}
Status BlockingTx::remove(uint16_t table, std::span<const std::byte> key) {
  return sched_->block_on(tx_->remove(table, key));
}
Status BlockingTx::commit() {
  return sched_->block_on(tx_->commit());
}
Status BlockingTx::abort() {
  return sched_->block_on(tx_->abort());
}

}  // namespace farmem
