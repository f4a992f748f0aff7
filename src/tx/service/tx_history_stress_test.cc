// The history checker (tx/client/tx_history.h) over a short multi-threaded workload on two
// partitions: transfers (two writes, often on both partitions: prepare / decide) and read-only
// audits of eight accounts (half each). Every value carries the id of the transaction that wrote
// it, so each committed transaction's reads and overwritten versions are known; the history must be
// serializable. With validation left out (TxClientFaults::skip_validation) the checker finds a
// dependency cycle; with locks made advisory (TxTableFaults::no_lock_check) a lost update.
// FARMEM_TX_FAULT=validation|lock runs the main test with that protection removed (it then
// fails). Two client threads, four coroutines each, plus the servers' threads.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "farmem/tx.h"
#include "node/rpc_call.h"
#include "tx/client/tx_history.h"
#include "tx/client/tx_test_env.h"
#include "tx/service/tx_cluster_test_util.h"

namespace farmem::tx_test {
namespace {

constexpr uint64_t kAccounts = 16;
constexpr uint64_t kInitial = 1000;
constexpr uint32_t kValue = 16;  // balance, stamp (the writer's transaction id; 0 = initial)
constexpr int kThreads = 2;
constexpr int kCoroutines = 4;
constexpr int kOps = 120;
constexpr size_t kAuditReads = 8;

uint64_t Word(std::span<const std::byte> b, size_t i) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + i * 8, 8);
  return v;
}
void SetWord(std::span<std::byte> b, size_t i, uint64_t v) {
  std::memcpy(b.data() + i * 8, &v, 8);
}

struct Counts {
  std::atomic<uint64_t> transfers{0}, audits{0}, aborts{0}, errors{0};
};

Task<void> Worker(TxClient* client, Scheduler* sched, uint32_t seed,
                  std::vector<tx::HistoryTx>* history, Counts* counts) {
  Tx tx(*client, *sched);
  std::mt19937_64 rng(seed);
  for (int op = 0; op < kOps; ++op) {
    tx.start();
    tx::HistoryTx h;
    h.id = tx.id();
    Status st = Status::OK();
    const bool audit = rng() % 2 == 0;
    if (audit) {
      std::vector<uint64_t> keys;
      while (keys.size() < kAuditReads) {
        const uint64_t k = rng() % kAccounts;
        if (std::find(keys.begin(), keys.end(), k) == keys.end()) keys.push_back(k);
      }
      for (uint64_t k : keys) {
        const auto key = Key(k);
        Result<std::span<const std::byte>> r = co_await tx.read(0, key);
        if (!r.ok()) {
          st = r.status();
          break;
        }
        h.reads.push_back({k, Word(*r, 1)});
        // A pause between two reads: the window in which a transfer can commit between them.
        co_await sched->sleep_for(std::chrono::microseconds(100));
      }
    } else {
      const uint64_t a = rng() % kAccounts;
      uint64_t b = rng() % (kAccounts - 1);
      if (b >= a) ++b;
      for (uint64_t k : {a, b}) {
        const auto key = Key(k);
        Result<std::span<std::byte>> w = co_await tx.write(0, key);
        if (!w.ok()) {
          st = w.status();
          break;
        }
        h.writes.push_back({k, Word(*w, 1)});
        const uint64_t amount = 1 + rng() % 20;
        const uint64_t balance = Word(*w, 0);
        SetWord(*w, 0, k == a ? (balance >= amount ? balance - amount : balance) : balance);
        SetWord(*w, 1, tx.id());
      }
    }
    if (st.ok()) st = co_await tx.commit();
    if (st.ok()) {
      history->push_back(std::move(h));
      (audit ? counts->audits : counts->transfers).fetch_add(1, std::memory_order_relaxed);
    } else {
      (void)co_await tx.abort();
      if (st.code() == Code::kAborted) {
        counts->aborts.fetch_add(1, std::memory_order_relaxed);
        co_await sched->sleep_for(std::chrono::microseconds(20 + rng() % 200));
      } else {
        ADD_FAILURE() << st.ToString();
        counts->errors.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
}

class TxHistoryStress : public ::testing::TestWithParam<std::string> {
 protected:
  // Runs the workload and checks its history.
  Status Run(bool skip_validation, bool no_lock_check) {
    const char* e = std::getenv("FARMEM_TX_FAULT");
    const std::string fault = e ? e : "";
    if (!fault.empty()) std::printf("[ fault    ] FARMEM_TX_FAULT=%s\n", fault.c_str());
    tx::TxTableOptions o;
    o.faults.no_lock_check = no_lock_check || fault == "lock";
    auto cluster = TxCluster::Start(GetParam(), 2, {"hist:8:16:32:2"}, 5000, o);
    if (!cluster->node) return Status::Internal("no cluster");
    TxClientOptions co;
    co.faults.skip_validation = skip_validation || fault == "validation";
    auto client = cluster->Connect(co);
    if (!client.ok()) return client.status();
    {
      auto t = BlockingTx::Create(**client, *cluster->node);
      if (!t.ok()) return t.status();
      std::vector<std::byte> v(kValue);
      SetWord(v, 0, kInitial);
      for (uint64_t k = 0; k < kAccounts; ++k) {
        (*t)->start();
        FARMEM_RETURN_IF_ERROR((*t)->insert(0, Key(k), v));
        FARMEM_RETURN_IF_ERROR((*t)->commit());
      }
    }
    Counts counts;
    std::vector<std::vector<tx::HistoryTx>> histories(kThreads * kCoroutines);
    std::vector<std::thread> threads;
    for (int th = 0; th < kThreads; ++th) {
      threads.emplace_back([&, th] {
        auto sched = cluster->node->make_scheduler();
        ASSERT_TRUE(sched.ok());
        for (int c = 0; c < kCoroutines; ++c) {
          const int w = th * kCoroutines + c;
          (*sched)->spawn(Worker(client->get(), sched->get(), 777 + w, &histories[w], &counts));
        }
        Status st = (*sched)->run(std::chrono::seconds(120));
        EXPECT_TRUE(st.ok()) << st.ToString();
      });
    }
    for (auto& t : threads) t.join();
    std::vector<tx::HistoryTx> all;
    for (auto& h : histories) all.insert(all.end(), h.begin(), h.end());
    tx::HistoryStats stats;
    Status st = tx::CheckHistory(all, &stats);
    std::printf(
        "[ history  ] %llu transfers, %llu audits committed, %llu aborts; %zu versions, "
        "%zu edges: %s\n",
        static_cast<unsigned long long>(counts.transfers.load()),
        static_cast<unsigned long long>(counts.audits.load()),
        static_cast<unsigned long long>(counts.aborts.load()), stats.versions, stats.edges,
        st.ToString().c_str());
    EXPECT_EQ(counts.errors.load(), 0u);
    // Vacuous unless transactions met: some aborted on a lock, and audits committed.
    if (!no_lock_check && fault.empty()) {
      EXPECT_GT(counts.aborts.load(), 0u) << "no conflict at all";
    }
    EXPECT_GT(counts.audits.load(), 0u);
    return st;
  }
};

TEST_P(TxHistoryStress, TheHistoryIsSerializable) {
  Status st = Run(false, false);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_P(TxHistoryStress, WithoutValidationTheCheckerFindsACycle) {
  if (GetParam() != "tcp") {
    // As in TxBankStress: on fabric shm audits abort on locks so often that a run may see no
    // anomaly; the deterministic TxClientE2E test covers validation there.
    GTEST_SKIP() << "native TCP only";
  }
  // A cycle needs a transfer to commit between two reads of one audit: likely in one run, not
  // certain — up to three runs.
  Status st = Status::OK();
  for (int run = 0; run < 3 && st.ok(); ++run) st = Run(true, false);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("cycle"), std::string::npos) << st.ToString();
}

TEST_P(TxHistoryStress, WithoutLockingTheCheckerFindsALostUpdate) {
  Status st = Run(false, true);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("lost update"), std::string::npos) << st.ToString();
}

INSTANTIATE_TEST_SUITE_P(Backends, TxHistoryStress, kTxBackends, TxBackendName);

}  // namespace
}  // namespace farmem::tx_test
