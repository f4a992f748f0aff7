// MemoryServer: wires the PoolSet and the CoRM ObjectService to a Node — pools and the object
// range are exported as regions, and the ALLOC_RAW / FREE_RAW / STAT and object handlers decode and
// bounds-check requests before touching memory. Teardown order matters: the node (and with it
// every peer's access) stops before pools and the object range unmap.
#include "farmem/server.h"

#include <array>
#include <atomic>
#include <chrono>
#include <string>

#include "common/log.h"
#include "objects/object_wire.h"
#include "server/object_service.h"
#include "server/pool.h"
#include "server/server_protocol.h"

namespace farmem {

namespace proto = server_proto;

namespace {

// Counters cover the raw server opcodes and the object opcodes that follow them.
static_assert(proto::kLastServerOpcode < object_wire::kLastObjectsOpcode);
constexpr size_t kNumOps = object_wire::kLastObjectsOpcode - kFirstUserOpcode + 1;
// STAT lists at most this many pools one by one (totals always cover all of them) so the reply
// stays far below the transport's max RPC size.
constexpr size_t kMaxListedPools = 1024;

const char* OpName(uint16_t opcode) {
  switch (opcode) {
    case proto::kOpAllocRaw:
      return "alloc_raw";
    case proto::kOpFreeRaw:
      return "free_raw";
    case proto::kOpStat:
      return "stat";
  }
  return ObjectService::OpName(opcode);
}

}  // namespace

struct MemoryServer::Impl {
  ServerConfig config;
  // Declared before `node` so it is destroyed after it: no peer can reach a pool once unmapped.
  std::unique_ptr<PoolSet> pools;
  std::unique_ptr<ObjectService> objects;  // null when config.objects.enabled is false
  std::unique_ptr<Node> node;
  std::chrono::steady_clock::time_point created = std::chrono::steady_clock::now();
  std::atomic<bool> started{false};
  std::atomic<bool> handlers_registered{false};
  struct OpCounters {
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> errors{0};
  };
  std::array<OpCounters, kNumOps> ops;

  ~Impl() {
    if (node) node->stop();
    if (objects) objects->Stop();
  }

  // Runs a handler, counting the call (before, so STAT includes itself) and its failure.
  Status Counted(uint16_t opcode, Status (Impl::*fn)(const RpcCall&, std::vector<std::byte>&),
                 const RpcCall& call, std::vector<std::byte>& reply) {
    auto& c = ops[opcode - kFirstUserOpcode];
    c.calls.fetch_add(1, std::memory_order_relaxed);
    Status st = (this->*fn)(call, reply);
    if (!st.ok()) c.errors.fetch_add(1, std::memory_order_relaxed);
    return st;
  }

  Status AllocRaw(const RpcCall& call, std::vector<std::byte>& reply) {
    auto req = proto::Decode<proto::AllocRawRequest>(call.request);
    if (!req) {
      return Status::Protocol("ALLOC_RAW request must be " +
                              std::to_string(sizeof(proto::AllocRawRequest)) + " bytes, got " +
                              std::to_string(call.request.size()));
    }
    Result<PoolAllocation> a = pools->allocate(req->length);
    if (!a.ok()) {
      FARMEM_LOG_DEBUG("ALLOC_RAW {} from {}: {}", req->length, call.source, a.status().ToString());
      return a.status();
    }
    reply = proto::Encode(proto::AllocRawReply{a->key, a->offset, a->length});
    return Status::OK();
  }

  Status FreeRaw(const RpcCall& call, std::vector<std::byte>& reply) {
    auto req = proto::Decode<proto::FreeRawRequest>(call.request);
    if (!req) {
      return Status::Protocol("FREE_RAW request must be " +
                              std::to_string(sizeof(proto::FreeRawRequest)) + " bytes, got " +
                              std::to_string(call.request.size()));
    }
    Result<uint64_t> len = pools->free(req->key, req->offset);
    if (!len.ok()) {
      FARMEM_LOG_DEBUG("FREE_RAW offset {} from {}: {}", req->offset, call.source,
                       len.status().ToString());
      return len.status();
    }
    reply = proto::Encode(proto::FreeRawReply{*len});
    return Status::OK();
  }

  Status Objects(const RpcCall& call, std::vector<std::byte>& reply) {
    return objects->Handle(call, reply);
  }

  Status Stat(const RpcCall& call, std::vector<std::byte>& reply) {
    if (call.request.size() != proto::kStatRequestSize) {
      return Status::Protocol("STAT request must be empty, got " +
                              std::to_string(call.request.size()) + " bytes");
    }
    const std::string text = Stats().dump();
    const auto* p = reinterpret_cast<const std::byte*>(text.data());
    reply.assign(p, p + text.size());
    return Status::OK();
  }

  nlohmann::json Stats() const {
    using nlohmann::json;
    json j;
    j["node"] = config.node.name;
    const bool running = started.load();
    j["bootstrap"] = running ? node->bootstrap_address() : "";
    j["transport"] = {{"name", node->transport().name()},
                      {"address", running ? node->transport().local_address() : ""}};
    j["uptime_seconds"] =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - created).count();

    std::vector<PoolSnapshot> snap = pools->snapshot();
    uint64_t allocated = 0, allocations = 0, mapped = 0;
    json list = json::array();
    for (const PoolSnapshot& p : snap) {
      allocated += p.stats.allocated_bytes;
      allocations += p.stats.allocations;
      mapped += p.length;
      if (list.size() < kMaxListedPools) {
        list.push_back({{"name", p.name},
                        {"bytes", p.length},
                        {"allocated_bytes", p.stats.allocated_bytes},
                        {"free_bytes", p.stats.free_bytes},
                        {"allocations", p.stats.allocations},
                        {"largest_free", p.stats.largest_free},
                        {"free_ranges", p.stats.free_ranges}});
      }
    }
    j["memory"] = {
        {"budget_bytes", config.memory_bytes}, {"reserved_bytes", pools->reserved_bytes()},
        {"pool_bytes", pools->pool_bytes()},   {"pools", snap.size()},
        {"max_pools", pools->max_pools()},     {"mapped_bytes", mapped},
        {"allocated_bytes", allocated},        {"free_bytes", pools->reserved_bytes() - allocated},
        {"allocations", allocations}};
    j["pools"] = std::move(list);
    j["pools_truncated"] = snap.size() > kMaxListedPools;

    json rpc = json::object();
    for (uint16_t op = kFirstUserOpcode; op <= object_wire::kLastObjectsOpcode; ++op) {
      const char* name = OpName(op);
      if (!name) continue;
      if (!objects && ObjectService::OpName(op) != nullptr) continue;
      const auto& c = ops[op - kFirstUserOpcode];
      rpc[name] = {{"opcode", op}, {"calls", c.calls.load()}, {"errors", c.errors.load()}};
    }
    j["rpc"] = std::move(rpc);
    j["objects"] = objects ? objects->Stats() : json{{"enabled", false}};
    return j;
  }
};

MemoryServer::MemoryServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MemoryServer::~MemoryServer() {
  stop();
}

Result<std::unique_ptr<MemoryServer>> MemoryServer::Create(const ServerConfig& config) {
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  FARMEM_ASSIGN_OR_RETURN(impl->node, Node::Create(config.node));
  Node* node = impl->node.get();
  auto pools = PoolSet::Create(
      config.memory_bytes, config.pool_bytes,
      [node](const std::string& name, void* addr, size_t len) -> Result<RegionKey> {
        FARMEM_ASSIGN_OR_RETURN(RegionInfo info, node->export_region(name, addr, len));
        return info.key;
      });
  if (!pools.ok()) return pools.status().WithContext("memory server config");
  impl->pools = std::move(*pools);
  if (config.objects.enabled) {
    auto objects = ObjectService::Create(config, *node);
    if (!objects.ok()) return objects.status().WithContext("memory server config");
    impl->objects = std::move(*objects);
  }
  return std::unique_ptr<MemoryServer>(new MemoryServer(std::move(impl)));
}

Status MemoryServer::start() {
  Impl* impl = impl_.get();
  if (impl->started.load()) return Status::OK();
  if (!impl->handlers_registered.exchange(true)) {
    // Every handler is counted; the node turns a returned error into an error reply, so a bad
    // request never takes the server down.
    auto reg = [&](uint16_t op, Status (Impl::*fn)(const RpcCall&, std::vector<std::byte>&),
                   RpcExecution execution = RpcExecution::kWorker) {
      return impl->node->register_rpc(
          op,
          [impl, op, fn](const RpcCall& call, std::vector<std::byte>& reply) {
            return impl->Counted(op, fn, call, reply);
          },
          execution);
    };
    FARMEM_RETURN_IF_ERROR(reg(proto::kOpAllocRaw, &Impl::AllocRaw));
    FARMEM_RETURN_IF_ERROR(reg(proto::kOpFreeRaw, &Impl::FreeRaw));
    FARMEM_RETURN_IF_ERROR(reg(proto::kOpStat, &Impl::Stat));
    if (impl->objects) {
      for (uint16_t op = kObjectsOpcodeBase; op <= object_wire::kLastObjectsOpcode; ++op) {
        if (ObjectService::OpName(op) == nullptr) continue;
        FARMEM_RETURN_IF_ERROR(reg(op, &Impl::Objects, ObjectService::Execution(op)));
      }
    }
  }
  if (impl->objects) FARMEM_RETURN_IF_ERROR(impl->objects->Start());
  FARMEM_RETURN_IF_ERROR(impl->node->start());
  impl->started.store(true);
  FARMEM_LOG_INFO(
      "memory server '{}' started: bootstrap {} transport {} budget {} MiB, pools of {} MiB",
      impl->config.node.name, impl->node->bootstrap_address(), impl->node->transport().name(),
      impl->config.memory_bytes >> 20, impl->config.pool_bytes >> 20);
  if (impl->objects) {
    const ObjectsConfig& oc = impl->objects->config();
    FARMEM_LOG_INFO(
        "object store: {} MiB range, {} MiB physical, {}-byte blocks, id_bits {}, {} workers",
        oc.reserve_bytes >> 20, oc.max_physical_bytes >> 20, oc.block_size, oc.id_bits, oc.workers);
  }
  return Status::OK();
}

void MemoryServer::stop() {
  if (impl_ && impl_->node) {
    impl_->node->stop();
    if (impl_->objects) impl_->objects->Stop();
    impl_->started.store(false);
  }
}

nlohmann::json MemoryServer::stats() const {
  return impl_->Stats();
}

Node& MemoryServer::node() {
  return *impl_->node;
}

const ServerConfig& MemoryServer::config() const {
  return impl_->config;
}

}  // namespace farmem
