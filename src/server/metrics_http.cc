// A minimal HTTP/1.0 server for Prometheus scrapes of farmemd's metrics. One thread (Loop) owns
// the listener and every connection: a poll() loop over non-blocking sockets, each connection with
// a deadline, the oldest evicted when a new one would exceed the limit, and accept backoff when
// the process is out of descriptors. stats() is read from any thread (atomic counters).
#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/log.h"
#include "common/net/accept_backoff.h"
#include "common/net/socket.h"

namespace farmem {
namespace {

using Clock = std::chrono::steady_clock;

// One accepted connection: reading its request head, then writing the response.
struct Conn {
  int fd = -1;
  std::string addr_key;  // net::AddressKey of the peer
  Clock::time_point deadline;
  std::string head;      // request bytes so far (reading) ...
  std::string response;  // ... or the whole response (writing)
  size_t sent = 0;
  bool writing = false;
};

// Which connection to close for a new one when all places are taken: the oldest of the address
// holding the most, so a flood from one address evicts its own connections, not a scrape's.
size_t OldestOfBusiestAddress(const std::deque<Conn>& conns) {
  std::unordered_map<std::string_view, size_t> count;
  for (const Conn& c : conns) ++count[c.addr_key];
  size_t best = 0;
  for (size_t i = 1; i < conns.size(); ++i) {
    if (count[conns[i].addr_key] > count[conns[best].addr_key]) best = i;
  }
  return best;  // conns is oldest first: the first of the busiest address
}

bool HeadComplete(const std::string& head) {
  return head.find("\r\n\r\n") != std::string::npos || head.find("\n\n") != std::string::npos;
}

std::string Response(const std::string& status, const std::string& body) {
  return "HTTP/1.0 " + status + "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

}  // namespace

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, uint16_t port, std::function<std::string()> render,
    MetricsHttpLimits limits) {
  // A numeric address only: the endpoint binds exactly where it is told (no name lookups).
  in6_addr probe6{};
  in_addr probe4{};
  if (inet_pton(AF_INET, host.c_str(), &probe4) != 1 &&
      inet_pton(AF_INET6, host.c_str(), &probe6) != 1) {
    return Status::InvalidArgument("metrics: '" + host + "' is not an IP address");
  }
  if (limits.max_connections < 1 || limits.max_request_bytes < 64 || limits.deadline.count() <= 0) {
    return Status::InvalidArgument(
        "metrics: limits need max_connections >= 1, max_request_bytes >= 64 and a positive "
        "deadline");
  }
  uint16_t bound = 0;
  FARMEM_ASSIGN_OR_RETURN(net::Fd listener, net::Listen(host, port, 64, "metrics", &bound));
  const int fd = listener.release();
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
    const int err = errno;
    close(fd);
    return Status::FromErrno("metrics: fcntl", err);
  }
  auto server = std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(fd, bound, std::move(render), limits));
  if (pipe2(server->wake_, O_CLOEXEC) != 0) return Status::FromErrno("metrics: pipe", errno);
  server->thread_ = std::thread([s = server.get()] { s->Loop(); });
  return server;
}

MetricsHttpServer::MetricsHttpServer(int fd, uint16_t port, std::function<std::string()> render,
                                     MetricsHttpLimits limits)
    : fd_(fd), port_(port), render_(std::move(render)), limits_(limits) {}

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

MetricsHttpStats MetricsHttpServer::stats() const {
  MetricsHttpStats s;
  s.served = served_.load(std::memory_order_relaxed);
  s.timed_out = timed_out_.load(std::memory_order_relaxed);
  s.evicted = evicted_.load(std::memory_order_relaxed);
  s.malformed = malformed_.load(std::memory_order_relaxed);
  s.accept_backoffs = backoffs_.load(std::memory_order_relaxed);
  return s;
}

std::string MetricsHttpServer::metrics_text() const {
  const MetricsHttpStats s = stats();
  std::string out =
      "# HELP farmem_metrics_http_connections_total Connections of the metrics endpoint by "
      "outcome.\n# TYPE farmem_metrics_http_connections_total counter\n";
  const std::pair<const char*, uint64_t> rows[] = {{"served", s.served},
                                                   {"timed_out", s.timed_out},
                                                   {"evicted", s.evicted},
                                                   {"malformed", s.malformed}};
  for (const auto& [outcome, n] : rows) {
    out += "farmem_metrics_http_connections_total{outcome=\"" + std::string(outcome) + "\"} " +
           std::to_string(n) + "\n";
  }
  out +=
      "# HELP farmem_metrics_http_accept_backoffs_total Pauses of the metrics listener for lack "
      "of descriptors or memory.\n# TYPE farmem_metrics_http_accept_backoffs_total counter\n"
      "farmem_metrics_http_accept_backoffs_total " +
      std::to_string(s.accept_backoffs) + "\n";
  return out;
}

void MetricsHttpServer::Loop() {
  net::AcceptBackoff backoff("metrics", std::chrono::milliseconds(100), std::chrono::seconds(1));
  // Oldest first: eviction takes the front.
  std::deque<Conn> conns;
  std::vector<pollfd> fds;
  auto drop = [&](size_t i) {
    close(conns[i].fd);
    conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
  };
  while (!stopping_.load()) {
    const auto now = Clock::now();
    // Deadlines first, so the poll timeout below is never negative.
    for (size_t i = 0; i < conns.size();) {
      if (now >= conns[i].deadline) {
        timed_out_.fetch_add(1, std::memory_order_relaxed);
        drop(i);
      } else {
        ++i;
      }
    }
    fds.clear();
    fds.push_back({wake_[0], POLLIN, 0});
    const bool listening = !backoff.paused(now);
    fds.push_back({listening ? fd_ : -1, POLLIN, 0});
    auto wake_at = now + std::chrono::seconds(1);
    if (!listening) wake_at = std::min(wake_at, backoff.resume_at());
    for (const Conn& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.writing ? POLLOUT : POLLIN), 0});
      wake_at = std::min(wake_at, c.deadline);
    }
    const auto timeout_ms =
        std::chrono::ceil<std::chrono::milliseconds>(wake_at - Clock::now()).count();
    const int n = poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(timeout_ms, 0)));
    if (n < 0 && errno != EINTR) {
      FARMEM_LOG_WARN("metrics: poll: {}", std::strerror(errno));
      break;
    }
    if (n <= 0) continue;
    if (fds[0].revents != 0) break;
    // Connections (fds[2..]) before accepting, so indexes still match.
    for (size_t i = conns.size(); i-- > 0;) {
      const short ev = fds[i + 2].revents;
      if (ev == 0) continue;
      Conn& c = conns[i];
      if (!c.writing) {
        char buf[2048];
        const ssize_t got = recv(c.fd, buf, sizeof(buf), 0);
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (got <= 0) {  // closed or reset before the head was complete
          malformed_.fetch_add(1, std::memory_order_relaxed);
          drop(i);
          continue;
        }
        c.head.append(buf, static_cast<size_t>(got));
        if (c.head.size() > limits_.max_request_bytes) {
          malformed_.fetch_add(1, std::memory_order_relaxed);
          c.response = Response("431 Request Header Fields Too Large", "request too large\n");
        } else if (!HeadComplete(c.head)) {
          continue;
        } else {
          const std::string line = c.head.substr(0, c.head.find_first_of("\r\n"));
          if (line.rfind("GET /metrics ", 0) == 0 || line == "GET /metrics") {
            // The endpoint's own counters follow the server's.
            c.response = Response("200 OK", render_() + metrics_text());
          } else if (line.rfind("GET ", 0) != 0) {
            c.response = Response("405 Method Not Allowed", "only GET is supported\n");
          } else {
            c.response = Response("404 Not Found", "not found; try GET /metrics\n");
          }
        }
        c.head.clear();
        c.head.shrink_to_fit();
        c.writing = true;  // poll for POLLOUT next round (usually ready at once)
        continue;
      }
      const ssize_t put =
          send(c.fd, c.response.data() + c.sent, c.response.size() - c.sent, MSG_NOSIGNAL);
      if (put < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (put <= 0) {
        malformed_.fetch_add(1, std::memory_order_relaxed);
        drop(i);
        continue;
      }
      c.sent += static_cast<size_t>(put);
      if (c.sent == c.response.size()) {
        served_.fetch_add(1, std::memory_order_relaxed);
        drop(i);
      }
    }
    if (!listening || (fds[1].revents & POLLIN) == 0) continue;
    // Accept what is waiting (bounded per round, so connections keep being served).
    for (int k = 0; k < 64; ++k) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      const int conn =
          accept4(fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (conn < 0) {
        const int err = errno;
        const auto action = backoff.OnError(err, Clock::now());
        if (action == net::AcceptBackoff::Action::kRetry) continue;
        if (action == net::AcceptBackoff::Action::kPause) {
          backoffs_.fetch_add(1, std::memory_order_relaxed);
        }
        break;
      }
      backoff.OnSuccess();
      if (conns.size() >= static_cast<size_t>(limits_.max_connections)) {
        evicted_.fetch_add(1, std::memory_order_relaxed);
        drop(OldestOfBusiestAddress(conns));
      }
      Conn c;
      c.fd = conn;
      c.addr_key = net::AddressKey(ss);
      c.deadline = Clock::now() + limits_.deadline;
      conns.push_back(std::move(c));
    }
  }
  for (Conn& c : conns) close(c.fd);
}

}  // namespace farmem
