// Helpers shared by the node tests: building nodes for a backend under test ("tcp" or
// "fabric:shm"), skipping when that backend is not available yet, and raw-socket utilities for
// poking the bootstrap port. Header-only: test code, not part of farmem_node.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "common/port_test_util.h"
#include "farmem/node.h"

namespace farmem::node::testing {

// "tcp" or "fabric:<provider>" -> a loopback node config.
inline NodeConfig MakeConfig(const std::string& backend, const std::string& name,
                             const std::string& token = "test-token") {
  NodeConfig c;
  c.name = name;
  c.bootstrap_host = "127.0.0.1";
  c.bootstrap_port = 0;
  c.rpc_workers = 2;
  if (backend.rfind("fabric:", 0) == 0) {
    c.transport.backend = "fabric";
    c.transport.provider = backend.substr(7);
  } else {
    c.transport.backend = backend;
  }
  c.transport.listen_host = "127.0.0.1";
  c.transport.cluster_token = token;
  c.transport.op_timeout = std::chrono::milliseconds(5000);
  c.transport.connect_timeout = std::chrono::milliseconds(2000);
  return c;
}

// A started node, or nullptr with `skip` set when the backend cannot be created here (for
// example the native TCP backend before it lands). Any other failure is a test failure.
inline std::unique_ptr<Node> StartNode(const NodeConfig& config, std::string* skip) {
  auto node = Node::Create(config);
  if (!node.ok()) {
    if (node.status().code() == Code::kUnavailable || node.status().code() == Code::kNotFound) {
      *skip = node.status().ToString();
      return nullptr;
    }
    ADD_FAILURE() << "Node::Create: " << node.status().ToString();
    return nullptr;
  }
  Status st = (*node)->start();
  if (!st.ok()) {
    ADD_FAILURE() << "Node::start: " << st.ToString();
    return nullptr;
  }
  return std::move(*node);
}

// A loopback TCP port nothing listens on (common/port_test_util.h: below the ephemeral range).
inline uint16_t UnusedPort() {
  return ::farmem::testing::FreePortBelowEphemeralRange();
}

// A listening socket that never accepts or answers; closed on destruction.
class SilentListener {
 public:
  SilentListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && ::listen(fd_, 16) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~SilentListener() { ::close(fd_); }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// Connects to 127.0.0.1:port with a receive timeout; -1 on failure.
inline int RawConnect(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Port part of "host:port".
inline uint16_t PortOf(const std::string& address) {
  return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}

}  // namespace farmem::node::testing
