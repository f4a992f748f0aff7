// Shared pieces of the object throughput and compaction benchmarks: farmemd target role, client
// node, load/free phases, start gate, machine info and the timeline summary (see the header).
#include "objects_throughput_internal.h"

#include "machine_info.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <limits>
#include <thread>

#include <fmt/format.h>

#include "common/log.h"
#include "farmem/server.h"
#include "server/serve.h"

namespace farmem::bench {

Status ParseObjectsBackend(const std::string& spec, std::string* backend, std::string* provider) {
  if (spec == "tcp") {
    *backend = "tcp";
    return Status::OK();
  }
  if (spec.rfind("fabric:", 0) == 0 && spec.size() > 7) {
    *backend = "fabric";
    *provider = spec.substr(7);
    return Status::OK();
  }
  return Status::InvalidArgument("unknown backend '" + spec +
                                 "' (expected 'tcp' or 'fabric:<provider>', e.g. fabric:shm)");
}

uint64_t ObjectsServerMemory(uint64_t objects, size_t size) {
  // Slot <= payload + 8 (header) + a version byte per 64 B + tail, rounded to the class: 2x + 64
  // covers it with room for partly filled blocks; at least 256 MiB, in 16 MiB steps.
  constexpr uint64_t kStep = 16ull << 20;
  const uint64_t need = objects * (2 * static_cast<uint64_t>(size) + 64);
  const uint64_t bytes = std::max<uint64_t>(256ull << 20, need);
  return (bytes + kStep - 1) / kStep * kStep;
}

TargetRole ObjectsServerRole(ObjectsServerSetup setup) {
  return [setup](int report_fd, int control_fd) {
    auto fail = [&](const Status& st) { (void)WriteMessage(report_fd, false, st.ToString()); };
    QuietBenchLogging();
    if (setup.cpu >= 0) {
      // Before the server starts its threads, so every one of them inherits the mask.
      if (Status st = PinToCpus({setup.cpu}); !st.ok()) return fail(st);
    }
    ServerConfig config;
    config.node.name = "farmemd-bench";
    config.node.bootstrap_host = "127.0.0.1";
    config.node.bootstrap_port = 0;
    config.node.rpc_workers = setup.workers;
    config.node.transport.backend = setup.backend;
    config.node.transport.provider = setup.provider;
    config.node.transport.listen_host = "127.0.0.1";
    config.node.transport.cluster_token = setup.token;
    // Tuned: busy-poll for the whole run so no request pays a wake-up of the NIC thread.
    if (setup.busy_poll) config.node.transport.spin_before_sleep = std::chrono::seconds(3600);
    config.objects.enabled = true;
    config.objects.workers = static_cast<uint32_t>(setup.workers);
    config.objects.reserve_bytes = setup.memory_bytes;
    config.objects.max_physical_bytes = setup.memory_bytes;
    config.objects.correction =
        setup.correction == "scan" ? Correction::kScan : Correction::kAskOwner;
    config.objects.max_block_size = setup.max_block_size;
    config.objects.min_slots_per_block = setup.min_slots_per_block;
    config.objects.compaction.interval_ms = setup.background_compaction ? 100 : 0;
    config.objects.compaction.max_merges_per_round = setup.max_merges_per_round;
    config.objects.compaction.max_merges_per_second = setup.max_merges_per_second;
    auto server = MemoryServer::Create(config);
    if (!server.ok()) return fail(server.status().WithContext("creating the memory server"));
    if (Status st = (*server)->start(); !st.ok())
      return fail(st.WithContext("starting the memory server"));
    if (WriteMessage(report_fd, true, (*server)->node().bootstrap_address()).ok())
      WaitForStop(control_fd, std::chrono::hours(2));
    (*server)->stop();
  };
}

namespace {
// The benchmark names correction modes as farmemd's --objects-correction does.
std::string DefaultCorrectionName() {
  return ServerConfig().objects.correction == Correction::kScan ? "scan" : "owner";
}
}  // namespace

ObjectsServerSetup DefaultFarmemdSetup(uint64_t memory_bytes) {
  const ServeOptions o;  // farmemd's own defaults
  const ServerConfig d;  // the services' defaults
  ObjectsServerSetup s;
  s.memory_bytes = memory_bytes;
  s.workers = o.workers;
  s.correction = DefaultCorrectionName();
  s.background_compaction = d.objects.compaction.interval_ms > 0;
  s.max_merges_per_round = d.objects.compaction.max_merges_per_round;
  s.max_merges_per_second = d.objects.compaction.max_merges_per_second;
  s.busy_poll = false;
  return s;
}

std::string DescribeServerSetup(const ObjectsServerSetup& s) {
  const ServeOptions o;
  const ServerConfig d;
  const bool is_default = s.workers == o.workers && !s.busy_poll &&
                          s.background_compaction == (d.objects.compaction.interval_ms > 0) &&
                          s.correction == DefaultCorrectionName() && s.cpu < 0 &&
                          s.max_block_size == d.objects.max_block_size &&
                          s.min_slots_per_block == d.objects.min_slots_per_block;
  return fmt::format(
      "{}: {} RPC worker(s), NIC thread {}, background compaction {}, correction {}{}{}",
      is_default ? "farmemd default configuration" : "farmemd tuned configuration", s.workers,
      s.busy_poll ? "busy-polls" : "spins 200 us then blocks (transport default)",
      s.background_compaction ? "on" : "off", s.correction,
      s.cpu >= 0 ? fmt::format(", pinned to CPU {}", s.cpu) : "",
      s.max_block_size != d.objects.max_block_size ||
              s.min_slots_per_block != d.objects.min_slots_per_block
          ? fmt::format(", blocks up to {} B holding >= {} slots", s.max_block_size,
                        s.min_slots_per_block)
          : "");
}

Result<std::unique_ptr<Node>> MakeObjectsClientNode(const ObjectsServerSetup& setup,
                                                    const std::string& name) {
  NodeConfig c;
  c.name = name;
  c.bootstrap_host = "127.0.0.1";
  c.rpc_workers = 1;
  c.transport.backend = setup.backend;
  c.transport.provider = setup.provider;
  c.transport.listen_host = "127.0.0.1";
  c.transport.cluster_token = setup.token;
  if (const char* e = std::getenv("FARMEM_BENCH_INITIATOR_SPIN_US"))
    c.transport.spin_before_sleep = std::chrono::microseconds(std::atoll(e));
  FARMEM_ASSIGN_OR_RETURN(auto node, Node::Create(c));
  FARMEM_RETURN_IF_ERROR(node->start().WithContext("starting the client node"));
  return node;
}

void FillObjectValue(uint64_t index, std::span<std::byte> out) {
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<std::byte>((index * 131 + i * 7) & 0xff);
  std::memcpy(out.data(), &index, std::min(out.size(), sizeof(index)));
}

namespace {

struct LoadState {
  ObjectClient* client;
  Scheduler* sched;
  std::vector<Ptr>* ptrs;
  uint64_t count = 0, next = 0, done = 0, next_report = 0;
  size_t size = 0;
  Status error;
  std::string label;
};

Task<void> LoadWorker(LoadState* s) {
  std::vector<std::byte> value(s->size);
  while (s->error.ok() && s->next < s->count) {
    const uint64_t i = s->next++;
    auto p = co_await s->client->alloc(*s->sched, s->size, 0);
    if (!p.ok()) {
      if (s->error.ok()) s->error = p.status().WithContext(fmt::format("alloc of object {}", i));
      break;
    }
    FillObjectValue(i, value);
    Status st = co_await s->client->write(*s->sched, *p, value);
    if (!st.ok()) {
      if (s->error.ok()) s->error = st.WithContext(fmt::format("write of object {}", i));
      break;
    }
    (*s->ptrs)[i] = *p;
    if (++s->done >= s->next_report) {
      fmt::print("  {}: {} / {} objects ({:.0f} %)\n", s->label, s->done, s->count,
                 100.0 * static_cast<double>(s->done) / static_cast<double>(s->count));
      std::fflush(stdout);
      s->next_report += std::max<uint64_t>(1, s->count / 10);
    }
  }
}

struct FreeState {
  ObjectClient* client;
  Scheduler* sched;
  std::vector<Ptr>* ptrs;
  std::span<const uint64_t> indices;
  size_t next = 0;
  Status error;
};

Task<void> FreeWorker(FreeState* s) {
  while (s->error.ok() && s->next < s->indices.size()) {
    const uint64_t i = s->indices[s->next++];
    Status st = co_await s->client->free(*s->sched, (*s->ptrs)[i]);
    if (!st.ok() && s->error.ok()) s->error = st.WithContext(fmt::format("free of object {}", i));
  }
}

}  // namespace

Result<std::vector<Ptr>> LoadObjects(ObjectClient& client, Scheduler& sched, uint64_t count,
                                     size_t size, int inflight, const std::string& label) {
  std::vector<Ptr> ptrs(count);
  LoadState s{&client, &sched, &ptrs};
  s.count = count;
  s.size = size;
  s.label = label;
  s.next_report = std::max<uint64_t>(1, count / 10);
  for (int k = 0; k < inflight; ++k) sched.spawn(LoadWorker(&s));
  // Each RPC has the transport's own timeout; this bounds a load that makes no progress at all.
  FARMEM_RETURN_IF_ERROR(
      DriveScheduler(sched, std::chrono::minutes(30)).WithContext("loading objects"));
  FARMEM_RETURN_IF_ERROR(s.error);
  return ptrs;
}

Status FreeObjects(ObjectClient& client, Scheduler& sched, std::vector<Ptr>& ptrs,
                   std::span<const uint64_t> indices, int inflight) {
  FreeState s{&client, &sched, &ptrs, indices};
  for (int k = 0; k < inflight; ++k) sched.spawn(FreeWorker(&s));
  FARMEM_RETURN_IF_ERROR(
      DriveScheduler(sched, std::chrono::minutes(30)).WithContext("freeing objects"));
  return s.error;
}

Status DriveScheduler(Scheduler& sched, std::chrono::milliseconds timeout) {
  return sched.run(timeout).WithContext("benchmark tasks");
}

bool StartGate::WaitForArrivals(int n, std::chrono::milliseconds timeout) const {
  auto deadline = ObjClock::now() + timeout;
  while (ready_.load(std::memory_order_acquire) < n) {
    if (ObjClock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

Result<uint64_t> RunTimedClients(int clients, double warmup_s, double seconds,
                                 const TimedClientBody& body) {
  StartGate gate;
  std::atomic<int64_t> warm_end_ns{0}, end_ns{0};
  std::vector<Result<uint64_t>> results(static_cast<size_t>(clients), uint64_t{0});
  auto run = [&](int t) {
    bool arrived = false;
    auto ready = [&]() -> std::optional<TimedWindow> {
      arrived = true;
      gate.Arrive();
      if (!gate.WaitForGo()) return std::nullopt;
      return TimedWindow{ObjClock::time_point(ObjClock::duration(warm_end_ns.load())),
                         ObjClock::time_point(ObjClock::duration(end_ns.load()))};
    };
    results[static_cast<size_t>(t)] = body(t, ready);
    if (!arrived) gate.Arrive();  // failed before ready(): do not keep the others waiting
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t) threads.emplace_back(run, t);
  if (!gate.WaitForArrivals(clients, std::chrono::seconds(30))) {
    gate.Abort();
    for (auto& th : threads) th.join();
    return Status::TimedOut("client threads did not start in time");
  }
  const auto warm = ObjClock::now() + std::chrono::duration_cast<ObjClock::duration>(
                                          std::chrono::duration<double>(warmup_s));
  warm_end_ns.store(warm.time_since_epoch().count());
  end_ns.store((warm + std::chrono::duration_cast<ObjClock::duration>(
                           std::chrono::duration<double>(seconds)))
                   .time_since_epoch()
                   .count());
  gate.Go();
  for (auto& th : threads) th.join();
  uint64_t total = 0;
  for (auto& r : results) {
    if (!r.ok()) return r.status();
    total += *r;
  }
  return total;
}

bool StartGate::WaitForGo() const {
  while (!go_.load(std::memory_order_acquire)) {
    if (abort_.load(std::memory_order_acquire)) return false;
    std::this_thread::yield();
  }
  return true;
}

void QuietBenchLogging() {
  InitLogging();
  if (std::getenv("FARMEM_LOG") == nullptr) spdlog::set_level(spdlog::level::warn);
}

TimelineSummary SummarizeTimeline(std::span<const uint64_t> counts, int64_t bucket_ms,
                                  int64_t compact_start_ms, int64_t compact_end_ms,
                                  size_t skip_buckets) {
  TimelineSummary s;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  s.dip = s.worst_bucket_dip = s.recovery = s.before_mean = s.during_min = s.during_mean =
      s.after_mean = nan;
  s.tail_mean = s.recovery_tail = nan;
  if (bucket_ms <= 0 || compact_end_ms < compact_start_ms) {
    s.missing = "invalid timeline (bucket size or compaction interval)";
    return s;
  }
  double before_sum = 0, during_sum = 0, after_sum = 0;
  double during_min = std::numeric_limits<double>::infinity();
  std::vector<size_t> after;  // indices of the after buckets
  for (size_t b = 0; b < counts.size(); ++b) {
    const int64_t lo = static_cast<int64_t>(b) * bucket_ms, hi = lo + bucket_ms;
    const double c = static_cast<double>(counts[b]);
    if (hi <= compact_start_ms) {
      if (b >= skip_buckets) {
        before_sum += c;
        ++s.before_buckets;
      }
    } else if (lo >= compact_end_ms && lo > compact_start_ms) {
      // (lo > start also puts an instantaneous compaction at a bucket edge into "during".)
      after_sum += c;
      ++s.after_buckets;
      after.push_back(b);
    } else {
      during_sum += c;
      during_min = std::min(during_min, c);
      ++s.during_buckets;
    }
  }
  if (s.before_buckets) s.before_mean = before_sum / static_cast<double>(s.before_buckets);
  if (s.during_buckets) {
    s.during_min = during_min;
    s.during_mean = during_sum / static_cast<double>(s.during_buckets);
  }
  if (s.after_buckets) s.after_mean = after_sum / static_cast<double>(s.after_buckets);
  std::vector<std::string> why;
  if (!s.before_buckets) why.push_back("no bucket before compaction");
  if (!s.during_buckets) why.push_back("compaction ran after the last bucket");
  if (!s.after_buckets) why.push_back("compaction did not end before the last bucket");
  if (s.before_buckets && s.before_mean <= 0) why.push_back("no read completed before compaction");
  const bool base_ok = s.before_buckets && s.before_mean > 0;
  if (base_ok && s.during_buckets) {
    s.dip = 1.0 - s.during_mean / s.before_mean;
    s.worst_bucket_dip = 1.0 - s.during_min / s.before_mean;
  }
  if (base_ok && s.after_buckets) s.recovery = s.after_mean / s.before_mean;
  if (!after.empty()) {
    const size_t tail = std::max<size_t>(1, after.size() / 4);
    double sum = 0;
    for (size_t i = after.size() - tail; i < after.size(); ++i)
      sum += static_cast<double>(counts[after[i]]);
    s.tail_mean = sum / static_cast<double>(tail);
    if (base_ok) {
      s.recovery_tail = s.tail_mean / s.before_mean;
      for (size_t b : after) {
        if (static_cast<double>(counts[b]) >= 0.95 * s.before_mean) {
          s.recovered_after_ms = static_cast<int64_t>(b) * bucket_ms - compact_end_ms;
          break;
        }
      }
    }
  }
  for (size_t i = 0; i < why.size(); ++i) s.missing += (i ? "; " : "") + why[i];
  return s;
}

nlohmann::json ObjectClientStatsJson(const ObjectClientStats& s) {
  return {{"direct_reads", s.direct_reads},
          {"direct_ok", s.direct_ok},
          {"torn_retries", s.torn_retries},
          {"locked_retries", s.locked_retries},
          {"moved", s.moved},
          {"scans", s.scans},
          {"corrections", s.corrections},
          {"rpc_reads", s.rpc_reads}};
}

}  // namespace farmem::bench
