// ServiceHost: method registration with counters and range checks, STAT, ordered start/stop,
// and the STAT / Prometheus documents generated from the services.
#include "service/service_host.h"

#include <set>

#include "common/log.h"
#include "node/session_wire.h"
#include "transport/tcp/tcp_transport.h"

namespace farmem {

ServiceHost::~ServiceHost() {
  stop();
}

Status ServiceHost::add(std::unique_ptr<Service> service) {
  if (registered_) return Status::Internal("ServiceHost::add after register_methods");
  if (!service) return Status::InvalidArgument("null service");
  const OpcodeRange r = service->opcodes();
  if (r.first < kFirstUserOpcode || r.last < r.first || kServerOpcodes.contains(r.first) ||
      kServerOpcodes.contains(r.last)) {
    return Status::InvalidArgument("service '" + std::string(service->name()) + "': opcode range " +
                                   std::to_string(r.first) + ".." + std::to_string(r.last) +
                                   " is not a service range");
  }
  for (const auto& s : services_) {
    if (s->name() == service->name()) {
      return Status::InvalidArgument("service '" + std::string(s->name()) + "' added twice");
    }
    const OpcodeRange o = s->opcodes();
    if (r.first <= o.last && o.first <= r.last) {
      return Status::InvalidArgument("services '" + std::string(s->name()) + "' and '" +
                                     std::string(service->name()) + "' share opcodes");
    }
  }
  services_.push_back(std::move(service));
  return Status::OK();
}

Status ServiceHost::register_methods() {
  if (registered_) return Status::OK();
  registered_ = true;
  std::set<uint16_t> seen;
  // Every handler is counted (before the call, so STAT counts itself); the node turns a returned
  // error into an error reply, so a bad request never takes the server down.
  auto reg = [&](const std::string& service, uint16_t opcode, const std::string& name,
                 RpcExecution execution, RpcFunction fn) -> Status {
    if (!seen.insert(opcode).second) {
      return Status::InvalidArgument("opcode " + std::to_string(opcode) + " registered twice");
    }
    Method* m = methods_.emplace_back(std::make_unique<Method>()).get();
    m->opcode = opcode;
    m->name = name;
    m->service = service;
    return node_.register_rpc(
        opcode,
        [m, fn = std::move(fn)](const RpcCall& call, std::vector<std::byte>& reply) {
          m->calls.fetch_add(1, std::memory_order_relaxed);
          Status st = fn(call, reply);
          if (!st.ok()) m->errors.fetch_add(1, std::memory_order_relaxed);
          return st;
        },
        execution);
  };
  FARMEM_RETURN_IF_ERROR(reg(
      "server", kOpStat, "stat", RpcExecution::kWorker,
      [this](const RpcCall& call, std::vector<std::byte>& reply) { return Stat(call, reply); }));
  // Sessions are farmemd's, not a service's: every farmemd answers them, whichever services run.
  // On workers: CLOSE runs the end listeners, which free memory.
  FARMEM_RETURN_IF_ERROR(reg(
      "server", kOpSessionOpen, "session_open", RpcExecution::kWorker,
      [this](const RpcCall& c, std::vector<std::byte>& r) { return sessions_.ServeOpen(c, r); }));
  FARMEM_RETURN_IF_ERROR(reg("server", kOpSessionKeepalive, "session_keepalive",
                             RpcExecution::kWorker,
                             [this](const RpcCall& c, std::vector<std::byte>& r) {
                               return sessions_.ServeKeepalive(c, r);
                             }));
  FARMEM_RETURN_IF_ERROR(reg(
      "server", kOpSessionClose, "session_close", RpcExecution::kWorker,
      [this](const RpcCall& c, std::vector<std::byte>& r) { return sessions_.ServeClose(c, r); }));
  for (const auto& s : services_) {
    const std::string service(s->name());
    const OpcodeRange range = s->opcodes();
    for (ServiceMethod& method : s->methods()) {
      if (!range.contains(method.opcode)) {
        return Status::InvalidArgument("service '" + service + "' method '" + method.name +
                                       "': opcode " + std::to_string(method.opcode) +
                                       " is outside its range " + std::to_string(range.first) +
                                       ".." + std::to_string(range.last));
      }
      if (method.name.empty() || !method.handler) {
        return Status::InvalidArgument("service '" + service + "': opcode " +
                                       std::to_string(method.opcode) +
                                       " needs a name and a handler");
      }
      FARMEM_RETURN_IF_ERROR(
          reg(service, method.opcode, method.name, method.execution, std::move(method.handler)));
    }
  }
  return Status::OK();
}

Status ServiceHost::start() {
  while (started_ < services_.size()) {
    Status st = services_[started_]->start();
    if (!st.ok()) {
      st = st.WithContext("starting service '" + std::string(services_[started_]->name()) + "'");
      stop();
      return st;
    }
    ++started_;
  }
  sessions_.start();
  return Status::OK();
}

void ServiceHost::stop() {
  sessions_.stop();
  while (started_ > 0) services_[--started_]->stop();
}

Service* ServiceHost::find(std::string_view name) const {
  for (const auto& s : services_) {
    if (s->name() == name) return s.get();
  }
  return nullptr;
}

Status ServiceHost::Stat(const RpcCall& call, std::vector<std::byte>& reply) {
  if (!call.request.empty()) {
    return Status::Protocol("STAT request must be empty, got " +
                            std::to_string(call.request.size()) + " bytes");
  }
  const std::string text = stats().dump();
  const auto* p = reinterpret_cast<const std::byte*>(text.data());
  reply.assign(p, p + text.size());
  return Status::OK();
}

nlohmann::json ServiceHost::stats() const {
  using nlohmann::json;
  json j;
  const bool running = running_.load();
  j["node"] = node_.config().name;
  j["bootstrap"] = running ? node_.bootstrap_address() : "";
  j["transport"] = {{"name", node_.transport().name()},
                    {"address", running ? node_.transport().local_address() : ""}};
  j["uptime_seconds"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count();
  json names = json::array();
  for (const auto& s : services_) names.push_back(std::string(s->name()));
  j["services"] = std::move(names);
  json rpc = json::object();
  for (const auto& m : methods_) {
    rpc[m->name] = {{"opcode", m->opcode},
                    {"service", m->service},
                    {"calls", m->calls.load(std::memory_order_relaxed)},
                    {"errors", m->errors.load(std::memory_order_relaxed)}};
  }
  j["rpc"] = std::move(rpc);
  j["sessions"] = sessions_.stats_json();
  // Connection limits of the listeners (docs/transport.md "Connection limits", docs/node.md
  // "Listener"): refused, timed out and throttled peers.
  const BootstrapStats b = node_.bootstrap_stats();
  json limits;
  limits["bootstrap"] = {{"accepted", b.accepted},
                         {"timed_out", b.timed_out},
                         {"refused_per_address", b.refused_per_address},
                         {"refused_total", b.refused_total},
                         {"accept_backoffs", b.accept_backoffs}};
  if (auto t = GetTcpTransportStats(node_.transport()); t.ok()) {
    limits["tcp"] = {{"open_connections", t->open_connections},
                     {"refused_unauthenticated_oversize", t->refused_unauthenticated_oversize},
                     {"auth_timeouts", t->auth_timeouts},
                     {"refused_per_address", t->refused_per_address},
                     {"refused_total", t->refused_total},
                     {"backpressure_events", t->backpressure_events},
                     {"throttled_connections", t->throttled_connections},
                     {"peak_send_queue_bytes", t->peak_send_queue_bytes},
                     {"queued_reply_bytes", t->queued_reply_bytes},
                     {"peak_total_send_queue_bytes", t->peak_total_send_queue_bytes},
                     {"accept_backoffs", t->accept_backoffs},
                     {"protocol_errors", t->protocol_errors}};
  }
  j["limits"] = std::move(limits);
  for (const auto& s : services_) s->stats(j);
  std::lock_guard lock(sections_mu_);
  for (const auto& [key, section] : sections_) j[key] = section();
  return j;
}

void ServiceHost::set_stats_section(std::string key, std::function<nlohmann::json()> section) {
  std::lock_guard lock(sections_mu_);
  std::erase_if(sections_, [&](const auto& s) { return s.first == key; });
  if (section) sections_.emplace_back(std::move(key), std::move(section));
}

std::string ServiceHost::metrics() const {
  MetricsWriter w;
  w.gauge("farmem_uptime_seconds", "Seconds since the server was created.",
          std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count());
  w.family("farmem_rpc_calls_total", MetricsWriter::Kind::kCounter,
           "RPCs served, by service and method.");
  for (const auto& m : methods_) {
    w.sample({{"service", m->service}, {"op", m->name}},
             static_cast<double>(m->calls.load(std::memory_order_relaxed)));
  }
  w.family("farmem_rpc_errors_total", MetricsWriter::Kind::kCounter,
           "RPCs answered with an error, by service and method.");
  for (const auto& m : methods_) {
    w.sample({{"service", m->service}, {"op", m->name}},
             static_cast<double>(m->errors.load(std::memory_order_relaxed)));
  }
  const BootstrapStats b = node_.bootstrap_stats();
  w.family("farmem_bootstrap_refused_total", MetricsWriter::Kind::kCounter,
           "Bootstrap connections closed at accept, by limit (per_address, total).");
  w.sample({{"limit", "per_address"}}, static_cast<double>(b.refused_per_address));
  w.sample({{"limit", "total"}}, static_cast<double>(b.refused_total));
  w.counter("farmem_bootstrap_timeouts_total", "Bootstrap handshakes not finished in time.",
            static_cast<double>(b.timed_out));
  w.family("farmem_accept_backoffs_total", MetricsWriter::Kind::kCounter,
           "Accept failures (EMFILE, ENFILE...) that paused a listener, by listener.");
  w.sample({{"listener", "bootstrap"}}, static_cast<double>(b.accept_backoffs));
  auto t = GetTcpTransportStats(node_.transport());
  if (t.ok()) w.sample({{"listener", "tcp"}}, static_cast<double>(t->accept_backoffs));
  if (t.ok()) {
    w.family("farmem_tcp_refused_total", MetricsWriter::Kind::kCounter,
             "TCP data connections closed by a limit (unauthenticated_oversize, per_address, "
             "total).");
    w.sample({{"limit", "unauthenticated_oversize"}},
             static_cast<double>(t->refused_unauthenticated_oversize));
    w.sample({{"limit", "per_address"}}, static_cast<double>(t->refused_per_address));
    w.sample({{"limit", "total"}}, static_cast<double>(t->refused_total));
    w.counter("farmem_tcp_auth_timeouts_total",
              "TCP data connections closed for not authenticating in time.",
              static_cast<double>(t->auth_timeouts));
    w.counter("farmem_tcp_backpressure_events_total",
              "Times a TCP peer's requests were paused because its replies queued up.",
              static_cast<double>(t->backpressure_events));
    w.gauge("farmem_tcp_throttled_connections", "TCP peers whose requests are paused now.",
            static_cast<double>(t->throttled_connections));
    w.gauge("farmem_tcp_open_connections", "Open TCP data connections.",
            static_cast<double>(t->open_connections));
    w.gauge("farmem_tcp_queued_reply_bytes", "Reply bytes queued for all TCP peers now.",
            static_cast<double>(t->queued_reply_bytes));
  }
  const SessionRegistryStats ss = sessions_.stats();
  w.gauge("farmem_sessions_open", "Client sessions open now.", static_cast<double>(ss.open));
  w.gauge("farmem_sessions_max", "Client sessions allowed (--max-sessions).",
          static_cast<double>(sessions_.options().max_sessions));
  w.family("farmem_sessions_ended_total", MetricsWriter::Kind::kCounter,
           "Client sessions ended, by reason (closed by the client, expired lease).");
  w.sample({{"reason", "closed"}}, static_cast<double>(ss.closed_total));
  w.sample({{"reason", "expired"}}, static_cast<double>(ss.expired_total));
  w.sample({{"reason", "member_expired"}}, static_cast<double>(ss.member_expired_total));
  w.counter("farmem_sessions_opened_total", "Client sessions opened.",
            static_cast<double>(ss.opened_total));
  w.counter("farmem_sessions_refused_total", "SESSION_OPEN refused at --max-sessions.",
            static_cast<double>(ss.refused_total));
  w.counter("farmem_sessions_unknown_total",
            "Keepalives, closes and allocations naming an unknown or expired session.",
            static_cast<double>(ss.unknown_total));
  w.counter("farmem_sessions_freed_objects_total", "Objects freed because their session ended.",
            static_cast<double>(ss.objects_freed_total));
  w.counter("farmem_sessions_freed_raw_bytes_total", "Raw bytes freed because their session ended.",
            static_cast<double>(ss.raw_bytes_freed_total));
  for (const auto& s : services_) s->metrics(w);
  return w.text();
}

}  // namespace farmem
