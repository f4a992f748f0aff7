// Command-line flags of `farmem bench channels` and its hidden child `farmem bench channels-node`
// (header-only so only the farmem binary, which links CLI11, includes it; src/cli/main.cc
// registers both with one call each).
#pragma once

#include <CLI/CLI.hpp>

#include "channels_bench.h"

namespace farmem {

inline CLI::App* AddChannelsBenchCommand(CLI::App& bench, ChannelsBenchOptions& o) {
  CLI::App* cmd = bench.add_subcommand(
      "channels",
      "ticket-lock transfers, a contended lock, barrier and update fences across 3 processes, "
      "vs Open MPI (MPI_Win_lock, MPI_Barrier) on the same wire");
  cmd->add_flag("--quick", o.quick,
                "run under two minutes: 0.5 s runs, 300 barrier episodes, no extra safety runs");
  cmd->add_option("--rounds", o.rounds, "interleaved rounds (farmem, MPI) per workload, >= 5")
      ->capture_default_str()
      ->check(CLI::Range(5, 1000));
  cmd->add_option("--seconds", o.seconds, "measured seconds per transfer/lock run (default 3)")
      ->check(CLI::Range(0.1, 3600.0));
  cmd->add_option("--accounts", o.accounts, "accounts of the transfer transactions")
      ->capture_default_str()
      ->check(CLI::Range(2L, 100000000L));
  cmd->add_option("--locks-per-node", o.locks_per_node,
                  "ticket locks (MPI: windows) per node guarding the accounts")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--episodes", o.episodes, "barrier episodes timed per run (default 2000)")
      ->check(CLI::Range(10L, 10000000L));
  cmd->add_option("--checked-acquisitions", o.checked_acquisitions,
                  "lock acquisitions checked for mutual exclusion; extra 60 s transfer runs until "
                  "reached (default 1e6, --quick: 0)")
      ->check(CLI::Range(0L, 1000000000L));
  cmd->add_option("--safety-cap-seconds", o.safety_cap_seconds,
                  "time limit of the extra transfer runs")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--safety-accounts", o.safety_accounts,
                  "accounts of the extra transfer runs (few, so a broken lock shows)")
      ->capture_default_str()
      ->check(CLI::Range(2L, 100000000L));
  cmd->add_option("--nic-spin-us", o.nic_spin_us,
                  "participants' transport spin_before_sleep in us (-1 = auto: 0 with fewer than "
                  "2 CPUs per participant, else the default)")
      ->check(CLI::Range(-1, 100000));
  cmd->add_option("--backend", o.backend, "tcp | fabric:shm (MPI: btl tcp on lo | btl vader)")
      ->capture_default_str()
      ->check(CLI::IsMember({"tcp", "fabric:shm"}));
  cmd->add_option("--mpirun", o.mpirun, "Open MPI's mpirun")->capture_default_str();
  cmd->add_option("--mpi-program", o.mpi_program,
                  "farmem_mpi_channels binary (default: next to farmem)");
  cmd->add_option("--json", o.json_path, "JSON result file (\"\" = none)")->capture_default_str();
  cmd->add_option("--netns", o.netns,
                  "NAME=IP,NAME=IP,NAME=IP: one participant (and MPI rank) per network namespace, "
                  "Redis/memcached in the first (scripts/bench_channels_netns; needs root, tcp)")
      ->delimiter(',');
  return cmd;
}

inline CLI::App* AddChannelsNodeCommand(CLI::App& bench, ChannelsNodeOptions& o) {
  CLI::App* cmd = bench.add_subcommand("channels-node", "");
  cmd->group("");  // hidden: started by `farmem bench channels`
  cmd->add_option("--id", o.id)->required()->check(CLI::Range(1u, 64u));
  cmd->add_option("--peers", o.peers)->required()->delimiter(',');
  cmd->add_option("--backend", o.backend);
  cmd->add_option("--workload", o.workload)
      ->required()
      ->check(CLI::IsMember(
          {"transfer", "lock", "barrier", "fence", "kvget", "kvwrite", "kvlin", "kill"}));
  cmd->add_option("--seconds", o.seconds)->check(CLI::Range(0.01, 3600.0));
  cmd->add_option("--accounts", o.accounts)->check(CLI::Range(2L, 100000000L));
  cmd->add_option("--locks-per-node", o.locks_per_node)->check(CLI::Range(1, 4096));
  cmd->add_option("--episodes", o.episodes)->check(CLI::Range(1L, 10000000L));
  cmd->add_option("--rounds", o.rounds)->check(CLI::Range(1, 1000));
  cmd->add_option("--ops", o.ops)->check(CLI::Range(1L, 1000000L));
  cmd->add_option("--history", o.history);
  cmd->add_option("--kill-marker", o.kill_marker);
  cmd->add_option("--nic-spin-us", o.nic_spin_us)->check(CLI::Range(-1, 100000));
  return cmd;
}

}  // namespace farmem
