// The memcached baseline of `farmem bench channels`: meta-protocol parsing, a blocking loopback
// client (one per thread), the server's target role and the measured gets. The role runs in a
// forked target process; the client runs on the benchmark's own threads.
#include "memcached_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "child_process.h"
#include "objects_throughput_internal.h"
#include "redis_bench.h"
#include "zipf.h"

namespace farmem::bench {
namespace {

using MClock = std::chrono::steady_clock;
constexpr size_t kMaxLine = 1024;  // a status line longer than this is malformed

}  // namespace

Result<std::optional<MetaReply>> ParseMetaReply(std::string_view buf) {
  const size_t eol = buf.find("\r\n");
  if (eol == std::string_view::npos) {
    if (buf.size() > kMaxLine) return Status::Protocol("memcached: status line without CRLF");
    return std::optional<MetaReply>();
  }
  const std::string_view line = buf.substr(0, eol);
  const std::string_view code = line.substr(0, line.find(' '));
  MetaReply r;
  r.consumed = eol + 2;
  if (code == "EN") {
    r.kind = MetaReply::Kind::kMiss;
  } else if (code == "HD") {
    r.kind = MetaReply::Kind::kStored;
  } else if (code == "MN") {
    r.kind = MetaReply::Kind::kNoop;
  } else if (code == "VA") {
    // "VA <len> [flags]": the length must be all digits (no sign, no trailing junk).
    if (line.size() <= 3) return Status::Protocol("memcached: VA without a length");
    std::string_view len_s = line.substr(3);
    len_s = len_s.substr(0, len_s.find(' '));
    size_t len = 0;
    auto [p, ec] = std::from_chars(len_s.data(), len_s.data() + len_s.size(), len);
    if (ec != std::errc() || p != len_s.data() + len_s.size() || len_s.empty())
      return Status::Protocol(fmt::format("memcached: bad VA length '{}'", len_s));
    if (len > (64u << 20)) return Status::Protocol("memcached: VA length above 64 MiB");
    if (buf.size() < r.consumed + len + 2) return std::optional<MetaReply>();
    if (buf.substr(r.consumed + len, 2) != "\r\n")
      return Status::Protocol("memcached: value block not ended by CRLF");
    r.kind = MetaReply::Kind::kValue;
    r.value.assign(buf.substr(r.consumed, len));
    r.consumed += len + 2;
  } else {
    return Status::Internal(fmt::format("memcached replied '{}'", line));
  }
  return std::optional<MetaReply>(std::move(r));
}

Result<MemcachedConn> MemcachedConn::Connect(uint16_t port, const std::string& host) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::FromErrno("memcached socket", errno);
  MemcachedConn c(fd);
  const timeval tv{5, 0};
  const int one = 1;
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
      ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0 ||
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
    return Status::FromErrno("memcached setsockopt", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    return Status::InvalidArgument(fmt::format("memcached: '{}' is not an IPv4 address", host));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0)
    return Status::FromErrno(fmt::format("memcached connect to {}:{}", host, port), errno);
  return c;
}

MemcachedConn::~MemcachedConn() {
  if (fd_ >= 0) ::close(fd_);
}

Status MemcachedConn::Send(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("memcached send", errno);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return Status::OK();
}

Result<MetaReply> MemcachedConn::Receive() {
  for (;;) {
    FARMEM_ASSIGN_OR_RETURN(auto r, ParseMetaReply(buf_));
    if (r) {
      buf_.erase(0, r->consumed);
      return std::move(*r);
    }
    char chunk[4096];
    const ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("memcached recv", errno);
    if (n == 0) return Status::Unavailable("memcached closed the connection");
    buf_.append(chunk, static_cast<size_t>(n));
  }
}

Status MemcachedConn::Set(std::string_view key, std::span<const std::byte> value) {
  std::string req = fmt::format("ms {} {} T0\r\n", key, value.size());
  req.append(reinterpret_cast<const char*>(value.data()), value.size());
  req += "\r\n";
  FARMEM_RETURN_IF_ERROR(Send(req));
  FARMEM_ASSIGN_OR_RETURN(MetaReply r, Receive());
  if (r.kind != MetaReply::Kind::kStored)
    return Status::Protocol(fmt::format("memcached ms {}: unexpected reply", key));
  return Status::OK();
}

Result<std::optional<std::string>> MemcachedConn::Get(std::string_view key) {
  FARMEM_RETURN_IF_ERROR(Send(fmt::format("mg {} v\r\n", key)));
  FARMEM_ASSIGN_OR_RETURN(MetaReply r, Receive());
  if (r.kind == MetaReply::Kind::kMiss) return std::optional<std::string>();
  if (r.kind != MetaReply::Kind::kValue)
    return Status::Protocol(fmt::format("memcached mg {}: unexpected reply", key));
  return std::optional<std::string>(std::move(r.value));
}

Status MemcachedConn::Noop() {
  FARMEM_RETURN_IF_ERROR(Send("mn\r\n"));
  FARMEM_ASSIGN_OR_RETURN(MetaReply r, Receive());
  if (r.kind != MetaReply::Kind::kNoop) return Status::Protocol("memcached mn: unexpected reply");
  return Status::OK();
}

TargetRole MemcachedServerRole(std::string memcached, std::string extra_listen) {
  return [memcached, extra_listen](int report_fd, int control_fd) {
    Status last =
        Status::NotFound("memcached not found on PATH (Debian: apt-get install memcached)");
    for (int attempt = 0; attempt < 5 && !memcached.empty(); ++attempt) {
      auto port = PickFreePort();
      if (!port.ok()) {
        last = port.status();
        continue;
      }
      const std::string listen = extra_listen.empty() ? "127.0.0.1" : "127.0.0.1," + extra_listen;
      std::vector<std::string> args{memcached, "-l", listen, "-p", std::to_string(*port)};
      if (::geteuid() == 0) args.insert(args.end(), {"-u", "root"});
      auto pid = Spawn(args, -1, -1);
      if (!pid.ok()) {
        last = pid.status();
        continue;
      }
      last = Status::TimedOut("memcached did not answer mn in 10 s");
      for (auto deadline = MClock::now() + std::chrono::seconds(10); MClock::now() < deadline;) {
        if (auto c = MemcachedConn::Connect(*port); c.ok()) {
          last = c->Noop();
          if (last.ok()) break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (last.ok()) {
        std::string msg(reinterpret_cast<const char*>(&*port), sizeof(uint16_t));
        if (WriteMessage(report_fd, true, msg).ok()) WaitForStop(control_fd, std::chrono::hours(2));
        // SIGKILL at once: nothing to persist, and memcached's SIGTERM shutdown waits up to 1 s for
        // its background threads' sleeps.
        KillAndReap(*pid, std::chrono::milliseconds(0));
        return;
      }
      KillAndReap(*pid, std::chrono::milliseconds(0));
    }
    (void)WriteMessage(report_fd, false, last.WithContext("starting memcached").ToString());
  };
}

Status MemcachedLoad(uint16_t port, uint64_t count, size_t value_size) {
  FARMEM_ASSIGN_OR_RETURN(MemcachedConn c, MemcachedConn::Connect(port));
  std::vector<std::byte> value(value_size);
  for (uint64_t i = 0; i < count; ++i) {
    FillObjectValue(i, value);
    FARMEM_RETURN_IF_ERROR(c.Set(RedisKey(i), value));
  }
  return Status::OK();
}

Result<double> RunMemcachedGets(uint16_t port, uint64_t count, size_t value_size, int clients,
                                double warmup_s, double seconds, const std::string& host) {
  auto body = [&](int t,
                  const std::function<std::optional<TimedWindow>()>& ready) -> Result<uint64_t> {
    auto c = MemcachedConn::Connect(port, host);
    if (!c.ok()) return c.status();
    const auto w = ready();
    if (!w) return uint64_t{0};
    KeyChooser chooser(count, nullptr, 0x3e3c0000ull + static_cast<uint64_t>(t));
    uint64_t n = 0;
    for (auto now = MClock::now(); now < w->end; now = MClock::now()) {
      const uint64_t k = chooser.Next();
      FARMEM_ASSIGN_OR_RETURN(std::optional<std::string> v, c->Get(RedisKey(k)));
      if (!v || v->size() != value_size ||
          !ValueMatches(k, std::as_bytes(std::span(v->data(), v->size()))))
        return Status::Internal(fmt::format("memcached mg {} returned a wrong value", k));
      if (MClock::now() >= w->warm_end) ++n;
    }
    return n;
  };
  FARMEM_ASSIGN_OR_RETURN(uint64_t total, RunTimedClients(clients, warmup_s, seconds, body));
  return static_cast<double>(total) / seconds;
}

}  // namespace farmem::bench
