// `farmem bench cluster`: control-plane latency against a local etcd started for the run —
// how long a membership change takes to reach every watcher of a 3-node cluster, and metadata
// get/put latency — each compared in the same run with etcd's own tool, etcdctl.
#pragma once

#include <string>

namespace farmem {

struct ClusterBenchOptions {
  bool quick = false;
  int rounds = 5;    // interleaved rounds (baseline, subject, baseline, ...), at least 5 each
  int changes = 0;   // membership changes (joins + leaves) per round; 0 = 40 (--quick: 16)
  int ops = 0;       // farmem get and put calls per round; 0 = 200 (--quick: 50)
  int tool_ops = 0;  // etcdctl processes per operation kind per round; 0 = 20 (--quick: 8)
  std::string etcd = "/usr/bin/etcd";
  std::string etcdctl = "/usr/bin/etcdctl";
  // The clientv3 baseline binary; "" = `go build` bench/etcd_baseline at the start.
  std::string go_baseline;
  std::string json_path = "cluster.json";
};

// Exit code: 0 ran (targets may MISS), 1 failed, 2 bad options.
int RunClusterBench(ClusterBenchOptions options);

}  // namespace farmem
