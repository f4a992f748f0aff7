// Allocation traces for `farmem bench objects-memory`: synthetic (N objects of one size, free a
// random fraction) and three Redis-like traces (t1 mixed sizes, t2 LRU cache, t3 large + small).
// Pure and deterministic (seeded), so the parent and every replay child build the same trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "farmem/status.h"

namespace farmem::bench {

// One step of a trace: allocate object `obj` with `size` payload bytes, or free it (size 0).
struct TraceOp {
  uint32_t obj = 0;
  uint32_t size = 0;  // 0 = free
  bool is_free() const { return size == 0; }
};

// A phase runs on `per_thread.size()` threads at once, thread t executing per_thread[t] in order;
// phases are separated by a barrier. An object is always freed by the thread that allocated it.
struct TracePhase {
  std::string name;
  std::vector<std::vector<TraceOp>> per_thread;
  size_t ops() const;
};

enum class TraceKind { kSynthetic, kT1, kT2, kT3 };

// What identifies a trace. Serialised as e.g. "synthetic:size=4096:free=0.9:n=8192:threads=1:
// seed=42" or "t2:threads=4:seed=42" (passed to the replay child on its command line).
struct TraceSpec {
  TraceKind kind = TraceKind::kSynthetic;
  uint32_t size = 64;          // synthetic: object size in bytes
  double free_fraction = 0.5;  // synthetic: fraction of the objects freed
  uint32_t count = 0;          // synthetic: objects allocated (0 = DefaultSyntheticCount(size))
  uint32_t threads = 1;        // threads (and CoRM workers) the phases run on
  uint64_t seed = 42;

  std::string ToString() const;
  static Result<TraceSpec> Parse(const std::string& text);
  // "synthetic 4096 B, 90% freed", "t2 LRU 100 MiB, 4 threads", ...
  std::string Label() const;
};

struct Trace {
  TraceSpec spec;
  uint32_t num_objects = 0;  // object indices are 0..num_objects-1
  std::vector<TracePhase> phases;
};

const char* TraceKindName(TraceKind k);

// Synthetic traces allocate about 16 MiB of payload, at least 8192 objects.
uint32_t DefaultSyntheticCount(uint32_t size);

// Redis-like trace parameters (see bench/README.md for how each trace is generated).
inline constexpr uint32_t kT1Keys = 10000;
inline constexpr uint32_t kT1KeyBytes = 8;
inline constexpr uint32_t kT1MaxValue = 16384;  // values uniform in [1, kT1MaxValue]
inline constexpr uint64_t kT2CacheBytes = uint64_t{100} << 20;
inline constexpr uint32_t kT2FirstCount = 700000;
inline constexpr uint32_t kT2FirstSize = 150;
inline constexpr uint32_t kT2SecondCount = 170000;
inline constexpr uint32_t kT2SecondSize = 300;
inline constexpr uint32_t kT3LargeCount = 5;
inline constexpr uint32_t kT3LargeSize = 160 * 1024;
inline constexpr uint32_t kT3SmallCount = 50000;
inline constexpr uint32_t kT3SmallSize = 150;
inline constexpr uint32_t kT3Removed = 25000;

// Builds the trace; InvalidArgument for a spec out of range (size 0, fraction outside [0, 1],
// threads outside 1..256).
Result<Trace> GenerateTrace(const TraceSpec& spec);

// Sizes of the objects still live after the whole trace (in object order), and whether every op
// is consistent (no double alloc, no free of a dead object). Error on an inconsistent trace.
Result<std::vector<uint32_t>> LiveSizesAfter(const Trace& trace);

// Largest object the trace allocates.
uint32_t MaxObjectSize(const Trace& trace);

}  // namespace farmem::bench
