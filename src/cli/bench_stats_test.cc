// Tests for the helpers behind `farmem bench raw`: statistics (bench/bench_stats.h: percentiles,
// summaries, ratios, formatting, target checks), the target-process plumbing and both baselines.
#include "bench_stats.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "raw_bench_internal.h"
#include "target_process.h"

namespace farmem::bench {
namespace {

TEST(BenchStatsTest, PercentileEmptyIsNaN) {
  std::vector<int64_t> v;
  EXPECT_TRUE(std::isnan(Percentile(v, 50)));
}

TEST(BenchStatsTest, PercentileSingleSample) {
  std::vector<int64_t> v{42};
  EXPECT_EQ(Percentile(v, 0), 42);
  EXPECT_EQ(Percentile(v, 50), 42);
  EXPECT_EQ(Percentile(v, 100), 42);
}

TEST(BenchStatsTest, PercentileNearestRankOnOneToHundred) {
  // Shuffled 1..100: the nearest-rank p-th percentile is exactly p.
  std::vector<int64_t> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  std::mt19937 rng(7);
  std::shuffle(v.begin(), v.end(), rng);
  EXPECT_EQ(Percentile(v, 50), 50);
  EXPECT_EQ(Percentile(v, 99), 99);
  EXPECT_EQ(Percentile(v, 100), 100);
  EXPECT_EQ(Percentile(v, 1), 1);
  EXPECT_EQ(Percentile(v, 0), 1);
}

TEST(BenchStatsTest, PercentileSmallSetRoundsUp) {
  // n = 4: p50 -> rank 2, p99 -> rank 4 (ceil), p25 -> rank 1.
  std::vector<int64_t> v{40, 10, 30, 20};
  EXPECT_EQ(Percentile(v, 50), 20);
  EXPECT_EQ(Percentile(v, 99), 40);
  EXPECT_EQ(Percentile(v, 25), 10);
  EXPECT_EQ(Percentile(v, 26), 20);
}

TEST(BenchStatsTest, PercentileClampsOutOfRangeP) {
  std::vector<int64_t> v{5, 1, 9};
  EXPECT_EQ(Percentile(v, -10), 1);
  EXPECT_EQ(Percentile(v, 250), 9);
}

TEST(BenchStatsTest, SummarizeConvertsToMicroseconds) {
  // 1000 samples: 990 at 1 us and 10 at 100 us -> p50 = 1 us, p99 = 1 us (rank 990), max = 100 us.
  std::vector<int64_t> v(990, 1000);
  v.insert(v.end(), 10, 100000);
  LatencySummary s = Summarize(v);
  EXPECT_EQ(s.count, 1000u);
  EXPECT_DOUBLE_EQ(s.p50_us, 1.0);
  EXPECT_DOUBLE_EQ(s.p99_us, 1.0);
  EXPECT_DOUBLE_EQ(s.min_us, 1.0);
  EXPECT_DOUBLE_EQ(s.max_us, 100.0);
  EXPECT_NEAR(s.mean_us, (990 * 1.0 + 10 * 100.0) / 1000.0, 1e-9);

  // One more slow sample pushes rank 991 (p99 of 1001 samples = ceil(990.99)) into the tail.
  v.push_back(100000);
  s = Summarize(v);
  EXPECT_DOUBLE_EQ(s.p99_us, 100.0);
}

TEST(BenchStatsTest, SummarizeEmpty) {
  std::vector<int64_t> v;
  LatencySummary s = Summarize(v);
  EXPECT_EQ(s.count, 0u);
  EXPECT_TRUE(std::isnan(s.p50_us));
  EXPECT_TRUE(std::isnan(s.p99_us));
}

TEST(BenchStatsTest, RatioRejectsMissingBaselines) {
  EXPECT_DOUBLE_EQ(*Ratio(3.0, 2.0), 1.5);
  EXPECT_DOUBLE_EQ(*Ratio(0.0, 2.0), 0.0);
  EXPECT_FALSE(Ratio(1.0, 0.0).has_value());
  EXPECT_FALSE(Ratio(1.0, -1.0).has_value());
  EXPECT_FALSE(Ratio(std::nan(""), 1.0).has_value());
  EXPECT_FALSE(Ratio(1.0, std::nan("")).has_value());
  EXPECT_FALSE(Ratio(-1.0, 1.0).has_value());
}

TEST(BenchStatsTest, FormatRatio) {
  EXPECT_EQ(FormatRatio(0.8512), "0.85x");
  EXPECT_EQ(FormatRatio(1.0), "1.00x");
  EXPECT_EQ(FormatRatio(12.34), "12.3x");
  EXPECT_EQ(FormatRatio(150.4), "150x");
  EXPECT_EQ(FormatRatio(std::nullopt), "n/a");
  EXPECT_EQ(FormatRatio(std::optional<double>(INFINITY)), "n/a");
}

TEST(BenchStatsTest, FormatRateAndMicros) {
  EXPECT_EQ(FormatRate(2210000), "2.21 M/s");
  EXPECT_EQ(FormatRate(823400), "823.4 k/s");
  EXPECT_EQ(FormatRate(950), "950 /s");
  EXPECT_EQ(FormatRate(std::nan("")), "n/a");
  EXPECT_EQ(FormatMicros(1.234), "1.23 us");
  EXPECT_EQ(FormatMicros(45.67), "45.7 us");
  EXPECT_EQ(FormatMicros(1234.4), "1234 us");
  EXPECT_EQ(FormatMicros(std::nan("")), "n/a");
}

TEST(BenchStatsTest, TargetChecks) {
  // shm read p50 1.8 us vs process_vm_readv 1.26 us: 1.43x <= 1.5x passes.
  EXPECT_EQ(CheckAtMost(1.8, 1.26, 1.5), TargetResult::kPass);
  EXPECT_EQ(CheckAtMost(2.0, 1.26, 1.5), TargetResult::kMiss);
  EXPECT_EQ(CheckAtLeast(1.6e6, 2.2e6, 0.7), TargetResult::kPass);
  EXPECT_EQ(CheckAtLeast(1.5e6, 2.2e6, 0.7), TargetResult::kMiss);
  EXPECT_EQ(CheckAtLeast(1.0, std::nan(""), 0.7), TargetResult::kUnknown);
  EXPECT_EQ(CheckAtMost(std::nan(""), 1.0, 1.5), TargetResult::kUnknown);
  EXPECT_STREQ(TargetResultName(TargetResult::kPass), "PASS");
  EXPECT_STREQ(TargetResultName(TargetResult::kMiss), "MISS");
}

TEST(BenchPipeTest, MessageRoundTripAndErrors) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ASSERT_TRUE(WriteMessage(fds[1], true, std::string("addr\0x", 6)).ok());
  ASSERT_TRUE(WriteMessage(fds[1], false, "boom").ok());
  auto m = ReadMessage(fds[0], std::chrono::milliseconds(1000));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(*m, std::string("addr\0x", 6));
  auto e = ReadMessage(fds[0], std::chrono::milliseconds(1000));
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), Code::kUnavailable);
  EXPECT_EQ(e.status().message(), "boom");
  // Nothing written: the read gives up at its deadline instead of hanging.
  auto t = ReadMessage(fds[0], std::chrono::milliseconds(20));
  EXPECT_EQ(t.status().code(), Code::kTimedOut);
  // A length beyond the limit is a protocol error, not an allocation.
  unsigned char bad[5] = {1, 0xff, 0xff, 0xff, 0x7f};
  ASSERT_EQ(::write(fds[1], bad, sizeof(bad)), 5);
  EXPECT_EQ(ReadMessage(fds[0], std::chrono::milliseconds(1000)).status().code(), Code::kProtocol);
  // Writer gone: EOF is reported as Unavailable.
  ::close(fds[1]);
  EXPECT_EQ(ReadMessage(fds[0], std::chrono::milliseconds(1000)).status().code(),
            Code::kUnavailable);
  ::close(fds[0]);
}

TEST(BenchTargetProcessTest, StartsReportsAndStops) {
  auto t = TargetProcess::Fork("hello", [](int report_fd, int control_fd) {
    if (WriteMessage(report_fd, true, "ready").ok()) WaitForStop(control_fd, kMaxTargetLifetime);
  });
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE((*t)->Alive());
  auto ready = (*t)->Start(std::chrono::seconds(10));
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  EXPECT_EQ(*ready, "ready");
  (*t)->Stop();
  EXPECT_FALSE((*t)->Alive());
  // Starting a stopped target is an error, not a hang.
  EXPECT_FALSE((*t)->Start(std::chrono::seconds(1)).ok());
}

TEST(BenchTargetProcessTest, ChildFailureAndSilentExitAreReported) {
  auto failing = TargetProcess::Fork("failing", [](int report_fd, int) {
    (void)WriteMessage(report_fd, false, "no such provider");
  });
  ASSERT_TRUE(failing.ok());
  auto r = (*failing)->Start(std::chrono::seconds(10));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("no such provider"), std::string::npos);

  auto silent = TargetProcess::Fork("silent", [](int, int) {});
  ASSERT_TRUE(silent.ok());
  auto s = (*silent)->Start(std::chrono::seconds(10));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kUnavailable);
}

TEST(BenchBaselineTest, TcpEchoMeasuresPipelinedRequests) {
  auto server = TargetProcess::Fork("echo", EchoServerRole());
  ASSERT_TRUE(server.ok());
  auto ready = (*server)->Start(std::chrono::seconds(10));
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  ASSERT_EQ(ready->size(), sizeof(uint16_t));
  uint16_t port;
  std::memcpy(&port, ready->data(), sizeof(port));
  for (size_t size : {size_t{64}, size_t{4096}}) {
    auto m = RunEchoCase(port, size, 4, 0.01, 0.05, std::chrono::seconds(5));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_GT(m->ops, 0u);
    EXPECT_EQ(m->lat_ns.size(), m->ops);
    for (int64_t ns : m->lat_ns) ASSERT_GT(ns, 0);
  }
  EXPECT_EQ(RunEchoCase(port, 4, 1, 0.01, 0.05, std::chrono::seconds(5)).status().code(),
            Code::kInvalidArgument);
  (*server)->Stop();
  // Server gone: the client fails with a Status instead of hanging.
  EXPECT_FALSE(RunEchoCase(port, 64, 1, 0.01, 0.05, std::chrono::seconds(2)).ok());
}

TEST(BenchBaselineTest, ProcessVmReadvReadsThePattern) {
  auto target = TargetProcess::Fork("pvm", PvmTargetRole());
  ASSERT_TRUE(target.ok());
  auto ready = (*target)->Start(std::chrono::seconds(10));
  ASSERT_TRUE(ready.ok()) << ready.status().ToString();
  ASSERT_EQ(ready->size(), sizeof(uint64_t));
  uint64_t addr;
  std::memcpy(&addr, ready->data(), sizeof(addr));
  auto m = RunPvmCase((*target)->pid(), addr, 4096, 0.01, 0.05);
  if (!m.ok() && m.status().message().find("Operation not permitted") != std::string::npos)
    GTEST_SKIP() << "process_vm_readv not permitted here: " << m.status().ToString();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_GT(m->ops, 0u);
  // A wrong address is reported, not crashed on.
  EXPECT_FALSE(RunPvmCase((*target)->pid(), 8, 64, 0.0, 0.01).ok());
  (*target)->Stop();
}

}  // namespace
TEST(BenchStatsTest, PerRoundRatiosMedianAndSpread) {
  const std::vector<double> subject{10, 30, 20, 40, 0};
  const std::vector<double> baseline{10, 10, 10, 10, 10};
  const bench::RoundRatios r = bench::PerRoundRatios(subject, baseline);
  ASSERT_EQ(r.ratios.size(), 5u);
  EXPECT_DOUBLE_EQ(r.ratios[1], 3.0);  // round order kept
  EXPECT_DOUBLE_EQ(r.median, 2.0);
  EXPECT_DOUBLE_EQ(r.min, 0.0);
  EXPECT_DOUBLE_EQ(r.max, 4.0);
  EXPECT_EQ(bench::FormatRoundRatios(r), "2.00x (0.00-4.00x, 5 rounds)");
}

TEST(BenchStatsTest, PerRoundRatiosSkipInvalidRoundsAndPairOnlyCommonRounds) {
  const double nan = std::nan("");
  const std::vector<double> subject{4, nan, 6, 8, 100};
  const std::vector<double> baseline{2, 2, 0, 2};  // round 2: no valid baseline; round 4: none
  const bench::RoundRatios r = bench::PerRoundRatios(subject, baseline);
  ASSERT_EQ(r.ratios.size(), 2u);
  EXPECT_DOUBLE_EQ(r.median, 3.0);  // even count: mean of the middle two (2 and 4)
  const bench::RoundRatios none = bench::PerRoundRatios({}, baseline);
  EXPECT_TRUE(none.ratios.empty());
  EXPECT_TRUE(std::isnan(none.median));
  EXPECT_EQ(bench::FormatRoundRatios(none), "n/a");
}

}  // namespace farmem::bench
