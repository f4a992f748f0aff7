// LocalServerTest: a gtest fixture with a MemoryServer (native TCP on loopback, the services a
// test names) and a started client Node with the same cluster token, torn down in the right
// order. For end-to-end tests of a service and its client (sessions, pools, objects).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "farmem/node.h"
#include "farmem/server.h"

namespace farmem::testing {

class LocalServerTest : public ::testing::Test {
 protected:
  // A server configuration on loopback native TCP with the tests' token and two RPC workers.
  static ServerConfig LoopbackConfig(std::vector<std::string> services, uint64_t memory_bytes,
                                     uint64_t pool_bytes) {
    ServerConfig sc;
    sc.memory_bytes = memory_bytes;
    sc.pool_bytes = pool_bytes;
    sc.node.transport.backend = "tcp";
    sc.node.transport.cluster_token = "secret";
    sc.node.rpc_workers = 2;
    sc.services = std::move(services);
    return sc;
  }

  // Starts the server and the client node; call from SetUp with ASSERT_NO_FATAL_FAILURE.
  void StartServer(std::vector<std::string> services, uint64_t memory_bytes, uint64_t pool_bytes,
                   std::string client_name) {
    StartServer(LoopbackConfig(std::move(services), memory_bytes, pool_bytes),
                std::move(client_name));
  }
  // The same with a configuration of the test's own (LoopbackConfig, then changed).
  void StartServer(const ServerConfig& sc, std::string client_name) {
    auto s = MemoryServer::Create(sc);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->start().ok());
    NodeConfig nc;
    nc.name = std::move(client_name);
    nc.transport.backend = "tcp";
    nc.transport.cluster_token = sc.node.transport.cluster_token;
    auto n = Node::Create(nc);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    node_ = std::move(*n);
    ASSERT_TRUE(node_->start().ok());
  }
  // Subclasses that hold schedulers or clients of node_ release them first, then call this.
  void TearDown() override {
    if (node_) node_->stop();
    if (server_) server_->stop();
  }

  std::unique_ptr<MemoryServer> server_;
  std::unique_ptr<Node> node_;
};

}  // namespace farmem::testing
