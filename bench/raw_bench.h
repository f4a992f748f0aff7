// Raw transport benchmark (`farmem bench raw`): latency/throughput of one-sided ops and RPC per
// backend, reported as ratios to two baselines measured in the same run (busy-polled TCP echo,
// process_vm_readv).
#pragma once

#include <string>
#include <vector>

namespace farmem {

struct RawBenchOptions {
  // Backend specs as accepted by farmem::CreateTransport ("tcp", "fabric:<provider>").
  std::vector<std::string> backends{"tcp", "fabric:shm", "fabric:tcp;ofi_rxm"};
  // Measurement time per case, split over `rounds` rounds (each after a short warm-up). Every
  // round runs every case once, so subjects and baselines alternate; targets are judged on the
  // median of the per-round ratios.
  double seconds = 1.0;
  int rounds = 5;
  // --quick: 0.5 s per case (the whole run in about 40 s).
  bool quick = false;
  // Operations kept in flight per case; 1 measures latency, deeper queues measure throughput.
  std::vector<int> inflight{1, 16};
  // Where the JSON result file is written ("" = do not write one).
  std::string json_path = "raw_bench.json";
};

// Runs every case, prints results with ratios and target pass/miss, writes JSON. Returns a process
// exit code (0 = ran; unavailable backends are reported, not failures).
int RunRawBench(const RawBenchOptions& options);

}  // namespace farmem
