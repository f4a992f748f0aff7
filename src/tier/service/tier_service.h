// TierService: farmemd's TeRM tiered region behind the TIER_* RPCs (tier/format/tier_wire.h).
// Owns a tier::TierStore, exports its range read-only and its page bitmap, sums the clients'
// access counters and runs the hotspot period on a thread of its own. Threads: RPC workers and
// the progress thread (inline handlers) call Handle; the period thread calls RunPeriod; STAT and
// metric scrapes call stats()/metrics() from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
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
  // Starts the period thread (modes hotspot and full). Idempotent.
  Status start() override;
  // Joins the period thread. Idempotent.
  void stop() override;
  // STAT key "tier" (docs/tier.md "STAT") and the farmem_tier_* metrics.
  void stats(nlohmann::json& doc) const override;
  void metrics(MetricsWriter& out) const override;
  nlohmann::json Stats() const;

  // One period now (what the period thread does): sums and clears the pushed counters, runs
  // the policy. Tests call it to force churn at their own pace.
  Status RunPeriodNow();
  tier::TierStore& store() { return *store_; }
  const TierConfig& config() const { return config_; }

 private:
  TierService() = default;
  Status Info(std::vector<std::byte>& reply);
  Status Read(const RpcCall& call, std::vector<std::byte>& reply);
  Status Write(const RpcCall& call);
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

  std::mutex thread_mu_;
  std::condition_variable thread_cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace farmem
