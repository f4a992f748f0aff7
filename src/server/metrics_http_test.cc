// Tests of the metrics endpoint: a real HTTP GET against the responder on loopback (200 for
// /metrics, 404 otherwise) and its limits (idle connections, oversized heads, the descriptor
// limit). Rendering is tested in src/service/metrics_test.cc.
#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "transport/testing/limits_util.h"

namespace farmem {
namespace {

using namespace std::chrono_literals;

// A connection from 127.0.0.`host` (any 127/8 address is loopback) that sends nothing; -1 on
// failure. `fd` is a socket made beforehand, or -1 for a new one.
int IdleConnection(uint16_t port, uint8_t host, int fd = -1) {
  if (fd < 0) fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in self{};
  self.sin_family = AF_INET;
  self.sin_addr.s_addr = htonl(0x7f000000u | host);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&self), sizeof(self)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The response to `request` (read until the server closes, at most 5 s of silence).
std::string Get(uint16_t port, const std::string& request) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "connect failed";
  }
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 5000) <= 0) break;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

TEST(MetricsTest, ServesOverHttp) {
  auto server = MetricsHttpServer::Start("127.0.0.1", 0,
                                         [] { return std::string("farmem_allocations 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  uint16_t port = (*server)->port();
  ASSERT_NE(port, 0);
  std::string ok = Get(port, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("farmem_allocations 1"), std::string::npos);
  std::string missing = Get(port, "GET / HTTP/1.0\r\n\r\n");
  EXPECT_EQ(missing.rfind("HTTP/1.0 404", 0), 0u) << missing;
  std::string post = Get(port, "POST /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(post.rfind("HTTP/1.0 405", 0), 0u) << post;
  (*server)->stop();
  EXPECT_EQ(MetricsHttpServer::Start("not-an-ip", 0, [] { return std::string(); }).status().code(),
            Code::kInvalidArgument);
}

// Issue 16 (slow peers delay others), on the metrics port: idle connections used to be served
// one at a time, 2 s each, so 100 of them held a scrape for minutes. Now they are multiplexed and
// a flood from one address evicts its own oldest connection, never the scrape.
TEST(MetricsTest, IdleConnectionsDoNotDelayAScrape) {
  auto server = MetricsHttpServer::Start(
      "127.0.0.1", 0, [] { return std::string("up 1\n"); },
      MetricsHttpLimits{.max_connections = 16});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const uint16_t port = (*server)->port();
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) {
    const int fd = IdleConnection(port, 2);
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  // Get gives up after 5 s of silence; the old serial loop needed 100 x 2 s.
  const std::string ok = Get(port, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << ok;
  for (int fd : idle) close(fd);
  const MetricsHttpStats st = (*server)->stats();
  EXPECT_EQ(st.served, 1u);
  EXPECT_GE(st.evicted, 100u - 16u);
}

TEST(MetricsTest, OversizedHeadIsRefusedAndSilentPeerTimesOut) {
  auto server = MetricsHttpServer::Start(
      "127.0.0.1", 0, [] { return std::string("up 1\n"); },
      MetricsHttpLimits{.max_request_bytes = 256, .deadline = 300ms});
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const uint16_t port = (*server)->port();
  const std::string big = Get(port, "GET /metrics HTTP/1.0\r\nX-Pad: " + std::string(1000, 'x'));
  EXPECT_EQ(big.rfind("HTTP/1.0 431", 0), 0u) << big;
  const int silent = IdleConnection(port, 3);
  ASSERT_GE(silent, 0);
  // The server closes it at its deadline: the read sees EOF (0), not a 5 s timeout.
  pollfd p{silent, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  char c;
  EXPECT_EQ(read(silent, &c, 1), 0);
  close(silent);
  const MetricsHttpStats st = (*server)->stats();
  EXPECT_GE(st.malformed, 1u);
  EXPECT_EQ(st.timed_out, 1u);
  EXPECT_EQ(
      MetricsHttpServer::Start(
          "127.0.0.1", 0, [] { return std::string(); }, MetricsHttpLimits{.max_connections = 0})
          .status()
          .code(),
      Code::kInvalidArgument);
}

// Issue 16, finding 3, on the metrics port: at the descriptor limit the old loop retried accept
// at once, forever (a core at 100 %). Now the listener pauses, and serves again afterwards.
TEST(MetricsTest, AcceptAtDescriptorLimitBacksOffStress) {
  farmem::testing::LogCounter emfile_logs("Too many open files");
  auto server = MetricsHttpServer::Start("127.0.0.1", 0, [] { return std::string("up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const uint16_t port = (*server)->port();
  farmem::testing::ScopeExit stop_first{[&] { (*server)->stop(); }};
  std::vector<int> clients;
  {
    // The clients' sockets are made first: once the table is full nothing else can be opened.
    for (int i = 0; i < 4; ++i) clients.push_back(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    farmem::testing::FdExhauster fds;
    ASSERT_TRUE(fds.ok()) << "could not lower RLIMIT_NOFILE";
    for (int& fd : clients) {
      fd = IdleConnection(port, 4, fd);
      ASSERT_GE(fd, 0);
    }
    const double cpu0 = farmem::testing::ProcessCpuSeconds();
    std::this_thread::sleep_for(1s);  // the interval being measured
    const double cpu = farmem::testing::ProcessCpuSeconds() - cpu0;
    EXPECT_LT(cpu, 0.3) << "the process used " << cpu << " s of CPU in 1 s at the fd limit";
    EXPECT_LE(emfile_logs.count(), 3u) << "the accept error was not rate-limited";
    EXPECT_GE((*server)->stats().accept_backoffs, 1u);
  }
  for (int fd : clients) close(fd);
  const std::string ok = Get(port, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.0 200 OK\r\n", 0), 0u) << ok;
}

}  // namespace
}  // namespace farmem
