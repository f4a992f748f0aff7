// A minimal HTTP/1.0 server for Prometheus scrapes of farmemd's metrics (one thread, one connection
// at a time: scrapes are rare and the render callback is cheap).
#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/log.h"
#include "common/net/socket.h"

namespace farmem {
Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, uint16_t port, std::function<std::string()> render) {
  // A numeric address only: the endpoint binds exactly where it is told (no name lookups).
  in6_addr probe6{};
  in_addr probe4{};
  if (inet_pton(AF_INET, host.c_str(), &probe4) != 1 &&
      inet_pton(AF_INET6, host.c_str(), &probe6) != 1) {
    return Status::InvalidArgument("metrics: '" + host + "' is not an IP address");
  }
  uint16_t bound = 0;
  FARMEM_ASSIGN_OR_RETURN(net::Fd listener, net::Listen(host, port, 16, "metrics", &bound));
  const int fd = listener.release();
  auto server =
      std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(fd, bound, std::move(render)));
  if (pipe2(server->wake_, O_CLOEXEC) != 0) return Status::FromErrno("metrics: pipe", errno);
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

MetricsHttpServer::MetricsHttpServer(int fd, uint16_t port, std::function<std::string()> render)
    : fd_(fd), port_(port), render_(std::move(render)) {}

MetricsHttpServer::~MetricsHttpServer() {
  stop();
  close(fd_);
  for (int w : wake_) {
    if (w >= 0) close(w);
  }
}

void MetricsHttpServer::stop() {
  if (stopping_.exchange(true)) return;
  if (wake_[1] >= 0) {
    char b = 1;
    [[maybe_unused]] ssize_t n = write(wake_[1], &b, 1);
  }
  if (thread_.joinable()) thread_.join();
}

void MetricsHttpServer::Loop() {
  while (!stopping_.load()) {
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    int n = poll(fds, 2, 1000);
    if (n <= 0) continue;
    if (fds[1].revents) break;
    if (!(fds[0].revents & POLLIN)) continue;
    int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    Serve(conn);
    close(conn);
  }
}

void MetricsHttpServer::Serve(int conn) {
  // Read the request head (bounded, 2 s total) — only the request line matters.
  constexpr size_t kMaxHead = 8192;
  std::string head;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  char buf[1024];
  while (head.find("\r\n\r\n") == std::string::npos && head.find("\n\n") == std::string::npos &&
         head.size() < kMaxHead) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    pollfd p{conn, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return;
    ssize_t n = read(conn, buf, sizeof(buf));
    if (n <= 0) break;
    head.append(buf, static_cast<size_t>(n));
  }
  std::string status = "404 Not Found";
  std::string body = "not found; try GET /metrics\n";
  const std::string line = head.substr(0, head.find_first_of("\r\n"));
  if (line.rfind("GET /metrics ", 0) == 0 || line == "GET /metrics") {
    status = "200 OK";
    body = render_();
  } else if (line.rfind("GET ", 0) != 0) {
    status = "405 Method Not Allowed";
    body = "only GET is supported\n";
  }
  std::string resp = "HTTP/1.0 " + status +
                     "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
                     std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  size_t off = 0;
  while (off < resp.size()) {
    pollfd p{conn, POLLOUT, 0};
    if (poll(&p, 1, 2000) <= 0) return;
    ssize_t n = send(conn, resp.data() + off, resp.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

}  // namespace farmem
