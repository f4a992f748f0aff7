// A farmemd child process of a benchmark (`farmem bench soak`, `farmem bench tx`): spawned with
// its flags (optionally pinned to one CPU), its ready line parsed, its RSS and CPU time read from
// /proc, stopped and reaped. Used by the benchmark's main thread; RssBytes/CpuSeconds by samplers.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "child_process.h"  // Spawn, KillAndReap
#include "farmem/status.h"

namespace farmem::bench {

// `given` if not empty, else farmemd next to this executable, else on PATH; "" if none.
std::string FindFarmemd(const std::string& given);

// user + system CPU seconds of process `pid` (/proc/PID/stat utime + stime); NaN if unreadable.
double ProcessCpuSeconds(pid_t pid);

// `farmemd --listen 127.0.0.1:0 EXTRA...`: every flag not in `extra` at its default (the port is
// ephemeral only so that a run never collides with a farmemd already on 7700).
class Farmemd {
 public:
  ~Farmemd() { Stop(); }

  // Starts the binary and waits (<= timeout) for "farmemd ready: bootstrap=... address=...".
  // `cpu` >= 0: the process runs on that CPU only.
  Status Start(const std::string& binary, std::chrono::milliseconds timeout,
               const std::vector<std::string>& extra = {}, int cpu = -1);
  bool Alive();
  void Stop();
  uint64_t RssBytes() const;
  double CpuSeconds() const { return ProcessCpuSeconds(pid_.load()); }
  std::string LogTail() const;

  pid_t pid() const { return pid_; }
  int exit_status() const { return exit_status_; }
  const std::string& bootstrap() const { return bootstrap_; }
  const std::string& data_address() const { return data_address_; }
  const std::string& log_path() const { return log_path_; }
  const std::vector<std::string>& args() const { return args_; }

 private:
  std::atomic<pid_t> pid_{-1};  // read by samplers too
  int exit_status_ = 0;
  std::string bootstrap_, data_address_, log_path_;
  std::vector<std::string> args_;
};

}  // namespace farmem::bench
