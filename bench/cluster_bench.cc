// `farmem bench cluster`: starts a local etcd, a 3-node cluster of watchers and a probe member, and
// measures (1) the time from a membership change (join / leave) to the last of the 3 watchers
// seeing it and (2) metadata get/put latency; baselines, interleaved round by round: 3 etcdctl
// watch processes seeing one put, and etcdctl get/put (one process per operation, as scripts use
// it; etcdctl's own start-up time is measured beside it) and etcd's Go client clientv3 in one
// process (bench/etcd_baseline, built with `go build` at the start). Threads: the main thread
// drives the rounds; watch callbacks run on the Cluster's threads and only append to a locked log.
#include "cluster_bench.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_json.h"
#include "bench_stats.h"
#include "cluster/testing/etcd_process.h"
#include "farmem/cluster.h"
#include "machine_info.h"

extern char** environ;

namespace farmem {
namespace {

constexpr const char* kClusterProg = "farmem bench cluster";
constexpr const char* kClusterName = "bench";
using Clock = std::chrono::steady_clock;

int64_t NsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

// Starts argv with stdout to `stdout_fd` (-1: /dev/null) and stderr to /dev/null.
Result<pid_t> Spawn(const std::vector<std::string>& args, int stdout_fd) {
  std::vector<char*> argv;
  std::vector<std::string> copy = args;
  for (auto& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (stdout_fd >= 0) {
    posix_spawn_file_actions_adddup2(&fa, stdout_fd, STDOUT_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  }
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Status::FromErrno(fmt::format("starting {}", args[0]), rc);
  return pid;
}

// Runs a tool to completion; returns its wall time in ns, or an error if it failed.
Result<int64_t> TimeTool(const std::vector<std::string>& args) {
  auto t0 = Clock::now();
  auto pid = Spawn(args, -1);
  if (!pid.ok()) return pid.status();
  int status = 0;
  if (::waitpid(*pid, &status, 0) != *pid) return Status::FromErrno("waitpid", errno);
  int64_t ns = NsSince(t0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Status::IoError(
        fmt::format("{} {} failed (status {})", args[0], args.size() > 1 ? args[1] : "", status));
  return ns;
}

// Runs a tool to completion and returns its stdout (error if it failed or printed > 64 MiB).
Result<std::string> CaptureTool(const std::vector<std::string>& args) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe", errno);
  auto pid = Spawn(args, fds[1]);
  ::close(fds[1]);
  if (!pid.ok()) {
    ::close(fds[0]);
    return pid.status();
  }
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > (64u << 20)) break;
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(*pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Status::IoError(fmt::format("{} failed (status {})", args[0], status));
  return out;
}

// One `etcdctl watch --prefix P` process whose output lines are read back to time deliveries.
class ToolWatcher {
 public:
  static Result<std::unique_ptr<ToolWatcher>> Start(const std::string& etcdctl,
                                                    const std::string& endpoint,
                                                    const std::string& prefix) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return Status::FromErrno("pipe", errno);
    auto pid = Spawn({etcdctl, "--endpoints=" + endpoint, "watch", "--prefix", prefix}, fds[1]);
    ::close(fds[1]);
    if (!pid.ok()) {
      ::close(fds[0]);
      return pid.status();
    }
    auto w = std::unique_ptr<ToolWatcher>(new ToolWatcher());
    w->pid_ = *pid;
    w->fd_ = fds[0];
    return w;
  }
  ~ToolWatcher() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }

  // Waits for a line equal to `line`; returns when it was read (or an error at the deadline).
  Result<Clock::time_point> WaitForLine(const std::string& line, Clock::time_point deadline) {
    for (;;) {
      size_t nl;
      while ((nl = buf_.find('\n')) != std::string::npos) {
        std::string got = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        if (got == line) return Clock::now();
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return Status::TimedOut("etcdctl watch did not print " + line);
      pollfd p{fd_, POLLIN, 0};
      int n = ::poll(&p, 1, static_cast<int>(left.count()));
      if (n < 0 && errno != EINTR) return Status::FromErrno("poll", errno);
      if (n <= 0) continue;
      char tmp[4096];
      ssize_t r = ::read(fd_, tmp, sizeof tmp);
      if (r == 0) return Status::Unavailable("etcdctl watch exited");
      if (r < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno("read", errno);
      }
      buf_.append(tmp, static_cast<size_t>(r));
    }
  }

 private:
  ToolWatcher() = default;
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buf_;
};

// Member events seen by the watcher nodes, keyed by "<type>/<member>", one time per watcher.
class EventLog {
 public:
  void Record(int watcher, const ClusterMemberEvent& e) {
    std::string k = Key(e.type, e.member.name);
    std::lock_guard lock(mu_);
    seen_[k][watcher] = Clock::now();
    cv_.notify_all();
  }
  // The time the last of `watchers` saw the event, or an error at the deadline.
  Result<Clock::time_point> WaitAll(ClusterMemberEvent::Type type, const std::string& name,
                                    int watchers, Clock::time_point deadline) {
    std::string k = Key(type, name);
    std::unique_lock lock(mu_);
    if (!cv_.wait_until(lock, deadline,
                        [&] { return seen_[k].size() >= static_cast<size_t>(watchers); }))
      return Status::TimedOut(
          fmt::format("{} seen by {} of {} watchers", k, seen_[k].size(), watchers));
    Clock::time_point last{};
    for (auto& [w, t] : seen_[k]) last = std::max(last, t);
    seen_.erase(k);
    return last;
  }

 private:
  static std::string Key(ClusterMemberEvent::Type type, const std::string& name) {
    const char* t = type == ClusterMemberEvent::Type::kJoin    ? "join"
                    : type == ClusterMemberEvent::Type::kLeave ? "leave"
                                                               : "expire";
    return fmt::format("{}/{}", t, name);
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::map<int, Clock::time_point>> seen_;
};

struct Samples {
  std::vector<int64_t> ns;
  double p50_ms() const {
    auto v = ns;
    return bench::Percentile(v, 50) / 1e6;
  }
  double p99_ms() const {
    auto v = ns;
    return bench::Percentile(v, 99) / 1e6;
  }
};

struct Round {
  Samples tool_watch;                 // a put seen by 3 etcdctl watchers
  Samples member_change;              // a join or leave seen by 3 farmem watchers
  Samples member_join, member_leave;  // the same, split: a join is two writes (lease + txn)
  Samples tool_get, tool_put, tool_start;
  Samples get, put;
  Samples go_get, go_put;  // clientv3 in one process (empty when the Go baseline is unavailable)
};

struct Check {
  std::string name;
  double value = 0, baseline = 0, factor = 0;
  bench::RoundRatios ratios;
  std::string unit, detail;
  bench::TargetResult result = bench::TargetResult::kUnknown;
};

nlohmann::json SamplesJson(const Samples& s) {
  return {{"count", s.ns.size()}, {"p50_ms", s.p50_ms()}, {"p99_ms", s.p99_ms()}};
}

Status Validate(ClusterBenchOptions& o) {
  if (o.rounds < 5) return Status::InvalidArgument("--rounds must be at least 5");
  if (o.changes == 0) o.changes = o.quick ? 16 : 40;
  if (o.ops == 0) o.ops = o.quick ? 50 : 200;
  if (o.tool_ops == 0) o.tool_ops = o.quick ? 8 : 20;
  if (o.changes < 2 || o.ops < 1 || o.tool_ops < 1)
    return Status::InvalidArgument("--changes must be >= 2, --ops and --tool-ops >= 1");
  if (::access(o.etcd.c_str(), X_OK) != 0)
    return Status::NotFound(
        o.etcd + " not found or not executable (apt install etcd-server, or --etcd PATH)");
  if (::access(o.etcdctl.c_str(), X_OK) != 0)
    return Status::NotFound(
        o.etcdctl + " not found or not executable (apt install etcd-client, or --etcdctl PATH)");
  return Status::OK();
}

class Bench {
 public:
  explicit Bench(const ClusterBenchOptions& o) : o_(o) {}

  Status Setup() {
    ::setenv("FARMEM_ETCD", o_.etcd.c_str(), 1);
    fmt::print("starting a local etcd ({})...\n", o_.etcd);
    FARMEM_RETURN_IF_ERROR(etcd_.Start());
    ClusterOptions co;
    co.url = etcd_.url();
    co.cluster_name = kClusterName;
    co.create_if_missing = true;
    for (int i = 0; i < 3; ++i) {
      FARMEM_ASSIGN_OR_RETURN(auto c, Cluster::Open(co));
      ClusterMember self;
      self.name = fmt::format("node-{}", i + 1);
      self.roles = {"memory"};
      FARMEM_RETURN_IF_ERROR(c->join(self));
      FARMEM_ASSIGN_OR_RETURN(
          auto w, c->watch_members([this, i](const ClusterMemberEvent& e) { log_.Record(i, e); }));
      watches_.push_back(std::move(w));
      nodes_.push_back(std::move(c));
    }
    FARMEM_ASSIGN_OR_RETURN(probe_, Cluster::Open(co));
    for (int i = 0; i < 3; ++i) {
      FARMEM_ASSIGN_OR_RETURN(auto w,
                              ToolWatcher::Start(o_.etcdctl, etcd_.endpoint(), ToolPrefix()));
      tool_watchers_.push_back(std::move(w));
    }
    // Warm-up: every etcdctl watch is established (prints the key) and every connection is open.
    for (int i = 0;; ++i) {
      std::string key = fmt::format("probe/warmup-{}", i);
      FARMEM_RETURN_IF_ERROR(probe_->put(key, "x").status());
      bool all = true;
      for (auto& w : tool_watchers_)
        all = all && w->WaitForLine(ToolPrefix() + key.substr(6),
                                    Clock::now() + std::chrono::milliseconds(500))
                         .ok();
      if (all) break;
      if (i == 20) return Status::TimedOut("etcdctl watch processes did not start within 10 s");
    }
    fmt::print("etcd at {}; 3 watcher nodes joined; 3 etcdctl watch processes ready\n",
               etcd_.url());
    BuildGoBaseline();
    fmt::print("\n");
    return Status::OK();
  }

  // The clientv3 baseline: --go-baseline, else `go build` of bench/etcd_baseline. Without Go the
  // clientv3 targets are reported as n/a (and why); the others still run.
  void BuildGoBaseline() {
    if (!o_.go_baseline.empty()) {
      go_baseline_ = o_.go_baseline;
      return;
    }
    std::string src = std::string(FARMEM_SOURCE_DIR) + "/bench/etcd_baseline";
    if (::access((src + "/main.go").c_str(), R_OK) != 0) {
      go_missing_ = src + "/main.go not found (pass --go-baseline PATH)";
      return;
    }
    char tmpl[] = "/tmp/farmem-etcd-baseline-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) {
      go_missing_ = "mkdtemp failed";
      return;
    }
    std::string bin = std::string(tmpl) + "/etcd_baseline";
    fmt::print("building the clientv3 baseline (go build in {})...\n", src);
    std::fflush(stdout);
    std::string cmd =
        fmt::format("cd '{}' && go build -o '{}' . >'{}/build.log' 2>&1", src, bin, tmpl);
    if (std::system(cmd.c_str()) != 0) {
      go_missing_ = fmt::format("go build of {} failed (see {}/build.log)", src, tmpl);
      fmt::print("  {}\n", go_missing_);
      return;
    }
    go_baseline_ = bin;
  }

  const std::string& go_missing() const { return go_missing_; }

  Status RunRound(int r, Round& out) {
    // Baseline A: one put of a metadata key, seen by 3 etcdctl watch processes.
    for (int i = 0; i < o_.changes; ++i) {
      std::string key = fmt::format("probe/r{}-{}", r, i);
      auto t0 = Clock::now();
      FARMEM_RETURN_IF_ERROR(probe_->put(key, "x").status());
      Clock::time_point last = t0;
      for (auto& w : tool_watchers_) {
        FARMEM_ASSIGN_OR_RETURN(auto t, w->WaitForLine(ToolPrefix() + key.substr(6),
                                                       Clock::now() + std::chrono::seconds(5)));
        last = std::max(last, t);
      }
      out.tool_watch.ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(last - t0).count());
    }
    // Subject B: the probe joins and leaves, seen by the 3 watcher nodes.
    for (int i = 0; i < o_.changes / 2; ++i) {
      ClusterMember m;
      m.name = fmt::format("probe-r{}-{}", r, i);
      m.roles = {"client"};
      auto t0 = Clock::now();
      FARMEM_RETURN_IF_ERROR(probe_->join(m));
      FARMEM_ASSIGN_OR_RETURN(auto tj, log_.WaitAll(ClusterMemberEvent::Type::kJoin, m.name, 3,
                                                    Clock::now() + std::chrono::seconds(5)));
      out.member_change.ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(tj - t0).count());
      out.member_join.ns.push_back(out.member_change.ns.back());
      t0 = Clock::now();
      FARMEM_RETURN_IF_ERROR(probe_->leave());
      FARMEM_ASSIGN_OR_RETURN(auto tl, log_.WaitAll(ClusterMemberEvent::Type::kLeave, m.name, 3,
                                                    Clock::now() + std::chrono::seconds(5)));
      out.member_change.ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(tl - t0).count());
      out.member_leave.ns.push_back(out.member_change.ns.back());
    }
    // Baseline A: etcdctl get / put, one process per operation; and its bare start-up.
    const std::string ep = "--endpoints=" + etcd_.endpoint();
    const std::string value(100, 'v');
    for (int i = 0; i < o_.tool_ops; ++i) {
      std::string key = fmt::format("{}kv/{}", MetaPrefix(), i % 16);
      FARMEM_ASSIGN_OR_RETURN(auto p, TimeTool({o_.etcdctl, ep, "put", key, value}));
      out.tool_put.ns.push_back(p);
      FARMEM_ASSIGN_OR_RETURN(auto g, TimeTool({o_.etcdctl, ep, "get", key}));
      out.tool_get.ns.push_back(g);
      FARMEM_ASSIGN_OR_RETURN(auto v, TimeTool({o_.etcdctl, "version"}));
      out.tool_start.ns.push_back(v);
    }
    // Baseline A': clientv3 in one process, the same operations.
    if (!go_baseline_.empty()) {
      FARMEM_ASSIGN_OR_RETURN(auto text,
                              CaptureTool({go_baseline_, "--endpoints=" + etcd_.endpoint(), "--ops",
                                           std::to_string(o_.ops), "--prefix", MetaPrefix()}));
      try {
        auto j = nlohmann::json::parse(text);
        out.go_put.ns = j.at("put_ns").get<std::vector<int64_t>>();
        out.go_get.ns = j.at("get_ns").get<std::vector<int64_t>>();
      } catch (const std::exception& e) {
        return Status::Protocol(fmt::format("etcd_baseline printed bad JSON: {}", e.what()));
      }
    }
    // Subject B: Cluster::put / get on the same keys and values.
    for (int i = 0; i < o_.ops; ++i) {
      std::string key = fmt::format("kv/{}", i % 16);
      auto t0 = Clock::now();
      FARMEM_RETURN_IF_ERROR(probe_->put(key, value).status());
      out.put.ns.push_back(NsSince(t0));
      t0 = Clock::now();
      auto g = probe_->get(key);
      if (!g.ok()) return g.status();
      out.get.ns.push_back(NsSince(t0));
    }
    return Status::OK();
  }

  void Teardown() {
    tool_watchers_.clear();
    watches_.clear();
    probe_.reset();
    nodes_.clear();
    etcd_.Stop();
  }

  std::string ToolPrefix() const { return MetaPrefix() + "probe/"; }
  static std::string MetaPrefix() { return fmt::format("/farmem/{}/meta/", kClusterName); }

 private:
  ClusterBenchOptions o_;
  cluster::testing::EtcdProcess etcd_;
  EventLog log_;
  std::vector<std::unique_ptr<Cluster>> nodes_;
  std::vector<std::unique_ptr<ClusterWatch>> watches_;
  std::unique_ptr<Cluster> probe_;
  std::vector<std::unique_ptr<ToolWatcher>> tool_watchers_;
  std::string go_baseline_;
  std::string go_missing_;
};

Check MakeCheck(std::string name, const std::vector<Round>& rounds, double factor,
                Samples Round::*subject, Samples Round::*baseline, bool p99, std::string detail) {
  Check c;
  c.name = std::move(name);
  c.factor = factor;
  c.detail = std::move(detail);
  std::vector<double> s, b;
  Samples all_s, all_b;
  for (const auto& r : rounds) {
    const Samples& x = r.*subject;
    const Samples& y = r.*baseline;
    s.push_back(p99 ? x.p99_ms() : x.p50_ms());
    b.push_back(p99 ? y.p99_ms() : y.p50_ms());
    all_s.ns.insert(all_s.ns.end(), x.ns.begin(), x.ns.end());
    all_b.ns.insert(all_b.ns.end(), y.ns.begin(), y.ns.end());
  }
  c.ratios = bench::PerRoundRatios(s, b);
  c.value = p99 ? all_s.p99_ms() : all_s.p50_ms();
  c.baseline = p99 ? all_b.p99_ms() : all_b.p50_ms();
  if (!c.ratios.ratios.empty())
    c.result = c.ratios.median <= factor ? bench::TargetResult::kPass : bench::TargetResult::kMiss;
  return c;
}

}  // namespace

int RunClusterBench(ClusterBenchOptions o) {
  if (Status st = Validate(o); !st.ok()) {
    fmt::print(stderr, "{}: {}\n", kClusterProg, st.ToString());
    return st.code() == Code::kInvalidArgument ? 2 : 1;
  }
  auto busy = bench::CpuBusyFraction(std::chrono::milliseconds(300));
  Bench b(o);
  if (Status st = b.Setup(); !st.ok()) {
    fmt::print(stderr, "{}: setup failed: {}\n", kClusterProg, st.ToString());
    b.Teardown();
    return 1;
  }
  std::vector<Round> rounds(static_cast<size_t>(o.rounds));
  for (int r = 0; r < o.rounds; ++r) {
    auto t0 = Clock::now();
    if (Status st = b.RunRound(r, rounds[static_cast<size_t>(r)]); !st.ok()) {
      fmt::print(stderr, "{}: round {} failed: {}\n", kClusterProg, r + 1, st.ToString());
      b.Teardown();
      return 1;
    }
    const Round& x = rounds[static_cast<size_t>(r)];
    fmt::print(
        "round {}/{} ({:.1f} s): member change {:.2f} ms p50 vs etcdctl watch {:.2f} ms; get "
        "{:.3f} ms vs "
        "etcdctl {:.1f} ms; put {:.3f} ms vs etcdctl {:.1f} ms (etcdctl start-up {:.1f} ms)\n",
        r + 1, o.rounds, static_cast<double>(NsSince(t0)) / 1e9, x.member_change.p50_ms(),
        x.tool_watch.p50_ms(), x.get.p50_ms(), x.tool_get.p50_ms(), x.put.p50_ms(),
        x.tool_put.p50_ms(), x.tool_start.p50_ms());
  }
  b.Teardown();

  std::vector<Check> checks;
  const std::string watch_detail =
      "join()/leave() until all 3 watcher nodes saw it vs one put until 3 etcdctl watch "
      "processes printed it";
  checks.push_back(MakeCheck("membership change reaches 3 watchers, p50 (ms)", rounds, 2.0,
                             &Round::member_change, &Round::tool_watch, false, watch_detail));
  checks.push_back(MakeCheck("membership change reaches 3 watchers, p99 (ms)", rounds, 2.0,
                             &Round::member_change, &Round::tool_watch, true, watch_detail));
  const std::string go_detail = b.go_missing().empty()
                                    ? "etcd's Go client (clientv3 over gRPC, what etcdctl is built "
                                      "on) in one process; farmem "
                                      "goes through etcd's JSON gateway (docs/cluster.md)"
                                    : "not measured: " + b.go_missing();
  const std::string tool_detail =
      "etcdctl runs one process per operation (as a script would): its time includes process "
      "start-up (see etcdctl_startup_ms)";
  checks.push_back(MakeCheck("metadata get p50 (ms) vs clientv3 get", rounds, 2.0, &Round::get,
                             &Round::go_get, false, go_detail));
  checks.push_back(MakeCheck("metadata put p50 (ms) vs clientv3 put", rounds, 2.0, &Round::put,
                             &Round::go_put, false, go_detail));
  checks.push_back(MakeCheck("metadata get p50 (ms) vs etcdctl get", rounds, 1.0, &Round::get,
                             &Round::tool_get, false, tool_detail));
  checks.push_back(MakeCheck("metadata put p50 (ms) vs etcdctl put", rounds, 1.0, &Round::put,
                             &Round::tool_put, false, tool_detail));

  Samples all_start;
  for (const auto& r : rounds) {
    all_start.ns.insert(all_start.ns.end(), r.tool_start.ns.begin(), r.tool_start.ns.end());
  }
  fmt::print("\n{:<48} {:>10} {:>10}  {}\n", "target", "farmem", "baseline",
             "ratio (median of rounds, min-max)");
  for (auto& c : checks) {
    fmt::print("{:<48} {:>10.3f} {:>10.3f}  {} <= {}x  {}\n", c.name, c.value, c.baseline,
               bench::FormatRoundRatios(c.ratios), c.factor, bench::TargetResultName(c.result));
  }
  fmt::print("etcdctl start-up alone (etcdctl version): p50 {:.2f} ms\n", all_start.p50_ms());
  Samples joins, leaves, watch;
  for (const auto& r : rounds) {
    joins.ns.insert(joins.ns.end(), r.member_join.ns.begin(), r.member_join.ns.end());
    leaves.ns.insert(leaves.ns.end(), r.member_leave.ns.begin(), r.member_leave.ns.end());
    watch.ns.insert(watch.ns.end(), r.tool_watch.ns.begin(), r.tool_watch.ns.end());
  }
  fmt::print(
      "membership changes split: join (lease grant + txn) p50 {:.2f} / p99 {:.2f} ms, leave (put "
      "\"leaving\", seen before the revoke) p50 {:.2f} / p99 {:.2f} ms; one put to etcdctl watch "
      "p50 {:.2f} / p99 {:.2f} ms\n",
      joins.p50_ms(), joins.p99_ms(), leaves.p50_ms(), leaves.p99_ms(), watch.p50_ms(),
      watch.p99_ms());

  if (!o.json_path.empty()) {
    nlohmann::json j;
    j["benchmark"] = "cluster";
    j["machine"] = bench::MachineInfo();
    if (busy) j["cpu_busy_before"] = *busy;
    j["config"] = {{"quick", o.quick}, {"rounds", o.rounds},     {"changes", o.changes},
                   {"ops", o.ops},     {"tool_ops", o.tool_ops}, {"watchers", 3},
                   {"etcd", o.etcd},   {"etcdctl", o.etcdctl}};
    nlohmann::json jr = nlohmann::json::array();
    for (const auto& r : rounds) {
      jr.push_back({{"member_change", SamplesJson(r.member_change)},
                    {"member_join", SamplesJson(r.member_join)},
                    {"member_leave", SamplesJson(r.member_leave)},
                    {"etcdctl_watch", SamplesJson(r.tool_watch)},
                    {"get", SamplesJson(r.get)},
                    {"put", SamplesJson(r.put)},
                    {"clientv3_get", SamplesJson(r.go_get)},
                    {"clientv3_put", SamplesJson(r.go_put)},
                    {"etcdctl_get", SamplesJson(r.tool_get)},
                    {"etcdctl_put", SamplesJson(r.tool_put)},
                    {"etcdctl_startup", SamplesJson(r.tool_start)}});
    }
    j["rounds"] = std::move(jr);
    j["etcdctl_startup_ms"] = all_start.p50_ms();
    std::vector<bench::TargetRecord> targets;
    for (const auto& c : checks) {
      bench::TargetRecord t{.name = c.name,
                            .value = c.value,
                            .baseline = c.baseline,
                            .limit = fmt::format("<= {}x baseline", c.factor),
                            .result = c.result,
                            .detail = c.detail};
      t.SetRounds(c.ratios);
      targets.push_back(std::move(t));
    }
    j["targets"] = bench::TargetsJson(targets);
    if (Status st = bench::WriteJsonFile(o.json_path, j); !st.ok()) {
      fmt::print(stderr, "{}: {}\n", kClusterProg, st.message());
      return 1;
    }
    fmt::print("\nResults written to {}\n", o.json_path);
  }
  return 0;
}

}  // namespace farmem
