// Device errors of the TeRM engine on a real, full file system (a loop-mounted tiny ext4; skipped
// with a message without root / mkfs.ext4 / loop devices): cold writes and demotion write-backs
// that get ENOSPC fail with the kernel's error, resident data is never lost, the budget stays
// exact. FARMEM_TIER_FAULT=writeback removes the "stay resident" step of I2 (docs/tier.md).
// Test thread only.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tier/engine/tier_store.h"
#include "tier/engine/tier_test_util.h"

namespace farmem::tier {
namespace {

using testing::ExpectNoSpace;
using testing::RandomBytes;
using testing::SmallOptions;
using testing::TinyExt4;

// Every frame is accounted for: resident + quarantined + free == budget (I1).
void ExpectBudgetExact(const TierStore& t) {
  const TierStats s = t.Stats();
  EXPECT_EQ(s.resident_units + s.quarantined_frames + s.free_frames, s.budget_units);
  EXPECT_LE(s.resident_units, s.budget_units);
}

TEST(TierStoreDevice, FullDiskFailsColdWritesAndKeepsDirtyUnitsResident) {
  TinyExt4 fs(4);
  if (!fs.skip_reason().empty()) GTEST_SKIP() << fs.skip_reason();
  // 64 units of 64 KiB (4 MiB, sparse: nothing allocated yet), 4 frames, O_DIRECT.
  TierOptions o = SmallOptions(fs.File("tier.data"), 64, 4, 64 * 1024);
  o.faults = testing::TierFaultsFromEnv();
  auto store = TierStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  TierStore& t = **store;
  const uint64_t unit = t.geometry().unit_size;
  std::mt19937_64 rng(7);

  // Units 0 and 1 resident and dirty (their only copy is the frame); unit 2 resident, clean.
  std::vector<std::vector<uint8_t>> data;
  for (uint32_t u = 0; u < 3; ++u) {
    ASSERT_TRUE(t.Promote(u).ok());
    data.push_back(RandomBytes(rng, unit));
    if (u < 2) {
      ASSERT_TRUE(t.Write(u * unit, data[u]).ok());
    }
  }
  const int64_t filled = fs.Fill();
  ASSERT_GT(filled, 0) << "could not fill the file system";
  std::printf("[ measure  ] filler %lld bytes: the file system is full\n",
              static_cast<long long>(filled));

  // A cold write into a hole of the file needs a block: ENOSPC, as an error.
  const std::vector<uint8_t> cold = RandomBytes(rng, 5000);
  ExpectNoSpace(t.Write(9 * unit + 100, cold), "cold write");
  // Demoting a dirty unit needs its write-back: it fails and the unit stays resident.
  ExpectNoSpace(t.Demote(0), "demotion of a dirty unit");
  EXPECT_TRUE(t.IsResident(0)) << "a unit whose write-back failed was demoted (data lost)";
  // A period that wants units 5..8 (not uniform: max > 10 x average) demotes 0, 1 and 2: it
  // reports the error, keeps 0 and 1, demotes the clean 2 and promotes into its frame.
  std::vector<uint64_t> counts(t.geometry().unit_count, 0);
  for (uint32_t u = 5; u <= 8; ++u) counts[u] = 1000;
  auto rep = t.RunPeriod(counts);
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ExpectNoSpace(rep->error, "period demoting dirty units");
  EXPECT_TRUE(t.IsResident(0));
  EXPECT_TRUE(t.IsResident(1));
  EXPECT_FALSE(t.IsResident(2));
  EXPECT_TRUE(t.IsResident(5)) << "the period's promotions did not run after the failures";
  ExpectBudgetExact(t);
  // Nothing of the resident data is lost, through the store and through the mapped range.
  for (uint32_t u = 0; u < 2; ++u) {
    std::vector<uint8_t> got(unit);
    ASSERT_TRUE(t.Read(u * unit, got).ok());
    EXPECT_EQ(got, data[u]) << "unit " << u << " lost its data";
    EXPECT_EQ(std::memcmp(t.base() + u * unit, data[u].data(), unit), 0) << "unit " << u;
  }
  const uint64_t bit0 = t.bitmap()[0];
  EXPECT_EQ(bit0 & 1, 1u) << "the resident unit's bitmap bits were left clear";

  // Space again: the same demotion writes back and succeeds; the data comes from the file.
  fs.Unfill();
  ASSERT_TRUE(t.Demote(0).ok());
  EXPECT_FALSE(t.IsResident(0));
  std::vector<uint8_t> got(unit);
  ASSERT_TRUE(t.Read(0, got).ok());
  EXPECT_EQ(got, data[0]);
  ASSERT_TRUE(t.Write(9 * unit + 100, cold).ok());
  std::vector<uint8_t> back(cold.size());
  ASSERT_TRUE(t.Read(9 * unit + 100, back).ok());
  EXPECT_EQ(back, cold);
  ExpectBudgetExact(t);
}

}  // namespace
}  // namespace farmem::tier
