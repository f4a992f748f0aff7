// Command-line flags of `farmem bench objects-memory` (header-only so only the farmem binary,
// which links CLI11, includes it; src/cli/main.cc registers the subcommand with one call).
#pragma once

#include <CLI/CLI.hpp>

#include "objects_memory_bench.h"

namespace farmem {

inline CLI::App* AddObjectsMemoryBenchCommand(CLI::App& bench, ObjectsMemoryBenchOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "objects-memory",
      "CoRM active memory (CoRM-0/8/12/16, hybrid, ideal) vs glibc/jemalloc on synthetic and "
      "Redis-like traces");
  cmd->add_option("--json", o.json_path, "JSON result file (\"\" = none)")->capture_default_str();
  cmd->add_flag(
      "--quick", o.quick,
      "~20 s subset: sizes 256/4096, fractions 0.5/0.9, traces synthetic+t3, threads 1/4");
  cmd->add_option("--sizes", o.sizes,
                  "synthetic object sizes in bytes (default 64 256 1024 2048 4096)")
      ->delimiter(',')
      ->check(CLI::Range(1u, 1u << 20));
  cmd->add_option("--fractions", o.fractions, "synthetic freed fractions (default 0.5 .. 0.9)")
      ->delimiter(',')
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--traces", o.traces, "synthetic, t1, t2, t3 (default all)")
      ->delimiter(',')
      ->check(CLI::IsMember({"synthetic", "t1", "t2", "t3"}));
  cmd->add_option("--threads", o.threads, "threads for t1..t3 (default 1 4 16 32)")
      ->delimiter(',')
      ->check(CLI::Range(1u, 256u));
  cmd->add_option("--objects", o.objects, "synthetic object count (default ~16 MiB, >= 8192)");
  cmd->add_option("--block-size", o.geometry.base_block_size,
                  "CoRM base block (farmemd --objects-block-size)")
      ->capture_default_str();
  cmd->add_option("--max-block-size", o.geometry.max_block_size,
                  "CoRM largest multi-slot block (farmemd --objects-max-block-size)")
      ->capture_default_str();
  cmd->add_option("--min-slots-per-block", o.geometry.min_slots_per_block,
                  "slots a class's block should hold (farmemd --objects-min-slots-per-block)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "trace seed")->capture_default_str();
  cmd->add_option("--jobs", o.jobs, "child processes at once (figures do not depend on it)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 64u));
  cmd->add_option("--timeout", o.timeout_seconds, "seconds per child run")->capture_default_str();
  cmd->add_option("--replay-bin", o.replay_bin,
                  "farmem_alloc_replay path (default: next to this executable)");
  cmd->add_option("--jemalloc", o.jemalloc, "libjemalloc.so.2 path (default: search)");
  return cmd;
}

}  // namespace farmem
