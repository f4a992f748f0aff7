// TierService: farmemd's TeRM tiered region behind the TIER_* RPCs (tier/format/tier_wire.h).
// Owns a tier::TierStore, exports its range read-only and its page bitmap, sums the clients'
// access counters and runs the hotspot period on a thread of its own. Threads: RPC workers and
// the progress thread (inline handlers) call Handle; a TIER_READ that needs the file is deferred
// (RpcCall::defer) to the miss-IO threads, which read and answer it; the period thread calls
// RunPeriod; STAT and metric scrapes call stats()/metrics() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/node.h"
#include "farmem/server.h"
#include "farmem/status.h"
#include "service/service.h"
#include "tier/engine/tier_store.h"
#include "tier/format/tier_wire.h"

namespace farmem {

// The tier service as farmemd knows it: the --tier-* flags and the factory.
const ServiceDescriptor& TierServiceDescriptor();

// Checks config.tier (InvalidArgument naming the flag). OK when no --tier-file was given.
Status ValidateTierConfig(const ServerConfig& config);
// "rpc", "rpc-direct", "tiering", "hotspot", "full".
const char* TierModeName(TierMode mode);

class TierService final : public Service {
 public:
  static constexpr const char* kDataRegionName = "tier";
  static constexpr const char* kBitmapRegionName = "tier-bitmap";
  // Miss-IO threads: TIER_READ / TIER_WRITE misses in the device at once (each runs one read or
  // write through the store's io rings, which get as many rings plus two for workers and the
  // period thread).
  static constexpr unsigned kMissIoThreads = 8;
  // Misses (reads and writes) waiting for a miss-IO thread; beyond this a miss is served on the
  // RPC worker (back-pressure instead of an unbounded queue).
  static constexpr size_t kMissQueueCapacity = 1024;

  // Validates config.tier, opens the store (file, mappings) and exports its range (read-only)
  // and, in mode full, the bitmap through `node` (which must outlive the service and be stopped
  // before it is destroyed). In mode tiering, fills the budget with the first units. `faults`
  // is test-only (tier_store.h); farmemd never sets it.
  static Result<std::unique_ptr<TierService>> Create(const ServerConfig& config, Node& node,
                                                     tier::TierStoreFaults faults = {});
  ~TierService() override;
  TierService(const TierService&) = delete;
  TierService& operator=(const TierService&) = delete;

  static const char* OpName(uint16_t opcode);
  // Serves one TIER_* RPC. Thread-safe.
  Status Handle(const RpcCall& call, std::vector<std::byte>& reply);

  std::string_view name() const override { return "tier"; }
  OpcodeRange opcodes() const override { return kTierOpcodes; }
  std::vector<ServiceMethod> methods() override;
  // Starts the miss-IO threads and the period thread (modes hotspot and full). Idempotent.
  Status start() override;
  // Joins the period thread and the miss-IO threads (misses already being read are answered;
  // queued ones get Unavailable). Idempotent.
  void stop() override;
  // STAT key "tier" (docs/tier.md "STAT") and the farmem_tier_* metrics.
  void stats(nlohmann::json& doc) const override;
  void metrics(MetricsWriter& out) const override;
  nlohmann::json Stats() const;

  // One period now (what the period thread does): sums and clears the pushed counters, runs
  // the policy, fills free frames until `fill_until` (the period thread: half a period). Tests
  // call it to force churn at their own pace.
  Status RunPeriodNow(std::chrono::steady_clock::time_point fill_until =
                          std::chrono::steady_clock::time_point::max());
  tier::TierStore& store() { return *store_; }
  const TierConfig& config() const { return config_; }

 private:
  TierService() = default;
  Status Info(std::vector<std::byte>& reply);
  // Answers at once when every requested page's unit is resident (or IO runs synchronously);
  // else defers the call to the miss-IO threads and sets *deferred.
  Status Read(const RpcCall& call, std::vector<std::byte>& reply, bool* deferred);
  // The store read of a decoded TIER_READ, packed into `reply` (any thread).
  Status ServeRead(const tier::TierReadRequest& req, std::vector<std::byte>& reply);
  // Every unit holding a byte of [offset, offset + length) (only pages set in `mask`, unless it
  // is empty) is resident now.
  bool AllResident(uint64_t offset, uint64_t length, std::span<const uint64_t> mask) const;
  void MissLoop();
  // Same split as Read: a write whose units are all resident is copied into DRAM on the worker;
  // one that touches a cold unit (file IO) is deferred to the miss-IO threads.
  Status Write(const RpcCall& call, bool* deferred);
  // The store write of a decoded TIER_WRITE (any thread).
  Status ServeWrite(const tier::TierWriteRequest& req);
  Status Counters(const RpcCall& call);
  void PeriodLoop();

  TierConfig config_;
  uint64_t max_io_ = 0;  // largest TIER_READ / TIER_WRITE range
  std::unique_ptr<tier::TierStore> store_;
  RegionInfo data_region_;
  RegionInfo bitmap_region_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per unit, pushed since the last period
  std::mutex period_mu_;                             // one period at a time
  std::atomic<uint64_t> periods_{0}, period_errors_{0}, counter_pushes_{0};
  std::atomic<uint64_t> rpc_reads_{0}, rpc_read_bytes_{0}, rpc_writes_{0}, rpc_write_bytes_{0};
  // TIER_READ / TIER_WRITE handlers running now (file IO in progress): 0 when idle, whatever
  // happened to the clients that sent them (STAT "rpc_in_flight").
  std::atomic<int64_t> rpc_in_flight_{0};

  bool sync_miss_io_ = false;   // test-only (TierStoreFaults::sync_miss_io)
  bool sync_write_io_ = false;  // test-only (TierStoreFaults::sync_write_io)

  // Deferred misses: queue of (answer handle, decoded request) for the miss-IO threads. A
  // write's data span points into the request bytes, which the handle owns until it answers.
  struct MissJob {
    DeferredReply reply;
    bool is_write = false;
    tier::TierReadRequest read;    // !is_write
    tier::TierWriteRequest write;  // is_write
  };
  // Defers `call` and queues `job` (moved from) for a miss-IO thread; false, leaving `job` as
  // it was, when the threads are not running, the queue is full or the call cannot be deferred.
  bool DeferMiss(const RpcCall& call, MissJob& job);
  std::mutex miss_mu_;
  std::condition_variable miss_cv_;
  std::deque<MissJob> miss_queue_;
  bool miss_running_ = false;  // threads started and not stopping: misses may be queued
  std::vector<std::thread> miss_threads_;
  std::atomic<uint64_t> misses_deferred_{0}, misses_sync_{0};              // TIER_READ
  std::atomic<uint64_t> write_misses_deferred_{0}, write_misses_sync_{0};  // TIER_WRITE

  std::mutex thread_mu_;
  std::condition_variable thread_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace farmem
