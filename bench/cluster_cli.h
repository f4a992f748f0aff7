// Command-line flags of `farmem bench cluster` (header-only so only the farmem binary, which links
// CLI11, includes it; src/cli/main.cc registers the subcommand with one call).
#pragma once

#include <CLI/CLI.hpp>

#include "cluster_bench.h"

namespace farmem {

inline CLI::App* AddClusterBenchCommand(CLI::App& bench, ClusterBenchOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "cluster",
      "membership change to 3 watchers and metadata get/put latency on a local etcd, vs etcdctl");
  cmd->add_flag("--quick", o.quick, "shorter run: 16 changes, 50 ops, 8 etcdctl runs per round");
  cmd->add_option("--rounds", o.rounds, "interleaved rounds (baseline, farmem, ...), >= 5")
      ->capture_default_str()
      ->check(CLI::Range(5, 100));
  cmd->add_option("--changes", o.changes, "membership changes per round (default 40)")
      ->check(CLI::Range(2, 100000));
  cmd->add_option("--ops", o.ops, "farmem get and put calls per round (default 200)")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--tool-ops", o.tool_ops,
                  "etcdctl runs per operation kind per round (default 20)")
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--etcd", o.etcd, "etcd binary")->capture_default_str();
  cmd->add_option("--etcdctl", o.etcdctl, "etcdctl binary")->capture_default_str();
  cmd->add_option("--go-baseline", o.go_baseline,
                  "prebuilt bench/etcd_baseline binary (default: go build it)");
  cmd->add_option("--json", o.json_path, "JSON result file (\"\" = none)")->capture_default_str();
  return cmd;
}

}  // namespace farmem
