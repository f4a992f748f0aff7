// TierEnv: an in-process tiered-memory server for tests — a Node on "tcp" or "fabric:shm" with a
// TierService registered on it (so tests reach the store to force promotions and demotions), a
// started client node, and TieredClient connections. Backing files go to a non-tmpfs temp dir.
// Used by the test threads only (the service and client are thread-safe themselves).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/node.h"
#include "farmem/server.h"
#include "farmem/tier.h"
#include "node/node_test_util.h"
#include "node/rpc_call.h"
#include "tier/engine/tier_test_util.h"
#include "tier/service/tier_service.h"

namespace farmem::tier::testing {

inline ServerConfig TierServerConfig(const std::string& backend, const std::string& file,
                                     uint64_t units, uint64_t budget_units, uint32_t unit_kib = 16,
                                     TierMode mode = TierMode::kFull, uint32_t period_ms = 60000) {
  ServerConfig sc;
  sc.node = ::farmem::node::testing::MakeConfig(backend, "tier-farmemd");
  sc.tier.file = file;
  sc.tier.unit_kib = unit_kib;
  sc.tier.capacity_bytes = units * unit_kib * 1024;
  sc.tier.dram_bytes = budget_units * unit_kib * 1024;
  sc.tier.fill_percent = 100;
  sc.tier.period_ms = period_ms;
  sc.tier.mode = mode;
  return sc;
}

// The tier server as seen without TieredClient, for requests it would never send: the peer (and
// the keys of regions `tier` and `tier-bitmap`, 0 when not exported), a scheduler for one-sided
// operations, and Call(opcode, request body) -> the RPC's status.
struct RawTierPeer {
  PeerInfo peer;
  std::unique_ptr<Scheduler> sched;
  RegionKey data_key = 0;
  RegionKey bitmap_key = 0;
  std::vector<std::byte> reply = std::vector<std::byte>(64 << 10);

  Status Call(uint16_t opcode, std::span<const std::byte> request) {
    auto r = sched->block_on(CallRpc(*sched, peer.id, opcode, request, reply, "raw"));
    return r.ok() ? Status::OK() : r.status();
  }
};

struct TierEnv {
  TempDir dir;
  std::unique_ptr<Node> server_node;
  std::unique_ptr<TierService> service;
  std::unique_ptr<Node> client_node;
  std::string address;

  // Starts both ends (service period thread included); ADD_FAILURE and service == nullptr on error.
  // `adjust` may change the server's config (backing file, direct IO, op timeout: the client's
  // follows) before the service opens.
  static std::unique_ptr<TierEnv> Start(const std::string& backend, uint64_t units,
                                        uint64_t budget_units, TierMode mode = TierMode::kFull,
                                        uint32_t period_ms = 60000, uint32_t unit_kib = 16,
                                        const std::function<void(ServerConfig&)>& adjust = {},
                                        TierStoreFaults faults = {}) {
    auto env = std::make_unique<TierEnv>();
    if (!env->dir.ok()) {
      ADD_FAILURE() << "no temp dir";
      return env;
    }
    ServerConfig sc = TierServerConfig(backend, env->dir.File("tier.data"), units, budget_units,
                                       unit_kib, mode, period_ms);
    if (adjust) adjust(sc);
    auto n = Node::Create(sc.node);
    if (!n.ok()) {
      ADD_FAILURE() << "server node: " << n.status().ToString();
      return env;
    }
    env->server_node = std::move(*n);
    auto s = TierService::Create(sc, *env->server_node, faults);
    if (!s.ok()) {
      ADD_FAILURE() << "tier service: " << s.status().ToString();
      return env;
    }
    for (ServiceMethod& m : (*s)->methods()) {
      Status st = env->server_node->register_rpc(m.opcode, m.handler, m.execution);
      if (!st.ok()) {
        ADD_FAILURE() << "register " << m.name << ": " << st.ToString();
        return env;
      }
    }
    if (Status st = env->server_node->start(); !st.ok()) {
      ADD_FAILURE() << "server start: " << st.ToString();
      return env;
    }
    if (Status st = (*s)->start(); !st.ok()) {
      ADD_FAILURE() << "service start: " << st.ToString();
      return env;
    }
    env->address = env->server_node->bootstrap_address();
    // The client waits as long as the server's config says (`adjust` may lengthen both).
    NodeConfig cc = ::farmem::node::testing::MakeConfig(backend, "tier-client");
    cc.transport.op_timeout = sc.node.transport.op_timeout;
    auto c = Node::Create(cc);
    Status st = c.ok() ? (*c)->start() : c.status();
    if (!st.ok()) {
      ADD_FAILURE() << "client node: " << st.ToString();
      return env;
    }
    env->client_node = std::move(*c);
    env->service = std::move(*s);
    return env;
  }

  Result<std::unique_ptr<TieredClient>> Connect(TieredClientOptions options = {}) {
    return TieredClient::Connect(*client_node, address, options);
  }

  Result<RawTierPeer> Raw() {
    RawTierPeer raw;
    FARMEM_ASSIGN_OR_RETURN(raw.peer, client_node->connect(address));
    FARMEM_ASSIGN_OR_RETURN(raw.sched, client_node->make_scheduler());
    for (const RegionInfo& r : raw.peer.regions) {
      if (r.name == TierService::kDataRegionName) raw.data_key = r.key;
      if (r.name == TierService::kBitmapRegionName) raw.bitmap_key = r.key;
    }
    return raw;
  }

  ~TierEnv() {
    if (client_node) client_node->stop();
    if (service) service->stop();
    if (server_node) server_node->stop();
    service.reset();
  }
};

// n random bytes, as the client API takes them.
inline std::vector<std::byte> Random(std::mt19937_64& rng, size_t n) {
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

inline std::string BackendName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param == "tcp" ? "tcp" : "fabric_shm";
}

// Every frame is accounted for in a STAT tier section: resident + quarantined + free == budget.
inline void ExpectBudgetExact(const nlohmann::json& s) {
  EXPECT_EQ(s["resident_units"].get<uint64_t>() + s["quarantined_frames"].get<uint64_t>() +
                s["free_frames"].get<uint64_t>(),
            s["budget_units"].get<uint64_t>())
      << s.dump();
  EXPECT_LE(s["resident_units"].get<uint64_t>(), s["budget_units"].get<uint64_t>()) << s.dump();
}

}  // namespace farmem::tier::testing
