// TxCluster: test-only fixture of in-process tx servers built from a Node and a TxService each
// (not a MemoryServer), so a test can hand the tables options (a fault switch of TxTableFaults),
// stop one server to play its death, and read its STAT; plus a started client node. Used by the
// recovery and history tests from their main thread; the servers' own threads serve them.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "farmem/node.h"
#include "farmem/tx.h"
#include "node/node_test_util.h"
#include "tx/service/tx_service.h"

namespace farmem::tx_test {

struct TxCluster {
  struct Server {
    std::unique_ptr<Node> node;
    std::unique_ptr<TxService> service;
    bool stopped = false;
  };
  std::vector<Server> servers;
  std::unique_ptr<Node> node;  // client side
  std::vector<std::string> addresses;

  ~TxCluster() {
    if (node) node->stop();
    for (size_t i = 0; i < servers.size(); ++i) Stop(i);
  }

  // Plays server i's death: its node stops (connections close, no more replies), then its
  // service (the reaper). Idempotent.
  void Stop(size_t i) {
    Server& s = servers[i];
    if (s.stopped) return;
    s.stopped = true;
    s.node->stop();
    s.service->stop();
  }

  // Holds server i's reaper (lease reaping and 2PC recovery) until ResumeRecovery(i), so that a
  // test decides when recovery first asks the peers — e.g. only after the first participant is
  // down; otherwise a reaper step in between asks the live first participant instead.
  void HoldRecovery(size_t i) { servers[i].service->stop(); }
  Status ResumeRecovery(size_t i) { return servers[i].service->start(); }

  // `tables`: --tx-table specs; `op_timeout`: every node's transport operation timeout (a dead
  // peer's calls fail by then). A failure is reported with ADD_FAILURE and leaves `node` null.
  static std::unique_ptr<TxCluster> Start(
      const std::string& backend, uint32_t partitions, std::vector<std::string> tables,
      uint32_t lease_ms, tx::TxTableOptions options = {},
      std::chrono::milliseconds op_timeout = std::chrono::milliseconds(2000)) {
    auto c = std::make_unique<TxCluster>();
    for (uint32_t p = 0; p < partitions; ++p) {
      NodeConfig nc = node::testing::MakeConfig(backend, "tx-server-" + std::to_string(p));
      nc.transport.op_timeout = op_timeout;
      auto n = Node::Create(nc);
      if (!n.ok()) {
        ADD_FAILURE() << "server node: " << n.status().ToString();
        return c;
      }
      ServerConfig sc;
      sc.tx.tables = tables;
      sc.tx.partition = p;
      sc.tx.partitions = partitions;
      sc.tx.lease_ms = lease_ms;
      auto svc = TxService::Create(sc, **n, options);
      if (!svc.ok()) {
        ADD_FAILURE() << "tx service: " << svc.status().ToString();
        return c;
      }
      for (const ServiceMethod& m : (*svc)->methods()) {
        if (Status st = (*n)->register_rpc(m.opcode, m.handler, m.execution); !st.ok()) {
          ADD_FAILURE() << "register: " << st.ToString();
          return c;
        }
      }
      Status st = (*n)->start();
      if (st.ok()) st = (*svc)->start();
      if (!st.ok()) {
        ADD_FAILURE() << "server start: " << st.ToString();
        return c;
      }
      c->addresses.push_back((*n)->bootstrap_address());
      c->servers.push_back(Server{std::move(*n), std::move(*svc)});
    }
    NodeConfig nc = node::testing::MakeConfig(backend, "tx-client");
    nc.transport.op_timeout = op_timeout;
    auto n = Node::Create(nc);
    Status st = n.ok() ? (*n)->start() : n.status();
    if (!st.ok()) {
      ADD_FAILURE() << "client node: " << st.ToString();
      return c;
    }
    c->node = std::move(*n);
    return c;
  }

  Result<std::unique_ptr<TxClient>> Connect(TxClientOptions options = {}) {
    return TxClient::Connect(*node, addresses, options);
  }
};

}  // namespace farmem::tx_test
