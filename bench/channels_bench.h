// `farmem bench channels`: the channels (ticket locks, barrier, owned/atomic vars, fences) across
// 3 participant processes on this machine, each judged against Open MPI 4.1 on the same wire in
// the same run (farmem_mpi_channels under mpirun), and the hidden per-participant child.
#pragma once

#include <string>
#include <vector>

namespace farmem {

struct ChannelsBenchOptions {
  bool quick = false;
  int rounds = 5;      // interleaved rounds (farmem, MPI, ...) per workload, >= 5
  double seconds = 0;  // measured time of each transfer/lock run; 0 = 3 (--quick: 1)
  long accounts = 1000000;
  int locks_per_node = 341;  // ticket locks (MPI: windows) per node for the transfers
  long episodes = 0;         // barrier episodes timed per run; 0 = 2000 (--quick: 500)
  // Lock acquisitions to check for mutual exclusion: 60 s transfer runs are added after the
  // rounds until reached (or safety_cap_seconds); -1 = 1e6 (--quick: 0, the rounds only).
  long checked_acquisitions = -1;
  double safety_cap_seconds = 900;
  // Accounts of those extra runs: few, so that concurrent transfers often share an account and
  // a broken lock loses updates visibly (with 1 M accounts two transfers almost never meet).
  long safety_accounts = 3000;
  std::string backend = "tcp";             // tcp | fabric:shm (MPI: btl tcp over lo | btl vader)
  std::string mpirun = "/usr/bin/mpirun";  // a path (exec does not search PATH)
  // farmem_mpi_channels; "" = next to the farmem binary.
  std::string mpi_program;
  std::string json_path = "channels.json";
  // One participant per network namespace: "NAME=IPV4" of participants 1..3 (the namespaces of
  // scripts/netns_cluster, made by scripts/bench_channels_netns). MPI ranks run one per
  // namespace too; Redis and memcached run in the first, their clients in the second and third.
  // Empty: everything on this machine's loopback.
  std::vector<std::string> netns;
  // The participants' transport spin_before_sleep (µs the NIC thread polls after its last work
  // before it blocks). -1 = auto: 0 when this machine has fewer than 2 CPUs per participant (a
  // NIC thread spinning there takes the CPU the callers and the other NIC threads need; measured
  // in bench/README.md), else the transport's default.
  int nic_spin_us = -1;
};

// Kvstore gets (and the raw reads, Redis GETs, memcached mg) in flight at once per participant.
inline constexpr int kKvGetInFlight = 16;

// One participant of a farmem run (started by the benchmark; prints one JSON line on stdout).
struct ChannelsNodeOptions {
  unsigned id = 0;                 // 1-based participant number
  std::vector<std::string> peers;  // bootstrap host:port of participants 1..n, in order
  // Lock acquisitions to check for mutual exclusion: 60 s transfer runs are added after the
  // rounds until reached (or safety_cap_seconds); -1 = 1e6 (--quick: 0, the rounds only).
  long checked_acquisitions = -1;
  double safety_cap_seconds = 900;
  // Accounts of those extra runs: few, so that concurrent transfers often share an account and
  // a broken lock loses updates visibly (with 1 M accounts two transfers almost never meet).
  long safety_accounts = 3000;
  std::string backend = "tcp";
  std::string workload;  // transfer | lock | barrier | fence | kvget | kvwrite | kvlin | kill
  double seconds = 1;
  long accounts = 1000000;
  int locks_per_node = 341;
  long episodes = 500;
  int rounds = 5;           // fence: fenced/unfenced block pairs
  long ops = 300;           // kvlin: operations per client thread
  std::string history;      // kvlin: the history file written (tests/porcupine format)
  std::string kill_marker;  // kill: survivors run their checks once this file exists
  int nic_spin_us = -1;     // the transport's spin_before_sleep; -1 = its default
};

// Exit code: 0 ran (targets may MISS), 1 failed, 2 bad options.
int RunChannelsBench(ChannelsBenchOptions options);
int RunChannelsNode(const ChannelsNodeOptions& options);

}  // namespace farmem
