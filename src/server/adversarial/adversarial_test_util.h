// The adversarial suite's handle on a real farmemd child process (found in the build tree or via
// $FARMEMD, started with default flags plus a few, optionally under a low RLIMIT_NOFILE; killed on
// destruction) and its legitimate client, a Node of its own that must keep being served.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "farmem/client.h"
#include "farmem/node.h"
#include "node/node_test_util.h"
#include "transport/testing/limits_util.h"

namespace farmem::adversarial {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// farmemd's default cluster token: the suite runs the daemon with default flags.
inline constexpr std::string_view kToken = "farmem";

// $FARMEMD when set (point the suite at another build), else the farmemd of this build tree.
inline std::string FarmemdPath() {
  const char* env = std::getenv("FARMEMD");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(FARMEMD_PATH);
}

inline uint16_t PortOf(const std::string& host_port) {
  return static_cast<uint16_t>(std::stoi(host_port.substr(host_port.rfind(':') + 1)));
}

class Farmemd {
 public:
  struct Options {
    std::vector<std::string> flags;  // after --listen 127.0.0.1:0 (every other flag: default)
    rlim_t max_fds = 0;              // RLIMIT_NOFILE (soft) of the child; 0 = inherited
  };

  // Starts farmemd and waits for its ready line; stderr goes to a file of its own.
  static Result<std::unique_ptr<Farmemd>> Start(const Options& o,
                                                std::chrono::milliseconds timeout = 10s) {
    std::unique_ptr<Farmemd> d(new Farmemd());
    std::string dir = (std::filesystem::temp_directory_path() / "farmem-adv-XXXXXX").string();
    if (::mkdtemp(dir.data()) == nullptr) return Status::FromErrno("mkdtemp", errno);
    d->dir_ = dir;
    d->stderr_path_ = dir + "/stderr.log";
    std::vector<std::string> args{FarmemdPath(), "--listen", "127.0.0.1:0"};
    args.insert(args.end(), o.flags.begin(), o.flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return Status::FromErrno("pipe2", errno);
    const int err = ::open(d->stderr_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t pid = ::fork();
    if (pid == 0) {  // child: async-signal-safe calls only, then exec
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(null, 0);
      ::dup2(out[1], 1);
      ::dup2(err, 2);
      for (int fd = 3; fd < 4096; ++fd) ::close(fd);
      if (o.max_fds != 0) {
        rlimit r{};
        ::getrlimit(RLIMIT_NOFILE, &r);
        r.rlim_cur = o.max_fds;
        ::setrlimit(RLIMIT_NOFILE, &r);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err);
    ::close(null);
    if (pid < 0) {
      ::close(out[0]);
      return Status::FromErrno("fork", errno);
    }
    d->pid_ = pid;
    d->stdout_fd_ = out[0];
    FARMEM_RETURN_IF_ERROR(d->WaitReady(timeout));
    return d;
  }

  ~Farmemd() {
    Stop();
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }
  Farmemd(const Farmemd&) = delete;
  Farmemd& operator=(const Farmemd&) = delete;

  // SIGTERM, up to 3 s to exit, then SIGKILL. Idempotent.
  void Stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + 3s;
    while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(10ms);  // back-off of a bounded poll
    }
    pid_ = -1;
  }

  pid_t pid() const { return pid_; }
  const std::string& bootstrap() const { return bootstrap_; }  // HOST:PORT
  uint16_t bootstrap_port() const { return PortOf(bootstrap_); }
  uint16_t data_port() const { return PortOf(data_address_); }  // native TCP transport
  size_t rss() const { return testing::RssBytesOf(pid_); }
  double cpu_seconds() const { return testing::ProcessCpuSecondsOf(pid_); }
  int open_fds() const {
    std::error_code ec;
    int n = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      ++n;
    }
    return n;
  }
  uint64_t stderr_bytes() const {
    struct stat st {};
    return ::stat(stderr_path_.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  // Lines of stderr containing `needle`; the first `max_bytes` of the file only.
  uint64_t stderr_lines_with(std::string_view needle, uint64_t max_bytes = 16u << 20) const {
    std::ifstream in(stderr_path_);
    std::string line;
    uint64_t n = 0, read = 0;
    while (read < max_bytes && std::getline(in, line)) {
      read += line.size() + 1;
      if (line.find(needle) != std::string::npos) ++n;
    }
    return n;
  }
  std::string stderr_tail(size_t bytes = 2000) const {
    std::ifstream in(stderr_path_, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return all.size() > bytes ? all.substr(all.size() - bytes) : all;
  }

 private:
  Farmemd() = default;

  // Reads stdout until "farmemd ready: bootstrap=H:P transport=NAME address=ADDR".
  Status WaitReady(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    std::string got;
    for (;;) {
      const size_t nl = got.find('\n');
      if (nl != std::string::npos) {
        const std::string line = got.substr(0, nl);
        auto field = [&](std::string_view key) {
          const size_t at = line.find(key);
          if (at == std::string::npos) return std::string();
          const size_t end = line.find(' ', at);
          return line.substr(at + key.size(),
                             end == std::string::npos ? end : end - at - key.size());
        };
        bootstrap_ = field("bootstrap=");
        data_address_ = field("address=");
        if (line.rfind("farmemd ready: ", 0) != 0 || bootstrap_.empty() || data_address_.empty())
          return Status::Protocol("unexpected farmemd stdout: " + line);
        return Status::OK();
      }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{stdout_fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0)
        return Status::TimedOut("no ready line from " + FarmemdPath() +
                                "; stderr: " + stderr_tail());
      char buf[512];
      const ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
      if (n <= 0)
        return Status::Unavailable(FarmemdPath() +
                                   " exited before its ready line; stderr: " + stderr_tail());
      got.append(buf, static_cast<size_t>(n));
    }
  }

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string dir_, stderr_path_, bootstrap_, data_address_;
};

// A legitimate client: a Node of its own (native TCP, loopback, farmemd's token), a RawClient and
// 4 KiB of raw memory it writes and reads one-sidedly.
struct LegitClient {
  std::unique_ptr<Node> node;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<RawClient> raw;
  RawAllocation alloc;

  ~LegitClient() {
    raw.reset();
    sched.reset();
    if (node) node->stop();
  }

  // Handshake, ALLOC_RAW and one write/read round; node.connect_timeout bounds the handshake.
  static Result<std::unique_ptr<LegitClient>> Connect(const std::string& bootstrap,
                                                      uint64_t bytes = 4096) {
    auto c = std::make_unique<LegitClient>();
    NodeConfig cfg = node::testing::MakeConfig("tcp", "adversarial-client", std::string(kToken));
    cfg.rpc_workers = 1;
    FARMEM_ASSIGN_OR_RETURN(c->node, Node::Create(cfg));
    FARMEM_RETURN_IF_ERROR(c->node->start());
    FARMEM_ASSIGN_OR_RETURN(c->sched, c->node->make_scheduler());
    FARMEM_ASSIGN_OR_RETURN(c->raw, RawClient::Connect(*c->node, bootstrap));
    FARMEM_ASSIGN_OR_RETURN(c->alloc, c->raw->alloc_raw(bytes));
    FARMEM_RETURN_IF_ERROR(c->RoundTrip(0x5eed));
    return c;
  }

  // Writes `value` to the first word of the allocation and reads it back.
  Status RoundTrip(uint64_t value) {
    FARMEM_RETURN_IF_ERROR(sched->block_on(sched->write(alloc.ref, &value, 8, true)));
    uint64_t got = 0;
    FARMEM_RETURN_IF_ERROR(sched->block_on(sched->read(alloc.ref, &got, 8)));
    if (got != value) return Status::Internal("read back " + std::to_string(got));
    return Status::OK();
  }
};

// Connects a fresh legitimate client and serves it one round; returns how long that took.
inline Result<std::chrono::milliseconds> ServeFreshClient(const std::string& bootstrap) {
  const auto t0 = Clock::now();
  FARMEM_ASSIGN_OR_RETURN(auto c, LegitClient::Connect(bootstrap));
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
}

}  // namespace farmem::adversarial
