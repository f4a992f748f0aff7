// Tests of the metrics endpoint: a real HTTP GET against the responder on loopback (200 for
// /metrics, 404 otherwise). Rendering is tested in src/service/metrics_test.cc.
#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace farmem {
namespace {

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

}  // namespace
}  // namespace farmem
