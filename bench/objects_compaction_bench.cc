// `farmem bench objects-compaction`: one reader thread reads every live object in a loop
// (read_any, so moved objects get their pointers corrected) while compaction of a 75 %-freed heap
// is triggered at t = 2 s; completed reads are counted per 100 ms, for scan and ask-owner
// correction, each against a fresh farmemd child process.
#include "objects_compaction_bench.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_json.h"
#include "bench_stats.h"
#include "farmem/objects.h"
#include "machine_info.h"
#include "objects_throughput_internal.h"
#include "target_process.h"

namespace farmem {
namespace {

using bench::FormatRate;
using bench::FormatRatio;
using bench::ObjClock;
using bench::TargetProcess;

// Merges per COMPACT RPC: rounds stay well inside the RPC timeout; the benchmark loops rounds.
constexpr uint32_t kMergesPerRound = 256;
constexpr int kMaxRounds = 10000;

const char* CorrectionName(Correction c) {
  return c == Correction::kScan ? "scan" : "ask_owner";
}

struct RunResult {
  Correction correction = Correction::kScan;
  Status status;
  std::vector<uint64_t> counts;
  int64_t compact_start_ms = 0, compact_end_ms = 0;
  int rounds = 0;
  uint64_t merges = 0;
  uint64_t live_objects = 0;
  bench::TimelineSummary summary;
  ObjectClientStats stats;
  nlohmann::json compaction_stats, objects_before, objects_after;
  double load_seconds = 0;
};

// The reader thread's state, shared by its coroutines.
struct ReaderState {
  ObjectClient* client;
  Scheduler* sched;
  std::vector<Ptr>* live;
  const std::vector<uint64_t>* live_index;
  size_t size;
  ObjClock::time_point t0, end;
  int64_t bucket_ns;
  std::vector<uint64_t>* counts;
  size_t cursor = 0;
  Status error;
};

Task<void> ReaderWorker(ReaderState* s) {
  std::vector<std::byte> buf(s->size);
  while (s->error.ok()) {
    if (ObjClock::now() >= s->end) break;
    const size_t i = s->cursor++ % s->live->size();
    // In place: a corrected pointer stays corrected for the next pass.
    auto r = co_await s->client->read_any(*s->sched, (*s->live)[i], buf);
    const uint64_t idx = (*s->live_index)[i];
    if (!r.ok()) {
      if (s->error.ok())
        s->error = r.status().WithContext(fmt::format("read_any of object {}", idx));
      break;
    }
    if (*r != s->size || !bench::ValueMatches(idx, buf)) {
      if (s->error.ok())
        s->error = Status::Internal(fmt::format("read_any of object {} returned wrong bytes", idx));
      break;
    }
    const int64_t ns = (ObjClock::now() - s->t0).count();
    const auto b = static_cast<size_t>(ns / s->bucket_ns);
    if (b < s->counts->size()) ++(*s->counts)[b];
  }
}

struct CompactLoop {
  ObjectClient* client;
  Scheduler* sched;
  ObjClock::time_point run_end;
  Status status;
};

// COMPACT rounds (all classes) until one merges nothing, the run ends or kMaxRounds.
Task<void> RunCompactLoop(CompactLoop* l, RunResult* res) {
  while (res->rounds < kMaxRounds && ObjClock::now() < l->run_end) {
    auto r = co_await l->client->compact(*l->sched, 0);
    if (!r.ok()) {
      l->status = r.status().WithContext("compact");
      co_return;
    }
    ++res->rounds;
    res->merges += r->merges;
    res->compaction_stats = nlohmann::json::parse(r->stats_json, nullptr, false);
    if (r->merges == 0) co_return;
  }
}

// Summary of the STAT "objects" section worth keeping (tolerates absent keys).
nlohmann::json ObjectsStat(ObjectClient& client) {
  auto text = client.stats_json(0);
  if (!text.ok()) return {{"error", text.status().ToString()}};
  const nlohmann::json st = nlohmann::json::parse(*text, nullptr, false);
  if (!st.is_object() || !st.contains("objects")) return nlohmann::json::object();
  return st["objects"];
}

RunResult RunOne(TargetProcess& server, const bench::ObjectsServerSetup& setup,
                 Correction correction, const ObjectsCompactionOptions& o) {
  RunResult res;
  res.correction = correction;
  auto fail = [&](Status st) {
    res.status = std::move(st);
    return res;
  };
  auto ready = server.Start(bench::kObjectsServerStartTimeout);
  if (!ready.ok()) return fail(ready.status().WithContext("server did not start"));
  auto node = bench::MakeObjectsClientNode(setup, "bench-client");
  if (!node.ok()) return fail(node.status());
  ObjectClientOptions copts;
  copts.correction = correction;
  std::vector<std::string> servers{*ready};
  auto client = ObjectClient::Connect(**node, servers, copts);
  if (!client.ok()) return fail(client.status().WithContext("connect"));
  if (o.size > (*client)->server_info(0).max_object_size())
    return fail(
        Status::InvalidArgument(fmt::format("--size {} exceeds the largest object", o.size)));
  {
    auto sched = (*node)->make_scheduler();
    if (!sched.ok()) return fail(sched.status());
    auto load_start = ObjClock::now();
    auto ptrs =
        bench::LoadObjects(**client, **sched, o.objects, o.size, bench::kLoadInflight, "load");
    if (!ptrs.ok()) return fail(ptrs.status());
    res.load_seconds = std::chrono::duration<double>(ObjClock::now() - load_start).count();

    // Free a random fraction (fixed seed, so both strategies see the same heap shape).
    std::vector<uint64_t> order(o.objects);
    std::iota(order.begin(), order.end(), uint64_t{0});
    std::mt19937_64 rng(42);
    std::shuffle(order.begin(), order.end(), rng);
    const auto nfree =
        static_cast<size_t>(std::llround(o.free_fraction * static_cast<double>(o.objects)));
    std::span<const uint64_t> to_free(order.data(), nfree);
    fmt::print("  freeing {} of {} objects at random\n", nfree, o.objects);
    std::fflush(stdout);
    if (Status st = bench::FreeObjects(**client, **sched, *ptrs, to_free, bench::kLoadInflight);
        !st.ok())
      return fail(st);
    std::vector<uint64_t> live_index(order.begin() + static_cast<std::ptrdiff_t>(nfree),
                                     order.end());
    std::sort(live_index.begin(), live_index.end());
    std::vector<Ptr> live;
    live.reserve(live_index.size());
    for (uint64_t i : live_index) live.push_back((*ptrs)[i]);
    res.live_objects = live.size();
    sched->reset();
    res.objects_before = ObjectsStat(**client);

    // Timeline.
    const int64_t bucket_ns = int64_t{o.bucket_ms} * 1000000;
    const auto nbuckets = static_cast<size_t>(o.seconds * 1000.0 / o.bucket_ms);
    res.counts.assign(nbuckets, 0);
    bench::StartGate gate;
    std::atomic<int64_t> t0_ns{0};
    Status reader_status;
    std::thread reader([&] {
      auto rs = (*node)->make_scheduler();
      gate.Arrive();
      if (!rs.ok()) {
        reader_status = rs.status();
        return;
      }
      if (!gate.WaitForGo()) return;
      const ObjClock::time_point t0{ObjClock::duration(t0_ns.load())};
      ReaderState s{client->get(),
                    rs->get(),
                    &live,
                    &live_index,
                    o.size,
                    t0,
                    t0 + std::chrono::nanoseconds(bucket_ns * static_cast<int64_t>(nbuckets)),
                    bucket_ns,
                    &res.counts};
      for (int k = 0; k < o.inflight; ++k) (*rs)->spawn(ReaderWorker(&s));
      auto limit = std::chrono::milliseconds(static_cast<int64_t>(o.seconds * 1000)) +
                   std::chrono::seconds(60);
      reader_status = bench::DriveScheduler(**rs, limit);
      if (reader_status.ok()) reader_status = s.error;
    });
    if (!gate.WaitForArrivals(1, std::chrono::seconds(30))) {
      gate.Abort();
      reader.join();
      return fail(Status::TimedOut("reader thread did not start"));
    }
    const auto t0 = ObjClock::now();
    t0_ns.store(t0.time_since_epoch().count());
    gate.Go();
    fmt::print(
        "  reading {} live objects ({} in flight, read_any, {} correction); compaction at "
        "{:.1f} s of {:.1f} s\n",
        live.size(), o.inflight, CorrectionName(correction), o.compact_at, o.seconds);
    std::fflush(stdout);
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<ObjClock::duration>(
                                           std::chrono::duration<double>(o.compact_at)));
    const auto run_end = t0 + std::chrono::duration_cast<ObjClock::duration>(
                                  std::chrono::duration<double>(o.seconds));
    // COMPACT RPCs from a scheduler of this thread. Its waiting blocks on the socket between
    // replies (Scheduler::run), so a paced round seconds long takes no CPU from the server's
    // compaction worker or the reader (a busy-polling compact() did: perf showed 4 runnable
    // threads on 2 CPUs and the worker starved).
    const auto cstart = ObjClock::now();
    Status compact_status;
    if (auto cs = (*node)->make_scheduler(); !cs.ok()) {
      compact_status = cs.status().WithContext("make_scheduler for compaction");
    } else {
      CompactLoop loop{client->get(), cs->get(), run_end};
      (*cs)->spawn(RunCompactLoop(&loop, &res));
      compact_status = bench::DriveScheduler(**cs, std::chrono::minutes(10));
      if (compact_status.ok()) compact_status = loop.status;
    }
    const auto cend = ObjClock::now();
    reader.join();
    res.compact_start_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(cstart - t0).count();
    res.compact_end_ms = std::chrono::duration_cast<std::chrono::milliseconds>(cend - t0).count();
    res.stats = (*client)->stats();
    res.objects_after = ObjectsStat(**client);
    if (!compact_status.ok()) return fail(compact_status);
    if (!reader_status.ok()) return fail(reader_status.WithContext("reader"));
    const size_t compact_buckets = static_cast<size_t>(o.compact_at * 1000.0 / o.bucket_ms);
    res.summary =
        bench::SummarizeTimeline(res.counts, o.bucket_ms, res.compact_start_ms, res.compact_end_ms,
                                 std::max<size_t>(1, compact_buckets / 4));
  }
  client->reset();
  node->reset();
  server.Stop();
  return res;
}

std::string Pct(double v) {
  return std::isfinite(v) ? fmt::format("{:.1f} %", v * 100) : "n/a";
}

}  // namespace

int RunObjectsCompactionBench(ObjectsCompactionOptions o) {
  constexpr const char* kProg = "farmem bench objects-compaction";
  if (o.objects == 0) o.objects = o.quick ? 100000 : 1000000;
  if (o.seconds == 0) o.seconds = o.quick ? 8.0 : 30.0;
  if (o.compact_at == 0) o.compact_at = o.quick ? 2.0 : 5.0;
  std::string bad;
  std::string backend, provider;
  if (Status st = bench::ParseObjectsBackend(o.backend, &backend, &provider); !st.ok())
    bad = st.message();
  else if (o.objects < 100 || o.objects > (64ull << 20))
    bad = "--objects must be in 100..67108864";
  else if (o.size < sizeof(uint64_t) || o.size > 4000)
    bad = "--size must be in 8..4000 bytes";
  else if (!(o.free_fraction >= 0) || o.free_fraction > 0.99)
    bad = "--free-fraction must be in [0, 0.99]";
  else if (o.bucket_ms < 10 || o.bucket_ms > 10000)
    bad = "--bucket-ms must be in 10..10000";
  else if (!(o.seconds > 0) || o.seconds > 600)
    bad = "--seconds must be in (0, 600]";
  else if (!(o.compact_at > 0) || o.compact_at * 1000 < 2 * o.bucket_ms ||
           o.compact_at + 2.0 * o.bucket_ms / 1000.0 > o.seconds)
    bad = "--compact-at must leave at least two buckets before it and after it inside --seconds";
  else if (o.inflight < 1 || o.inflight > 1024)
    bad = "--inflight must be in 1..1024";
  if (!bad.empty()) {
    fmt::print(stderr, "{}: {}\n", kProg, bad);
    return 2;
  }
  bench::QuietBenchLogging();
  bench::ObjectsServerSetup setup;
  setup.backend = backend;
  setup.provider = provider;
  setup.memory_bytes = bench::ObjectsServerMemory(o.objects, o.size);
  setup.max_merges_per_round = kMergesPerRound;
  setup.max_merges_per_second = o.merges_per_second;
  const int ncpu = static_cast<int>(std::thread::hardware_concurrency());
  const bool pin = o.pin && ncpu >= 2;
  if (pin) setup.cpu = ncpu - 1;
  const Correction strategies[] = {Correction::kScan, Correction::kAskOwner};
  // One fresh server per strategy, forked before this process starts any thread.
  std::vector<std::unique_ptr<TargetProcess>> servers;
  std::vector<bench::ObjectsServerSetup> setups;
  for (Correction c : strategies) {
    bench::ObjectsServerSetup s = setup;
    s.correction = c == Correction::kScan ? "scan" : "owner";
    auto t = TargetProcess::Fork(std::string("farmemd-") + CorrectionName(c),
                                 bench::ObjectsServerRole(s));
    if (!t.ok()) {
      fmt::print(stderr, "{}: cannot fork the server: {}\n", kProg, t.status().ToString());
      return 1;
    }
    servers.push_back(std::move(t).value());
    setups.push_back(s);
  }
  if (pin) {
    // Still single-threaded: the reader and the client transport inherit the mask.
    std::vector<int> client_cpus(static_cast<size_t>(ncpu - 1));
    std::iota(client_cpus.begin(), client_cpus.end(), 0);
    if (Status st = bench::PinToCpus(client_cpus); !st.ok()) {
      fmt::print(stderr, "{}: {}\n", kProg, st.ToString());
      return 1;
    }
  }
  nlohmann::json machine = bench::MachineInfo();
  fmt::print(
      "{}: backend {}, {} objects x {} B, {:.0f} % freed at random, {} reads in flight, "
      "compaction at {:.1f} s, {:.1f} s per strategy, {} ms buckets\n",
      kProg, o.backend, o.objects, o.size, o.free_fraction * 100, o.inflight, o.compact_at,
      o.seconds, o.bucket_ms);
  if (pin) fmt::print("  pinned: server on CPU {}, this client on CPUs 0-{}\n", ncpu - 1, ncpu - 2);
  if (auto busy = bench::CpuBusyFraction(std::chrono::milliseconds(200))) {
    machine["cpu_busy_before_run"] = *busy;
    if (*busy > 0.25)
      fmt::print("WARNING: {:.0f}% of the CPUs were busy before the run; figures will be noisy.\n",
                 *busy * 100);
  }

  std::vector<RunResult> runs;
  for (size_t i = 0; i < servers.size(); ++i) {
    fmt::print("\ncorrection: {}\n", CorrectionName(strategies[i]));
    std::fflush(stdout);
    RunResult r = RunOne(*servers[i], setups[i], strategies[i], o);
    servers[i]->Stop();
    if (!r.status.ok()) {
      fmt::print("  FAILED: {}\n", r.status.ToString());
    } else {
      const auto& s = r.summary;
      const double per_s = 1000.0 / o.bucket_ms;
      fmt::print("  compaction: {} round(s), {} merges, {} ms .. {} ms ({} ms)\n", r.rounds,
                 r.merges, r.compact_start_ms, r.compact_end_ms,
                 r.compact_end_ms - r.compact_start_ms);
      // The server's merges waited this long for one-sided READ copies in progress (STAT).
      if (r.objects_after.contains("compaction") &&
          r.objects_after["compaction"].contains("grace_wait_ns")) {
        const nlohmann::json& k = r.objects_after["compaction"];
        fmt::print("  grace periods: {:.3f} ms in all, longest {:.1f} us\n",
                   k["grace_wait_ns"].get<uint64_t>() / 1e6,
                   k["grace_wait_max_ns"].get<uint64_t>() / 1e3);
      }
      fmt::print("  reads/s: before {}  during min {} (mean {})  after {}\n",
                 FormatRate(s.before_mean * per_s), FormatRate(s.during_min * per_s),
                 FormatRate(s.during_mean * per_s), FormatRate(s.after_mean * per_s));
      fmt::print(
          "  dip {} (worst bucket {})  recovery {}  corrections {}  scans {}  moved {}  locked "
          "retries {}\n",
          Pct(s.dip), Pct(s.worst_bucket_dip), Pct(s.recovery), r.stats.corrections, r.stats.scans,
          r.stats.moved, r.stats.locked_retries);
      fmt::print(
          "  after the lazy pointer corrections: last quarter {} ({} of before); first bucket "
          "at >= 95 % of before: {}\n",
          FormatRate(s.tail_mean * per_s), Pct(s.recovery_tail),
          s.recovered_after_ms >= 0
              ? fmt::format("{} ms after compaction ended", s.recovered_after_ms)
              : std::string("none"));
      if (!s.missing.empty()) fmt::print("  note: {}\n", s.missing);
    }
    std::fflush(stdout);
    runs.push_back(std::move(r));
  }

  // Targets: dip <= 25 % (mean during >= 0.75x mean before), recovery >= 95 %.
  struct Check {
    std::string name;
    double value = std::nan(""), baseline = std::nan(""), factor = 0;
    bench::TargetResult result = bench::TargetResult::kUnknown;
    std::string detail;
  };
  std::vector<Check> checks;
  for (const auto& r : runs) {
    const std::string c = CorrectionName(r.correction);
    Check dip{c + ": throughput dip during compaction <= 25 %"};
    Check rec{c + ": throughput after compaction >= 95 % of before"};
    if (!r.status.ok()) {
      dip.detail = rec.detail = "run failed";
    } else {
      const auto& s = r.summary;
      dip.value = s.during_mean;
      dip.baseline = s.before_mean;
      dip.factor = 0.75;
      dip.result = bench::CheckAtLeast(s.during_mean, s.before_mean, 0.75);
      dip.detail = std::isfinite(s.dip)
                       ? fmt::format(
                             "dip {} ({:.0f} reads per {} ms bucket during compaction vs {:.0f} "
                             "before; worst bucket {:.0f} = {} dip)",
                             Pct(s.dip), s.during_mean, o.bucket_ms, s.before_mean, s.during_min,
                             Pct(s.worst_bucket_dip))
                       : s.missing;
      rec.value = s.after_mean;
      rec.baseline = s.before_mean;
      rec.factor = 0.95;
      rec.result = bench::CheckAtLeast(s.after_mean, s.before_mean, 0.95);
      rec.detail = std::isfinite(s.recovery)
                       ? fmt::format("recovery {} ({:.0f} vs {:.0f} reads per bucket = {})",
                                     Pct(s.recovery), s.after_mean, s.before_mean,
                                     FormatRatio(bench::Ratio(s.after_mean, s.before_mean)))
                       : s.missing;
    }
    checks.push_back(std::move(dip));
    checks.push_back(std::move(rec));
  }
  fmt::print("\nTargets\n");
  for (const auto& c : checks)
    fmt::print("  [{:<4}] {}: {}\n", bench::TargetResultName(c.result), c.name, c.detail);
  std::fflush(stdout);

  if (!o.json_path.empty()) {
    nlohmann::json j;
    j["benchmark"] = kProg;
    if (double load[3]; ::getloadavg(load, 3) == 3)
      machine["loadavg_at_end"] = {load[0], load[1], load[2]};
    j["machine"] = machine;
    j["options"] = {
        {"backend", o.backend},
        {"objects", o.objects},
        {"size", o.size},
        {"free_fraction", o.free_fraction},
        {"seconds", o.seconds},
        {"compact_at", o.compact_at},
        {"inflight", o.inflight},
        {"bucket_ms", o.bucket_ms},
        {"merges_per_round", kMergesPerRound},
        {"merges_per_second", o.merges_per_second},
        {"pinned",
         pin ? fmt::format("server on CPU {}, client on CPUs 0-{}", ncpu - 1, ncpu - 2) : "no"},
        {"quick", o.quick}};
    j["notes"] = {
        "one reader thread, `inflight` coroutines, read_any over the live objects in index order; "
        "counts[b] = reads completed in [b*bucket_ms, (b+1)*bucket_ms)",
        "compaction = COMPACT RPC rounds (all classes) from compact_start_ms until a round merges "
        "nothing (compact_end_ms); the server's background compaction is off",
        "dip = 1 - mean(during)/mean(before) (worst_bucket_dip = 1 - min(during)/mean(before), "
        "information); recovery = mean(after)/mean(before); the first "
        "quarter of the pre-compaction buckets is warm-up and not in `before`"};
    nlohmann::json jr = nlohmann::json::array();
    for (const auto& r : runs) {
      nlohmann::json x = {{"correction", CorrectionName(r.correction)},
                          {"load_seconds", r.load_seconds},
                          {"live_objects", r.live_objects},
                          {"counts", r.counts},
                          {"compact_start_ms", r.compact_start_ms},
                          {"compact_end_ms", r.compact_end_ms},
                          {"rounds", r.rounds},
                          {"merges", r.merges},
                          {"client_stats", bench::ObjectClientStatsJson(r.stats)},
                          {"compaction_stats", r.compaction_stats},
                          {"objects_before", r.objects_before},
                          {"objects_after", r.objects_after}};
      if (!r.status.ok()) x["error"] = r.status.ToString();
      const auto& s = r.summary;
      x["summary"] = {{"before_buckets", s.before_buckets},
                      {"during_buckets", s.during_buckets},
                      {"after_buckets", s.after_buckets},
                      {"before_mean", s.before_mean},
                      {"during_min", s.during_min},
                      {"during_mean", s.during_mean},
                      {"after_mean", s.after_mean},
                      {"dip", s.dip},
                      {"worst_bucket_dip", s.worst_bucket_dip},
                      {"recovery", s.recovery},
                      {"tail_mean", s.tail_mean},
                      {"recovery_tail", s.recovery_tail},
                      {"recovered_after_ms", s.recovered_after_ms},
                      {"missing", s.missing}};
      jr.push_back(std::move(x));
    }
    j["runs"] = std::move(jr);
    std::vector<bench::TargetRecord> targets;
    for (const auto& c : checks) {
      targets.push_back({.name = c.name,
                         .value = c.value,
                         .baseline = c.baseline,
                         .ratio = bench::Ratio(c.value, c.baseline),
                         .limit = fmt::format(">= {}x baseline", c.factor),
                         .result = c.result,
                         .detail = c.detail});
    }
    j["targets"] = bench::TargetsJson(targets);
    if (Status st = bench::WriteJsonFile(o.json_path, j); !st.ok()) {
      fmt::print(stderr, "{}: {}\n", kProg, st.message());
      return 1;
    }
    fmt::print("\nResults written to {}\n", o.json_path);
  }
  for (const auto& r : runs)
    if (!r.status.ok()) return 1;
  return 0;
}

}  // namespace farmem
