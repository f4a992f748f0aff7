// Example: named synchronization of the regions library (farmem/regions.h), built against an
// installed farmem. An embedded memory server holds the sync cells; the names live in an in-process
// cluster store (memory://). Three workers — threads here, processes or hosts in a deployment, the
// code is the same with an etcd:// store — meet at a barrier, increment a remote counter with a
// plain read and write under a named mutex, and meet again; the counter must be exact.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <farmem/client.h>
#include <farmem/cluster.h>
#include <farmem/node.h>
#include <farmem/regions.h>
#include <farmem/server.h>

namespace {

void Check(const farmem::Status& st, const std::string& what) {
  if (!st.ok()) {
    std::fprintf(stderr, "regions_sync: %s failed: %s\n", what.c_str(), st.ToString().c_str());
    std::exit(1);
  }
}

constexpr int kWorkers = 3;
constexpr int kIncrements = 100;
constexpr std::chrono::seconds kTimeout{20};  // every wait ends by then, never hangs

// One worker: its own node, raw client and RegionSync (a RegionSync serves one thread).
void Worker(int id, const std::string& server, farmem::Cluster& cluster,
            farmem::RemoteRef counter) {
  farmem::NodeConfig nc;
  nc.name = "worker" + std::to_string(id);
  auto node = farmem::Node::Create(nc);
  Check(node.status(), "Node::Create");
  Check((*node)->start(), "Node::start");
  auto raw = farmem::RawClient::Connect(**node, server);
  Check(raw.status(), "RawClient::Connect");
  auto sync = farmem::RegionSync::Open(**node, cluster, raw->get());
  Check(sync.status(), "RegionSync::Open");
  farmem::RegionSync& s = **sync;
  // Every worker inits the names: the first creates them, the others agree.
  Check(s.rbarrier_init("example/start", kWorkers), "rbarrier_init");
  Check(s.rmutex_init("example/lock"), "rmutex_init");
  Check(s.rbarrier_wait("example/start", kTimeout), "rbarrier_wait (start)");

  auto sched = (*node)->make_scheduler();
  Check(sched.status(), "make_scheduler");
  farmem::Scheduler& sc = **sched;
  counter.peer = (*raw)->server().id;  // this node's id for the server
  for (int i = 0; i < kIncrements; i++) {
    Check(s.rmutex_lock("example/lock", kTimeout), "rmutex_lock");
    uint64_t v = 0;  // a plain read-modify-write: correct only under the lock
    Check(sc.block_on(sc.read(counter, &v, sizeof v)), "read");
    v++;
    Check(sc.block_on(sc.write(counter, &v, sizeof v, /*delivery_complete=*/true)), "write");
    Check(s.rmutex_unlock("example/lock"), "rmutex_unlock");
  }
  Check(s.rbarrier_wait("example/start", kTimeout), "rbarrier_wait (end)");
  std::printf("worker %d: %d increments done, passed both barriers\n", id, kIncrements);
  sched->reset();
  sync->reset();
  raw->reset();
  (*node)->stop();
}

}  // namespace

int main() {
  auto server = farmem::MemoryServer::Create(farmem::ServerConfig{});
  Check(server.status(), "MemoryServer::Create");
  Check((*server)->start(), "MemoryServer::start");
  const std::string address = (*server)->node().bootstrap_address();

  farmem::ClusterOptions co;
  co.url = "memory://regions-sync-example";
  co.create_if_missing = true;
  auto cluster = farmem::Cluster::Open(co);
  Check(cluster.status(), "Cluster::Open");

  // The shared counter: 8 bytes of remote memory, zeroed by the owner.
  farmem::NodeConfig nc;
  nc.name = "owner";
  auto node = farmem::Node::Create(nc);
  Check(node.status(), "Node::Create");
  Check((*node)->start(), "Node::start");
  auto raw = farmem::RawClient::Connect(**node, address);
  Check(raw.status(), "RawClient::Connect");
  auto range = (*raw)->alloc_raw(64);
  Check(range.status(), "alloc_raw");
  auto sched = (*node)->make_scheduler();
  Check(sched.status(), "make_scheduler");
  uint64_t zero = 0;
  Check((*sched)->block_on((*sched)->write(range->ref, &zero, sizeof zero, true)), "write");

  std::vector<std::thread> workers;
  for (int i = 0; i < kWorkers; i++) {
    workers.emplace_back(Worker, i, address, std::ref(**cluster), range->ref);
  }
  for (auto& w : workers) w.join();

  uint64_t total = 0;
  Check((*sched)->block_on((*sched)->read(range->ref, &total, sizeof total)), "read");
  std::printf("counter = %" PRIu64 " (expected %d)\n", total, kWorkers * kIncrements);
  if (total != uint64_t{kWorkers * kIncrements}) {
    std::fprintf(stderr, "regions_sync: the mutex let two workers in\n");
    return 1;
  }
  // Names outlive their creators until deleted.
  auto owner_sync = farmem::RegionSync::Open(**node, **cluster, raw->get());
  Check(owner_sync.status(), "RegionSync::Open");
  Check((*owner_sync)->rdelete("example/start"), "rdelete");
  Check((*owner_sync)->rdelete("example/lock"), "rdelete");
  owner_sync->reset();
  sched->reset();
  raw->reset();
  (*node)->stop();
  (*server)->stop();
  std::printf("regions_sync: all checks passed\n");
  return 0;
}
