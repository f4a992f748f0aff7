// `farmem bench regions`: remote regions (a `farmem mount` FUSE file system, embedded farmemd)
// against tmpfs, measured with sysbench fileio, fio and cp -a in interleaved rounds, and rmmap
// faults and rmalloc(64) against a one-sided read and a file create (issue 14).
// Also the pure parsers of the tools' output (tested in src/cli). Main thread only.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace farmem {

struct RegionsBenchOptions {
  bool quick = false;
  int rounds = 5;           // interleaved rounds (farmem, tmpfs, farmem, ...), at least 5
  int read_file_mib = 0;    // sysbench fileio file size; 0 = 2048 (--quick: 64)
  double read_seconds = 0;  // sysbench --time per run; 0 = 10 (--quick: 2)
  int write_file_mib = 0;   // fio sequential write size; 0 = 2048 (--quick: 64)
  int small_files = 0;      // files of the cp -a tree; 0 = 5000 (--quick: 1000)
  int fault_pages = 0;      // cold pages timed per rmmap round; 0 = 2048 (--quick: 256)
  int rmalloc_calls = 0;    // rmalloc(64) calls timed per round; 0 = 10000 (--quick: 2000)
  int creates = 0;          // files created in the mount per round; 0 = 1000 (--quick: 200)
  std::string json_path = "regions.json";
};

// Exit code: 0 ran (targets may MISS), 1 failed (or a tool / FUSE is missing), 2 bad options.
int RunRegionsBench(RegionsBenchOptions options);

// "read, MiB/s: 1234.56" of `sysbench fileio run` output; nullopt when absent or malformed.
std::optional<double> ParseSysbenchReadMiBps(std::string_view sysbench_output);

// jobs[0].write.bw_bytes of `fio --output-format=json` (bytes/s over the job's run time, which
// includes end_fsync); nullopt when the text is not fio JSON with that field.
std::optional<double> ParseFioWriteBytesPerSec(std::string_view fio_json);

}  // namespace farmem
