// Tests of the free-room fill of TierStore::RunPeriod (TierOptions::fill_free_frames): a budget
// that holds the region ends up holding all of it, idle periods fill too, the fill never passes
// the policy's target, stops at its deadline and resumes, gives way to any counted unit, and is
// off when asked; and (TierPolicyInStore) that periods following a move rank without the
// hysteresis. Single-threaded.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "tier/engine/tier_store.h"
#include "tier/engine/tier_test_util.h"

// Own namespace: the folder's tests are one unity build, and kUnit is taken there.
namespace farmem::tier::fill_test {
namespace {

using testing::MustRead;
using testing::RandomBytes;
using testing::SmallOptions;
using testing::TempDir;

constexpr uint64_t kUnit = 16 * 1024;

size_t ResidentCount(const TierStore& t) {
  size_t n = 0;
  for (uint8_t r : t.Residency()) n += r;
  return n;
}

TEST(TierFill, BudgetHoldingTheRegionEndsUpHoldingAllOfIt) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const uint64_t units = 24;
  TierOptions o = SmallOptions(dir.File("tier"), units, units);
  o.fill_percent = 85;  // ignored: a budget holding every unit keeps no room free
  std::mt19937_64 rng(7);
  const std::vector<uint8_t> data = RandomBytes(rng, units * kUnit);
  auto s = TierStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  ASSERT_TRUE(t.Write(0, data).ok());  // all cold: straight to the file

  // One counted unit; the other 23 were never accessed.
  std::vector<uint64_t> counts(units, 0);
  counts[3] = 5;
  auto rep = t.RunPeriod(counts);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_TRUE(rep->error.ok()) << rep->error.ToString();
  EXPECT_EQ(rep->promoted, (std::vector<uint32_t>{3}));
  EXPECT_EQ(rep->filled.size(), units - 1);
  EXPECT_FALSE(rep->fill_cut);
  EXPECT_EQ(ResidentCount(t), units) << "the budget holds the region, yet units stayed cold";
  EXPECT_EQ(t.Stats().fills, units - 1);
  EXPECT_EQ(t.Stats().promotions, units);
  EXPECT_EQ(t.Stats().free_frames, 0u);
  // Every filled unit holds the file's bytes, in its frame (the range shows them, no pattern).
  std::vector<uint8_t> mapped(units * kUnit);
  std::memcpy(mapped.data(), t.base(), mapped.size());
  EXPECT_EQ(mapped, data) << "a filled frame does not hold its unit's bytes";
  EXPECT_EQ(MustRead(t, 0, data.size()), data);
  // Nothing left to fill: the next period moves nothing.
  rep = t.RunPeriod(counts);
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->promoted.empty());
  EXPECT_TRUE(rep->filled.empty());
  EXPECT_TRUE(rep->demoted.empty());
}

TEST(TierFill, IdlePeriodsFillUpToTheTargetAndNoFurther) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const uint64_t units = 40, budget = 20;
  TierOptions o = SmallOptions(dir.File("tier"), units, budget);
  o.fill_percent = 50;  // target 10 of the 20 frames
  auto s = TierStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  const std::vector<uint64_t> idle(units, 0);
  auto rep = t.RunPeriod(idle);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_TRUE(rep->error.ok()) << rep->error.ToString();
  EXPECT_EQ(rep->target_units, 10u);
  EXPECT_EQ(rep->filled.size(), 10u);
  EXPECT_EQ(ResidentCount(t), 10u) << "an idle server left its free room empty, or overfilled it";
  EXPECT_EQ(t.Stats().free_frames, budget - 10);
  rep = t.RunPeriod(idle);
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->filled.empty()) << "the fill went past the target";
  EXPECT_EQ(ResidentCount(t), 10u);
}

TEST(TierFill, StopsAtItsDeadlineAndResumesWhereItStopped) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const uint64_t units = 12;
  auto s = TierStore::Open(SmallOptions(dir.File("tier"), units, units));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  const std::vector<uint64_t> idle(units, 0);
  // A deadline already passed: nothing is read, and the report says the fill was cut.
  auto rep = t.RunPeriod(idle, std::chrono::steady_clock::now() - std::chrono::seconds(1));
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->filled.empty());
  EXPECT_TRUE(rep->fill_cut);
  EXPECT_EQ(ResidentCount(t), 0u);
  // Half by hand (as if an earlier fill had stopped there), then the fill does the rest.
  for (uint32_t u = 0; u < 6; ++u) ASSERT_TRUE(t.Promote(u).ok());
  rep = t.RunPeriod(idle);
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->filled, (std::vector<uint32_t>{6, 7, 8, 9, 10, 11}));
  EXPECT_FALSE(rep->fill_cut);
  EXPECT_EQ(ResidentCount(t), units);
}

// A filled unit holds its frame only until somebody counts another unit: it has no hysteresis
// bonus (TierPolicyInput::resident 2), so a cold unit counted once displaces it, while a unit the
// policy promoted keeps its bonus against the same single access.
TEST(TierFill, FilledUnitsGiveWayToAnyCountedUnit) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const uint64_t units = 64, budget = 4;
  TierOptions o = SmallOptions(dir.File("tier"), units, budget);  // fill 100 %: target 4
  ASSERT_GT(o.hysteresis_heat, 1u) << "the test needs an absolute bonus above one access";
  auto s = TierStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  // Unit 40 is hot and promoted by the policy; the fill brings in 0, 1, 2.
  std::vector<uint64_t> counts(units, 0);
  counts[40] = 1000;
  auto rep = t.RunPeriod(counts);
  ASSERT_TRUE(rep.ok());
  ASSERT_TRUE(rep->error.ok()) << rep->error.ToString();
  EXPECT_EQ(rep->promoted, (std::vector<uint32_t>{40}));
  EXPECT_EQ(rep->filled, (std::vector<uint32_t>{0, 1, 2}));
  // One access each to units 50, 51, 52 (cold). The skew keeps the ranking out of the uniform
  // rule (unit 40 stays far hotter than the average).
  counts.assign(units, 0);
  counts[40] = 1000;
  counts[50] = counts[51] = counts[52] = 1;
  rep = t.RunPeriod(counts);
  ASSERT_TRUE(rep.ok());
  ASSERT_TRUE(rep->error.ok()) << rep->error.ToString();
  EXPECT_FALSE(rep->uniform);
  EXPECT_EQ(rep->promoted, (std::vector<uint32_t>{50, 51, 52}))
      << "filled units that nobody counted kept their frames against counted ones";
  EXPECT_EQ(rep->demoted.size(), 3u);
  std::vector<uint8_t> want(units, 0);
  want[40] = want[50] = want[51] = want[52] = 1;
  EXPECT_EQ(t.Residency(), want);
  // Now they are policy units with the bonus: one access to 60 does not displace them.
  counts.assign(units, 0);
  counts[40] = 1000;
  counts[60] = 1;
  rep = t.RunPeriod(counts);
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->promoted.empty()) << "a unit with one access displaced a counted resident one";
  EXPECT_EQ(t.Residency(), want);
}

// Not the fill: the store's use of TierHeat::Update::following. After a move, the shift's period
// promoted two units seen once (60, 61); the next period the set has not caught up (resident
// share 0.89 < 0.99 of the 1.0 before the move), so it ranks without the hysteresis and units
// with 3 accesses (below the bar of 2 x 0.88 + 4 accesses) displace them.
TEST(TierPolicyInStore, PeriodsFollowingAMoveRankWithoutTheHysteresis) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const uint64_t units = 64;
  TierOptions o = SmallOptions(dir.File("tier"), units, 4);  // fill 100 %: target 4
  o.fill_free_frames = false;
  auto s = TierStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  auto period = [&](const std::vector<std::pair<uint32_t, uint64_t>>& hot) {
    std::vector<uint64_t> counts(units, 0);
    for (auto [u, c] : hot) counts[u] = c;
    auto rep = t.RunPeriod(counts);
    EXPECT_TRUE(rep.ok());
    if (rep.ok()) {
      EXPECT_TRUE(rep->error.ok()) << rep->error.ToString();
    }
    return rep.ok() ? *rep : TierPeriodReport{};
  };
  const std::vector<std::pair<uint32_t, uint64_t>> old_set = {
      {40, 100}, {41, 100}, {42, 100}, {43, 100}};
  period(old_set);
  auto rep = period(old_set);  // resident share 1.0
  ASSERT_FALSE(rep.shifted || rep.following);
  rep = period({{50, 100}, {51, 100}, {60, 1}, {61, 1}});  // share 0: moved
  ASSERT_TRUE(rep.shifted);
  std::vector<uint8_t> want(units, 0);
  want[50] = want[51] = want[60] = want[61] = 1;
  ASSERT_EQ(t.Residency(), want);
  std::vector<std::pair<uint32_t, uint64_t>> next = {{50, 100}, {51, 100}};
  for (uint32_t u = 52; u < 60; ++u) next.push_back({u, 3});
  rep = period(next);
  EXPECT_TRUE(rep.following);
  EXPECT_EQ(rep.promoted, (std::vector<uint32_t>{52, 53}))
      << "units seen once in the shift's period kept their frames behind the hysteresis";
  want[60] = want[61] = 0;
  want[52] = want[53] = 1;
  EXPECT_EQ(t.Residency(), want);
}

TEST(TierFill, OffPromotesOnlyCountedUnits) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const uint64_t units = 16;
  TierOptions o = SmallOptions(dir.File("tier"), units, units);
  o.fill_free_frames = false;
  auto s = TierStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  std::vector<uint64_t> counts(units, 0);
  counts[9] = 3;
  auto rep = t.RunPeriod(counts);
  ASSERT_TRUE(rep.ok());
  EXPECT_EQ(rep->promoted, (std::vector<uint32_t>{9}));
  EXPECT_TRUE(rep->filled.empty());
  EXPECT_EQ(ResidentCount(t), 1u);
  EXPECT_EQ(t.Stats().fills, 0u);
}

}  // namespace
}  // namespace farmem::tier::fill_test
