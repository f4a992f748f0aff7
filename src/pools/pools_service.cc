// PoolsService: decodes and bounds-checks ALLOC_RAW / FREE_RAW before the PoolSet is touched, and
// reports pool use in STAT and Prometheus. Handlers run on RPC workers (pool growth maps memory).
#include "pools/pools_service.h"

#include "common/log.h"
#include "pools/pool_set.h"
#include "pools/pools_wire.h"
#include "pools/raw_owners.h"

namespace farmem {
namespace {

namespace proto = server_proto;

// STAT lists at most this many pools one by one (totals always cover all of them) so the reply
// stays far below the transport's max RPC size.
constexpr size_t kMaxListedPools = 1024;

class PoolsService final : public Service {
 public:
  PoolsService(uint64_t budget, std::unique_ptr<PoolSet> pools, SessionRegistry& sessions)
      : budget_(budget), pools_(std::move(pools)), owners_(*pools_), sessions_(sessions) {
    // The registry outlives the service and stops its reaper before the service stops; a
    // session closed by RPC ends on a worker, before the node (and so the service) stops.
    sessions_.add_end_listener([this](SessionIndex i) { return owners_.free_owned(i); });
  }

  std::string_view name() const override { return "pools"; }
  OpcodeRange opcodes() const override { return kPoolsOpcodes; }

  std::vector<ServiceMethod> methods() override {
    return {
        {proto::kOpAllocRaw, "alloc_raw", RpcExecution::kWorker,
         [this](const RpcCall& c, std::vector<std::byte>& r) {
           return ServeAllocRaw(owners_, sessions_, c, r);
         }},
        {proto::kOpFreeRaw, "free_raw", RpcExecution::kWorker,
         [this](const RpcCall& c, std::vector<std::byte>& r) {
           return ServeFreeRaw(owners_, c, r);
         }},
    };
  }

  void stats(nlohmann::json& j) const override {
    using nlohmann::json;
    const Totals t = Snapshot();
    const RawOwners::Owned owned = owners_.owned();
    json list = json::array();
    for (const PoolSnapshot& p : t.snap) {
      if (list.size() >= kMaxListedPools) break;
      list.push_back({{"name", p.name},
                      {"bytes", p.length},
                      {"allocated_bytes", p.stats.allocated_bytes},
                      {"free_bytes", p.stats.free_bytes},
                      {"allocations", p.stats.allocations},
                      {"largest_free", p.stats.largest_free},
                      {"free_ranges", p.stats.free_ranges}});
    }
    j["memory"] = {{"budget_bytes", budget_},
                   {"reserved_bytes", pools_->reserved_bytes()},
                   {"pool_bytes", pools_->pool_bytes()},
                   {"pools", t.snap.size()},
                   {"max_pools", pools_->max_pools()},
                   {"mapped_bytes", t.mapped},
                   {"allocated_bytes", t.allocated},
                   {"free_bytes", pools_->reserved_bytes() - t.allocated},
                   {"allocations", t.allocations},
                   // Owned by a client session (freed when it ends) vs persistent; a snapshot
                   // taken under different locks, so clamped when an alloc races STAT.
                   {"owned_allocations", owned.allocations},
                   {"owned_bytes", owned.bytes},
                   {"persistent_allocations",
                    t.allocations > owned.allocations ? t.allocations - owned.allocations : 0},
                   {"persistent_bytes", t.allocated > owned.bytes ? t.allocated - owned.bytes : 0}};
    j["pools"] = std::move(list);
    j["pools_truncated"] = t.snap.size() > kMaxListedPools;
  }

  void metrics(MetricsWriter& w) const override {
    const Totals t = Snapshot();
    const auto d = [](uint64_t v) { return static_cast<double>(v); };
    w.gauge("farmem_memory_budget_bytes", "Configured memory budget.", d(budget_));
    w.gauge("farmem_memory_reserved_bytes", "Virtual range reserved for pools.",
            d(pools_->reserved_bytes()));
    w.gauge("farmem_memory_mapped_bytes", "Bytes of pools created (memfd-backed).", d(t.mapped));
    w.gauge("farmem_memory_allocated_bytes", "Bytes in live raw allocations.", d(t.allocated));
    w.gauge("farmem_memory_free_bytes", "Budget bytes not allocated.",
            d(pools_->reserved_bytes() - t.allocated));
    w.gauge("farmem_allocations", "Live raw allocations.", d(t.allocations));
    const RawOwners::Owned owned = owners_.owned();
    w.gauge("farmem_memory_owned_allocations",
            "Live raw allocations owned by a client session (freed when it ends).",
            d(owned.allocations));
    w.gauge("farmem_memory_owned_bytes", "Bytes of raw allocations owned by a client session.",
            d(owned.bytes));
    w.gauge("farmem_pools", "Pools created.", d(t.snap.size()));
    w.gauge("farmem_pools_max", "Pools the budget allows.", d(pools_->max_pools()));
    struct PerPool {
      const char* name;
      const char* help;
      uint64_t RawAllocatorStats::*field;
    };
    static constexpr PerPool kPerPool[] = {
        {"farmem_pool_allocated_bytes", "Bytes allocated in a pool.",
         &RawAllocatorStats::allocated_bytes},
        {"farmem_pool_free_bytes", "Bytes free in a pool.", &RawAllocatorStats::free_bytes},
        {"farmem_pool_largest_free_bytes", "Longest free range of a pool.",
         &RawAllocatorStats::largest_free},
        {"farmem_pool_free_ranges", "Free ranges of a pool (fragmentation).",
         &RawAllocatorStats::free_ranges},
    };
    for (const PerPool& m : kPerPool) {
      w.family(m.name, MetricsWriter::Kind::kGauge, m.help);
      for (const PoolSnapshot& p : t.snap) w.sample({{"pool", p.name}}, d(p.stats.*m.field));
    }
  }

 private:
  struct Totals {
    std::vector<PoolSnapshot> snap;
    uint64_t allocated = 0, allocations = 0, mapped = 0;
  };
  Totals Snapshot() const {
    Totals t;
    t.snap = pools_->snapshot();
    for (const PoolSnapshot& p : t.snap) {
      t.allocated += p.stats.allocated_bytes;
      t.allocations += p.stats.allocations;
      t.mapped += p.length;
    }
    return t;
  }

  const uint64_t budget_;
  std::unique_ptr<PoolSet> pools_;
  RawOwners owners_;
  SessionRegistry& sessions_;
};

}  // namespace

Status ServeAllocRaw(RawOwners& pools, SessionRegistry& sessions, const RpcCall& call,
                     std::vector<std::byte>& reply) {
  auto req = proto::Decode<proto::AllocRawRequest>(call.request);
  if (!req) {
    return Status::Protocol("ALLOC_RAW request must be " +
                            std::to_string(sizeof(proto::AllocRawRequest)) + " bytes, got " +
                            std::to_string(call.request.size()));
  }
  // The guard keeps the session from finishing its end while we allocate: the range is either
  // recorded before the session's ranges are freed (and freed with them) or refused here.
  Result<SessionGuard> guard = sessions.acquire(req->session_id);
  if (!guard.ok()) return guard.status().WithContext("ALLOC_RAW");
  Result<PoolAllocation> a = pools.allocate(req->length, guard->index());
  if (!a.ok()) {
    FARMEM_LOG_DEBUG("ALLOC_RAW {} from {}: {}", req->length, call.source, a.status().ToString());
    return a.status();
  }
  reply = proto::Encode(proto::AllocRawReply{a->key, a->offset, a->length});
  return Status::OK();
}

Status ServeFreeRaw(RawOwners& pools, const RpcCall& call, std::vector<std::byte>& reply) {
  auto req = proto::Decode<proto::FreeRawRequest>(call.request);
  if (!req) {
    return Status::Protocol("FREE_RAW request must be " +
                            std::to_string(sizeof(proto::FreeRawRequest)) + " bytes, got " +
                            std::to_string(call.request.size()));
  }
  Result<uint64_t> len = pools.free(req->key, req->offset);
  if (!len.ok()) {
    FARMEM_LOG_DEBUG("FREE_RAW offset {} from {}: {}", req->offset, call.source,
                     len.status().ToString());
    return len.status();
  }
  reply = proto::Encode(proto::FreeRawReply{*len});
  return Status::OK();
}

const ServiceDescriptor& PoolsServiceDescriptor() {
  static const ServiceDescriptor d{
      "pools",
      "raw memfd pools: ALLOC_RAW / FREE_RAW, one region per pool",
      [](FlagSet& flags, ServerConfig& c) {
        flags.add_mib("memory-mib", &c.memory_bytes,
                      "memory budget in MiB (pools; the object store's default budget too)");
        flags.add_mib("pool-mib", &c.pool_bytes, "pool size in MiB");
      },
      [](ServerConfig& c) -> Status {
        if (c.pool_bytes == 0 || c.pool_bytes > (1ull << 40)) {
          return Status::InvalidArgument("--pool-mib must be 1..1048576");
        }
        if (c.memory_bytes < c.pool_bytes) {
          return Status::InvalidArgument("--memory-mib must be at least --pool-mib (" +
                                         std::to_string(c.pool_bytes >> 20) +
                                         ") and at most 64 TiB");
        }
        return Status::OK();
      },
      [](const ServerConfig& c, ServiceEnv& env) -> Result<std::unique_ptr<Service>> {
        auto pools = PoolSet::Create(c.memory_bytes, c.pool_bytes,
                                     [&node = env.node](const std::string& name, void* addr,
                                                        size_t len) -> Result<RegionKey> {
                                       FARMEM_ASSIGN_OR_RETURN(RegionInfo info,
                                                               node.export_region(name, addr, len));
                                       return info.key;
                                     });
        if (!pools.ok()) return pools.status();
        return std::unique_ptr<Service>(
            new PoolsService(c.memory_bytes, std::move(*pools), env.sessions));
      },
  };
  return d;
}

}  // namespace farmem
