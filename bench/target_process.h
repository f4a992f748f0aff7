// Child processes that host the benchmark targets (transport servers, TCP echo server, memory for
// process_vm_readv). All are forked before the parent creates any thread, then started one by one.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "farmem/status.h"

namespace farmem::bench {

// Pipe framing between parent and child: [u8 ok][u32 length][length bytes]. A not-ok message
// carries an error text. Lengths above kMaxMessageBytes are rejected as a protocol error.
inline constexpr uint32_t kMaxMessageBytes = 64 * 1024;
Status WriteMessage(int fd, bool ok, std::string_view bytes);
// Waits at most `timeout`; a not-ok message comes back as Unavailable(<child's text>).
Result<std::string> ReadMessage(int fd, std::chrono::milliseconds timeout);

// What a child does once started: report readiness with WriteMessage(report_fd, ...), serve, and
// return when `control_fd` reaches EOF (the parent's stop) — poll it, never ignore it. Runs in
// the child only; the child _exit()s when it returns.
using TargetRole = std::function<void(int report_fd, int control_fd)>;

class TargetProcess {
 public:
  // Fork now. The child closes every inherited descriptor except its two pipes, dies with the
  // parent (PR_SET_PDEATHSIG) and blocks without spinning until Start() or the parent's stop.
  static Result<std::unique_ptr<TargetProcess>> Fork(std::string name, TargetRole role);

  TargetProcess(const TargetProcess&) = delete;
  TargetProcess& operator=(const TargetProcess&) = delete;
  ~TargetProcess();

  // Let the child run its role and wait for its ready message (its payload is returned).
  Result<std::string> Start(std::chrono::milliseconds timeout);
  // Close the control pipe, give the child `grace` to exit cleanly, then SIGKILL. Idempotent.
  void Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(3000));
  // True while the child has not exited (reaps it if it has).
  bool Alive();

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

 private:
  TargetProcess(std::string name, pid_t pid, int control_fd, int report_fd)
      : name_(std::move(name)), pid_(pid), control_fd_(control_fd), report_fd_(report_fd) {}

  std::string name_;
  pid_t pid_ = -1;
  int control_fd_ = -1;  // parent -> child: one byte = start, EOF = stop
  int report_fd_ = -1;   // child -> parent: ready/error message
  bool reaped_ = false;
};

// For roles: true once the parent closed the control pipe (EOF) or the pipe failed. Never blocks.
bool StopRequested(int control_fd);
// For roles: block until the parent closes the control pipe or `timeout` passes.
void WaitForStop(int control_fd, std::chrono::milliseconds timeout);

}  // namespace farmem::bench
