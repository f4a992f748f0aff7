// Shared by the channels examples: N farmem nodes in one process, each with its channels Manager
// over the same static participant list (loopback, native TCP), and a thread per node running the
// example's code. In a real deployment each node is its own process or host; the code is the same.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <farmem/channels.h>
#include <farmem/node.h>

namespace example {

namespace ch = farmem::channels;

// Exits the program with status 1 if `st` is an error.
inline void Check(const farmem::Status& st, const std::string& what) {
  if (!st.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", what.c_str(), st.ToString().c_str());
    std::exit(1);
  }
}

// A loopback port that was free a moment ago (the participant list needs every port up front).
inline uint16_t FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("bind 127.0.0.1:0");
    std::exit(1);
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Starts `n` nodes (ids 1..n), connects their managers, then runs `body(id, thread)` on one OS
// thread per node and waits for all of them. Teardown order: threads, node stopped, manager, node.
inline void RunNodes(int n, const std::function<void(ch::NodeId, ch::ChannelThread&)>& body) {
  std::vector<uint16_t> ports;
  std::vector<ch::Participant> participants;
  for (int i = 1; i <= n; i++) {
    ports.push_back(FreePort());
    participants.push_back(
        {static_cast<ch::NodeId>(i), "127.0.0.1:" + std::to_string(ports.back())});
  }
  std::vector<std::unique_ptr<farmem::Node>> nodes;
  std::vector<std::unique_ptr<ch::Manager>> managers;
  for (int i = 1; i <= n; i++) {
    farmem::NodeConfig nc;
    nc.name = "node" + std::to_string(i);
    nc.bootstrap_port = ports[i - 1];
    auto node = farmem::Node::Create(nc);
    Check(node.status(), "Node::Create");
    ch::ManagerConfig mc;
    mc.self = static_cast<ch::NodeId>(i);
    mc.participants = participants;
    auto mgr = ch::Manager::Create(**node, mc);  // before start: registers JOIN, exports memory
    Check(mgr.status(), "Manager::Create");
    Check((*node)->start(), "Node::start");
    nodes.push_back(std::move(*node));
    managers.push_back(std::move(*mgr));
  }
  std::vector<std::thread> threads;
  for (int i = 1; i <= n; i++) {
    threads.emplace_back([&, i] {
      ch::Manager& m = *managers[i - 1];
      Check(m.connect(std::chrono::seconds(10)), "connect");
      auto thread = m.make_thread();  // one ChannelThread per OS thread
      Check(thread.status(), "make_thread");
      body(static_cast<ch::NodeId>(i), **thread);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& node : nodes) node->stop();
  managers.clear();
  nodes.clear();
}

}  // namespace example
