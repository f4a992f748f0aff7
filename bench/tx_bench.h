// `farmem bench tx`: Storm transactions on farmemd tx tables, per backend (native TCP, fabric shm):
// KV lookups (latency one at a time, one-sided share cold and warm against the model, server CPU
// per lookup and throughput with farmemd pinned to one core; RPC-only, one-two-sided, perfect)
// and TATP (one-two-sided vs RPC-only vs Redis Lua and WATCH/MULTI/EXEC). With --servers: the
// same parts against running farmemds that hold the tables' partitions (scripts/bench_tx_netns: one
// per network namespace), their CPU read from /proc by pid, Redis at --redis. Main thread drives.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace farmem {

struct TxBenchOptions {
  bool quick = false;  // under two minutes: small tables, 5 rounds of short runs
  // Empty: tcp and fabric:shm, or with `servers` tcp alone (one backend there: the servers').
  std::vector<std::string> backends;
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
  // Running farmemds ("host:port") holding partitions 0..n-1 of the TATP tables and of the KV
  // table (their --tx-table from `print_tatp_tables` and `print_kv_table`): no farmemd children.
  std::vector<std::string> servers;
  // With `servers`: their pids, in the same order (same machine, any network namespace): their
  // utime+stime from /proc gives the KV server-CPU target. Empty: that target is not judged.
  std::vector<int> server_pids;
  // With `servers`: "HOST:PORT" of a running redis-server for the Redis baselines ("" = none).
  std::string redis_addr;
  std::string data_host = "127.0.0.1";  // with `servers`: where this client's node listens
  std::string token = "farmem";         // with `servers`: their cluster token
  // > 0: print the --tx-table value of the TATP tables split over this many servers (for the
  // sizes these options give) and exit; scripts/bench_tx_netns starts its farmemds with it.
  int print_tatp_tables = 0;
  // > 0: print "--tx-table value of the KV table split over this many servers, then the
  // --tx-overflow-percent it needs" (one line, space separated) and exit.
  int print_kv_table = 0;
};

// Exit code: 0 ran (targets may MISS), 1 failed, 2 bad options.
int RunTxBench(TxBenchOptions options);

}  // namespace farmem
