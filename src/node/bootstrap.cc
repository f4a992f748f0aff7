// Bootstrap handshake: JSON bodies, the blocking client exchange (deadline-bounded) and the
// poll()-driven listener. Everything read from the network is length- and type-checked here.
// Protocol description: docs/node.md; header layout: bootstrap_wire.h.
#include "node/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <exception>
#include <memory>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "node/bootstrap_wire.h"

namespace farmem::node {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Handshakes served at once; further peers wait in the kernel backlog until one finishes.
constexpr size_t kMaxOpenHandshakes = 64;

std::string Dump(const json& j) {
  // replace: a non-UTF-8 name must not make dump() throw; such names are only shown in logs.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<json> ParseObject(std::string_view body) {
  if (body.size() > kMaxBootstrapBody) return Status::Protocol("bootstrap: body too large");
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::Protocol("bootstrap: body is not a JSON object");
  }
  return j;
}

Result<std::string> GetString(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return Status::Protocol(std::string("bootstrap: missing or non-string field '") + key + "'");
  }
  const auto& s = it->get_ref<const std::string&>();
  if (s.size() > kMaxFieldBytes) {
    return Status::Protocol(std::string("bootstrap: field '") + key + "' too long");
  }
  return s;
}

Result<uint64_t> GetU64(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) {
    return Status::Protocol(std::string("bootstrap: missing or non-unsigned field '") + key + "'");
  }
  return it->get<uint64_t>();
}

json RegionsToJson(const std::vector<RegionInfo>& regions) {
  json arr = json::array();
  for (const auto& r : regions) {
    arr.push_back(json{{"name", r.name}, {"key", r.key}, {"length", r.length}});
  }
  return arr;
}

Result<std::vector<RegionInfo>> RegionsFromJson(const json& j) {
  auto it = j.find("regions");
  if (it == j.end() || !it->is_array()) {
    return Status::Protocol("bootstrap: missing or non-array field 'regions'");
  }
  if (it->size() > kMaxRegionsListed) return Status::Protocol("bootstrap: too many regions");
  std::vector<RegionInfo> out;
  out.reserve(it->size());
  for (const auto& e : *it) {
    if (!e.is_object()) return Status::Protocol("bootstrap: region entry is not an object");
    RegionInfo r;
    FARMEM_ASSIGN_OR_RETURN(r.name, GetString(e, "name"));
    FARMEM_ASSIGN_OR_RETURN(r.key, GetU64(e, "key"));
    FARMEM_ASSIGN_OR_RETURN(r.length, GetU64(e, "length"));
    out.push_back(std::move(r));
  }
  return out;
}

std::string Frame(FrameType type, const std::string& body) {
  FrameHeader h;
  h.type = static_cast<uint16_t>(type);
  h.body_length = static_cast<uint32_t>(body.size());
  auto hdr = EncodeHeader(h);
  std::string out(reinterpret_cast<const char*>(hdr.data()), hdr.size());
  out += body;
  return out;
}

// Milliseconds until `deadline`, rounded up so a sub-millisecond remainder still polls once.
int MsLeft(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left, INT_MAX));
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// Wait until `fd` is ready for `events` or the deadline passes (TimedOut, naming `what`).
Status WaitFd(int fd, short events, Clock::time_point deadline, std::string_view what) {
  for (;;) {
    int ms = MsLeft(deadline);
    if (ms == 0) return Status::TimedOut(std::string(what));
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("bootstrap: poll", errno);
    }
    if (r > 0) return Status::OK();  // ready, or an error the next socket call reports
  }
}

Status SendAll(int fd, std::string_view data, Clock::time_point deadline, std::string_view peer) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      FARMEM_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline,
                                    "bootstrap: sending to " + std::string(peer) + " timed out"));
      continue;
    }
    return Status::Unavailable("bootstrap: sending to " + std::string(peer) +
                               " failed: " + std::strerror(errno));
  }
  return Status::OK();
}

Status RecvAll(int fd, void* buf, size_t len, Clock::time_point deadline, std::string_view peer) {
  auto* p = static_cast<char*>(buf);
  size_t off = 0;
  while (off < len) {
    ssize_t n = ::recv(fd, p + off, len - off, MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return Status::Unavailable("bootstrap: " + std::string(peer) +
                                 " closed the connection during the handshake");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      FARMEM_RETURN_IF_ERROR(
          WaitFd(fd, POLLIN, deadline,
                 "bootstrap: no answer from " + std::string(peer) + " before the deadline"));
      continue;
    }
    return Status::Unavailable("bootstrap: receiving from " + std::string(peer) +
                               " failed: " + std::strerror(errno));
  }
  return Status::OK();
}

std::string FormatHostPort(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string SockaddrToString(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    return FormatHostPort(buf, ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    return FormatHostPort(buf, ntohs(in6->sin6_port));
  }
  return "?";
}

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

Result<AddrInfoPtr> Resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::Unavailable("bootstrap: cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  return AddrInfoPtr(res);
}

Result<Fd> ConnectWithDeadline(const std::string& host, uint16_t port, Clock::time_point deadline) {
  const std::string target = FormatHostPort(host, port);
  FARMEM_ASSIGN_OR_RETURN(AddrInfoPtr ai, Resolve(host, port, false));
  Status last = Status::Unavailable("bootstrap: no usable address for " + target);
  for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (fd.get() < 0) {
      last = Status::FromErrno("bootstrap: socket", errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS || err == EINTR) {
      FARMEM_RETURN_IF_ERROR(
          WaitFd(fd.get(), POLLOUT, deadline, "bootstrap: connect to " + target + " timed out"));
      socklen_t len = sizeof(err);
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err == 0) return fd;
    last =
        Status::Unavailable("bootstrap: connect to " + target + " failed: " + std::strerror(err));
  }
  return last;
}

bool ValidCode(int64_t c) {
  return c > static_cast<int64_t>(Code::kOk) && c <= static_cast<int64_t>(Code::kInternal);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Bodies

std::string EncodeHello(const HelloMsg& msg) {
  return Dump(json{{"token", msg.token},
                   {"name", msg.name},
                   {"transport_address", msg.transport_address},
                   {"backend", msg.backend}});
}

Result<HelloMsg> DecodeHello(std::string_view body) {
  FARMEM_ASSIGN_OR_RETURN(json j, ParseObject(body));
  HelloMsg m;
  FARMEM_ASSIGN_OR_RETURN(m.token, GetString(j, "token"));
  FARMEM_ASSIGN_OR_RETURN(m.name, GetString(j, "name"));
  FARMEM_ASSIGN_OR_RETURN(m.transport_address, GetString(j, "transport_address"));
  FARMEM_ASSIGN_OR_RETURN(m.backend, GetString(j, "backend"));
  return m;
}

std::string EncodeWelcome(const WelcomeMsg& msg) {
  return Dump(json{{"name", msg.name},
                   {"transport_address", msg.transport_address},
                   {"backend", msg.backend},
                   {"regions", RegionsToJson(msg.regions)}});
}

Result<WelcomeMsg> DecodeWelcome(std::string_view body) {
  FARMEM_ASSIGN_OR_RETURN(json j, ParseObject(body));
  WelcomeMsg m;
  FARMEM_ASSIGN_OR_RETURN(m.name, GetString(j, "name"));
  FARMEM_ASSIGN_OR_RETURN(m.transport_address, GetString(j, "transport_address"));
  FARMEM_ASSIGN_OR_RETURN(m.backend, GetString(j, "backend"));
  FARMEM_ASSIGN_OR_RETURN(m.regions, RegionsFromJson(j));
  return m;
}

std::string EncodeError(const Status& status) {
  Status s = status.ok() ? Status::Internal("error frame without an error") : status;
  return Dump(json{{"code", static_cast<int>(s.code())}, {"message", std::string(s.message())}});
}

Status DecodeError(std::string_view body) {
  auto j = ParseObject(body);
  if (!j.ok()) return Status::Protocol("bootstrap: malformed error frame from peer");
  auto it = j->find("code");
  if (it == j->end() || !it->is_number_integer() || !ValidCode(it->get<int64_t>())) {
    return Status::Protocol("bootstrap: error frame with an invalid code");
  }
  auto msg = GetString(*j, "message");
  if (!msg.ok()) return Status::Protocol("bootstrap: error frame without a message");
  return Status(static_cast<Code>(it->get<int64_t>()), *msg);
}

std::vector<std::byte> EncodeRegionList(const std::vector<RegionInfo>& regions) {
  std::string s = Dump(json{{"regions", RegionsToJson(regions)}});
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

Result<std::vector<RegionInfo>> DecodeRegionList(std::span<const std::byte> body) {
  std::string_view sv(reinterpret_cast<const char*>(body.data()), body.size());
  FARMEM_ASSIGN_OR_RETURN(json j, ParseObject(sv));
  return RegionsFromJson(j);
}

Result<std::pair<std::string, uint16_t>> SplitHostPort(std::string_view address) {
  std::string_view host, port;
  if (!address.empty() && address.front() == '[') {
    size_t close = address.find(']');
    if (close == std::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return Status::InvalidArgument("bad address '" + std::string(address) +
                                     "' (expected [ipv6]:port)");
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) {
      return Status::InvalidArgument("bad address '" + std::string(address) +
                                     "' (expected host:port)");
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  if (host.empty() || port.empty() || port.size() > 5) {
    return Status::InvalidArgument("bad address '" + std::string(address) +
                                   "' (expected host:port)");
  }
  uint32_t p = 0;
  for (char c : port) {
    if (c < '0' || c > '9') {
      return Status::InvalidArgument("bad port in address '" + std::string(address) + "'");
    }
    p = p * 10 + static_cast<uint32_t>(c - '0');
  }
  if (p == 0 || p > 65535) {
    return Status::InvalidArgument("port out of range in address '" + std::string(address) + "'");
  }
  return std::make_pair(std::string(host), static_cast<uint16_t>(p));
}

// ---------------------------------------------------------------------------------------------
// Client

Result<WelcomeMsg> Handshake(std::string_view host_sv, uint16_t port, const HelloMsg& hello,
                             std::chrono::milliseconds timeout) {
  const std::string host(host_sv);
  const std::string target = FormatHostPort(host, port);
  const auto deadline = Clock::now() + timeout;
  FARMEM_ASSIGN_OR_RETURN(Fd fd, ConnectWithDeadline(host, port, deadline));
  FARMEM_RETURN_IF_ERROR(
      SendAll(fd.get(), Frame(FrameType::kHello, EncodeHello(hello)), deadline, target));

  std::byte hdr_buf[kFrameHeaderSize];
  FARMEM_RETURN_IF_ERROR(RecvAll(fd.get(), hdr_buf, sizeof(hdr_buf), deadline, target));
  FrameHeader h = DecodeHeader(hdr_buf);
  if (h.magic != kBootstrapMagic) {
    return Status::Protocol("bootstrap: " + target + " is not a farmem bootstrap listener");
  }
  if (h.version != kBootstrapVersion) {
    return Status::Protocol("bootstrap: " + target + " speaks protocol version " +
                            std::to_string(h.version) + ", this node " +
                            std::to_string(kBootstrapVersion));
  }
  if (h.body_length > kMaxBootstrapBody) {
    return Status::Protocol("bootstrap: answer from " + target + " too large (" +
                            std::to_string(h.body_length) + " bytes)");
  }
  std::string body(h.body_length, '\0');
  FARMEM_RETURN_IF_ERROR(RecvAll(fd.get(), body.data(), body.size(), deadline, target));
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::kWelcome:
      return DecodeWelcome(body);
    case FrameType::kError:
      return DecodeError(body);
    default:
      return Status::Protocol("bootstrap: unexpected frame type " + std::to_string(h.type) +
                              " from " + target);
  }
}

// ---------------------------------------------------------------------------------------------
// Server

struct BootstrapServer::Conn {
  Fd fd;
  std::string peer;
  Clock::time_point deadline;
  std::vector<std::byte> in;  // header, then header + body
  std::string out;            // the answer frame once decided
  size_t out_off = 0;
  bool answering = false;  // reading is over; flushing `out`, then closing
};

BootstrapServer::BootstrapServer(HelloFn on_hello, std::chrono::milliseconds handshake_timeout)
    : on_hello_(std::move(on_hello)), handshake_timeout_(handshake_timeout) {}

BootstrapServer::~BootstrapServer() {
  Stop();
}

Status BootstrapServer::Start(const std::string& host, uint16_t port) {
  if (listen_fd_ >= 0) return Status::InvalidArgument("bootstrap listener already started");
  FARMEM_ASSIGN_OR_RETURN(AddrInfoPtr ai, Resolve(host, port, true));
  Status last = Status::Unavailable("bootstrap: no usable address for " + host);
  Fd fd;
  for (addrinfo* a = ai.get(); a != nullptr; a = a->ai_next) {
    Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (s.get() < 0) {
      last = Status::FromErrno("bootstrap: socket", errno);
      continue;
    }
    int one = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
      last = Status::FromErrno("bootstrap: bind " + FormatHostPort(host, port), errno);
      continue;
    }
    if (::listen(s.get(), 128) != 0) {
      last = Status::FromErrno("bootstrap: listen", errno);
      continue;
    }
    fd = std::move(s);
    break;
  }
  if (fd.get() < 0) return last;
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Status::FromErrno("bootstrap: getsockname", errno);
  }
  uint16_t bound = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                            : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  Fd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wake.get() < 0) return Status::FromErrno("bootstrap: eventfd", errno);

  address_ = FormatHostPort(host, bound);
  // Ownership of both descriptors moves to the server (closed in Stop()).
  listen_fd_ = fd.release();
  wake_fd_ = wake.release();
  stop_.store(false);
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

void BootstrapServer::Stop() {
  std::lock_guard lock(stop_mu_);
  stop_.store(true);
  if (wake_fd_ >= 0) {
    uint64_t one = 1;
    ssize_t n = ::write(wake_fd_, &one, sizeof(one));
    (void)n;  // an eventfd write only fails on counter overflow; the flag is set either way
  }
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  listen_fd_ = -1;
  wake_fd_ = -1;
}

std::string BootstrapServer::address() const {
  return address_;
}

BootstrapServer::Stats BootstrapServer::stats() const {
  Stats s;
  s.accepted = accepted_.load();
  s.welcomed = welcomed_.load();
  s.rejected = rejected_.load();
  s.malformed = malformed_.load();
  s.timed_out = timed_out_.load();
  return s;
}

void BootstrapServer::Loop() {
  std::vector<std::unique_ptr<Conn>> conns;
  std::vector<pollfd> pfds;

  // Decide the answer for a connection whose input is complete or broken; switches it to writing.
  auto answer = [&](Conn& c, FrameType type, const std::string& body) {
    c.out = Frame(type, body);
    c.out_off = 0;
    c.answering = true;
  };
  auto reject = [&](Conn& c, const Status& st) {
    FARMEM_LOG_DEBUG("bootstrap: {} from {}", st.ToString(), c.peer);
    answer(c, FrameType::kError, EncodeError(st));
  };

  // Called when c.in holds a complete header (and maybe the body). Returns false to keep reading.
  auto on_input = [&](Conn& c) -> bool {
    FrameHeader h = DecodeHeader(c.in.data());
    if (h.magic != kBootstrapMagic) {
      malformed_++;
      reject(c, Status::Protocol("not a farmem bootstrap frame (bad magic)"));
      return true;
    }
    if (h.version != kBootstrapVersion) {
      rejected_++;
      reject(c, Status::InvalidArgument("bootstrap protocol version " + std::to_string(h.version) +
                                        " not supported (this node speaks " +
                                        std::to_string(kBootstrapVersion) + ")"));
      return true;
    }
    if (h.type != static_cast<uint16_t>(FrameType::kHello)) {
      malformed_++;
      reject(c, Status::Protocol("expected a HELLO frame, got type " + std::to_string(h.type)));
      return true;
    }
    if (h.body_length > kMaxBootstrapBody) {
      malformed_++;
      reject(c,
             Status::Protocol("HELLO body of " + std::to_string(h.body_length) +
                              " bytes exceeds the limit of " + std::to_string(kMaxBootstrapBody)));
      return true;
    }
    if (c.in.size() < kFrameHeaderSize + h.body_length) return false;
    std::string_view body(reinterpret_cast<const char*>(c.in.data()) + kFrameHeaderSize,
                          h.body_length);
    auto hello = DecodeHello(body);
    if (!hello.ok()) {
      malformed_++;
      reject(c, hello.status());
      return true;
    }
    Result<WelcomeMsg> welcome = Status::Internal("bootstrap: hello handler did not run");
    try {
      welcome = on_hello_(*hello, c.peer);
    } catch (const std::exception& e) {
      welcome = Status::Internal(std::string("bootstrap: hello handler threw: ") + e.what());
    } catch (...) {
      welcome = Status::Internal("bootstrap: hello handler threw");
    }
    if (!welcome.ok()) {
      rejected_++;
      answer(c, FrameType::kError, EncodeError(welcome.status()));
      return true;
    }
    std::string wbody = EncodeWelcome(*welcome);
    if (wbody.size() > kMaxBootstrapBody) {
      rejected_++;
      reject(c, Status::ResourceExhausted("WELCOME too large (too many exported regions)"));
      return true;
    }
    welcomed_++;
    answer(c, FrameType::kWelcome, wbody);
    return true;
  };

  // Read what is available. Returns false when the connection must be dropped.
  auto do_read = [&](Conn& c) -> bool {
    std::byte buf[16384];
    for (;;) {
      size_t need;
      if (c.in.size() < kFrameHeaderSize) {
        need = kFrameHeaderSize - c.in.size();
      } else {
        FrameHeader h = DecodeHeader(c.in.data());
        need = kFrameHeaderSize + h.body_length - c.in.size();  // header was validated
      }
      ssize_t n = ::recv(c.fd.get(), buf, std::min(need, sizeof(buf)), MSG_DONTWAIT);
      if (n == 0) {
        malformed_++;
        FARMEM_LOG_DEBUG("bootstrap: {} closed before finishing its HELLO", c.peer);
        return false;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        malformed_++;
        return false;
      }
      c.in.insert(c.in.end(), buf, buf + n);
      if (c.in.size() >= kFrameHeaderSize && on_input(c)) return true;
    }
  };

  // Flush the answer. Returns false when the connection is finished (sent or broken).
  auto do_write = [&](Conn& c) -> bool {
    while (c.out_off < c.out.size()) {
      ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out_off += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      return false;
    }
    ::shutdown(c.fd.get(), SHUT_WR);
    return false;
  };

  while (!stop_.load()) {
    pfds.clear();
    pfds.push_back({wake_fd_, POLLIN, 0});
    const bool can_accept = conns.size() < kMaxOpenHandshakes;
    pfds.push_back({listen_fd_, static_cast<short>(can_accept ? POLLIN : 0), 0});
    auto now = Clock::now();
    Clock::time_point next = now + std::chrono::seconds(1);
    for (auto& c : conns) {
      pfds.push_back({c->fd.get(), static_cast<short>(c->answering ? POLLOUT : POLLIN), 0});
      next = std::min(next, c->deadline);
    }
    int r = ::poll(pfds.data(), pfds.size(), MsLeft(next));
    if (r < 0) {
      if (errno == EINTR) continue;
      FARMEM_LOG_ERROR("bootstrap: poll failed: {}", std::strerror(errno));
      break;
    }
    if (stop_.load()) break;

    // Service existing connections first (pfds[2..] match conns by index).
    std::vector<std::unique_ptr<Conn>> keep;
    keep.reserve(conns.size());
    now = Clock::now();
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = *conns[i];
      short rev = pfds[i + 2].revents;
      bool alive = true;
      if (rev & (POLLIN | POLLHUP | POLLERR)) {
        alive = c.answering ? do_write(c) : do_read(c);
      } else if (rev & POLLOUT) {
        alive = do_write(c);
      }
      // An answer decided during the read is flushed at once (usually fits the socket buffer).
      if (alive && c.answering && (rev & POLLIN)) alive = do_write(c);
      if (alive && now >= c.deadline) {
        if (!c.answering) {
          timed_out_++;
          FARMEM_LOG_DEBUG("bootstrap: {} did not send its HELLO in time", c.peer);
        }
        alive = false;
      }
      if (alive) keep.push_back(std::move(conns[i]));
    }
    conns.swap(keep);

    if (pfds[1].revents & POLLIN) {
      while (conns.size() < kMaxOpenHandshakes) {
        sockaddr_storage ss{};
        socklen_t len = sizeof(ss);
        int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) {
            FARMEM_LOG_WARN("bootstrap: accept failed: {}", std::strerror(errno));
          }
          break;
        }
        accepted_++;
        auto c = std::make_unique<Conn>();
        c->fd = Fd(fd);
        c->peer = SockaddrToString(ss);
        c->deadline = Clock::now() + handshake_timeout_;
        conns.push_back(std::move(c));
      }
    }
  }
  // Open handshakes are dropped; their clients see the connection close (Unavailable).
}

}  // namespace farmem::node
