// CLI11 wiring of `farmem bench objects-throughput` and `farmem bench objects-compaction`, kept
// here so src/cli/main.cc only adds a line per command (header-only: CLI11 is used by main.cc).
#pragma once

#include <CLI/CLI.hpp>

#include "objects_compaction_bench.h"
#include "objects_throughput_bench.h"

namespace farmem {

inline CLI::App* AddObjectsThroughputBenchCommand(CLI::App& bench, ObjectsThroughputOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "objects-throughput",
      "32 B object reads: direct_read vs RPC read vs raw transport read, uniform/Zipf, 1-8 "
      "clients, and Redis GETs in the same run");
  cmd->add_option("--backend", o.backend, "tcp | fabric:<provider>")->capture_default_str();
  cmd->add_option("--objects", o.objects, "objects loaded (default 1000000; --quick: 100000)")
      ->check(CLI::Range(uint64_t{2}, uint64_t{64} << 20));
  cmd->add_option("--size", o.size, "object / value size in bytes")
      ->capture_default_str()
      ->check(CLI::Range(8, 4000));
  cmd->add_option("--clients", o.clients,
                  "client thread counts, repeatable or comma separated (default 1,2,4,8)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  cmd->add_option("--inflight", o.inflight, "reads in flight per client thread (K)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--seconds", o.seconds, "measured time per case (default 1; --quick: 0.5)")
      ->check(CLI::Range(0.01, 600.0));
  cmd->add_option("--rounds", o.rounds,
                  "rounds (every case runs once per round, in turn; medians count; >= 5 advised)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->add_flag("--quick", o.quick, "smaller, shorter run (about 1 min)");
  cmd->add_flag("!--no-redis", o.redis, "skip the Redis baseline");
  cmd->add_option("--ops", o.ops,
                  "read paths, comma separated: raw_read, direct_read, read, scan_read (default "
                  "the first three; targets need the ones they compare)")
      ->delimiter(',')
      ->check(CLI::IsMember({"raw_read", "direct_read", "read", "scan_read"}));
  cmd->add_option("--server-max-block-size", o.server_max_block_size,
                  "farmemd --objects-max-block-size (0 = its default; else a tuned run)")
      ->capture_default_str();
  cmd->add_option("--server-min-slots-per-block", o.server_min_slots_per_block,
                  "farmemd --objects-min-slots-per-block (16 = its default)")
      ->capture_default_str();
  cmd->add_option("--json", o.json_path, "JSON result file (\"\" = none)")->capture_default_str();
  return cmd;
}

inline CLI::App* AddObjectsCompactionBenchCommand(CLI::App& bench, ObjectsCompactionOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "objects-compaction",
      "read throughput per 100 ms while a 75 %-freed heap is compacted, scan and ask-owner "
      "correction");
  cmd->add_option("--backend", o.backend, "tcp | fabric:<provider>")->capture_default_str();
  cmd->add_option("--objects", o.objects, "objects loaded (default 1000000; --quick: 100000)")
      ->check(CLI::Range(uint64_t{100}, uint64_t{64} << 20));
  cmd->add_option("--size", o.size, "object size in bytes")
      ->capture_default_str()
      ->check(CLI::Range(8, 4000));
  cmd->add_option("--free-fraction", o.free_fraction, "fraction of objects freed at random")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.99));
  cmd->add_option("--seconds", o.seconds, "timeline length per strategy (default 30; --quick: 8)")
      ->check(CLI::Range(0.1, 600.0));
  cmd->add_option("--compact-at", o.compact_at,
                  "seconds into the timeline when compaction starts (default 5; --quick: 2)")
      ->check(CLI::Range(0.01, 600.0));
  cmd->add_option("--inflight", o.inflight, "reads the reader thread keeps in flight")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--bucket-ms", o.bucket_ms, "timeline bucket")
      ->capture_default_str()
      ->check(CLI::Range(10, 10000));
  cmd->add_option("--merges-per-second", o.merges_per_second,
                  "the server's compaction pace (0 = unpaced)")
      ->capture_default_str();
  cmd->add_flag("--pin,!--no-pin", o.pin,
                "server process on the last CPU, reader on the others (default on)");
  cmd->add_flag("--quick", o.quick, "smaller, shorter run (about 20 s)");
  cmd->add_option("--json", o.json_path, "JSON result file (\"\" = none)")->capture_default_str();
  return cmd;
}

}  // namespace farmem
