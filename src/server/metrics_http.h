// A tiny HTTP/1.0 responder for Prometheus: GET /metrics returns what `render` produces
// (MemoryServer::metrics_text). One thread multiplexes up to MetricsHttpLimits::max_connections
// requests with poll(), each with its own deadline, so an idle or slow client never delays a
// scrape.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "farmem/status.h"

namespace farmem {

// Limits of the metrics listener (docs/server.md, "Metrics endpoint").
struct MetricsHttpLimits {
  // Connections served at once; a new one beyond this evicts the oldest (a scrape that arrives
  // while idle connections hold every place is still served).
  int max_connections = 32;
  // A request head (request line and headers) larger than this is refused (431).
  size_t max_request_bytes = 8192;
  // From accept to the last byte of the response; the connection is closed when it passes.
  std::chrono::milliseconds deadline{2000};
};

// Counters of the metrics listener (farmem_metrics_http_* in the Prometheus text, STAT
// "limits"."metrics_http").
struct MetricsHttpStats {
  uint64_t served = 0;           // responses sent completely
  uint64_t timed_out = 0;        // connections closed at their deadline
  uint64_t evicted = 0;          // connections closed to make room for a newer one
  uint64_t malformed = 0;        // oversized heads, peers that closed mid-request
  uint64_t accept_backoffs = 0;  // pauses of the listener for lack of descriptors or memory
};

class MetricsHttpServer {
 public:
  // Binds host:port (port 0 = ephemeral) and serves `render()` on GET /metrics.
  static Result<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, uint16_t port,
                                                          std::function<std::string()> render,
                                                          MetricsHttpLimits limits = {});
  ~MetricsHttpServer();
  uint16_t port() const { return port_; }
  void stop();
  MetricsHttpStats stats() const;
  // The counters as Prometheus text (appended to farmemd's /metrics).
  std::string metrics_text() const;

 private:
  MetricsHttpServer(int fd, uint16_t port, std::function<std::string()> render,
                    MetricsHttpLimits limits);
  void Loop();

  int fd_;
  int wake_[2] = {-1, -1};  // pipe: stop() writes to end the poll() loop
  uint16_t port_;
  std::function<std::string()> render_;
  const MetricsHttpLimits limits_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  // Written by the loop thread, read by stats() from any thread.
  std::atomic<uint64_t> served_{0}, timed_out_{0}, evicted_{0}, malformed_{0}, backoffs_{0};
};

}  // namespace farmem
