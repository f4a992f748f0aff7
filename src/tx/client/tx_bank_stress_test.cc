// Bank stress of the tx client against two in-process tx servers (two partitions of one table):
// client threads, each running several transaction coroutines, do transfers between random
// accounts and read-only audits of every account. Every committed audit must see the exact total
// and no negative balance; the final total is conserved. The second test leaves out read-set
// validation (TxClientFaults::skip_validation) and shows the audits then see wrong totals.
// Threads: the test's client threads (one Scheduler each) and the servers' own threads.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "farmem/tx.h"
#include "tx/client/tx_test_env.h"

namespace farmem::tx_test {
namespace {

constexpr uint64_t kAccounts = 40;
constexpr uint64_t kInitial = 1000;
constexpr int kThreads = 2;
constexpr int kCoroutinesPerThread = 4;
constexpr int kOpsPerCoroutine = 150;

struct Outcome {
  std::atomic<uint64_t> transfers{0}, audits{0}, bad_audits{0}, aborts{0}, errors{0};
  std::atomic<uint64_t> negative{0};
};

Task<void> Worker(TxClient* client, Scheduler* sched, uint16_t table, uint64_t seed, Outcome* out) {
  Tx tx(*client, *sched);
  std::mt19937_64 rng(seed);
  for (int op = 0; op < kOpsPerCoroutine; ++op) {
    const bool audit = rng() % 4 == 0;
    bool done = false;
    for (int attempt = 0; attempt < 50 && !done; ++attempt) {
      tx.start();
      Status st;
      if (audit) {
        uint64_t sum = 0;
        bool neg = false;
        for (uint64_t a = 0; a < kAccounts && st.ok(); ++a) {
          const auto key = Key(a);
          Result<std::span<const std::byte>> r = co_await tx.read(table, key);
          if (!r.ok()) {
            st = r.status();
            break;
          }
          const int64_t v = static_cast<int64_t>(U64(*r));
          neg |= v < 0;
          sum += static_cast<uint64_t>(v);
        }
        if (st.ok()) st = co_await tx.commit();
        if (st.ok()) {
          out->audits.fetch_add(1);
          if (sum != kAccounts * kInitial) out->bad_audits.fetch_add(1);
          if (neg) out->negative.fetch_add(1);
        }
      } else {
        const uint64_t a = rng() % kAccounts;
        uint64_t b = rng() % (kAccounts - 1);
        if (b >= a) ++b;
        const uint64_t amount = 1 + rng() % 50;
        const auto ka = Key(a), kb = Key(b);
        Result<std::span<std::byte>> wa = co_await tx.write(table, ka);
        if (!wa.ok()) {
          st = wa.status();
        } else {
          Result<std::span<std::byte>> wb = co_await tx.write(table, kb);
          if (!wb.ok()) {
            st = wb.status();
          } else {
            const uint64_t va = U64(*wa), vb = U64(*wb);
            if (va >= amount) {
              const uint64_t na = va - amount, nb = vb + amount;
              std::memcpy(wa->data(), &na, 8);
              std::memcpy(wb->data(), &nb, 8);
            }
            st = co_await tx.commit();
            if (st.ok()) out->transfers.fetch_add(1);
          }
        }
      }
      if (st.ok()) {
        done = true;
      } else if (st.code() == Code::kAborted) {
        out->aborts.fetch_add(1);
        co_await sched->sleep_for(std::chrono::microseconds(20 + rng() % 200));
      } else {
        ADD_FAILURE() << st.ToString();
        out->errors.fetch_add(1);
        (void)co_await tx.abort();
        done = true;
      }
    }
  }
}

class TxBankStress : public ::testing::TestWithParam<std::string> {
 protected:
  // Runs the workload; returns the final total.
  uint64_t Run(bool skip_validation, Outcome& out) {
    auto env = TxEnv::Start(GetParam(), 2, {"bank:8:8:32:2"});
    if (!env->node) return 0;
    TxClientOptions o;
    o.faults.skip_validation = skip_validation;
    auto client = env->Connect(o);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    if (!client.ok()) return 0;
    const uint16_t table = *(*client)->table("bank");
    {
      auto t = BlockingTx::Create(**client, *env->node);
      EXPECT_TRUE(t.ok());
      for (uint64_t a = 0; a < kAccounts; ++a) {
        (*t)->start();
        EXPECT_TRUE((*t)->insert(table, Key(a), Value(kInitial, 8)).ok());
        EXPECT_TRUE((*t)->commit().ok());
      }
    }
    std::vector<std::thread> threads;
    for (int th = 0; th < kThreads; ++th) {
      threads.emplace_back([&, th] {
        auto sched = env->node->make_scheduler();
        ASSERT_TRUE(sched.ok());
        for (int c = 0; c < kCoroutinesPerThread; ++c) {
          (*sched)->spawn(Worker(client->get(), sched->get(), table, 1234 + th * 100 + c, &out));
        }
        Status st = (*sched)->run(std::chrono::seconds(120));
        EXPECT_TRUE(st.ok()) << st.ToString();
      });
    }
    for (auto& t : threads) t.join();
    uint64_t total = 0;
    auto t = BlockingTx::Create(**client, *env->node);
    EXPECT_TRUE(t.ok());
    (*t)->start();
    for (uint64_t a = 0; a < kAccounts; ++a) {
      auto r = (*t)->read(table, Key(a));
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (r.ok()) total += U64(*r);
    }
    EXPECT_TRUE((*t)->commit().ok());
    const TxClientStats s = (*client)->stats();
    std::printf(
        "%s skip_validation=%d: transfers %llu audits %llu bad audits %llu aborts %llu "
        "(locked %llu validation %llu) one-sided hits %llu misses %llu\n",
        GetParam().c_str(), skip_validation, (unsigned long long)out.transfers.load(),
        (unsigned long long)out.audits.load(), (unsigned long long)out.bad_audits.load(),
        (unsigned long long)out.aborts.load(),
        (unsigned long long)s.aborts[static_cast<size_t>(TxAbortReason::kLocked)],
        (unsigned long long)s.aborts[static_cast<size_t>(TxAbortReason::kValidation)],
        (unsigned long long)s.one_sided_hits, (unsigned long long)s.one_sided_misses);
    t->reset();
    client->reset();
    return total;
  }
};

TEST_P(TxBankStress, AuditsSeeTheExactTotal) {
  Outcome out;
  const uint64_t total = Run(false, out);
  EXPECT_EQ(total, kAccounts * kInitial);
  EXPECT_EQ(out.errors.load(), 0u);
  EXPECT_GT(out.transfers.load(), 0u);
  EXPECT_GT(out.audits.load(), 0u);
  EXPECT_EQ(out.bad_audits.load(), 0u);
  EXPECT_EQ(out.negative.load(), 0u);
}

// The protection removed: without read-set validation, audits commit inconsistent snapshots.
// Native TCP only: on fabric shm an audit (three reads per item) meets a transfer's lock and aborts
// (NO_WAIT) so often that some runs end with no wrong audit at all (0-4 of ~130 seen), which would
// make this a flaky test; TxClientE2E.WithoutValidationAnInterleavedAuditCommitsAWrongTotal shows
// the same failure deterministically on both backends.
TEST_P(TxBankStress, WithoutValidationAuditsSeeWrongTotals) {
  if (GetParam() != "tcp") GTEST_SKIP() << "not reliable on fabric shm; see the comment above";
  Outcome out;
  const uint64_t total = Run(true, out);
  EXPECT_EQ(total, kAccounts * kInitial);  // transfers themselves still lock both accounts
  EXPECT_GT(out.audits.load(), 0u);
  EXPECT_GT(out.bad_audits.load(), 0u) << "validation left out, yet no audit saw a wrong total";
}

INSTANTIATE_TEST_SUITE_P(Backends, TxBankStress, kTxBackends, TxBackendName);

}  // namespace
}  // namespace farmem::tx_test
