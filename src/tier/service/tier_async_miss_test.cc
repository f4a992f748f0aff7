// Asynchronous miss IO of the tier service: a TIER_READ or TIER_WRITE that needs the file is
// deferred to the miss-IO threads, so one slow miss (a SIMULATED slow device: TierStoreFaults::
// hold_io holds every io-ring completion until the test lets go) does not delay a DRAM-hit
// TIER_READ on the same, only RPC worker. FARMEM_TIER_FAULT=sync_miss (reads) or sync_write
// (writes) serves misses on the worker again and the matching test fails.
// Test thread plus one thread for the held operation; the server runs in-process
// (tier_service_test_util.h).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
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

// One server with one RPC worker (a miss served on it blocks everything behind it): 16 units of
// 16 KiB, 4 frames, unit 0 resident holding `hot` at 100, unit 9 cold; two rpc_only clients (the
// DRAM hit goes through TIER_READ, i.e. through the worker); `hold` holds the io rings.
class TierAsyncMiss : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    TierStoreFaults faults = testing::TierFaultsFromEnv();
    faults.hold_io = hold_;
    env_ = TierEnv::Start(
        GetParam(), 16, 4, TierMode::kFull, 60000, 16,
        [](ServerConfig& sc) { sc.node.rpc_workers = 1; }, faults);
    ASSERT_TRUE(env_->service);
    store_ = &env_->service->store();
    unit_ = store_->geometry().unit_size;
    TieredClientOptions rpc;
    rpc.rpc_only = true;
    for (auto* c : {&slow_, &fast_}) {
      auto client = env_->Connect(rpc);
      ASSERT_TRUE(client.ok()) << client.status().ToString();
      *c = std::move(*client);
    }
    ASSERT_TRUE(store_->Promote(0).ok());
    ASSERT_TRUE(fast_->write(100, hot_).ok());
    ASSERT_TRUE(store_->IsResident(0));
    ASSERT_FALSE(store_->IsResident(9));
  }

  // Holds the device, runs `slow_op` on another thread until the server has it in flight, then
  // reads `hot` (a DRAM hit) and releases the device. The hit must come back while `slow_op` is
  // still held (bounded by the client's 5 s op_timeout: served on the worker behind the held IO,
  // it times out). Returns slow_op's status.
  Status HitWhileHeld(const std::function<Status()>& slow_op, const char* what) {
    hold_->store(true);
    Status slow_status;
    std::atomic<bool> slow_done{false};
    std::thread slow([&] {
      slow_status = slow_op();
      slow_done.store(true);
    });
    bool in_flight = false;
    for (int i = 0; i < 20000 && !in_flight; ++i) {
      in_flight = env_->service->Stats()["rpc_in_flight"] == 1;
      if (!in_flight) std::this_thread::sleep_for(1ms);
    }
    EXPECT_TRUE(in_flight) << what << " never reached the server";
    std::vector<std::byte> got_hot(hot_.size());
    const Status fast_status = fast_->read(100, got_hot);
    const bool still_held = !slow_done.load();  // the hit did not wait for the slow op's end
    hold_->store(false);
    slow.join();
    EXPECT_TRUE(fast_status.ok()) << "a DRAM-hit TIER_READ waited for " << what
                                  << " on the same worker: " << fast_status.ToString();
    EXPECT_EQ(got_hot, hot_);
    EXPECT_TRUE(still_held) << what << " was not held while the hit was served";
    return slow_status;
  }

  std::shared_ptr<std::atomic<bool>> hold_ = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<TierEnv> env_;
  TierStore* store_ = nullptr;
  uint64_t unit_ = 0;
  std::unique_ptr<TieredClient> slow_, fast_;
  std::mt19937_64 rng_{11};
  const std::vector<std::byte> hot_ = Random(rng_, 5000);
  const std::vector<std::byte> cold_ = Random(rng_, 5000);
};

TEST_P(TierAsyncMiss, ASlowMissDoesNotDelayADramHitOnTheSameWorker) {
  ScopedWatchdog wd("ASlowMissDoesNotDelayADramHitOnTheSameWorker", 120s);
  ASSERT_TRUE(slow_->write(9 * unit_ + 300, cold_).ok());
  ASSERT_FALSE(store_->IsResident(9));
  std::vector<std::byte> got_cold(cold_.size());
  const Status st =
      HitWhileHeld([&] { return slow_->read(9 * unit_ + 300, got_cold); }, "a slow miss");
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(got_cold, cold_) << "the deferred miss returned wrong bytes";
  nlohmann::json s = env_->service->Stats();
  EXPECT_GE(s["misses_deferred"].get<uint64_t>(), 1u) << s.dump();
  EXPECT_EQ(s["rpc_in_flight"], 0) << s.dump();
}

TEST_P(TierAsyncMiss, AColdWriteDoesNotDelayADramHitOnTheSameWorker) {
  ScopedWatchdog wd("AColdWriteDoesNotDelayADramHitOnTheSameWorker", 120s);
  // Unaligned: a block read, then the file write; held at the first.
  const Status st =
      HitWhileHeld([&] { return slow_->write(9 * unit_ + 300, cold_); }, "a cold TIER_WRITE");
  ASSERT_TRUE(st.ok()) << st.ToString();
  // The deferred write landed in the file: read back cold, then after a promotion.
  std::vector<std::byte> got_cold(cold_.size());
  ASSERT_TRUE(fast_->read(9 * unit_ + 300, got_cold).ok());
  EXPECT_EQ(got_cold, cold_) << "the deferred write did not land (read from the file)";
  ASSERT_TRUE(store_->Demote(0).ok());
  ASSERT_TRUE(store_->Promote(9).ok());
  std::fill(got_cold.begin(), got_cold.end(), std::byte{0});
  ASSERT_TRUE(fast_->read(9 * unit_ + 300, got_cold).ok());
  EXPECT_EQ(got_cold, cold_) << "the deferred write did not land (read after a promotion)";
  nlohmann::json s = env_->service->Stats();
  EXPECT_GE(s["write_misses_deferred"].get<uint64_t>(), 1u) << s.dump();
  EXPECT_EQ(s["rpc_in_flight"], 0) << s.dump();
}

// A malformed or out-of-range TIER_WRITE is refused on the worker, never queued for a miss-IO
// thread (nothing is deferred, the counters do not move).
TEST_P(TierAsyncMiss, BadWritesAreRefusedBeforeAnyDeferral) {
  ScopedWatchdog wd("BadWritesAreRefusedBeforeAnyDeferral", 120s);
  auto raw = env_->Raw();  // raw requests: the client library would refuse these itself
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  const std::vector<std::byte> data(100, std::byte{7});
  // Past the end of the region (its last units are cold): OutOfRange from the decoder.
  EXPECT_EQ(raw->Call(kOpTierWrite, EncodeTierWriteRequest(16 * unit_ - 50, data)).code(),
            Code::kOutOfRange);
  // A truncated request (a cold range, half its data missing): Protocol.
  std::vector<std::byte> cut = EncodeTierWriteRequest(9 * unit_, data);
  cut.resize(cut.size() - 50);
  EXPECT_EQ(raw->Call(kOpTierWrite, cut).code(), Code::kProtocol);
  nlohmann::json s = env_->service->Stats();
  EXPECT_EQ(s["write_misses_deferred"], 0) << s.dump();
  EXPECT_EQ(s["write_misses_sync"], 0) << s.dump();
  EXPECT_EQ(s["rpc_in_flight"], 0) << s.dump();
}

INSTANTIATE_TEST_SUITE_P(Backends, TierAsyncMiss, ::testing::Values("tcp", "fabric:shm"),
                         testing::BackendName);

}  // namespace
}  // namespace farmem::tier
