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

class RecordOwner final : public TxDsOwner {
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
    for (size_t i = 0; i < op.items.size(); ++i) {
      const TxDsBatchItem& e = op.items[i];
      const uint64_t r = records[i];
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
    return Status::OK();
  }

  Status Unlock(std::span<const std::byte> request) {
    FARMEM_ASSIGN_OR_RETURN(TxDsBatchRequest op, DecodeTxDsBatchRequest(request, false));
    for (const TxDsBatchItem& e : op.items) {
      const uint64_t r = Find(KeyOf(e.key));
      if (r == kRecords || Get(r, kLock) != op.txid) continue;  // already released or taken over
      const bool reserved = Get(r, kLive) == 0;
      Change(r, [&](auto set) {
        if (reserved) set(kKey, 0);  // an insert that did not commit frees its record
        set(kLock, 0);
        set(kLease, 0);
      });
    }
    return Status::OK();
  }

  std::mutex mu_;
  uint64_t* words_ = nullptr;
};

// Client callbacks: key k is guessed at record (k - 1) % N, or at the address an RPC lookup
// returned (cached, shared by every thread: a mutex). Copies are checked like the hash table's:
// ordered (native TCP) seq even and equal to tail; else the seqlock words around the copy too.
class RecordDs final : public TxDsClient {
 public:
  explicit RecordDs(bool ordered, uint16_t base = kTxBase) : ordered_(ordered), base_(base) {}

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

 private:
  TxDsStep ReadAt(uint64_t offset) const {
    TxDsStep s;
    s.kind = TxDsStep::kRead;
    s.read = {offset, static_cast<uint32_t>(kRecordBytes), !ordered_};
    return s;
  }
  const bool ordered_;
  const uint16_t base_;
  std::mutex mu_;
  std::map<uint64_t, uint64_t> cache_;
};

// One tx server (a hash table "kv", 8-byte keys and values) plus the records' owner node.
class TxUserDs : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_NE(owner_.memory(), nullptr);
    env_ = TxEnv::Start(GetParam(), 1, {"kv:8:8:64:2"});
    ASSERT_NE(env_->node, nullptr);
    auto node = Node::Create(node::testing::MakeConfig(GetParam(), "records-owner"));
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    owner_node_ = std::move(*node);
    auto region = owner_node_->export_region("records", owner_.memory(), RecordOwner::kBytes,
                                             Access::kReadOnly);
    ASSERT_TRUE(region.ok()) << region.status().ToString();
    for (uint16_t op : {kLookupOp, static_cast<uint16_t>(kTxBase + kTxDsLock),
                        static_cast<uint16_t>(kTxBase + kTxDsLockInsert),
                        static_cast<uint16_t>(kTxBase + kTxDsValidate),
                        static_cast<uint16_t>(kTxBase + kTxDsCommit),
                        static_cast<uint16_t>(kTxBase + kTxDsUnlock)}) {
      ASSERT_TRUE(owner_node_
                      ->register_rpc(op,
                                     [this](const RpcCall& call, std::vector<std::byte>& reply) {
                                       return owner_.rpc_handler(call.opcode, call.request, reply);
                                     })
                      .ok());
    }
    ASSERT_TRUE(owner_node_->start().ok());
  }
  void TearDown() override {
    clients_.clear();
    env_.reset();
    if (owner_node_) owner_node_->stop();
  }
  // A client with the records registered; *id gets their table id.
  TxClient* Connect(uint16_t* id, TxClientOptions options = {}) {
    auto c = env_->Connect(options);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return nullptr;
    auto ds = std::make_shared<RecordDs>(GetParam() == "tcp");
    auto r = (*c)->add_data_structure("records", ds, owner_node_->bootstrap_address(), "records");
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return nullptr;
    *id = *r;
    clients_.push_back(std::move(*c));
    return clients_.back().get();
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

  RecordOwner owner_;
  std::unique_ptr<TxEnv> env_;
  std::unique_ptr<Node> owner_node_;
  std::vector<std::unique_ptr<TxClient>> clients_;
};

TEST_P(TxUserDs, RegistrationChecksTheDataStructureAndItsOwner) {
  auto c = env_->Connect();
  ASSERT_TRUE(c.ok());
  const std::string owner = owner_node_->bootstrap_address();
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
  // Its five opcodes must fit under 65536: base 65531 does (65531..65535), 65532 does not; 0
  // means lookups only.
  EXPECT_EQ(
      (*c)->add_data_structure("top", std::make_shared<RecordDs>(true, 65532), owner, "records")
          .status()
          .code(),
      Code::kInvalidArgument);
  EXPECT_EQ((*c)->add_data_structure("zero", std::make_shared<RecordDs>(true, 0), owner, "records")
                .status()
                .code(),
            Code::kInvalidArgument);
  EXPECT_TRUE(
      (*c)->add_data_structure("high", std::make_shared<RecordDs>(true, 65531), owner, "records")
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

// Reads of the hash table validate beside writes to the records; writes to both are refused
// (no two-phase commit with a user data structure) and leave every lock released.
TEST_P(TxUserDs, MixesWithTheHashTableWhereOneParticipantWrites) {
  uint16_t id = 0;
  TxClient* c = Connect(&id);
  ASSERT_NE(c, nullptr);
  const uint16_t kv = *c->table("kv");
  Fill(*c, id, 2, 100);
  auto t = Blocking(*c);
  t->start();
  ASSERT_TRUE(t->insert(kv, Key(1), Value(50, 8)).ok());
  ASSERT_TRUE(t->commit().ok());
  // Hash read + record write: commits.
  t->start();
  auto h = t->read(kv, Key(1));
  ASSERT_TRUE(h.ok());
  auto w = t->write(id, Key(1));
  ASSERT_TRUE(w.ok());
  const uint64_t v = U64(*h) + 1;
  std::memcpy(w->data(), &v, 8);
  ASSERT_TRUE(t->commit().ok());
  // Writes to both: refused, nothing installed, both locks released.
  t->start();
  ASSERT_TRUE(t->write(kv, Key(1)).ok());
  ASSERT_TRUE(t->write(id, Key(2)).ok());
  Status st = t->commit();
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.ToString().find("two-phase commit"), std::string::npos) << st.ToString();
  t->start();
  auto after_kv = t->write(kv, Key(1));
  auto after_rec = t->write(id, Key(2));
  ASSERT_TRUE(after_kv.ok()) << after_kv.status().ToString();
  ASSERT_TRUE(after_rec.ok()) << after_rec.status().ToString();
  EXPECT_EQ(U64(*after_kv), 50u);
  EXPECT_EQ(U64(*after_rec), 100u);
  ASSERT_TRUE(t->abort().ok());
  t->start();
  auto rec1 = t->read(id, Key(1));
  ASSERT_TRUE(rec1.ok());
  EXPECT_EQ(U64(*rec1), 51u);
  ASSERT_TRUE(t->commit().ok());
}

// Bank over the records: 2 threads x 4 coroutines of transfers (two read-for-updates) and audits
// (reads of every account); every committed audit sees the exact total, and it is conserved.
constexpr uint64_t kAccounts = 16;
constexpr uint64_t kInitial = 1000;

struct BankOutcome {
  std::atomic<uint64_t> transfers{0}, audits{0}, bad_audits{0}, errors{0};
};

Task<void> BankWorker(TxClient* client, Scheduler* sched, uint16_t id, uint64_t seed,
                      BankOutcome* out) {
  Tx tx(*client, *sched);
  std::mt19937_64 rng(seed);
  for (int op = 0; op < 120; ++op) {
    const bool audit = rng() % 4 == 0;
    for (int attempt = 0; attempt < 50; ++attempt) {
      tx.start();
      Status st;
      uint64_t sum = 0;
      if (audit) {
        for (uint64_t a = 1; a <= kAccounts && st.ok(); ++a) {
          Result<std::span<const std::byte>> r = co_await tx.read(id, Key(a));
          if (!r.ok()) {
            st = r.status();
          } else {
            sum += U64(*r);
          }
        }
      } else {
        const uint64_t a = 1 + rng() % kAccounts;
        uint64_t b = 1 + rng() % (kAccounts - 1);
        if (b >= a) ++b;
        Result<std::span<std::byte>> wa = co_await tx.write(id, Key(a));
        Result<std::span<std::byte>> wb = Status::Aborted("not reached");
        if (wa.ok()) wb = co_await tx.write(id, Key(b));
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
        if (audit && sum != kAccounts * kInitial) out->bad_audits.fetch_add(1);
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

TEST_P(TxUserDs, BankStressAuditsSeeTheExactTotal) {
  uint16_t id = 0;
  TxClient* c = Connect(&id);
  ASSERT_NE(c, nullptr);
  Fill(*c, id, kAccounts, kInitial);
  BankOutcome out;
  std::vector<std::thread> threads;
  for (int th = 0; th < 2; ++th) {
    threads.emplace_back([&, th] {
      auto sched = env_->node->make_scheduler();
      ASSERT_TRUE(sched.ok());
      for (int k = 0; k < 4; ++k) {
        (*sched)->spawn(BankWorker(c, sched->get(), id, 77 + th * 10 + k, &out));
      }
      Status st = (*sched)->run(std::chrono::seconds(120));
      EXPECT_TRUE(st.ok()) << st.ToString();
    });
  }
  for (auto& t : threads) t.join();
  auto t = Blocking(*c);
  t->start();
  uint64_t total = 0;
  for (uint64_t a = 1; a <= kAccounts; ++a) {
    auto r = t->read(id, Key(a));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    total += U64(*r);
  }
  ASSERT_TRUE(t->commit().ok());
  const TxClientStats s = c->stats();
  std::printf(
      "%s: transfers %llu audits %llu bad %llu; one-sided hits %llu misses %llu, "
      "validations one-sided %llu rpc %llu, aborts locked %llu validation %llu\n",
      GetParam().c_str(), (unsigned long long)out.transfers.load(),
      (unsigned long long)out.audits.load(), (unsigned long long)out.bad_audits.load(),
      (unsigned long long)s.one_sided_hits, (unsigned long long)s.one_sided_misses,
      (unsigned long long)s.one_sided_validations, (unsigned long long)s.rpc_validations,
      (unsigned long long)s.aborts[static_cast<size_t>(TxAbortReason::kLocked)],
      (unsigned long long)s.aborts[static_cast<size_t>(TxAbortReason::kValidation)]);
  EXPECT_EQ(total, kAccounts * kInitial);
  EXPECT_EQ(out.errors.load(), 0u);
  EXPECT_GT(out.transfers.load(), 0u);
  EXPECT_GT(out.audits.load(), 0u);
  EXPECT_EQ(out.bad_audits.load(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, TxUserDs, kTxBackends, TxBackendName);

}  // namespace user_ds
}  // namespace farmem::tx_test
