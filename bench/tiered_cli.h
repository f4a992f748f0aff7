// Command-line flags of `farmem bench tiered` (header-only so only the farmem binary, which links
// CLI11, includes it; src/cli/main.cc registers it with one call).
#pragma once

#include <CLI/CLI.hpp>

#include "tiered_bench.h"

namespace farmem {

inline CLI::App* AddTieredBenchCommand(CLI::App& bench, TieredBenchOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "tiered",
      "tiered memory (farmemd --tier-*) vs all-DRAM and cgroup-capped file mmap (RPC and "
      "one-sided): hit ratio, throughput ratios, ablation ladder, hot-set move");
  cmd->add_flag("--quick", o.quick,
                "under two minutes: 256 MiB region, 0.5 s slices, only the targets' cases");
  cmd->add_option("--capacity-mib", o.capacity_mib,
                  "tiered region size in MiB (default 1024, --quick 256)")
      ->check(CLI::Range(16, 1 << 20));
  cmd->add_option("--rounds", o.rounds, "interleaved rounds per case")
      ->capture_default_str()
      ->check(CLI::Range(5, 1000));
  cmd->add_option("--slice-seconds", o.slice_seconds,
                  "measured seconds of one subject per round (default 1, --quick 0.5)")
      ->check(CLI::Range(0.05, 60.0));
  cmd->add_option("--inflight", o.inflight, "operations in flight on the client thread")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  cmd->add_option("--warmup-periods", o.warmup_periods,
                  "tier periods of the workload before a case is measured")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  cmd->add_option("--tier-period-ms", o.tier_period_ms,
                  "the tier servers' hotspot period (default: farmemd's, 1000 ms); an experiment: "
                  "the targets assume the default")
      ->check(CLI::Range(10, 600000));
  cmd->add_option("--client-refresh-ms", o.client_refresh_ms,
                  "the clients' bitmap pulls and counter pushes (default: the client's, a quarter "
                  "of the server's period); an experiment")
      ->check(CLI::Range(1, 600000));
  cmd->add_option("--matrix", o.matrix,
                  "1: also run the whole workload matrix, 0: only the targets' cases "
                  "(default 1, --quick 0)")
      ->check(CLI::Range(0, 1));
  cmd->add_option("--dir", o.dir, "directory for the data files (a real disk, not tmpfs)");
  cmd->add_option("--json", o.json_path, "JSON result file (\"\" = none)")->capture_default_str();
  return cmd;
}

}  // namespace farmem
