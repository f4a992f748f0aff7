// Tests of the pure parts of the object throughput/compaction benchmarks: the Zipf and uniform
// key choosers (statistical, generous tolerances, fixed seeds) and the timeline dip/recovery math.
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "machine_info.h"
#include "objects_throughput_internal.h"
#include "zipf.h"

namespace farmem::bench {
namespace {

TEST(BenchZipf, ZetaMatchesDirectSum) {
  EXPECT_DOUBLE_EQ(Zeta(1, 0.99), 1.0);
  EXPECT_NEAR(Zeta(2, 0.99), 1.0 + 1.0 / std::pow(2.0, 0.99), 1e-12);
  // theta = 0: every term is 1.
  EXPECT_DOUBLE_EQ(Zeta(1000, 0.0), 1000.0);
}

TEST(BenchZipf, FrequenciesFollowTheDistribution) {
  constexpr uint64_t kN = 1000;
  constexpr int kSamples = 1000000;
  ZipfGenerator zipf(kN, 0.99);
  SplitMix64 rng(12345);
  std::vector<uint64_t> hist(kN, 0);
  for (int i = 0; i < kSamples; ++i) {
    uint64_t r = zipf.Next(rng);
    ASSERT_LT(r, kN);
    ++hist[r];
  }
  auto freq = [&](uint64_t r) { return static_cast<double>(hist[r]) / kSamples; };
  // Ranks 0 and 1 are exact in Gray's method; ~7.5 % and ~3.8 % of the samples here.
  EXPECT_NEAR(freq(0), zipf.Probability(0), 0.05 * zipf.Probability(0));
  EXPECT_NEAR(freq(1), zipf.Probability(1), 0.05 * zipf.Probability(1));
  // The tail is approximated: compare the mass of the hottest 10 % and of rank groups.
  double top = 0, top_exact = 0;
  for (uint64_t r = 0; r < kN / 10; ++r) {
    top += freq(r);
    top_exact += zipf.Probability(r);
  }
  EXPECT_NEAR(top, top_exact, 0.1 * top_exact);
  // Skewed, and monotone on average: each decade of ranks gets less mass per rank.
  double d1 = 0, d2 = 0, d3 = 0;
  for (uint64_t r = 0; r < 10; ++r) d1 += freq(r) / 10;
  for (uint64_t r = 10; r < 100; ++r) d2 += freq(r) / 90;
  for (uint64_t r = 100; r < 1000; ++r) d3 += freq(r) / 900;
  EXPECT_GT(d1, 3 * d2);
  EXPECT_GT(d2, 3 * d3);
  EXPECT_GT(hist[kN - 1] + hist[kN - 2] + hist[kN - 3], 0u) << "the tail is never drawn";
}

TEST(BenchZipf, LargeKeySpaceStaysInRange) {
  constexpr uint64_t kN = 1000000;
  ZipfGenerator zipf(kN, 0.99);
  SplitMix64 rng(7);
  uint64_t zeros = 0, high = 0;
  constexpr int kSamples = 200000;
  for (int i = 0; i < kSamples; ++i) {
    uint64_t r = zipf.Next(rng);
    ASSERT_LT(r, kN);
    zeros += r == 0;
    high += r >= kN / 2;
  }
  EXPECT_NEAR(static_cast<double>(zeros) / kSamples, zipf.Probability(0),
              0.1 * zipf.Probability(0));
  EXPECT_GT(high, 0u);
}

TEST(BenchZipf, UniformChooserCoversKeysEvenly) {
  constexpr uint64_t kN = 100;
  constexpr int kSamples = 1000000;
  KeyChooser chooser(kN, nullptr, 99);
  std::vector<uint64_t> hist(kN, 0);
  for (int i = 0; i < kSamples; ++i) {
    uint64_t k = chooser.Next();
    ASSERT_LT(k, kN);
    ++hist[k];
  }
  // 10 000 expected per key, standard deviation ~100: +-10 % is ten sigma.
  for (uint64_t k = 0; k < kN; ++k) EXPECT_NEAR(hist[k], 10000.0, 1000.0) << "key " << k;
}

TEST(BenchZipf, RankScramblerIsABijectionThatSeparatesHotRanks) {
  for (uint64_t n : {1ull, 2ull, 10ull, 100ull, 1000ull, 4096ull, 100003ull}) {
    RankScrambler s(n);
    std::vector<bool> seen(n, false);
    for (uint64_t r = 0; r < n; ++r) {
      const uint64_t k = s(r);
      ASSERT_LT(k, n);
      ASSERT_FALSE(seen[k]) << "n " << n << ": rank " << r << " collides";
      seen[k] = true;
    }
  }
  // The ten hottest ranks of a million keys land far apart (no two within 1000 keys).
  RankScrambler s(1000000);
  std::vector<uint64_t> hot;
  for (uint64_t r = 0; r < 10; ++r) hot.push_back(s(r));
  std::sort(hot.begin(), hot.end());
  for (size_t i = 1; i < hot.size(); ++i) EXPECT_GT(hot[i] - hot[i - 1], 1000u);
}

TEST(BenchZipf, ScrambledChooserKeepsTheRankFrequencies) {
  // The hottest key is the scrambled rank 0 and is drawn with rank 0's probability.
  constexpr uint64_t kN = 1000;
  ZipfGenerator zipf(kN, 0.99);
  KeyChooser chooser(kN, &zipf, 7);
  const uint64_t hottest = RankScrambler(kN)(0);
  constexpr int kSamples = 200000;
  int hits = 0;
  for (int i = 0; i < kSamples; ++i) hits += chooser.Next() == hottest;
  EXPECT_NEAR(static_cast<double>(hits) / kSamples, zipf.Probability(0),
              0.05 * zipf.Probability(0));
}

TEST(BenchZipf, ChoosersWithTheSameSeedAgree) {
  ZipfGenerator zipf(5000, 0.99);
  KeyChooser a(5000, &zipf, 3), b(5000, &zipf, 3), c(5000, &zipf, 4);
  int same_c = 0;
  for (int i = 0; i < 1000; ++i) {
    uint64_t x = a.Next();
    ASSERT_EQ(x, b.Next());
    same_c += x == c.Next();
  }
  EXPECT_LT(same_c, 500) << "different seeds should give different streams";
}

TEST(BenchTimeline, DipAndRecovery) {
  // 100 ms buckets: 0..1 warm-up (skipped), 2..9 before (100), 10..12 during, 13..19 after (98).
  std::vector<uint64_t> counts(20, 100);
  counts[0] = 10;
  counts[1] = 50;
  counts[10] = 70;
  counts[11] = 60;
  counts[12] = 90;
  for (size_t b = 13; b < 20; ++b) counts[b] = 98;
  TimelineSummary s = SummarizeTimeline(counts, 100, 1000, 1250, 2);
  EXPECT_EQ(s.before_buckets, 8u);
  EXPECT_EQ(s.during_buckets, 3u);  // 1000-1100, 1100-1200, 1200-1300 (holds the end)
  EXPECT_EQ(s.after_buckets, 7u);
  EXPECT_DOUBLE_EQ(s.before_mean, 100.0);
  EXPECT_DOUBLE_EQ(s.during_min, 60.0);
  EXPECT_DOUBLE_EQ(s.during_mean, 220.0 / 3);
  EXPECT_DOUBLE_EQ(s.after_mean, 98.0);
  EXPECT_DOUBLE_EQ(s.dip, 1.0 - 220.0 / 300);  // mean of the during buckets
  EXPECT_DOUBLE_EQ(s.worst_bucket_dip, 0.4);   // the lowest one
  EXPECT_DOUBLE_EQ(s.recovery, 0.98);
  EXPECT_TRUE(s.missing.empty()) << s.missing;
  // Last quarter of 7 after buckets = the last one; 98 >= 95: recovered at the first after bucket
  // (1300 ms), 50 ms after compaction ended.
  EXPECT_DOUBLE_EQ(s.tail_mean, 98.0);
  EXPECT_DOUBLE_EQ(s.recovery_tail, 0.98);
  EXPECT_EQ(s.recovered_after_ms, 50);
}

TEST(BenchTimeline, LazyCorrectionShowsInTheTail) {
  // before 100; during 10; after: a slow correction pass (50) then faster than before (120).
  std::vector<uint64_t> counts{100, 100, 100, 100, 10, 50, 50, 50, 50, 120, 120, 120, 120};
  TimelineSummary s = SummarizeTimeline(counts, 100, 400, 500, 0);
  EXPECT_EQ(s.after_buckets, 8u);
  EXPECT_DOUBLE_EQ(s.recovery, (4 * 50 + 4 * 120) / 8.0 / 100.0);
  EXPECT_DOUBLE_EQ(s.tail_mean, 120.0);  // last 2 of 8
  EXPECT_DOUBLE_EQ(s.recovery_tail, 1.2);
  EXPECT_EQ(s.recovered_after_ms, 400);  // bucket 9 starts at 900 ms, compaction ended at 500
  // Never back to 95 %: -1.
  std::vector<uint64_t> low{100, 100, 10, 90, 90};
  EXPECT_EQ(SummarizeTimeline(low, 100, 200, 300, 0).recovered_after_ms, -1);
}

TEST(BenchTimeline, WarmupBucketsAreNotTheBaseline) {
  std::vector<uint64_t> counts{1, 100, 100, 50, 100, 100};
  TimelineSummary with_skip = SummarizeTimeline(counts, 100, 300, 350, 1);
  EXPECT_DOUBLE_EQ(with_skip.before_mean, 100.0);
  TimelineSummary without = SummarizeTimeline(counts, 100, 300, 350, 0);
  EXPECT_DOUBLE_EQ(without.before_mean, 201.0 / 3);
  EXPECT_DOUBLE_EQ(with_skip.dip, 0.5);
}

TEST(BenchTimeline, CompactionInsideOneBucketAndAtAnEdge) {
  std::vector<uint64_t> counts{100, 100, 80, 100, 100};
  // Start and end inside bucket 2.
  TimelineSummary s = SummarizeTimeline(counts, 100, 210, 260, 0);
  EXPECT_EQ(s.before_buckets, 2u);
  EXPECT_EQ(s.during_buckets, 1u);
  EXPECT_EQ(s.after_buckets, 2u);
  EXPECT_DOUBLE_EQ(s.dip, 0.2);
  EXPECT_DOUBLE_EQ(s.worst_bucket_dip, 0.2);
  // An instantaneous compaction exactly at a bucket edge still has a "during" bucket.
  TimelineSummary e = SummarizeTimeline(counts, 100, 200, 200, 0);
  EXPECT_EQ(e.before_buckets, 2u);
  EXPECT_EQ(e.during_buckets, 1u);
  EXPECT_EQ(e.after_buckets, 2u);
  // Ending exactly at a bucket edge: the next bucket is "after".
  TimelineSummary f = SummarizeTimeline(counts, 100, 150, 300, 0);
  EXPECT_EQ(f.before_buckets, 1u);
  EXPECT_EQ(f.during_buckets, 2u);
  EXPECT_EQ(f.after_buckets, 2u);
}

TEST(BenchTimeline, MissingPhasesAreReported) {
  std::vector<uint64_t> counts{100, 100, 100, 100};
  TimelineSummary late = SummarizeTimeline(counts, 100, 250, 900, 0);
  EXPECT_EQ(late.after_buckets, 0u);
  EXPECT_TRUE(std::isnan(late.recovery));
  EXPECT_FALSE(std::isnan(late.dip));
  EXPECT_NE(late.missing.find("did not end"), std::string::npos) << late.missing;

  TimelineSummary early = SummarizeTimeline(counts, 100, 0, 50, 0);
  EXPECT_EQ(early.before_buckets, 0u);
  EXPECT_TRUE(std::isnan(early.dip));
  EXPECT_TRUE(std::isnan(early.recovery));
  EXPECT_NE(early.missing.find("no bucket before"), std::string::npos) << early.missing;

  std::vector<uint64_t> zeros{0, 0, 5, 5};
  TimelineSummary z = SummarizeTimeline(zeros, 100, 200, 250, 0);
  EXPECT_TRUE(std::isnan(z.dip));
  EXPECT_NE(z.missing.find("no read completed"), std::string::npos) << z.missing;

  TimelineSummary bad = SummarizeTimeline(counts, 100, 300, 200, 0);
  EXPECT_FALSE(bad.missing.empty());
}

// In a thread of its own, so the test process keeps its CPU mask.
TEST(BenchPinning, PinsTheCallingThreadAndRejectsBadCpus) {
  std::thread([] {
    cpu_set_t before;
    ASSERT_EQ(sched_getaffinity(0, sizeof(before), &before), 0);
    int first = -1;
    for (int c = 0; c < CPU_SETSIZE && first < 0; ++c) {
      if (CPU_ISSET(c, &before)) first = c;
    }
    ASSERT_GE(first, 0);
    ASSERT_TRUE(PinToCpus({first}).ok());
    cpu_set_t after;
    ASSERT_EQ(sched_getaffinity(0, sizeof(after), &after), 0);
    EXPECT_EQ(CPU_COUNT(&after), 1);
    EXPECT_TRUE(CPU_ISSET(first, &after));
    // Threads created afterwards inherit the mask.
    std::thread([first] {
      cpu_set_t child;
      ASSERT_EQ(sched_getaffinity(0, sizeof(child), &child), 0);
      EXPECT_EQ(CPU_COUNT(&child), 1);
      EXPECT_TRUE(CPU_ISSET(first, &child));
    }).join();
    EXPECT_EQ(PinToCpus({-1}).code(), Code::kInvalidArgument);
    EXPECT_EQ(PinToCpus({CPU_SETSIZE}).code(), Code::kInvalidArgument);
    EXPECT_FALSE(PinToCpus({}).ok());  // an empty mask is refused by the kernel
  }).join();
}

}  // namespace
}  // namespace farmem::bench
