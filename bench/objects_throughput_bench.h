// `farmem bench objects-throughput`: read throughput of 32 B objects from a farmemd child process,
// direct_read (one-sided, checked) vs read (RPC) vs a raw transport read of the same slot bytes,
// uniform and Zipf(0.99) keys, 1-8 client threads; plus Redis GETs of 32 B values in the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace farmem {

struct ObjectsThroughputOptions {
  std::string backend = "tcp";  // "tcp" | "fabric:<provider>"
  uint64_t objects = 0;         // objects loaded (and Redis keys); 0 = 1 M (100 k with --quick)
  size_t size = 32;             // object / value bytes
  std::vector<int> clients;     // empty = 1,2,4,8
  int inflight = 8;             // reads each client thread keeps in flight (K)
  double seconds = 0;           // measured time per case; 0 = 1 s (0.5 s with --quick)
  // A case is measured in this many rounds of seconds/rounds each (after its own warm-up); every
  // case of a key distribution (all client counts, read paths and Redis) runs once per round, so
  // compared cases alternate; a case's rate is the median round, a target's ratio the median of
  // the per-round ratios.
  int rounds = 5;
  bool redis = true;  // also measure redis-server GETs (skipped with a note if missing)
  // Read paths measured, in turn: raw_read, direct_read, read, scan_read (one-sided copy of the
  // object's whole block). Empty = the first three.
  std::vector<std::string> ops;
  // The server's block geometry (0 / 16: farmemd's defaults; else a tuned run).
  uint32_t server_max_block_size = 0;
  uint32_t server_min_slots_per_block = 16;
  bool quick = false;  // 100 k objects, 0.5 s per case
  std::string json_path = "objects_throughput.json";
};

// Runs the benchmark, prints each case, the targets (PASS/MISS with ratios) and writes JSON.
// Returns a process exit code: 0 ran (targets may still MISS), 1 failed, 2 bad options.
int RunObjectsThroughputBench(ObjectsThroughputOptions options);

}  // namespace farmem
