// Command-line flags of `farmem bench soak` and its hidden child `farmem bench soak-child`
// (header-only so only the farmem binary, which links CLI11, includes it; src/cli/main.cc
// registers both with one call each).
#pragma once

#include <CLI/CLI.hpp>

#include "soak_bench.h"

namespace farmem {

inline CLI::App* AddSoakBenchCommand(CLI::App& bench, SoakBenchOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "soak",
      "legitimate object/raw clients with and without hostile ones (slow readers, floods, "
      "garbage, killed clients): throughput ratio, peak RSS, leaks, wrong results");
  cmd->add_option("--minutes", o.minutes, "whole run in minutes")
      ->capture_default_str()
      ->check(CLI::Range(0.5, 24.0 * 60));
  cmd->add_flag("--quick", o.quick, "run under two minutes: 5 rounds of ~6.7 s + 6.7 s");
  cmd->add_option("--rounds", o.rounds,
                  "baseline/hostile round pairs, >= 5 (default: minutes rounded, 5..30)")
      ->check(CLI::Range(5, 1000));
  cmd->add_option("--objects", o.objects, "objects the legitimate client keeps")
      ->capture_default_str()
      ->check(CLI::Range(8, 1000000));
  cmd->add_option("--raw-ranges", o.raw_ranges, "raw ranges the legitimate client keeps")
      ->capture_default_str()
      ->check(CLI::Range(8, 100000));
  cmd->add_option("--inflight", o.inflight, "coroutines per legitimate client thread")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--slow-readers", o.slow_readers, "hostile: authenticated peers never reading")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  cmd->add_option("--flood-connections", o.flood_connections,
                  "hostile: unauthenticated connections held per port")
      ->capture_default_str()
      ->check(CLI::Range(0, 5000));
  cmd->add_option("--garbage-per-second", o.garbage_per_second,
                  "hostile: connections sending malformed frames per second")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--killed-clients", o.killed_clients,
                  "hostile: client processes alive at once, each SIGKILLed mid-operation")
      ->capture_default_str()
      ->check(CLI::Range(0, 16));
  cmd->add_option("--hostile-nice", o.hostile_nice,
                  "hostile: nice value of the generator thread and killed clients (0 = none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 19));
  cmd->add_option("--child-ops-per-second", o.child_ops_per_second,
                  "hostile: loop iterations per second of each killed client (0 = unpaced)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--farmemd", o.farmemd, "farmemd binary (default: next to farmem, else PATH)");
  cmd->add_option("--json", o.json_path, "JSON result file (\"\" = none)")->capture_default_str();
  return cmd;
}

inline CLI::App* AddSoakChildCommand(CLI::App& bench, SoakChildOptions& o) {
  CLI::App* cmd = bench.add_subcommand("soak-child", "");
  cmd->group("");  // hidden: started and killed by `farmem bench soak`
  cmd->add_option("--connect", o.connect)->required();
  cmd->add_option("--token", o.token);
  cmd->add_option("--seed", o.seed);
  cmd->add_option("--max-seconds", o.max_seconds);
  cmd->add_option("--ops-per-second", o.ops_per_second)->check(CLI::Range(0.0, 1e6));
  return cmd;
}

}  // namespace farmem
