// The native TCP backend's Transport object (TcpTransport): listener and NIC thread lifecycle
// (start/stop), memory registration, peers (address parsing and resolution), contexts and the
// factory; called from any thread. NIC thread: tcp_target.cc; contexts: tcp_initiator.cc.
#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "common/copy_epoch.h"
#include "common/log.h"
#include "transport/tcp/frame_codec.h"
#include "transport/tcp/tcp_internal.h"

namespace farmem {
namespace tcp::internal {

namespace {

// Splits "host:port" or "[v6-host]:port". `allow_zero_port` is for listen addresses.
Status SplitHostPort(std::string_view address, std::string* host, uint16_t* port,
                     bool allow_zero_port) {
  auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(fmt::format("bad address '{}': {}", address, why));
  };
  std::string_view h, p;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string_view::npos || close + 1 >= address.size() || address[close + 1] != ':')
      return bad("expected [host]:port");
    h = address.substr(1, close - 1);
    p = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) return bad("expected host:port");
    h = address.substr(0, colon);
    p = address.substr(colon + 1);
    if (h.find(':') != std::string_view::npos) return bad("IPv6 hosts need brackets");
  }
  if (h.empty()) return bad("empty host");
  if (p.empty() || p.size() > 5) return bad("port must be a number 1-65535");
  uint32_t v = 0;
  for (char ch : p) {
    if (ch < '0' || ch > '9') return bad("port must be a number 1-65535");
    v = v * 10 + static_cast<uint32_t>(ch - '0');
  }
  if (v > 65535 || (v == 0 && !allow_zero_port)) return bad("port must be a number 1-65535");
  *host = std::string(h);
  *port = static_cast<uint16_t>(v);
  return Status::OK();
}

Result<SockAddr> Resolve(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::InvalidArgument(
        fmt::format("cannot resolve host '{}': {}", host, ::gai_strerror(rc)));
  }
  SockAddr out;
  std::memcpy(&out.storage, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return out;
}

}  // namespace

Status TcpTransport::start() {
  std::lock_guard lock(lifecycle_mu_);
  if (started_) return Status::InvalidArgument("tcp transport already started");
  if (shared_->stopped.load()) return Status::Unavailable("tcp transport was stopped");
  const TransportConfig& cfg = shared_->config;
  FARMEM_ASSIGN_OR_RETURN(SockAddr addr, Resolve(cfg.listen_host, cfg.listen_port));
  Fd listen_fd(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (listen_fd.get() < 0) return Status::FromErrno("socket", errno);
  int one = 1;
  (void)::setsockopt(listen_fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(listen_fd.get(), addr.sa(), addr.len) < 0)
    return Status::FromErrno(fmt::format("bind {}:{}", cfg.listen_host, cfg.listen_port), errno);
  if (::listen(listen_fd.get(), 1024) < 0) return Status::FromErrno("listen", errno);
  sockaddr_storage bound{};
  socklen_t blen = sizeof(bound);
  if (::getsockname(listen_fd.get(), reinterpret_cast<sockaddr*>(&bound), &blen) < 0)
    return Status::FromErrno("getsockname", errno);
  const uint16_t port = bound.ss_family == AF_INET6
                            ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                            : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  Fd epoll_fd(::epoll_create1(EPOLL_CLOEXEC));
  if (epoll_fd.get() < 0) return Status::FromErrno("epoll_create1", errno);
  Fd wake_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wake_fd.get() < 0) return Status::FromErrno("eventfd", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, listen_fd.get(), &ev) < 0)
    return Status::FromErrno("epoll_ctl", errno);
  ev.data.u64 = kWakeId;
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, wake_fd.get(), &ev) < 0)
    return Status::FromErrno("epoll_ctl", errno);

  const bool v6 = cfg.listen_host.find(':') != std::string::npos;
  local_address_ = v6 ? fmt::format("[{}]:{}", cfg.listen_host, port)
                      : fmt::format("{}:{}", cfg.listen_host, port);
  listen_fd_.reset(listen_fd.release());
  epoll_fd_.reset(epoll_fd.release());
  wake_fd_.reset(wake_fd.release());
  started_ = true;
  thread_ = std::thread([this] { NicLoop(); });
  FARMEM_LOG_DEBUG("tcp transport listening on {}", local_address_);
  return Status::OK();
}

void TcpTransport::stop() {
  std::lock_guard lock(lifecycle_mu_);
  shared_->SignalStop();
  if (thread_.joinable()) {
    stop_requested_.store(true, std::memory_order_release);
    const uint64_t one = 1;
    (void)!::write(wake_fd_.get(), &one, sizeof(one));
    thread_.join();
  }
  for (auto& [id, conn] : conns_) CloseConn(*conn);
  conns_.clear();
  closing_.clear();
  nic_->dirty.clear();
  listen_fd_.reset();
  epoll_fd_.reset();
  wake_fd_.reset();
}

Result<MemoryRegion> TcpTransport::register_memory(void* addr, size_t len, Access access) {
  if (addr == nullptr || len == 0)
    return Status::InvalidArgument("register_memory needs a non-null address and length > 0");
  if (access != Access::kReadWrite && access != Access::kReadOnly)
    return Status::InvalidArgument(
        fmt::format("register_memory: unknown access mode {}", static_cast<int>(access)));
  std::unique_lock lock(regions_mu_);
  RegionKey key;
  do {
    key = rng_();
  } while (key == 0 || regions_.count(key) != 0);
  MemoryRegion mr{key, addr, len, access};
  regions_.emplace(key, mr);
  return mr;
}

Status TcpTransport::deregister_memory(RegionKey key) {
  // Taking the lock exclusively waits out any NIC-thread access to the region in progress.
  std::unique_lock lock(regions_mu_);
  if (regions_.erase(key) == 0)
    return Status::NotFound(fmt::format("region key {:#x} is not registered", key));
  return Status::OK();
}

Status TcpTransport::wait_for_read_copies(std::chrono::steady_clock::time_point deadline) {
  // One NIC thread serves every read, each copy bracketed by read_copies_.
  nic_->stats.read_copy_waits.fetch_add(1, std::memory_order_relaxed);
  const CopyEpoch* nic[] = {&read_copies_};
  if (WaitForCopies(nic, deadline)) return Status::OK();
  return Status::TimedOut("tcp transport: a one-sided read copy is still in progress");
}

Result<PeerId> TcpTransport::add_peer(std::string_view address) {
  std::string host;
  uint16_t port = 0;
  FARMEM_RETURN_IF_ERROR(SplitHostPort(address, &host, &port, false));
  {
    std::lock_guard lock(shared_->peers_mu);
    auto it = shared_->peer_ids.find(std::string(address));
    if (it != shared_->peer_ids.end()) return it->second;
  }
  FARMEM_ASSIGN_OR_RETURN(SockAddr addr, Resolve(host, port));
  std::lock_guard lock(shared_->peers_mu);
  auto [it, inserted] =
      shared_->peer_ids.emplace(std::string(address), static_cast<PeerId>(shared_->peers.size()));
  if (inserted) shared_->peers.push_back({std::string(address), addr});
  return it->second;
}

Result<std::unique_ptr<Context>> TcpTransport::create_context() {
  if (shared_->stopped.load()) return Status::Unavailable("tcp transport stopped");
  return std::unique_ptr<Context>(std::make_unique<TcpContext>(shared_));
}

TcpTransportStats TcpTransport::stats() const {
  TcpTransportStats s;
  s.connections_accepted = nic_->stats.accepted.load(std::memory_order_relaxed);
  s.frames_served = nic_->stats.frames.load(std::memory_order_relaxed);
  s.send_calls = nic_->stats.sends.load(std::memory_order_relaxed);
  s.protocol_errors = nic_->stats.protocol_errors.load(std::memory_order_relaxed);
  s.read_copy_waits = nic_->stats.read_copy_waits.load(std::memory_order_relaxed);
  return s;
}

}  // namespace tcp::internal

Result<std::unique_ptr<Transport>> CreateTcpTransport(const TransportConfig& config) {
  if (config.listen_host.empty()) return Status::InvalidArgument("listen_host is empty");
  if (config.cluster_token.size() > tcpwire::kMaxTokenBytes)
    return Status::InvalidArgument(
        fmt::format("cluster_token is longer than {} bytes", tcpwire::kMaxTokenBytes));
  if (config.max_rpc_bytes > tcpwire::kMaxRpcBytes)
    return Status::InvalidArgument(fmt::format("max_rpc_bytes {} exceeds the wire limit {}",
                                               config.max_rpc_bytes, tcpwire::kMaxRpcBytes));
  if (config.op_timeout.count() <= 0 || config.connect_timeout.count() <= 0)
    return Status::InvalidArgument("op_timeout and connect_timeout must be positive");
  return std::unique_ptr<Transport>(std::make_unique<tcp::internal::TcpTransport>(config));
}

Result<TcpContextStats> GetTcpContextStats(const Context& context) {
  const auto* c = dynamic_cast<const tcp::internal::TcpContext*>(&context);
  if (c == nullptr) return Status::InvalidArgument("not a tcp transport context");
  return c->stats();
}

Result<TcpTransportStats> GetTcpTransportStats(const Transport& transport) {
  const auto* t = dynamic_cast<const tcp::internal::TcpTransport*>(&transport);
  if (t == nullptr) return Status::InvalidArgument("not a tcp transport");
  return t->stats();
}

}  // namespace farmem
