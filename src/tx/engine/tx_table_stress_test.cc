// Concurrency stress of TxTable: bank transfers by several owner threads (lock both accounts,
// validate, commit) while other threads copy the region word by word like one-sided readers
// (every accepted item copy must be self-consistent) and an auditor runs read-only OCC audits
// over one-sided copies (every committed audit must see the exact total); and a lost-update
// counter test. FARMEM_TX_FAULT=odd|lock|lease runs them with one protection of the engine
// removed, FARMEM_TX_FAULT=validation with the audits' validation left out (docs/tx.md, "Tests":
// they must then fail).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tx/engine/tx_table.h"
#include "tx/engine/tx_test_util.h"

namespace farmem::tx {
namespace {

using testing::CopyBucket;
using testing::CopyItem;
using testing::K;
using testing::Word;

TxTableFaults FaultsFromEnv() {
  TxTableFaults f;
  const char* e = std::getenv("FARMEM_TX_FAULT");
  const std::string s = e ? e : "";
  f.no_odd_marking = s == "odd";
  f.no_lock_check = s == "lock";
  f.no_lease_check = s == "lease";
  if (!s.empty()) std::printf("[ fault    ] FARMEM_TX_FAULT=%s\n", s.c_str());
  return f;
}

// FARMEM_TX_FAULT=validation: audits accept locked items and skip their validation phase.
bool AuditsValidate() {
  const char* e = std::getenv("FARMEM_TX_FAULT");
  return e == nullptr || std::string(e) != "validation";
}

std::chrono::milliseconds RunFor() {
  const char* e = std::getenv("FARMEM_TX_STRESS_MS");
  return std::chrono::milliseconds(e ? std::atoi(e) : 1500);
}

// An account value: balance, a stamp unique to the commit that wrote it, then six words derived
// from both. A copy mixing two commits' words fails Consistent().
constexpr uint32_t kValueWords = 8;
uint64_t Derived(uint64_t balance, uint64_t stamp, uint32_t i) {
  uint64_t x = balance * 0x9e3779b97f4a7c15ull ^ (stamp + i) * 0xc2b2ae3d27d4eb4full;
  return x ^ (x >> 31);
}
std::vector<std::byte> Account(uint64_t balance, uint64_t stamp) {
  std::vector<std::byte> v(kValueWords * 8);
  std::memcpy(v.data(), &balance, 8);
  std::memcpy(v.data() + 8, &stamp, 8);
  for (uint32_t i = 2; i < kValueWords; ++i) {
    const uint64_t d = Derived(balance, stamp, i);
    std::memcpy(v.data() + i * 8, &d, 8);
  }
  return v;
}
bool Consistent(std::span<const std::byte> v) {
  const uint64_t balance = Word(v, 0), stamp = Word(v, 1);
  for (uint32_t i = 2; i < kValueWords; ++i) {
    if (Word(v, i) != Derived(balance, stamp, i)) return false;
  }
  return true;
}

TEST(TxStress, BankTransfersWithOneSidedReadersAndAudits) {
  TxGeometry g;
  g.key_size = 8;
  g.value_size = kValueWords * 8;
  g.width = 2;
  g.num_buckets = 16;  // 48 accounts in 16 buckets of 2: chains in use
  g.overflow_buckets = 64;
  TxTableOptions o;
  o.faults = FaultsFromEnv();
  auto created = TxTable::Create(g, o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  TxTable& t = **created;
  constexpr uint64_t kAccounts = 48, kInitial = 1000, kTotal = kAccounts * kInitial;
  std::vector<uint64_t> offsets(kAccounts);
  for (uint64_t a = 0; a < kAccounts; ++a) {
    auto off = t.Insert(K(a), Account(kInitial, a));
    ASSERT_TRUE(off.ok()) << off.status().ToString();
    offsets[a] = *off;
  }
  ASSERT_GT(t.Stats().overflow_buckets_used, 0u);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> transfers{0}, aborts_locked{0}, aborts_funds{0};
  std::atomic<uint64_t> copies_accepted{0}, torn_accepted{0}, copies_refused{0};
  std::atomic<uint64_t> unordered_torn_without_recheck{0};
  std::atomic<uint64_t> audits_committed{0}, audits_aborted{0}, audit_violations{0};
  std::atomic<uint64_t> rpc_audits_committed{0};
  std::atomic<uint64_t> errors{0};
  constexpr uint64_t kLease = 10'000'000'000;  // 10 s: never runs out in this test

  auto transfer_thread = [&](uint64_t id) {
    std::mt19937_64 rng(id);
    std::vector<std::byte> va(g.value_size), vb(g.value_size);
    uint64_t n = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      const uint64_t txid = (id << 40) | ++n;
      const uint64_t a = rng() % kAccounts;
      uint64_t b = rng() % (kAccounts - 1);
      if (b >= a) ++b;
      auto la = t.LockForUpdate(K(a), txid, kLease, va);
      if (!la.ok()) {
        if (AbortReasonOf(la.status()) != AbortReason::kLocked) ++errors;
        ++aborts_locked;
        std::this_thread::yield();
        continue;
      }
      auto lb = t.LockForUpdate(K(b), txid, kLease, vb);
      if (!lb.ok()) {
        if (AbortReasonOf(lb.status()) != AbortReason::kLocked) ++errors;
        ++aborts_locked;
        if (!t.Unlock(K(a), txid).ok() && !o.faults.no_lock_check) ++errors;
        std::this_thread::yield();
        continue;
      }
      const uint64_t amount = 1 + rng() % 50;
      const uint64_t ba = Word(va, 0), bb = Word(vb, 0);
      if (ba < amount) {  // no negative balances: abort, leaving no trace
        ++aborts_funds;
        if (!t.Unlock(K(a), txid).ok() && !o.faults.no_lock_check) ++errors;
        if (!t.Unlock(K(b), txid).ok() && !o.faults.no_lock_check) ++errors;
        continue;
      }
      // Validation of the write set (the owner-side check; both locked by us, so it passes).
      if (!t.Validate(K(a), la->version, txid).ok() || !t.Validate(K(b), lb->version, txid).ok()) {
        if (!o.faults.no_lock_check) ++errors;
      }
      // The single-participant commit: both accounts at once.
      const auto ka = K(a), kb = K(b);
      const auto na = Account(ba - amount, txid * 2), nb = Account(bb + amount, txid * 2 + 1);
      const TxTable::TxWrite writes[] = {{ka, false, na}, {kb, false, nb}};
      if (!t.CommitAll(txid, writes).ok()) ++errors;
      ++transfers;
    }
  };

  // Copies random buckets (ordered word copy, like the TCP NIC thread) and checks every slot;
  // every other round plays an unordered transport instead: seq word, the item's words in
  // another order (ends first), seq word again, checked with the seqlock recheck.
  auto reader_thread = [&](uint64_t id) {
    std::mt19937_64 rng(id);
    uint64_t round = 0;
    std::vector<std::byte> item(ItemBytes(g));
    while (!stop.load(std::memory_order_relaxed)) {
      if (++round % 2 == 0) {
        const std::byte* at = t.region() + offsets[rng() % kAccounts];
        SeqlockRecheck rc;
        rc.before = LoadWord(at);
        // Both ends first, then the middle (as glibc memcpy does for medium sizes), each word
        // atomic: a copy that a seq == tail check alone does not protect.
        const uint64_t words = ItemWords(g);
        OrderedCopy(at, item.data(), 8);
        OrderedCopy(at + (words - 1) * 8, item.data() + (words - 1) * 8, 8);
        for (uint64_t w = 1; w + 1 < words; ++w) OrderedCopy(at + w * 8, item.data() + w * 8, 8);
        rc.after = LoadWord(at);
        ItemView v;
        const ItemCheck c = CheckItemCopy(g, item, {}, &rc, &v);
        if (c == ItemCheck::kOk) {
          ++copies_accepted;
          if (!Consistent(v.value)) ++torn_accepted;
        } else {
          ++copies_refused;
        }
        // The same copy without the recheck: what an unordered copy alone would let through.
        if (CheckItemCopy(g, item, {}, nullptr, &v) == ItemCheck::kOk && !Consistent(v.value)) {
          ++unordered_torn_without_recheck;
        }
        continue;
      }
      const uint64_t bucket = rng() % TotalBuckets(g);
      const auto copy = CopyBucket(t, bucket);
      for (uint32_t s = 0; s < g.width; ++s) {
        const auto item = std::span(copy).subspan(8 + s * ItemBytes(g), ItemBytes(g));
        ItemView v;
        const ItemCheck c = CheckItemCopy(g, item, {}, nullptr, &v);
        if (c == ItemCheck::kOk) {
          ++copies_accepted;
          if (!Consistent(v.value)) ++torn_accepted;
        } else if (c == ItemCheck::kBusy || c == ItemCheck::kTorn) {
          ++copies_refused;
        }
      }
    }
  };

  // Read-only OCC audits: read every account one-sidedly (consistent, unlocked), then validate
  // every one by a second copy (same version, unlocked). A committed audit must see kTotal.
  // Every other round audits through the owner-side calls instead (Lookup, then Validate).
  const bool validate = AuditsValidate();
  auto audit_thread = [&]() {
    std::vector<uint64_t> versions(kAccounts);
    uint64_t round = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      ++round;
      const bool rpc = round % 2 == 0;
      uint64_t sum = 0;
      bool ok = true;
      bool negative = false;
      for (uint64_t a = 0; a < kAccounts && ok; ++a) {
        if (rpc) {
          std::vector<std::byte> value(g.value_size);
          auto r = t.Lookup(K(a), value);
          if (!r.ok()) {
            ++errors;
            ok = false;
            break;
          }
          if (r->lock_txid != 0 && validate) {
            ok = false;
            break;
          }
          versions[a] = r->version;
          sum += Word(value, 0);
          negative |= static_cast<int64_t>(Word(value, 0)) < 0;
          continue;
        }
        const auto copy = CopyItem(t, offsets[a]);
        ItemView v;
        const auto key = K(a);
        const ItemCheck c = CheckItemCopy(g, copy, key, nullptr, &v);
        if (c != ItemCheck::kOk || (v.lock_txid != 0 && validate)) {
          if (c == ItemCheck::kEmpty || c == ItemCheck::kOtherKey) ++errors;
          ok = false;
          break;
        }
        if (!Consistent(v.value)) ++torn_accepted;
        versions[a] = v.version;
        sum += Word(v.value, 0);
        negative |= static_cast<int64_t>(Word(v.value, 0)) < 0;
      }
      for (uint64_t a = 0; a < kAccounts && ok && validate; ++a) {
        if (rpc) {
          ok = t.Validate(K(a), versions[a], 0).ok();
          continue;
        }
        const auto copy = CopyItem(t, offsets[a]);
        ItemView v;
        const auto key = K(a);
        ok = CheckItemCopy(g, copy, key, nullptr, &v) == ItemCheck::kOk &&
             ValidatesAgainst(v, versions[a], 0);
      }
      if (!ok) {
        ++audits_aborted;
        continue;
      }
      ++(rpc ? rpc_audits_committed : audits_committed);
      if ((sum != kTotal || negative) && ++audit_violations <= 3) {
        std::printf("[ audit    ] committed audit saw total %llu (expected %llu)\n",
                    static_cast<unsigned long long>(sum), static_cast<unsigned long long>(kTotal));
      }
    }
  };

  std::vector<std::thread> threads;
  for (uint64_t i = 1; i <= 3; ++i) threads.emplace_back(transfer_thread, i);
  for (uint64_t i = 1; i <= 2; ++i) threads.emplace_back(reader_thread, 100 + i);
  threads.emplace_back(audit_thread);
  std::this_thread::sleep_for(RunFor());
  stop = true;
  for (auto& th : threads) th.join();

  std::printf(
      "[ measure  ] transfers %llu, aborted locked %llu / funds %llu; copies accepted %llu, "
      "refused %llu, torn accepted %llu; audits committed %llu one-sided + %llu owner-side, "
      "aborted %llu, violations %llu; unordered copies torn without the recheck %llu\n",
      (unsigned long long)transfers.load(), (unsigned long long)aborts_locked.load(),
      (unsigned long long)aborts_funds.load(), (unsigned long long)copies_accepted.load(),
      (unsigned long long)copies_refused.load(), (unsigned long long)torn_accepted.load(),
      (unsigned long long)audits_committed.load(), (unsigned long long)rpc_audits_committed.load(),
      (unsigned long long)audits_aborted.load(), (unsigned long long)audit_violations.load(),
      (unsigned long long)unordered_torn_without_recheck.load());
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_EQ(torn_accepted.load(), 0u) << "a one-sided copy was accepted torn";
  EXPECT_EQ(audit_violations.load(), 0u) << "a committed audit saw a wrong total";
  EXPECT_GT(transfers.load(), 0u);
  EXPECT_GT(copies_accepted.load(), 0u);
  EXPECT_GT(audits_committed.load() + rpc_audits_committed.load(), 0u) << "no audit committed";
  // Quiescent: the exact total, nothing negative, no lock left, every value consistent.
  uint64_t sum = 0;
  for (uint64_t a = 0; a < kAccounts; ++a) {
    std::vector<std::byte> value(g.value_size);
    auto r = t.Lookup(K(a), value);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->lock_txid, 0u);
    EXPECT_TRUE(Consistent(value));
    EXPECT_GE(static_cast<int64_t>(Word(value, 0)), 0);
    sum += Word(value, 0);
  }
  EXPECT_EQ(sum, kTotal);
  EXPECT_EQ(t.Stats().locked_items, 0u);
}

// Lost updates: threads increment shared counters (read-for-update, +1, commit), retrying when
// locked, and log what committed; every counter must equal its committed increments.
TEST(TxStress, LostUpdateCounter) {
  TxGeometry g;
  g.key_size = 8;
  g.value_size = 8;
  g.width = 1;
  g.num_buckets = 4;
  g.overflow_buckets = 8;
  TxTableOptions o;
  o.faults = FaultsFromEnv();
  auto created = TxTable::Create(g, o);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  TxTable& t = **created;
  constexpr uint64_t kCounters = 6, kThreads = 4, kPerThread = 3000;
  for (uint64_t c = 0; c < kCounters; ++c) ASSERT_TRUE(t.Insert(K(c), testing::V(0, 8)).ok());
  std::vector<std::vector<uint64_t>> committed(kThreads, std::vector<uint64_t>(kCounters));
  std::atomic<uint64_t> locked{0};
  std::vector<std::thread> threads;
  for (uint64_t id = 0; id < kThreads; ++id) {
    threads.emplace_back([&, id] {
      std::mt19937_64 rng(id);
      uint64_t n = 0;
      for (uint64_t i = 0; i < kPerThread; ++i) {
        const uint64_t c = rng() % kCounters;
        for (;;) {
          const uint64_t txid = ((id + 1) << 40) | ++n;
          std::vector<std::byte> v(8);
          auto r = t.LockForUpdate(K(c), txid, 10'000'000'000, v);
          if (!r.ok()) {
            ++locked;
            std::this_thread::yield();
            continue;
          }
          // The transaction's other work: lets the other threads run into the lock.
          std::this_thread::yield();
          if (t.CommitWrite(K(c), txid, testing::V(Word(v, 0) + 1, 8)).ok()) {
            ++committed[id][c];
            break;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  uint64_t lost = 0;
  for (uint64_t c = 0; c < kCounters; ++c) {
    uint64_t expect = 0;
    for (uint64_t id = 0; id < kThreads; ++id) expect += committed[id][c];
    std::vector<std::byte> v(8);
    ASSERT_TRUE(t.Lookup(K(c), v).ok());
    EXPECT_EQ(Word(v, 0), expect) << "counter " << c;
    lost += expect - Word(v, 0);
  }
  std::printf("[ measure  ] %llu increments, %llu lock conflicts, %llu lost\n",
              (unsigned long long)(kThreads * kPerThread), (unsigned long long)locked.load(),
              (unsigned long long)lost);
  EXPECT_GT(locked.load(), 0u) << "vacuous: no two increments ever met at a lock";
}

}  // namespace
}  // namespace farmem::tx
