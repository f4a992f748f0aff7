// Pieces shared by `farmem bench objects-throughput` and `farmem bench objects-compaction`: the
// farmemd target process with objects enabled, the client node, the load phase (N objects whose
// bytes name their index), a start barrier for client threads, machine info, and the pure
// time-bucket arithmetic of the compaction benchmark (unit-tested in cli_tests).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/node.h"
#include "farmem/objects.h"
#include "farmem/status.h"
#include "farmem/transport.h"
#include "target_process.h"

namespace farmem::bench {

using ObjClock = std::chrono::steady_clock;

// Operations in flight while the load phase creates or frees the objects.
inline constexpr int kLoadInflight = 64;

// How long a farmemd target may take to start and report its bootstrap address.
inline constexpr std::chrono::milliseconds kObjectsServerStartTimeout{30000};

// "tcp" or "fabric:<provider>" -> backend + provider. Anything else is InvalidArgument.
Status ParseObjectsBackend(const std::string& spec, std::string* backend, std::string* provider);

// What the farmemd target runs with.
struct ObjectsServerSetup {
  std::string backend = "tcp";
  std::string provider = "shm";
  std::string token = "farmem-bench";
  uint64_t memory_bytes = 256ull << 20;  // whole budget; the object reservation uses all of it
  int workers = 2;                       // RPC workers = store workers
  std::string correction = "owner";      // RPC-path pointer correction: "owner" | "scan"
  // The compaction leader thread compacts on its own when a class's fragmentation passes the
  // threshold. The benchmarks trigger compaction themselves, so they turn it off.
  bool background_compaction = false;
  uint32_t max_merges_per_round = 1u << 20;
  uint32_t max_merges_per_second = 0;  // compaction pace (0 = unpaced)
  int cpu = -1;                        // >= 0: the server process runs on this CPU only
  // true: the NIC/progress thread busy-polls for the whole run (a tuned configuration); false:
  // the transport's default (spin 200 us after the last work, then block on epoll).
  bool busy_poll = true;
  // Block geometry (--objects-max-block-size, --objects-min-slots-per-block): 0 / 16 are
  // farmemd's defaults; anything else is a tuned configuration.
  uint32_t max_block_size = 0;
  uint32_t min_slots_per_block = 16;
};

// The setup of a farmemd a user starts with no flags (ServeOptions defaults: 1 RPC worker, store
// workers = RPC workers, background compaction every 100 ms at 64 merges/round and 500 merges/s,
// the transport's default spin), on `backend`/`provider` and with room for `memory_bytes`.
ObjectsServerSetup DefaultFarmemdSetup(uint64_t memory_bytes);
// One line saying what that configuration is, for the benchmark's output and JSON.
std::string DescribeServerSetup(const ObjectsServerSetup& setup);

// Memory budget for `objects` objects of `size` bytes: generous, so the store never runs out
// (slots are at most ~1.5x payload + header for small objects) and a multiple of 16 MiB pools.
uint64_t ObjectsServerMemory(uint64_t objects, size_t size);

// Child role: a MemoryServer (the farmemd library) with objects enabled, whose transport busy-
// polls like `farmem bench raw`'s targets. Reports its bootstrap "host:port"; serves until stop.
TargetRole ObjectsServerRole(ObjectsServerSetup setup);

// A started client node on loopback with the server's backend and token. Its transport keeps the
// default spin (FARMEM_BENCH_INITIATOR_SPIN_US overrides it): client threads poll their own
// contexts, so a busy-polling progress thread would only take a core from them.
Result<std::unique_ptr<Node>> MakeObjectsClientNode(const ObjectsServerSetup& setup,
                                                    const std::string& name);

// The object bytes of object `index`: its index (8 bytes, little endian) then a pattern. Readers
// check the first 8 bytes, so a read that returned another object's bytes fails the case.
void FillObjectValue(uint64_t index, std::span<std::byte> out);
// The client-side counters of an ObjectClient as the benchmarks' JSON reports them.
nlohmann::json ObjectClientStatsJson(const ObjectClientStats& s);
inline bool ValueMatches(uint64_t index, std::span<const std::byte> got) {
  if (got.size() < sizeof(uint64_t)) return false;
  uint64_t v;
  std::memcpy(&v, got.data(), sizeof(v));
  return v == index;
}

// Allocates and writes `count` objects of `size` bytes with `inflight` coroutines on one
// scheduler, printing progress every 10 %. Returns their pointers, indexed like the values.
Result<std::vector<Ptr>> LoadObjects(ObjectClient& client, Scheduler& sched, uint64_t count,
                                     size_t size, int inflight, const std::string& label);

// Frees the objects at `indices` (pointers in `ptrs` are invalidated) with `inflight` coroutines.
Status FreeObjects(ObjectClient& client, Scheduler& sched, std::vector<Ptr>& ptrs,
                   std::span<const uint64_t> indices, int inflight);

// Drives `sched` until all its tasks finished or `timeout` passed: Scheduler::run, i.e. the
// library's own waiting (spin briefly, then block on the transport until a completion may be
// there). The benchmark has no idle policy of its own.
Status DriveScheduler(Scheduler& sched, std::chrono::milliseconds timeout);

// Start barrier for client threads: each thread calls Arrive() after its set-up and waits in
// WaitForGo(); the main thread waits for everyone (with a deadline), then releases them at once.
class StartGate {
 public:
  void Arrive() { ready_.fetch_add(1, std::memory_order_acq_rel); }
  // Returns false if `timeout` passed before `n` threads arrived.
  bool WaitForArrivals(int n, std::chrono::milliseconds timeout) const;
  void Go() { go_.store(true, std::memory_order_release); }
  // Spins (with yield) until Go() or Abort(); returns false on abort.
  bool WaitForGo() const;
  void Abort() { abort_.store(true, std::memory_order_release); }

 private:
  std::atomic<int> ready_{0};
  std::atomic<bool> go_{false}, abort_{false};
};

// The measurement window of timed client threads: operations completing in [warm_end, end) count.
struct TimedWindow {
  ObjClock::time_point warm_end, end;
};
// Runs `clients` threads of `body(t, ready)`: the body sets itself up (its connection), then calls
// ready(), which waits until every thread is set up and returns the common window (nullopt if
// the start was aborted: return at once), and returns the operations it counted in the window.
// Warm-up `warmup_s`, then `seconds` measured. The first error of any thread is the result.
using TimedClientBody = std::function<Result<uint64_t>(
    int t, const std::function<std::optional<TimedWindow>()>& ready)>;
Result<uint64_t> RunTimedClients(int clients, double warmup_s, double seconds,
                                 const TimedClientBody& body);

// Quiet logging (warnings and errors) unless FARMEM_LOG asks for more: the server and client
// nodes log every connection at info level, which would bury the benchmark's own lines.
void QuietBenchLogging();

// ---- Compaction-under-load timeline (pure) --------------------------------------------------

// Completed reads per fixed time bucket, and when compaction ran (ms since the reader started).
// Bucket b covers [b * bucket_ms, (b + 1) * bucket_ms).
//   before = buckets b >= skip_buckets that end at or before compaction start
//   during = buckets that overlap [start, end] (at least the bucket holding the start)
//   after  = buckets that begin at or after compaction end
// dip = 1 - min(during) / mean(before); recovery = mean(after) / mean(before). A figure that
// lacks its buckets (or a zero baseline) is NaN and `missing` says why.
// Also, because moved pointers are corrected lazily (the first read of each moved object after
// compaction pays for the correction), where the rate ends up: recovery_tail = mean of the last
// quarter of the after buckets (at least one) / mean(before), and recovered_after_ms = from
// compaction end to the start of the first after bucket at >= 95 % of mean(before) (-1: none).
struct TimelineSummary {
  size_t before_buckets = 0, during_buckets = 0, after_buckets = 0;
  double before_mean = 0, during_min = 0, during_mean = 0, after_mean = 0;
  // dip = 1 - during_mean / before_mean (the target); worst_bucket_dip = 1 - during_min /
  // before_mean (information: on a 2-CPU machine single buckets swing by 30 % with no
  // compaction at all, so the minimum of a seconds-long paced compaction measures that noise).
  double dip = 0, worst_bucket_dip = 0, recovery = 0;
  double tail_mean = 0, recovery_tail = 0;
  int64_t recovered_after_ms = -1;
  std::string missing;
};
TimelineSummary SummarizeTimeline(std::span<const uint64_t> counts, int64_t bucket_ms,
                                  int64_t compact_start_ms, int64_t compact_end_ms,
                                  size_t skip_buckets);

}  // namespace farmem::bench
