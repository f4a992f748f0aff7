// Stress test of TierStore: writers, store readers and one-sided-style direct readers against a
// churn thread that promotes and demotes every few milliseconds on a budget of 3 units. Threads:
// 2 writers, 1 Read reader, 1 direct reader (CopyEpoch-bracketed copies of the mapped range), 1
// churn thread; the test thread checks the result.
//
// Every 8-byte word i of the region holds 0 (never written) or V = (writer + 1) << 56 | i << 32 |
// seq. Word i belongs to writer (i / 192) % 2 (192-word chunks, so chunks straddle pages and units
// and the two writers share 4 KiB blocks: same-block read-modify-write). Per word, `issued` is the
// last value a writer started to write, `acked` the last one whose Write returned. A read of word
// i that started after acked[i] = A must return a value of the right writer and word, with
// A's seq <= seq <= issued[i]'s seq (no stale, torn or foreign word), never the pattern; at the end
// every word equals acked (no lost write), also after every unit was demoted (file holds it).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/copy_epoch.h"
#include "tier/engine/tier_store.h"
#include "tier/engine/tier_test_util.h"

namespace farmem::tier {
namespace {

using testing::DirectCopy;
using testing::SmallOptions;
using testing::TempDir;

constexpr uint64_t kStressUnit = 16 * 1024;
constexpr uint64_t kUnits = 8;
constexpr uint64_t kBudget = 3;
constexpr uint64_t kWords = kUnits * kStressUnit / 8;
constexpr uint64_t kChunkWords = 192;
constexpr int kWriters = 2;

int OwnerOf(uint64_t word) {
  return static_cast<int>((word / kChunkWords) % kWriters);
}
uint64_t Value(int writer, uint64_t word, uint32_t seq) {
  return (uint64_t(writer + 1) << 56) | (word << 32) | seq;
}
uint32_t SeqOf(uint64_t v) {
  return static_cast<uint32_t>(v);
}

struct Shared {
  std::vector<std::atomic<uint64_t>> issued = std::vector<std::atomic<uint64_t>>(kWords);
  std::vector<std::atomic<uint64_t>> acked = std::vector<std::atomic<uint64_t>>(kWords);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> failures{0};
  std::atomic<uint64_t> words_checked{0};
  std::atomic<uint64_t> direct_misses{0};
  std::mutex mu;
  std::vector<std::string> messages;
  void Fail(const std::string& m) {
    failures.fetch_add(1);
    std::lock_guard<std::mutex> l(mu);
    if (messages.size() < 8) messages.push_back(m);
  }
};

// Checks the words read from [w0, w0 + n) against the lower bounds taken before the read.
void Verify(Shared& sh, uint64_t magic, uint64_t w0, const std::vector<uint64_t>& got,
            const std::vector<uint64_t>& lower, const char* how) {
  for (size_t k = 0; k < got.size(); ++k) {
    const uint64_t i = w0 + k;
    const uint64_t v = got[k];
    const uint64_t lo = lower[k];
    const uint64_t hi = sh.issued[i].load(std::memory_order_seq_cst);
    std::string bad;
    if (v == magic) {
      bad = "pattern word accepted";
    } else if (v == 0) {
      if (lo != 0) bad = "lost write: zero after an acknowledged write";
    } else if (v != Value(OwnerOf(i), i, SeqOf(v))) {
      bad = "torn or foreign word";
    } else if (lo != 0 && SeqOf(v) < SeqOf(lo)) {
      bad = "stale word (older than the last acknowledged write)";
    } else if (SeqOf(v) > SeqOf(hi)) {
      bad = "word from the future";
    }
    if (!bad.empty()) {
      sh.Fail(std::string(how) + " word " + std::to_string(i) + ": " + bad + " (got " +
              std::to_string(v) + ", acked " + std::to_string(lo) + ")");
    }
  }
  sh.words_checked.fetch_add(got.size(), std::memory_order_relaxed);
}

TEST(TierStoreStress, ConcurrentWritesReadsAndDirectCopiesUnderChurn) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TierOptions o = SmallOptions(dir.File("tier"), kUnits, kBudget);
  CopyEpoch reader_epoch;  // the direct reader's (stands in for the transport's NIC thread)
  std::atomic<uint64_t> grace_calls{0};
  o.grace = [&]() -> Status {
    grace_calls.fetch_add(1, std::memory_order_relaxed);
    const CopyEpoch* epochs[] = {&reader_epoch};
    if (!WaitForCopies(epochs, std::chrono::steady_clock::now() + std::chrono::seconds(5))) {
      return Status::TimedOut("direct copy still running");
    }
    return Status::OK();
  };
  auto opened = TierStore::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  TierStore& t = **opened;
  const uint64_t magic = t.magic_word();
  Shared sh;

  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(100 + w);
      const uint64_t chunks = kWords / kChunkWords;
      uint32_t seq = 0;
      std::vector<uint64_t> buf;
      while (!sh.stop.load(std::memory_order_relaxed)) {
        uint64_t c = rng() % chunks;
        c -= c % kWriters;
        c += static_cast<uint64_t>(w);
        if (c >= chunks) continue;
        const uint64_t first = c * kChunkWords + rng() % kChunkWords;
        const uint64_t n = 1 + rng() % ((c + 1) * kChunkWords - first);
        ++seq;
        buf.resize(n);
        for (uint64_t k = 0; k < n; ++k) {
          buf[k] = Value(w, first + k, seq);
          sh.issued[first + k].store(buf[k], std::memory_order_seq_cst);
        }
        Status st = t.Write(first * 8, std::span<const uint8_t>(
                                           reinterpret_cast<const uint8_t*>(buf.data()), n * 8));
        if (!st.ok()) {
          sh.Fail("write: " + st.ToString());
          return;
        }
        for (uint64_t k = 0; k < n; ++k)
          sh.acked[first + k].store(buf[k], std::memory_order_seq_cst);
      }
    });
  }
  // Reader through the store's Read (the RPC path).
  threads.emplace_back([&] {
    std::mt19937_64 rng(7);
    std::vector<uint64_t> got, lower;
    while (!sh.stop.load(std::memory_order_relaxed)) {
      const uint64_t w0 = rng() % kWords;
      const uint64_t n = 1 + rng() % std::min<uint64_t>(kWords - w0, 6000);
      lower.resize(n);
      got.resize(n);
      for (uint64_t k = 0; k < n; ++k) lower[k] = sh.acked[w0 + k].load(std::memory_order_seq_cst);
      Status st = t.Read(w0 * 8, std::span<uint8_t>(reinterpret_cast<uint8_t*>(got.data()), n * 8));
      if (!st.ok()) {
        sh.Fail("read: " + st.ToString());
        return;
      }
      Verify(sh, magic, w0, got, lower, "Read");
    }
  });
  // Direct reader: copies the mapped range like a one-sided read, treats pattern words as missing
  // pages and fetches only those (sparse fetch).
  threads.emplace_back([&] {
    std::mt19937_64 rng(8);
    std::vector<uint64_t> got, lower;
    while (!sh.stop.load(std::memory_order_relaxed)) {
      const uint64_t w0 = rng() % kWords;
      const uint64_t n = 1 + rng() % std::min<uint64_t>(kWords - w0, 6000);
      lower.resize(n);
      got.resize(n);
      for (uint64_t k = 0; k < n; ++k) lower[k] = sh.acked[w0 + k].load(std::memory_order_seq_cst);
      std::span<uint8_t> bytes(reinterpret_cast<uint8_t*>(got.data()), n * 8);
      {
        CopyEpoch::Scope copy(reader_epoch);
        DirectCopy(t.base(), w0 * 8, bytes);
      }
      auto missing = FindMissingPages(w0 * 8, bytes, magic);
      if (!missing.ok()) {
        sh.Fail("detect: " + missing.status().ToString());
        return;
      }
      bool any = false;
      for (uint64_t m : *missing) any |= m != 0;
      if (any) {
        sh.direct_misses.fetch_add(1, std::memory_order_relaxed);
        Status st = t.ReadPages(w0 * 8, bytes, *missing);
        if (!st.ok()) {
          sh.Fail("sparse fetch: " + st.ToString());
          return;
        }
      }
      Verify(sh, magic, w0, got, lower, "direct");
    }
  });
  // Churn: promote / demote / run a period every ~2 ms; the budget holds at every sample.
  std::atomic<uint64_t> churn_ops{0};
  threads.emplace_back([&] {
    std::mt19937_64 rng(9);
    while (!sh.stop.load(std::memory_order_relaxed)) {
      const int op = static_cast<int>(rng() % 5);
      const auto u = static_cast<uint32_t>(rng() % kUnits);
      Status st;
      if (op <= 1) {
        st = t.Demote(u);
      } else if (op <= 3) {
        st = t.Promote(u);
        if (st.code() == Code::kResourceExhausted) {
          st = t.Demote(static_cast<uint32_t>(rng() % kUnits));
        }
      } else {
        std::vector<uint64_t> counts(kUnits, 0);
        for (auto& c : counts) c = rng() % 3 == 0 ? rng() % 1000 : 0;
        auto rep = t.RunPeriod(counts);
        st = rep.ok() ? rep->error : rep.status();
        if (st.code() == Code::kResourceExhausted) st = Status::OK();
      }
      if (!st.ok()) sh.Fail("churn: " + st.ToString());
      const TierStats s = t.Stats();
      if (s.resident_units + s.quarantined_frames > kBudget) {
        sh.Fail("budget exceeded: " + std::to_string(s.resident_units) + " resident");
      }
      churn_ops.fetch_add(1, std::memory_order_relaxed);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });

  std::this_thread::sleep_for(std::chrono::seconds(2));
  sh.stop.store(true);
  for (auto& th : threads) th.join();

  for (const auto& m : sh.messages) ADD_FAILURE() << m;
  EXPECT_EQ(sh.failures.load(), 0u);
  // No lost write: every word is its last acknowledged value, in DRAM and then from the file.
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<uint64_t> all(kWords);
    ASSERT_TRUE(
        t.Read(0, std::span<uint8_t>(reinterpret_cast<uint8_t*>(all.data()), kWords * 8)).ok());
    uint64_t wrong = 0;
    for (uint64_t i = 0; i < kWords; ++i) {
      if (all[i] != sh.acked[i].load()) {
        if (++wrong <= 5) {
          ADD_FAILURE() << "pass " << pass << " word " << i << ": " << all[i] << " != last acked "
                        << sh.acked[i].load();
        }
      }
    }
    EXPECT_EQ(wrong, 0u) << "lost or stale words (pass " << pass << ")";
    for (uint32_t u = 0; u < kUnits; ++u) ASSERT_TRUE(t.Demote(u).ok());
  }
  const TierStats s = t.Stats();
  std::printf(
      "[ measure  ] words checked %llu, direct misses %llu, churn ops %llu, promotions %llu, "
      "demotions %llu, write-backs %llu, grace calls %llu\n",
      (unsigned long long)sh.words_checked.load(), (unsigned long long)sh.direct_misses.load(),
      (unsigned long long)churn_ops.load(), (unsigned long long)s.promotions,
      (unsigned long long)s.demotions, (unsigned long long)s.writebacks,
      (unsigned long long)grace_calls.load());
  EXPECT_GT(churn_ops.load(), 100u);
  EXPECT_GT(s.promotions, 50u);
  EXPECT_GT(s.writebacks, 10u);
  EXPECT_GT(sh.direct_misses.load(), 0u);
  EXPECT_GT(sh.words_checked.load(), 100000u);
}

}  // namespace
}  // namespace farmem::tier
