// `farmem bench tiered` (tiered_bench.h): forks the tier servers and the mmap baseline server,
// then drives every client from the main thread (one scheduler, `inflight` coroutines); the
// TieredClients' background threads pull bitmaps and push counters each period.
#include "tiered_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "bench_json.h"
#include "bench_stats.h"
#include "farmem/node.h"
#include "farmem/tier.h"
#include "machine_info.h"
#include "objects_throughput_internal.h"
#include "tiered_baseline.h"
#include "tiered_oracle.h"
#include "zipf.h"

namespace farmem {
namespace {

using Clock = std::chrono::steady_clock;
using bench::TargetRecord;
using bench::TargetResult;
constexpr const char* kTieredProg = "farmem bench tiered";
constexpr double kZipfTheta = 0.99;
constexpr auto kStartTimeout = std::chrono::seconds(60);

// ---- Workloads ------------------------------------------------------------------------------

struct Work {
  bool zipf = true;
  uint32_t size = 4096;
  int write_pct = 0;
  std::string Name() const {
    const std::string sz =
        size >= 1024 ? fmt::format("{}KiB", size / 1024) : fmt::format("{}B", size);
    return fmt::format("{} {} {}", zipf ? "zipf" : "uniform", sz,
                       write_pct ? fmt::format("{}%w", write_pct) : std::string("read"));
  }
};

// ---- Subjects: what a worker reads from and writes to ----------------------------------------

class Subject {
 public:
  virtual ~Subject() = default;
  virtual Task<Status> Read(Scheduler& s, uint64_t off, std::span<std::byte> out) = 0;
  virtual Task<Status> Write(Scheduler& s, uint64_t off, std::span<const std::byte> in) = 0;
  virtual std::optional<TieredClientStats> Stats() const { return std::nullopt; }
  std::string name;
  std::string desc;
  // False where nothing moves with the workload (no hotspot periods, no page cache): the
  // steady-state warm-up is skipped, which keeps --quick under two minutes.
  bool warms = true;
};

class TierSubject : public Subject {
 public:
  explicit TierSubject(std::unique_ptr<TieredClient> c) : client(std::move(c)) {}
  Task<Status> Read(Scheduler& s, uint64_t off, std::span<std::byte> out) override {
    return client->read(s, off, out);
  }
  Task<Status> Write(Scheduler& s, uint64_t off, std::span<const std::byte> in) override {
    return client->write(s, off, in);
  }
  std::optional<TieredClientStats> Stats() const override { return client->stats(); }
  std::unique_ptr<TieredClient> client;
};

// The cgroup-capped file mmap, read by MMAP_READ RPCs (an RPC worker copies, taking the faults).
class MmapRpcSubject : public Subject {
 public:
  explicit MmapRpcSubject(PeerId p) : peer(p) {}
  Task<Status> Read(Scheduler& s, uint64_t off, std::span<std::byte> out) override {
    bench::MmapReadRequest r;
    r.offset = off;
    r.length = static_cast<uint32_t>(out.size());
    auto reply = co_await s.rpc(peer, RpcImm(bench::kOpMmapRead),
                                std::as_bytes(std::span<bench::MmapReadRequest>(&r, 1)), out);
    if (!reply.ok()) co_return reply.status();
    if (reply->length != out.size()) co_return Status::Protocol("MMAP_READ: short reply");
    co_return Status::OK();
  }
  Task<Status> Write(Scheduler&, uint64_t, std::span<const std::byte>) override {
    co_return Status::FailedPrecondition("the mmap baselines are read-only");
  }
  PeerId peer;
};

// The same mapping read one-sidedly: the server's NIC thread takes the page faults.
class MmapOneSidedSubject : public Subject {
 public:
  explicit MmapOneSidedSubject(RemoteRef r) : region(r) {}
  Task<Status> Read(Scheduler& s, uint64_t off, std::span<std::byte> out) override {
    RemoteRef at = region;
    at.offset = off;
    return s.read(at, out.data(), out.size());
  }
  Task<Status> Write(Scheduler&, uint64_t, std::span<const std::byte>) override {
    co_return Status::FailedPrecondition("the mmap baselines are read-only");
  }
  RemoteRef region;
};

// ---- Running a workload ----------------------------------------------------------------------

struct SliceOut {
  uint64_t ops = 0, errors = 0, wrong = 0;
  Status first_error;
  std::vector<uint64_t> buckets;  // completed ops per bucket (timeline runs only)
};

struct RunSpec {
  const Work* work = nullptr;
  uint64_t items = 0;  // capacity / size
  const bench::ZipfGenerator* zipf = nullptr;
  Clock::time_point start, end;
  std::optional<Clock::time_point> move_at;  // hot-set move: key k becomes items - 1 - k
  int64_t bucket_ms = 0;
};

// One worker coroutine: draws keys, reads (checking the first and last word: every byte of the
// region is always DataWord(offset), writes included) or writes, until the end of the run.
Task<void> Worker(Scheduler& s, Subject& t, const RunSpec& spec, uint64_t seed, SliceOut* out) {
  bench::KeyChooser keys(spec.items, spec.zipf, seed);
  bench::SplitMix64 rng(seed * 7 + 1);
  const uint32_t size = spec.work->size;
  std::vector<uint64_t> buf(size / 8);
  auto bytes = std::as_writable_bytes(std::span<uint64_t>(buf));
  while (true) {
    const auto now = Clock::now();
    if (now >= spec.end) break;
    uint64_t k = keys.Next();
    if (spec.move_at && now >= *spec.move_at) k = spec.items - 1 - k;
    const uint64_t off = k * size;
    Status st;
    if (rng.Below(100) < static_cast<uint64_t>(spec.work->write_pct)) {
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = bench::DataWord(off + i * 8);
      st = co_await t.Write(s, off, bytes);
    } else {
      st = co_await t.Read(s, off, bytes);
      if (st.ok() &&
          (buf.front() != bench::DataWord(off) || buf.back() != bench::DataWord(off + size - 8)))
        ++out->wrong;
    }
    if (!st.ok()) {
      if (out->errors++ == 0) out->first_error = st;
      co_return;  // an error ends this worker; the run reports it
    }
    ++out->ops;
    if (spec.bucket_ms > 0) {
      const auto b = static_cast<size_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - spec.start).count() /
          spec.bucket_ms);
      if (b < out->buckets.size()) ++out->buckets[b];
    }
  }
}

class Runner {
 public:
  Runner(Scheduler& s, uint64_t capacity, int inflight)
      : sched_(s), capacity_(capacity), inflight_(inflight) {}

  const bench::ZipfGenerator* Zipf(uint64_t items) {
    auto& z = zipfs_[items];
    if (!z) z = std::make_unique<bench::ZipfGenerator>(items, kZipfTheta);
    return z.get();
  }

  // Runs `w` on `t` for `seconds`; ops/s. A failed operation or a wrong word fails the run.
  Result<double> Run(Subject& t, const Work& w, double seconds, SliceOut* out = nullptr,
                     std::optional<double> move_after = std::nullopt, int64_t bucket_ms = 0) {
    SliceOut local;
    SliceOut& o = out ? *out : local;
    RunSpec spec;
    spec.work = &w;
    spec.items = capacity_ / w.size;
    spec.zipf = w.zipf ? Zipf(spec.items) : nullptr;
    spec.start = Clock::now();
    spec.end = spec.start +
               std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    if (move_after)
      spec.move_at = spec.start + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(*move_after));
    spec.bucket_ms = bucket_ms;
    if (bucket_ms > 0) o.buckets.assign(static_cast<size_t>(seconds * 1000 / bucket_ms) + 1, 0);
    for (int i = 0; i < inflight_; ++i) sched_.spawn(Worker(sched_, t, spec, ++seed_, &o));
    FARMEM_RETURN_IF_ERROR(bench::DriveScheduler(
        sched_, std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000) + 60000)));
    const double elapsed = std::chrono::duration<double>(Clock::now() - spec.start).count();
    if (o.errors > 0) return o.first_error.WithContext(fmt::format("{} on {}", w.Name(), t.name));
    if (o.wrong > 0)
      return Status::Internal(
          fmt::format("{} on {}: {} reads returned wrong data", w.Name(), t.name, o.wrong));
    return static_cast<double>(o.ops) / elapsed;
  }

 private:
  Scheduler& sched_;
  uint64_t capacity_;
  int inflight_;
  uint64_t seed_ = 1;
  std::map<uint64_t, std::unique_ptr<bench::ZipfGenerator>> zipfs_;
};

// Page counts of the measured rounds of one tier subject.
struct PageCounts {
  uint64_t hits = 0, skips = 0, pattern = 0, false_pos = 0, rpc_reads = 0, reads = 0;
  void Add(const TieredClientStats& a, const TieredClientStats& b) {  // b - a
    hits += b.one_sided_hits - a.one_sided_hits;
    skips += b.bitmap_skips - a.bitmap_skips;
    pattern += b.pattern_misses - a.pattern_misses;
    false_pos += b.false_positives - a.false_positives;
    rpc_reads += b.rpc_reads - a.rpc_reads;
    reads += b.reads - a.reads;
  }
  uint64_t pages() const { return hits + skips + pattern; }
  double HitRatio() const {
    return pages() ? static_cast<double>(hits) / static_cast<double>(pages()) : std::nan("");
  }
  double FetchedTwice() const {
    return pages() ? static_cast<double>(pattern) / static_cast<double>(pages()) : std::nan("");
  }
  nlohmann::json Json() const {
    return {{"pages_one_sided_hit", hits},
            {"pages_bitmap_skipped", skips},
            {"pages_pattern_miss", pattern},
            {"false_positives", false_pos},
            {"tier_read_rpcs", rpc_reads},
            {"reads", reads},
            {"hit_ratio", bench::json_detail::OrNull(HitRatio())}};
  }
};

struct CaseResult {
  Work work;
  std::vector<Subject*> subjects;
  std::vector<std::vector<double>> rates;  // [subject][round]
  std::vector<PageCounts> pages;           // [subject]
  double Median(size_t i) const { return bench::MedianOf(rates[i]); }
  size_t Index(const Subject* s) const {
    return static_cast<size_t>(std::find(subjects.begin(), subjects.end(), s) - subjects.begin());
  }
  bench::RoundRatios Ratio(const Subject* a, const Subject* b) const {
    return bench::PerRoundRatios(rates[Index(a)], rates[Index(b)]);
  }
};

// Warm-up (each subject on its own, `warm` seconds) then `rounds` rounds, each running every
// subject for `slice` seconds in turn (A B C A B C ...).
Result<CaseResult> RunCase(Runner& r, const Work& w, std::vector<Subject*> subjects, int rounds,
                           double slice, double warm) {
  CaseResult c;
  c.work = w;
  c.subjects = subjects;
  c.rates.assign(subjects.size(), {});
  c.pages.assign(subjects.size(), {});
  fmt::print(
      "case {}: warm-up {:.1f} s per subject that moves data, then {} rounds x {} subjects x "
      "{:.2f} s\n",
      w.Name(), warm, rounds, subjects.size(), slice);
  std::fflush(stdout);
  for (Subject* s : subjects) {
    if (warm > 0 && s->warms) FARMEM_RETURN_IF_ERROR(r.Run(*s, w, warm).status());
  }
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < subjects.size(); ++i) {
      const auto before = subjects[i]->Stats();
      FARMEM_ASSIGN_OR_RETURN(double rate, r.Run(*subjects[i], w, slice));
      if (before) c.pages[i].Add(*before, *subjects[i]->Stats());
      c.rates[i].push_back(rate);
    }
  }
  for (size_t i = 0; i < subjects.size(); ++i) {
    std::vector<std::string> per_round;
    for (double v : c.rates[i]) per_round.push_back(bench::FormatRate(v));
    fmt::print("  {:<22} {:>12}  (rounds {})", subjects[i]->name, bench::FormatRate(c.Median(i)),
               fmt::join(per_round, ", "));
    if (c.pages[i].pages()) fmt::print("  hit ratio {:.3f}", c.pages[i].HitRatio());
    fmt::print("\n");
  }
  std::fflush(stdout);
  return c;
}

nlohmann::json CaseJson(const CaseResult& c, const Subject* ref) {
  nlohmann::json subjects = nlohmann::json::object();
  for (size_t i = 0; i < c.subjects.size(); ++i) {
    nlohmann::json s = {{"rates", c.rates[i]},
                        {"median_ops_per_second", bench::json_detail::OrNull(c.Median(i))},
                        {"description", c.subjects[i]->desc}};
    if (c.pages[i].pages() || c.subjects[i]->Stats()) s["pages"] = c.pages[i].Json();
    if (ref && c.subjects[i] != ref && c.Index(ref) < c.subjects.size()) {
      const auto rr = c.Ratio(c.subjects[i], ref);
      s["ratio_vs_" + ref->name] = bench::json_detail::OrNull(rr.median);
    }
    subjects[c.subjects[i]->name] = s;
  }
  return {{"workload", c.work.Name()},
          {"zipf", c.work.zipf},
          {"size", c.work.size},
          {"write_percent", c.work.write_pct},
          {"subjects", subjects}};
}

// A target judged on the per-round ratio subject / baseline of one case.
TargetRecord RatioTarget(std::string name, const CaseResult& c, const Subject* a, const Subject* b,
                         double limit, std::string detail = "") {
  TargetRecord t;
  t.name = std::move(name);
  t.value = c.Median(c.Index(a));
  t.baseline = c.Median(c.Index(b));
  const auto rr = c.Ratio(a, b);
  t.SetRounds(rr);
  t.limit = fmt::format(">= {}x {}", limit, b->name);
  t.result = rr.ratios.empty() ? TargetResult::kUnknown
                               : (rr.median >= limit ? TargetResult::kPass : TargetResult::kMiss);
  t.detail = detail.empty() ? fmt::format("{}: {} vs {}, per-round {}", c.work.Name(), a->name,
                                          b->name, bench::FormatRoundRatios(rr))
                            : detail;
  return t;
}

// A target on a figure of its own (no baseline): n/a when the figure is missing, else `pass`.
TargetRecord ValueTarget(std::string name, double value, std::string limit, bool pass,
                         std::string detail) {
  TargetRecord t;
  t.name = std::move(name);
  t.value = value;
  t.ratio = value;
  t.limit = std::move(limit);
  t.result = !std::isfinite(value) ? TargetResult::kUnknown
             : pass                ? TargetResult::kPass
                                   : TargetResult::kMiss;
  t.detail = std::move(detail);
  return t;
}

TargetRecord NotMeasured(std::string name, std::string limit, std::string why) {
  TargetRecord t;
  t.name = std::move(name);
  t.limit = std::move(limit);
  t.result = TargetResult::kMiss;
  t.detail = "not measured: " + why;
  return t;
}

// The `tier` section of a server's STAT document (what `farmem stat` shows), as a profile.
Result<nlohmann::json> FetchTierStat(Node& node, Scheduler& s, const std::string& address) {
  FARMEM_ASSIGN_OR_RETURN(PeerInfo peer, node.connect(address));
  std::vector<std::byte> reply(1 << 20);
  auto r = s.block_on(s.rpc(peer.id, RpcImm(kOpStat), {}, reply));
  if (!r.ok()) return r.status().WithContext("STAT " + address);
  auto j = nlohmann::json::parse(
      std::string(reinterpret_cast<const char*>(reply.data()), r->length), nullptr, false);
  if (j.is_discarded() || !j.contains("tier")) return Status::Protocol("STAT without 'tier'");
  return j["tier"];
}

// A forked server with its subject (client) once started.
struct Server {
  std::string name;
  std::unique_ptr<bench::MemoryCgroup> cgroup;  // destroyed after the process stopped
  std::unique_ptr<bench::TargetProcess> process;
  std::string address;
};

}  // namespace

int RunTieredBench(TieredBenchOptions o) {
  if (o.capacity_mib == 0) o.capacity_mib = o.quick ? 256 : 1024;
  if (o.slice_seconds == 0) o.slice_seconds = o.quick ? 0.5 : 1.0;
  const bool matrix = o.matrix < 0 ? !o.quick : o.matrix == 1;
  bench::QuietBenchLogging();
  const TierConfig defaults;  // farmemd's tier defaults: unit, period, fill
  const uint64_t unit = uint64_t{defaults.unit_kib} << 10;
  const uint64_t capacity = o.capacity_mib << 20;
  if (capacity % unit != 0 || capacity / unit < 20) {
    fmt::print(stderr, "{}: --capacity-mib must be a multiple of the {} KiB unit, >= 20 units\n",
               kTieredProg, defaults.unit_kib);
    return 2;
  }
  auto dram = [&](int pct) { return std::max(unit, capacity * pct / 100 / unit * unit); };
  // The hotspot period: farmemd's default unless --tier-period-ms asks for another (experiments).
  const uint32_t period_ms = o.tier_period_ms ? o.tier_period_ms : defaults.period_ms;
  const double period_s = period_ms / 1000.0;
  const double warm = o.warmup_periods * period_s;

  auto dir = bench::PickDataDir(o.dir);
  if (!dir.ok()) {
    fmt::print(stderr, "{}: {}\n", kTieredProg, dir.status().ToString());
    return 2;
  }
  struct DirGuard {
    std::string d;
    ~DirGuard() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } dir_guard{*dir};

  auto fail = [&](const Status& st) {
    fmt::print(stderr, "{}: {}\n", kTieredProg, st.ToString());
    return 1;
  };
  nlohmann::json machine = bench::MachineInfo();
  fmt::print(
      "{}: region {} MiB in {} KiB units, period {} ms, fill {} %, {} in flight, {} "
      "rounds x {:.2f} s, steady state after {} periods; files in {}\n",
      kTieredProg, o.capacity_mib, defaults.unit_kib, period_ms, defaults.fill_percent, o.inflight,
      o.rounds, o.slice_seconds, o.warmup_periods, *dir);
  if (auto busy = bench::CpuBusyFraction(std::chrono::milliseconds(200))) {
    machine["cpu_busy_before_run"] = *busy;
    if (*busy > 0.25)
      fmt::print("WARNING: {:.0f}% of the CPUs were busy before the run; figures will be noisy.\n",
                 *busy * 100);
  }

  // The machine's own disk figure, before anything else uses the disk.
  nlohmann::json disk = nlohmann::json::object();
  for (int depth : {32, 1}) {
    auto iops = bench::FioRandomReadIops(*dir, o.quick ? 2 : 5, depth);
    if (!iops.ok()) {
      fmt::print("disk: fio skipped: {}\n", iops.status().ToString());
      disk = {{"fio_skipped", iops.status().ToString()}};
      break;
    }
    fmt::print("disk: fio 4 KiB random read, O_DIRECT, iodepth {}: {:.0f} IOPS ({:.0f} MiB/s)\n",
               depth, *iops, *iops * 4096 / (1 << 20));
    disk[fmt::format("fio_4k_randread_direct_iops_qd{}", depth)] = *iops;
  }

  // Data files: one shared by every O_DIRECT tier server (writes always store DataWord, so they
  // never change a byte), and one each for the two page-cache users, so neither finds the
  // other's pages cached.
  const std::string base_file = *dir + "/tier.dat";
  const std::string rpc_file = *dir + "/tier-rpc.dat";
  const std::string mmap_file = *dir + "/mmap.dat";
  const std::string plain_file = *dir + "/mmap-plain.dat";
  for (const auto& f : {base_file, rpc_file, mmap_file, plain_file}) {
    if (Status st = bench::WriteDataFile(f, capacity); !st.ok()) {
      fmt::print(stderr, "{}: {}\n", kTieredProg, st.ToString());
      return 1;
    }
  }

  // ---- Servers: all forked before this process starts a thread -----------------------------
  auto tier = [&](std::string file, int pct, TierMode mode, uint32_t fill) {
    TierConfig t;
    t.file = std::move(file);
    t.capacity_bytes = capacity;
    t.dram_bytes = dram(pct);
    t.mode = mode;
    t.fill_percent = fill;
    t.period_ms = period_ms;
    return t;
  };
  struct Planned {
    std::string name, desc;
    bench::TargetRole role;
    bool cgroup = false;
  };
  const uint32_t fill = defaults.fill_percent;
  std::vector<Planned> plan = {
      {"all-dram", "tier mode tiering, DRAM 100 %, fill 100 %: every unit resident from the start",
       bench::TierServerRole(tier(base_file, 100, TierMode::kTiering, 100))},
      {"tier-20", "tier mode full, DRAM 20 %",
       bench::TierServerRole(tier(base_file, 20, TierMode::kFull, fill))},
      {"tier-50", "tier mode full, DRAM 50 %",
       bench::TierServerRole(tier(base_file, 50, TierMode::kFull, fill))},
      {"tier-100", "tier mode full, DRAM 100 %",
       bench::TierServerRole(tier(base_file, 100, TierMode::kFull, fill))},
      {"ladder-rpc", "tier mode rpc (buffered IO), process in a memory cgroup of the 50 % budget",
       bench::TierServerRole(tier(rpc_file, 50, TierMode::kRpc, fill)), true},
      {"ladder-rpc-direct", "tier mode rpc-direct, DRAM 50 %",
       bench::TierServerRole(tier(base_file, 50, TierMode::kRpcDirect, fill))},
      {"ladder-tiering", "tier mode tiering, DRAM 50 %",
       bench::TierServerRole(tier(base_file, 50, TierMode::kTiering, fill))},
      {"ladder-hotspot", "tier mode hotspot, DRAM 50 %",
       bench::TierServerRole(tier(base_file, 50, TierMode::kHotspot, fill))},
      {"mmap",
       "file mmap, MADV_RANDOM, in a memory cgroup of the 50 % budget: MMAP_READ RPC and "
       "one-sided",
       bench::MmapServerRole(mmap_file, capacity, true), true},
      {"mmap-plain",
       "file mmap with the kernel's default readahead (what a user builds first), in a memory "
       "cgroup of the 50 % budget: MMAP_READ RPC and one-sided",
       bench::MmapServerRole(plain_file, capacity, false), true},
  };
  std::vector<Server> servers;
  for (auto& p : plan) {
    auto proc = bench::TargetProcess::Fork(p.name, p.role);
    if (!proc.ok()) {
      fmt::print(stderr, "{}: cannot fork {}: {}\n", kTieredProg, p.name, proc.status().ToString());
      return 1;
    }
    servers.push_back(Server{p.name, nullptr, std::move(*proc), ""});
  }

  // Memory cgroups of the 50 % budget for the page-cache users.
  std::string cgroup_skip;
  nlohmann::json cgroup_json;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (!plan[i].cgroup) continue;
    auto cg = bench::MemoryCgroup::Create(
        fmt::format("farmem-tiered-{}-{}", ::getpid(), plan[i].name), dram(50));
    if (!cg.ok()) {
      cgroup_skip = cg.status().ToString();
      break;
    }
    if (Status st = (*cg)->Add(servers[i].process->pid()); !st.ok()) {
      cgroup_skip = st.ToString();
      break;
    }
    cgroup_json[plan[i].name] = {
        {"path", (*cg)->path()}, {"kind", (*cg)->kind()}, {"limit_bytes", (*cg)->limit()}};
    servers[i].cgroup = std::move(*cg);
  }
  if (!cgroup_skip.empty()) {
    fmt::print("cgroup: unavailable, the cgroup baselines are not measured: {}\n", cgroup_skip);
    cgroup_json = {{"skipped", cgroup_skip}};
  } else {
    fmt::print("cgroup: {} memory cgroups of {} MiB for the mmap servers and tier mode rpc\n",
               servers.back().cgroup->kind(), dram(50) >> 20);
  }
  const bool have_cgroup = cgroup_skip.empty();

  for (size_t i = 0; i < servers.size(); ++i) {
    if (plan[i].cgroup && !have_cgroup) continue;  // its figures would not be what they claim
    auto ready = servers[i].process->Start(kStartTimeout);
    if (!ready.ok()) {
      fmt::print(stderr, "{}: {} did not start: {}\n", kTieredProg, servers[i].name,
                 ready.status().ToString());
      return 1;
    }
    servers[i].address = *ready;
  }

  // ---- Clients ----------------------------------------------------------------------------
  bench::ObjectsServerSetup client_setup;                // tcp
  client_setup.token = TransportConfig().cluster_token;  // the servers run the default token
  auto node = bench::MakeObjectsClientNode(client_setup, "tiered-bench");
  if (!node.ok()) {
    fmt::print(stderr, "{}: {}\n", kTieredProg, node.status().ToString());
    return 1;
  }
  auto sched = (*node)->make_scheduler();
  if (!sched.ok()) {
    fmt::print(stderr, "{}: {}\n", kTieredProg, sched.status().ToString());
    return 1;
  }
  std::map<std::string, std::unique_ptr<Subject>> subjects;
  for (size_t i = 0; i < servers.size(); ++i) {
    if (servers[i].address.empty()) continue;
    if (servers[i].name.starts_with("mmap")) {
      const std::string suffix = servers[i].name == "mmap" ? "" : "-plain";
      auto peer = (*node)->connect(servers[i].address);
      if (!peer.ok()) {
        fmt::print(stderr, "{}: mmap server: {}\n", kTieredProg, peer.status().ToString());
        return 1;
      }
      RegionKey key = 0;
      for (const auto& r : peer->regions)
        if (r.name == bench::kMmapRegionName) key = r.key;
      if (key == 0) return fail(Status::NotFound("mmap server exports no region 'mmap'"));
      auto rpc = std::make_unique<MmapRpcSubject>(peer->id);
      rpc->name = "cgroup-mmap-rpc" + suffix;
      rpc->desc = plan[i].desc + " (read by MMAP_READ)";
      auto os = std::make_unique<MmapOneSidedSubject>(RemoteRef{peer->id, key, 0});
      os->name = "cgroup-mmap-one-sided" + suffix;
      os->desc = plan[i].desc + " (read one-sidedly)";
      subjects[rpc->name] = std::move(rpc);
      subjects[os->name] = std::move(os);
      continue;
    }
    TieredClientOptions copts;
    copts.period = std::chrono::milliseconds(o.client_refresh_ms);
    auto c = TieredClient::Connect(**node, servers[i].address, copts);
    if (!c.ok()) {
      fmt::print(stderr, "{}: {}: {}\n", kTieredProg, servers[i].name, c.status().ToString());
      return 1;
    }
    auto s = std::make_unique<TierSubject>(std::move(*c));
    s->name = servers[i].name;
    s->desc = plan[i].desc;
    s->warms =
        s->name != "all-dram" && s->name != "ladder-tiering" && s->name != "ladder-rpc-direct";
    subjects[s->name] = std::move(s);
  }
  auto S = [&](const std::string& n) -> Subject* {
    auto it = subjects.find(n);
    return it == subjects.end() ? nullptr : it->second.get();
  };
  Subject* all = S("all-dram");
  Subject* t20 = S("tier-20");
  Subject* t50 = S("tier-50");
  Subject* t100 = S("tier-100");
  Subject* mrpc = S("cgroup-mmap-rpc");
  Subject* mos = S("cgroup-mmap-one-sided");
  Subject* prpc = S("cgroup-mmap-rpc-plain");
  Subject* pos = S("cgroup-mmap-one-sided-plain");

  Runner runner(**sched, capacity, o.inflight);
  std::vector<TargetRecord> targets;
  nlohmann::json cases = nlohmann::json::array();

  // ---- Case 1: 4 KiB Zipf reads: DRAM levels, cgroup baselines, the ladder -----------------
  const Work zipf4k{true, 4096, 0};
  std::vector<Subject*> case1 = {t50, all, t20, t100};
  if (mrpc) case1.insert(case1.end(), {mrpc, mos, prpc, pos});
  // The rungs of --tier-mode in order, each with the subject that runs it (`full` is tier-50).
  const std::vector<std::pair<std::string, std::string>> rungs = {
      {"rpc", "ladder-rpc"},
      {"rpc-direct", "ladder-rpc-direct"},
      {"tiering", "ladder-tiering"},
      {"hotspot", "ladder-hotspot"},
      {"full", "tier-50"}};
  std::vector<std::pair<std::string, Subject*>> ladder;  // the rungs that have a server
  for (const auto& [mode, n] : rungs) {
    if (S(n) == nullptr) continue;
    ladder.emplace_back(mode, S(n));
    if (std::find(case1.begin(), case1.end(), S(n)) == case1.end()) case1.push_back(S(n));
  }
  auto c1 = RunCase(runner, zipf4k, case1, o.rounds, o.slice_seconds, warm);
  if (!c1.ok()) return fail(c1.status());
  cases.push_back(CaseJson(*c1, all));
  // What a perfect hotspot policy would hit with the same budget and fill (information).
  nlohmann::json oracle = nlohmann::json::object();
  for (int pct : {20, 50, 100}) {
    const uint64_t items = capacity / zipf4k.size;
    // As the server's policy: every unit when the budget holds them all, else budget x fill.
    const uint64_t budget_units = dram(pct) / unit, all_units = capacity / unit;
    const uint64_t target =
        budget_units >= all_units ? all_units : budget_units * defaults.fill_percent / 100;
    const double h = bench::OracleHitRatio(items, zipf4k.size, unit, target, runner.Zipf(items));
    oracle[fmt::format("dram{}", pct)] = h;
    fmt::print("  oracle hit ratio, DRAM {} %, fill {} %: {:.3f}\n", pct, defaults.fill_percent, h);
  }
  {
    const PageCounts& p = c1->pages[c1->Index(t50)];
    targets.push_back(ValueTarget(
        "hit_ratio_4k_zipf_dram50", p.HitRatio(), ">= 0.85", p.HitRatio() >= 0.85,
        fmt::format(
            "pages read one-sidedly {} of {} (bitmap skips {}, pattern misses {}); oracle {:.3f}",
            p.hits, p.pages(), p.skips, p.pattern, oracle["dram50"].get<double>())));
  }
  targets.push_back(RatioTarget("throughput_4k_zipf_dram50_vs_all_dram", *c1, t50, all, 0.80));
  targets.push_back(RatioTarget("throughput_4k_zipf_dram20_vs_all_dram", *c1, t20, all, 0.60));
  {
    TargetRecord t = RatioTarget("overhead_4k_zipf_dram100_vs_all_dram", *c1, t100, all, 0.98);
    t.limit = "overhead <= 2 % (>= 0.98x all-dram)";
    targets.push_back(t);
    const PageCounts& p = c1->pages[c1->Index(t100)];
    targets.push_back(ValueTarget(
        "reads_fetched_twice_4k_zipf_dram100", p.FetchedTwice(), "< 0.0005 (0.05 %)",
        p.FetchedTwice() < 0.0005,
        fmt::format("pages read one-sidedly then fetched by TIER_READ (pattern): {} of {}",
                    p.pattern, p.pages())));
  }
  if (mrpc) {
    targets.push_back(
        RatioTarget("throughput_4k_zipf_dram50_vs_cgroup_mmap_rpc", *c1, t50, mrpc, 5.0));
    targets.push_back(
        RatioTarget("throughput_4k_zipf_dram50_vs_cgroup_mmap_one_sided", *c1, t50, mos, 5.0));
    targets.push_back(
        RatioTarget("throughput_4k_zipf_dram50_vs_cgroup_mmap_rpc_plain", *c1, t50, prpc, 5.0));
    targets.push_back(RatioTarget("throughput_4k_zipf_dram50_vs_cgroup_mmap_one_sided_plain", *c1,
                                  t50, pos, 5.0));
  } else {
    for (const char* n : {"rpc", "one_sided", "rpc_plain", "one_sided_plain"})
      targets.push_back(NotMeasured(fmt::format("throughput_4k_zipf_dram50_vs_cgroup_mmap_{}", n),
                                    ">= 5x", "cgroups unavailable: " + cgroup_skip));
  }
  nlohmann::json ladder_json = nlohmann::json::array();
  {
    TargetRecord t;
    t.name = "ablation_ladder_monotone";
    t.limit = ">= 1.0x the step before, every step";
    double worst = std::numeric_limits<double>::infinity();
    std::vector<std::string> steps;
    for (size_t i = 0; i < ladder.size(); ++i) {
      const auto& [mode, subject] = ladder[i];
      nlohmann::json step = {{"mode", mode},
                             {"subject", subject->name},
                             {"median_ops_per_second", c1->Median(c1->Index(subject))}};
      if (i > 0) {
        const auto rr = c1->Ratio(subject, ladder[i - 1].second);
        step["ratio_vs_previous"] = bench::json_detail::OrNull(rr.median);
        worst = std::min(worst, rr.ratios.empty() ? 0.0 : rr.median);
        steps.push_back(fmt::format("{} {}", subject->name, bench::FormatRoundRatios(rr)));
      }
      ladder_json.push_back(step);
    }
    if (ladder.size() != rungs.size()) {
      t = NotMeasured(t.name, t.limit,
                      "a step of the ladder has no server (cgroup for rpc: " + cgroup_skip + ")");
    } else {
      t.value = worst;
      t.ratio = worst;
      t.result = worst >= 1.0 ? TargetResult::kPass : TargetResult::kMiss;
      t.detail = "per step vs the step before: " + fmt::format("{}", fmt::join(steps, "; "));
    }
    targets.push_back(t);
  }

  // ---- Hot-set move on tier-50 (4 KiB Zipf reads, steady after case 1) ---------------------
  nlohmann::json timeline;
  {
    const double pre = 3 * period_s, post = std::max(5.0, 2 * period_s) + 2 * period_s;
    const int64_t bucket_ms = 250;
    fmt::print("hot-set move: {} {:.0f} s, key k -> n-1-k after {:.0f} s\n", t50->name, pre + post,
               pre);
    std::fflush(stdout);
    SliceOut out;
    auto rate = runner.Run(*t50, zipf4k, pre + post, &out, pre, bucket_ms);
    if (!rate.ok()) return fail(rate.status());
    const int64_t move_ms = static_cast<int64_t>(pre * 1000);
    // Skip the first period of the "before" window: the previous case's last slice ended on
    // another subject, so the first buckets include a cold start of the coroutines.
    const size_t skip = static_cast<size_t>(period_s * 1000 / bucket_ms);
    auto dip = bench::SummarizeTimeline(out.buckets, bucket_ms, move_ms, move_ms + 5000, skip);
    auto rec = bench::SummarizeTimeline(out.buckets, bucket_ms, move_ms, move_ms, skip);
    out.buckets.pop_back();  // the partial bucket at the end
    timeline = {{"subject", t50->name},
                {"bucket_ms", bucket_ms},
                {"move_ms", move_ms},
                {"ops_per_bucket", out.buckets},
                {"before_mean", dip.before_mean},
                {"dip_5s", dip.dip},
                {"recovered_after_ms", rec.recovered_after_ms}};
    targets.push_back(ValueTarget(
        "hot_set_move_dip_over_5s", dip.missing.empty() ? dip.dip : std::nan(""), "<= 0.10",
        dip.dip <= 0.10,
        fmt::format("mean of the 5 s after the move {:.0f} vs before {:.0f} ops/bucket {}",
                    dip.during_mean, dip.before_mean, dip.missing)));
    TargetRecord r;
    r.name = "hot_set_move_recovery_95pct";
    r.value = static_cast<double>(rec.recovered_after_ms);
    r.baseline = 2.0 * period_ms;
    r.limit = fmt::format("back to >= 95 % within two periods ({} ms)", 2 * period_ms);
    r.result = !rec.missing.empty() ? TargetResult::kUnknown
               : (rec.recovered_after_ms >= 0 &&
                  rec.recovered_after_ms <= 2 * static_cast<int64_t>(period_ms))
                   ? TargetResult::kPass
                   : TargetResult::kMiss;
    r.detail = fmt::format("first {} ms bucket at >= 95 % of before starts {} ms after the move",
                           bucket_ms, rec.recovered_after_ms);
    targets.push_back(r);
    fmt::print("  dip over 5 s {:.3f}, recovered to 95 % after {} ms\n", dip.dip,
               rec.recovered_after_ms);
  }

  // ---- 64 B Zipf reads and 4 KiB Zipf 50 % writes at 50 % DRAM ---------------------------
  {
    const Work w{true, 64, 0};
    auto c = RunCase(runner, w, {t50, all}, o.rounds, o.slice_seconds, warm);
    if (!c.ok()) return fail(c.status());
    cases.push_back(CaseJson(*c, all));
    targets.push_back(RatioTarget("throughput_64b_zipf_dram50_vs_all_dram", *c, t50, all, 0.60));
  }
  {
    const Work w{true, 4096, 50};
    auto c = RunCase(runner, w, {t50, all}, o.rounds, o.slice_seconds, warm);
    if (!c.ok()) return fail(c.status());
    cases.push_back(CaseJson(*c, all));
    targets.push_back(
        RatioTarget("throughput_4k_zipf_50pct_writes_dram50_vs_all_dram", *c, t50, all, 0.60));
  }

  // ---- The workload matrix (information) --------------------------------------------------
  if (matrix) {
    for (bool z : {false, true})
      for (uint32_t size : {64u, 4096u, 16384u})
        for (int wp : {0, 50}) {
          const Work w{z, size, wp};
          auto c = RunCase(runner, w, {all, t20, t50, t100}, o.rounds, o.slice_seconds, warm);
          if (!c.ok()) return fail(c.status());
          auto j = CaseJson(*c, all);
          j["matrix"] = true;
          cases.push_back(j);
        }
  }

  // ---- Report ----------------------------------------------------------------------------
  nlohmann::json server_stats = nlohmann::json::object();
  fmt::print("\nServer counters (STAT tier):\n");
  for (const auto& sv : servers) {
    if (sv.address.empty() || sv.name.starts_with("mmap")) continue;
    auto st = FetchTierStat(**node, **sched, sv.address);
    if (!st.ok()) {
      fmt::print("  {}: {}\n", sv.name, st.status().ToString());
      continue;
    }
    const auto& j = *st;
    fmt::print(
        "  {:<18} resident {}/{} units, periods {}, promotions {}, demotions {}, "
        "TIER_READs {} ({} from DRAM, {} from the file), file read {:.1f} MiB\n",
        sv.name, j.value("resident_units", uint64_t{0}), j.value("budget_units", uint64_t{0}),
        j.value("periods", uint64_t{0}), j.value("promotions", uint64_t{0}),
        j.value("demotions", uint64_t{0}), j.value("rpc_reads", uint64_t{0}),
        j.value("reads_dram", uint64_t{0}), j.value("reads_file", uint64_t{0}),
        j.value("io_read_bytes", uint64_t{0}) / 1048576.0);
    server_stats[sv.name] = j;
  }
  for (const auto& sv : servers)
    if (sv.cgroup)
      fmt::print("  {:<18} cgroup usage {:.1f} MiB, peak {:.1f} MiB of {:.0f} MiB\n", sv.name,
                 sv.cgroup->Usage() / 1048576.0, sv.cgroup->PeakUsage() / 1048576.0,
                 sv.cgroup->limit() / 1048576.0);
  fmt::print("\nTargets:\n");
  for (const auto& t : targets)
    fmt::print("  {:<4} {:<52} {}  [{}]\n", bench::TargetResultName(t.result), t.name,
               t.ratio                  ? fmt::format("{:.4g}", *t.ratio)
               : std::isfinite(t.value) ? fmt::format("{:.4g}", t.value)  // e.g. ms, no ratio
                                        : std::string("n/a"),
               t.limit);
  for (const auto& t : targets)
    if (!t.detail.empty()) fmt::print("  {}: {}\n", t.name, t.detail);
  nlohmann::json servers_json = nlohmann::json::object();
  for (const auto& p : plan) servers_json[p.name] = p.desc;
  nlohmann::json doc = {
      {"benchmark", "tiered"},
      {"machine", machine},
      {"config",
       {{"quick", o.quick},
        {"capacity_bytes", capacity},
        {"unit_bytes", unit},
        {"period_ms", period_ms},
        {"client_refresh_ms",
         o.client_refresh_ms != 0
             ? o.client_refresh_ms
             : std::max<uint32_t>(1, period_ms / TieredClientOptions::kRefreshesPerPeriod)},
        {"fill_percent", defaults.fill_percent},
        {"rounds", o.rounds},
        {"slice_seconds", o.slice_seconds},
        {"inflight", o.inflight},
        {"warmup_periods", o.warmup_periods},
        {"zipf_theta", kZipfTheta},
        {"matrix", matrix},
        {"transport", "tcp"},
        {"client_threads", 1}}},
      {"disk", disk},
      {"cgroup", cgroup_json},
      {"servers", servers_json},
      {"cases", cases},
      {"server_stats", server_stats},
      {"ladder", ladder_json},
      {"oracle_hit_ratio_4k_zipf", oracle},
      {"hot_set_move", timeline},
      {"targets", bench::TargetsJson(targets)}};
  if (!o.json_path.empty()) {
    if (Status st = bench::WriteJsonFile(o.json_path, doc); !st.ok()) return fail(st);
    fmt::print("wrote {}\n", o.json_path);
  }
  subjects.clear();  // clients before the servers
  for (auto& s : servers) s.process->Stop();
  return 0;
}

}  // namespace farmem
