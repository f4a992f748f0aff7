// farmemd child processes of the benchmarks (see farmemd_process.h); moved here from the soak
// benchmark so `farmem bench tx` starts its servers the same way. Main thread only, except
// RssBytes / CpuSeconds (any thread: they read /proc).
#include "farmemd_process.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

extern char** environ;

namespace farmem::bench {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string FindFarmemd(const std::string& given) {
  namespace fs = std::filesystem;
  if (!given.empty()) return given;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec && ::access((self.parent_path() / "farmemd").c_str(), X_OK) == 0)
    return (self.parent_path() / "farmemd").string();
  if (const char* path = std::getenv("PATH")) {
    std::string p = path;
    size_t start = 0;
    while (start <= p.size()) {
      size_t end = p.find(':', start);
      if (end == std::string::npos) end = p.size();
      const std::string cand = p.substr(start, end - start) + "/farmemd";
      if (::access(cand.c_str(), X_OK) == 0) return cand;
      start = end + 1;
    }
  }
  return "";
}

double ProcessCpuSeconds(pid_t pid) {
  if (pid <= 0) return std::nan("");
  FILE* f = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "r");
  if (f == nullptr) return std::nan("");
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // Fields after the command name (which may hold spaces) start after the last ')'; utime and
  // stime are fields 14 and 15, i.e. the 12th and 13th after it.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return std::nan("");
  unsigned long utime = 0, stime = 0;
  if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) !=
      2)
    return std::nan("");
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

Status Farmemd::Start(const std::string& binary, std::chrono::milliseconds timeout,
                      const std::vector<std::string>& extra, int cpu) {
  if (::access(binary.c_str(), X_OK) != 0)
    return Status::FromErrno("farmemd binary " + binary, errno);
  char log_path[] = "/tmp/farmem-bench-farmemd-XXXXXX";
  const int log_fd = ::mkstemp(log_path);
  if (log_fd < 0) return Status::FromErrno("mkstemp", errno);
  log_path_ = log_path;
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return Status::FromErrno("pipe", errno);
  args_ = {binary, "--listen", "127.0.0.1:0"};
  args_.insert(args_.end(), extra.begin(), extra.end());
  auto pid = Spawn(args_, out[1], log_fd, cpu);
  ::close(out[1]);
  ::close(log_fd);
  if (!pid.ok()) {
    ::close(out[0]);
    return pid.status();
  }
  pid_ = *pid;
  // "farmemd ready: bootstrap=HOST:PORT transport=NAME address=ADDR"
  std::string line;
  const auto deadline = Clock::now() + timeout;
  while (line.find('\n') == std::string::npos) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{out[0], POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[512];
    const ssize_t n = ::read(out[0], buf, sizeof(buf));
    if (n <= 0) break;
    line.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  auto field = [&](const std::string& key) -> std::string {
    const size_t at = line.find(key + "=");
    if (at == std::string::npos) return "";
    const size_t start = at + key.size() + 1;
    return line.substr(start, line.find_first_of(" \n", start) - start);
  };
  bootstrap_ = field("bootstrap");
  data_address_ = field("address");
  if (bootstrap_.empty() || data_address_.empty()) {
    bool exited = !Alive();  // stdout closed: give an exiting child a moment to be reaped
    for (int i = 0; i < 50 && !exited; ++i) {
      std::this_thread::sleep_for(20ms);
      exited = !Alive();
    }
    return Status::Unavailable(fmt::format(
        "{} did not report ready within {} ms (got '{}'{}); its log: {}", binary, timeout.count(),
        line.substr(0, line.find('\n')),
        exited ? fmt::format(", exited with status {:#x}", exit_status_) : std::string(),
        LogTail()));
  }
  return Status::OK();
}

bool Farmemd::Alive() {
  if (pid_ <= 0) return false;
  int st = 0;
  if (::waitpid(pid_, &st, WNOHANG) == pid_) {
    exit_status_ = st;
    pid_ = -1;
    return false;
  }
  return true;
}
void Farmemd::Stop() {
  if (pid_ > 0) KillAndReap(pid_, 3000ms);
  pid_ = -1;
}
uint64_t Farmemd::RssBytes() const {
  const pid_t pid = pid_.load();
  if (pid <= 0) return 0;
  FILE* f = std::fopen(fmt::format("/proc/{}/statm", pid).c_str(), "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}
std::string Farmemd::LogTail() const {
  FILE* f = std::fopen(log_path_.c_str(), "r");
  if (f == nullptr) return "(no log)";
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s.size() > 1500 ? "..." + s.substr(s.size() - 1500) : s;
}

}  // namespace farmem::bench
