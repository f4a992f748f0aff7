// Asynchronous miss IO of the tier service: a TIER_READ that needs the file is deferred to the
// miss-IO threads, so one slow miss (a SIMULATED slow device: TierStoreFaults::hold_io holds
// every io-ring completion until the test lets go) does not delay a DRAM-hit TIER_READ on the same,
// only RPC worker. FARMEM_TIER_FAULT=sync_miss reads misses on the worker again and this fails.
// Test thread plus one reader thread; the server runs in-process (tier_service_test_util.h).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "farmem/tier.h"
#include "tier/service/tier_service_test_util.h"
#include "transport/testing/watchdog.h"

namespace farmem::tier {
namespace {

using farmem::testing::ScopedWatchdog;
using testing::Random;
using testing::TierEnv;
using namespace std::chrono_literals;

class TierAsyncMiss : public ::testing::TestWithParam<std::string> {};

TEST_P(TierAsyncMiss, ASlowMissDoesNotDelayADramHitOnTheSameWorker) {
  ScopedWatchdog wd("ASlowMissDoesNotDelayADramHitOnTheSameWorker", 120s);
  TierStoreFaults faults = testing::TierFaultsFromEnv();
  auto hold = std::make_shared<std::atomic<bool>>(false);
  faults.hold_io = hold;
  // 16 units of 16 KiB, 4 frames, one RPC worker: a miss read on it blocks everything behind it.
  auto env = TierEnv::Start(
      GetParam(), 16, 4, TierMode::kFull, 60000, 16,
      [](ServerConfig& sc) { sc.node.rpc_workers = 1; }, faults);
  ASSERT_TRUE(env->service);
  TierStore& store = env->service->store();
  const uint64_t unit = store.geometry().unit_size;
  TieredClientOptions rpc;
  rpc.rpc_only = true;  // the DRAM hit goes through TIER_READ, i.e. through the worker
  auto slow_client = env->Connect(rpc);
  auto fast_client = env->Connect(rpc);
  ASSERT_TRUE(slow_client.ok()) << slow_client.status().ToString();
  ASSERT_TRUE(fast_client.ok()) << fast_client.status().ToString();
  std::mt19937_64 rng(11);
  ASSERT_TRUE(store.Promote(0).ok());
  const std::vector<std::byte> hot = Random(rng, 5000);
  const std::vector<std::byte> cold = Random(rng, 5000);
  ASSERT_TRUE((*fast_client)->write(100, hot).ok());
  ASSERT_TRUE((*slow_client)->write(9 * unit + 300, cold).ok());
  ASSERT_TRUE(store.IsResident(0));
  ASSERT_FALSE(store.IsResident(9));

  // The miss goes into the "device" and stays there until released.
  hold->store(true);
  std::vector<std::byte> got_cold(cold.size());
  Status slow_status;
  std::atomic<bool> slow_done{false};
  std::thread slow([&] {
    slow_status = (*slow_client)->read(9 * unit + 300, got_cold);
    slow_done.store(true);
  });
  bool in_flight = false;
  for (int i = 0; i < 20000 && !in_flight; ++i) {
    in_flight = env->service->Stats()["rpc_in_flight"] == 1;
    if (!in_flight) std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(in_flight) << "the miss never reached the server";

  // The DRAM hit is answered while the miss is held (bounded by the client's 5 s op_timeout:
  // with the miss read on the worker it waits behind it and times out).
  std::vector<std::byte> got_hot(hot.size());
  const Status fast_status = (*fast_client)->read(100, got_hot);
  const bool miss_still_held = !slow_done.load();  // the hit did not wait for the miss's end
  hold->store(false);
  slow.join();
  EXPECT_TRUE(fast_status.ok()) << "a DRAM-hit TIER_READ waited for a slow miss on the same "
                                   "worker: "
                                << fast_status.ToString();
  EXPECT_EQ(got_hot, hot);
  EXPECT_TRUE(miss_still_held) << "the miss was not held while the hit was served";
  ASSERT_TRUE(slow_status.ok()) << slow_status.ToString();
  EXPECT_EQ(got_cold, cold) << "the deferred miss returned wrong bytes";
  nlohmann::json s = env->service->Stats();
  EXPECT_GE(s["misses_deferred"].get<uint64_t>(), 1u) << s.dump();
  EXPECT_EQ(s["rpc_in_flight"], 0) << s.dump();
}

INSTANTIATE_TEST_SUITE_P(Backends, TierAsyncMiss, ::testing::Values("tcp", "fabric:shm"),
                         testing::BackendName);

}  // namespace
}  // namespace farmem::tier
