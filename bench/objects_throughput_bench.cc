// `farmem bench objects-throughput`: loads N objects into a farmemd child process, then measures
// read throughput per (key distribution, client threads, read path) and Redis GETs of the same
// values at the same concurrency; prints targets with ratios and writes a JSON result file.
#include "objects_throughput_bench.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "bench_json.h"
#include "bench_stats.h"
#include "farmem/objects.h"
#include "machine_info.h"
#include "objects_throughput_internal.h"
#include "redis_bench.h"
#include "target_process.h"
#include "zipf.h"

namespace farmem {
namespace {

using bench::FormatRate;
using bench::FormatRatio;
using bench::ObjClock;
using bench::TargetProcess;

constexpr double kZipfTheta = 0.99;

enum class ReadOp { kRaw, kDirect, kRpc, kScan };

const char* OpName(ReadOp op) {
  switch (op) {
    case ReadOp::kRaw:
      return "raw_read";
    case ReadOp::kDirect:
      return "direct_read";
    case ReadOp::kRpc:
      return "read";
    case ReadOp::kScan:
      return "scan_read";
  }
  return "?";
}

struct CaseResult {
  std::string system;  // "farmem" | "redis"
  std::string op;      // raw_read | direct_read | read | get
  std::string dist;    // uniform | zipf
  int clients = 1;
  int inflight = 1;
  Status status;
  uint64_t ops = 0;
  double seconds = 0;
  double ops_per_sec = std::nan("");  // median of the rounds' rates
  std::vector<double> round_rates;    // ops/s of each round
};

struct Report {
  std::vector<CaseResult> cases;
  const CaseResult* Find(std::string_view op, std::string_view dist, int clients) const {
    for (const auto& c : cases)
      if (c.status.ok() && c.op == op && c.dist == dist && c.clients == clients) return &c;
    return nullptr;
  }
};

double WarmupFor(double seconds) {
  return std::clamp(seconds * 0.2, 0.05, 0.2);
}

// What every client thread of a farmem case needs.
struct Env {
  Node* node;
  ObjectClient* client;
  PeerId peer;
  RegionKey key;
  uint32_t slot_size;
  size_t size;
  const std::vector<Ptr>* ptrs;
};

// One client thread's state, shared by its K coroutines (they all run on this thread).
struct ThreadState {
  const Env* env;
  Scheduler* sched;
  ReadOp op;
  bench::KeyChooser chooser;
  ObjClock::time_point warm_end, end;
  uint64_t ops = 0;
  Status error;
};

Task<void> ReadWorker(ThreadState* s) {
  const Env& env = *s->env;
  std::vector<std::byte> buf(std::max<size_t>(env.slot_size, env.size));
  while (s->error.ok()) {
    if (ObjClock::now() >= s->end) break;
    const uint64_t idx = s->chooser.Next();
    Ptr p = (*env.ptrs)[idx];  // a private copy: reads may update the version hint
    Status st;
    switch (s->op) {
      case ReadOp::kRaw:
        // The slot bytes as stored, with no consistency check: the transport's own cost.
        st = co_await s->sched->read(RemoteRef{env.peer, env.key, p.offset}, buf.data(),
                                     env.slot_size);
        break;
      case ReadOp::kDirect:
      case ReadOp::kRpc:
      case ReadOp::kScan: {
        std::span<std::byte> out(buf.data(), env.size);
        // (No co_await inside nested conditional operators: GCC 12 ran the wrong branch.)
        Result<size_t> r = Status::Internal("no read path");
        if (s->op == ReadOp::kDirect) {
          r = co_await env.client->direct_read(*s->sched, p, out);
        } else if (s->op == ReadOp::kScan) {
          r = co_await env.client->scan_read(*s->sched, p, out);
        } else {
          r = co_await env.client->read(*s->sched, p, out);
        }
        if (!r.ok()) {
          st = r.status();
        } else if (*r != env.size || !bench::ValueMatches(idx, out)) {
          st = Status::Internal(
              fmt::format("{} of object {} returned wrong bytes", OpName(s->op), idx));
        }
        break;
      }
    }
    if (!st.ok()) {
      if (s->error.ok())
        s->error = st.WithContext(fmt::format("{} of object {}", OpName(s->op), idx));
      break;
    }
    const auto now = ObjClock::now();
    if (now >= s->warm_end && now < s->end) ++s->ops;
  }
}

Result<uint64_t> RunObjectsCase(const Env& env, ReadOp op, const bench::ZipfGenerator* zipf,
                                int clients, int inflight, double warmup_s, double seconds) {
  bench::StartGate gate;
  std::atomic<int64_t> warm_end_ns{0}, end_ns{0};
  std::vector<uint64_t> ops(static_cast<size_t>(clients), 0);
  std::mutex err_mu;
  Status first_error;
  auto record = [&](const Status& st) {
    std::lock_guard lock(err_mu);
    if (first_error.ok()) first_error = st;
  };
  auto body = [&](int t) {
    auto sched = env.node->make_scheduler();
    gate.Arrive();
    if (!sched.ok()) return record(sched.status().WithContext("make_scheduler"));
    if (!gate.WaitForGo()) return;
    ThreadState s{
        &env,
        sched->get(),
        op,
        bench::KeyChooser(env.ptrs->size(), zipf, 0xc0ffee00ull + static_cast<uint64_t>(t)),
        ObjClock::time_point(ObjClock::duration(warm_end_ns.load())),
        ObjClock::time_point(ObjClock::duration(end_ns.load()))};
    for (int k = 0; k < inflight; ++k) (*sched)->spawn(ReadWorker(&s));
    // Every operation has the transport's timeout; this bounds a case that stops progressing.
    auto limit = std::chrono::milliseconds(static_cast<int64_t>((warmup_s + seconds) * 1000)) +
                 std::chrono::seconds(60);
    if (Status st = bench::DriveScheduler(**sched, limit); !st.ok()) return record(st);
    if (!s.error.ok()) return record(s.error);
    ops[static_cast<size_t>(t)] = s.ops;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t) threads.emplace_back(body, t);
  if (!gate.WaitForArrivals(clients, std::chrono::seconds(30))) {
    gate.Abort();
    for (auto& th : threads) th.join();
    return Status::TimedOut("client threads did not start in time");
  }
  auto start = ObjClock::now();
  auto warm = start + std::chrono::duration_cast<ObjClock::duration>(
                          std::chrono::duration<double>(warmup_s));
  auto stop =
      warm + std::chrono::duration_cast<ObjClock::duration>(std::chrono::duration<double>(seconds));
  warm_end_ns.store(warm.time_since_epoch().count());
  end_ns.store(stop.time_since_epoch().count());
  gate.Go();
  for (auto& th : threads) th.join();
  if (!first_error.ok()) return first_error;
  uint64_t total = 0;
  for (uint64_t n : ops) total += n;
  return total;
}

// One case from its rounds (each measured for `slice_s`): total ops, and the median of the
// rounds' rates as its throughput, so one round disturbed by another process does not decide it.
CaseResult MakeCase(std::string system, std::string op, std::string dist, int clients, int inflight,
                    double slice_s, const std::vector<Result<uint64_t>>& rounds) {
  CaseResult r{std::move(system), std::move(op), std::move(dist), clients, inflight};
  for (const auto& x : rounds) {
    if (!x.ok()) {
      r.status = x.status();
      return r;
    }
    r.ops += *x;
    r.seconds += slice_s;
    r.round_rates.push_back(static_cast<double>(*x) / slice_s);
  }
  if (r.round_rates.empty() || r.ops == 0) {
    r.status = Status::TimedOut("no operation completed inside the window");
    return r;
  }
  std::vector<double> sorted = r.round_rates;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  r.ops_per_sec = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  return r;
}

void PrintCaseStart(std::string_view system, std::string_view op, std::string_view dist,
                    int clients, int inflight) {
  fmt::print("  {:<7} {:<12} {:<8} clients {} x{:<3} ", system, op, dist, clients, inflight);
  std::fflush(stdout);
}

void PrintCaseEnd(const CaseResult& r, const Report& report) {
  if (!r.status.ok()) {
    fmt::print("FAILED: {}\n", r.status.ToString());
    std::fflush(stdout);
    return;
  }
  std::string extra;
  if (r.op == "direct_read") {
    if (const CaseResult* raw = report.Find("raw_read", r.dist, r.clients))
      extra += "  /raw_read " +
               bench::FormatRoundRatios(bench::PerRoundRatios(r.round_rates, raw->round_rates));
  } else if (r.op == "read" || r.op == "get") {
    if (const CaseResult* d = report.Find("direct_read", r.dist, r.clients))
      extra += "  direct_read/this " +
               bench::FormatRoundRatios(bench::PerRoundRatios(d->round_rates, r.round_rates));
  }
  const auto [lo, hi] = std::minmax_element(r.round_rates.begin(), r.round_rates.end());
  fmt::print("{:>11} ({}-{}){}\n", FormatRate(r.ops_per_sec), FormatRate(*lo), FormatRate(*hi),
             extra);
  std::fflush(stdout);
}

struct TargetCheck {
  std::string name;
  double value = std::nan(""), baseline = std::nan(""), factor = 0;
  bench::RoundRatios ratios;  // per round: value_i / baseline_i (rounds interleaved)
  bench::TargetResult result = bench::TargetResult::kUnknown;
  std::string missing;
};

// Every target compares two cases measured in the same rounds (interleaved), and is judged on the
// median of the per-round ratios.
std::vector<TargetCheck> EvaluateTargets(const Report& report, const ObjectsThroughputOptions& o,
                                         const std::string& redis_missing) {
  std::vector<TargetCheck> out;
  const int min_clients = *std::min_element(o.clients.begin(), o.clients.end());
  const int max_clients = *std::max_element(o.clients.begin(), o.clients.end());
  const bool has8 = std::find(o.clients.begin(), o.clients.end(), 8) != o.clients.end();
  const int rpc_clients = has8 ? 8 : max_clients;
  auto check = [&](std::string name, const CaseResult* v, const CaseResult* b, double factor,
                   std::string missing) {
    TargetCheck t;
    t.name = std::move(name);
    t.factor = factor;
    t.missing = std::move(missing);
    if (t.missing.empty() && (!v || !b)) t.missing = "a case it needs failed or was not run";
    if (v) t.value = v->ops_per_sec;
    if (b) t.baseline = b->ops_per_sec;
    if (t.missing.empty()) {
      t.ratios = bench::PerRoundRatios(v->round_rates, b->round_rates);
      if (!t.ratios.ratios.empty())
        t.result =
            t.ratios.median >= factor ? bench::TargetResult::kPass : bench::TargetResult::kMiss;
    }
    out.push_back(std::move(t));
  };
  for (const char* dist : {"uniform", "zipf"}) {
    check(fmt::format("{} {} clients: direct_read >= 0.9x raw transport read of the same bytes",
                      dist, max_clients),
          report.Find("direct_read", dist, max_clients), report.Find("raw_read", dist, max_clients),
          0.9, "");
    std::string tcp_only;
    if (o.backend != "tcp") tcp_only = "defined for the native TCP backend (--backend tcp)";
    check(
        fmt::format("{} {} clients: direct_read >= 1.5x RPC read (native TCP)", dist, rpc_clients),
        report.Find("direct_read", dist, rpc_clients), report.Find("read", dist, rpc_clients), 1.5,
        tcp_only);
    const std::string one_count =
        min_clients == max_clients ? "needs two client counts (--clients 1,8)" : "";
    for (const char* op : {"raw_read", "direct_read"}) {
      check(fmt::format("{}: {} with {} clients >= 1.0x {} with {} client(s)", dist, op,
                        max_clients, op, min_clients),
            report.Find(op, dist, max_clients), report.Find(op, dist, min_clients), 1.0, one_count);
    }
    for (int c : o.clients) {
      check(fmt::format("{} {} clients: RPC read >= 1.0x Redis GET", dist, c),
            report.Find("read", dist, c), report.Find("get", dist, c), 1.0, redis_missing);
      check(fmt::format("{} {} clients: direct_read >= 2.0x Redis GET", dist, c),
            report.Find("direct_read", dist, c), report.Find("get", dist, c), 2.0, redis_missing);
    }
  }
  return out;
}

void PrintTargets(const std::vector<TargetCheck>& targets) {
  fmt::print("\nTargets (median of the per-round ratios, min-max of the rounds)\n");
  for (const auto& t : targets) {
    std::string detail = !t.missing.empty() ? t.missing
                                            : fmt::format("{} vs {}: {}", FormatRate(t.value),
                                                          FormatRate(t.baseline),
                                                          bench::FormatRoundRatios(t.ratios));
    fmt::print("  [{:<4}] {}: {}\n", bench::TargetResultName(t.result), t.name, detail);
  }
  std::fflush(stdout);
}

Status Validate(const ObjectsThroughputOptions& o) {
  if (o.objects < 2 || o.objects > (64ull << 20))
    return Status::InvalidArgument("--objects must be in 2..67108864");
  if (o.size < sizeof(uint64_t) || o.size > 4000)
    return Status::InvalidArgument("--size must be in 8..4000 bytes");
  if (!(o.seconds > 0) || o.seconds > 600)
    return Status::InvalidArgument("--seconds must be in (0, 600]");
  if (o.rounds < 1 || o.rounds > 100) return Status::InvalidArgument("--rounds must be in 1..100");
  if (o.inflight < 1 || o.inflight > 1024)
    return Status::InvalidArgument("--inflight must be in 1..1024");
  if (o.clients.empty()) return Status::InvalidArgument("--clients list is empty");
  std::set<int> seen;
  for (int c : o.clients) {
    if (c < 1 || c > 64)
      return Status::InvalidArgument(fmt::format("--clients {} outside 1..64", c));
    if (!seen.insert(c).second)
      return Status::InvalidArgument(fmt::format("--clients {} given twice", c));
  }
  std::string b, p;
  return bench::ParseObjectsBackend(o.backend, &b, &p);
}

}  // namespace

int RunObjectsThroughputBench(ObjectsThroughputOptions o) {
  constexpr const char* kProg = "farmem bench objects-throughput";
  if (o.objects == 0) o.objects = o.quick ? 100000 : 1000000;
  if (o.seconds == 0) o.seconds = o.quick ? 0.5 : 1.0;
  if (o.clients.empty()) o.clients = {1, 2, 4, 8};
  if (Status st = Validate(o); !st.ok()) {
    fmt::print(stderr, "{}: {}\n", kProg, st.ToString());
    return 2;
  }
  bench::QuietBenchLogging();
  // The server a user gets by default (farmemd with no flags), not a tuned one.
  bench::ObjectsServerSetup setup =
      bench::DefaultFarmemdSetup(bench::ObjectsServerMemory(o.objects, o.size));
  (void)bench::ParseObjectsBackend(o.backend, &setup.backend, &setup.provider);
  setup.max_block_size = o.server_max_block_size;
  setup.min_slots_per_block = o.server_min_slots_per_block;
  const std::string server_desc = bench::DescribeServerSetup(setup);

  // Fork the targets before this process creates any thread (see target_process.h).
  auto server = TargetProcess::Fork("farmemd", bench::ObjectsServerRole(setup));
  if (!server.ok()) {
    fmt::print(stderr, "{}: cannot fork the server: {}\n", kProg, server.status().ToString());
    return 1;
  }
  std::string redis_skip;
  const std::string redis_path = o.redis ? bench::FindRedisServer() : "";
  if (!o.redis)
    redis_skip = "disabled (--no-redis)";
  else if (redis_path.empty())
    redis_skip = "redis-server not found on PATH (Debian: apt-get install redis-server)";
  std::unique_ptr<TargetProcess> redis;
  if (redis_skip.empty()) {
    auto r = TargetProcess::Fork("redis-server", bench::RedisServerRole(redis_path));
    if (!r.ok())
      redis_skip = "cannot fork: " + r.status().ToString();
    else
      redis = std::move(r).value();
  }

  nlohmann::json machine = bench::MachineInfo();
  const double slice = o.seconds / o.rounds;  // measured time of one round of a case
  const double warmup = WarmupFor(slice);
  fmt::print(
      "{}: backend {}, {} objects x {} B, clients {}, {} reads in flight per client, "
      "{} s per case in {} rounds (each +{:.2f} s warm-up; read paths and Redis take turns round "
      "by round, median round "
      "reported), Zipf theta {}\n",
      kProg, o.backend, o.objects, o.size, fmt::join(o.clients, "/"), o.inflight, o.seconds,
      o.rounds, warmup, kZipfTheta);
  fmt::print("Server: {}\n", server_desc);
  if (auto busy = bench::CpuBusyFraction(std::chrono::milliseconds(200))) {
    machine["cpu_busy_before_run"] = *busy;
    if (*busy > 0.25)
      fmt::print("WARNING: {:.0f}% of the CPUs were busy before the run; figures will be noisy.\n",
                 *busy * 100);
  }

  auto ready = (*server)->Start(bench::kObjectsServerStartTimeout);
  if (!ready.ok()) {
    fmt::print(stderr, "{}: server did not start: {}\n", kProg, ready.status().ToString());
    return 1;
  }
  const std::string address = *ready;
  auto node = bench::MakeObjectsClientNode(setup, "bench-client");
  if (!node.ok()) {
    fmt::print(stderr, "{}: {}\n", kProg, node.status().ToString());
    return 1;
  }
  auto peer = (*node)->connect(address);
  std::vector<std::string> servers{address};
  auto client = ObjectClient::Connect(**node, servers);
  if (!peer.ok() || !client.ok()) {
    fmt::print(stderr, "{}: cannot connect to the server at {}: {}\n", kProg, address,
               (!peer.ok() ? peer.status() : client.status()).ToString());
    return 1;
  }
  const ObjectServerInfo info = (*client)->server_info(0);  // a copy: outlives the client
  if (o.size > info.max_object_size()) {
    fmt::print(stderr, "{}: --size {} exceeds the server's largest object ({} B)\n", kProg, o.size,
               info.max_object_size());
    return 2;
  }
  auto load_sched = (*node)->make_scheduler();
  if (!load_sched.ok()) {
    fmt::print(stderr, "{}: {}\n", kProg, load_sched.status().ToString());
    return 1;
  }
  fmt::print("\nLoad\n");
  auto load_start = ObjClock::now();
  auto ptrs =
      bench::LoadObjects(**client, **load_sched, o.objects, o.size, bench::kLoadInflight, "load");
  if (!ptrs.ok()) {
    fmt::print(stderr, "{}: {}\n", kProg, ptrs.status().ToString());
    return 1;
  }
  const double load_s = std::chrono::duration<double>(ObjClock::now() - load_start).count();
  const uint16_t cls = ptrs->front().size_class;
  if (cls >= info.classes.size()) {
    fmt::print(stderr, "{}: server returned size class {} it does not have\n", kProg, cls);
    return 1;
  }
  const uint32_t slot_size = info.classes[cls].slot_size;
  fmt::print("  loaded {} objects in {:.1f} s ({}); size class {}: {} B slots, {}\n", o.objects,
             load_s, FormatRate(static_cast<double>(o.objects) / load_s), cls, slot_size,
             info.classes[cls].id_mask ? "random IDs (movable)" : "offset-only");

  const bench::ZipfGenerator zipf(o.objects, kZipfTheta);
  const Env env{node->get(), client->get(), peer->id, info.region_key, slot_size, o.size, &*ptrs};

  // Redis is started and loaded before the rounds, so its GETs take turns with farmem's reads
  // (round after round) and a ratio between them compares figures measured side by side.
  std::string redis_status = "skipped: " + redis_skip;
  std::optional<uint16_t> redis_port;
  if (redis) {
    fmt::print("\nRedis (redis-server on 127.0.0.1, default configuration, no persistence)\n");
    auto port_msg = redis->Start(std::chrono::seconds(30));
    if (!port_msg.ok() || port_msg->size() != sizeof(uint16_t)) {
      redis_skip = port_msg.ok() ? "bad ready message" : port_msg.status().ToString();
      redis_status = "skipped: " + redis_skip;
    } else {
      uint16_t port;
      std::memcpy(&port, port_msg->data(), sizeof(port));
      Status loaded = bench::RedisLoad(port, o.objects, o.size, 1000);
      if (!loaded.ok()) {
        redis_status = "failed: " + loaded.ToString();
        fmt::print("  redis load FAILED: {}\n", loaded.ToString());
      } else {
        redis_status = "ran";
        redis_port = port;
      }
    }
  }

  Report report;
  bool server_died = false;
  std::vector<ReadOp> kOps;
  for (ReadOp op : {ReadOp::kRaw, ReadOp::kDirect, ReadOp::kRpc, ReadOp::kScan}) {
    const bool wanted = o.ops.empty()
                            ? op != ReadOp::kScan
                            : std::find(o.ops.begin(), o.ops.end(), OpName(op)) != o.ops.end();
    if (wanted) kOps.push_back(op);
  }
  const size_t nops = kOps.size();  // Redis, when measured, is entry nops
  for (const char* dist : {"uniform", "zipf"}) {
    fmt::print("\n{} keys: {} rounds, each running every client count's {}{} in turn\n  ", dist,
               o.rounds,
               fmt::join(o.ops.empty() ? std::vector<std::string>{"raw_read", "direct_read", "read"}
                                       : o.ops,
                         ", "),
               redis_port ? " and Redis get" : "");
    std::fflush(stdout);
    const bench::ZipfGenerator* z = dist[0] == 'z' ? &zipf : nullptr;
    // rounds[client index][read path, nops = Redis]
    std::vector<std::vector<std::vector<Result<uint64_t>>>> rounds(
        o.clients.size(), std::vector<std::vector<Result<uint64_t>>>(nops + 1));
    for (int round = 0; round < o.rounds; ++round) {
      for (size_t ci = 0; ci < o.clients.size(); ++ci) {
        const int clients = o.clients[ci];
        for (size_t k = 0; k < nops; ++k) {
          Result<uint64_t> ops =
              server_died ? Result<uint64_t>(Status::Unavailable("server process died"))
                          : RunObjectsCase(env, kOps[k], z, clients, o.inflight, warmup, slice);
          if (!server_died && !(*server)->Alive()) {
            server_died = true;
            ops = Status::Unavailable("server process died during the case");
          }
          rounds[ci][k].push_back(std::move(ops));
        }
        if (redis_port) {
          auto g = bench::RunRedisGets(*redis_port, o.objects, o.size, z, clients, o.inflight,
                                       warmup, slice);
          rounds[ci][nops].push_back(g.ok() ? Result<uint64_t>(g->ops)
                                            : Result<uint64_t>(g.status()));
        }
      }
      fmt::print("{}", round + 1 < o.rounds ? "." : ".\n");
      std::fflush(stdout);
    }
    for (size_t ci = 0; ci < o.clients.size(); ++ci) {
      for (size_t k = 0; k <= nops; ++k) {
        if (k == nops && !redis_port) continue;
        const bool is_redis = k == nops;
        const std::string system = is_redis ? "redis" : "farmem";
        const std::string op = is_redis ? "get" : OpName(kOps[k]);
        PrintCaseStart(system, op, dist, o.clients[ci], o.inflight);
        CaseResult r = MakeCase(system, op, dist, o.clients[ci], o.inflight, slice, rounds[ci][k]);
        PrintCaseEnd(r, report);
        report.cases.push_back(std::move(r));
      }
    }
  }
  const ObjectClientStats client_stats = (*client)->stats();
  // Contexts and the client go before the node whose transport they use.
  load_sched->reset();
  client->reset();
  node->reset();
  (*server)->Stop();
  if (redis) redis->Stop();
  if (!redis_skip.empty()) fmt::print("\nRedis: SKIPPED ({})\n", redis_skip);

  auto targets =
      EvaluateTargets(report, o, redis_port ? "" : "Redis not measured (" + redis_status + ")");
  PrintTargets(targets);

  if (!o.json_path.empty()) {
    nlohmann::json j;
    j["benchmark"] = kProg;
    if (double load[3]; ::getloadavg(load, 3) == 3)
      machine["loadavg_at_end"] = {load[0], load[1], load[2]};
    j["machine"] = machine;
    j["options"] = {
        {"backend", o.backend},     {"objects", o.objects},     {"size", o.size},
        {"slot_size", slot_size},   {"clients", o.clients},     {"inflight", o.inflight},
        {"seconds", o.seconds},     {"rounds", o.rounds},       {"round_seconds", slice},
        {"warmup_seconds", warmup}, {"zipf_theta", kZipfTheta}, {"quick", o.quick}};
    j["server"] = {{"block_size", info.block_size},
                   {"id_bits", info.id_bits},
                   {"size_class", cls},
                   {"id_mask", info.classes[cls].id_mask},
                   {"block_bytes", info.classes[cls].block_bytes},
                   {"max_block_size", setup.max_block_size},
                   {"min_slots_per_block", setup.min_slots_per_block},
                   {"workers", setup.workers},
                   {"configuration", server_desc},
                   {"default_configuration", !setup.busy_poll}};
    j["load_seconds"] = load_s;
    j["notes"] = {
        "raw_read = Scheduler::read of slot_size bytes at the object's offset, no checks",
        "direct_read = ObjectClient::direct_read (one-sided, ID/lock/version checks); read = RPC",
        "scan_read (--ops) = ObjectClient::scan_read: one-sided copy of the object's whole block "
        "(server.block_bytes), then the slot found by ID",
        "each client thread has its own Scheduler on one shared client node and keeps `inflight` "
        "reads outstanding; redis: one connection per client thread, `inflight` GETs pipelined",
        "zipf: Gray et al. (SIGMOD 1994) generator; rank r reads object (r * step + n / 3) mod n, "
        "step ~ 0.618 n coprime with n (scrambled like YCSB, so hot objects are not adjacent)"};
    nlohmann::json cases = nlohmann::json::array();
    for (const auto& c : report.cases) {
      nlohmann::json x = {
          {"system", c.system},     {"op", c.op},   {"dist", c.dist},      {"clients", c.clients},
          {"inflight", c.inflight}, {"ops", c.ops}, {"seconds", c.seconds}};
      x["round_ops_per_sec"] = c.round_rates;
      if (c.status.ok()) {
        x["ops_per_sec"] = c.ops_per_sec;
      } else {
        x["error"] = c.status.ToString();
      }
      cases.push_back(std::move(x));
    }
    j["cases"] = std::move(cases);
    j["redis"] = redis_status;
    j["client_stats"] = bench::ObjectClientStatsJson(client_stats);
    std::vector<bench::TargetRecord> records;
    for (const auto& t : targets) {
      bench::TargetRecord r{.name = t.name,
                            .value = t.value,
                            .baseline = t.baseline,
                            .limit = fmt::format(">= {}x baseline", t.factor),
                            .result = t.result};
      r.SetRounds(t.ratios);
      if (!t.missing.empty()) r.extra["missing"] = t.missing;
      records.push_back(std::move(r));
    }
    j["targets"] = bench::TargetsJson(records);
    if (Status st = bench::WriteJsonFile(o.json_path, j); !st.ok()) {
      fmt::print(stderr, "{}: {}\n", kProg, st.message());
      return 1;
    }
    fmt::print("\nResults written to {}\n", o.json_path);
  }
  for (const auto& c : report.cases)
    if (!c.status.ok()) return 1;
  return 0;
}

}  // namespace farmem
