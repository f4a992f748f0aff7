// Device errors seen by a TieredClient: a full backing file system (a real loop-mounted tiny ext4;
// skipped with a message without root / mkfs.ext4 / a loop device) gives the client ENOSPC for a
// cold write, and a period whose write-backs fail keeps the dirty units resident with their data.
// FARMEM_TIER_FAULT=writeback removes that protection (docs/tier.md "Failure tests"). Test thread
// only; the server runs in-process (tier_service_test_util.h).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/tier.h"
#include "tier/service/tier_service_test_util.h"

namespace farmem::tier {
namespace {

using testing::ExpectBudgetExact;
using testing::ExpectNoSpace;
using testing::Random;
using testing::TierEnv;
using testing::TinyExt4;

// Reads units 5..8 often enough to be the period's hot set (max > 10 x average over 64 units),
// and pushes the counters.
void MakeHot(TieredClient& c, uint64_t unit_bytes) {
  std::vector<std::byte> b(64);
  for (uint64_t u = 5; u <= 8; ++u) {
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(c.read(u * unit_bytes + 64 * i, b).ok());
  }
  ASSERT_TRUE(c.refresh().ok());
}

TEST(TierDeviceErrors, FullDiskIsAClearErrorToTheClientAndLosesNoResidentData) {
  TinyExt4 fs(4);
  if (!fs.skip_reason().empty()) GTEST_SKIP() << fs.skip_reason();
  // 64 units of 64 KiB (sparse) on a 4 MiB file system, 4 frames, O_DIRECT; periods on demand.
  auto env = TierEnv::Start(
      "tcp", 64, 4, TierMode::kFull, 60000, 64,
      [&](ServerConfig& sc) { sc.tier.file = fs.File("tier.data"); }, testing::TierFaultsFromEnv());
  ASSERT_TRUE(env->service);
  auto client = env->Connect();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  TieredClient& c = **client;
  const uint64_t unit = c.info().unit_size;
  TierStore& store = env->service->store();
  std::mt19937_64 rng(11);

  // Units 0 and 1 resident and dirty: their frames hold the only copy.
  std::vector<std::vector<std::byte>> data;
  for (uint32_t u = 0; u < 2; ++u) {
    ASSERT_TRUE(store.Promote(u).ok());
    data.push_back(Random(rng, unit));
    ASSERT_TRUE(c.write(u * unit, data[u]).ok());
  }
  ASSERT_GT(fs.Fill(), 0) << "could not fill the file system";

  // A write to a cold unit needs new blocks: the client gets the kernel's ENOSPC.
  const std::vector<std::byte> cold = Random(rng, 5000);
  ExpectNoSpace(c.write(9 * unit + 100, cold), "client write to a cold unit");
  // A period whose hot set is 5..8 demotes 0 and 1: their write-backs fail, they stay.
  MakeHot(c, unit);
  ExpectNoSpace(env->service->RunPeriodNow(), "period demoting dirty units");
  EXPECT_TRUE(store.IsResident(0)) << "a unit whose write-back failed was demoted";
  EXPECT_TRUE(store.IsResident(1)) << "a unit whose write-back failed was demoted";
  EXPECT_TRUE(store.IsResident(5)) << "the promotion of the same period did not run";
  nlohmann::json s = env->service->Stats();
  ExpectBudgetExact(s);
  EXPECT_EQ(s["period_errors"], 1) << s.dump();
  for (uint32_t u = 0; u < 2; ++u) {
    std::vector<std::byte> got(unit);
    ASSERT_TRUE(c.read(u * unit, got).ok());
    EXPECT_EQ(got, data[u]) << "unit " << u << " lost its data";
  }

  // Space again: the next period writes 0 and 1 back and demotes them; nothing was lost.
  fs.Unfill();
  MakeHot(c, unit);
  ASSERT_TRUE(env->service->RunPeriodNow().ok());
  EXPECT_FALSE(store.IsResident(0));
  EXPECT_FALSE(store.IsResident(1));
  for (uint32_t u = 0; u < 2; ++u) {
    std::vector<std::byte> got(unit);
    ASSERT_TRUE(c.read(u * unit, got).ok());
    EXPECT_EQ(got, data[u]) << "unit " << u << " read back from the file";
  }
  ASSERT_TRUE(c.write(9 * unit + 100, cold).ok());
  std::vector<std::byte> back(cold.size());
  ASSERT_TRUE(c.read(9 * unit + 100, back).ok());
  EXPECT_EQ(back, cold);
  ExpectBudgetExact(env->service->Stats());
}

}  // namespace
}  // namespace farmem::tier
