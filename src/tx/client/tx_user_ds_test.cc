// A data structure of the user's own in transactions (docs/tx.md "User data structures"), built
// on the public farmem/tx_ds.h only: an array of locked, versioned records served by its own
// owner node (lookup, lock, lock-insert, validate, commit, unlock RPCs), read one-two-sidedly
// through its client callbacks, registered with TxClient::add_data_structure beside a hash table of
// farmemd's tx service. Threads: the test's (one Scheduler each), the owner's and the servers' RPC
// threads.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "farmem/node.h"
#include "farmem/tx.h"
#include "farmem/tx_ds.h"
#include "node/node_test_util.h"
#include "tx/client/tx_test_env.h"

namespace farmem::tx_test {
// Named, not anonymous: the unity build puts this file in one translation unit with the other
// tx client tests, whose anonymous namespaces hold names like kRecords and kValue too.
namespace user_ds {

using Clock = std::chrono::steady_clock;

// Record i at offset 64 * i, eight words: seq, key (0 = free slot), version, lock holder, lease
// deadline (owner's steady clock, ns), value, live (1 = committed, 0 = free or reserved by an
// insert), tail. Changes follow the hash table's writer protocol (tx_layout.h): tail and seq odd,
// the words, then tail and seq even. Keys are u64 >= 1; key k is placed at record (k - 1) % N
// when that one is free, else at the next free one.
constexpr uint64_t kRecords = 64;
constexpr size_t kRecordBytes = 64;
constexpr uint16_t kLookupOp =
    9100;  // request: the 8 key bytes; reply: address, version, lock, value
constexpr uint16_t kTxBase = 9101;  // + kTxDs*
enum Word : uint32_t { kSeq, kKey, kVersion, kLock, kLease, kValue, kLive, kTail, kWords };
static_assert(kWords * 8 == kRecordBytes);

uint64_t KeyOf(std::span<const std::byte> key) {
  uint64_t k = 0;
  std::memcpy(&k, key.data(), 8);
  return k;
}

// The owner also takes part in multi-participant commits: it pins and applies prepared writes
// (TxDsPreparedWrites) and passes kTxDsPrepare / kTxDsDecide to its TxDsParticipant. A pinned
// lock has lease kPinned: it never runs out.
constexpr uint64_t kPinned = UINT64_MAX;

class RecordOwner final : public TxDsOwner, public TxDsPreparedWrites {
 public:
  RecordOwner() {
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    words_ = static_cast<uint64_t*>(p == MAP_FAILED ? nullptr : p);
  }
  ~RecordOwner() override {
    if (words_ != nullptr) munmap(words_, kBytes);
  }
  static constexpr size_t kBytes = kRecords * kRecordBytes;
  void* memory() { return words_; }

  Status rpc_handler(uint16_t opcode, std::span<const std::byte> request,
                     std::vector<std::byte>& reply) override {
    if (opcode == kTxBase + kTxDsPrepare || opcode == kTxBase + kTxDsDecide) {
      // Not under mu_: the participant calls pin() / apply(), which take it.
      if (participant == nullptr) return Status::Protocol("records: no two-phase participant");
      return opcode == kTxBase + kTxDsPrepare ? participant->prepare(request)
                                              : participant->decide(request);
    }
    std::lock_guard lock(mu_);
    switch (opcode) {
      case kLookupOp:
        return Lookup(request, reply);
      case kTxBase + kTxDsLock:
        return Lock(request, reply, false);
      case kTxBase + kTxDsLockInsert:
        return Lock(request, reply, true);
      case kTxBase + kTxDsValidate:
        return Validate(request);
      case kTxBase + kTxDsCommit:
        return Commit(request);
      case kTxBase + kTxDsUnlock:
        return Unlock(request);
    }
    return Status::Protocol("records: unknown opcode " + std::to_string(opcode));
  }

  Status pin(uint64_t txid, std::span<const TxDsBatchItem> items) override {
    std::lock_guard lock(mu_);
    std::vector<uint64_t> records;
    for (const TxDsBatchItem& e : items) {
      const uint64_t r = Find(KeyOf(e.key));
      if (r == kRecords || Get(r, kLock) != txid || Get(r, kLease) <= Now()) {
        Release(txid, items);
        return Status::Aborted("stale commit: transaction " + std::to_string(txid) +
                               " does not hold key " + std::to_string(KeyOf(e.key)) +
                               " (its lease ran out?)");
      }
      if (e.op == TxDsOp::kWrite && e.value.size() != 8) {
        Release(txid, items);
        return Status::InvalidArgument("records: values are 8 bytes");
      }
      records.push_back(r);
    }
    for (uint64_t r : records) Change(r, [&](auto set) { set(kLease, kPinned); });
    return Status::OK();
  }
  void apply(uint64_t txid, std::span<const TxDsBatchItem> items, bool commit) override {
    std::lock_guard lock(mu_);
    if (!commit) {
      Release(txid, items);
      return;
    }
    std::vector<uint64_t> records;
    for (const TxDsBatchItem& e : items) records.push_back(Find(KeyOf(e.key)));
    Install(items, records);
  }

  // The record of `key` as the owner sees it (for the tests' checks).
  struct Snapshot {
    uint64_t value = 0, lock = 0, lease = 0;
  };
  Snapshot Peek(uint64_t key) {
    std::lock_guard lock(mu_);
    const uint64_t r = Find(key);
    if (r == kRecords) return {};
    return {Get(r, kValue), Get(r, kLock), Get(r, kLease)};
  }

  TxDsParticipant* participant = nullptr;
  // Test-only fault: commits do not check that the transaction still holds each lock.
  bool skip_lock_check = false;

 private:
  uint64_t Get(uint64_t r, Word w) const {
    return std::atomic_ref<uint64_t>(words_[r * kWords + w]).load(std::memory_order_relaxed);
  }
  template <typename F>
  void Change(uint64_t r, F&& f) {
    uint64_t* rec = words_ + r * kWords;
    const uint64_t seq = Get(r, kSeq);
    std::atomic_ref<uint64_t>(rec[kTail]).store(seq + 1, std::memory_order_relaxed);
    std::atomic_ref<uint64_t>(rec[kSeq]).store(seq + 1, std::memory_order_relaxed);
    f([&](Word w, uint64_t v) {
      std::atomic_ref<uint64_t>(rec[w]).store(v, std::memory_order_release);
    });
    std::atomic_ref<uint64_t>(rec[kTail]).store(seq + 2, std::memory_order_release);
    std::atomic_ref<uint64_t>(rec[kSeq]).store(seq + 2, std::memory_order_release);
  }
  // The record holding `key` (committed or reserved), or kRecords.
  uint64_t Find(uint64_t key) const {
    for (uint64_t i = 0; i < kRecords; ++i) {
      const uint64_t r = (key - 1 + i) % kRecords;
      if (Get(r, kKey) == key) return r;
    }
    return kRecords;
  }
  static uint64_t Now() { return static_cast<uint64_t>(Clock::now().time_since_epoch().count()); }
  bool LockedByOther(uint64_t r, uint64_t txid) const {
    const uint64_t holder = Get(r, kLock);
    return holder != 0 && holder != txid && Get(r, kLease) > Now();
  }
  void ItemReply(uint64_t r, std::vector<std::byte>& reply, bool with_value) const {
    const uint64_t v = Get(r, kValue);
    reply = EncodeTxDsItemReply(
        r * kRecordBytes, Get(r, kVersion), Get(r, kLock),
        with_value ? std::as_bytes(std::span(&v, 1)) : std::span<const std::byte>());
  }

  Status Lookup(std::span<const std::byte> request, std::vector<std::byte>& reply) {
    if (request.size() != 8) return Status::Protocol("records lookup: the request is a u64 key");
    const uint64_t key = KeyOf(request);
    const uint64_t r = key == 0 ? kRecords : Find(key);
    if (r == kRecords || Get(r, kLive) == 0) {
      return Status::NotFound("not found: key " + std::to_string(key));
    }
    const uint64_t out[4] = {r * kRecordBytes, Get(r, kVersion), Get(r, kLock), Get(r, kValue)};
    reply.resize(sizeof(out));
    std::memcpy(reply.data(), out, sizeof(out));
    return Status::OK();
  }

  Status Lock(std::span<const std::byte> request, std::vector<std::byte>& reply, bool insert) {
    FARMEM_ASSIGN_OR_RETURN(TxDsKeyRequest op, DecodeTxDsKeyRequest(request));
    if (op.key.size() != 8 || KeyOf(op.key) == 0) {
      return Status::InvalidArgument("records: keys are u64 >= 1");
    }
    const uint64_t key = KeyOf(op.key);
    uint64_t r = Find(key);
    if (r != kRecords && LockedByOther(r, op.txid)) {
      return Status::Aborted("locked: key " + std::to_string(key) + " held by transaction " +
                             std::to_string(Get(r, kLock)));
    }
    const uint64_t lease = Now() + op.lease_ns;
    if (!insert) {
      if (r == kRecords || Get(r, kLive) == 0) {
        return Status::NotFound("not found: key " + std::to_string(key));
      }
      Change(r, [&](auto set) {
        set(kLock, op.txid);
        set(kLease, lease);
      });
      ItemReply(r, reply, true);
      return Status::OK();
    }
    if (r != kRecords && Get(r, kLive) != 0) {
      return Status::Aborted("exists: key " + std::to_string(key));
    }
    if (r == kRecords) {
      for (uint64_t i = 0; i < kRecords && r == kRecords; ++i) {
        const uint64_t c = (key - 1 + i) % kRecords;
        if (Get(c, kKey) == 0) r = c;
      }
      if (r == kRecords) return Status::ResourceExhausted("records: all records in use");
    }
    Change(r, [&](auto set) {
      set(kKey, key);
      set(kLock, op.txid);
      set(kLease, lease);
      set(kValue, 0);
    });
    ItemReply(r, reply, false);
    return Status::OK();
  }

  Status Validate(std::span<const std::byte> request) {
    FARMEM_ASSIGN_OR_RETURN(TxDsValidateRequest op, DecodeTxDsValidateRequest(request));
    for (const TxDsVersionedKey& item : op.items) {
      const uint64_t r = Find(KeyOf(item.key));
      if (r == kRecords || Get(r, kLive) == 0 || Get(r, kVersion) != item.version ||
          LockedByOther(r, op.txid)) {
        return Status::Aborted("validation: key " + std::to_string(KeyOf(item.key)));
      }
    }
    return Status::OK();
  }

  Status Commit(std::span<const std::byte> request) {
    FARMEM_ASSIGN_OR_RETURN(TxDsBatchRequest op, DecodeTxDsBatchRequest(request, true));
    std::vector<uint64_t> records;
    for (const TxDsBatchItem& e : op.items) {
      const uint64_t r = Find(KeyOf(e.key));
      const bool held = r != kRecords && Get(r, kLock) == op.txid && Get(r, kLease) > Now();
      if (!held && !skip_lock_check) {
        return Status::Aborted("stale commit: transaction " + std::to_string(op.txid) +
                               " does not hold key " + std::to_string(KeyOf(e.key)));
      }
      if (r == kRecords) return Status::Aborted("stale commit: no key");
      if (e.op == TxDsOp::kWrite && e.value.size() != 8) {
        return Status::InvalidArgument("records: values are 8 bytes");
      }
      records.push_back(r);
    }
    Install(op.items, records);
    return Status::OK();
  }

  // Installs each item at its record (caller holds mu_; records[i] is items[i]'s).
  void Install(std::span<const TxDsBatchItem> items, const std::vector<uint64_t>& records) {
    for (size_t i = 0; i < items.size(); ++i) {
      const TxDsBatchItem& e = items[i];
      const uint64_t r = records[i];
      if (r == kRecords) continue;
      const uint64_t version = Get(r, kVersion) + 1;
      Change(r, [&](auto set) {
        if (e.op == TxDsOp::kRemove) {
          set(kKey, 0);
          set(kLive, 0);
          set(kValue, 0);
        } else {
          uint64_t v = 0;
          std::memcpy(&v, e.value.data(), 8);
          set(kValue, v);
          set(kLive, 1);
        }
        set(kVersion, version);
        set(kLock, 0);
        set(kLease, 0);
      });
    }
  }

  Status Unlock(std::span<const std::byte> request) {
    FARMEM_ASSIGN_OR_RETURN(TxDsBatchRequest op, DecodeTxDsBatchRequest(request, false));
    Release(op.txid, op.items);
    return Status::OK();
  }

  // Releases txid's locks on the items' records (caller holds mu_).
  void Release(uint64_t txid, std::span<const TxDsBatchItem> items) {
    for (const TxDsBatchItem& e : items) {
      const uint64_t r = Find(KeyOf(e.key));
      if (r == kRecords || Get(r, kLock) != txid) continue;  // already released or taken over
      const bool reserved = Get(r, kLive) == 0;
      Change(r, [&](auto set) {
        if (reserved) set(kKey, 0);  // an insert that did not commit frees its record
        set(kLock, 0);
        set(kLease, 0);
      });
    }
  }

  std::mutex mu_;
  uint64_t* words_ = nullptr;
};

// Client callbacks: key k is guessed at record (k - 1) % N, or at the address an RPC lookup
// returned (cached, shared by every thread: a mutex). Copies are checked like the hash table's:
// ordered (native TCP) seq even and equal to tail; else the seqlock words around the copy too.
class RecordDs final : public TxDsClient {
 public:
  explicit RecordDs(bool ordered, uint16_t base = kTxBase, bool two_phase = true)
      : ordered_(ordered), base_(base), two_phase_(two_phase) {}

  TxDsStep lookup_start(std::span<const std::byte> key) override {
    const uint64_t k = KeyOf(key);
    if (k == 0) return {};
    {
      std::lock_guard lock(mu_);
      if (auto it = cache_.find(k); it != cache_.end()) return ReadAt(it->second);
    }
    return ReadAt(((k - 1) % kRecords) * kRecordBytes);
  }
  TxDsStep lookup_end(std::span<const std::byte> copy, const TxDsRead& read,
                      const TxSeqlockRecheck* recheck, std::span<const std::byte> key) override {
    uint64_t w[kWords];
    std::memcpy(w, copy.data(), sizeof(w));
    TxDsStep next;
    const bool consistent =
        w[kSeq] % 2 == 0 && w[kSeq] == w[kTail] &&
        (recheck == nullptr || (recheck->before == w[kSeq] && recheck->after == w[kSeq]));
    if (!consistent) {
      next.kind = TxDsStep::kRetry;
      return next;
    }
    if (w[kKey] != KeyOf(key) || w[kLive] == 0) return next;  // elsewhere, or absent: the owner
    next.kind = TxDsStep::kFound;
    next.address = read.offset;
    next.view.seq = w[kSeq];
    next.view.version = w[kVersion];
    next.view.lock_txid = w[kLock];
    next.view.value = copy.subspan(kValue * 8, 8);
    return next;
  }
  uint16_t rpc_opcode() const override { return kLookupOp; }
  std::vector<std::byte> rpc_request(std::span<const std::byte> key) override {
    return std::vector<std::byte>(key.begin(), key.end());
  }
  Result<TxDsStep> rpc_lookup_end(std::span<const std::byte> reply,
                                  std::span<const std::byte> key) override {
    if (reply.size() != 32) return Status::Protocol("records lookup reply: length");
    TxDsStep found;
    found.kind = TxDsStep::kFound;
    std::memcpy(&found.address, reply.data(), 8);
    std::memcpy(&found.view.version, reply.data() + 8, 8);
    std::memcpy(&found.view.lock_txid, reply.data() + 16, 8);
    found.view.value = reply.subspan(24, 8);
    std::lock_guard lock(mu_);
    cache_[KeyOf(key)] = found.address;
    return found;
  }
  uint16_t tx_opcode_base() const override { return base_; }
  uint32_t value_size() const override { return 8; }
  TxDsStep validate_start(uint64_t address, std::span<const std::byte> key) override {
    (void)key;
    return ReadAt(address);
  }
  bool two_phase() const override { return two_phase_; }

 private:
  TxDsStep ReadAt(uint64_t offset) const {
    TxDsStep s;
    s.kind = TxDsStep::kRead;
    s.read = {offset, static_cast<uint32_t>(kRecordBytes), !ordered_};
    return s;
  }
  const bool ordered_;
  const uint16_t base_;
  const bool two_phase_;
  std::mutex mu_;
  std::map<uint64_t, uint64_t> cache_;
};

// Where a RecordOwner serves: its node and its two-phase participant.
struct OwnerSite {
  RecordOwner records;
  std::unique_ptr<Node> node;
  std::unique_ptr<TxDsParticipant> participant;
  ~OwnerSite() { Stop(); }
  void Stop() {
    records.participant = nullptr;
    participant.reset();  // before the node: its recovery calls through it
    if (node) node->stop();
    node.reset();
  }
};

// Two tx servers (a hash table "kv", 8-byte keys and values, partitioned over both) plus the
// records' owner node.
class TxUserDs : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    env_ = TxEnv::Start(GetParam(), 2, {"kv:8:8:64:2"});
    ASSERT_NE(env_->node, nullptr);
    StartOwner(site_, "records-owner");
  }
  // Starts a records owner: its node, region "records", RPCs and participant (`options`).
  void StartOwner(OwnerSite& site, const std::string& name, TxDsParticipantOptions options = {}) {
    ASSERT_NE(site.records.memory(), nullptr);
    auto node = Node::Create(node::testing::MakeConfig(GetParam(), name));
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    site.node = std::move(*node);
    auto region = site.node->export_region("records", site.records.memory(), RecordOwner::kBytes,
                                           Access::kReadOnly);
    ASSERT_TRUE(region.ok()) << region.status().ToString();
    static_assert(kTxBase == kLookupOp + 1);  // one range: the lookup, then the tx RPCs
    for (uint16_t op = kLookupOp; op < kTxBase + kTxDsTwoPhaseOpcodes; ++op) {
      ASSERT_TRUE(site.node
                      ->register_rpc(op,
                                     [&site](const RpcCall& call, std::vector<std::byte>& reply) {
                                       return site.records.rpc_handler(call.opcode, call.request,
                                                                       reply);
                                     })
                      .ok());
    }
    ASSERT_TRUE(site.node->start().ok());
    ResetParticipant(site, std::move(options));
  }
  // Replaces the owner's participant (no transaction may be running).
  static void ResetParticipant(OwnerSite& site, TxDsParticipantOptions options) {
    site.records.participant = nullptr;
    site.participant.reset();
    auto p = TxDsParticipant::Create(*site.node, site.records, std::move(options));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    site.participant = std::move(*p);
    site.records.participant = site.participant.get();
  }
  void TearDown() override {
    clients_.clear();
    site2_.Stop();
    site_.Stop();
    env_.reset();
  }
  // A client with the records registered; *id gets their table id.
  TxClient* Connect(uint16_t* id, TxClientOptions options = {}) {
    auto c = env_->Connect(options);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    auto ds = std::make_shared<RecordDs>(GetParam() == "tcp");
    auto r = (*c)->add_data_structure("records", ds, site_.node->bootstrap_address(), "records");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return nullptr;
    *id = *r;
    clients_.push_back(std::move(*c));
    return clients_.back().get();
  }
  // With a fresh participant (`participant`): kv key 1 = 50 (table id *kv) and record 1 = 100
  // (records id *id), committed by the client returned (null on a failure, reported).
  TxClient* StartOneOfEach(TxDsParticipantOptions participant, uint16_t* id, uint16_t* kv) {
    ResetParticipant(site_, std::move(participant));
    TxClient* c = Connect(id);
    if (c == nullptr) return nullptr;
    *kv = *c->table("kv");
    Fill(*c, *id, 1, 100);
    auto t = Blocking(*c);
    t->start();
    EXPECT_TRUE(t->insert(*kv, Key(1), Value(50, 8)).ok());
    EXPECT_TRUE(t->commit().ok());
    return c;
  }
  // StartOneOfEach, then a client with a 100 ms lease writes
  // 777 to both and dies in its commit at `at`. Null on a failure (reported).
  TxClient* StartDyingCommit(TxDieAt at, TxDsParticipantOptions participant, uint16_t* id,
                             uint16_t* kv) {
    TxClient* c = StartOneOfEach(std::move(participant), id, kv);
    if (c == nullptr) return nullptr;
    TxClientOptions dying;
    dying.lease = std::chrono::milliseconds(100);
    dying.faults.die_at = at;
    auto dt = WriteBoth(dying, 777);
    if (dt == nullptr) return nullptr;
    EXPECT_EQ(dt->commit().code(), Code::kInternal);  // the test fault
    return c;
  }
  // A transaction of a new client (`options`) that wrote `v` to kv key 1 and record 1, ready to
  // commit (null on a failure, reported).
  std::unique_ptr<BlockingTx> WriteBoth(TxClientOptions options, uint64_t v) {
    uint16_t id = 0;
    TxClient* c = Connect(&id, options);
    if (c == nullptr) return nullptr;
    auto t = Blocking(*c);
    t->start();
    auto wk = t->write(*c->table("kv"), Key(1));
    auto wr = t->write(id, Key(1));
    EXPECT_TRUE(wk.ok() && wr.ok());
    if (!wk.ok() || !wr.ok()) return nullptr;
    std::memcpy(wk->data(), &v, 8);
    std::memcpy(wr->data(), &v, 8);
    return t;
  }
  // Record 1 holds `record` with no lock; kv key 1 holds `kv_value` and t can lock it.
  void ExpectFree(BlockingTx& t, uint16_t kv, uint64_t kv_value, uint64_t record) {
    EXPECT_EQ(site_.records.Peek(1).value, record);
    EXPECT_EQ(site_.records.Peek(1).lock, 0u);
    t.start();
    auto k1 = t.write(kv, Key(1));
    ASSERT_TRUE(k1.ok()) << k1.status().ToString();
    EXPECT_EQ(U64(*k1), kv_value);
    ASSERT_TRUE(t.abort().ok());
  }
  std::unique_ptr<BlockingTx> Blocking(TxClient& c) {
    auto t = BlockingTx::Create(c, *env_->node);
    EXPECT_TRUE(t.ok());
    return t.ok() ? std::move(*t) : nullptr;
  }
  // Inserts keys 1..n with value `value` each, one transaction.
  void Fill(TxClient& c, uint16_t id, uint64_t n, uint64_t value) {
    auto t = Blocking(c);
    t->start();
    for (uint64_t k = 1; k <= n; ++k) ASSERT_TRUE(t->insert(id, Key(k), Value(value, 8)).ok());
    ASSERT_TRUE(t->commit().ok());
  }

  std::unique_ptr<TxEnv> env_;
  OwnerSite site_, site2_;
  std::vector<std::unique_ptr<TxClient>> clients_;
};

TEST_P(TxUserDs, RegistrationChecksTheDataStructureAndItsOwner) {
  auto c = env_->Connect();
  ASSERT_TRUE(c.ok());
  const std::string owner = site_.node->bootstrap_address();
  auto ds = std::make_shared<RecordDs>(true);
  auto r = (*c)->add_data_structure("records", ds, owner, "nope");
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(r.status().ToString().find("exports no region 'nope' (it exports: records)"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_EQ((*c)->add_data_structure("kv", ds, owner, "records").status().code(),
            Code::kInvalidArgument);  // the hash table's name
  EXPECT_EQ((*c)->add_data_structure("x", nullptr, owner, "records").status().code(),
            Code::kInvalidArgument);
  // Its five opcodes (seven with two_phase()) must fit under 65536: base 65531 does
  // (65531..65535) without two_phase(), 65532 does not; with it 65529 does, 65530 does not; 0
  // means lookups only.
  EXPECT_EQ((*c)->add_data_structure("top", std::make_shared<RecordDs>(true, 65532, false), owner,
                                     "records")
                .status()
                .code(),
            Code::kInvalidArgument);
  EXPECT_EQ(
      (*c)->add_data_structure("top", std::make_shared<RecordDs>(true, 65530), owner, "records")
          .status()
          .code(),
      Code::kInvalidArgument);
  EXPECT_TRUE(
      (*c)->add_data_structure("top", std::make_shared<RecordDs>(true, 65529), owner, "records")
          .ok());
  EXPECT_EQ((*c)->add_data_structure("zero", std::make_shared<RecordDs>(true, 0), owner, "records")
                .status()
                .code(),
            Code::kInvalidArgument);
  EXPECT_TRUE((*c)->add_data_structure("high", std::make_shared<RecordDs>(true, 65531, false),
                                       owner, "records")
                  .ok());
  r = (*c)->add_data_structure("records", ds, "127.0.0.1:1", "records");
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("connecting to its owner at 127.0.0.1:1"), std::string::npos)
      << r.status().ToString();
  r = (*c)->add_data_structure("records", ds, owner, "records");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*(*c)->table("records"), *r);
  EXPECT_EQ((*c)->value_size(*r), 8u);
  EXPECT_EQ((*c)->add_data_structure("records", ds, owner, "records").status().code(),
            Code::kInvalidArgument);  // taken
}

TEST_P(TxUserDs, ReadsWritesInsertsAndRemovesCommitThroughTheCallbacks) {
  uint16_t id = 0;
  TxClient* c = Connect(&id);
  ASSERT_NE(c, nullptr);
  Fill(*c, id, 3, 100);
  auto t = Blocking(*c);
  // Read one, change another, commit.
  t->start();
  auto v1 = t->read(id, Key(1));
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  EXPECT_EQ(U64(*v1), 100u);
  auto w2 = t->write(id, Key(2));
  ASSERT_TRUE(w2.ok()) << w2.status().ToString();
  const uint64_t seven = 7;
  std::memcpy(w2->data(), &seven, 8);
  ASSERT_TRUE(t->commit().ok());
  const TxClientStats before = c->stats();
  t->start();
  auto v2 = t->read(id, Key(2));
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ(U64(*v2), 7u);
  ASSERT_TRUE(t->commit().ok());
  // Key 2 sits at its guessed record: read with one one-sided copy, no RPC.
  EXPECT_EQ(c->stats().one_sided_hits, before.one_sided_hits + 1);
  EXPECT_EQ(c->stats().rpc_lookups, before.rpc_lookups);
  // Remove, then the key is gone; insert of a live key aborts "exists".
  t->start();
  ASSERT_TRUE(t->remove(id, Key(3)).ok());
  ASSERT_TRUE(t->commit().ok());
  t->start();
  EXPECT_EQ(t->read(id, Key(3)).status().code(), Code::kNotFound);
  ASSERT_TRUE(t->abort().ok());
  t->start();
  Status ins = t->insert(id, Key(1), Value(5, 8));
  EXPECT_EQ(TxAbortReasonOf(ins), TxAbortReason::kExists) << ins.ToString();
  // An insert that aborts leaves nothing; one that commits is read back.
  t->start();
  ASSERT_TRUE(t->insert(id, Key(9), Value(99, 8)).ok());
  ASSERT_TRUE(t->abort().ok());
  t->start();
  EXPECT_EQ(t->read(id, Key(9)).status().code(), Code::kNotFound);
  ASSERT_TRUE(t->abort().ok());
  t->start();
  ASSERT_TRUE(t->insert(id, Key(9), Value(99, 8)).ok());
  ASSERT_TRUE(t->commit().ok());
  t->start();
  auto v9 = t->read(id, Key(9));
  ASSERT_TRUE(v9.ok()) << v9.status().ToString();
  EXPECT_EQ(U64(*v9), 99u);
  ASSERT_TRUE(t->commit().ok());
  // Bad keys are refused before any IO.
  t->start();
  EXPECT_EQ(t->read(id, std::vector<std::byte>(12)).status().code(), Code::kInvalidArgument);
}

// A read that another transaction overwrote before the commit fails validation (one-sided
// re-read of the record, or, RPC-only, the owner's validate RPC); with validation left out the
// stale snapshot commits (the check can fail). And a record locked by a writer aborts a reader.
TEST_P(TxUserDs, ValidationAndLocksProtectReads) {
  for (int config = 0; config < 3; ++config) {
    const bool skip = config == 2, rpc_only = config == 1;
    SCOPED_TRACE(skip ? "validation left out" : rpc_only ? "RPC only" : "one-sided");
    TxClientOptions o;
    o.faults.skip_validation = skip;
    o.one_sided_reads = !rpc_only;
    uint16_t id = 0;
    TxClient* c = Connect(&id, o);
    ASSERT_NE(c, nullptr);
    const uint64_t base = 10 + 10 * static_cast<uint64_t>(config);
    const TxClientStats before = c->stats();
    {
      auto t = Blocking(*c);
      t->start();
      for (uint64_t k = base; k < base + 3; ++k) {
        ASSERT_TRUE(t->insert(id, Key(k), Value(100, 8)).ok());
      }
      ASSERT_TRUE(t->commit().ok());
    }
    auto audit = Blocking(*c);
    auto transfer = Blocking(*c);
    audit->start();
    auto a = audit->read(id, Key(base));
    ASSERT_TRUE(a.ok());
    // A transfer of 30 from `base` to `base + 1` commits between the audit's two reads.
    transfer->start();
    auto from = transfer->write(id, Key(base));
    auto to = transfer->write(id, Key(base + 1));
    ASSERT_TRUE(from.ok() && to.ok());
    const uint64_t f = U64(*from) - 30, t = U64(*to) + 30;
    std::memcpy(from->data(), &f, 8);
    std::memcpy(to->data(), &t, 8);
    ASSERT_TRUE(transfer->commit().ok());
    auto b = audit->read(id, Key(base + 1));
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(U64(*a) + U64(*b), 230u);  // the snapshot is inconsistent ...
    Status st = audit->commit();         // ... and must not commit
    if (skip) {
      EXPECT_TRUE(st.ok()) << st.ToString();
    } else {
      EXPECT_EQ(TxAbortReasonOf(st), TxAbortReason::kValidation) << st.ToString();
      const TxClientStats after = c->stats();
      EXPECT_GT(rpc_only ? after.rpc_validations - before.rpc_validations
                         : after.one_sided_validations - before.one_sided_validations,
                0u);
    }
    // A locked record aborts a reader ("locked"), and is readable again after the writer aborts.
    auto writer = Blocking(*c);
    writer->start();
    ASSERT_TRUE(writer->write(id, Key(base + 2)).ok());
    auto reader = Blocking(*c);
    reader->start();
    auto r = reader->read(id, Key(base + 2));
    EXPECT_EQ(TxAbortReasonOf(r.status()), TxAbortReason::kLocked) << r.status().ToString();
    ASSERT_TRUE(writer->abort().ok());
    reader->start();
    r = reader->read(id, Key(base + 2));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(reader->commit().ok());
  }
}

// Reads of the hash table validate beside writes to the records; writes to both commit
// atomically (the records' owner a prepared participant, a tx server the first); a record whose
// lease ran out refuses its prepare and nothing is installed; a data structure whose owner takes
// no part in two-phase commits is refused beside other writes, leaving every lock released.
TEST_P(TxUserDs, WritesToTheHashTableAndTheRecordsCommitTogether) {
  uint16_t id = 0;
  TxClient* c = Connect(&id);
  ASSERT_NE(c, nullptr);
  const uint16_t kv = *c->table("kv");
  Fill(*c, id, 2, 100);
  auto t = Blocking(*c);
  t->start();
  for (uint64_t k = 1; k <= 4; ++k) ASSERT_TRUE(t->insert(kv, Key(k), Value(50, 8)).ok());
  ASSERT_TRUE(t->commit().ok());
  // Hash read + record write: one participant.
  t->start();
  auto h = t->read(kv, Key(1));
  ASSERT_TRUE(h.ok());
  auto w = t->write(id, Key(1));
  ASSERT_TRUE(w.ok());
  uint64_t v = U64(*h) + 1;
  std::memcpy(w->data(), &v, 8);
  ASSERT_TRUE(t->commit().ok());
  EXPECT_EQ(site_.participant->stats().prepares, 0u);
  // Writes to kv 1..4 (both servers) and records 1, 2: all installed, every lock released.
  t->start();
  for (uint64_t k = 1; k <= 4; ++k) {
    auto wk = t->write(kv, Key(k));
    ASSERT_TRUE(wk.ok()) << wk.status().ToString();
    v = 60 + k;
    std::memcpy(wk->data(), &v, 8);
  }
  for (uint64_t k = 1; k <= 2; ++k) {
    auto wk = t->write(id, Key(k));
    ASSERT_TRUE(wk.ok()) << wk.status().ToString();
    v = 200 + k;
    std::memcpy(wk->data(), &v, 8);
  }
  Status st = t->commit();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(site_.participant->stats().prepares, 1u);
  EXPECT_EQ(site_.participant->stats().decides, 1u);
  EXPECT_EQ(site_.participant->stats().prepared, 0u);
  for (uint64_t k = 1; k <= 2; ++k) {
    EXPECT_EQ(site_.records.Peek(k).value, 200 + k);
    EXPECT_EQ(site_.records.Peek(k).lock, 0u);
  }
  t->start();
  for (uint64_t k = 1; k <= 4; ++k) {
    auto wk = t->write(kv, Key(k));  // a lock left behind would refuse this
    ASSERT_TRUE(wk.ok()) << wk.status().ToString();
    EXPECT_EQ(U64(*wk), 60 + k);
  }
  ASSERT_TRUE(t->abort().ok());
  // A record lock whose lease ran out before the commit: the owner refuses the prepare ("stale
  // commit"), the transaction aborts, nothing of it is installed.
  TxClientOptions brief;
  brief.lease = std::chrono::milliseconds(30);
  auto bt = WriteBoth(brief, 999);
  ASSERT_NE(bt, nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  st = bt->commit();
  EXPECT_EQ(TxAbortReasonOf(st), TxAbortReason::kStaleCommit) << st.ToString();
  ExpectFree(*t, kv, 61, 201);
  // The same records registered without two_phase(): writes to them and to kv are refused.
  auto one_phase = c->add_data_structure(
      "records1p", std::make_shared<RecordDs>(GetParam() == "tcp", kTxBase, false),
      site_.node->bootstrap_address(), "records");
  ASSERT_TRUE(one_phase.ok()) << one_phase.status().ToString();
  t->start();
  ASSERT_TRUE(t->write(kv, Key(1)).ok());
  ASSERT_TRUE(t->write(*one_phase, Key(2)).ok());
  st = t->commit();
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.ToString().find("two-phase commit"), std::string::npos) << st.ToString();
  t->start();
  auto after_kv = t->write(kv, Key(1));
  auto after_rec = t->write(*one_phase, Key(2));
  ASSERT_TRUE(after_kv.ok()) << after_kv.status().ToString();
  ASSERT_TRUE(after_rec.ok()) << after_rec.status().ToString();
  EXPECT_EQ(U64(*after_kv), 61u);
  EXPECT_EQ(U64(*after_rec), 202u);
  ASSERT_TRUE(t->abort().ok());
}

// Writes to two data structures and no table: server 0 keeps the decision (it holds no write),
// both owners are prepared participants.
TEST_P(TxUserDs, TwoDataStructuresCommitThroughAKeeperServer) {
  StartOwner(site2_, "records-owner-2");
  uint16_t id = 0;
  TxClient* c = Connect(&id);
  ASSERT_NE(c, nullptr);
  auto id2 = c->add_data_structure("records2", std::make_shared<RecordDs>(GetParam() == "tcp"),
                                   site2_.node->bootstrap_address(), "records");
  ASSERT_TRUE(id2.ok()) << id2.status().ToString();
  Fill(*c, id, 2, 100);
  Fill(*c, *id2, 2, 100);
  auto t = Blocking(*c);
  t->start();
  auto a = t->write(id, Key(1));
  auto b = t->write(*id2, Key(2));
  ASSERT_TRUE(a.ok() && b.ok());
  uint64_t v = 150;
  std::memcpy(a->data(), &v, 8);
  v = 50;
  std::memcpy(b->data(), &v, 8);
  Status st = t->commit();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(site_.participant->stats().prepares, 1u);
  EXPECT_EQ(site2_.participant->stats().prepares, 1u);
  EXPECT_EQ(site_.records.Peek(1).value, 150u);
  EXPECT_EQ(site2_.records.Peek(2).value, 50u);
  EXPECT_EQ(site_.records.Peek(1).lock, 0u);
  EXPECT_EQ(site2_.records.Peek(2).lock, 0u);
}

// The client dies once every participant is prepared: nothing was decided, so the owner's
// recovery thread asks the first participant (a tx server), is told "aborted" (a fence) and
// releases the pinned lock; nothing is installed anywhere.
TEST_P(TxUserDs, AClientDeadAfterThePreparesIsAbortedByTheOwnersRecovery) {
  TxDsParticipantOptions po;
  po.max_lease_ns = 400'000'000;  // recovery every 200 ms
  uint16_t id = 0, kv = 0;
  TxClient* c = StartDyingCommit(TxDieAt::kAfterPrepare, po, &id, &kv);
  ASSERT_NE(c, nullptr);
  auto t = Blocking(*c);
  EXPECT_EQ(site_.participant->stats().prepared, 1u);
  EXPECT_EQ(site_.records.Peek(1).lease, kPinned);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (site_.participant->stats().prepared != 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const TxDsParticipantStats s = site_.participant->stats();
  EXPECT_EQ(s.prepared, 0u);
  EXPECT_EQ(s.recovered_aborts, 1u);
  EXPECT_EQ(s.recovered_commits, 0u);
  // (The kv lock's lease ran out long ago: a writer takes it over and finds the old value.)
  ExpectFree(*t, kv, 50, 100);
}

// The client dies after the commit point (the first participant, a tx server, installed its
// write and recorded "commit"): the record's lock stays pinned past its lease — no other
// transaction takes it — until the owner's recovery learns "commit" and installs the write.
TEST_P(TxUserDs, ACommitDecidedBeforeTheClientDiedReachesTheOwnerByItsRecovery) {
  TxDsParticipantOptions po;
  po.recovery_thread = false;  // recover() by hand
  uint16_t id = 0, kv = 0;
  TxClient* c = StartDyingCommit(TxDieAt::kAfterFirstDecide, po, &id, &kv);
  ASSERT_NE(c, nullptr);
  auto t = Blocking(*c);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));  // past the lease
  t->start();
  auto k1 = t->read(kv, Key(1));
  ASSERT_TRUE(k1.ok()) << k1.status().ToString();
  EXPECT_EQ(U64(*k1), 777u);  // committed at the first participant
  auto r1 = t->write(id, Key(1));
  EXPECT_EQ(TxAbortReasonOf(r1.status()), TxAbortReason::kLocked) << r1.status().ToString();
  EXPECT_EQ(site_.participant->stats().prepared, 1u);
  site_.participant->recover();
  const TxDsParticipantStats s = site_.participant->stats();
  EXPECT_EQ(s.prepared, 0u);
  EXPECT_EQ(s.recovered_commits, 1u);
  EXPECT_EQ(site_.records.Peek(1).value, 777u);
  t->start();
  r1 = t->write(id, Key(1));
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_EQ(U64(*r1), 777u);
  ASSERT_TRUE(t->abort().ok());
}

// Bank: 2 threads x 4 coroutines of transfers (two read-for-updates) and audits (reads of every
// account); every committed audit sees the exact total, and it is conserved.
constexpr uint64_t kAccounts = 16;
constexpr uint64_t kInitial = 1000;

struct BankOutcome {
  std::atomic<uint64_t> transfers{0}, audits{0}, bad_audits{0}, errors{0};
};
// Account i lives at (table, key).
using Accounts = std::vector<std::pair<uint16_t, uint64_t>>;

Task<void> BankWorker(TxClient* client, Scheduler* sched, const Accounts* accounts, uint64_t seed,
                      BankOutcome* out) {
  Tx tx(*client, *sched);
  std::mt19937_64 rng(seed);
  const size_t n = accounts->size();
  for (int op = 0; op < 120; ++op) {
    const bool audit = rng() % 4 == 0;
    for (int attempt = 0; attempt < 50; ++attempt) {
      tx.start();
      Status st;
      uint64_t sum = 0;
      if (audit) {
        for (size_t a = 0; a < n && st.ok(); ++a) {
          const auto [table, key] = (*accounts)[a];
          Result<std::span<const std::byte>> r = co_await tx.read(table, Key(key));
          if (!r.ok()) {
            st = r.status();
          } else {
            sum += U64(*r);
          }
        }
      } else {
        const size_t a = rng() % n;
        size_t b = rng() % (n - 1);
        if (b >= a) ++b;
        Result<std::span<std::byte>> wa =
            co_await tx.write((*accounts)[a].first, Key((*accounts)[a].second));
        Result<std::span<std::byte>> wb = Status::Aborted("not reached");
        if (wa.ok()) wb = co_await tx.write((*accounts)[b].first, Key((*accounts)[b].second));
        if (!wa.ok() || !wb.ok()) {
          st = wa.ok() ? wb.status() : wa.status();
        } else {
          const uint64_t amount = 1 + rng() % 20, va = U64(*wa), vb = U64(*wb);
          if (va >= amount) {
            const uint64_t na = va - amount, nb = vb + amount;
            std::memcpy(wa->data(), &na, 8);
            std::memcpy(wb->data(), &nb, 8);
          }
        }
      }
      if (st.ok()) st = co_await tx.commit();
      if (st.ok()) {
        (audit ? out->audits : out->transfers).fetch_add(1);
        if (audit && sum != n * kInitial) out->bad_audits.fetch_add(1);
        break;
      }
      if (st.code() != Code::kAborted) {
        ADD_FAILURE() << st.ToString();
        out->errors.fetch_add(1);
        (void)co_await tx.abort();
        break;
      }
      co_await sched->sleep_for(std::chrono::microseconds(20 + rng() % 200));
    }
  }
}

// Runs the bank over `accounts` and checks the audits and the final total.
void RunBank(TxEnv& env, TxClient* c, BlockingTx& t, const Accounts& accounts, const char* what) {
  BankOutcome out;
  std::vector<std::thread> threads;
  for (int th = 0; th < 2; ++th) {
    threads.emplace_back([&, th] {
      auto sched = env.node->make_scheduler();
      ASSERT_TRUE(sched.ok());
      for (int k = 0; k < 4; ++k) {
        (*sched)->spawn(BankWorker(c, sched->get(), &accounts, 77 + th * 10 + k, &out));
      }
      Status st = (*sched)->run(std::chrono::seconds(120));
      EXPECT_TRUE(st.ok()) << st.ToString();
    });
  }
  for (auto& th : threads) th.join();
  t.start();
  uint64_t total = 0;
  for (const auto& [table, key] : accounts) {
    auto r = t.read(table, Key(key));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    total += U64(*r);
  }
  ASSERT_TRUE(t.commit().ok());
  const TxClientStats s = c->stats();
  std::printf(
      "%s: transfers %llu audits %llu bad %llu; one-sided hits %llu misses %llu, "
      "validations one-sided %llu rpc %llu, aborts locked %llu validation %llu\n",
      what, (unsigned long long)out.transfers.load(), (unsigned long long)out.audits.load(),
      (unsigned long long)out.bad_audits.load(), (unsigned long long)s.one_sided_hits,
      (unsigned long long)s.one_sided_misses, (unsigned long long)s.one_sided_validations,
      (unsigned long long)s.rpc_validations,
      (unsigned long long)s.aborts[static_cast<size_t>(TxAbortReason::kLocked)],
      (unsigned long long)s.aborts[static_cast<size_t>(TxAbortReason::kValidation)]);
  EXPECT_EQ(total, accounts.size() * kInitial);
  EXPECT_EQ(out.errors.load(), 0u);
  EXPECT_GT(out.transfers.load(), 0u);
  EXPECT_GT(out.audits.load(), 0u);
  EXPECT_EQ(out.bad_audits.load(), 0u);
}

TEST_P(TxUserDs, BankStressAuditsSeeTheExactTotal) {
  uint16_t id = 0;
  TxClient* c = Connect(&id);
  ASSERT_NE(c, nullptr);
  Fill(*c, id, kAccounts, kInitial);
  Accounts accounts;
  for (uint64_t k = 1; k <= kAccounts; ++k) accounts.push_back({id, k});
  auto t = Blocking(*c);
  RunBank(*env_, c, *t, accounts, GetParam().c_str());
}

// The bank over accounts in the hash table (both servers) and in the records: transfers
// between them commit by prepare / decide with the records' owner a prepared participant.
TEST_P(TxUserDs, MixedBankStressAcrossTheHashTableAndTheRecords) {
  uint16_t id = 0;
  TxClient* c = Connect(&id);
  ASSERT_NE(c, nullptr);
  const uint16_t kv = *c->table("kv");
  Fill(*c, id, kAccounts / 2, kInitial);
  auto t = Blocking(*c);
  t->start();
  for (uint64_t k = 1; k <= kAccounts / 2; ++k) {
    ASSERT_TRUE(t->insert(kv, Key(k), Value(kInitial, 8)).ok());
  }
  ASSERT_TRUE(t->commit().ok());
  Accounts accounts;
  for (uint64_t k = 1; k <= kAccounts / 2; ++k) {
    accounts.push_back({kv, k});
    accounts.push_back({id, k});
  }
  RunBank(*env_, c, *t, accounts, (GetParam() + " mixed").c_str());
  const TxDsParticipantStats s = site_.participant->stats();
  std::printf("records' owner: prepares %llu decides %llu\n", (unsigned long long)s.prepares,
              (unsigned long long)s.decides);
  EXPECT_GT(s.prepares, 0u);
  EXPECT_EQ(s.prepared, 0u);
}

// A real client process SIGKILLed after the prepares, then after the commit point (native TCP
// only, as TxRecoveryProcess): the owner's recovery aborts the first and commits the second.
class TxUserDsProcess : public TxUserDs {};

TEST_P(TxUserDsProcess, AClientProcessKilledMidCommitIsResolvedByTheOwnersRecovery) {
  TxDsParticipantOptions po;
  po.recovery_thread = false;  // recover() by hand
  uint16_t id = 0, kv = 0;
  TxClient* c = StartOneOfEach(po, &id, &kv);
  ASSERT_NE(c, nullptr);
  auto t = Blocking(*c);
  for (const std::string step : {"prepare", "decide"}) {
    SCOPED_TRACE("killed after the " + step);
    const std::vector<std::string> env = {
        "FARMEM_TX_DS_CHILD_SERVERS=" + env_->addresses[0] + "," + env_->addresses[1],
        "FARMEM_TX_DS_CHILD_OWNER=" + site_.node->bootstrap_address(),
        "FARMEM_TX_DS_CHILD_BACKEND=" + GetParam(), "FARMEM_TX_DS_CHILD_STEP=" + step};
    ASSERT_TRUE(
        KillChildAtMarker("TxUserDsChild.DISABLED_Client", env, "FARMEM_TX_DS_CHILD_AT_STEP"));
    EXPECT_EQ(site_.participant->stats().prepared, 1u);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));  // past the child's lease
    site_.participant->recover();
    EXPECT_EQ(site_.participant->stats().prepared, 0u);
    const uint64_t expected = step == "prepare" ? 100 : 777;
    EXPECT_EQ(site_.records.Peek(1).value, expected);
    EXPECT_EQ(site_.records.Peek(1).lock, 0u);
    t->start();
    auto k1 = t->write(kv, Key(1));  // its lease ran out: taken over
    ASSERT_TRUE(k1.ok()) << k1.status().ToString();
    EXPECT_EQ(U64(*k1), step == "prepare" ? 50u : 777u);
    ASSERT_TRUE(t->abort().ok());
  }
  EXPECT_EQ(site_.participant->stats().recovered_aborts, 1u);
  EXPECT_EQ(site_.participant->stats().recovered_commits, 1u);
}

// The client process of TxUserDsProcess (run only as its child: disabled otherwise): writes 777
// to kv key 1 and record 1 with TxClientFaults::die_at at the step asked, says so on stdout and
// waits to be killed.
TEST(TxUserDsChild, DISABLED_Client) {
  const char* servers = std::getenv("FARMEM_TX_DS_CHILD_SERVERS");
  const char* owner = std::getenv("FARMEM_TX_DS_CHILD_OWNER");
  const char* backend = std::getenv("FARMEM_TX_DS_CHILD_BACKEND");
  const char* step = std::getenv("FARMEM_TX_DS_CHILD_STEP");
  ASSERT_TRUE(servers && owner && backend && step) << "run by TxUserDsProcess only";
  const std::string sv = servers;
  auto node = Node::Create(node::testing::MakeConfig(backend, "tx-ds-child-client"));
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE((*node)->start().ok());
  TxClientOptions o;
  o.lease = std::chrono::milliseconds(100);
  o.faults.die_at =
      std::string(step) == "prepare" ? TxDieAt::kAfterPrepare : TxDieAt::kAfterFirstDecide;
  auto client =
      TxClient::Connect(**node, {sv.substr(0, sv.find(',')), sv.substr(sv.find(',') + 1)}, o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto id = (*client)->add_data_structure(
      "records", std::make_shared<RecordDs>(std::string(backend) == "tcp"), owner, "records");
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  auto t = BlockingTx::Create(**client, **node);
  ASSERT_TRUE(t.ok());
  (*t)->start();
  auto wk = (*t)->write(*(*client)->table("kv"), Key(1));
  auto wr = (*t)->write(*id, Key(1));
  ASSERT_TRUE(wk.ok() && wr.ok());
  const uint64_t v = 777;
  std::memcpy(wk->data(), &v, 8);
  std::memcpy(wr->data(), &v, 8);
  const Status result = (*t)->commit();
  ASSERT_EQ(result.code(), Code::kInternal) << result.ToString();
  std::printf("FARMEM_TX_DS_CHILD_AT_STEP %s\n", step);
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(60));  // SIGKILLed here
}

INSTANTIATE_TEST_SUITE_P(Backends, TxUserDs, kTxBackends, TxBackendName);
INSTANTIATE_TEST_SUITE_P(Tcp, TxUserDsProcess, ::testing::Values(std::string("tcp")),
                         TxBackendName);

}  // namespace user_ds
}  // namespace farmem::tx_test
