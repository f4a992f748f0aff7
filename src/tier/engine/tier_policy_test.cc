// Tests of the TeRM hotspot policy (pure function): ranking, budget target, fill, uniform access
// keeps the resident set, zero counts move nothing, bad input. Single-threaded.
#include "tier/engine/tier_policy.h"

#include <gtest/gtest.h>

#include <vector>

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

}  // namespace
}  // namespace farmem::tier
