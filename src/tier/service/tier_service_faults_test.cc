// Service-level tests of the tier server's protections that need a switch to provoke: SIMULATED
// device errors (EIO injected at the io ring, TierStoreFaults::simulated_io_errno: no real device
// here can fail a read) reach the client as clear errors and lose no resident data; the demotion's
// grace hook reaches the transport (tcp read-copy waits); --tier-cached-reads reaches the store;
// SIMULATED short file transfers give clients no partial or stale bytes.
// FARMEM_TIER_FAULT=writeback / no_grace / accept_short remove protections and these tests fail.
// Test thread only; the server runs in-process (tier_service_test_util.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "farmem/tier.h"
#include "tier/service/tier_service_test_util.h"
#include "transport/tcp/tcp_transport.h"

namespace farmem::tier {
namespace {

using testing::Random;
using testing::TierEnv;

// `st` is the simulated EIO, reported as an IoError that says so.
void ExpectEio(const Status& st, const std::string& what) {
  EXPECT_FALSE(st.ok()) << what << " succeeded while the device fails";
  EXPECT_EQ(st.code(), Code::kIoError) << what << ": " << st.ToString();
  EXPECT_NE(st.ToString().find("Input/output error"), std::string::npos)
      << what << ": " << st.ToString();
}

TEST(TierSimulatedIoErrors, EioIsAClearErrorAndLosesNoResidentData) {
  TierStoreFaults faults = testing::TierFaultsFromEnv();
  auto eio = std::make_shared<std::atomic<int>>(0);
  faults.simulated_io_errno = eio;
  // 16 units of 16 KiB, 4 frames, O_DIRECT; periods on demand.
  auto env = TierEnv::Start("tcp", 16, 4, TierMode::kFull, 60000, 16, {}, faults);
  ASSERT_TRUE(env->service);
  auto client = env->Connect();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  TieredClient& c = **client;
  TierStore& store = env->service->store();
  const uint64_t unit = store.geometry().unit_size;
  std::mt19937_64 rng(5);

  // Unit 0 resident and dirty (its only copy is the frame); unit 9 cold, on the file.
  ASSERT_TRUE(store.Promote(0).ok());
  const std::vector<std::byte> hot = Random(rng, unit);
  ASSERT_TRUE(c.write(0, hot).ok());
  const std::vector<std::byte> cold = Random(rng, 3000);
  ASSERT_TRUE(c.write(9 * unit + 100, cold).ok());

  eio->store(EIO);
  std::vector<std::byte> got(3000);
  ExpectEio(c.read(9 * unit + 100, got), "client read of a cold unit");
  ExpectEio(c.write(10 * unit + 7, cold), "client write to a cold unit");
  ExpectEio(store.Promote(3), "promotion (reads the unit from the file)");
  EXPECT_FALSE(store.IsResident(3));
  ExpectEio(store.Demote(0), "demotion of a dirty unit (write-back)");
  EXPECT_TRUE(store.IsResident(0)) << "a unit whose write-back failed was demoted (data lost)";
  // The resident unit still reads back, and the server keeps serving.
  std::vector<std::byte> got0(unit);
  ASSERT_TRUE(c.read(0, got0).ok());
  EXPECT_EQ(got0, hot);
  nlohmann::json s = env->service->Stats();
  EXPECT_EQ(s["rpc_in_flight"], 0) << s.dump();

  // The device recovers: the demotion writes the unit back, every byte is still there.
  eio->store(0);
  ASSERT_TRUE(store.Demote(0).ok());
  EXPECT_FALSE(store.IsResident(0));
  ASSERT_TRUE(c.read(0, got0).ok());
  EXPECT_EQ(got0, hot) << "unit 0 lost its data";
  ASSERT_TRUE(c.read(9 * unit + 100, got).ok());
  EXPECT_EQ(got, cold);
}

TEST(TierGraceHook, DemotionsWaitForTheTransportsReadCopies) {
  // 64 units of 16 KiB, 2 frames: two hot units out of 64 are a skewed period (not uniform).
  auto env =
      TierEnv::Start("tcp", 64, 2, TierMode::kFull, 60000, 16, {}, testing::TierFaultsFromEnv());
  ASSERT_TRUE(env->service);
  TierStore& store = env->service->store();
  auto waits = [&] {
    auto st = GetTcpTransportStats(env->server_node->transport());
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    return st.ok() ? st->read_copy_waits : 0;
  };
  const uint64_t before = waits();
  ASSERT_TRUE(store.Promote(1).ok());
  ASSERT_TRUE(store.Promote(2).ok());
  ASSERT_TRUE(store.Demote(1).ok());
  EXPECT_EQ(waits(), before + 1) << "the demotion's frame was freed without a grace period";
  ASSERT_TRUE(store.Promote(1).ok());
  // A period whose hot set is 5 and 6 demotes 1 and 2, with one grace period for both.
  auto client = env->Connect();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::vector<std::byte> b(64);
  for (uint32_t u = 5; u <= 6; ++u) {
    for (int i = 0; i < 50; ++i) ASSERT_TRUE((*client)->read(u * 16384 + 64 * i, b).ok());
  }
  ASSERT_TRUE((*client)->refresh().ok());
  ASSERT_TRUE(env->service->RunPeriodNow().ok());
  EXPECT_FALSE(store.IsResident(1));
  EXPECT_FALSE(store.IsResident(2));
  EXPECT_TRUE(store.IsResident(5));
  EXPECT_EQ(waits(), before + 2) << "the period's demotions skipped or repeated the grace period";
  EXPECT_EQ(store.Stats().grace_failures, 0u);
}

TEST(TierCachedReads, FlagReachesTheStore) {
  auto env = TierEnv::Start("tcp", 16, 4, TierMode::kFull, 60000, 16,
                            [](ServerConfig& sc) { sc.tier.cached_reads = true; });
  ASSERT_TRUE(env->service);
  auto client = env->Connect();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::vector<std::byte> b(100);
  ASSERT_TRUE((*client)->read(7 * 16384 + 5, b).ok());  // cold: a buffered try first
  const TierStats st = env->service->store().Stats();
  EXPECT_EQ(st.cached_read_hits + st.cached_read_misses, 1u);
  nlohmann::json s = env->service->Stats();
  EXPECT_EQ(s["config"]["cached_reads"], true) << s.dump();

  ServerConfig sc = testing::TierServerConfig("tcp", "/var/tmp/x", 16, 4);
  sc.tier.cached_reads = true;
  sc.tier.direct_io = false;
  EXPECT_EQ(ValidateTierConfig(sc).code(), Code::kInvalidArgument);
  sc.tier.direct_io = true;
  sc.tier.mode = TierMode::kRpc;
  EXPECT_EQ(ValidateTierConfig(sc).code(), Code::kInvalidArgument);
  sc.tier.mode = TierMode::kRpcDirect;
  EXPECT_TRUE(ValidateTierConfig(sc).ok());
}

// SIMULATED short transfers (TierStoreFaults::short_io: every file IO of two pages or more moves
// half per completion) end to end: what a client reads back over RPC and one-sidedly is exactly
// what it wrote, through cold writes, promotions, write-backs and cold reads.
// FARMEM_TIER_FAULT=accept_short (a short completion taken as the whole IO) fails it.
TEST(TierSimulatedShortIo, ClientsGetNoPartialOrStaleBytes) {
  TierStoreFaults faults = testing::TierFaultsFromEnv();
  faults.short_io = true;
  auto env = TierEnv::Start("tcp", 16, 4, TierMode::kFull, 60000, 16, {}, faults);
  ASSERT_TRUE(env->service);
  TierStore& store = env->service->store();
  const uint64_t unit = store.geometry().unit_size;
  TieredClientOptions rpc;
  rpc.rpc_only = true;
  auto rpc_client = env->Connect(rpc);
  auto client = env->Connect();
  ASSERT_TRUE(rpc_client.ok()) << rpc_client.status().ToString();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  std::mt19937_64 rng(13);
  // Units 4..7 cold: three unaligned writes of several pages each go to the file.
  const uint64_t off = 4 * unit + 1000;
  const std::vector<std::byte> data = Random(rng, 3 * unit);
  ASSERT_TRUE((*rpc_client)->write(off, data).ok());
  std::vector<std::byte> got(data.size());
  ASSERT_TRUE((*rpc_client)->read(off, got).ok());
  EXPECT_EQ(got, data) << "a cold TIER_READ returned partial or stale bytes";
  // Promote (reads whole units), write into the frames, demote (writes them back), read cold.
  for (uint32_t u = 4; u < 8; ++u) ASSERT_TRUE(store.Promote(u).ok());
  const std::vector<std::byte> more = Random(rng, 2 * unit);
  ASSERT_TRUE((*rpc_client)->write(off + 500, more).ok());
  std::vector<std::byte> want = data;
  std::copy(more.begin(), more.end(), want.begin() + 500);
  std::fill(got.begin(), got.end(), std::byte{0});
  ASSERT_TRUE((*client)->read(off, got).ok());
  EXPECT_EQ(got, want) << "a read of promoted units returned partial or stale bytes";
  for (uint32_t u = 4; u < 8; ++u) ASSERT_TRUE(store.Demote(u).ok());
  std::fill(got.begin(), got.end(), std::byte{0});
  ASSERT_TRUE((*client)->read(off, got).ok());
  EXPECT_EQ(got, want) << "a cold read after write-back returned partial or stale bytes";
  EXPECT_GT(env->service->Stats()["io_short_completions"].get<uint64_t>(), 0u);
}

}  // namespace
}  // namespace farmem::tier
