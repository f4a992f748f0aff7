// Failure tests of multi-participant commit (docs/tx.md "Multi-participant commit"): a client
// that dies (test fault TxClientFaults::die_at: its sends stop at the exact step; in-process, and
// as a separate process then SIGKILLed) holding locks, after the prepares and after the first
// decision, between two partitions; the bank invariant must hold and every lock be freed. With
// the protection removed (one_phase_commit: no prepare / decide; TxTableFaults::no_prepare_pin:
// prepared locks expire) the transfer is torn. Also a stopped server (errors, never a hang), a
// dead first participant (prepared locks stay: 2PC blocks; a peer that learned the outcome or
// never voted settles it) and the decision fence of TX_STATUS.
// FARMEM_TX_FAULT=one_phase|no_pin runs the die tests with that protection removed (they then
// fail), FARMEM_TX_FAULT=no_learned|no_fence the peer tests. Main thread plus the servers'
// threads (and a child process of this binary).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "farmem/tx.h"
#include "tx/client/tx_test_env.h"
#include "tx/format/tx_layout.h"
#include "tx/format/tx_wire.h"
#include "tx/service/tx_cluster_test_util.h"

namespace farmem::tx_test {
namespace {

namespace wire = tx_wire;
using std::chrono::milliseconds;

constexpr uint32_t kLeaseMs = 100;  // server cap and client lease: recovery starts ~100 ms after
constexpr uint64_t kRecoveryAccounts = 8;
constexpr uint64_t kStart = 100;
constexpr uint64_t kAmount = 30;

std::string Fault() {
  const char* e = std::getenv("FARMEM_TX_FAULT");
  return e ? e : "";
}

// Moves kAmount from `from` to `to` in one transaction of `tx` (aborted on an error). An abort
// ("stale commit" when a slow machine let the 100 ms lease run out before the commit, "locked")
// leaves nothing behind and is tried again: the tests check outcomes, not timing.
Status Transfer(BlockingTx& tx, uint64_t from, uint64_t to) {
  Status st = Status::Aborted("not tried");
  for (int i = 0; i < 50 && st.code() == Code::kAborted; ++i) {
    tx.start();
    auto wf = tx.write(0, Key(from));
    auto wt = wf.ok() ? tx.write(0, Key(to)) : Result<std::span<std::byte>>(wf.status());
    if (!wt.ok()) {
      (void)tx.abort();
      st = wt.status();
      continue;
    }
    const uint64_t nf = U64(*wf) - kAmount, nt = U64(*wt) + kAmount;
    std::memcpy(wf->data(), &nf, 8);
    std::memcpy(wt->data(), &nt, 8);
    st = tx.commit();
  }
  return st;
}

class TxRecovery : public ::testing::TestWithParam<std::string> {
 protected:
  void Start(tx::TxTableOptions options = {}, milliseconds op_timeout = milliseconds(2000)) {
    if (Fault() == "no_pin") options.faults.no_prepare_pin = true;
    if (!Fault().empty()) std::printf("[ fault    ] FARMEM_TX_FAULT=%s\n", Fault().c_str());
    cluster_ = TxCluster::Start(GetParam(), 2, {"acct:8:8:64:4"}, kLeaseMs, options, op_timeout);
    ASSERT_TRUE(cluster_->node);
    client_ = Client({});
    ASSERT_TRUE(client_);
    auto t = BlockingTx::Create(*client_, *cluster_->node);
    ASSERT_TRUE(t.ok());
    tx_ = std::move(*t);
    const tx::TxGeometry& g = cluster_->servers[0].service->table(0).geometry();
    for (uint64_t k = 0; k < kRecoveryAccounts; ++k) {
      std::vector<std::byte> v(8);
      std::memcpy(v.data(), &kStart, 8);
      Status st = Status::Aborted("not yet");
      // A slow machine may let the 100 ms lease run out before the commit: insert again.
      for (int i = 0; i < 50 && st.code() == Code::kAborted; ++i) {
        tx_->start();
        st = tx_->insert(0, Key(k), v);
        if (st.ok()) st = tx_->commit();
      }
      ASSERT_TRUE(st.ok()) << st.ToString();
      const uint32_t part = tx::PlaceKey(g, tx::HashKey(Key(k), g.hash_seed)).partition;
      if (part == 0 && a_ == kRecoveryAccounts) a_ = k;
      if (part == 1 && b_ == kRecoveryAccounts) b_ = k;
    }
    ASSERT_LT(a_, kRecoveryAccounts) << "no account on partition 0";
    ASSERT_LT(b_, kRecoveryAccounts) << "no account on partition 1";
  }
  std::unique_ptr<TxClient> Client(TxClientFaults faults) {
    TxClientOptions o;
    o.lease = milliseconds(kLeaseMs);
    o.faults = faults;
    if (Fault() == "one_phase") o.faults.one_phase_commit = true;
    auto c = cluster_->Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  // Transfer (below) on a BlockingTx of `client`.
  Status Transfer(TxClient& client, uint64_t from, uint64_t to) {
    auto t = BlockingTx::Create(client, *cluster_->node);
    if (!t.ok()) return t.status();
    return ::farmem::tx_test::Transfer(**t, from, to);
  }
  uint64_t Stat(size_t server, const char* key) {
    return cluster_->servers[server].service->Stats()[key].get<uint64_t>();
  }
  uint64_t LockedItems(size_t server) {
    return cluster_->servers[server].service->Stats()["tables"][0]["locked_items"].get<uint64_t>();
  }
  // Waits (generously: no timing is asserted) until no server holds a lock, then audits every
  // account in one transaction. Prints how long the locks took to go.
  std::vector<uint64_t> BalancesWhenFree() {
    const auto t0 = std::chrono::steady_clock::now();
    const auto deadline = t0 + std::chrono::seconds(30);
    while (LockedItems(0) + LockedItems(1) != 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "locks still held after 30 s";
        return {};
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    std::printf("[ info     ] locks freed %lld ms after the client died (lease %u ms)\n",
                static_cast<long long>(
                    std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0)
                        .count()),
                kLeaseMs);
    std::vector<uint64_t> out;
    tx_->start();
    for (uint64_t k = 0; k < kRecoveryAccounts; ++k) {
      auto r = tx_->read(0, Key(k));
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      out.push_back(r.ok() ? U64(*r) : 0);
    }
    Status st = tx_->commit();
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  }
  // The bank invariant: total kept, nothing negative (no underflow of the u64 balances).
  static uint64_t Total(const std::vector<uint64_t>& b) {
    uint64_t total = 0;
    for (uint64_t v : b) {
      EXPECT_LE(v, kRecoveryAccounts * kStart) << "a balance went negative";
      total += v;
    }
    return total;
  }
  // The transfer left no trace / was installed everywhere; the bank invariant either way.
  void ExpectUnchanged(const std::vector<uint64_t>& b) {
    ASSERT_EQ(b.size(), kRecoveryAccounts);
    EXPECT_EQ(Total(b), kRecoveryAccounts * kStart);
    EXPECT_EQ(b[a_], kStart);
    EXPECT_EQ(b[b_], kStart);
  }
  void ExpectTransferred(const std::vector<uint64_t>& b) {
    ASSERT_EQ(b.size(), kRecoveryAccounts);
    EXPECT_EQ(Total(b), kRecoveryAccounts * kStart);
    EXPECT_EQ(b[a_], kStart - kAmount);
    EXPECT_EQ(b[b_], kStart + kAmount);
  }
  // A client of fault `at` transfers a_ -> b_ and dies there; returns the balances once free.
  std::vector<uint64_t> DieAt(TxDieAt at, TxClientFaults faults = {}) {
    faults.die_at = at;
    auto dying = Client(faults);
    if (!dying) return {};
    Status st = Transfer(*dying, a_, b_);
    EXPECT_EQ(st.code(), Code::kInternal) << st.ToString();
    return BalancesWhenFree();
  }

  // A separate client process (this binary, running TxRecoveryChild.DISABLED_Client) transfers
  // a_ -> b_ and stops at `step` ("holding" / "prepare" / "decide"); once it says so it is
  // killed with SIGKILL (the kernel closes its connections). Returns the balances once free.
  std::vector<uint64_t> KillProcessAt(const std::string& step) {
    const std::vector<std::string> env = {
        "FARMEM_TX_CHILD_SERVERS=" + cluster_->addresses[0] + "," + cluster_->addresses[1],
        "FARMEM_TX_CHILD_BACKEND=" + GetParam(), "FARMEM_TX_CHILD_STEP=" + step,
        "FARMEM_TX_CHILD_KEYS=" + std::to_string(a_) + "," + std::to_string(b_)};
    if (!KillChildAtMarker("TxRecoveryChild.DISABLED_Client", env, "FARMEM_TX_CHILD_AT_STEP")) {
      return {};
    }
    return BalancesWhenFree();
  }

  std::unique_ptr<TxCluster> cluster_;
  std::unique_ptr<TxClient> client_;
  std::unique_ptr<BlockingTx> tx_;
  uint64_t a_ = kRecoveryAccounts;  // an account on partition 0 (the first participant)
  uint64_t b_ = kRecoveryAccounts;  // an account on partition 1 (prepared)
};

TEST_P(TxRecovery, AClientDyingHoldingLocksChangesNothingAndItsLocksExpire) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ExpectUnchanged(DieAt(TxDieAt::kHoldingLocks));
  EXPECT_EQ(Stat(0, "prepares") + Stat(1, "prepares"), 0u);
}

TEST_P(TxRecovery, AClientDyingAfterThePreparesIsAbortedEverywhere) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ExpectUnchanged(DieAt(TxDieAt::kAfterPrepare));
  if (Fault().empty()) {
    // The prepared participant asked the first one, which fenced the transaction as aborted.
    EXPECT_EQ(Stat(1, "recovered_aborts"), 1u);
    EXPECT_EQ(Stat(0, "statuses"), 1u);
  }
  // The dead client's transaction can no longer commit at the first participant.
  EXPECT_TRUE(Transfer(*client_, a_, b_).ok());
}

TEST_P(TxRecovery, AClientDyingAfterTheFirstDecisionIsCommittedEverywhere) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ExpectTransferred(DieAt(TxDieAt::kAfterFirstDecide));
  if (Fault().empty()) {
    EXPECT_EQ(Stat(1, "recovered_commits"), 1u);
  }
}

// The same three steps with a real client process SIGKILLed there (native TCP only: the fabric
// shm runs take seconds longer and add nothing the in-process tests do not check).
class TxRecoveryProcess : public TxRecovery {};

TEST_P(TxRecoveryProcess, AClientProcessKilledHoldingLocksChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ExpectUnchanged(KillProcessAt("holding"));
}

TEST_P(TxRecoveryProcess, AClientProcessKilledAfterThePreparesIsAbortedEverywhere) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ExpectUnchanged(KillProcessAt("prepare"));
  if (Fault().empty()) {
    EXPECT_EQ(Stat(1, "recovered_aborts"), 1u);
  }
}

TEST_P(TxRecoveryProcess, AClientProcessKilledAfterTheFirstDecisionIsCommittedEverywhere) {
  ASSERT_NO_FATAL_FAILURE(Start());
  ExpectTransferred(KillProcessAt("decide"));
  if (Fault().empty()) {
    EXPECT_EQ(Stat(1, "recovered_commits"), 1u);
  }
}

// The protection removed, deterministically: without prepare / decide, a client dying after its
// first TX_COMMIT leaves half a transfer installed — what issue 12 called "partial commit".
TEST_P(TxRecovery, WithoutPrepareDecideAClientDyingBetweenCommitsTearsTheTransfer) {
  ASSERT_NO_FATAL_FAILURE(Start());
  TxClientFaults f;
  f.one_phase_commit = true;
  const auto b = DieAt(TxDieAt::kAfterFirstDecide, f);
  ASSERT_EQ(b.size(), kRecoveryAccounts);
  EXPECT_NE(Total(b), kRecoveryAccounts * kStart);
  EXPECT_EQ(b[a_] + b[b_], 2 * kStart - kAmount);
}

// Prepared locks not pinned: they expire with the lease, so when the prepared participant learns
// "commit" its locks are gone and the commit cannot install — half the transfer is lost.
TEST_P(TxRecovery, WithoutPinningAPreparedParticipantLosesTheCommittedWrite) {
  tx::TxTableOptions o;
  o.faults.no_prepare_pin = true;
  ASSERT_NO_FATAL_FAILURE(Start(o));
  const auto b = DieAt(TxDieAt::kAfterFirstDecide);
  ASSERT_EQ(b.size(), kRecoveryAccounts);
  EXPECT_NE(Total(b), kRecoveryAccounts * kStart);
  EXPECT_EQ(b[b_], kStart);
}

// 2PC blocks when the decision's keeper is gone: the prepared participant keeps its locks and
// keeps asking (it must not guess: the first participant may have committed).
TEST_P(TxRecovery, APreparedParticipantKeepsItsLocksWhileTheFirstParticipantIsDown) {
  ASSERT_NO_FATAL_FAILURE(Start({}, milliseconds(500)));
  TxClientFaults f;
  f.die_at = TxDieAt::kAfterPrepare;
  auto dying = Client(f);
  ASSERT_TRUE(dying);
  cluster_->HoldRecovery(1);
  EXPECT_EQ(Transfer(*dying, a_, b_).code(), Code::kInternal);
  cluster_->Stop(0);
  ASSERT_TRUE(cluster_->ResumeRecovery(1).ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (Stat(1, "recovery_unreachable") == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  ASSERT_GE(Stat(1, "recovery_unreachable"), 1u);
  EXPECT_EQ(Stat(1, "prepared"), 1u);
  EXPECT_EQ(LockedItems(1), 1u);
}

TEST_P(TxRecovery, AStoppedServerGivesErrorsNotAHang) {
  ASSERT_NO_FATAL_FAILURE(Start({}, milliseconds(500)));
  cluster_->Stop(1);
  tx_->start();
  auto r = tx_->read(0, Key(b_));
  EXPECT_FALSE(r.ok());
  std::printf("[ info     ] read on the stopped server: %s\n", r.status().ToString().c_str());
  (void)tx_->abort();
  Status st = Transfer(*client_, a_, b_);
  EXPECT_FALSE(st.ok());
  std::printf("[ info     ] transfer to the stopped server: %s\n", st.ToString().c_str());
  // The live partition still serves.
  tx_->start();
  auto live = tx_->read(0, Key(a_));
  EXPECT_TRUE(live.ok()) << live.status().ToString();
  EXPECT_TRUE(tx_->commit().ok());
}

// TX_STATUS at the first participant fences an undecided transaction: its later commit there is
// refused, and so is a first participant's commit after its lease ran out.
TEST_P(TxRecovery, TheStatusFenceAndTheLeaseRefuseALateCommit) {
  ASSERT_NO_FATAL_FAILURE(Start());
  TxService& s0 = *cluster_->servers[0].service;
  const auto call = [&](uint16_t op, const std::vector<std::byte>& body,
                        std::vector<std::byte>* reply) {
    std::vector<std::byte> r;
    Status st = s0.Handle(RpcCall{op, body, "test"}, r);
    if (reply) *reply = r;
    return st;
  };
  const auto key = Key(a_);
  std::vector<std::byte> value(8, std::byte{7});
  const wire::TwoPhaseEntry items[] = {{wire::kWrite, 0, key, value}};
  const std::vector<std::string> none;
  // Fenced: txid 901 holds the lock, but a participant asked first.
  ASSERT_TRUE(
      call(wire::kOpLock, wire::EncodeKeyRequest(0, key, 901, 10'000'000'000), nullptr).ok());
  std::vector<std::byte> reply;
  ASSERT_TRUE(call(wire::kOpStatus, EncodeStruct(wire::StatusRequest{901}), &reply).ok());
  EXPECT_EQ(wire::DecodeStatusReply(reply)->outcome, wire::kDecideAbort);
  Status st =
      call(wire::kOpDecide,
           wire::EncodeTwoPhaseRequest(901, 0, wire::kDecideCommit, 2, none, items), nullptr);
  EXPECT_EQ(TxAbortReasonOf(st), TxAbortReason::kStaleCommit) << st.ToString();
  EXPECT_EQ(LockedItems(0), 0u);
  // Committed: the status says so (and stays so).
  // (The lease is 100 ms: a slow machine may let it run out between lock and decide; then the
  // decide is refused and a fresh transaction id tries again.)
  uint64_t committed = 0;
  for (uint64_t txid = 902; txid < 950 && committed == 0; ++txid) {
    ASSERT_TRUE(
        call(wire::kOpLock, wire::EncodeKeyRequest(0, key, txid, 10'000'000'000), nullptr).ok());
    if (call(wire::kOpDecide,
             wire::EncodeTwoPhaseRequest(txid, 0, wire::kDecideCommit, 2, none, items), nullptr)
            .ok()) {
      committed = txid;
    }
  }
  ASSERT_NE(committed, 0u);
  ASSERT_TRUE(call(wire::kOpStatus, EncodeStruct(wire::StatusRequest{committed}), &reply).ok());
  EXPECT_EQ(wire::DecodeStatusReply(reply)->outcome, wire::kDecideCommit);
  // A lease that ran out: refused, recorded as aborted.
  ASSERT_TRUE(call(wire::kOpLock, wire::EncodeKeyRequest(0, key, 953, 1'000'000), nullptr).ok());
  std::this_thread::sleep_for(milliseconds(20));
  st = call(wire::kOpDecide,
            wire::EncodeTwoPhaseRequest(953, 0, wire::kDecideCommit, 2, none, items), nullptr);
  EXPECT_EQ(TxAbortReasonOf(st), TxAbortReason::kStaleCommit) << st.ToString();
  ASSERT_TRUE(call(wire::kOpStatus, EncodeStruct(wire::StatusRequest{953}), &reply).ok());
  EXPECT_EQ(wire::DecodeStatusReply(reply)->outcome, wire::kDecideAbort);
  // A decision for a transaction never prepared here; a prepare naming an unknown table.
  EXPECT_EQ(call(wire::kOpDecide,
                 wire::EncodeTwoPhaseRequest(904, 0, wire::kDecideCommit, 0, none, {}), nullptr)
                .code(),
            Code::kFailedPrecondition);
  EXPECT_TRUE(call(wire::kOpDecide,
                   wire::EncodeTwoPhaseRequest(904, 0, wire::kDecideAbort, 0, none, {}), nullptr)
                  .ok());
  const std::vector<std::string> parts = {"127.0.0.1:1", "127.0.0.1:2"};
  const wire::TwoPhaseEntry bad[] = {{wire::kWrite, 9, key, value}};
  EXPECT_EQ(
      call(wire::kOpPrepare, wire::EncodeTwoPhaseRequest(905, 1000, 0, 0, parts, bad), nullptr)
          .code(),
      Code::kNotFound);
}

// Recovery through the peers (docs/tx.md "Multi-participant commit", step 5): three servers, the
// 2PC steps sent by hand (TX_LOCK / TX_PREPARE / TX_DECIDE through the handlers) as a client
// that dies part way, then the first participant (server 0) stopped.
class TxPeerRecovery : public ::testing::TestWithParam<std::string> {
 protected:
  // Server cap 2 s (the reaper runs each second): the locks taken by hand cannot run out before
  // their prepare on a slow machine. The prepares ask for 50 ms: recovery starts at the next
  // reaper step.
  static constexpr uint32_t kServerLeaseMs = 2000;
  static constexpr uint64_t kPrepareLeaseNs = 50'000'000;
  static constexpr uint64_t kLockLeaseNs = 10'000'000'000;

  void SetUp() override {
    tx::TxTableOptions options;
    if (Fault() == "no_learned") options.faults.no_learned_outcome = true;
    if (Fault() == "no_fence") options.faults.no_prepare_fence = true;
    if (!Fault().empty()) std::printf("[ fault    ] FARMEM_TX_FAULT=%s\n", Fault().c_str());
    cluster_ = TxCluster::Start(GetParam(), 3, {"acct:8:8:64:4"}, kServerLeaseMs, options,
                                milliseconds(500));
    ASSERT_TRUE(cluster_->node);
    auto client = cluster_->Connect({});
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    auto tx = BlockingTx::Create(**client, *cluster_->node);
    ASSERT_TRUE(tx.ok());
    // One account per partition, each kStart.
    const tx::TxGeometry& g = cluster_->servers[0].service->table(0).geometry();
    std::vector<std::byte> v(8);
    std::memcpy(v.data(), &kStart, 8);
    for (uint64_t k = 0; k < 64 && (key_[0] == 0 || key_[1] == 0 || key_[2] == 0); ++k) {
      const uint32_t part = tx::PlaceKey(g, tx::HashKey(Key(k), g.hash_seed)).partition;
      if (key_[part] != 0) continue;
      (*tx)->start();
      Status st = (*tx)->insert(0, Key(k), v);
      if (st.ok()) st = (*tx)->commit();
      ASSERT_TRUE(st.ok()) << st.ToString();
      key_[part] = k;
    }
    ASSERT_TRUE(key_[0] != 0 && key_[1] != 0 && key_[2] != 0) << "a partition without a key";
  }

  Status Call(size_t server, uint16_t op, const std::vector<std::byte>& body,
              std::vector<std::byte>* reply = nullptr) {
    std::vector<std::byte> r;
    // Through the data-structure interface's owner callback (TxService's is Handle).
    tx::TxDsOwner& owner = *cluster_->servers[server].service;
    Status st = owner.rpc_handler(op, body, r);
    if (reply) *reply = r;
    return st;
  }
  Status Lock(size_t server, uint64_t txid) {
    return Call(server, wire::kOpLock,
                wire::EncodeKeyRequest(0, Key(key_[server]), txid, kLockLeaseNs));
  }
  // TX_PREPARE to `server` of its account := kStart + kAmount, naming all three participants.
  Status Prepare(size_t server, uint64_t txid) {
    const auto key = Key(key_[server]);
    const uint64_t nv = kStart + kAmount;
    std::vector<std::byte> value(8);
    std::memcpy(value.data(), &nv, 8);
    const wire::TwoPhaseEntry items[] = {{wire::kWrite, 0, key, value}};
    return Call(
        server, wire::kOpPrepare,
        wire::EncodeTwoPhaseRequest(txid, kPrepareLeaseNs, 0, 0, cluster_->addresses, items));
  }
  uint64_t Value(size_t server) {
    std::vector<std::byte> reply;
    Status st =
        Call(server, wire::kOpLookup, wire::EncodeKeyRequest(0, Key(key_[server]), 0, 0), &reply);
    if (!st.ok()) return 0;
    auto r = wire::DecodeItemReply(reply, 8);
    return r.ok() ? U64(r->value) : 0;
  }
  uint64_t Stat(size_t server, const char* key) {
    return cluster_->servers[server].service->Stats()[key].get<uint64_t>();
  }
  // Waits (generously: no timing is asserted) until `server` holds no prepared transaction.
  void WaitResolved(size_t server) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (Stat(server, "prepared") != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));
    }
  }

  std::unique_ptr<TxCluster> cluster_;
  uint64_t key_[3] = {};  // the account on partition i (never key 0: it is probed first)
};

// The client committed at the first participant and told server 1, then died; the first
// participant is down. Server 2 learns "committed" from server 1 (without that record server 1
// would fence and answer "aborted", and the transfer would be torn).
TEST_P(TxPeerRecovery, APreparedParticipantLearnsTheCommitFromAPeerWhenTheFirstIsDown) {
  const uint64_t txid = 7001;
  cluster_->HoldRecovery(1);  // its TX_DECIDE is sent by hand below
  cluster_->HoldRecovery(2);
  for (size_t s = 0; s < 3; ++s) ASSERT_TRUE(Lock(s, txid).ok()) << s;
  ASSERT_TRUE(Prepare(1, txid).ok());
  ASSERT_TRUE(Prepare(2, txid).ok());
  const auto key0 = Key(key_[0]);
  const uint64_t nv = kStart + kAmount;
  std::vector<std::byte> value(8);
  std::memcpy(value.data(), &nv, 8);
  const wire::TwoPhaseEntry own[] = {{wire::kWrite, 0, key0, value}};
  const std::vector<std::string> none;
  ASSERT_TRUE(Call(0, wire::kOpDecide,
                   wire::EncodeTwoPhaseRequest(txid, 0, wire::kDecideCommit, 3, none, own))
                  .ok());
  cluster_->Stop(0);
  ASSERT_TRUE(Call(1, wire::kOpDecide,
                   wire::EncodeTwoPhaseRequest(txid, 0, wire::kDecideCommit, 0, none, {}))
                  .ok());
  EXPECT_EQ(Value(1), kStart + kAmount);
  ASSERT_TRUE(cluster_->ResumeRecovery(2).ok());
  WaitResolved(2);
  EXPECT_EQ(Stat(2, "prepared"), 0u);
  EXPECT_EQ(Stat(2, "recovered_from_peers"), 1u);
  EXPECT_EQ(Stat(2, "recovered_commits"), 1u);
  EXPECT_EQ(Value(2), kStart + kAmount) << "server 2 aborted a transaction server 1 committed";
  EXPECT_EQ(cluster_->servers[2].service->Stats()["tables"][0]["locked_items"], 0u);
}

// The client prepared server 1 only, then died (server 2 never voted); the first participant is
// down. Server 2 fences the transaction and answers "aborted", server 1 aborts, and the late
// prepare at server 2 is refused (without the fence it would succeed, and a commit could follow).
TEST_P(TxPeerRecovery, APeerThatNeverVotedFencesAndAbortsTheTransaction) {
  const uint64_t txid = 7002;
  cluster_->HoldRecovery(1);
  ASSERT_TRUE(Lock(1, txid).ok());
  ASSERT_TRUE(Lock(2, txid).ok());
  ASSERT_TRUE(Prepare(1, txid).ok());
  cluster_->Stop(0);
  ASSERT_TRUE(cluster_->ResumeRecovery(1).ok());
  WaitResolved(1);
  EXPECT_EQ(Stat(1, "prepared"), 0u);
  EXPECT_EQ(Stat(1, "recovered_from_peers"), 1u);
  EXPECT_EQ(Stat(1, "recovered_aborts"), 1u);
  EXPECT_EQ(Value(1), kStart);
  EXPECT_EQ(cluster_->servers[1].service->Stats()["tables"][0]["locked_items"], 0u);
  const Status late = Prepare(2, txid);
  EXPECT_EQ(TxAbortReasonOf(late), TxAbortReason::kStaleCommit) << late.ToString();
  EXPECT_EQ(cluster_->servers[2].service->Stats()["tables"][0]["locked_items"], 0u);
  EXPECT_EQ(Stat(2, "prepared"), 0u);
}

// TX_STATUS at a prepared, undecided participant says so and fences nothing.
TEST_P(TxPeerRecovery, AnUndecidedParticipantAnswersUndecided) {
  const uint64_t txid = 7003;
  ASSERT_TRUE(Lock(1, txid).ok());
  ASSERT_TRUE(Prepare(1, txid).ok());
  std::vector<std::byte> reply;
  ASSERT_TRUE(Call(1, wire::kOpStatus, EncodeStruct(wire::StatusRequest{txid}), &reply).ok());
  EXPECT_EQ(wire::DecodeStatusReply(reply)->outcome, wire::kOutcomeUndecided);
  const std::vector<std::string> none;
  EXPECT_TRUE(Call(1, wire::kOpDecide,
                   wire::EncodeTwoPhaseRequest(txid, 0, wire::kDecideAbort, 0, none, {}))
                  .ok());
  ASSERT_TRUE(Call(1, wire::kOpStatus, EncodeStruct(wire::StatusRequest{txid}), &reply).ok());
  EXPECT_EQ(wire::DecodeStatusReply(reply)->outcome, wire::kDecideAbort);
}

// Several tables on one server: one participant, one TX_DECIDE with every table's writes,
// installed at once; no prepare, no decision kept.
TEST(TxRecoveryOneServer, WritesToTwoTablesCommitInOneDecide) {
  auto cluster = TxCluster::Start("tcp", 1, {"a:8:8:16", "b:8:8:16"}, kLeaseMs);
  ASSERT_TRUE(cluster->node);
  auto client = cluster->Connect();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto t = BlockingTx::Create(**client, *cluster->node);
  ASSERT_TRUE(t.ok());
  BlockingTx& tx = **t;
  std::vector<std::byte> v(8, std::byte{5});
  Status st = Status::Aborted("not yet");
  for (int i = 0; i < 50 && st.code() == Code::kAborted; ++i) {  // as in Start(): the lease
    tx.start();
    st = tx.insert(0, Key(1), v);
    if (st.ok()) st = tx.insert(1, Key(1), v);
    if (st.ok()) st = tx.commit();
  }
  ASSERT_TRUE(st.ok()) << st.ToString();
  tx.start();
  auto a = tx.read(0, Key(1));
  auto b = tx.read(1, Key(1));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(U64(*a), U64(v));
  EXPECT_EQ(U64(*b), U64(v));
  EXPECT_TRUE(tx.commit().ok());
  const auto stat = cluster->servers[0].service->Stats();
  EXPECT_EQ(stat["decides"].get<uint64_t>(), 1u);
  EXPECT_EQ(stat["prepares"].get<uint64_t>(), 0u);
  EXPECT_EQ(stat["decisions"].get<uint64_t>(), 0u);
  EXPECT_EQ(stat["commits"].get<uint64_t>(), 0u);  // no TX_COMMIT
}

// The client process of KillProcessAt (run only as its child: disabled otherwise): connects,
// transfers with TxClientFaults::die_at at the step asked, says so on stdout and waits to be
// killed.
TEST(TxRecoveryChild, DISABLED_Client) {
  const char* servers = std::getenv("FARMEM_TX_CHILD_SERVERS");
  const char* backend = std::getenv("FARMEM_TX_CHILD_BACKEND");
  const char* step = std::getenv("FARMEM_TX_CHILD_STEP");
  const char* keys = std::getenv("FARMEM_TX_CHILD_KEYS");
  ASSERT_TRUE(servers && backend && step && keys) << "run by KillProcessAt only";
  const std::string sv = servers, kv = keys, st = step;
  const std::vector<std::string> addresses = {sv.substr(0, sv.find(',')),
                                              sv.substr(sv.find(',') + 1)};
  const uint64_t from = std::stoull(kv.substr(0, kv.find(','))),
                 to = std::stoull(kv.substr(kv.find(',') + 1));
  auto node = Node::Create(node::testing::MakeConfig(backend, "tx-child-client"));
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE((*node)->start().ok());
  TxClientOptions o;
  o.lease = milliseconds(kLeaseMs);
  o.faults.die_at = st == "holding"   ? TxDieAt::kHoldingLocks
                    : st == "prepare" ? TxDieAt::kAfterPrepare
                                      : TxDieAt::kAfterFirstDecide;
  if (Fault() == "one_phase") o.faults.one_phase_commit = true;
  auto client = TxClient::Connect(**node, addresses, o);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto t = BlockingTx::Create(**client, **node);
  ASSERT_TRUE(t.ok());
  const Status result = Transfer(**t, from, to);
  ASSERT_EQ(result.code(), Code::kInternal) << result.ToString();
  std::printf("FARMEM_TX_CHILD_AT_STEP %s\n", step);
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(60));  // SIGKILLed here
}

INSTANTIATE_TEST_SUITE_P(Backends, TxRecovery, kTxBackends, TxBackendName);
INSTANTIATE_TEST_SUITE_P(Backends, TxPeerRecovery, kTxBackends, TxBackendName);
INSTANTIATE_TEST_SUITE_P(Tcp, TxRecoveryProcess, ::testing::Values(std::string("tcp")),
                         TxBackendName);

}  // namespace
}  // namespace farmem::tx_test
