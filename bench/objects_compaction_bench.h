// `farmem bench objects-compaction`: read throughput per 100 ms while farmemd compacts a heap
// whose objects were 75 % freed, for both pointer-correction strategies (scan, ask the owner);
// reports the dip during compaction and the recovery after it.
#pragma once

#include <cstdint>
#include <string>

namespace farmem {

struct ObjectsCompactionOptions {
  std::string backend = "tcp";  // "tcp" | "fabric:<provider>"
  uint64_t objects = 0;         // 0 = 1 M (100 k with --quick)
  size_t size = 32;
  double free_fraction = 0.75;  // objects freed (at random, fixed seed) before the reader starts
  double seconds = 0;           // whole timeline; 0 = 30 s (8 s with --quick)
  double compact_at = 0;        // when compaction is triggered; 0 = 5 s (2 s with --quick)
  int inflight = 8;             // reads the reader thread keeps in flight
  int bucket_ms = 100;
  // The server's compaction pace (objects.compaction.max_merges_per_second; 0 = unpaced).
  uint32_t merges_per_second = 500;
  // Pin the server process to the last CPU and this (client) process to the others, so the
  // scheduler cannot move the busy-polling threads between runs (2-CPU machines flip between
  // two throughput levels ~30 % apart otherwise). Ignored on a single CPU.
  bool pin = true;
  bool quick = false;
  std::string json_path = "objects_compaction.json";
};

// Runs both strategies, prints the timeline summaries and targets, writes JSON. Exit code: 0 ran
// (targets may MISS), 1 failed, 2 bad options.
int RunObjectsCompactionBench(ObjectsCompactionOptions options);

}  // namespace farmem
