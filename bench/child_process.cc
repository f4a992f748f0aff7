// Spawn and KillAndReap (child_process.h): the benchmarks' fork + exec of other programs.
// Called from the benchmark's main thread or one generator thread.
#include "child_process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <thread>

extern char** environ;

namespace farmem::bench {

Result<pid_t> Spawn(const std::vector<std::string>& args, int stdout_fd, int stderr_fd, int cpu) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno("fork", errno);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    if (cpu >= 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(cpu, &set);
      if (::sched_setaffinity(0, sizeof(set), &set) != 0) ::_exit(126);
    }
    const int null_fd = ::open("/dev/null", O_RDWR);
    ::dup2(stdout_fd >= 0 ? stdout_fd : null_fd, STDOUT_FILENO);
    ::dup2(stderr_fd >= 0 ? stderr_fd : null_fd, STDERR_FILENO);
    ::dup2(null_fd, STDIN_FILENO);
    if (::syscall(SYS_close_range, 3u, ~0u, 0u) != 0)
      for (int fd = 3; fd < 65536; ++fd) ::close(fd);
    ::execve(argv[0], argv.data(), environ);
    ::_exit(127);
  }
  return pid;
}

void KillAndReap(pid_t pid, std::chrono::milliseconds grace) {
  if (pid <= 0) return;
  int st = 0;
  if (grace.count() > 0) {
    ::kill(pid, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + grace;
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid, &st, WNOHANG) == pid) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &st, 0);
}

Result<uint16_t> PickFreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno("socket", errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int err = errno;
    ::close(fd);
    return Status::FromErrno("bind 127.0.0.1:0", err);
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace farmem::bench
