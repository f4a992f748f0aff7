// TxEnv: test-only fixture helper for the tx service and client: one or two in-process farmemd
// (services "tx" only) holding partitions 0..n-1 of the same tables, on a given backend (native
// TCP or fabric shm), and a started client node. Used by the tests of src/tx/client and
// src/tx/service from their main thread; the servers' own threads serve them.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "farmem/server.h"
#include "farmem/tx.h"
#include "node/node_test_util.h"

namespace farmem::tx_test {

struct TxEnv {
  std::vector<std::unique_ptr<MemoryServer>> servers;
  std::unique_ptr<Node> node;  // client side
  std::vector<std::string> addresses;

  ~TxEnv() {
    if (node) node->stop();
    for (auto& s : servers) s->stop();
  }

  // `tables`: --tx-table specs. A failure is reported with ADD_FAILURE and leaves `node` null.
  static std::unique_ptr<TxEnv> Start(const std::string& backend, uint32_t partitions,
                                      std::vector<std::string> tables, uint32_t lease_ms = 5000,
                                      uint32_t overflow_percent = 25) {
    auto env = std::make_unique<TxEnv>();
    for (uint32_t p = 0; p < partitions; ++p) {
      ServerConfig sc;
      sc.node = ::farmem::node::testing::MakeConfig(backend, "tx-farmemd-" + std::to_string(p));
      sc.node.rpc_workers = 2;
      sc.services = {"tx"};
      sc.memory_bytes = 16ull << 20;
      sc.pool_bytes = 4ull << 20;
      sc.tx.tables = tables;
      sc.tx.partition = p;
      sc.tx.partitions = partitions;
      sc.tx.lease_ms = lease_ms;
      sc.tx.overflow_percent = overflow_percent;
      auto s = MemoryServer::Create(sc);
      if (!s.ok()) {
        ADD_FAILURE() << "server create: " << s.status().ToString();
        return env;
      }
      if (Status st = (*s)->start(); !st.ok()) {
        ADD_FAILURE() << "server start: " << st.ToString();
        return env;
      }
      env->addresses.push_back((*s)->node().bootstrap_address());
      env->servers.push_back(std::move(*s));
    }
    auto n = Node::Create(::farmem::node::testing::MakeConfig(backend, "tx-client"));
    Status st = n.ok() ? (*n)->start() : n.status();
    if (!st.ok()) {
      ADD_FAILURE() << "client node: " << st.ToString();
      return env;
    }
    env->node = std::move(*n);
    return env;
  }

  Result<std::unique_ptr<TxClient>> Connect(TxClientOptions options = {}) {
    return TxClient::Connect(*node, addresses, options);
  }
};

inline std::vector<std::byte> Key(uint64_t k, size_t size = 8) {
  std::vector<std::byte> out(size);
  std::memcpy(out.data(), &k, 8);
  return out;
}
inline std::vector<std::byte> Value(uint64_t v, size_t size) {
  std::vector<std::byte> out(size);
  std::memcpy(out.data(), &v, 8);
  return out;
}
inline uint64_t U64(std::span<const std::byte> b) {
  uint64_t v = 0;
  std::memcpy(&v, b.data(), 8);
  return v;
}

// The backends the tx tests run on, and their test-name suffixes:
// INSTANTIATE_TEST_SUITE_P(Backends, Suite, kTxBackends, TxBackendName).
inline const auto kTxBackends = ::testing::Values(std::string("tcp"), std::string("fabric:shm"));
inline std::string TxBackendName(const ::testing::TestParamInfo<std::string>& info) {
  return info.param == "tcp" ? "tcp" : "fabric_shm";
}

// Runs this test binary as a child process on the test `filter` (usually a DISABLED_ one) with
// `env` added to this process's environment, waits (up to 60 s) until it prints `marker` on
// stdout, then SIGKILLs it (the kernel closes its connections). True when it reached the marker
// and died of the signal; otherwise a failure is reported with its output.
inline bool KillChildAtMarker(const std::string& filter, const std::vector<std::string>& env,
                              const std::string& marker) {
  std::vector<std::string> args = {"/proc/self/exe", "--gtest_filter=" + filter,
                                   "--gtest_also_run_disabled_tests"};
  std::vector<std::string> all_env;
  for (char** e = environ; *e != nullptr; ++e) all_env.emplace_back(*e);
  all_env.insert(all_env.end(), env.begin(), env.end());
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : all_env) envp.push_back(e.data());
  envp.push_back(nullptr);
  int fds[2];
  if (pipe(fds) != 0) {
    ADD_FAILURE() << "pipe";
    return false;
  }
  const pid_t pid = fork();
  if (pid < 0) {  // never reach kill(pid) below with -1: that signals every process
    close(fds[0]);
    close(fds[1]);
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return false;
  }
  if (pid == 0) {  // only async-signal-safe calls until exec
    dup2(fds[1], 1);
    close(fds[0]);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(fds[1]);
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool reached = false;
  while (!reached && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;  // the child exited
    out.append(buf, static_cast<size_t>(n));
    reached = out.find(marker) != std::string::npos;
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  close(fds[0]);
  if (!reached) {
    ADD_FAILURE() << "the child process did not print " << marker << "; its output:\n" << out;
    return false;
  }
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

}  // namespace farmem::tx_test
