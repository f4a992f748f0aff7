// Forking and pipe plumbing for benchmark target processes (see target_process.h).
// Everything here runs before/independently of any transport; waits use poll() with deadlines.
#include "target_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace farmem::bench {
namespace {

using Clock = std::chrono::steady_clock;

Status WriteAll(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("pipe write", errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::OK();
}

Status ReadAll(int fd, void* data, size_t len, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return Status::TimedOut("no message from target process in time");
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("poll on pipe", errno);
    }
    if (r == 0) continue;
    ssize_t n = ::read(fd, p, len);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Status::FromErrno("pipe read", errno);
    }
    if (n == 0) return Status::Unavailable("target process exited before reporting");
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::OK();
}

// Close every descriptor >= 3 except a and b, so this child holds no pipe end of a sibling (a
// sibling would otherwise never see EOF on its control pipe).
void CloseAllExcept(int a, int b) {
  int lo = std::min(a, b), hi = std::max(a, b);
  if (lo > 3) ::close_range(3, static_cast<unsigned>(lo - 1), 0);
  const int mid = std::max(lo + 1, 3);  // never close stdio, even if a pipe got fd 0..2
  if (hi > mid) ::close_range(static_cast<unsigned>(mid), static_cast<unsigned>(hi - 1), 0);
  ::close_range(static_cast<unsigned>(hi + 1), ~0u, 0);
}

}  // namespace

Status WriteMessage(int fd, bool ok, std::string_view bytes) {
  if (bytes.size() > kMaxMessageBytes) return Status::InvalidArgument("pipe message too large");
  unsigned char header[5];
  header[0] = ok ? 1 : 0;
  uint32_t len = static_cast<uint32_t>(bytes.size());
  std::memcpy(header + 1, &len, sizeof(len));
  FARMEM_RETURN_IF_ERROR(WriteAll(fd, header, sizeof(header)));
  return WriteAll(fd, bytes.data(), bytes.size());
}

Result<std::string> ReadMessage(int fd, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  unsigned char header[5];
  FARMEM_RETURN_IF_ERROR(ReadAll(fd, header, sizeof(header), deadline));
  uint32_t len;
  std::memcpy(&len, header + 1, sizeof(len));
  if (header[0] > 1 || len > kMaxMessageBytes)
    return Status::Protocol("malformed message from target process");
  std::string body(len, '\0');
  FARMEM_RETURN_IF_ERROR(ReadAll(fd, body.data(), len, deadline));
  if (header[0] == 0) return Status::Unavailable(body);
  return body;
}

bool StopRequested(int control_fd) {
  pollfd pfd{control_fd, POLLIN, 0};
  int r = ::poll(&pfd, 1, 0);
  if (r < 0) return errno != EINTR;
  // Any readable state here means EOF/hang-up: the parent sends nothing after the start byte.
  return r > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
}

void WaitForStop(int control_fd, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    pollfd pfd{control_fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, 1000);
    if (r < 0 && errno != EINTR) return;
    if (r > 0) return;
  }
}

Result<std::unique_ptr<TargetProcess>> TargetProcess::Fork(std::string name, TargetRole role) {
  int control[2], report[2];
  if (::pipe2(control, O_CLOEXEC) != 0) return Status::FromErrno("pipe", errno);
  if (::pipe2(report, O_CLOEXEC) != 0) {
    int err = errno;
    ::close(control[0]);
    ::close(control[1]);
    return Status::FromErrno("pipe", err);
  }
  // Buffered output would otherwise be written twice (once by each process).
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    for (int fd : {control[0], control[1], report[0], report[1]}) ::close(fd);
    return Status::FromErrno("fork", err);
  }
  if (pid == 0) {
    // Child: never returns into the caller's code; leaves through _exit so no parent-owned
    // destructors or atexit handlers run twice.
    const int control_fd = control[0], report_fd = report[1];
    CloseAllExcept(control_fd, report_fd);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(0);
    char go = 0;
    ssize_t n;
    do {
      n = ::read(control_fd, &go, 1);
    } while (n < 0 && errno == EINTR);
    if (n == 1) role(report_fd, control_fd);
    ::_exit(0);
  }
  ::close(control[0]);
  ::close(report[1]);
  return std::unique_ptr<TargetProcess>(
      new TargetProcess(std::move(name), pid, control[1], report[0]));
}

TargetProcess::~TargetProcess() {
  Stop();
}

Result<std::string> TargetProcess::Start(std::chrono::milliseconds timeout) {
  if (control_fd_ < 0) return Status::Unavailable(name_ + ": target process already stopped");
  char go = 'g';
  FARMEM_RETURN_IF_ERROR(WriteAll(control_fd_, &go, 1));
  auto msg = ReadMessage(report_fd_, timeout);
  if (!msg.ok()) return msg.status().WithContext(name_);
  return msg;
}

bool TargetProcess::Alive() {
  if (reaped_ || pid_ <= 0) return false;
  int st;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_ || (r < 0 && errno == ECHILD)) {
    reaped_ = true;
    return false;
  }
  return true;
}

void TargetProcess::Stop(std::chrono::milliseconds grace) {
  if (control_fd_ >= 0) {
    ::close(control_fd_);
    control_fd_ = -1;
  }
  if (report_fd_ >= 0) {
    ::close(report_fd_);
    report_fd_ = -1;
  }
  if (pid_ <= 0 || reaped_) return;
  auto deadline = Clock::now() + grace;
  while (Alive()) {
    if (Clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      int st;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      reaped_ = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace farmem::bench
