// Command-line flags of `farmem bench tx` (header-only so only the farmem binary, which links
// CLI11, includes it; src/cli/main.cc registers it with one call).
#pragma once

#include <CLI/CLI.hpp>

#include "tx_bench.h"

namespace farmem {

inline CLI::App* AddTxBenchCommand(CLI::App& bench, TxBenchOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "tx",
      "Storm transactions: KV lookups (RPC-only, one-two-sided, perfect) and TATP vs RPC-only "
      "and Redis (Lua, WATCH/MULTI/EXEC)");
  cmd->add_flag("--quick", o.quick, "run under two minutes: small tables, short rounds");
  cmd->add_option("--backend", o.backends,
                  "tcp | fabric:<provider> (repeatable; default tcp and fabric:shm, with "
                  "--servers tcp)");
  cmd->add_option("--rounds", o.rounds, "interleaved rounds per comparison")
      ->capture_default_str()
      ->check(CLI::Range(5, 100));
  cmd->add_option("--seconds", o.seconds, "per configuration per round (--quick: 0.6)")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 600.0));
  cmd->add_option("--threads", o.threads, "client threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--inflight", o.inflight, "transactions in flight per client thread")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--kv-keys", o.kv_keys, "keys of the KV table (--quick: 40000)")
      ->capture_default_str()
      ->check(CLI::Range(1000, 50000000));
  cmd->add_option("--alpha", o.alpha, "KV table load alpha = keys / buckets (width 1)")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 1.0));
  cmd->add_option("--zipf", o.zipf_theta, "Zipf theta of the skewed KV run (0 = no Zipf run)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.9999));
  cmd->add_option("--subscribers", o.subscribers, "TATP subscribers (--quick: 10000)")
      ->capture_default_str()
      ->check(CLI::Range(100, 10000000));
  cmd->add_option("--tatp-alpha", o.tatp_alpha, "TATP table load (width 1)")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 1.0));
  cmd->add_option("--latency-samples", o.latency_samples,
                  "lookups one at a time per configuration per round")
      ->capture_default_str()
      ->check(CLI::Range(100, 10000000));
  cmd->add_option("--only", o.only, "run only one part: kv | tatp")
      ->check(CLI::IsMember({"kv", "tatp"}));
  cmd->add_flag("!--no-redis", o.redis, "leave out the Redis baselines");
  cmd->add_option("--seed", o.seed, "population and input seed")->capture_default_str();
  cmd->add_option("--farmemd", o.farmemd, "farmemd binary (default: next to farmem, else PATH)");
  cmd->add_option(
         "--farmemd-arg", o.farmemd_args,
         "extra flag for every farmemd (repeatable, e.g. --farmemd-arg=--tx-lease-ms=10000)")
      ->allow_extra_args(false);
  cmd->add_option("--servers", o.servers,
                  "running farmemds holding the KV and TATP tables' partitions (ADDR,ADDR,...): "
                  "the benchmark against them (scripts/bench_tx_netns)")
      ->delimiter(',');
  cmd->add_option("--server-pids", o.server_pids,
                  "with --servers: their pids in the same order (PID,PID,...), for the KV "
                  "server CPU from /proc")
      ->delimiter(',');
  cmd->add_option("--redis", o.redis_addr,
                  "with --servers: HOST:PORT of a running redis-server for the Redis baselines");
  cmd->add_option("--data-host", o.data_host,
                  "with --servers: IP this client's node listens on (reachable by them)")
      ->capture_default_str();
  cmd->add_option("--token", o.token, "with --servers: their cluster token")->capture_default_str();
  cmd->add_option("--print-tatp-tables", o.print_tatp_tables,
                  "print the farmemd --tx-table value of the TATP tables split over N servers "
                  "(sized by --subscribers/--quick, --tatp-alpha) and exit")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--print-kv-table", o.print_kv_table,
                  "print the farmemd --tx-table value of the KV table split over N servers and "
                  "the --tx-overflow-percent it needs (sized by --kv-keys/--quick, --alpha), exit")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--json", o.json_path, "JSON result file (\"\" = none)")->capture_default_str();
  return cmd;
}

}  // namespace farmem
