// Tests of the TeRM hotspot policy (pure function + decayed heat): ranking, budget target, fill,
// uniform access keeps the resident set, zero counts move nothing, hysteresis, bad input, and
// synthetic Zipf access streams (a stable hot set stops churning; a moved one is followed).
// FARMEM_TIER_FAULT=churn runs the streams with the memoryless, hysteresis-free policy. Single-
// threaded.
#include "tier/engine/tier_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "tier/engine/tier_store.h"

namespace farmem::tier {
namespace {

using U = std::vector<uint32_t>;

TierPolicyDecision Decide(const std::vector<uint64_t>& counts, const std::vector<uint8_t>& res,
                          uint64_t budget, uint32_t fill = 100) {
  auto d = TierPolicy::Decide(TierPolicyInput{counts, res, budget, fill});
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : TierPolicyDecision{};
}

// 40 units, four of them hot: max > 10 x average (skewed).
std::vector<uint64_t> SkewedCounts() {
  std::vector<uint64_t> c(40, 0);
  c[0] = 5;
  c[1] = 900;
  c[3] = 300;
  c[4] = 1000;
  c[5] = 7;
  return c;
}

TEST(TierPolicy, PromotesTheHottestThatFit) {
  std::vector<uint64_t> c = SkewedCounts();
  std::vector<uint8_t> r(c.size(), 0);
  auto d = Decide(c, r, 3);
  EXPECT_FALSE(d.uniform);
  EXPECT_EQ(d.target_units, 3u);
  EXPECT_EQ(d.promote, (U{4, 1, 3}));
  EXPECT_TRUE(d.demote.empty());
}

TEST(TierPolicy, SkipsResidentUnitsAndDemotesTheColdest) {
  std::vector<uint64_t> c = SkewedCounts();
  std::vector<uint8_t> r(c.size(), 0);
  r[0] = r[1] = r[2] = 1;  // 0 and 2 are cold now
  auto d = Decide(c, r, 3);
  EXPECT_EQ(d.promote, (U{4, 3}));  // 1 stays, not promoted again
  EXPECT_EQ(d.demote, (U{2, 0}));   // coldest first
}

TEST(TierPolicy, FillPercentSetsTheTarget) {
  EXPECT_EQ(TierPolicy::TargetUnits(100, 85), 85u);
  EXPECT_EQ(TierPolicy::TargetUnits(10, 85), 8u);
  EXPECT_EQ(TierPolicy::TargetUnits(3, 85), 2u);
  EXPECT_EQ(TierPolicy::TargetUnits(1, 85), 1u);  // never 0 with a budget
  EXPECT_EQ(TierPolicy::TargetUnits(0, 85), 0u);
  EXPECT_EQ(TierPolicy::TargetUnits(uint64_t{1} << 40, 100), uint64_t{1} << 40);
  std::vector<uint64_t> c = {100, 90, 80, 70, 60, 50, 40, 30, 20, 10,
                             0,   0,  0,  0,  0,  0,  0,  0,  0,  10000};
  std::vector<uint8_t> r(c.size(), 0);
  auto d = Decide(c, r, 10, 85);
  EXPECT_EQ(d.target_units, 8u);
  EXPECT_EQ(d.promote, (U{19, 0, 1, 2, 3, 4, 5, 6}));
}

TEST(TierPolicy, BudgetNeverExceeded) {
  std::vector<uint64_t> c(64);
  for (size_t i = 0; i < c.size(); ++i) c[i] = (i * 7919) % 97 + (i == 5 ? 100000 : 0);
  std::vector<uint8_t> r(c.size(), 0);
  for (size_t i = 0; i < c.size(); i += 5) r[i] = 1;  // 13 resident, budget 6
  auto d = Decide(c, r, 6, 100);
  uint64_t resident = 13 - d.demote.size() + d.promote.size();
  EXPECT_LE(resident, 6u);
}

TEST(TierPolicy, UniformAccessKeepsTheResidentSet) {
  std::vector<uint64_t> c = {10, 12, 9, 11, 10, 10, 13, 10};  // max <= 10 x average
  std::vector<uint8_t> r = {0, 0, 1, 0, 0, 1, 0, 0};          // the two coldest-ish are resident
  auto d = Decide(c, r, 3);
  EXPECT_TRUE(d.uniform);
  EXPECT_TRUE(d.demote.empty()) << "no churn under uniform access";
  EXPECT_EQ(d.promote, (U{6}));  // free room filled with the hottest
  // Already full: nothing moves at all.
  r = {0, 0, 1, 0, 1, 1, 0, 0};
  d = Decide(c, r, 3);
  EXPECT_TRUE(d.demote.empty());
  EXPECT_TRUE(d.promote.empty());
}

TEST(TierPolicy, SkewedAccessReplacesTheResidentSet) {
  std::vector<uint64_t> c(100, 1);
  c[42] = 5000;  // max > 10 x average
  std::vector<uint8_t> r(100, 0);
  r[3] = 1;
  auto d = Decide(c, r, 1);
  EXPECT_FALSE(d.uniform);
  EXPECT_EQ(d.demote, (U{3}));
  EXPECT_EQ(d.promote, (U{42}));
}

TEST(TierPolicy, ZeroCountsMoveNothing) {
  std::vector<uint64_t> c(16, 0);
  std::vector<uint8_t> r(16, 0);
  r[1] = r[2] = r[3] = 1;
  auto d = Decide(c, r, 2);
  EXPECT_TRUE(d.promote.empty());
  EXPECT_TRUE(d.demote.empty()) << "max == 0: no information, the resident set stays";
}

TEST(TierPolicy, UnaccessedUnitsAreNotPromotedToFillRoom) {
  std::vector<uint64_t> c = {0, 50, 0, 0};
  std::vector<uint8_t> r(4, 0);
  auto d = Decide(c, r, 4);
  EXPECT_EQ(d.promote, (U{1}));
}

TEST(TierPolicy, HugeCountsDoNotOverflow) {
  std::vector<uint64_t> c = {~uint64_t{0}, ~uint64_t{0} - 1, 1, 0};
  std::vector<uint8_t> r(4, 0);
  auto d = Decide(c, r, 1);
  EXPECT_EQ(d.promote, (U{0}));
}

TEST(TierPolicy, RefusesBadInput) {
  std::vector<uint64_t> c = {1, 2, 3};
  std::vector<uint8_t> r = {0, 0};
  EXPECT_EQ(TierPolicy::Decide(TierPolicyInput{c, r, 1, 85}).status().code(),
            Code::kInvalidArgument);
  std::vector<uint8_t> r3 = {0, 0, 0};
  EXPECT_EQ(TierPolicy::Decide(TierPolicyInput{c, r3, 1, 0}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(TierPolicy::Decide(TierPolicyInput{c, r3, 1, 101}).status().code(),
            Code::kInvalidArgument);
  auto empty = TierPolicy::Decide(TierPolicyInput{{}, {}, 4, 85});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->promote.empty());
}

TEST(TierPolicy, HysteresisKeepsResidentUnitsUnlessMuchHotter) {
  std::vector<uint64_t> c(40, 0);
  c[0] = 100;  // resident
  c[1] = 140;  // cold, 1.4x hotter: not enough against 50 % hysteresis
  c[2] = 1;
  std::vector<uint8_t> r(c.size(), 0);
  r[0] = 1;
  auto d = TierPolicy::Decide(TierPolicyInput{c, r, 1, 100, 50});
  ASSERT_TRUE(d.ok());
  EXPECT_TRUE(d->promote.empty());
  EXPECT_TRUE(d->demote.empty());
  c[1] = 151;  // more than 1.5x: replaces it
  d = TierPolicy::Decide(TierPolicyInput{c, r, 1, 100, 50});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->promote, (U{1}));
  EXPECT_EQ(d->demote, (U{0}));
  // Without hysteresis the 1.4x hotter unit wins at once (the old rule).
  c[1] = 140;
  d = TierPolicy::Decide(TierPolicyInput{c, r, 1, 100, 0});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->promote, (U{1}));
}

TEST(TierPolicy, BudgetHoldingEveryUnitIgnoresTheFill) {
  std::vector<uint64_t> c = {5, 4, 3, 2, 1, 9, 9, 9, 9, 90};
  std::vector<uint8_t> r(c.size(), 0);
  auto d = Decide(c, r, 10, 85);
  EXPECT_EQ(d.target_units, 10u);
  EXPECT_EQ(d.promote.size(), 10u);
  d = Decide(c, r, 9, 85);
  EXPECT_EQ(d.target_units, 7u);
}

TEST(TierHeat, DecaysAndIgnoresIdlePeriods) {
  auto h = TierHeat::Make(3, 50);
  ASSERT_TRUE(h.ok());
  std::vector<uint64_t> c = {100, 0, 7};
  ASSERT_TRUE(*h->Add(c));
  EXPECT_EQ(std::vector<uint64_t>(h->heat().begin(), h->heat().end()),
            (std::vector<uint64_t>{100, 0, 7}));
  c = {0, 10, 0};
  ASSERT_TRUE(*h->Add(c));
  EXPECT_EQ(std::vector<uint64_t>(h->heat().begin(), h->heat().end()),
            (std::vector<uint64_t>{50, 10, 3}));
  c = {0, 0, 0};
  EXPECT_FALSE(*h->Add(c)) << "an idle period changes nothing";
  EXPECT_EQ(h->heat()[0], 50u);
  c = {~uint64_t{0}, 0, 0};
  ASSERT_TRUE(*h->Add(c));
  EXPECT_EQ(h->heat()[0], ~uint64_t{0}) << "saturates";
  std::vector<uint64_t> wrong(2);
  EXPECT_EQ(h->Add(wrong).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(TierHeat::Make(3, 100).status().code(), Code::kInvalidArgument);
  std::vector<uint64_t> c3 = {1, 2, 3};
  std::vector<uint8_t> r3 = {0, 0, 0};
  EXPECT_EQ(TierPolicy::Decide(TierPolicyInput{c3, r3, 1, 85, 1001}).status().code(),
            Code::kInvalidArgument);
}

// ---- synthetic access streams -------------------------------------------------------------------

// Zipf 0.99 over `units` ranks, ranks scrambled onto units by a seeded permutation (the benchmark's
// workload shape). Deterministic: only raw mt19937_64 output is used.
class ZipfStream {
 public:
  ZipfStream(size_t units, uint64_t seed) : rng_(seed), cdf_(units), unit_of_rank_(units) {
    double sum = 0;
    for (size_t r = 0; r < units; ++r) {
      sum += 1.0 / std::pow(static_cast<double>(r + 1), 0.99);
      cdf_[r] = sum;
    }
    for (double& v : cdf_) v /= sum;
    Scramble();
  }
  // A new permutation: the hot set moves.
  void Scramble() {
    std::iota(unit_of_rank_.begin(), unit_of_rank_.end(), 0u);
    for (size_t i = unit_of_rank_.size() - 1; i > 0; --i) {
      std::swap(unit_of_rank_[i], unit_of_rank_[rng_() % (i + 1)]);
    }
  }
  std::vector<uint64_t> Period(size_t accesses) {
    std::vector<uint64_t> counts(cdf_.size(), 0);
    for (size_t i = 0; i < accesses; ++i) {
      const double x = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
      const size_t r =
          static_cast<size_t>(std::lower_bound(cdf_.begin(), cdf_.end(), x) - cdf_.begin());
      ++counts[unit_of_rank_[std::min(r, cdf_.size() - 1)]];
    }
    return counts;
  }
  // Share of accesses that hit `resident`, and the best any `k` units could reach.
  double HitShare(const std::vector<uint8_t>& resident) const {
    double hit = 0;
    for (size_t r = 0; r < cdf_.size(); ++r) {
      if (resident[unit_of_rank_[r]]) hit += cdf_[r] - (r == 0 ? 0.0 : cdf_[r - 1]);
    }
    return hit;
  }
  double OracleShare(size_t k) const { return k == 0 ? 0.0 : cdf_[std::min(k, cdf_.size()) - 1]; }

 private:
  std::mt19937_64 rng_;
  std::vector<double> cdf_;
  std::vector<uint32_t> unit_of_rank_;
};

// The policy as TierStore runs it: heat, decision, residency applied.
struct PolicySim {
  static constexpr size_t kUnits = 512;
  static constexpr uint64_t kBudget = 256;    // 50 % DRAM
  static constexpr size_t kAccesses = 20000;  // per period: ~14 at the cut of the ranking

  PolicySim() {
    // FARMEM_TIER_FAULT=churn: the artifact's memoryless rule, no hysteresis.
    const char* e = std::getenv("FARMEM_TIER_FAULT");
    if (e != nullptr && std::string(e) == "churn") {
      std::printf("[ fault    ] FARMEM_TIER_FAULT=churn\n");
      keep = 0;
      hysteresis = 0;
    }
    heat = *TierHeat::Make(kUnits, keep);
  }
  // One period; returns the number of units promoted.
  size_t Step(const std::vector<uint64_t>& counts) {
    auto added = heat.Add(counts);
    EXPECT_TRUE(added.ok());
    if (!added.ok() || !*added) return 0;
    auto d = TierPolicy::Decide(TierPolicyInput{heat.heat(), resident, kBudget, 85, hysteresis});
    EXPECT_TRUE(d.ok());
    if (!d.ok()) return 0;
    for (uint32_t u : d->demote) resident[u] = 0;
    for (uint32_t u : d->promote) resident[u] = 1;
    target = d->target_units;
    return d->promote.size();
  }

  // The engine's defaults (what farmemd runs).
  uint32_t keep = TierOptions{}.heat_keep_percent;
  uint32_t hysteresis = TierOptions{}.hysteresis_percent;
  TierHeat heat;
  std::vector<uint8_t> resident = std::vector<uint8_t>(kUnits, 0);
  uint64_t target = 0;
};

TEST(TierPolicyStream, StableHotSetStopsChurningAfterWarmUp) {
  ZipfStream zipf(PolicySim::kUnits, 11);
  PolicySim sim;
  for (int p = 0; p < 5; ++p) sim.Step(zipf.Period(PolicySim::kAccesses));  // warm-up
  size_t moved = 0;
  const int periods = 40;
  for (int p = 0; p < periods; ++p) moved += sim.Step(zipf.Period(PolicySim::kAccesses));
  const double per_period = static_cast<double>(moved) / periods / static_cast<double>(sim.target);
  const double hit = zipf.HitShare(sim.resident);
  const double oracle = zipf.OracleShare(sim.target);
  std::printf(
      "[ measure  ] stable Zipf: %.2f %% of %llu resident units swapped per period, hit "
      "share %.3f (oracle %.3f)\n",
      100 * per_period, static_cast<unsigned long long>(sim.target), hit, oracle);
  // Old rule: 14 % per period here; the defaults: 0.2 % (the benchmark's 50 % server: ~7 %).
  EXPECT_LT(per_period, 0.01) << "a stable hot set keeps churning";
  EXPECT_GT(hit, 0.97 * oracle) << "the resident set is not the hot set";
}

TEST(TierPolicyStream, MovedHotSetIsFollowedWithinThreePeriods) {
  ZipfStream zipf(PolicySim::kUnits, 23);
  PolicySim sim;
  for (int p = 0; p < 10; ++p) sim.Step(zipf.Period(PolicySim::kAccesses));
  zipf.Scramble();
  const double oracle = zipf.OracleShare(sim.target);
  std::printf("[ measure  ] moved hot set: hit share right after the move %.3f (oracle %.3f)\n",
              zipf.HitShare(sim.resident), oracle);
  for (int p = 1; p <= 3; ++p) {
    sim.Step(zipf.Period(PolicySim::kAccesses));
    std::printf("[ measure  ]   after period %d: %.3f\n", p, zipf.HitShare(sim.resident));
  }
  EXPECT_GT(zipf.HitShare(sim.resident), 0.90 * oracle) << "the policy did not follow the move";
}

}  // namespace
}  // namespace farmem::tier
