// ServiceHost: farmemd's core. Registers the method tables of its services with the node (only
// inside each service's opcode range, each call counted), serves STAT and the SESSION_* RPCs
// itself (it owns the SessionRegistry), starts and stops the services, and builds the STAT
// document and Prometheus text from the services.
// Thread use: built and started on one thread; handlers and stats()/metrics() run on any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/node.h"
#include "farmem/status.h"
#include "service/service.h"

namespace farmem {

class ServiceHost {
 public:
  explicit ServiceHost(Node& node, SessionOptions sessions = {})
      : node_(node), sessions_(std::move(sessions)) {}
  ~ServiceHost();
  ServiceHost(const ServiceHost&) = delete;
  ServiceHost& operator=(const ServiceHost&) = delete;

  // Adds a service (before register_methods). Names must be unique, ranges must not overlap.
  Status add(std::unique_ptr<Service> service);
  // The client sessions; services register their end listeners before start().
  SessionRegistry& sessions() { return sessions_; }
  const SessionRegistry& sessions() const { return sessions_; }

  // Registers STAT, SESSION_* and every service's methods with the node; refuses an opcode outside
  // its service's range, an unnamed method, a method without handler and a duplicate opcode. Once.
  Status register_methods();
  // Starts the services in the order they were added, then the session reaper; on failure stops
  // those already started.
  Status start();
  // Stops the session reaper, then the services in reverse order. Idempotent. Call after the
  // node stopped serving (so no session ends while a service stops).
  void stop();

  // Whether the node is serving (STAT shows addresses only then). Set by the owner of the node.
  void set_running(bool running) { running_.store(running); }

  const std::vector<std::unique_ptr<Service>>& services() const { return services_; }
  Service* find(std::string_view name) const;

  // The STAT document: node, transport, uptime, services, rpc (from the method tables), then
  // each service's keys.
  nlohmann::json stats() const;
  // Adds (or replaces; an empty function removes) a top-level STAT key filled by `section` on every
  // STAT: for parts of the process that are not services (farmemd's cluster membership). Any time,
  // any thread.
  void set_stats_section(std::string key, std::function<nlohmann::json()> section);
  // Prometheus text: uptime, farmem_rpc_{calls,errors}_total{service,op}, then each service's.
  std::string metrics() const;

 private:
  struct Method {
    uint16_t opcode = 0;
    std::string name;
    std::string service;
    std::atomic<uint64_t> calls{0};
    std::atomic<uint64_t> errors{0};
  };
  Status Stat(const RpcCall& call, std::vector<std::byte>& reply);

  Node& node_;
  // Before services_: the services' end listeners point into them, and a session must never end
  // (reaper) after its listeners' service is gone; stop() stops the reaper first.
  SessionRegistry sessions_;
  std::vector<std::unique_ptr<Service>> services_;
  mutable std::mutex sections_mu_;
  std::vector<std::pair<std::string, std::function<nlohmann::json()>>> sections_;
  // Stable addresses: handlers hold a Method* for their counters.
  std::vector<std::unique_ptr<Method>> methods_;
  bool registered_ = false;
  std::atomic<bool> running_{false};
  size_t started_ = 0;  // services_[0, started_) are running
  std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
};

}  // namespace farmem
