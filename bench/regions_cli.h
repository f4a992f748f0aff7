// Command-line flags of `farmem bench regions` (header-only so only the farmem binary, which links
// CLI11, includes it; src/cli/main.cc registers it with one call).
#pragma once

#include <CLI/CLI.hpp>

#include "regions_bench.h"

namespace farmem {

inline CLI::App* AddRegionsBenchCommand(CLI::App& bench, RegionsBenchOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "regions",
      "remote regions (farmem mount) vs tmpfs: sysbench fileio 16 KiB reads, fio 1 MiB writes "
      "with end_fsync, cp -a of small files; rmmap cold faults vs a one-sided read, "
      "rmarkdirty(zero) writes vs read faults, rmalloc(64) vs creating a file in the mount");
  cmd->add_flag("--quick", o.quick,
                "under two minutes: 64 MiB files (not 2 GiB), 2 s sysbench runs, 1000 files");
  cmd->add_option("--rounds", o.rounds, "interleaved rounds (farmem, tmpfs, ...), >= 5")
      ->capture_default_str()
      ->check(CLI::Range(5, 100));
  cmd->add_option("--read-mib", o.read_file_mib, "sysbench file size (default 2048, --quick 64)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--read-seconds", o.read_seconds, "sysbench --time (default 10, --quick 2)")
      ->check(CLI::Range(0.5, 3600.0));
  cmd->add_option("--write-mib", o.write_file_mib, "fio write size (default 2048, --quick 64)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--files", o.small_files, "files in the cp -a tree (default 5000, --quick 1000)")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--fault-pages", o.fault_pages,
                  "cold pages timed per rmmap round (default 2048, --quick 256)")
      ->check(CLI::Range(1, 1 << 18));
  cmd->add_option("--rmalloc-calls", o.rmalloc_calls,
                  "rmalloc(64) calls timed per round (default 10000, --quick 2000)")
      ->check(CLI::Range(1, 10000));
  cmd->add_option("--creates", o.creates,
                  "files created in the mount per round (default 1000, --quick 200)")
      ->check(CLI::Range(1, 1000000));
  cmd->add_option("--json", o.json_path, "JSON result file (\"\" = none)")->capture_default_str();
  return cmd;
}

}  // namespace farmem
