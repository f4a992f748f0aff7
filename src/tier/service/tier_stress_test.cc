// Stress test of the tier service and TieredClient under forced churn, on native TCP and
// libfabric shm: a budget of 2 units, the server's period thread every 3 ms plus a churn thread
// promoting and demoting random units every ~1 ms, while reader threads (two clients, coroutine
// batches in flight) do verified reads of random unaligned ranges and writer threads do tagged
// writes (each word names its own index, a sequence number and a checksum) into 64-byte chunks
// they own (interleaved, so cold writes of different writers share 4 KiB blocks). Checked: no
// stale word (older than the last write acknowledged before the read began), no torn, foreign or
// pattern word, and at the end no lost write; at every sample (~5 ms) the budget holds and at most
// 1 % of the backing file is in the page cache (mincore). FARMEM_STRESS_SECONDS sets the duration
// (3 s); FARMEM_TIER_FAULT=buffered runs the server without O_DIRECT (the page-cache check fails).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/failures_test_util.h"
#include "farmem/tier.h"
#include "tier/service/tier_service_test_util.h"

namespace farmem::tier {
namespace {

using testing::TierEnv;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kUnits = 16;
constexpr uint64_t kUnitKib = 16;
constexpr uint64_t kBytes = kUnits * kUnitKib * 1024;
constexpr uint64_t kWords = kBytes / 8;
constexpr int kWriters = 2;
constexpr int kReaders = 3;
constexpr int kLanes = 4;  // reads in flight per reader thread

double StressSeconds() {
  const char* env = std::getenv("FARMEM_STRESS_SECONDS");
  const double s = env ? std::atof(env) : 0;
  return s > 0 ? s : 3.0;
}

// word = index (24 bits) | seq (24 bits) << 24 | check (16 bits) << 48.
uint64_t Check16(uint64_t index, uint64_t seq) {
  uint64_t h = (index * 0x9E3779B97F4A7C15ull) ^ (seq * 0xC2B2AE3D27D4EB4Full);
  h ^= h >> 29;
  return (h * 0x94D049BB133111EBull) >> 48;
}
uint64_t Tag(uint64_t index, uint64_t seq) {
  return index | seq << 24 | Check16(index, seq) << 48;
}

using farmem::testing::Failures;

// FARMEM_TIER_FAULT=buffered: the server's file IO goes through the page cache.
bool BufferedFault() {
  const char* e = std::getenv("FARMEM_TIER_FAULT");
  const bool on = e != nullptr && std::string(e) == "buffered";
  if (on) std::printf("[ fault    ] FARMEM_TIER_FAULT=buffered\n");
  return on;
}

class TierStress : public ::testing::TestWithParam<std::string> {};

TEST_P(TierStress, VerifiedReadsAndTaggedWritesUnderChurn) {
  const bool buffered = BufferedFault();
  auto env =
      TierEnv::Start(GetParam(), kUnits, 2, TierMode::kFull, 3, kUnitKib, [&](ServerConfig& sc) {
        sc.tier.direct_io = !buffered;
        // A correctness test, not a latency one: on a loaded 2-CPU runner a
        // cold write's O_DIRECT IO under a unit lock has stalled every
        // worker for over 5 s (CI, fabric shm). An op that still times out
        // fails the test, as a hang would.
        sc.node.transport.op_timeout = std::chrono::seconds(30);
      });
  ASSERT_TRUE(env->service);
  TieredClientOptions opts;
  opts.period = std::chrono::milliseconds(3);
  auto c1 = env->Connect(opts);
  auto c2 = env->Connect(opts);
  ASSERT_TRUE(c1.ok() && c2.ok());
  TieredClient* clients[2] = {c1->get(), c2->get()};
  ASSERT_TRUE(clients[0]->info().one_sided);

  // Every word at seq 0.
  std::vector<uint64_t> init(kWords);
  for (uint64_t w = 0; w < kWords; ++w) init[w] = Tag(w, 0);
  for (uint64_t at = 0; at < kBytes; at += 64 << 10) {
    ASSERT_TRUE(clients[0]->write(at, std::as_bytes(std::span(init)).subspan(at, 64 << 10)).ok());
  }
  std::vector<std::atomic<uint32_t>> acked(kWords);   // last seq acknowledged per word
  std::vector<std::atomic<uint32_t>> issued(kWords);  // highest seq ever sent per word
  const uint64_t magic = env->service->store().magic_word();

  Failures fail;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, words_checked{0}, writes{0}, churns{0};
  const auto deadline = Clock::now() + std::chrono::duration<double>(StressSeconds());

  std::vector<std::thread> threads;
  // Sampler: the budget and the page cache of the backing file (<= 1 % of its pages) at every
  // sample, not only at the end.
  std::atomic<int64_t> max_cached{0};
  std::atomic<uint64_t> samples{0};
  threads.emplace_back([&] {
    const std::string file = env->service->config().file;
    while (!stop.load()) {
      const uint64_t resident = env->service->store().Stats().resident_units;
      if (resident > 2) fail.Add("budget: " + std::to_string(resident) + " units resident");
      const int64_t cached = testing::CachedPages(file, kBytes);
      if (cached < 0) fail.Add("mincore of the backing file failed");
      if (cached > max_cached.load()) max_cached.store(cached);
      samples.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  // Churn: random promotions and demotions on top of the 3 ms period thread.
  threads.emplace_back([&] {
    std::mt19937_64 rng(1);
    TierStore& store = env->service->store();
    while (!stop.load()) {
      const uint32_t u = static_cast<uint32_t>(rng() % kUnits);
      Status st = store.IsResident(u) ? store.Demote(u) : store.Promote(u);
      if (!st.ok() && st.code() != Code::kResourceExhausted) fail.Add("churn: " + st.ToString());
      if (st.code() == Code::kResourceExhausted) {
        for (uint32_t v = 0; v < kUnits; ++v) {
          if (store.IsResident(v)) (void)store.Demote(v);
        }
      }
      churns.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(1000));
    }
  });
  for (int wi = 0; wi < kWriters; ++wi) {
    threads.emplace_back([&, wi] {
      std::mt19937_64 rng(100 + wi);
      TieredClient& c = *clients[wi % 2];
      std::vector<uint32_t> seq(kWords, 0);
      while (Clock::now() < deadline && fail.count() == 0) {
        // 1..8 words inside one of this writer's chunks, or a run of its chunks' words in a
        // 4 KiB block (one write per chunk, so only its own words change).
        uint64_t chunk = (rng() % (kWords / 8));
        chunk -= chunk % kWriters;
        chunk += wi;
        if (chunk >= kWords / 8) continue;
        const uint64_t a = rng() % 8, b = a + 1 + rng() % (8 - a);
        uint64_t vals[8];
        for (uint64_t k = a; k < b; ++k) {
          const uint64_t w = chunk * 8 + k;
          ++seq[w];
          issued[w].store(seq[w]);
          vals[k - a] = Tag(w, seq[w]);
        }
        Status st = c.write(chunk * 64 + a * 8, std::as_bytes(std::span(vals, b - a)));
        if (!st.ok()) {
          fail.Add("write: " + st.ToString());
          break;
        }
        for (uint64_t k = a; k < b; ++k) acked[chunk * 8 + k].store(seq[chunk * 8 + k]);
        writes.fetch_add(1);
      }
    });
  }
  for (int ri = 0; ri < kReaders; ++ri) {
    threads.emplace_back([&, ri] {
      auto made = env->client_node->make_scheduler();
      if (!made.ok()) {
        fail.Add("scheduler: " + made.status().ToString());
        return;
      }
      Scheduler& sched = **made;
      std::mt19937_64 rng(200 + ri);
      TieredClient& c = *clients[ri % 2];
      while (Clock::now() < deadline && fail.count() == 0) {
        std::vector<std::vector<std::byte>> bufs(kLanes);
        std::vector<std::vector<uint32_t>> floor(kLanes);
        std::vector<TierReadOp> ops(kLanes);
        for (int l = 0; l < kLanes; ++l) {
          const size_t len = rng() % 4 == 0 ? 1 + rng() % (40 << 10) : 1 + rng() % 5000;
          ops[l].offset = rng() % (kBytes - len + 1);
          bufs[l].resize(len);
          ops[l].out = bufs[l];
          const uint64_t w0 = (ops[l].offset + 7) / 8, w1 = (ops[l].offset + len) / 8;
          for (uint64_t w = w0; w < w1; ++w) floor[l].push_back(acked[w].load());
        }
        Status st = sched.block_on(c.read_batch(sched, ops));
        if (!st.ok()) {
          fail.Add("read: " + st.ToString());
          break;
        }
        for (int l = 0; l < kLanes; ++l) {
          const uint64_t off = ops[l].offset, len = bufs[l].size();
          const uint64_t w0 = (off + 7) / 8, w1 = (off + len) / 8;
          for (uint64_t w = w0; w < w1; ++w) {
            uint64_t v;
            std::memcpy(&v, bufs[l].data() + (w * 8 - off), 8);
            const uint64_t idx = v & 0xffffff, sq = v >> 24 & 0xffffff;
            const char* what = nullptr;
            if (v == magic) {
              what = "pattern word";
            } else if (idx != w) {
              what = "foreign word";
            } else if ((v >> 48) != Check16(idx, sq)) {
              what = "torn word";
            } else if (sq < floor[l][w - w0]) {
              what = "stale word";
            } else if (sq > issued[w].load()) {
              what = "word from the future";
            }
            if (what != nullptr) {
              fail.Add(std::string(what) + " at word " + std::to_string(w) + ": " +
                       std::to_string(v) + " (seq " + std::to_string(sq) + ", acked before " +
                       std::to_string(floor[l][w - w0]) + ")");
              break;
            }
          }
          words_checked.fetch_add(w1 > w0 ? w1 - w0 : 0);
        }
        reads.fetch_add(kLanes);
      }
    });
  }
  // threads[0] samples and threads[1] churns until `stop`; the others end at the deadline.
  for (size_t i = 2; i < threads.size(); ++i) threads[i].join();
  stop.store(true);
  threads[0].join();
  threads[1].join();

  // No lost write: every word holds exactly its last acknowledged write.
  std::vector<uint64_t> final_words(kWords);
  auto bytes = std::as_writable_bytes(std::span(final_words));
  for (uint64_t at = 0; at < kBytes; at += 1 << 20) {
    ASSERT_TRUE(
        clients[0]->read(at, bytes.subspan(at, std::min<uint64_t>(1 << 20, kBytes - at))).ok());
  }
  uint64_t lost = 0;
  for (uint64_t w = 0; w < kWords; ++w) {
    if (final_words[w] != Tag(w, acked[w].load())) {
      if (++lost < 5) fail.Add("lost write at word " + std::to_string(w));
    }
  }
  const TierStats ts = env->service->store().Stats();
  const TieredClientStats cs = clients[0]->stats();
  std::printf(
      "reads %llu words %llu writes %llu churn %llu promotions %llu demotions %llu "
      "writebacks %llu; client0: hits %llu skips %llu pattern misses %llu false "
      "positives %llu rpc reads %llu bitmap pulls %llu; page cache max %lld of %llu pages in "
      "%llu samples\n",
      (unsigned long long)reads.load(), (unsigned long long)words_checked.load(),
      (unsigned long long)writes.load(), (unsigned long long)churns.load(),
      (unsigned long long)ts.promotions, (unsigned long long)ts.demotions,
      (unsigned long long)ts.writebacks, (unsigned long long)cs.one_sided_hits,
      (unsigned long long)cs.bitmap_skips, (unsigned long long)cs.pattern_misses,
      (unsigned long long)cs.false_positives, (unsigned long long)cs.rpc_reads,
      (unsigned long long)cs.bitmap_pulls, (long long)max_cached.load(),
      (unsigned long long)(kBytes / 4096), (unsigned long long)samples.load());
  EXPECT_EQ(fail.count(), 0u) << fail.Report();
  EXPECT_EQ(lost, 0u);
  EXPECT_GT(reads.load(), 100u);
  EXPECT_GT(writes.load(), 100u);
  EXPECT_GT(ts.promotions, 20u);
  EXPECT_GT(ts.demotions, 20u);
  EXPECT_LE(ts.resident_units, 2u);
  EXPECT_GT(samples.load(), 0u);
  EXPECT_LE(max_cached.load() * 100, int64_t(kBytes / 4096))
      << "backing file pages in the page cache: " << max_cached.load() << " of " << kBytes / 4096
      << " (more than 1 %)";
  EXPECT_GT(cs.one_sided_hits + clients[1]->stats().one_sided_hits, 0u);
}

INSTANTIATE_TEST_SUITE_P(Backends, TierStress, ::testing::Values("tcp", "fabric:shm"),
                         testing::BackendName);

}  // namespace
}  // namespace farmem::tier
