// Prometheus exposition of farmemd's STAT document (raw pools, object store, RPC counters) over a
// minimal HTTP/1.0 server (one thread, one connection at a time: scrapes are rare, handler cheap).
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

namespace farmem {
namespace {

// Prometheus label values escape backslash, quote and newline.
std::string Label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void Metric(std::string& out, const char* name, const char* type, const char* help,
            const nlohmann::json& value) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
  out += name;
  out += ' ';
  out += value.is_number() ? value.dump() : "0";
  out += '\n';
}

uint64_t U64(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return (it != j.end() && it->is_number_unsigned()) ? it->get<uint64_t>() : 0;
}

}  // namespace

std::string StatsToPrometheus(const nlohmann::json& s) {
  std::string out;
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& mem = s.contains("memory") ? s["memory"] : empty;
  Metric(out, "farmem_uptime_seconds", "gauge", "Seconds since the server was created.",
         s.value("uptime_seconds", nlohmann::json(0)));
  struct {
    const char* key;
    const char* name;
    const char* help;
  } const gauges[] = {
      {"budget_bytes", "farmem_memory_budget_bytes", "Configured memory budget."},
      {"reserved_bytes", "farmem_memory_reserved_bytes", "Virtual range reserved for pools."},
      {"mapped_bytes", "farmem_memory_mapped_bytes", "Bytes of pools created (memfd-backed)."},
      {"allocated_bytes", "farmem_memory_allocated_bytes", "Bytes in live raw allocations."},
      {"free_bytes", "farmem_memory_free_bytes", "Budget bytes not allocated."},
      {"allocations", "farmem_allocations", "Live raw allocations."},
      {"pools", "farmem_pools", "Pools created."},
      {"max_pools", "farmem_pools_max", "Pools the budget allows."},
  };
  for (const auto& g : gauges)
    Metric(out, g.name, "gauge", g.help, nlohmann::json(U64(mem, g.key)));

  struct {
    const char* key;
    const char* name;
    const char* help;
  } const per_pool[] = {
      {"allocated_bytes", "farmem_pool_allocated_bytes", "Bytes allocated in a pool."},
      {"free_bytes", "farmem_pool_free_bytes", "Bytes free in a pool."},
      {"largest_free", "farmem_pool_largest_free_bytes", "Longest free range of a pool."},
      {"free_ranges", "farmem_pool_free_ranges", "Free ranges of a pool (fragmentation)."},
  };
  const nlohmann::json& pools = s.contains("pools") ? s["pools"] : nlohmann::json::array();
  for (const auto& m : per_pool) {
    out += std::string("# HELP ") + m.name + " " + m.help + "\n# TYPE " + m.name + " gauge\n";
    for (const auto& p : pools) {
      out += std::string(m.name) + "{pool=\"" + Label(p.value("name", "")) + "\"} " +
             std::to_string(U64(p, m.key)) + "\n";
    }
  }

  // Object store: absent (or disabled) renders nothing, so dashboards see no fake zeros.
  const nlohmann::json& obj = s.contains("objects") ? s["objects"] : empty;
  if (obj.value("enabled", false)) {
    struct {
      const char* key;
      const char* name;
      const char* type;
      const char* help;
    } const object_metrics[] = {
        {"live_objects", "farmem_objects_live", "gauge", "Live objects."},
        {"live_blocks", "farmem_objects_blocks", "gauge", "Blocks holding objects."},
        {"physical_bytes_held", "farmem_objects_physical_bytes", "gauge",
         "Physical memory held by the object store (its own accounting)."},
        {"virtual_blocks_in_use", "farmem_objects_virtual_blocks", "gauge",
         "Virtual blocks mapped (primaries and compaction aliases)."},
        {"process_rss_bytes", "farmem_process_rss_bytes", "gauge", "Resident set of farmemd."},
    };
    for (const auto& m : object_metrics) {
      Metric(out, m.name, m.type, m.help, nlohmann::json(U64(obj, m.key)));
    }
    const nlohmann::json& comp = obj.contains("compaction") ? obj["compaction"] : empty;
    struct {
      const char* key;
      const char* name;
      const char* help;
    } const counters[] = {
        {"rounds", "farmem_objects_compaction_rounds_total", "Compaction rounds run."},
        {"compactions", "farmem_objects_compactions_total", "Block merges done by compaction."},
        {"blocks_freed", "farmem_objects_compaction_blocks_freed_total",
         "Physical blocks released by compaction."},
        {"bytes_moved", "farmem_objects_compaction_bytes_moved_total",
         "Slot bytes copied by compaction."},
    };
    for (const auto& m : counters) {
      Metric(out, m.name, "counter", m.help, nlohmann::json(U64(comp, m.key)));
    }
    Metric(out, "farmem_objects_compaction_grace_wait_seconds_total", "counter",
           "Time merges waited for one-sided copies in progress before remapping.",
           nlohmann::json(static_cast<double>(U64(comp, "grace_wait_ns")) / 1e9));
    const nlohmann::json& classes = obj.contains("classes") ? obj["classes"] : nlohmann::json();
    struct {
      const char* key;
      const char* name;
      const char* help;
    } const per_class[] = {
        {"fragmentation", "farmem_objects_class_fragmentation",
         "1 - live / capacity of a size class."},
        {"blocks", "farmem_objects_class_blocks", "Blocks of a size class."},
        {"live", "farmem_objects_class_live", "Live objects of a size class."},
    };
    for (const auto& m : per_class) {
      out += std::string("# HELP ") + m.name + " " + m.help + "\n# TYPE " + m.name + " gauge\n";
      if (!classes.is_array()) continue;
      for (const auto& c : classes) {
        auto v = c.find(m.key);
        out += std::string(m.name) + "{class=\"" + std::to_string(U64(c, "class")) +
               "\",slot_size=\"" + std::to_string(U64(c, "slot_size")) + "\"} " +
               ((v != c.end() && v->is_number()) ? v->dump() : "0") + "\n";
      }
    }
  }

  const nlohmann::json& rpc = s.contains("rpc") ? s["rpc"] : empty;
  for (const char* kind : {"calls", "errors"}) {
    const std::string name = std::string("farmem_rpc_") + kind + "_total";
    out +=
        "# HELP " + name + " RPCs served by opcode (" + kind + ").\n# TYPE " + name + " counter\n";
    for (const auto& [op, c] : rpc.items()) {
      out += name + "{op=\"" + Label(op) + "\"} " + std::to_string(U64(c, kind)) + "\n";
    }
  }
  return out;
}

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, uint16_t port, std::function<std::string()> render) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return Status::InvalidArgument("metrics: '" + host + "' is not an IPv4 address");
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno("metrics: socket", errno);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
    Status st = Status::FromErrno("metrics: binding " + host + ":" + std::to_string(port), errno);
    close(fd);
    return st;
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  auto server = std::unique_ptr<MetricsHttpServer>(
      new MetricsHttpServer(fd, ntohs(addr.sin_port), std::move(render)));
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
