// `farmem cluster up|down`: a whole local cluster in one command — an etcd and N farmemds on
// loopback, detached (own session, stdin /dev/null, logs under DIR), described by DIR/cluster.json
// so that `down` (any later shell) stops exactly those processes.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "common/log.h"
#include "server/serve.h"

extern char** environ;

namespace farmem::cli {

int FreeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void Progress(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int Error(const std::string& message) {
  std::fprintf(stderr, "farmem cluster: error: %s\n", message.c_str());
  return kExitFailure;
}

bool Executable(const std::string& path) {
  return ::access(path.c_str(), X_OK) == 0;
}

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    if (!dir.empty() && Executable(dir + "/" + name)) return dir + "/" + name;
  }
  return "";
}

// True while `pid` runs (a zombie counts as gone) and its command line still names `binary`
// (so a pid reused by an unrelated process is never signalled).
bool Running(pid_t pid, const std::string& binary) {
  if (pid <= 0 || ::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z') return false;
  std::ifstream cmd("/proc/" + std::to_string(pid) + "/cmdline");
  std::string argv0;
  std::getline(cmd, argv0, '\0');
  return fs::path(argv0).filename() == fs::path(binary).filename();
}

// Starts `args` detached: own session (a Ctrl-C in the shell that ran `up` does not reach it),
// stdin from /dev/null, stdout and stderr appended to `log`.
Result<pid_t> SpawnDetached(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  pid_t pid = -1;
  int rc = ::posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return Status::FromErrno("starting " + args[0], rc);
  return pid;
}

std::string LogTail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  std::string line;
  while (std::getline(in, line)) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += "    " + all[i] + "\n";
  }
  return out;
}

struct Proc {
  std::string name;  // "etcd", "node-1", ...
  std::string binary;
  pid_t pid = -1;
  // Started by this process (`up`): alive until waitpid reaps it. Checked that way because
  // right after posix_spawn the child's command line may still be ours, not yet the binary's.
  bool child = false;
};

bool Alive(const Proc& p) {
  if (!p.child) return Running(p.pid, p.binary);
  int status = 0;
  return ::waitpid(p.pid, &status, WNOHANG) == 0;
}

// SIGTERM to every process, wait up to `wait_seconds` for all, SIGKILL the rest. Prints one line
// per process unless quiet. Returns how many had to be killed.
int StopAll(const std::vector<Proc>& procs, double wait_seconds, bool quiet) {
  int killed = 0;
  const auto t0 = Clock::now();
  std::vector<const Proc*> live;
  for (const Proc& p : procs) {
    if (Alive(p)) {
      ::kill(p.pid, SIGTERM);
      live.push_back(&p);
    } else if (!quiet) {
      Progress(fmt::format("  {} (pid {}) was not running", p.name, p.pid));
    }
  }
  std::set<const Proc*> done;
  while (done.size() < live.size() && SecondsSince(t0) < wait_seconds) {
    for (const Proc* p : live) {
      if (!done.count(p) && !Alive(*p)) {
        done.insert(p);
        if (!quiet) {
          Progress(fmt::format("  stopped {} (pid {}, SIGTERM, {:.1f} s)", p->name, p->pid,
                               SecondsSince(t0)));
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (const Proc* p : live) {
    if (done.count(p)) continue;
    ::kill(p->pid, SIGKILL);
    if (p->child) {
      int status = 0;
      ::waitpid(p->pid, &status, 0);
    }
    ++killed;
    if (!quiet) {
      Progress(fmt::format("  killed {} (pid {}): still running {:.0f} s after SIGTERM", p->name,
                           p->pid, wait_seconds));
    }
  }
  return killed;
}

Result<json> ReadClusterJson(const std::string& dir) {
  const std::string path = dir + "/cluster.json";
  std::ifstream in(path);
  if (!in) {
    return Status::NotFound(path + " does not exist: no cluster was started there with `farmem " +
                            "cluster up --dir " + dir + "`");
  }
  json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("etcd") || !j.contains("nodes")) {
    return Status::InvalidArgument(path + " is not a cluster description of `farmem cluster up`");
  }
  return j;
}

// The processes of a cluster.json, farmemds first (they leave while etcd still answers).
std::vector<Proc> ProcsOf(const json& j) {
  std::vector<Proc> procs;
  for (const auto& n : j["nodes"]) {
    procs.push_back({n.value("name", "node"), n.value("binary", "farmemd"), n.value("pid", -1)});
  }
  const json& e = j["etcd"];
  procs.push_back({"etcd", e.value("binary", "etcd"), e.value("pid", -1)});
  return procs;
}

}  // namespace

int RunClusterUp(const ClusterUpOptions& o) {
  InitLogging();
  if (o.nodes < 1 || o.nodes > 64) {
    std::fprintf(stderr, "farmem cluster up: error: --nodes must be 1..64\n");
    return kExitUsage;
  }
  if (o.base_port != 0 && (o.base_port < 1024 || o.base_port + 2 + 2 * o.nodes > 65535)) {
    std::fprintf(stderr,
                 "farmem cluster up: error: --base-port must leave room for %d ports "
                 "in 1024..65535\n",
                 2 + 2 * o.nodes);
    return kExitUsage;
  }
  const auto t0 = Clock::now();
  std::error_code ec;
  fs::create_directories(o.dir + "/etcd", ec);
  if (ec) return Error("cannot create " + o.dir + "/etcd: " + ec.message());
  const std::string dir = fs::canonical(o.dir, ec).string();

  // One cluster per directory: a live one must be stopped first; a dead one's file is replaced.
  if (auto old = ReadClusterJson(dir); old.ok()) {
    for (const Proc& p : ProcsOf(*old)) {
      if (Running(p.pid, p.binary)) {
        return Error(
            fmt::format("{} already runs a cluster ({} is pid {}); stop it with `farmem "
                        "cluster down --dir {}`",
                        dir, p.name, p.pid, dir));
      }
    }
    Progress("replacing the description of a stopped cluster in " + dir + "/cluster.json");
  }

  std::string etcd = o.etcd;
  if (etcd.empty() && std::getenv("FARMEM_ETCD")) etcd = std::getenv("FARMEM_ETCD");
  if (etcd.empty()) etcd = FindOnPath("etcd");
  if (etcd.empty()) etcd = "/usr/bin/etcd";
  if (!Executable(etcd)) {
    return Error("etcd not found at " + etcd + " (install etcd-server, or give --etcd PATH)");
  }
  std::string farmemd = o.farmemd;
  if (farmemd.empty()) {
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    if (!ec && Executable((self.parent_path() / "farmemd").string())) {
      farmemd = (self.parent_path() / "farmemd").string();
    } else {
      farmemd = FindOnPath("farmemd");
    }
  }
  if (farmemd.empty() || !Executable(farmemd)) {
    return Error("farmemd not found next to farmem nor on PATH (give --farmemd PATH)");
  }

  const int etcd_client = o.base_port ? o.base_port : FreeLoopbackPort();
  const int etcd_peer = o.base_port ? o.base_port + 1 : FreeLoopbackPort();
  const std::string url = fmt::format("etcd://127.0.0.1:{}", etcd_client);
  std::vector<Proc> started;
  // Any failure from here on stops what was started, so a failed `up` leaves nothing behind.
  auto abort_up = [&](const std::string& message) {
    std::fprintf(stderr, "farmem cluster up: error: %s\n", message.c_str());
    Progress(fmt::format("stopping the {} process(es) started", started.size()));
    StopAll(started, 5, /*quiet=*/false);
    return kExitFailure;
  };

  // --- etcd ---
  const std::string client_url = fmt::format("http://127.0.0.1:{}", etcd_client);
  const std::string peer_url = fmt::format("http://127.0.0.1:{}", etcd_peer);
  const std::string etcd_log = dir + "/etcd/etcd.log";
  Progress(fmt::format("starting etcd on 127.0.0.1:{} (data {}/etcd/data, log {})", etcd_client,
                       dir, etcd_log));
  // Debian's etcd 3.4 wants this on some architectures; harmless elsewhere.
  ::setenv("ETCD_UNSUPPORTED_ARCH", "", 0);
  auto etcd_pid =
      SpawnDetached({etcd, "--name=farmem-local", "--data-dir=" + dir + "/etcd/data",
                     "--listen-client-urls=" + client_url, "--advertise-client-urls=" + client_url,
                     "--listen-peer-urls=" + peer_url, "--initial-advertise-peer-urls=" + peer_url,
                     "--initial-cluster=farmem-local=" + peer_url, "--logger=zap"},
                    etcd_log);
  if (!etcd_pid.ok()) return abort_up(etcd_pid.status().ToString());
  started.push_back({"etcd", etcd, *etcd_pid, /*child=*/true});

  // Ready when it serves the cluster (created here, so the farmemds and later tools find it).
  ClusterOptions copts;
  copts.url = url;
  copts.cluster_name = o.cluster_name;
  copts.create_if_missing = true;
  copts.call_timeout = std::chrono::milliseconds(1000);
  std::unique_ptr<Cluster> cluster;
  Status last;
  while (!cluster) {
    if (!Alive(started.front())) {
      return abort_up("etcd exited at start; its log " + etcd_log + " ends with:\n" +
                      LogTail(etcd_log, 10));
    }
    auto opened = Cluster::Open(copts);
    if (opened.ok()) {
      cluster = std::move(*opened);
    } else {
      last = opened.status();
      if (last.code() == Code::kInvalidArgument) return abort_up(last.ToString());
      if (SecondsSince(t0) > o.wait_seconds) {
        return abort_up(fmt::format("etcd did not answer within {:.0f} s ({}); see {}",
                                    o.wait_seconds, last.ToString(), etcd_log));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  Progress(fmt::format("  etcd ready (pid {}) after {:.1f} s: {}, cluster '{}'", *etcd_pid,
                       SecondsSince(t0), url, o.cluster_name));

  // --- farmemds ---
  json nodes = json::array();
  for (int k = 1; k <= o.nodes; ++k) {
    const int listen = o.base_port ? o.base_port + 2 * k : FreeLoopbackPort();
    const int data = o.base_port ? o.base_port + 2 * k + 1 : FreeLoopbackPort();
    const std::string name = fmt::format("node-{}", k);
    const std::string log = fmt::format("{}/{}.log", dir, name);
    std::vector<std::string> args = {farmemd,
                                     "--listen",
                                     fmt::format("127.0.0.1:{}", listen),
                                     "--data-port",
                                     std::to_string(data),
                                     "--name",
                                     name,
                                     "--memory-mib",
                                     std::to_string(o.memory_mib),
                                     "--cluster",
                                     url,
                                     "--cluster-name",
                                     o.cluster_name,
                                     "--cluster-ttl",
                                     std::to_string(o.ttl_seconds)};
    args.insert(args.end(), o.farmemd_args.begin(), o.farmemd_args.end());
    Progress(
        fmt::format("starting {} on 127.0.0.1:{} (data port {}, log {})", name, listen, data, log));
    auto pid = SpawnDetached(args, log);
    if (!pid.ok()) return abort_up(pid.status().ToString());
    started.push_back({name, farmemd, *pid, /*child=*/true});
    nodes.push_back({{"name", name},
                     {"pid", *pid},
                     {"binary", farmemd},
                     {"listen", fmt::format("127.0.0.1:{}", listen)},
                     {"data_port", data},
                     {"log", log}});
  }

  // --- wait until every farmemd is a member ---
  size_t shown = 0;
  for (;;) {
    for (size_t i = 1; i < started.size(); ++i) {
      if (!Alive(started[i])) {
        const std::string log = nodes[i - 1]["log"].get<std::string>();
        return abort_up(started[i].name + " exited at start; its log " + log + " ends with:\n" +
                        LogTail(log, 10));
      }
    }
    auto members = cluster->members();
    size_t joined = 0;
    if (members.ok()) {
      for (const auto& m : *members) {
        for (const auto& n : nodes) joined += m.name == n["name"].get<std::string>();
      }
    }
    if (joined != shown) {
      Progress(fmt::format("  {}/{} farmemd(s) joined after {:.1f} s", joined, o.nodes,
                           SecondsSince(t0)));
      shown = joined;
    }
    if (joined == static_cast<size_t>(o.nodes)) break;
    if (SecondsSince(t0) > o.wait_seconds) {
      return abort_up(
          fmt::format("only {} of {} farmemd(s) joined within {:.0f} s{}; see the logs in {}",
                      joined, o.nodes, o.wait_seconds,
                      members.ok() ? "" : " (members: " + members.status().ToString() + ")", dir));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  json desc = {{"url", url},
               {"cluster_name", o.cluster_name},
               {"etcd",
                {{"pid", *etcd_pid},
                 {"binary", etcd},
                 {"client_port", etcd_client},
                 {"peer_port", etcd_peer},
                 {"data_dir", dir + "/etcd/data"},
                 {"log", etcd_log}}},
               {"nodes", nodes}};
  const std::string path = dir + "/cluster.json";
  {
    std::ofstream out(path + ".tmp");
    out << desc.dump(2) << "\n";
    if (!out) return abort_up("cannot write " + path);
  }
  fs::rename(path + ".tmp", path, ec);
  if (ec) return abort_up("cannot write " + path + ": " + ec.message());

  Progress(fmt::format("cluster up: etcd and {} farmemd(s) in {:.1f} s; described in {}", o.nodes,
                       SecondsSince(t0), path));
  Progress("cluster URL: " + url +
           (o.cluster_name == "default" ? "" : " (--cluster-name " + o.cluster_name + ")"));
  Progress("export FARMEM_CLUSTER=" + url);
  Progress("stop it with: farmem cluster down --dir " + dir);
  return kExitOk;
}

int RunClusterDown(const std::string& dir_arg, double wait_seconds) {
  std::error_code ec;
  const std::string dir = fs::weakly_canonical(dir_arg, ec).string();
  auto desc = ReadClusterJson(dir);
  if (!desc.ok()) {
    std::fprintf(stderr, "farmem cluster down: error: %s\n", desc.status().ToString().c_str());
    return kExitFailure;
  }
  std::vector<Proc> procs = ProcsOf(*desc);
  std::vector<Proc> farmemds(procs.begin(), procs.end() - 1);
  Progress(fmt::format("stopping cluster {} in {}: {} farmemd(s), then etcd",
                       desc->value("url", std::string("?")), dir, farmemds.size()));
  // farmemds first, while etcd still answers: each leaves the cluster on SIGTERM.
  int killed = StopAll(farmemds, wait_seconds, /*quiet=*/false);
  killed += StopAll({procs.back()}, wait_seconds, /*quiet=*/false);
  fs::remove(dir + "/cluster.json", ec);
  Progress(fmt::format("cluster down{}; logs and etcd data stay in {}",
                       killed ? fmt::format(" ({} process(es) needed SIGKILL)", killed) : "", dir));
  return kExitOk;
}

}  // namespace farmem::cli
