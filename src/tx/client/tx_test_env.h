// TxEnv: test-only fixture helper for the tx service and client: one or two in-process farmemd
// (services "tx" only) holding partitions 0..n-1 of the same tables, on a given backend (native
// TCP or fabric shm), and a started client node. Used by the tests of src/tx/client and
// src/tx/service from their main thread; the servers' own threads serve them.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "farmem/server.h"
#include "farmem/tx.h"
#include "node/node_test_util.h"

namespace farmem::tx_test {

struct TxEnv {
  std::vector<std::unique_ptr<MemoryServer>> servers;
  std::unique_ptr<Node> node;  // client side
  std::vector<std::string> addresses;

  ~TxEnv() {
    if (node) node->stop();
    for (auto& s : servers) s->stop();
  }

  // `tables`: --tx-table specs. A failure is reported with ADD_FAILURE and leaves `node` null.
  static std::unique_ptr<TxEnv> Start(const std::string& backend, uint32_t partitions,
                                      std::vector<std::string> tables, uint32_t lease_ms = 5000,
                                      uint32_t overflow_percent = 25) {
    auto env = std::make_unique<TxEnv>();
    for (uint32_t p = 0; p < partitions; ++p) {
      ServerConfig sc;
      sc.node = ::farmem::node::testing::MakeConfig(backend, "tx-farmemd-" + std::to_string(p));
      sc.node.rpc_workers = 2;
      sc.services = {"tx"};
      sc.memory_bytes = 16ull << 20;
      sc.pool_bytes = 4ull << 20;
      sc.tx.tables = tables;
      sc.tx.partition = p;
      sc.tx.partitions = partitions;
      sc.tx.lease_ms = lease_ms;
      sc.tx.overflow_percent = overflow_percent;
      auto s = MemoryServer::Create(sc);
      if (!s.ok()) {
        ADD_FAILURE() << "server create: " << s.status().ToString();
        return env;
      }
      if (Status st = (*s)->start(); !st.ok()) {
        ADD_FAILURE() << "server start: " << st.ToString();
        return env;
      }
      env->addresses.push_back((*s)->node().bootstrap_address());
      env->servers.push_back(std::move(*s));
    }
    auto n = Node::Create(::farmem::node::testing::MakeConfig(backend, "tx-client"));
    Status st = n.ok() ? (*n)->start() : n.status();
    if (!st.ok()) {
      ADD_FAILURE() << "client node: " << st.ToString();
      return env;
    }
    env->node = std::move(*n);
    return env;
  }

  Result<std::unique_ptr<TxClient>> Connect(TxClientOptions options = {}) {
    return TxClient::Connect(*node, addresses, options);
  }
};

inline std::vector<std::byte> Key(uint64_t k, size_t size = 8) {
  std::vector<std::byte> out(size);
  std::memcpy(out.data(), &k, 8);
  return out;
}
inline std::vector<std::byte> Value(uint64_t v, size_t size) {
  std::vector<std::byte> out(size);
  std::memcpy(out.data(), &v, 8);
  return out;
}
inline uint64_t U64(std::span<const std::byte> b) {
  uint64_t v = 0;
  std::memcpy(&v, b.data(), 8);
  return v;
}

// The backends the tx tests run on, and their test-name suffixes:
// INSTANTIATE_TEST_SUITE_P(Backends, Suite, kTxBackends, TxBackendName).
inline const auto kTxBackends = ::testing::Values(std::string("tcp"), std::string("fabric:shm"));
inline std::string TxBackendName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param == "tcp" ? "tcp" : "fabric_shm";
}

}  // namespace farmem::tx_test
