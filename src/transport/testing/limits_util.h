// Test helpers for connection-limit tests (TCP transport, bootstrap listener, farmemd): RSS and
// CPU time of this or another process, a log sink counting matching lines, and a scope that uses
// up every file descriptor. Header-only test code; each helper is used by the test's own thread.
#pragma once

#include <dirent.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include <cstdint>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/dist_sink.h>
#include <spdlog/spdlog.h>

namespace farmem::testing {

// Runs `f` when the scope ends (e.g. stop the threads that log before a LogCounter detaches).
template <typename F>
struct ScopeExit {
  F f;
  ~ScopeExit() { f(); }
};
// clang before 17 has no class template argument deduction for aggregates (P1816).
template <typename F>
ScopeExit(F) -> ScopeExit<F>;

// Resident set size in bytes of the process whose statm file is `path` (second field); 0 when
// it cannot be read (e.g. the process is gone).
inline size_t RssBytesFromStatm(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

// Resident set size of this process in bytes (/proc/self/statm).
inline size_t RssBytes() {
  return RssBytesFromStatm("/proc/self/statm");
}
// ... of another process (/proc/PID/statm), e.g. a farmemd the test started.
inline size_t RssBytesOf(pid_t pid) {
  return RssBytesFromStatm("/proc/" + std::to_string(pid) + "/statm");
}

// CPU time (user + system) of every thread of this process, in seconds.
inline double ProcessCpuSeconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// CPU time (utime + stime, fields 14 and 15 of /proc/PID/stat) of another process, in seconds;
// -1 when it cannot be read. Resolution: one clock tick (10 ms).
inline double ProcessCpuSecondsOf(pid_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and parentheses: fields 3.. follow the last ')'.
  const char* p = std::strrchr(buf, ')');
  unsigned long utime = 0, stime = 0;
  if (p == nullptr || std::sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                                  &utime, &stime) != 2) {
    return -1;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Counts log lines containing `needle` while it lives. spdlog's logger.sinks() vector must not
// change while other threads log (these tests' transport threads log throughout: a counter
// removed mid-log was once called after its destruction, caught by clang's UBSan vptr check), so
// counters attach to one dist_sink, whose own mutex makes adding and removing safe; the dist_sink
// joins the default logger once, at the first counter (a test's threads start after it).
class LogCounter {
 public:
  explicit LogCounter(std::string needle) : sink_(std::make_shared<Sink>(std::move(needle))) {
    Hub().add_sink(sink_);
  }
  // After remove_sink returns no thread is inside sink_ (dist_sink logs under its mutex).
  ~LogCounter() { Hub().remove_sink(sink_); }
  LogCounter(const LogCounter&) = delete;
  LogCounter& operator=(const LogCounter&) = delete;
  uint64_t count() const { return sink_->count.load(); }

 private:
  struct Sink : spdlog::sinks::base_sink<std::mutex> {
    explicit Sink(std::string n) : needle(std::move(n)) {}
    void sink_it_(const spdlog::details::log_msg& msg) override {
      if (std::string_view(msg.payload.data(), msg.payload.size()).find(needle) !=
          std::string_view::npos)
        count.fetch_add(1);
    }
    void flush_() override {}
    const std::string needle;
    std::atomic<uint64_t> count{0};
  };
  static spdlog::sinks::dist_sink_mt& Hub() {
    static const std::shared_ptr<spdlog::sinks::dist_sink_mt> hub = [] {
      auto h = std::make_shared<spdlog::sinks::dist_sink_mt>();
      spdlog::default_logger()->sinks().push_back(h);
      return h;
    }();
    return *hub;
  }
  std::shared_ptr<Sink> sink_;
};

// How much more resident memory the same work costs in this build: TSan keeps shadow and
// meta memory for every page the program touches (several times the page itself), so RSS bounds
// are scaled by this. The bounds stay far below what the unbounded code used (hundreds of MiB).
#if defined(__SANITIZE_THREAD__)
inline constexpr uint64_t kRssBoundFactor = 4;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr uint64_t kRssBoundFactor = 4;
#else
inline constexpr uint64_t kRssBoundFactor = 1;
#endif
#else
inline constexpr uint64_t kRssBoundFactor = 1;
#endif

// Lowers RLIMIT_NOFILE to a little above the descriptors in use and fills the rest with dup()s,
// so the next socket()/accept() in this process fails with EMFILE (make the test's own client
// sockets before). The destructor frees everything and restores the limit.
class FdExhauster {
 public:
  FdExhauster() {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    int highest = 0;
    if (DIR* d = ::opendir("/proc/self/fd")) {
      while (dirent* e = ::readdir(d)) highest = std::max(highest, std::atoi(e->d_name));
      ::closedir(d);
    }
    rlimit lowered = saved_;
    lowered.rlim_cur = static_cast<rlim_t>(highest) + 64;
    ok_ = ::setrlimit(RLIMIT_NOFILE, &lowered) == 0;
    for (;;) {
      const int fd = ::dup(0);
      if (fd < 0) break;
      fds_.push_back(fd);
    }
  }
  ~FdExhauster() { Release(); }
  FdExhauster(const FdExhauster&) = delete;
  FdExhauster& operator=(const FdExhauster&) = delete;

  bool ok() const { return ok_ && !fds_.empty(); }
  // Closes every held descriptor and restores the limit.
  void Release() {
    for (int fd : fds_) ::close(fd);
    fds_.clear();
    if (ok_) ::setrlimit(RLIMIT_NOFILE, &saved_);
    ok_ = false;
  }

 private:
  rlimit saved_{};
  bool ok_ = false;
  std::vector<int> fds_;
};

}  // namespace farmem::testing
