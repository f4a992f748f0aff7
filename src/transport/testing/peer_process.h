// A forked peer process for transport fault tests: the child runs a body (typically: create its
// own Transport, export memory, report its address) and talks to the parent over a socketpair
// with length-prefixed messages. The parent can SIGKILL it to simulate a peer dying mid-operation.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

#include "farmem/status.h"
#include "transport/fabric/fabric_util.h"
#include "transport/testing/watchdog.h"

namespace farmem::testing {

// One end of the parent<->child channel. Every message is a 4-byte length then that many bytes
// (addresses are opaque and may hold any byte, so no text framing).
class PeerChannel {
 public:
  explicit PeerChannel(int fd = -1) : fd_(fd) {}
  int fd() const { return fd_; }

  Status Send(std::string_view msg) const {
    uint32_t len = static_cast<uint32_t>(msg.size());
    FARMEM_RETURN_IF_ERROR(WriteAll(&len, sizeof(len)));
    return WriteAll(msg.data(), msg.size());
  }

  // Waits at most `timeout` for one whole message; EOF (the other side exited) is kUnavailable.
  Result<std::string> Receive(std::chrono::milliseconds timeout) const {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    uint32_t len = 0;
    FARMEM_RETURN_IF_ERROR(ReadAll(&len, sizeof(len), deadline));
    if (len > (1u << 20)) return Status::Protocol("peer channel message too long");
    std::string msg(len, '\0');
    FARMEM_RETURN_IF_ERROR(ReadAll(msg.data(), len, deadline));
    return msg;
  }

 private:
  Status WriteAll(const void* data, size_t len) const {
    const char* p = static_cast<const char*>(data);
    while (len > 0) {
      // MSG_NOSIGNAL: a dead peer must give EPIPE, not kill the test with SIGPIPE.
      ssize_t n = ::send(fd_, p, len, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Status::FromErrno("peer channel send", errno);
      p += n;
      len -= static_cast<size_t>(n);
    }
    return Status::OK();
  }

  Status ReadAll(void* data, size_t len, std::chrono::steady_clock::time_point deadline) const {
    char* p = static_cast<char*>(data);
    while (len > 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return Status::TimedOut("peer channel receive");
      pollfd pfd{fd_, POLLIN, 0};
      int r = ::poll(&pfd, 1, static_cast<int>(left.count()));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return Status::FromErrno("peer channel poll", errno);
      if (r == 0) continue;  // re-check the deadline
      ssize_t n = ::recv(fd_, p, len, 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (n < 0) return Status::FromErrno("peer channel recv", errno);
      if (n == 0) return Status::Unavailable("peer process closed its channel");
      p += n;
      len -= static_cast<size_t>(n);
    }
    return Status::OK();
  }

  int fd_;
};

class PeerProcess {
 public:
  // The child's work. It runs in a fresh fork: it must build everything it uses itself (never
  // touch the parent's Transport objects) and must not use gtest assertions. Its return value is
  // the child's exit code.
  using Body = std::function<int(const PeerChannel& to_parent)>;

  PeerProcess() = default;
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  ~PeerProcess() { Kill(); }

  // Fork should happen while the parent is single-threaded (before it starts any transport), so
  // the child does not inherit locks held by threads that no longer exist there.
  // `child_lifetime` bounds how long an orphaned child can live.
  Status Start(Body body, std::chrono::seconds child_lifetime = std::chrono::seconds(60)) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      return Status::FromErrno("socketpair", errno);
    }
    pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) {
      int err = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      return Status::FromErrno("fork", err);
    }
    if (pid == 0) {
      ::close(fds[0]);
      Watchdog::ResetInChild();
      // Die with the parent, and never outlive `child_lifetime` (default SIGALRM action kills).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(3);
      ::alarm(static_cast<unsigned>(child_lifetime.count()));
      int code = body(PeerChannel(fds[1]));
      // _exit: skip the parent's atexit handlers and static destructors (gtest state).
      _exit(code);
    }
    ::close(fds[1]);
    pid_ = pid;
    channel_ = PeerChannel(fds[0]);
    return Status::OK();
  }

  const PeerChannel& channel() const { return channel_; }
  pid_t pid() const { return pid_; }

  // SIGKILL and reap the child. Idempotent.
  void Kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      RemoveShmOf(pid_);
      pid_ = -1;
    }
    if (channel_.fd() >= 0) {
      ::close(channel_.fd());
      channel_ = PeerChannel();
    }
  }

 private:
  // libfabric's shm provider names our segments "/dev/shm/<pid>_..." (fabric::ShmSourceName) and
  // unlinks them at exit; a SIGKILLed peer cannot, so the test that killed it removes them (else
  // every run leaks 16 MiB+).
  static void RemoveShmOf(pid_t pid) {
    const std::string prefix = fabric::ShmFilePrefix(pid);
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
      if (e.path().filename().string().starts_with(prefix)) std::filesystem::remove(e.path(), ec);
    }
  }

  pid_t pid_ = -1;
  PeerChannel channel_;
};

// Threads of the calling process (from /proc/self/status); tests log it before fork() so a
// deadlocked child can be traced to threads the parent still had.
inline int CountThreads() {
  int n = 0;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f)) {
      if (std::strncmp(line, "Threads:", 8) == 0) n = std::atoi(line + 8);
    }
    std::fclose(f);
  }
  return n;
}

}  // namespace farmem::testing
