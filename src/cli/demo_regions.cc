// `farmem demo`'s regions part (issue 14): mount a farmem file system (RunRegionFs on a thread of
// the demo, its own embedded farmemd), write a file, and have a forked child rmmap it (faults read
// one-sidedly from farmemd, not through FUSE) once a RegionSync barrier (cell on the demo's
// farmemd) says the write is done; then unmount. The demo's main thread runs it; the child process
// has one thread of its own plus its Nodes' and the mapping's fault handler.
#include "cli/demo_regions.h"

#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli/demo_steps.h"
#include "farmem/client.h"
#include "farmem/cluster.h"
#include "farmem/regionfs.h"
#include "farmem/regions.h"

extern char** environ;

namespace farmem::cli {
namespace {

constexpr size_t kFileBytes = (1 << 20) + 4321;  // not a multiple of a page or a chunk
constexpr const char* kBarrier = "demo/regions-written";
constexpr const char* kSyncUrl = "memory://demo-regions";
constexpr auto kWait = std::chrono::seconds(10);

unsigned char PatternByte(size_t i) {
  return static_cast<unsigned char>((i * 131 + i / 4096) ^ 0x5a);
}

// What the child tells the demo through a pipe (fixed size: one write, one read).
struct ChildVerdict {
  int32_t barrier_ok = 0;
  int32_t read_ok = 0;
  uint64_t bytes = 0;
  uint64_t faults = 0;    // rmmap page faults served (each read 4 KiB one-sidedly)
  int64_t mismatch = -1;  // first wrong byte, -1 = none
  char error[200] = {};
};

// Runs `argv` (PATH lookup) and returns its exit code, or -1 if it could not be started.
int RunTool(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The child: its own Node (the forked copy of memory://demo-regions has the barrier's name), waits
// at the barrier for the write, rmmaps the file through the mount's user.region.map descriptor,
// checks every byte, reports, _exits. FARMEM_DEMO_FAULT=regions_no_barrier maps before waiting
// (the check must then fail).
[[noreturn]] void ChildMain(const ClientOptions& client, const std::string& path, int out_fd) {
  ChildVerdict v;
  auto say = [&](const std::string& e) {
    std::snprintf(v.error, sizeof(v.error), "%s", e.c_str());
  };
  const char* fault = std::getenv("FARMEM_DEMO_FAULT");
  const bool no_barrier = fault != nullptr && std::string(fault) == "regions_no_barrier";
  auto read_file = [&] {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0)
      return say(fmt::format("stat {}: {}", path, std::strerror(errno)));
    v.bytes = static_cast<uint64_t>(st.st_size);
    // kFileBytes whatever the size: a shorter file's missing tail then reads zero, not SIGSEGV.
    auto p = rmmap(path, kFileBytes);
    if (!p.ok()) return say("rmmap " + path + ": " + p.status().ToString());
    const auto* b = static_cast<const unsigned char*>(*p);
    for (size_t i = 0; i < kFileBytes && v.mismatch < 0; i++)
      if (b[i] != PatternByte(i)) v.mismatch = static_cast<int64_t>(i);
    if (auto stats = rmmap_stats(*p); stats.ok()) v.faults = stats->faults;
    (void)rmunmap(*p);
    v.read_ok = v.bytes == kFileBytes && v.mismatch < 0;
    if (!v.read_ok && v.error[0] == 0)
      say(v.mismatch < 0 ? fmt::format("file has {} bytes, want {}", v.bytes, kFileBytes)
                         : fmt::format("byte {} differs from the pattern", v.mismatch));
  };
  if (no_barrier) read_file();  // at once: the demo is still writing (or has not created it)
  auto node = MakeClientNode(client, "farmem-demo-regions-child");
  ClusterOptions co;
  co.url = kSyncUrl;
  auto cluster = node.ok() ? Cluster::Open(co) : Result<std::unique_ptr<Cluster>>(node.status());
  auto sync = cluster.ok() ? RegionSync::Open(**node, **cluster, nullptr)
                           : Result<std::unique_ptr<RegionSync>>(cluster.status());
  if (!sync.ok()) {
    say("child: " + sync.status().ToString());
  } else {
    Status st = (*sync)->rbarrier_wait(kBarrier, kWait);
    v.barrier_ok = st.ok();
    if (!st.ok()) say("child barrier: " + st.ToString());
    if (!no_barrier && st.ok()) read_file();
  }
  [[maybe_unused]] ssize_t w = write(out_fd, &v, sizeof(v));
  _exit(0);
}

// The mount on its own thread; Wait gives the ready/exit outcome. The state the thread writes is
// shared with it, so that a daemon that never returns (an unmount that failed twice) is left
// running detached instead of hanging the demo in a join: the process exits soon after anyway.
class Mount {
 public:
  explicit Mount(const std::string& dir) : state_(std::make_shared<State>()) {
    RegionFsOptions o;
    o.mountpoint = dir;
    o.memory_bytes = 32ull << 20;
    o.threads = 2;
    o.on_ready = [state = state_] {
      std::lock_guard lock(state->mu);
      state->ready = true;
      state->cv.notify_all();
    };
    thread_ = std::thread([state = state_, o] {
      Status st = RunRegionFs(o);
      std::lock_guard lock(state->mu);
      state->result = st;
      state->cv.notify_all();
    });
  }
  ~Mount() {
    if (WaitExit().ok() || Exited()) {
      thread_.join();
    } else {
      std::printf("  regions: the mount daemon did not return within 10 s; left detached\n");
      thread_.detach();
    }
  }
  // OK once mounted; the daemon's error if it stopped first; TimedOut after kWait.
  Status WaitReady() {
    std::unique_lock lock(state_->mu);
    if (!state_->cv.wait_for(lock, kWait,
                             [&] { return state_->ready || state_->result.has_value(); }))
      return Status(Code::kTimedOut, "the mount was not ready within 10 s");
    return state_->ready
               ? Status()
               : (state_->result->ok() ? Status(Code::kInternal, "mount ended") : *state_->result);
  }
  // The daemon's result once it returned (TimedOut after kWait).
  Status WaitExit() {
    std::unique_lock lock(state_->mu);
    if (!state_->cv.wait_for(lock, kWait, [&] { return state_->result.has_value(); }))
      return Status(Code::kTimedOut, "the mount did not stop within 10 s");
    return *state_->result;
  }

 private:
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    bool ready = false;
    std::optional<Status> result;
  };
  bool Exited() {
    std::lock_guard lock(state_->mu);
    return state_->result.has_value();
  }

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace

bool RunRegionSteps(Node& node, const std::string& address, const ClientOptions& client) {
  std::printf("regions (a farmem file system mounted in this process)\n");
  if (access("/dev/fuse", R_OK | W_OK) != 0) {
    std::printf("  regions: skipped (/dev/fuse: %s; no FUSE in this kernel or container)\n",
                std::strerror(errno));
    return true;
  }
  StepLog log;
  char tmpl[] = "/tmp/farmem-demo-regions.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return log.Report("temp dir", false, 0, std::strerror(errno));
  const std::string dir = tmpl, file = dir + "/demo.bin";
  bool ok = true;
  {
    auto t0 = Clock::now();
    Mount mount(dir);
    Status st = mount.WaitReady();
    const bool mounted = st.ok();
    ok = log.Report(
        "mount", st.ok(), MicrosSince(t0),
        st.ok() ? dir + ": embedded farmemd (32.0 MiB), memory://regions metadata" : st.ToString());

    // The barrier's name, created before the fork so the child's copy of the store has it.
    std::unique_ptr<Cluster> cluster;
    std::unique_ptr<RawClient> raw;
    std::unique_ptr<RegionSync> sync;
    if (ok) {
      t0 = Clock::now();
      ClusterOptions co;
      co.url = kSyncUrl;
      co.create_if_missing = true;
      auto c = Cluster::Open(co);
      auto r = c.ok() ? RawClient::Connect(node, address)
                      : Result<std::unique_ptr<RawClient>>(c.status());
      auto s = r.ok() ? RegionSync::Open(node, **c, r->get())
                      : Result<std::unique_ptr<RegionSync>>(r.status());
      st = s.ok() ? (*s)->rbarrier_init(kBarrier, 2) : s.status();
      ok = log.Report(
          "rbarrier_init", st.ok(), MicrosSince(t0),
          st.ok() ? fmt::format("'{}' (2 parties), cell on {}", kBarrier, address) : st.ToString());
      if (ok) {
        cluster = std::move(*c);
        raw = std::move(*r);
        sync = std::move(*s);
      }
    }

    int fds[2] = {-1, -1};
    pid_t child = -1;
    if (ok) {
      if (pipe(fds) != 0) {
        ok = log.Report("fork child", false, 0, std::strerror(errno));
      } else {
        std::fflush(stdout);
        child = fork();
        if (child == 0) {
          close(fds[0]);
          ChildMain(client, file, fds[1]);
        }
        close(fds[1]);
        if (child < 0) ok = log.Report("fork child", false, 0, std::strerror(errno));
      }
    }

    if (ok) {
      // Written only now: the child is already running and must wait at the barrier for it.
      t0 = Clock::now();
      std::vector<unsigned char> data(kFileBytes);
      for (size_t i = 0; i < kFileBytes; i++) data[i] = PatternByte(i);
      int fd = open(file.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
      size_t put = 0;
      for (ssize_t n; fd >= 0 && put < data.size() &&
                      (n = write(fd, data.data() + put, data.size() - put)) > 0;)
        put += static_cast<size_t>(n);
      const bool wrote = fd >= 0 && put == data.size() && fsync(fd) == 0 && close(fd) == 0;
      const std::string err = std::strerror(errno);
      log.Report("write file", wrote, MicrosSince(t0),
                 wrote ? fmt::format("{} ({} bytes of a pattern), fsync'ed", file, kFileBytes)
                       : file + ": " + err);

      t0 = Clock::now();
      st = sync->rbarrier_wait(kBarrier, kWait);
      log.Report(
          "barrier with child", st.ok(), MicrosSince(t0),
          st.ok() ? fmt::format("demo and child (pid {}) both arrived", child) : st.ToString());

      // The child's verdict (it reads after the barrier), within the timeout.
      t0 = Clock::now();
      ChildVerdict v;
      pollfd p{fds[0], POLLIN, 0};
      const bool got = poll(&p, 1, static_cast<int>(kWait.count() * 1000) + 5000) == 1 &&
                       read(fds[0], &v, sizeof(v)) == static_cast<ssize_t>(sizeof(v));
      if (!got) kill(child, SIGKILL);  // a child stuck past every timeout
      int status = 0;
      waitpid(child, &status, 0);
      v.error[sizeof(v.error) - 1] = 0;
      log.Report("child rmmaps file", got && v.barrier_ok && v.read_ok, MicrosSince(t0),
                 !got ? "no verdict from the child within 15 s"
                 : v.read_ok && v.barrier_ok
                     ? fmt::format("pid {}: {} bytes, pattern verified, {} page faults read "
                                   "one-sidedly from farmemd (after the barrier)",
                                   child, v.bytes, v.faults)
                     : fmt::format("pid {}: {}", child, v.error));
      close(fds[0]);

      t0 = Clock::now();
      st = sync->rdelete(kBarrier);
      log.Report("rdelete", st.ok(), MicrosSince(t0),
                 st.ok() ? "barrier name removed" : st.ToString());
    }
    sync.reset();
    raw.reset();
    cluster.reset();

    if (mounted) {
      t0 = Clock::now();
      int rc = RunTool({"fusermount3", "-u", dir});
      if (rc != 0) RunTool({"fusermount3", "-uz", dir});  // never leave a mount behind
      st = mount.WaitExit();
      log.Report("unmount", rc == 0 && st.ok(), MicrosSince(t0),
                 rc != 0   ? fmt::format("fusermount3 -u exited {}", rc)
                 : st.ok() ? "fusermount3 -u; the daemon thread returned OK"
                           : st.ToString());
    }
  }
  rmdir(dir.c_str());
  std::printf("  regions: %d/%d checks passed\n", log.passed(), log.passed() + log.failed());
  return log.failed() == 0;
}

}  // namespace farmem::cli
