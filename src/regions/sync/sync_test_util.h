// Test helpers of the regions sync tests: one "process worth" of a sync user (a started Node, a
// RawClient to the farmemd, a Cluster handle and a RegionSync) and the fault switch read from
// FARMEM_REGIONS_SYNC_FAULT. Used by the test threads and by the child processes of the stress
// test.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "farmem/client.h"
#include "farmem/cluster.h"
#include "farmem/node.h"
#include "farmem/regions.h"
#include "farmem/server.h"
#include "regions/sync/sync_faults.h"

namespace farmem::regions::sync::testing {

// Applies FARMEM_REGIONS_SYNC_FAULT (and prints it, so a run shows which protection is off).
inline std::string ApplyFaultFromEnv() {
  const char* e = std::getenv("FARMEM_REGIONS_SYNC_FAULT");
  std::string name = e != nullptr ? e : "";
  SyncFault f = SyncFault::kNone;
  if (!ParseSyncFault(name, &f)) {
    std::fprintf(stderr, "unknown FARMEM_REGIONS_SYNC_FAULT=%s\n", name.c_str());
    std::abort();
  }
  SetSyncFault(f);
  if (!name.empty()) std::printf("[ fault    ] FARMEM_REGIONS_SYNC_FAULT=%s\n", name.c_str());
  return name;
}

// The farmemd of the tests: an in-process MemoryServer (tcp, loopback, 4 MiB), started.
inline Result<std::unique_ptr<MemoryServer>> StartSyncServer() {
  ServerConfig sc;
  sc.memory_bytes = 4 << 20;
  sc.pool_bytes = 1 << 20;
  sc.node.name = "sync-farmemd";
  sc.node.transport.backend = "tcp";
  FARMEM_ASSIGN_OR_RETURN(auto server, MemoryServer::Create(sc));
  FARMEM_RETURN_IF_ERROR(server->start());
  return server;
}

struct SyncUser {
  std::unique_ptr<Node> node;
  std::unique_ptr<RawClient> raw;
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<RegionSync> sync;

  ~SyncUser() {
    sync.reset();
    cluster.reset();
    raw.reset();
    if (node) node->stop();
  }

  static Result<std::unique_ptr<SyncUser>> Open(const std::string& farmemd,
                                                const ClusterOptions& cluster_options,
                                                const std::string& name = "sync-user") {
    auto u = std::make_unique<SyncUser>();
    NodeConfig nc;
    nc.name = name;
    nc.transport.backend = "tcp";
    FARMEM_ASSIGN_OR_RETURN(u->node, Node::Create(nc));
    FARMEM_RETURN_IF_ERROR(u->node->start());
    FARMEM_ASSIGN_OR_RETURN(u->raw, RawClient::Connect(*u->node, farmemd));
    FARMEM_ASSIGN_OR_RETURN(u->cluster, Cluster::Open(cluster_options));
    FARMEM_ASSIGN_OR_RETURN(u->sync, RegionSync::Open(*u->node, *u->cluster, u->raw.get()));
    return u;
  }
};

}  // namespace farmem::regions::sync::testing
