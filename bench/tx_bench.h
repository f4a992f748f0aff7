// `farmem bench tx`: Storm transactions on farmemd tx tables, per backend (native TCP, fabric shm):
// KV lookups (latency one at a time, one-sided share cold and warm against the model, server CPU
// per lookup and throughput with farmemd pinned to one core; RPC-only, one-two-sided, perfect)
// and TATP (one-two-sided vs RPC-only vs Redis Lua and WATCH/MULTI/EXEC). Main thread drives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace farmem {

struct TxBenchOptions {
  bool quick = false;  // under two minutes: small tables, 5 rounds of short runs
  std::vector<std::string> backends = {"tcp", "fabric:shm"};
  int rounds = 5;             // interleaved rounds (>= 5)
  double seconds = 2.0;       // per configuration per round (--quick: 0.6)
  int threads = 2;            // client threads (farmem and Redis alike)
  int inflight = 8;           // coroutines (farmem) / pipelined transactions (Redis Lua) per thread
  uint64_t kv_keys = 200000;  // --quick: 40000
  double alpha = 0.5;         // KV table load: keys / (buckets x width 1)
  double zipf_theta = 0.99;   // the Zipf KV run (0: none)
  uint64_t subscribers = 100000;  // TATP population (--quick: 10000)
  double tatp_alpha = 0.5;        // TATP table load (width 1, "oversub")
  int latency_samples = 4000;     // lookups one at a time per configuration per round
  std::string only;               // "kv" or "tatp": run only that part ("" = both)
  bool redis = true;              // the Redis baselines (skipped when redis-server is missing)
  uint64_t seed = 42;
  std::string farmemd;  // binary; "" = next to farmem, else PATH
  // Extra flags for every farmemd (e.g. --tx-lease-ms=10000); the targets are for the defaults.
  std::vector<std::string> farmemd_args;
  std::string json_path = "tx.json";
};

// Exit code: 0 ran (targets may MISS), 1 failed, 2 bad options.
int RunTxBench(TxBenchOptions options);

}  // namespace farmem
