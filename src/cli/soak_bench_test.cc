// Tests for the pure parts of `farmem bench soak` (bench/soak_internal.h) and the shared JSON
// targets writer (bench/bench_json.h): content pattern, malformed frames (each one checked
// against the server's own decoders), STAT parsing for the leak check, and target judging.
#include "soak_internal.h"

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "bench_json.h"
#include "farmem/transport.h"
#include "node/bootstrap.h"
#include "transport/tcp/frame_codec.h"

namespace farmem::bench::soak {
namespace {

TEST(SoakPattern, MatchesOnlyTheSameIdAndSeq) {
  std::vector<std::byte> buf(300);
  FillPattern(7, 3, buf);
  EXPECT_TRUE(PatternMatches(7, 3, buf));
  EXPECT_FALSE(PatternMatches(7, 4, buf));
  EXPECT_FALSE(PatternMatches(8, 3, buf));
  for (size_t i : {0, 9, 16, 299}) {
    auto copy = buf;
    copy[i] ^= std::byte{1};
    EXPECT_FALSE(PatternMatches(7, 3, copy)) << "byte " << i;
  }
  // Prefixes (objects smaller than the header, reads of a part) hold the same bytes.
  for (size_t n : {0, 1, 5, 8, 12, 16, 17}) {
    std::vector<std::byte> small(n);
    FillPattern(7, 3, small);
    EXPECT_TRUE(PatternMatches(7, 3, small)) << n;
    EXPECT_TRUE(std::equal(small.begin(), small.end(), buf.begin())) << n;
  }
  std::vector<std::byte> other(300);
  FillPattern(9, 1, other);
  EXPECT_NE(DescribeContent(other, 7, 3).find("holds id 9 seq 1"), std::string::npos);
  auto corrupt = buf;
  corrupt[100] ^= std::byte{0x40};
  EXPECT_NE(DescribeContent(corrupt, 7, 3).find("corrupt from byte 100"), std::string::npos);
}

TEST(SoakGarbage, EveryBootstrapFrameIsRefusedByTheListener) {
  const std::string token = "farmem";
  for (uint64_t seed = 0; seed < 20; ++seed) {
    for (int v = 0; v < kGarbageVariants; ++v) {
      const auto bytes = GarbageFrame(Port::kBootstrap, v, seed, token);
      ASSERT_FALSE(bytes.empty());
      const auto f = node::ParseHelloFrame(
          std::span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
      SCOPED_TRACE(std::string(GarbageName(Port::kBootstrap, v)) + " seed " + std::to_string(seed));
      if (f.kind == node::HelloFrame::Kind::kHello) {
        EXPECT_NE(f.hello.token, token);  // well-formed, but the server rejects the token
      } else {
        EXPECT_NE(f.kind, node::HelloFrame::Kind::kNeedMore);  // refused at once
      }
    }
  }
}

TEST(SoakGarbage, EveryDataFrameIsRefusedBeforeAuthentication) {
  const std::string token = "farmem";
  const size_t max_unauth = TcpLimits{}.max_unauthenticated_bytes;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    for (int v = 0; v < kGarbageVariants; ++v) {
      const auto bytes = GarbageFrame(Port::kData, v, seed, token);
      SCOPED_TRACE(std::string(GarbageName(Port::kData, v)) + " seed " + std::to_string(seed));
      ASSERT_GE(bytes.size(), sizeof(tcpwire::FrameHeader));
      tcpwire::FrameView f;
      const auto r = tcpwire::DecodeFrame(bytes, {}, &f);
      const uint8_t opcode = bytes[4];
      const bool is_hello = opcode == static_cast<uint8_t>(tcpwire::Opcode::kHello);
      switch (r.state) {
        case tcpwire::DecodeState::kError:
          break;  // corrupt stream: closed
        case tcpwire::DecodeState::kNeedMore:
          // Only refused if the header alone gives it away: not a hello, or too big.
          EXPECT_TRUE(!is_hello || r.needed > max_unauth) << r.needed;
          break;
        case tcpwire::DecodeState::kFrame:
          if (f.opcode == tcpwire::Opcode::kHello) {
            EXPECT_NE(std::string(reinterpret_cast<const char*>(f.data.data()), f.data.size()),
                      token);
          }
          break;
      }
    }
  }
  // A real hello decodes with the token, so the check above would notice a correct one.
  tcpwire::ByteQueue q;
  tcpwire::EncodeHello(q, token);
  tcpwire::FrameView f;
  ASSERT_EQ(tcpwire::DecodeFrame(q.readable(), {}, &f).state, tcpwire::DecodeState::kFrame);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(f.data.data()), f.data.size()), token);
}

TEST(SoakStat, CountsAndSessionTtl) {
  auto stat =
      nlohmann::json::parse(R"({"memory": {"allocations": 5}, "objects": {"live_objects": 12}})");
  StatCounts c = ParseStatCounts(stat);
  EXPECT_EQ(c.raw_allocations, 5);
  EXPECT_EQ(c.live_objects, 12);
  EXPECT_FALSE(c.has_sessions);
  EXPECT_FALSE(c.session_ttl_seconds);
  EXPECT_DOUBLE_EQ(LeakWaitSeconds(c), kAssumedSessionTtlSeconds + kLeakWaitMarginSeconds);

  stat["sessions"] = {{"open", 2}, {"ttl_ms", 4000}};
  c = ParseStatCounts(stat);
  EXPECT_TRUE(c.has_sessions);
  ASSERT_TRUE(c.session_ttl_seconds);
  EXPECT_DOUBLE_EQ(*c.session_ttl_seconds, 4.0);
  EXPECT_DOUBLE_EQ(LeakWaitSeconds(c), 4.0 + kLeakWaitMarginSeconds);

  stat["sessions"] = {{"config", {{"client_ttl_seconds", 7}}}, {"owned_objects", 1}};
  EXPECT_DOUBLE_EQ(*ParseStatCounts(stat).session_ttl_seconds, 7.0);
  stat["sessions"] = {{"open", 0}};  // a section without a TTL: the assumed one
  c = ParseStatCounts(stat);
  EXPECT_TRUE(c.has_sessions);
  EXPECT_FALSE(c.session_ttl_seconds);
  EXPECT_EQ(ParseStatCounts(nlohmann::json::array()).live_objects, -1);
}

TEST(SoakTargets, ThroughputOnTheMedianRoundRatio) {
  const std::vector<double> base = {100, 100, 100, 100, 100};
  const std::vector<double> hostile = {90, 50, 85, 95, 81};  // ratios .9 .5 .85 .95 .81
  TargetRecord t = JudgeThroughput(hostile, base, 0.8);
  ASSERT_TRUE(t.ratio);
  EXPECT_DOUBLE_EQ(*t.ratio, 0.85);
  EXPECT_DOUBLE_EQ(*t.ratio_min, 0.5);
  EXPECT_DOUBLE_EQ(*t.ratio_max, 0.95);
  EXPECT_EQ(t.result, TargetResult::kPass);
  const std::vector<double> worse = {70, 50, 85, 75, 81};
  EXPECT_EQ(JudgeThroughput(worse, base, 0.8).result, TargetResult::kMiss);
  EXPECT_EQ(JudgeThroughput({}, {}, 0.8).result, TargetResult::kUnknown);
}

TEST(SoakTargets, RssOnTheWholeRunPeakAgainstTheMemoryBudget) {
  const double mib = 1024.0 * 1024.0;
  const std::vector<double> base = {30 * mib, 32 * mib, 31 * mib, 32 * mib, 32 * mib};
  const std::vector<double> hostile = {33 * mib, 33 * mib, 60 * mib, 33 * mib, 34 * mib};
  TargetRecord t = JudgeRss(hostile, base, 50 * mib, 1.1);
  EXPECT_DOUBLE_EQ(t.value, 60);
  EXPECT_DOUBLE_EQ(t.baseline, 50);
  ASSERT_TRUE(t.ratio);
  EXPECT_DOUBLE_EQ(*t.ratio, 60.0 / 50.0);  // one bad round is enough to miss
  EXPECT_EQ(t.result, TargetResult::kMiss);
  EXPECT_DOUBLE_EQ(t.extra["baseline_rounds_peak_mib"].get<double>(), 32);
  EXPECT_DOUBLE_EQ(t.extra["growth_over_baseline_rounds_mib"].get<double>(), 28);
  const std::vector<double> fine = {33 * mib, 33 * mib, 54 * mib, 33 * mib, 35 * mib};
  EXPECT_EQ(JudgeRss(fine, base, 50 * mib, 1.1).result, TargetResult::kPass);
  // No budget in STAT: no ratio, no verdict.
  EXPECT_EQ(JudgeRss(fine, base, -1, 1.1).result, TargetResult::kUnknown);
}

TEST(SoakTargets, ZeroCountsAndTheSharedJsonWriter) {
  EXPECT_EQ(JudgeZero("leaks", 0, "").result, TargetResult::kPass);
  EXPECT_EQ(JudgeZero("leaks", 3, "").result, TargetResult::kMiss);
  EXPECT_EQ(JudgeZero("leaks", std::nan(""), "").result, TargetResult::kUnknown);

  std::vector<TargetRecord> ts = {
      JudgeZero("leaks", 3, "why"),
      JudgeThroughput(std::vector<double>{2, 4}, std::vector<double>{4, 4}, 0.8)};
  const nlohmann::json j = TargetsJson(ts);
  ASSERT_EQ(j.size(), 2u);
  for (const auto& t : j)
    for (const char* key : {"name", "value", "baseline", "ratio", "limit", "result"})
      EXPECT_TRUE(t.contains(key)) << key;
  EXPECT_TRUE(j[0]["ratio"].is_null());
  EXPECT_EQ(j[0]["result"], "MISS");
  EXPECT_EQ(j[0]["detail"], "why");
  EXPECT_FALSE(j[0].contains("round_ratios"));
  EXPECT_DOUBLE_EQ(j[1]["ratio"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j[1]["ratio_min"].get<double>(), 0.5);
  EXPECT_EQ(j[1]["round_ratios"].size(), 2u);
  EXPECT_EQ(j[1]["result"], "MISS");

  // Judged on rounds but none was valid: the round keys are there, null / empty; extra keys of a
  // benchmark's own are merged in.
  TargetRecord none{.name = "x", .limit = "<= 1x baseline"};
  none.SetRounds(RoundRatios{});
  none.extra["metric"] = "p50_us";
  const nlohmann::json n = TargetJson(none);
  EXPECT_TRUE(n["ratio"].is_null());
  EXPECT_TRUE(n["ratio_min"].is_null());
  EXPECT_TRUE(n["round_ratios"].empty());
  EXPECT_EQ(n["metric"], "p50_us");
  EXPECT_EQ(n["result"], "n/a");
  EXPECT_TRUE(n["value"].is_null());  // NaN is written as null
}

}  // namespace
}  // namespace farmem::bench::soak
