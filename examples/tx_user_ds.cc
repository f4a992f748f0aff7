// Example: a data structure of your own in farmem transactions (docs/tx.md "User data
// structures"), from a program built against an installed farmem. An embedded farmemd serves a
// hash table ("prices"); a node of this program owns "stock", 16 versioned counters (key k is
// counter k - 1, 1 <= k <= 16) that clients read one-sidedly and change through the owner's
// transaction RPCs. One transaction reads a price, takes stock and records the order in a second
// hash table ("orders") — writes to both commit atomically, the owner a prepared participant of
// the two-phase commit (TxDsParticipant); one whose read of a counter went stale before its
// commit is refused ("validation").
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <farmem/node.h>
#include <farmem/server.h>
#include <farmem/tx.h>
#include <farmem/tx_ds.h>

namespace {

void Check(const farmem::Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "tx_user_ds: %s failed: %s\n", what, st.ToString().c_str());
    std::exit(1);
  }
}

std::vector<std::byte> U64Bytes(uint64_t v) {
  std::vector<std::byte> b(8);
  std::memcpy(b.data(), &v, 8);
  return b;
}
uint64_t U64(std::span<const std::byte> b) {
  uint64_t v = 0;
  std::memcpy(&v, b.data(), 8);
  return v;
}

constexpr uint64_t kCounters = 16;
constexpr uint16_t kLookup = 9000;  // request: 8 key bytes; reply: address, version, lock, value
constexpr uint16_t kTxBase = 9001;  // + farmem::kTxDsLock .. kTxDsDecide

// A counter: {seq, version, lock holder, value}. The owner changes one under its mutex with seq
// odd while it does (a reader's copy with an odd or moved seq is retried).
struct Counter {
  std::atomic<uint64_t> seq{0}, version{0}, lock{0}, value{0};
};
static_assert(sizeof(Counter) == 32);

// The owner serves the transaction RPCs and, for commits that span other participants, pins and
// applies prepared writes (TxDsPreparedWrites) for its TxDsParticipant.
class StockOwner final : public farmem::TxDsOwner, public farmem::TxDsPreparedWrites {
 public:
  Counter counters[kCounters];
  farmem::TxDsParticipant* participant = nullptr;

  farmem::Status rpc_handler(uint16_t opcode, std::span<const std::byte> request,
                             std::vector<std::byte>& reply) override {
    // Not under mu_: the participant calls pin() / apply(), which take it.
    if (opcode == kTxBase + farmem::kTxDsPrepare) return participant->prepare(request);
    if (opcode == kTxBase + farmem::kTxDsDecide) return participant->decide(request);
    std::lock_guard guard(mu_);
    if (opcode == kLookup) {
      Counter* c = request.size() == 8 ? Find(request) : nullptr;
      if (c == nullptr) return farmem::Status::NotFound("not found: no such counter");
      const uint64_t out[4] = {Address(c), c->version, c->lock, c->value};
      reply.assign(reinterpret_cast<const std::byte*>(out),
                   reinterpret_cast<const std::byte*>(out) + sizeof(out));
      return farmem::Status::OK();
    }
    switch (opcode - kTxBase) {
      case farmem::kTxDsLock: {
        FARMEM_ASSIGN_OR_RETURN(farmem::TxDsKeyRequest r, farmem::DecodeTxDsKeyRequest(request));
        Counter* c = Find(r.key);
        if (c == nullptr) return farmem::Status::NotFound("not found: no such counter");
        if (c->lock != 0 && c->lock != r.txid) return farmem::Status::Aborted("locked: counter");
        Change(c, [&] { c->lock = r.txid; });  // (a real owner also keeps r.lease_ns)
        const uint64_t v = c->value;
        reply = farmem::EncodeTxDsItemReply(Address(c), c->version, c->lock,
                                            std::as_bytes(std::span(&v, 1)));
        return farmem::Status::OK();
      }
      case farmem::kTxDsValidate: {
        FARMEM_ASSIGN_OR_RETURN(farmem::TxDsValidateRequest r,
                                farmem::DecodeTxDsValidateRequest(request));
        for (const auto& item : r.items) {
          Counter* c = Find(item.key);
          if (c == nullptr || c->version != item.version || (c->lock != 0 && c->lock != r.txid))
            return farmem::Status::Aborted("validation: counter changed");
        }
        return farmem::Status::OK();
      }
      case farmem::kTxDsCommit:
      case farmem::kTxDsUnlock: {
        const bool commit = opcode - kTxBase == farmem::kTxDsCommit;
        FARMEM_ASSIGN_OR_RETURN(farmem::TxDsBatchRequest r,
                                farmem::DecodeTxDsBatchRequest(request, commit));
        if (commit) FARMEM_RETURN_IF_ERROR(Held(r.txid, r.items));
        Apply(r.txid, r.items, commit);
        return farmem::Status::OK();
      }
      default:  // kTxDsLockInsert: a fixed set of counters
        return farmem::Status::InvalidArgument("stock: no inserts");
    }
  }

  // A prepare: txid must hold every lock. These locks have no lease (they never expire), so
  // they are pinned as they are; an owner with leases would stop them running out here.
  farmem::Status pin(uint64_t txid, std::span<const farmem::TxDsBatchItem> items) override {
    std::lock_guard guard(mu_);
    farmem::Status st = Held(txid, items);
    if (!st.ok()) Apply(txid, items, false);  // a refused prepare releases txid's locks
    return st;
  }
  void apply(uint64_t txid, std::span<const farmem::TxDsBatchItem> items, bool commit) override {
    std::lock_guard guard(mu_);
    Apply(txid, items, commit);
  }

 private:
  farmem::Status Held(uint64_t txid, std::span<const farmem::TxDsBatchItem> items) {
    for (const auto& item : items) {
      Counter* c = Find(item.key);
      if (c == nullptr || c->lock != txid) {
        return farmem::Status::Aborted("stale commit: lock not held");
      }
      if (item.op != farmem::TxDsOp::kWrite) {
        return farmem::Status::InvalidArgument("stock: counters cannot be removed");
      }
    }
    return farmem::Status::OK();
  }
  // Installs (commit) and releases txid's locks on the items (caller holds mu_).
  void Apply(uint64_t txid, std::span<const farmem::TxDsBatchItem> items, bool commit) {
    for (const auto& item : items) {
      Counter* c = Find(item.key);
      if (c == nullptr || c->lock != txid) continue;
      Change(c, [&] {
        if (commit) {
          c->value = U64(item.value);
          c->version = c->version + 1;
        }
        c->lock = 0;
      });
    }
  }
  Counter* Find(std::span<const std::byte> key) {
    const uint64_t k = U64(key);
    return k >= 1 && k <= kCounters ? &counters[k - 1] : nullptr;
  }
  uint64_t Address(const Counter* c) const { return (c - counters) * sizeof(Counter); }
  template <typename F>
  void Change(Counter* c, F&& f) {
    c->seq = c->seq + 1;  // odd: changing (seq_cst stores keep the order readers rely on)
    f();
    c->seq = c->seq + 1;
  }
  std::mutex mu_;
};

// Client side. The seqlock read (seq word before and after the copy) makes every copy checkable
// on any transport.
class StockClient final : public farmem::TxDsClient {
 public:
  farmem::TxDsStep lookup_start(std::span<const std::byte> key) override {
    const uint64_t k = U64(key);
    if (k < 1 || k > kCounters) return {};
    return At((k - 1) * sizeof(Counter));
  }
  farmem::TxDsStep lookup_end(std::span<const std::byte> copy, const farmem::TxDsRead& read,
                              const farmem::TxSeqlockRecheck* recheck,
                              std::span<const std::byte> key) override {
    (void)key;
    uint64_t w[4];
    std::memcpy(w, copy.data(), sizeof(w));
    farmem::TxDsStep s;
    if (recheck == nullptr || w[0] % 2 != 0 || recheck->before != w[0] || recheck->after != w[0]) {
      s.kind = farmem::TxDsStep::kRetry;
      return s;
    }
    s.kind = farmem::TxDsStep::kFound;
    s.address = read.offset;
    s.view = {w[0], w[1], w[2], {}, copy.subspan(24, 8)};
    return s;
  }
  uint16_t rpc_opcode() const override { return kLookup; }
  std::vector<std::byte> rpc_request(std::span<const std::byte> key) override {
    return {key.begin(), key.end()};
  }
  farmem::Result<farmem::TxDsStep> rpc_lookup_end(std::span<const std::byte> reply,
                                                  std::span<const std::byte> key) override {
    (void)key;
    if (reply.size() != 32) return farmem::Status::Protocol("stock lookup reply");
    farmem::TxDsStep s;
    s.kind = farmem::TxDsStep::kFound;
    s.address = U64(reply);
    s.view = {0, U64(reply.subspan(8)), U64(reply.subspan(16)), {}, reply.subspan(24, 8)};
    return s;
  }
  uint16_t tx_opcode_base() const override { return kTxBase; }
  uint32_t value_size() const override { return 8; }
  farmem::TxDsStep validate_start(uint64_t address, std::span<const std::byte> key) override {
    (void)key;
    return At(address);
  }
  // The owner serves kTxDsPrepare / kTxDsDecide: stock may commit beside other writes.
  bool two_phase() const override { return true; }

 private:
  static farmem::TxDsStep At(uint64_t offset) {
    farmem::TxDsStep s;
    s.kind = farmem::TxDsStep::kRead;
    s.read = {offset, sizeof(Counter), /*seqlock=*/true};
    return s;
  }
};

}  // namespace

int main() {
  // The hash table "prices" (8-byte keys and values) in an embedded farmemd's tx service.
  farmem::ServerConfig sc;
  sc.services = {"tx"};
  sc.tx.tables = {"prices:8:8:64:2", "orders:8:8:64:2"};
  auto server = farmem::MemoryServer::Create(sc);
  Check(server.status(), "MemoryServer::Create");
  Check((*server)->start(), "MemoryServer::start");

  // The owner of "stock": exports the counters read-only and serves their RPCs.
  StockOwner owner;
  for (uint64_t k = 0; k < kCounters; ++k) owner.counters[k].value = 10;
  farmem::NodeConfig oc;
  oc.name = "stock-owner";
  auto owner_node = farmem::Node::Create(oc);
  Check(owner_node.status(), "Node::Create (owner)");
  Check((*owner_node)
            ->export_region("stock", owner.counters, sizeof(owner.counters),
                            farmem::Access::kReadOnly)
            .status(),
        "export_region");
  auto participant = farmem::TxDsParticipant::Create(**owner_node, owner);
  Check(participant.status(), "TxDsParticipant::Create");
  owner.participant = participant->get();
  for (uint16_t op = kLookup; op < kTxBase + farmem::kTxDsTwoPhaseOpcodes; ++op) {
    Check((*owner_node)
              ->register_rpc(op,
                             [&owner](const farmem::RpcCall& call, std::vector<std::byte>& reply) {
                               return owner.rpc_handler(call.opcode, call.request, reply);
                             }),
          "register_rpc");
  }
  Check((*owner_node)->start(), "Node::start (owner)");

  farmem::NodeConfig nc;
  nc.name = "tx-example";
  auto node = farmem::Node::Create(nc);
  Check(node.status(), "Node::Create");
  Check((*node)->start(), "Node::start");
  auto client = farmem::TxClient::Connect(**node, {(*server)->node().bootstrap_address()});
  Check(client.status(), "TxClient::Connect");
  const uint16_t prices = *(*client)->table("prices");
  const uint16_t orders = *(*client)->table("orders");
  auto stock = (*client)->add_data_structure("stock", std::make_shared<StockClient>(),
                                             (*owner_node)->bootstrap_address(), "stock");
  Check(stock.status(), "add_data_structure");

  auto tx = farmem::BlockingTx::Create(**client, **node);
  Check(tx.status(), "BlockingTx::Create");
  (*tx)->start();
  Check((*tx)->insert(prices, U64Bytes(3), U64Bytes(250)), "insert price");
  Check((*tx)->commit(), "commit");

  // Buy 4 of item 3: read its price (hash table), take stock (our data structure) and record
  // order 1 (another hash table): the stock and the order commit together or not at all.
  (*tx)->start();
  auto price = (*tx)->read(prices, U64Bytes(3));
  Check(price.status(), "read price");
  auto left = (*tx)->write(*stock, U64Bytes(3));
  Check(left.status(), "write stock");
  const uint64_t n = U64(*left) - 4;
  std::memcpy(left->data(), &n, 8);
  Check((*tx)->insert(orders, U64Bytes(1), U64Bytes(3 * 1000 + 4)), "insert order");
  Check((*tx)->commit(), "commit purchase");
  std::printf(
      "bought 4 of item 3 at %llu: %llu left, order 1 recorded (prepared at the stock "
      "owner: %llu)\n",
      (unsigned long long)U64(*price), (unsigned long long)n,
      (unsigned long long)(*participant)->stats().prepares);

  // A stock check reads items 3 and 4; a purchase of item 4 commits in between: refused.
  auto other = farmem::BlockingTx::Create(**client, **node);
  Check(other.status(), "BlockingTx::Create");
  (*tx)->start();
  auto s3 = (*tx)->read(*stock, U64Bytes(3));
  auto s4 = (*tx)->read(*stock, U64Bytes(4));
  Check(s3.status(), "read stock 3");
  Check(s4.status(), "read stock 4");
  (*other)->start();
  auto w4 = (*other)->write(*stock, U64Bytes(4));
  Check(w4.status(), "write stock 4");
  const uint64_t n4 = U64(*w4) - 1;
  std::memcpy(w4->data(), &n4, 8);
  Check((*other)->commit(), "commit purchase of item 4");
  const farmem::Status st = (*tx)->commit();
  if (farmem::TxAbortReasonOf(st) != farmem::TxAbortReason::kValidation) {
    std::fprintf(stderr, "tx_user_ds: the stale stock check was not refused: %s\n",
                 st.ToString().c_str());
    return 1;
  }
  std::printf("stale stock check refused: %s\n", st.ToString().c_str());
  const farmem::TxClientStats stats = (*client)->stats();
  std::printf("one-sided reads %llu, one-sided validations %llu, commits %llu\n",
              (unsigned long long)stats.one_sided_hits,
              (unsigned long long)stats.one_sided_validations, (unsigned long long)stats.commits);
  (*node)->stop();
  owner.participant = nullptr;
  participant->reset();
  (*owner_node)->stop();
  (*server)->stop();
  return 0;
}
