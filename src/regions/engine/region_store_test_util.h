// Test fixture pieces for the region store: embedded farmemd(s) over loopback TCP, a client Node,
// a fresh memory:// cluster store per test, and FARMEM_REGIONS_FAULT (docs/regions.md "Tests").
// Used by the test's main thread only.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "farmem/cluster.h"
#include "farmem/server.h"
#include "regions/engine/region_store.h"

namespace farmem::regions::testing {

// The protection this run removes ("" = none); printed so a log shows it.
inline std::string FaultName() {
  const char* e = std::getenv("FARMEM_REGIONS_FAULT");
  return e ? e : "";
}

inline std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

// `servers` farmemds with `budget` bytes each (pools of 4 MiB, or the budget if smaller).
// Reads n bytes of `ino` at `off` through the store; a failed read is a test failure and an
// empty result, a short one is cut to what was read.
inline std::vector<std::byte> ReadBytes(RegionStore& store, uint64_t ino, uint64_t off, size_t n) {
  std::vector<std::byte> out(n);
  auto r = store.read(ino, off, out);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  out.resize(r.ok() ? *r : 0);
  return out;
}

class RegionEnv {
 public:
  Status Start(int servers, uint64_t budget, bool persistent_units = false) {
    for (int i = 0; i < servers; ++i) {
      ServerConfig sc;
      sc.memory_bytes = budget;
      sc.pool_bytes = std::min<uint64_t>(budget, 4ull << 20);
      sc.node.name = "regions-farmemd-" + std::to_string(i);
      sc.node.transport.backend = "tcp";
      sc.node.transport.cluster_token = "secret";
      sc.node.rpc_workers = 1;
      sc.services = {"pools"};
      FARMEM_ASSIGN_OR_RETURN(auto s, MemoryServer::Create(sc));
      FARMEM_RETURN_IF_ERROR(s->start());
      options.servers.push_back(s->node().bootstrap_address());
      this->servers.push_back(std::move(s));
    }
    options.persistent_units = persistent_units;
    NodeConfig nc;
    nc.name = "regions-client";
    nc.transport.backend = "tcp";
    nc.transport.cluster_token = "secret";
    FARMEM_ASSIGN_OR_RETURN(node, Node::Create(nc));
    FARMEM_RETURN_IF_ERROR(node->start());
    static std::atomic<int> n{0};
    ClusterOptions co;
    co.url = "memory://regions-test-" + std::to_string(getpid()) + "-" + std::to_string(n++);
    co.create_if_missing = true;
    FARMEM_ASSIGN_OR_RETURN(cluster, Cluster::Open(co));
    meta = NewClusterMetaStore(*cluster);
    return Status::OK();
  }
  Result<std::unique_ptr<RegionStore>> OpenStore() {
    return RegionStore::Open(*node, *meta, options);
  }
  ~RegionEnv() {
    if (node) node->stop();
    for (auto& s : servers) s->stop();
  }

  std::vector<std::unique_ptr<MemoryServer>> servers;
  std::unique_ptr<Node> node;
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<MetaStore> meta;
  RegionStoreOptions options;
};

}  // namespace farmem::regions::testing
