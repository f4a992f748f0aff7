// `farmem bench raw`: p50/p99 latency and throughput of one-sided reads, writes, CAS, FAA and RPC
// echo per transport backend, next to two baselines measured in the same run (busy-polled TCP
// echo, process_vm_readv). Targets run in forked processes; results go to stdout and a JSON file.
#include "raw_bench.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_json.h"
#include "bench_stats.h"
#include "common/log.h"
#include "farmem/transport.h"
#include "machine_info.h"
#include "raw_bench_internal.h"
#include "target_process.h"

namespace farmem {
namespace {

using bench::Clock;
using bench::FormatMicros;
using bench::FormatRate;
using bench::FormatRatio;
using bench::LatencySummary;
using bench::Measurement;
using bench::TargetProcess;

constexpr const char* kPvmName = "process_vm_readv";
constexpr const char* kEchoName = "tcp_echo";
constexpr size_t kSmall = 64;
constexpr size_t kLarge = 4096;
constexpr uint32_t kRpcImm = 0x7e57;
// Time a target gets to create its transport and report its address.
constexpr std::chrono::milliseconds kStartTimeout{20000};

// ---------------------------------------------------------------------------------------------
// Results

struct RawCaseResult {
  std::string backend;
  std::string op;
  size_t size = 0;
  int inflight = 1;
  Status status;  // not OK: the case failed and its figures are absent
  uint64_t ops = 0;
  double seconds = 0;
  double ops_per_sec = std::nan("");
  LatencySummary lat;
  std::vector<std::pair<std::string, std::optional<double>>> ratios;
  // Per round (in round order): p50 and ops/s of that round's slice.
  std::vector<double> round_p50_us, round_ops;
};

struct RawReport {
  std::vector<RawCaseResult> cases;
  std::vector<std::pair<std::string, std::string>> unavailable;  // backend, reason

  const RawCaseResult* Find(std::string_view backend, std::string_view op, size_t size,
                            int inflight) const {
    for (const auto& c : cases)
      if (c.status.ok() && c.backend == backend && c.op == op && c.size == size &&
          c.inflight == inflight)
        return &c;
    return nullptr;
  }
};

RawCaseResult MakeResult(std::string backend, std::string op, size_t size, int inflight,
                         Result<Measurement> m);

// A case measured in rounds: figures over all the rounds' samples, plus each round's p50 and
// ops/s (what the targets' per-round ratios use). A failed round fails the case.
RawCaseResult MakeRoundsResult(std::string backend, std::string op, size_t size, int inflight,
                               std::vector<Result<Measurement>>& rounds) {
  Measurement all;
  std::vector<double> p50s, ops;
  for (auto& r : rounds) {
    if (!r.ok()) return MakeResult(backend, op, size, inflight, r.status());
    p50s.push_back(bench::Summarize(r->lat_ns).p50_us);
    ops.push_back(r->seconds > 0 ? static_cast<double>(r->ops) / r->seconds : std::nan(""));
    all.ops += r->ops;
    all.seconds += r->seconds;
    all.lat_ns.insert(all.lat_ns.end(), r->lat_ns.begin(), r->lat_ns.end());
  }
  RawCaseResult c = MakeResult(std::move(backend), std::move(op), size, inflight, std::move(all));
  c.round_p50_us = std::move(p50s);
  c.round_ops = std::move(ops);
  return c;
}

RawCaseResult MakeResult(std::string backend, std::string op, size_t size, int inflight,
                         Result<Measurement> m) {
  RawCaseResult r;
  r.backend = std::move(backend);
  r.op = std::move(op);
  r.size = size;
  r.inflight = inflight;
  if (!m.ok()) {
    r.status = m.status();
    return r;
  }
  r.ops = m->ops;
  r.seconds = m->seconds;
  r.ops_per_sec = m->seconds > 0 ? static_cast<double>(m->ops) / m->seconds : std::nan("");
  r.lat = bench::Summarize(m->lat_ns);
  if (r.ops == 0)
    r.status = Status::TimedOut("no operation completed inside the measurement window");
  return r;
}

// Ratios of a transport case to its baselines: the TCP echo of the same size (8-byte atomics and
// 64 B RPC compare with the 64 B echo) and depth, and process_vm_readv for fabric:shm reads.
void AddRatios(RawCaseResult& r, const RawReport& report) {
  size_t echo_size = (r.op == "read" || r.op == "write") ? r.size : kSmall;
  if (const RawCaseResult* e = report.Find(kEchoName, "echo", echo_size, r.inflight)) {
    r.ratios.emplace_back("p50_vs_tcp_echo", bench::Ratio(r.lat.p50_us, e->lat.p50_us));
    r.ratios.emplace_back("ops_vs_tcp_echo", bench::Ratio(r.ops_per_sec, e->ops_per_sec));
  }
  if (r.backend == "fabric:shm" && r.op == "read") {
    if (const RawCaseResult* p = report.Find(kPvmName, "read", r.size, 1)) {
      r.ratios.emplace_back("p50_vs_process_vm_readv", bench::Ratio(r.lat.p50_us, p->lat.p50_us));
      r.ratios.emplace_back("ops_vs_process_vm_readv", bench::Ratio(r.ops_per_sec, p->ops_per_sec));
    }
  }
}

// Progress: the case's name is printed (and flushed) before it runs, its figures after.
void PrintCaseStart(std::string_view backend, std::string_view op, size_t size, int inflight) {
  fmt::print("  {:<20} {:<5} {:>5} B x{:<4} ", backend, op, size, inflight);
  std::fflush(stdout);
}

void PrintCaseEnd(const RawCaseResult& r) {
  if (!r.status.ok()) {
    fmt::print("FAILED: {}\n", r.status.ToString());
    std::fflush(stdout);
    return;
  }
  std::string ratios;
  for (const auto& [name, value] : r.ratios) {
    // "p50_vs_tcp_echo" -> "p50/tcp_echo"
    std::string label = name;
    if (auto pos = label.find("_vs_"); pos != std::string::npos) label.replace(pos, 4, "/");
    ratios += fmt::format("  {} {}", label, FormatRatio(value));
  }
  fmt::print("p50 {:>9}  p99 {:>9}  {:>11}{}\n", FormatMicros(r.lat.p50_us),
             FormatMicros(r.lat.p99_us), FormatRate(r.ops_per_sec), ratios);
  std::fflush(stdout);
}

// ---------------------------------------------------------------------------------------------
// Transport targets

struct BackendSpec {
  std::string label;
  TransportConfig config;
  Status parse_status;
};

BackendSpec ParseBackend(const std::string& spec) {
  BackendSpec b;
  b.label = spec;
  b.config.listen_host = "127.0.0.1";
  if (spec == "tcp") {
    b.config.backend = "tcp";
  } else if (spec.rfind("fabric:", 0) == 0 && spec.size() > 7) {
    b.config.backend = "fabric";
    b.config.provider = spec.substr(7);
  } else {
    b.parse_status = Status::InvalidArgument("unknown backend '" + spec +
                                             "' (expected 'tcp' or 'fabric:<provider>')");
  }
  return b;
}

// Child role: a transport with its default configuration (the NIC/progress thread spins 200 us
// after its last work, then blocks: it stays hot during a case and costs nothing while the other
// cases of a round run), exports the 1 MiB region (read area filled with the pattern, the rest
// zero) and echoes RPCs. Reports [8-byte region key][local address].
bench::TargetRole TransportTargetRole(TransportConfig config) {
  return [config](int report_fd, int control_fd) mutable {
    auto fail = [&](const Status& st) {
      (void)bench::WriteMessage(report_fd, false, st.ToString());
    };
    void* mem = ::mmap(nullptr, bench::kRegionBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return fail(Status::FromErrno("mmap", errno));
    bench::FillPattern(static_cast<char*>(mem) + bench::kReadAreaOffset, bench::kReadAreaBytes);
    {
      auto created = Transport::Create(config);
      if (!created.ok()) return fail(created.status());
      std::unique_ptr<Transport> transport = std::move(created).value();
      transport->set_rpc_handler([](std::unique_ptr<IncomingRpc> rpc) {
        // Echo: answered at once on the progress thread (it does not block).
        (void)rpc->reply(rpc->imm(), rpc->payload());
      });
      if (Status st = transport->start(); !st.ok()) return fail(st.WithContext("start"));
      auto mr = transport->register_memory(mem, bench::kRegionBytes);
      if (!mr.ok()) {
        transport->stop();
        return fail(mr.status().WithContext("register_memory"));
      }
      std::string msg(reinterpret_cast<const char*>(&mr->key), sizeof(RegionKey));
      msg += transport->local_address();
      if (bench::WriteMessage(report_fd, true, msg).ok())
        bench::WaitForStop(control_fd, bench::kMaxTargetLifetime);
      transport->stop();
    }
    ::munmap(mem, bench::kRegionBytes);
  };
}

// Buffers and per-slot state for one backend. Outlives the Context so that a buffer is never
// freed while an operation that targets it might still be in flight.
struct Arena {
  explicit Arena(int max_inflight)
      : slots(static_cast<size_t>(max_inflight)),
        local(static_cast<size_t>(max_inflight) * kLarge),
        request(static_cast<size_t>(max_inflight) * kLarge),
        old(slots),
        sent_expected(slots),
        posted(slots),
        busy(slots, false),
        cas_expect(slots, uint64_t{0}),
        faa_expect(slots, uint64_t{0}) {}

  std::byte* local_buf(size_t i) { return local.data() + i * kLarge; }
  std::byte* request_buf(size_t i) { return request.data() + i * kLarge; }

  size_t slots;
  std::vector<std::byte> local;    // read destination / write source / RPC reply, kLarge per slot
  std::vector<std::byte> request;  // RPC request, kLarge per slot
  std::vector<uint64_t> old;       // CAS/FAA previous value
  std::vector<uint64_t> sent_expected;  // the CAS `expected` of the slot's op in flight
  std::vector<Clock::time_point> posted;
  std::vector<bool> busy;
  // The value each slot's private CAS/FAA word must hold (the child zeroes them). Unknown after an
  // operation failed, because it may or may not have been applied.
  std::vector<std::optional<uint64_t>> cas_expect, faa_expect;
  uint64_t rpc_seq = 0;
};

struct CaseSpec {
  OpType op;
  size_t size;
};

// One case: keep exactly `inflight` operations outstanding (post, poll, repost) for warm-up +
// `seconds`, then drain. Sets *broken when the context can no longer be trusted (a completion
// never came), so the caller skips the backend's remaining cases.
Result<Measurement> RunTransportCase(Context& ctx, PeerId peer, RegionKey key, CaseSpec spec,
                                     int inflight, Arena& arena, double warmup_s, double seconds,
                                     std::chrono::milliseconds stall_timeout, bool* broken) {
  const size_t size = spec.size;
  auto read_offset = [&](size_t i) {
    return bench::kReadAreaOffset + (i * size) % bench::kReadAreaBytes;
  };
  auto post = [&](size_t i) -> Status {
    RemoteRef ref{peer, key, 0};
    std::byte* buf = arena.local_buf(i);
    arena.posted[i] = Clock::now();
    switch (spec.op) {
      case OpType::kRead:
        ref.offset = read_offset(i);
        // Poison the ends so a completion that delivered no data fails the check.
        buf[0] = static_cast<std::byte>(~bench::PatternByte(ref.offset));
        buf[size - 1] = static_cast<std::byte>(~bench::PatternByte(ref.offset + size - 1));
        return ctx.post_read(ref, buf, size, i);
      case OpType::kWrite:
        ref.offset = bench::kWriteAreaOffset + (i * size) % bench::kWriteAreaBytes;
        return ctx.post_write(ref, buf, size, i, /*delivery_complete=*/true);
      case OpType::kCompareSwap: {
        ref.offset = bench::kCasAreaOffset + i * bench::kAtomicStride;
        uint64_t expected = arena.cas_expect[i].value_or(0);
        arena.sent_expected[i] = expected;
        return ctx.post_compare_swap(ref, expected, expected + 1, &arena.old[i], i);
      }
      case OpType::kFetchAdd:
        ref.offset = bench::kFaaAreaOffset + i * bench::kAtomicStride;
        return ctx.post_fetch_add(ref, 1, &arena.old[i], i);
      case OpType::kRpc: {
        std::byte* req = arena.request_buf(i);
        uint64_t seq = ++arena.rpc_seq;
        std::memcpy(req, &seq, sizeof(seq));
        std::memset(buf, 0, sizeof(seq));
        return ctx.post_rpc(peer, kRpcImm, std::span<const std::byte>(req, size),
                            std::span<std::byte>(buf, size), i);
      }
    }
    return Status::Internal("unknown op");
  };
  // Checks that the completed operation did what it claims; updates the atomics' expectations.
  auto verify = [&](size_t i, const Completion& c) -> Status {
    const std::byte* buf = arena.local_buf(i);
    switch (spec.op) {
      case OpType::kRead: {
        uint64_t off = read_offset(i);
        if (buf[0] != static_cast<std::byte>(bench::PatternByte(off)) ||
            buf[size - 1] != static_cast<std::byte>(bench::PatternByte(off + size - 1)))
          return Status::Internal(fmt::format("read at offset {} returned wrong data", off));
        return Status::OK();
      }
      case OpType::kWrite:
        return Status::OK();
      case OpType::kCompareSwap: {
        uint64_t old = arena.old[i], sent = arena.sent_expected[i];
        if (arena.cas_expect[i] && old != *arena.cas_expect[i])
          return Status::Internal(
              fmt::format("CAS returned old value {}, word holds {}", old, *arena.cas_expect[i]));
        arena.cas_expect[i] = old == sent ? sent + 1 : old;
        return Status::OK();
      }
      case OpType::kFetchAdd: {
        uint64_t old = arena.old[i];
        if (arena.faa_expect[i] && old != *arena.faa_expect[i])
          return Status::Internal(
              fmt::format("FAA returned old value {}, word holds {}", old, *arena.faa_expect[i]));
        arena.faa_expect[i] = old + 1;
        return Status::OK();
      }
      case OpType::kRpc: {
        if (c.reply_length != size || c.reply_imm != kRpcImm ||
            std::memcmp(buf, arena.request_buf(i), sizeof(uint64_t)) != 0)
          return Status::Internal(fmt::format("RPC echo reply mismatch (length {}, imm {:#x})",
                                              c.reply_length, c.reply_imm));
        return Status::OK();
      }
    }
    return Status::Internal("unknown op");
  };
  auto forget_expectations = [&](size_t i) {
    arena.cas_expect[i].reset();
    arena.faa_expect[i].reset();
  };

  bench::Recorder rec(warmup_s, seconds);
  Status first_error;
  size_t busy = 0;
  for (size_t i = 0; i < static_cast<size_t>(inflight); ++i) {
    Status st = post(i);
    if (!st.ok()) {
      first_error = st.WithContext("post");
      break;
    }
    arena.busy[i] = true;
    ++busy;
  }
  Completion batch[64];
  auto last_progress = Clock::now();
  while (busy > 0) {
    size_t n = ctx.poll(std::span<Completion>(batch, 64));
    if (n == 0) {
      if (Clock::now() - last_progress > stall_timeout) {
        *broken = true;
        return Status::TimedOut(fmt::format(
            "{} operation(s) never completed (transport broke its timeout promise)", busy));
      }
      continue;
    }
    auto now = Clock::now();
    last_progress = now;
    for (size_t k = 0; k < n; ++k) {
      const Completion& c = batch[k];
      size_t i = static_cast<size_t>(c.wr_id);
      if (i >= static_cast<size_t>(inflight) || !arena.busy[i]) {
        *broken = true;
        return Status::Internal(fmt::format("completion for unknown wr_id {}", c.wr_id));
      }
      arena.busy[i] = false;
      --busy;
      if (!c.status.ok()) {
        forget_expectations(i);
        if (first_error.ok()) first_error = c.status;
        continue;
      }
      if (Status v = verify(i, c); !v.ok()) {
        forget_expectations(i);
        if (first_error.ok()) first_error = v;
        continue;
      }
      rec.Add(arena.posted[i], now);
      if (first_error.ok() && rec.Running(now)) {
        Status st = post(i);
        if (!st.ok()) {
          first_error = st.WithContext("post");
          continue;
        }
        arena.busy[i] = true;
        ++busy;
      }
    }
  }
  if (!first_error.ok()) return first_error;
  return rec.Finish();
}

double RawWarmupFor(double seconds) {
  return std::clamp(seconds * 0.2, 0.05, 0.2);
}

const CaseSpec kTransportSpecs[] = {{OpType::kRead, kSmall},   {OpType::kRead, kLarge},
                                    {OpType::kWrite, kSmall},  {OpType::kWrite, kLarge},
                                    {OpType::kCompareSwap, 8}, {OpType::kFetchAdd, 8},
                                    {OpType::kRpc, kSmall}};

// One backend's initiator side, set up once and used by every round.
struct BackendRun {
  const BackendSpec* spec = nullptr;
  TargetProcess* target = nullptr;
  std::unique_ptr<Transport> transport;
  std::unique_ptr<Arena> arena;  // outlives ctx (see Arena)
  std::unique_ptr<Context> ctx;
  PeerId peer = kInvalidPeer;
  RegionKey key = 0;
  bool broken = false;

  ~BackendRun() {
    ctx.reset();
    if (transport) transport->stop();
    transport.reset();
    arena.reset();
    if (target) target->Stop();
  }
};

// Starts the backend's target and initiator; an error means the backend is unavailable.
Status SetUpBackend(BackendRun& b, int max_inflight) {
  auto ready = b.target->Start(kStartTimeout);
  if (!ready.ok()) return ready.status();
  if (ready->size() <= sizeof(RegionKey))
    return Status::Protocol("target sent a malformed ready message");
  std::memcpy(&b.key, ready->data(), sizeof(b.key));
  std::string address = ready->substr(sizeof(b.key));
  // The initiator keeps the transport's default spin too.
  TransportConfig initiator = b.spec->config;
  if (const char* e = std::getenv("FARMEM_BENCH_INITIATOR_SPIN_US"))
    initiator.spin_before_sleep = std::chrono::microseconds(std::atoll(e));
  FARMEM_ASSIGN_OR_RETURN(b.transport, Transport::Create(initiator));
  FARMEM_RETURN_IF_ERROR(b.transport->start().WithContext("start"));
  b.arena = std::make_unique<Arena>(max_inflight);
  FARMEM_ASSIGN_OR_RETURN(b.peer, b.transport->add_peer(address));
  FARMEM_ASSIGN_OR_RETURN(b.ctx, b.transport->create_context());
  return Status::OK();
}

// One case of the run: what it is and its rounds' measurements.
struct RoundCase {
  std::string backend, op;
  size_t size = 0;
  int inflight = 1;
  std::function<Result<Measurement>(double warmup_s, double seconds)> run;
  std::vector<Result<Measurement>> rounds;
};

// ---------------------------------------------------------------------------------------------
// Targets of the issue, machine info, JSON

struct RawTargetCheck {
  std::string name;
  std::string metric;  // "p50_us" or "ops_per_sec"
  double value = std::nan("");
  double baseline = std::nan("");
  double factor = 0;
  bool at_most = true;        // value <= factor x baseline (latency) or >= (throughput)
  bench::RoundRatios ratios;  // per round: subject_i / baseline_i; judged on the median
  bench::TargetResult result = bench::TargetResult::kUnknown;
  std::string missing;  // why the check could not be made
};

std::vector<RawTargetCheck> EvaluateTargets(const RawReport& report,
                                            const RawBenchOptions& options) {
  // "16+ in flight": 16 when measured, else the deepest queue measured above 1.
  int deep = 0;
  for (int n : options.inflight)
    if (n > 1 && (deep != 16) && (n == 16 || n > deep)) deep = n;
  auto make = [&](std::string name, const RawCaseResult* v, const RawCaseResult* b, bool latency,
                  double factor, bool at_most, std::string v_desc, std::string b_desc) {
    RawTargetCheck t;
    t.name = std::move(name);
    t.metric = latency ? "p50_us" : "ops_per_sec";
    t.factor = factor;
    t.at_most = at_most;
    if (!latency && deep == 0) {
      t.missing = "no in-flight depth above 1 was measured";
      return t;
    }
    if (!v) t.missing = v_desc + " not measured";
    if (!b) t.missing += (t.missing.empty() ? "" : "; ") + b_desc + " not measured";
    if (v) t.value = latency ? v->lat.p50_us : v->ops_per_sec;
    if (b) t.baseline = latency ? b->lat.p50_us : b->ops_per_sec;
    if (v && b) {
      t.ratios = latency ? bench::PerRoundRatios(v->round_p50_us, b->round_p50_us)
                         : bench::PerRoundRatios(v->round_ops, b->round_ops);
      if (!t.ratios.ratios.empty()) {
        const double m = t.ratios.median;
        t.result = (at_most ? m <= factor : m >= factor) ? bench::TargetResult::kPass
                                                         : bench::TargetResult::kMiss;
      }
    }
    return t;
  };
  std::vector<RawTargetCheck> out;
  out.push_back(make("fabric:shm 64 B read p50 <= 1.5x process_vm_readv 64 B p50",
                     report.Find("fabric:shm", "read", kSmall, 1),
                     report.Find(kPvmName, "read", kSmall, 1), true, 1.5, true,
                     "fabric:shm read x1", "process_vm_readv"));
  out.push_back(make(
      "tcp 64 B read p50 <= 1.3x TCP echo 64 B p50", report.Find("tcp", "read", kSmall, 1),
      report.Find(kEchoName, "echo", kSmall, 1), true, 1.3, true, "tcp read x1", "tcp_echo x1"));
  // Without a depth above 1 the throughput targets are named after the 16 and left n/a.
  std::string d = std::to_string(deep ? deep : 16);
  const RawCaseResult* tcp_deep = deep ? report.Find("tcp", "read", kSmall, deep) : nullptr;
  out.push_back(make("tcp 64 B read throughput x" + d + " >= 0.7x pipelined TCP echo x" + d,
                     tcp_deep, deep ? report.Find(kEchoName, "echo", kSmall, deep) : nullptr, false,
                     0.7, false, "tcp read x" + d, "tcp_echo x" + d));
  out.push_back(make("tcp 64 B read throughput x" + d + " >= 5x fabric:tcp;ofi_rxm read x" + d,
                     tcp_deep,
                     deep ? report.Find("fabric:tcp;ofi_rxm", "read", kSmall, deep) : nullptr,
                     false, 5.0, false, "tcp read x" + d, "fabric:tcp;ofi_rxm read x" + d));
  return out;
}

void PrintRawTargets(const std::vector<RawTargetCheck>& targets) {
  fmt::print("\nTargets (median of the per-round ratios, min-max of the rounds)\n");
  for (const auto& t : targets) {
    std::string detail;
    if (!t.missing.empty()) {
      detail = t.missing;
    } else if (t.metric == "p50_us") {
      detail = fmt::format("{} vs {}: {}", FormatMicros(t.value), FormatMicros(t.baseline),
                           bench::FormatRoundRatios(t.ratios));
    } else {
      detail = fmt::format("{} vs {}: {}", FormatRate(t.value), FormatRate(t.baseline),
                           bench::FormatRoundRatios(t.ratios));
    }
    fmt::print("  [{:<4}] {}: {}\n", bench::TargetResultName(t.result), t.name, detail);
  }
  std::fflush(stdout);
}

nlohmann::json ToJson(const RawReport& report, const std::vector<RawTargetCheck>& targets,
                      const RawBenchOptions& options, const nlohmann::json& machine) {
  nlohmann::json j;
  j["benchmark"] = "farmem bench raw";
  j["machine"] = machine;
  j["options"] = {{"backends", options.backends},
                  {"seconds", options.seconds},
                  {"rounds", options.rounds},
                  {"round_seconds", options.seconds / options.rounds},
                  {"warmup_seconds", RawWarmupFor(options.seconds / options.rounds)},
                  {"inflight", options.inflight}};
  j["notes"] = {
      "write = write with delivery_complete; cas/faa operate on 8-byte words (size 8); "
      "rpc = echo of a 64 B request by the target's progress thread",
      "ratios: p50_vs_* = p50 / baseline p50 (lower is better); ops_vs_* = ops_per_sec / baseline "
      "ops_per_sec (higher is better); tcp_echo baseline of the same size (64 B for cas/faa/rpc) "
      "and the same inflight depth",
      "percentiles: nearest rank over every operation completed in the measurement window "
      "(all rounds); targets: median of per-round ratios (each round runs every case once, so "
      "subject and baseline alternate)",
      "targets run with the transport's default configuration (spin 200 us, then block)"};
  nlohmann::json cases = nlohmann::json::array();
  for (const auto& c : report.cases) {
    nlohmann::json jc = {{"backend", c.backend},   {"op", c.op},   {"size", c.size},
                         {"inflight", c.inflight}, {"ops", c.ops}, {"seconds", c.seconds}};
    if (!c.status.ok()) {
      jc["error"] = c.status.ToString();
    } else {
      jc["p50_us"] = c.lat.p50_us;
      jc["p99_us"] = c.lat.p99_us;
      jc["mean_us"] = c.lat.mean_us;
      jc["min_us"] = c.lat.min_us;
      jc["max_us"] = c.lat.max_us;
      jc["ops_per_sec"] = c.ops_per_sec;
      jc["round_p50_us"] = c.round_p50_us;
      jc["round_ops_per_sec"] = c.round_ops;
      nlohmann::json ratios = nlohmann::json::object();
      for (const auto& [name, value] : c.ratios)
        ratios[name] = value ? nlohmann::json(*value) : nlohmann::json(nullptr);
      jc["ratios"] = ratios;
    }
    cases.push_back(std::move(jc));
  }
  j["cases"] = std::move(cases);
  nlohmann::json unavailable = nlohmann::json::array();
  for (const auto& [backend, reason] : report.unavailable)
    unavailable.push_back({{"backend", backend}, {"reason", reason}});
  j["unavailable"] = std::move(unavailable);
  std::vector<bench::TargetRecord> records;
  for (const auto& t : targets) {
    bench::TargetRecord r{
        .name = t.name,
        .value = t.value,
        .baseline = t.baseline,
        .limit = std::string(t.at_most ? "<= " : ">= ") + fmt::format("{}x baseline", t.factor),
        .result = t.result};
    r.SetRounds(t.ratios);
    r.extra["metric"] = t.metric;
    if (!t.missing.empty()) r.extra["missing"] = t.missing;
    records.push_back(std::move(r));
  }
  j["targets"] = bench::TargetsJson(records);
  return j;
}

Status ValidateOptions(const RawBenchOptions& o) {
  if (!(o.seconds > 0) || o.seconds > 3600)
    return Status::InvalidArgument("seconds must be in (0, 3600]");
  if (o.rounds < 1 || o.rounds > 100) return Status::InvalidArgument("rounds must be in 1..100");
  if (o.inflight.empty()) return Status::InvalidArgument("inflight list is empty");
  std::set<int> seen;
  for (int n : o.inflight) {
    if (n < 1 || n > bench::kMaxInflight)
      return Status::InvalidArgument(
          fmt::format("inflight {} outside 1..{}", n, bench::kMaxInflight));
    if (!seen.insert(n).second)
      return Status::InvalidArgument(fmt::format("inflight {} given twice", n));
  }
  std::set<std::string> names;
  for (const auto& b : o.backends)
    if (!names.insert(b).second) return Status::InvalidArgument("backend '" + b + "' given twice");
  return Status::OK();
}

}  // namespace

int RunRawBench(const RawBenchOptions& options) {
  if (Status st = ValidateOptions(options); !st.ok()) {
    fmt::print(stderr, "farmem bench raw: {}\n", st.ToString());
    return 2;
  }
  InitLogging();
  std::vector<BackendSpec> specs;
  for (const auto& b : options.backends) specs.push_back(ParseBackend(b));

  // Fork every target now, before this process creates any transport or thread: a fork after
  // that would copy locks held by other threads. The children block until their turn.
  auto pvm = TargetProcess::Fork(kPvmName, bench::PvmTargetRole());
  auto echo = TargetProcess::Fork(kEchoName, bench::EchoServerRole());
  std::vector<std::unique_ptr<TargetProcess>> targets;
  for (const auto& s : specs) {
    if (!s.parse_status.ok()) {
      targets.emplace_back();
      continue;
    }
    auto t = TargetProcess::Fork(s.label, TransportTargetRole(s.config));
    if (!t.ok()) {
      fmt::print(stderr, "farmem bench raw: cannot fork target for {}: {}\n", s.label,
                 t.status().ToString());
      return 1;
    }
    targets.push_back(std::move(t).value());
  }
  if (!pvm.ok() || !echo.ok()) {
    fmt::print(stderr, "farmem bench raw: cannot fork baseline targets: {}\n",
               (!pvm.ok() ? pvm.status() : echo.status()).ToString());
    return 1;
  }

  nlohmann::json machine = bench::MachineInfo();
  fmt::print(
      "farmem bench raw: {} s per case in {} interleaved rounds, in flight {}, {} CPUs, {}\n",
      options.seconds, options.rounds, fmt::join(options.inflight, "/"), machine.value("nproc", 0L),
      machine.value("kernel", std::string("?")));
  fmt::print(
      "Targets run with the transport's default configuration (NIC/progress thread spins 200 us "
      "after its last work, then blocks).\n");
  fmt::print(
      "Latency is per operation (post to completion); ratios: p50/baseline (lower is "
      "better), ops/baseline (higher is better).\n");
  // Cases keep both sides hot, so other load on the machine shows up directly in the figures;
  // say so rather than let a loaded run pass for a clean one.
  if (auto busy = bench::CpuBusyFraction(std::chrono::milliseconds(200))) {
    machine["cpu_busy_before_run"] = *busy;
    if (*busy > 0.25)
      fmt::print(
          "WARNING: {:.0f}% of the CPUs were busy before the run: other processes compete "
          "with the benchmark's targets and initiator, so figures will be noisy.\n",
          *busy * 100);
  }
  // Set up every target and initiator once, then run the rounds: each round runs every case
  // (baselines and transports) for seconds/rounds, so a subject and its baseline alternate
  // (A B A B ...) and load on the machine hits them alike.
  RawReport report;
  std::vector<RoundCase> cases;
  auto unavailable = [&](const std::string& label, const Status& st) {
    fmt::print("  {:<20} unavailable: {}\n", label, st.ToString());
    report.unavailable.emplace_back(label, st.ToString());
  };
  fmt::print("\nSet-up\n");
  if (auto ready = (*pvm)->Start(kStartTimeout); !ready.ok() || ready->size() != sizeof(uint64_t)) {
    unavailable(kPvmName, ready.ok() ? Status::Protocol("bad ready message") : ready.status());
  } else {
    uint64_t addr;
    std::memcpy(&addr, ready->data(), sizeof(addr));
    const pid_t pid = (*pvm)->pid();
    for (size_t size : {kSmall, kLarge}) {
      cases.push_back({kPvmName, "read", size, 1, [pid, addr, size](double w, double s) {
                         return bench::RunPvmCase(pid, addr, size, w, s);
                       }});
    }
  }
  if (auto ready = (*echo)->Start(kStartTimeout);
      !ready.ok() || ready->size() != sizeof(uint16_t)) {
    unavailable(kEchoName, ready.ok() ? Status::Protocol("bad ready message") : ready.status());
  } else {
    uint16_t port;
    std::memcpy(&port, ready->data(), sizeof(port));
    for (size_t size : {kSmall, kLarge}) {
      for (int inflight : options.inflight) {
        cases.push_back(
            {kEchoName, "echo", size, inflight, [port, size, inflight](double w, double s) {
               return bench::RunEchoCase(port, size, inflight, w, s,
                                         std::chrono::milliseconds(5000));
             }});
      }
    }
  }
  int max_inflight = 1;
  for (int n : options.inflight) max_inflight = std::max(max_inflight, n);
  std::vector<std::unique_ptr<BackendRun>> runs;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].parse_status.ok()) {
      unavailable(specs[i].label, specs[i].parse_status);
      continue;
    }
    auto run = std::make_unique<BackendRun>();
    run->spec = &specs[i];
    run->target = targets[i].get();
    if (Status st = SetUpBackend(*run, max_inflight); !st.ok()) {
      unavailable(specs[i].label, st);
      continue;
    }
    BackendRun* b = run.get();
    const auto stall = specs[i].config.op_timeout + std::chrono::seconds(2);
    for (const CaseSpec& cs : kTransportSpecs) {
      for (int inflight : options.inflight) {
        cases.push_back({specs[i].label, std::string(OpTypeName(cs.op)), cs.size, inflight,
                         [b, cs, inflight, stall](double w, double s) -> Result<Measurement> {
                           if (b->broken)
                             return Status::Aborted("skipped: an earlier case broke the context");
                           Result<Measurement> m =
                               RunTransportCase(*b->ctx, b->peer, b->key, cs, inflight, *b->arena,
                                                w, s, stall, &b->broken);
                           if (m.ok() && !b->target->Alive())
                             return Status::Unavailable("target process died during the case");
                           return m;
                         }});
      }
    }
    fmt::print("  {:<20} ready\n", specs[i].label);
    runs.push_back(std::move(run));
  }
  const double slice = options.seconds / options.rounds;
  fmt::print("\n{} cases x {} rounds of {:.2f} s (+{:.2f} s warm-up each)\n  ", cases.size(),
             options.rounds, slice, RawWarmupFor(slice));
  std::fflush(stdout);
  for (int round = 0; round < options.rounds; ++round) {
    for (auto& c : cases) {
      // A case that failed is not run again (its later rounds repeat the failure).
      if (!c.rounds.empty() && !c.rounds.back().ok()) {
        c.rounds.push_back(c.rounds.back().status());
        continue;
      }
      c.rounds.push_back(c.run(RawWarmupFor(slice), slice));
    }
    fmt::print("{}", round + 1 < options.rounds ? "." : ".\n");
    std::fflush(stdout);
  }
  std::string section;
  for (auto& c : cases) {
    const std::string sec =
        c.backend == kPvmName || c.backend == kEchoName ? "Baselines" : c.backend;
    if (sec != section) {
      fmt::print("\n{}\n", sec);
      section = sec;
    }
    PrintCaseStart(c.backend, c.op, c.size, c.inflight);
    RawCaseResult r = MakeRoundsResult(c.backend, c.op, c.size, c.inflight, c.rounds);
    if (r.status.ok() && sec != "Baselines") AddRatios(r, report);
    PrintCaseEnd(r);
    report.cases.push_back(std::move(r));
  }
  cases.clear();  // the closures point into runs
  runs.clear();
  (*pvm)->Stop();
  (*echo)->Stop();
  for (auto& t : targets)
    if (t) t->Stop();

  if (double load[3]; ::getloadavg(load, 3) == 3)
    machine["loadavg_at_end"] = {load[0], load[1], load[2]};
  auto checks = EvaluateTargets(report, options);
  PrintRawTargets(checks);
  if (!options.json_path.empty()) {
    if (Status st =
            bench::WriteJsonFile(options.json_path, ToJson(report, checks, options, machine));
        !st.ok()) {
      fmt::print(stderr, "farmem bench raw: {}\n", st.message());
      return 1;
    }
    fmt::print("\nResults written to {}\n", options.json_path);
  }
  return 0;
}

}  // namespace farmem
