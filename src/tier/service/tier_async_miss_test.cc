// Asynchronous miss IO of the tier service: a TIER_READ or TIER_WRITE that needs the file is
// deferred to the miss-IO threads, so one slow miss (a SIMULATED slow device: TierStoreFaults::
// hold_io holds every io-ring completion until the test lets go) does not delay a DRAM-hit
// TIER_READ on the same, only RPC worker. FARMEM_TIER_FAULT=sync_miss (reads) or sync_write
// (writes) serves misses on the worker again and the matching test fails.
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
#include "tier/format/tier_wire.h"
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

TEST_P(TierAsyncMiss, AColdWriteDoesNotDelayADramHitOnTheSameWorker) {
  ScopedWatchdog wd("AColdWriteDoesNotDelayADramHitOnTheSameWorker", 120s);
  TierStoreFaults faults = testing::TierFaultsFromEnv();
  auto hold = std::make_shared<std::atomic<bool>>(false);
  faults.hold_io = hold;
  // As above: 16 units of 16 KiB, 4 frames, one RPC worker.
  auto env = TierEnv::Start(
      GetParam(), 16, 4, TierMode::kFull, 60000, 16,
      [](ServerConfig& sc) { sc.node.rpc_workers = 1; }, faults);
  ASSERT_TRUE(env->service);
  TierStore& store = env->service->store();
  const uint64_t unit = store.geometry().unit_size;
  TieredClientOptions rpc;
  rpc.rpc_only = true;
  auto slow_client = env->Connect(rpc);
  auto fast_client = env->Connect(rpc);
  ASSERT_TRUE(slow_client.ok()) << slow_client.status().ToString();
  ASSERT_TRUE(fast_client.ok()) << fast_client.status().ToString();
  std::mt19937_64 rng(12);
  ASSERT_TRUE(store.Promote(0).ok());
  const std::vector<std::byte> hot = Random(rng, 5000);
  const std::vector<std::byte> cold = Random(rng, 5000);
  ASSERT_TRUE((*fast_client)->write(100, hot).ok());
  ASSERT_FALSE(store.IsResident(9));

  // The cold write (unaligned: a block read, then the file write) goes into the "device" and
  // stays there until released.
  hold->store(true);
  Status slow_status;
  std::atomic<bool> slow_done{false};
  std::thread slow([&] {
    slow_status = (*slow_client)->write(9 * unit + 300, cold);
    slow_done.store(true);
  });
  bool in_flight = false;
  for (int i = 0; i < 20000 && !in_flight; ++i) {
    in_flight = env->service->Stats()["rpc_in_flight"] == 1;
    if (!in_flight) std::this_thread::sleep_for(1ms);
  }
  EXPECT_TRUE(in_flight) << "the cold write never reached the server";

  // The DRAM hit is answered while the write is held (bounded by the client's 5 s op_timeout:
  // with the write's IO on the worker it waits behind it and times out).
  std::vector<std::byte> got_hot(hot.size());
  const Status fast_status = (*fast_client)->read(100, got_hot);
  const bool write_still_held = !slow_done.load();
  hold->store(false);
  slow.join();
  EXPECT_TRUE(fast_status.ok()) << "a DRAM-hit TIER_READ waited for a cold TIER_WRITE on the "
                                   "same worker: "
                                << fast_status.ToString();
  EXPECT_EQ(got_hot, hot);
  EXPECT_TRUE(write_still_held) << "the write was not held while the hit was served";
  ASSERT_TRUE(slow_status.ok()) << slow_status.ToString();
  // The deferred write landed in the file: read back cold, then after a promotion.
  std::vector<std::byte> got_cold(cold.size());
  ASSERT_TRUE((*fast_client)->read(9 * unit + 300, got_cold).ok());
  EXPECT_EQ(got_cold, cold) << "the deferred write did not land (read from the file)";
  ASSERT_TRUE(store.Demote(0).ok());
  ASSERT_TRUE(store.Promote(9).ok());
  std::fill(got_cold.begin(), got_cold.end(), std::byte{0});
  ASSERT_TRUE((*fast_client)->read(9 * unit + 300, got_cold).ok());
  EXPECT_EQ(got_cold, cold) << "the deferred write did not land (read after a promotion)";
  nlohmann::json s = env->service->Stats();
  EXPECT_GE(s["write_misses_deferred"].get<uint64_t>(), 1u) << s.dump();
  EXPECT_EQ(s["rpc_in_flight"], 0) << s.dump();
}

// A malformed or out-of-range TIER_WRITE is refused on the worker, never queued for a miss-IO
// thread (nothing is deferred, the counters do not move).
TEST_P(TierAsyncMiss, BadWritesAreRefusedBeforeAnyDeferral) {
  ScopedWatchdog wd("BadWritesAreRefusedBeforeAnyDeferral", 120s);
  auto env = TierEnv::Start(
      GetParam(), 16, 4, TierMode::kFull, 60000, 16,
      [](ServerConfig& sc) { sc.node.rpc_workers = 1; }, testing::TierFaultsFromEnv());
  ASSERT_TRUE(env->service);
  const uint64_t unit = env->service->store().geometry().unit_size;
  auto raw = env->Raw();  // raw requests: the client library would refuse these itself
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  const std::vector<std::byte> data(100, std::byte{7});
  // Past the end of the region (its last units are cold): OutOfRange from the decoder.
  EXPECT_EQ(raw->Call(kOpTierWrite, EncodeTierWriteRequest(16 * unit - 50, data)).code(),
            Code::kOutOfRange);
  // A truncated request (a cold range, half its data missing): Protocol.
  std::vector<std::byte> cut = EncodeTierWriteRequest(9 * unit, data);
  cut.resize(cut.size() - 50);
  EXPECT_EQ(raw->Call(kOpTierWrite, cut).code(), Code::kProtocol);
  nlohmann::json s = env->service->Stats();
  EXPECT_EQ(s["write_misses_deferred"], 0) << s.dump();
  EXPECT_EQ(s["write_misses_sync"], 0) << s.dump();
  EXPECT_EQ(s["rpc_in_flight"], 0) << s.dump();
}

INSTANTIATE_TEST_SUITE_P(Backends, TierAsyncMiss, ::testing::Values("tcp", "fabric:shm"),
                         testing::BackendName);

}  // namespace
}  // namespace farmem::tier
