// EtcdProcess: a real etcd (Debian's etcd-server) started by a test on free loopback ports with a
// temporary data directory, stopped (or killed, or restarted on the same ports and data) by the
// test, and removed at the end; optionally with TLS (and client-certificate auth) on the client
// port. Tests skip with a message when /usr/bin/etcd is missing.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/port_test_util.h"
#include "farmem/status.h"

extern char** environ;

namespace farmem::cluster::testing {

inline std::string EtcdBinary() {
  if (const char* e = std::getenv("FARMEM_ETCD")) return e;
  return "/usr/bin/etcd";
}

inline bool EtcdAvailable() {
  return ::access(EtcdBinary().c_str(), X_OK) == 0;
}

// etcdctl next to the etcd binary (FARMEM_ETCDCTL overrides).
inline std::string EtcdctlBinary() {
  if (const char* e = std::getenv("FARMEM_ETCDCTL")) return e;
  return std::filesystem::path(EtcdBinary()).parent_path() / "etcdctl";
}

// A port nobody listens on right now (common/port_test_util.h: below the ephemeral range); -1
// if none was found.
inline int FreeLoopbackPort() {
  const uint16_t port = ::farmem::testing::FreePortBelowEphemeralRange();
  return port == 0 ? -1 : port;
}

inline bool PortAccepts(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// TLS on etcd's client port (the peer port stays plain: one member, loopback only). Paths of PEM
// files, typically written into EtcdProcess::dir() after Prepare().
struct EtcdTls {
  std::string cert_file;  // the server's certificate (--cert-file)
  std::string key_file;   // and its key (--key-file)
  // Require clients to present a certificate signed by trusted_ca_file (--client-cert-auth).
  bool client_cert_auth = false;
  std::string trusted_ca_file;
  // What Etcdctl() uses to reach this etcd: the CA that signed cert_file and, with
  // client_cert_auth, a client certificate and key.
  std::string ca_file;
  std::string client_cert_file;
  std::string client_key_file;
};

class EtcdProcess {
 public:
  EtcdProcess() = default;
  ~EtcdProcess() {
    Kill();
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // Picks ports and a data directory, starts etcd and waits (up to 20 s) until it accepts
  // clients. `extra_args` go to etcd as they are (e.g. "--auto-compaction-retention=1").
  Status Start(std::vector<std::string> extra_args = {}) {
    FARMEM_RETURN_IF_ERROR(Prepare());
    use_tls_ = false;
    extra_args_ = std::move(extra_args);
    return FirstStart();
  }

  // Like Start, with TLS on the client port: etcd listens on https:// and url() is etcds://.
  // Call Prepare() first to have dir() to write the certificates into.
  Status StartTls(EtcdTls tls, std::vector<std::string> extra_args = {}) {
    FARMEM_RETURN_IF_ERROR(Prepare());
    tls_ = std::move(tls);
    use_tls_ = true;
    extra_args_ = std::move(extra_args);
    return FirstStart();
  }

  // Picks the ports and creates the temporary directory without starting etcd (Start and
  // StartTls do it when it was not done). NotFound when etcd is not installed.
  Status Prepare() {
    if (!EtcdAvailable())
      return Status::NotFound(EtcdBinary() + " not found (apt install etcd-server)");
    if (!dir_.empty()) return Status::OK();
    char tmpl[] = "/tmp/farmem-etcd-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return Status::FromErrno("mkdtemp", errno);
    dir_ = tmpl;
    client_port_ = FreeLoopbackPort();
    peer_port_ = FreeLoopbackPort();
    return Status::OK();
  }

  // Starts etcd again on the same ports and data (after Stop or Kill).
  Status Restart() {
    if (pid_ > 0) return Status::Internal("etcd already running");
    std::string client =
        (use_tls_ ? "https://127.0.0.1:" : "http://127.0.0.1:") + std::to_string(client_port_);
    std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> args = {EtcdBinary(),
                                     "--name=farmem-test",
                                     "--data-dir=" + dir_ + "/data",
                                     "--listen-client-urls=" + client,
                                     "--advertise-client-urls=" + client,
                                     "--listen-peer-urls=" + peer,
                                     "--initial-advertise-peer-urls=" + peer,
                                     "--initial-cluster=farmem-test=" + peer,
                                     "--log-outputs=" + dir_ + "/etcd.log",
                                     "--logger=zap"};
    if (use_tls_) {
      args.push_back("--cert-file=" + tls_.cert_file);
      args.push_back("--key-file=" + tls_.key_file);
      if (tls_.client_cert_auth) args.push_back("--client-cert-auth");
      if (!tls_.trusted_ca_file.empty())
        args.push_back("--trusted-ca-file=" + tls_.trusted_ca_file);
    }
    for (const auto& a : extra_args_) args.push_back(a);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // Debian's etcd 3.4 refuses to start on some architectures without this; harmless on amd64.
    ::setenv("ETCD_UNSUPPORTED_ARCH", "", 0);
    pid_t pid = -1;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, (dir_ + "/etcd.stderr").c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    // Ready means *this* etcd serves its client port: a port that only accepts could belong to
    // another test's etcd that took it between FreeLoopbackPort and our bind (our etcd then exits,
    // but a test that saw the port accept would talk to the other one). So also wait for this
    // run's "serving client traffic" line in our own log (written after the listener is up).
    std::error_code size_ec;
    const auto log_start = std::filesystem::file_size(dir_ + "/etcd.log", size_ec);
    const uint64_t log_offset = size_ec ? 0 : static_cast<uint64_t>(log_start);
    int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return Status::FromErrno("posix_spawn etcd", rc);
    pid_ = pid;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return Status::Unavailable("etcd exited at start; see " + dir_ + "/etcd.stderr");
      }
      if (PortAccepts(client_port_) && LogHasSince(log_offset, "serving client traffic"))
        return Status::OK();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Kill();
    return Status::TimedOut("etcd did not accept clients within 20 s");
  }

  // SIGTERM and wait.
  void Stop() { Signal(SIGTERM); }
  // SIGKILL and wait.
  void Kill() { Signal(SIGKILL); }
  // SIGSTOP / SIGCONT: etcd keeps its sockets but answers nothing (a hung store). Pause returns
  // only once every etcd thread is stopped: a group stop is not instant — on a loaded machine a
  // Go thread already running went on answering requests for tens of milliseconds after kill()
  // returned (seen in CI: a get answered 0 ms after the SIGSTOP). Internal after 10 s.
  Status Pause() {
    if (pid_ <= 0) return Status::Internal("etcd is not running");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      // Sent again each round: harmless when already stopped, and a stop that a SIGCONT raced
      // away is not waited for in vain.
      ::kill(pid_, SIGSTOP);
      if (AllThreadsStopped()) return Status::OK();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return Status::Internal("etcd pid " + std::to_string(pid_) + " did not stop within 10 s");
  }
  void Resume() {
    if (pid_ > 0) ::kill(pid_, SIGCONT);
  }

  // Runs `etcdctl --endpoints=<this etcd> <args...>` (API v3, 5 s command timeout) and waits;
  // its stdout+stderr go to *output. Internal unless it exits 0. For tests that set up the
  // store out of band (auth, compaction, ...). Uses EtcdTls' ca/client files after StartTls.
  Status Etcdctl(const std::vector<std::string>& args, std::string* output = nullptr) const {
    std::string out_file = dir_ + "/etcdctl.out";
    std::vector<std::string> all = {
        EtcdctlBinary(), "--endpoints=" + std::string(use_tls_ ? "https://" : "") + endpoint(),
        "--dial-timeout=3s", "--command-timeout=5s"};
    if (use_tls_) {
      if (!tls_.ca_file.empty()) all.push_back("--cacert=" + tls_.ca_file);
      if (!tls_.client_cert_file.empty()) all.push_back("--cert=" + tls_.client_cert_file);
      if (!tls_.client_key_file.empty()) all.push_back("--key=" + tls_.client_key_file);
    }
    for (const auto& a : args) all.push_back(a);
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::setenv("ETCDCTL_API", "3", 1);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out_file.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid = -1;
    int rc = ::posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return Status::FromErrno("posix_spawn etcdctl", rc);
    int status = 0;
    ::waitpid(pid, &status, 0);
    std::string text;
    if (FILE* f = std::fopen(out_file.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
      std::fclose(f);
    }
    if (output != nullptr) *output = text;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return Status::Internal("etcdctl failed: " + text);
    }
    return Status::OK();
  }

  bool running() const { return pid_ > 0; }
  int client_port() const { return client_port_; }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(client_port_); }
  // etcd:// (etcds:// when started with StartTls).
  std::string url() const { return (use_tls_ ? "etcds://" : "etcd://") + endpoint(); }
  const std::string& dir() const { return dir_; }

 private:
  // Restart, and when etcd exits at once — its ports were taken by another process between
  // FreeLoopbackPort and its bind — again on fresh ports and an empty data dir, up to 3 tries.
  Status FirstStart() {
    Status st = Restart();
    for (int i = 0; i < 2 && st.code() == Code::kUnavailable; ++i) {
      client_port_ = FreeLoopbackPort();
      peer_port_ = FreeLoopbackPort();
      std::error_code ec;
      std::filesystem::remove_all(dir_ + "/data", ec);
      st = Restart();
    }
    return st;
  }

  // Whether every thread of etcd is in state T (stopped) or t (traced), from /proc/PID/task.
  bool AllThreadsStopped() const {
    std::error_code ec;
    std::filesystem::directory_iterator it("/proc/" + std::to_string(pid_) + "/task", ec);
    if (ec) return false;
    bool any = false;
    for (const auto& task : it) {
      FILE* f = std::fopen((task.path() / "stat").c_str(), "r");
      if (f == nullptr) continue;  // the thread just exited
      char buf[512];
      size_t n = std::fread(buf, 1, sizeof buf - 1, f);
      std::fclose(f);
      buf[n] = '\0';
      // "pid (comm) S ...": the state follows the last ')' (comm may contain one).
      const char* close = std::strrchr(buf, ')');
      if (close == nullptr || close[1] != ' ') return false;
      if (close[2] != 'T' && close[2] != 't') return false;
      any = true;
    }
    return any;
  }

  // Whether dir_/etcd.log contains `what` at or after byte `offset`.
  bool LogHasSince(uint64_t offset, const std::string& what) const {
    FILE* f = std::fopen((dir_ + "/etcd.log").c_str(), "r");
    if (f == nullptr) return false;
    std::string text;
    if (std::fseek(f, static_cast<long>(offset), SEEK_SET) == 0) {
      char buf[4096];
      size_t n;
      while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
    }
    std::fclose(f);
    return text.find(what) != std::string::npos;
  }

  void Signal(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, sig);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::string dir_;
  int client_port_ = -1;
  int peer_port_ = -1;
  std::vector<std::string> extra_args_;
  bool use_tls_ = false;
  EtcdTls tls_;
  pid_t pid_ = -1;
};

}  // namespace farmem::cluster::testing
