// `farmem bench tiered`: TeRM tiered memory (farmemd --tier-*) against an all-DRAM region and
// cgroup-capped file-mmap baselines (RPC and one-sided), with the machine's fio figure, the
// ablation ladder and a hot-set move. The main thread drives every client; servers are children.
#pragma once

#include <cstdint>
#include <string>

namespace farmem {

struct TieredBenchOptions {
  bool quick = false;
  uint64_t capacity_mib = 0;    // region size; 0 = 1024 (--quick: 256)
  int rounds = 5;               // interleaved rounds per case (>= 5)
  double slice_seconds = 0;     // measured time of one subject in one round; 0 = 1 (--quick: 0.5)
  int inflight = 16;            // operations in flight (coroutines on the one client thread)
  int warmup_periods = 3;       // steady state: periods of the workload before a case is measured
  uint32_t tier_period_ms = 0;  // the tier servers' --tier-period-ms; 0 = farmemd's default
  // The clients' bitmap pulls and counter pushes (TieredClientOptions::period); 0 = the
  // client's default (a quarter of the server's period). An experiment, as tier_period_ms.
  uint32_t client_refresh_ms = 0;
  // The full workload matrix (uniform/Zipf x 64 B/4 KiB/16 KiB x read-only/50 % writes x DRAM
  // 20/50/100 %) besides the targets' cases: 1 on, 0 off, -1 = on unless --quick.
  int matrix = -1;
  std::string dir;  // data files; "" = /tmp, or /var/tmp when /tmp is tmpfs
  std::string json_path = "tiered.json";
};

// Exit code: 0 ran (targets may MISS), 1 failed, 2 bad options.
int RunTieredBench(TieredBenchOptions options);

}  // namespace farmem
