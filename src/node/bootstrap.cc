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
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/net/accept_backoff.h"
#include "common/net/socket.h"
#include "node/bootstrap_wire.h"

namespace farmem::node {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using net::Fd;
using net::FormatHostPort;
using net::MsLeft;

// Connections accepted per poll round, so a connection flood cannot starve open handshakes.
constexpr int kMaxAcceptsPerRound = 64;

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

// Every error code of farmem/status.h (kFailedPrecondition is the last): EncodeError sends any of
// them, so the decoder accepts all of them (it stopped at kInternal, turning kMoved and
// kFailedPrecondition into Protocol errors).
bool ValidCode(int64_t c) {
  return c > static_cast<int64_t>(Code::kOk) &&
         c <= static_cast<int64_t>(Code::kFailedPrecondition);
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

HelloFrame ParseHelloFrame(std::span<const std::byte> in) {
  HelloFrame f;
  if (in.size() < kFrameHeaderSize) {
    f.frame_bytes = kFrameHeaderSize;
    return f;
  }
  const FrameHeader h = DecodeHeader(in.data());
  auto fail = [&f](HelloFrame::Kind kind, Status st) {
    f.kind = kind;
    f.error = std::move(st);
    return f;
  };
  if (h.magic != kBootstrapMagic) {
    return fail(HelloFrame::Kind::kMalformed,
                Status::Protocol("not a farmem bootstrap frame (bad magic)"));
  }
  if (h.version != kBootstrapVersion) {
    return fail(HelloFrame::Kind::kRejected,
                Status::InvalidArgument("bootstrap protocol version " + std::to_string(h.version) +
                                        " not supported (this node speaks " +
                                        std::to_string(kBootstrapVersion) + ")"));
  }
  if (h.type != static_cast<uint16_t>(FrameType::kHello)) {
    return fail(HelloFrame::Kind::kMalformed,
                Status::Protocol("expected a HELLO frame, got type " + std::to_string(h.type)));
  }
  if (h.body_length > kMaxHelloBody) {
    return fail(HelloFrame::Kind::kMalformed,
                Status::Protocol("HELLO body of " + std::to_string(h.body_length) +
                                 " bytes exceeds the limit of " + std::to_string(kMaxHelloBody)));
  }
  f.frame_bytes = kFrameHeaderSize + h.body_length;
  if (in.size() < f.frame_bytes) return f;
  std::string_view body(reinterpret_cast<const char*>(in.data()) + kFrameHeaderSize, h.body_length);
  Result<HelloMsg> hello = DecodeHello(body);
  if (!hello.ok()) return fail(HelloFrame::Kind::kMalformed, hello.status());
  f.kind = HelloFrame::Kind::kHello;
  f.hello = std::move(*hello);
  return f;
}

// ---------------------------------------------------------------------------------------------
// Client

Result<WelcomeMsg> Handshake(std::string_view host_sv, uint16_t port, const HelloMsg& hello,
                             std::chrono::milliseconds timeout) {
  const std::string host(host_sv);
  const std::string target = FormatHostPort(host, port);
  const auto deadline = Clock::now() + timeout;
  const std::string what = "bootstrap: handshake with " + target;
  FARMEM_ASSIGN_OR_RETURN(Fd fd, net::ConnectWithDeadline(host, port, deadline, "bootstrap"));
  FARMEM_RETURN_IF_ERROR(
      net::SendAll(fd.get(), Frame(FrameType::kHello, EncodeHello(hello)), deadline, what));

  std::byte hdr_buf[kFrameHeaderSize];
  FARMEM_RETURN_IF_ERROR(net::RecvAll(fd.get(), hdr_buf, sizeof(hdr_buf), deadline, what));
  const FrameHeader h = DecodeHeader(hdr_buf);
  FARMEM_RETURN_IF_ERROR(CheckReplyHeader(h, target));
  std::string body(h.body_length, '\0');
  FARMEM_RETURN_IF_ERROR(net::RecvAll(fd.get(), body.data(), body.size(), deadline, what));
  return DecodeReply(h.type, body, target);
}

Status CheckReplyHeader(const FrameHeader& h, std::string_view target_sv) {
  const std::string target(target_sv);
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
  return Status::OK();
}

Result<WelcomeMsg> DecodeReply(uint16_t type, std::string_view body, std::string_view target) {
  switch (static_cast<FrameType>(type)) {
    case FrameType::kWelcome:
      return DecodeWelcome(body);
    case FrameType::kError:
      return DecodeError(body);
    default:
      return Status::Protocol("bootstrap: unexpected frame type " + std::to_string(type) +
                              " from " + std::string(target));
  }
}

// ---------------------------------------------------------------------------------------------
// Server

struct BootstrapServer::Conn {
  Fd fd;
  std::string peer;
  std::string addr_key;  // AddressKey of the peer
  Clock::time_point deadline;
  std::vector<std::byte> in;  // header, then header + body
  std::string out;            // the answer frame once decided
  size_t out_off = 0;
  bool answering = false;  // reading is over; flushing `out`, then closing
};

BootstrapServer::BootstrapServer(HelloFn on_hello, std::chrono::milliseconds handshake_timeout,
                                 BootstrapLimits limits)
    : on_hello_(std::move(on_hello)), handshake_timeout_(handshake_timeout), limits_(limits) {
  limits_.handshake_timeout = handshake_timeout;
}

BootstrapServer::~BootstrapServer() {
  Stop();
}

Status BootstrapServer::Start(const std::string& host, uint16_t port) {
  if (listen_fd_ >= 0) return Status::InvalidArgument("bootstrap listener already started");
  uint16_t bound = 0;
  FARMEM_ASSIGN_OR_RETURN(Fd fd, net::Listen(host, port, 128, "bootstrap", &bound));
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
  s.refused_per_address = refused_per_address_.load();
  s.refused_total = refused_total_.load();
  s.accept_backoffs = accept_backoffs_.load();
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
    HelloFrame f = ParseHelloFrame(c.in);
    switch (f.kind) {
      case HelloFrame::Kind::kNeedMore:
        return false;
      case HelloFrame::Kind::kMalformed:
        malformed_++;
        reject(c, f.error);
        return true;
      case HelloFrame::Kind::kRejected:
        rejected_++;
        reject(c, f.error);
        return true;
      case HelloFrame::Kind::kHello:
        break;
    }
    Result<WelcomeMsg> welcome = Status::Internal("bootstrap: hello handler did not run");
    try {
      welcome = on_hello_(f.hello, c.peer);
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
      // The header, then exactly the rest of the frame (ParseHelloFrame validated the header).
      const HelloFrame f = ParseHelloFrame(c.in);
      if (f.kind != HelloFrame::Kind::kNeedMore || f.frame_bytes <= c.in.size()) {
        malformed_++;  // unreachable: on_input answered, or asked for more
        return false;
      }
      const size_t need = f.frame_bytes - c.in.size();
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

  // Open handshakes per peer address (entries removed at zero).
  std::unordered_map<std::string, uint32_t> per_address;
  auto forget = [&](const Conn& c) {
    auto it = per_address.find(c.addr_key);
    if (it != per_address.end() && --it->second == 0) per_address.erase(it);
  };
  net::AcceptBackoff backoff("bootstrap", limits_.accept_backoff_min, limits_.accept_backoff_max);

  // Admission of a new connection from `key` (see BootstrapLimits): false to refuse it. May
  // evict the busiest address's oldest handshake to make room, so one address (or a few) holding
  // every slot cannot lock others out.
  // Serves the input already waiting on `key`'s handshakes (a HELLO, or the EOF of a peer that
  // left) and forgets the finished ones, so an address is judged full by the handshakes really
  // in progress: connections accepted in the same round have not been read yet, and a burst of
  // quick legitimate handshakes from one host must not be refused for them.
  auto reap = [&](const std::string& key) {
    std::vector<pollfd> ready;
    std::vector<Conn*> owners;
    for (auto& c : conns) {
      if (c->addr_key != key) continue;
      ready.push_back({c->fd.get(), static_cast<short>(c->answering ? POLLOUT : POLLIN), 0});
      owners.push_back(c.get());
    }
    if (ready.empty() || ::poll(ready.data(), ready.size(), 0) <= 0) return;
    std::vector<const Conn*> done;
    for (size_t i = 0; i < ready.size(); ++i) {
      Conn& c = *owners[i];
      const short rev = ready[i].revents;
      if (rev == 0) continue;
      bool alive = c.answering ? do_write(c) : do_read(c);
      if (alive && c.answering) alive = do_write(c);
      if (!alive) done.push_back(&c);
    }
    for (const Conn* c : done) {
      forget(*c);
      std::erase_if(conns, [&](const std::unique_ptr<Conn>& p) { return p.get() == c; });
    }
  };

  auto admit = [&](const std::string& key, const std::string& peer) -> bool {
    (void)peer;  // only in debug logs, which release builds may compile out
    auto mine = per_address.find(key);
    if (mine != per_address.end() && mine->second >= limits_.max_open_handshakes_per_address) {
      reap(key);
      mine = per_address.find(key);
    }
    const uint32_t have = mine == per_address.end() ? 0 : mine->second;
    if (have >= limits_.max_open_handshakes_per_address) {
      refused_per_address_++;
      FARMEM_LOG_DEBUG("bootstrap: refusing {}: {} handshakes open from that address", peer, have);
      return false;
    }
    if (conns.size() < limits_.max_open_handshakes) return true;
    auto busiest = per_address.end();
    for (auto it = per_address.begin(); it != per_address.end(); ++it) {
      if (busiest == per_address.end() || it->second > busiest->second) busiest = it;
    }
    refused_total_++;
    if (busiest == per_address.end() || busiest->second <= have + 1) {
      FARMEM_LOG_DEBUG("bootstrap: refusing {}: {} handshakes open", peer, conns.size());
      return false;
    }
    // conns is in accept order: the first match is that address's oldest handshake.
    const std::string victim = busiest->first;
    for (auto it = conns.begin(); it != conns.end(); ++it) {
      if ((*it)->addr_key != victim) continue;
      FARMEM_LOG_DEBUG("bootstrap: dropping {} (its address holds the most handshakes) for {}",
                       (*it)->peer, peer);
      forget(**it);
      conns.erase(it);
      break;
    }
    return true;
  };

  while (!stop_.load()) {
    pfds.clear();
    pfds.push_back({wake_fd_, POLLIN, 0});
    auto now = Clock::now();
    // At the descriptor limit the listener stays readable: leave it out of the set until the
    // back-off ends rather than spin on accept.
    const bool can_accept = !backoff.paused(now);
    pfds.push_back({listen_fd_, static_cast<short>(can_accept ? POLLIN : 0), 0});
    Clock::time_point next = now + std::chrono::seconds(1);
    if (!can_accept) next = std::min(next, backoff.resume_at());
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
      if (alive) {
        keep.push_back(std::move(conns[i]));
      } else {
        forget(c);
      }
    }
    conns.swap(keep);

    if (can_accept && (pfds[1].revents & POLLIN)) {
      for (int n = 0; n < kMaxAcceptsPerRound;) {
        sockaddr_storage ss{};
        socklen_t len = sizeof(ss);
        int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          const auto action = backoff.OnError(errno, Clock::now());
          if (action == net::AcceptBackoff::Action::kRetry) continue;
          if (action == net::AcceptBackoff::Action::kPause) accept_backoffs_++;
          break;
        }
        ++n;
        backoff.OnSuccess();
        accepted_++;
        auto c = std::make_unique<Conn>();
        c->fd = Fd(fd);
        c->peer = net::FormatSockaddr(ss);
        c->addr_key = net::AddressKey(ss);
        if (!admit(c->addr_key, c->peer)) continue;  // closed by Fd's destructor
        ++per_address[c->addr_key];
        c->deadline = Clock::now() + handshake_timeout_;
        conns.push_back(std::move(c));
      }
    }
  }
  // Open handshakes are dropped; their clients see the connection close (Unavailable).
}

}  // namespace farmem::node
