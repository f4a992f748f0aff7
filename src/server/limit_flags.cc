// `--limit KEY=VALUE` (limit_flags.h): one table row per limit — its name, unit, range and field —
// so parsing, range checks, --help and the defaults shown come from the same place.
#include "server/limit_flags.h"

#include <charconv>
#include <cstdint>
#include <functional>

namespace farmem {
namespace {

using std::chrono::milliseconds;

// One settable limit: reads and writes its field as an integer in its unit.
struct LimitKey {
  const char* name;
  uint64_t min, max;
  std::function<uint64_t(const ListenerLimits&)> get;
  std::function<void(ListenerLimits&, uint64_t)> set;
};

template <typename T>
LimitKey Count(const char* name, uint64_t min, uint64_t max, T ListenerLimits::*group, auto field) {
  return {name, min, max, [=](const ListenerLimits& l) { return uint64_t((l.*group).*field); },
          [=](ListenerLimits& l, uint64_t v) {
            (l.*group).*field =
                static_cast<std::remove_reference_t<decltype((l.*group).*field)>>(v);
          }};
}

template <typename T>
LimitKey Millis(const char* name, uint64_t min, uint64_t max, T ListenerLimits::*group,
                milliseconds T::*field) {
  return {name, min, max,
          [=](const ListenerLimits& l) { return uint64_t(((l.*group).*field).count()); },
          [=](ListenerLimits& l, uint64_t v) { (l.*group).*field = milliseconds(v); }};
}

constexpr uint64_t kHour = 3'600'000;
constexpr uint64_t kTiB = uint64_t{1} << 40;

const std::vector<LimitKey>& Keys() {
  static const std::vector<LimitKey> keys = {
      Count("tcp.max_unauthenticated_bytes", 512, 1u << 20, &ListenerLimits::tcp,
            &TcpLimits::max_unauthenticated_bytes),
      Millis("tcp.auth_timeout_ms", 1, kHour, &ListenerLimits::tcp, &TcpLimits::auth_timeout),
      Count("tcp.max_send_queue_bytes", 4096, kTiB, &ListenerLimits::tcp,
            &TcpLimits::max_send_queue_bytes),
      Count("tcp.send_queue_resume_bytes", 0, kTiB, &ListenerLimits::tcp,
            &TcpLimits::send_queue_resume_bytes),
      Count("tcp.max_total_send_queue_bytes", 4096, kTiB, &ListenerLimits::tcp,
            &TcpLimits::max_total_send_queue_bytes),
      Count("tcp.total_send_queue_resume_bytes", 0, kTiB, &ListenerLimits::tcp,
            &TcpLimits::total_send_queue_resume_bytes),
      Count("tcp.max_rpcs_in_flight", 1, 1u << 20, &ListenerLimits::tcp,
            &TcpLimits::max_rpcs_in_flight),
      Count("tcp.max_connections_per_address", 1, 1u << 20, &ListenerLimits::tcp,
            &TcpLimits::max_connections_per_address),
      Count("tcp.max_connections", 1, 1u << 20, &ListenerLimits::tcp, &TcpLimits::max_connections),
      Millis("tcp.accept_backoff_min_ms", 1, kHour, &ListenerLimits::tcp,
             &TcpLimits::accept_backoff_min),
      Millis("tcp.accept_backoff_max_ms", 1, kHour, &ListenerLimits::tcp,
             &TcpLimits::accept_backoff_max),
      Millis("bootstrap.handshake_timeout_ms", 1, kHour, &ListenerLimits::bootstrap,
             &BootstrapLimits::handshake_timeout),
      Count("bootstrap.max_open_handshakes", 1, 1u << 20, &ListenerLimits::bootstrap,
            &BootstrapLimits::max_open_handshakes),
      Count("bootstrap.max_open_handshakes_per_address", 1, 1u << 20, &ListenerLimits::bootstrap,
            &BootstrapLimits::max_open_handshakes_per_address),
      Millis("bootstrap.accept_backoff_min_ms", 1, kHour, &ListenerLimits::bootstrap,
             &BootstrapLimits::accept_backoff_min),
      Millis("bootstrap.accept_backoff_max_ms", 1, kHour, &ListenerLimits::bootstrap,
             &BootstrapLimits::accept_backoff_max),
      Count("metrics.max_connections", 1, 4096, &ListenerLimits::metrics,
            &MetricsHttpLimits::max_connections),
      Count("metrics.max_request_bytes", 64, 1u << 20, &ListenerLimits::metrics,
            &MetricsHttpLimits::max_request_bytes),
      Millis("metrics.deadline_ms", 1, kHour, &ListenerLimits::metrics,
             &MetricsHttpLimits::deadline),
  };
  return keys;
}

std::string KnownKeys() {
  std::string out;
  for (const LimitKey& k : Keys()) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

// Combinations the listeners cannot work with (a per-address limit above the total is allowed:
// the total then decides).
Status CheckConsistent(const ListenerLimits& l) {
  if (l.tcp.send_queue_resume_bytes > l.tcp.max_send_queue_bytes) {
    return Status::InvalidArgument(
        "tcp.send_queue_resume_bytes must not exceed tcp.max_send_queue_bytes");
  }
  if (l.tcp.total_send_queue_resume_bytes > l.tcp.max_total_send_queue_bytes) {
    return Status::InvalidArgument(
        "tcp.total_send_queue_resume_bytes must not exceed tcp.max_total_send_queue_bytes");
  }
  if (l.tcp.accept_backoff_min > l.tcp.accept_backoff_max) {
    return Status::InvalidArgument("tcp.accept_backoff_min_ms must not exceed its max");
  }
  if (l.bootstrap.accept_backoff_min > l.bootstrap.accept_backoff_max) {
    return Status::InvalidArgument("bootstrap.accept_backoff_min_ms must not exceed its max");
  }
  return Status::OK();
}

}  // namespace

Status ApplyLimitItems(const std::vector<std::string>& items, ListenerLimits& limits) {
  ListenerLimits next = limits;
  for (const std::string& item : items) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      return Status::InvalidArgument("--limit '" + item +
                                     "': expected KEY=VALUE (keys: " + KnownKeys() + ")");
    }
    const std::string key = item.substr(0, eq), text = item.substr(eq + 1);
    const LimitKey* found = nullptr;
    for (const LimitKey& k : Keys()) {
      if (key == k.name) found = &k;
    }
    if (found == nullptr) {
      return Status::InvalidArgument("--limit '" + item + "': unknown key '" + key +
                                     "' (keys: " + KnownKeys() + ")");
    }
    uint64_t value = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || ec != std::errc() || end != text.data() + text.size() ||
        value < found->min || value > found->max) {
      return Status::InvalidArgument("--limit '" + item + "': " + key + " takes a whole number " +
                                     std::to_string(found->min) + ".." +
                                     std::to_string(found->max));
    }
    found->set(next, value);
  }
  FARMEM_RETURN_IF_ERROR(CheckConsistent(next).WithContext("--limit"));
  limits = next;
  return Status::OK();
}

std::string LimitKeysHelp() {
  const ListenerLimits defaults;
  std::string out;
  for (const LimitKey& k : Keys()) {
    out += (out.empty() ? "" : ", ") + std::string(k.name) + " (" +
           std::to_string(k.get(defaults)) + ")";
  }
  return out;
}

}  // namespace farmem
