// A tiny HTTP/1.0 responder for Prometheus: GET /metrics returns what `render` produces
// (MemoryServer::metrics_text). One request per connection, bounded request size, every wait has
// a timeout.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "farmem/status.h"

namespace farmem {

class MetricsHttpServer {
 public:
  // Binds host:port (port 0 = ephemeral) and serves `render()` on GET /metrics.
  static Result<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host, uint16_t port,
                                                          std::function<std::string()> render);
  ~MetricsHttpServer();
  uint16_t port() const { return port_; }
  void stop();

 private:
  MetricsHttpServer(int fd, uint16_t port, std::function<std::string()> render);
  void Loop();
  void Serve(int conn);

  int fd_;
  int wake_[2] = {-1, -1};  // pipe: stop() writes to end the poll() loop
  uint16_t port_;
  std::function<std::string()> render_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace farmem
