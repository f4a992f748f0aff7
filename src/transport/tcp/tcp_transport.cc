// The native TCP backend's Transport object (TcpTransport): listener and NIC thread lifecycle
// (start/stop), memory registration, peers (address parsing and resolution), contexts and the
// factory; called from any thread. NIC thread: tcp_target.cc; contexts: tcp_initiator.cc.
#include "transport/tcp/tcp_transport.h"

#include <fmt/format.h>
#include <netdb.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
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
#include "common/net/fd.h"
#include "common/net/host_port.h"
#include "common/net/socket.h"
#include "transport/tcp/frame_codec.h"
#include "transport/tcp/tcp_internal.h"

namespace farmem {
namespace tcp::internal {

namespace {

// The first address of host:port. A name that does not resolve is a bad peer or listen address
// (InvalidArgument) here, where net::Resolve reports Unavailable.
Result<SockAddr> ResolveFirst(const std::string& host, uint16_t port, bool passive) {
  auto ai = net::Resolve(host, port, passive);
  if (!ai.ok()) return Status::InvalidArgument(ai.status().message());
  SockAddr out;
  std::memcpy(&out.storage, (*ai)->ai_addr, (*ai)->ai_addrlen);
  out.len = (*ai)->ai_addrlen;
  return out;
}

}  // namespace

Status TcpTransport::start() {
  std::lock_guard lock(lifecycle_mu_);
  if (started_) return Status::InvalidArgument("tcp transport already started");
  if (shared_->stopped.load()) return Status::Unavailable("tcp transport was stopped");
  const TransportConfig& cfg = shared_->config;
  // Resolved once here only for the error code (see ResolveFirst); net::Listen resolves again.
  FARMEM_RETURN_IF_ERROR(ResolveFirst(cfg.listen_host, cfg.listen_port, true).status());
  uint16_t port = 0;
  FARMEM_ASSIGN_OR_RETURN(net::Fd listen_fd, net::Listen(cfg.listen_host, cfg.listen_port, 1024,
                                                         "tcp transport", &port));
  net::Fd epoll_fd(::epoll_create1(EPOLL_CLOEXEC));
  if (epoll_fd.get() < 0) return Status::FromErrno("epoll_create1", errno);
  net::Fd wake_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wake_fd.get() < 0) return Status::FromErrno("eventfd", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, listen_fd.get(), &ev) < 0)
    return Status::FromErrno("epoll_ctl", errno);
  ev.data.u64 = kWakeId;
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, wake_fd.get(), &ev) < 0)
    return Status::FromErrno("epoll_ctl", errno);

  local_address_ = net::FormatHostPort(cfg.listen_host, port);
  listen_fd_.reset(listen_fd.release());
  epoll_fd_.reset(epoll_fd.release());
  wake_fd_.reset(wake_fd.release());
  nic_->wake_fd = wake_fd_.get();
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
  FARMEM_ASSIGN_OR_RETURN(auto host_port, net::ParseHostPort(address, net::PortZero::kRefused));
  {
    std::lock_guard lock(shared_->peers_mu);
    auto it = shared_->peer_ids.find(std::string(address));
    if (it != shared_->peer_ids.end()) return it->second;
  }
  FARMEM_ASSIGN_OR_RETURN(SockAddr addr, ResolveFirst(host_port.first, host_port.second, false));
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
  const ServerStats& n = nic_->stats;
  s.refused_unauthenticated_oversize =
      n.refused_unauthenticated_oversize.load(std::memory_order_relaxed);
  s.auth_timeouts = n.auth_timeouts.load(std::memory_order_relaxed);
  s.refused_per_address = n.refused_per_address.load(std::memory_order_relaxed);
  s.refused_total = n.refused_total.load(std::memory_order_relaxed);
  s.backpressure_events = n.backpressure_events.load(std::memory_order_relaxed);
  s.throttled_connections = n.throttled.load(std::memory_order_relaxed);
  s.peak_send_queue_bytes = n.peak_send_queue.load(std::memory_order_relaxed);
  s.queued_reply_bytes = n.queued_total.load(std::memory_order_relaxed);
  s.peak_total_send_queue_bytes = n.peak_queued_total.load(std::memory_order_relaxed);
  s.accept_backoffs = n.accept_backoffs.load(std::memory_order_relaxed);
  s.open_connections = n.open.load(std::memory_order_relaxed);
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
  const TcpLimits& lim = config.tcp_limits;
  const size_t hello =
      sizeof(tcpwire::FrameHeader) + sizeof(tcpwire::HelloBody) + config.cluster_token.size();
  if (lim.max_unauthenticated_bytes < hello)
    return Status::InvalidArgument(
        fmt::format("tcp_limits.max_unauthenticated_bytes {} cannot hold a hello of {} bytes",
                    lim.max_unauthenticated_bytes, hello));
  if (lim.auth_timeout.count() <= 0)
    return Status::InvalidArgument("tcp_limits.auth_timeout must be positive");
  if (lim.max_send_queue_bytes == 0 || lim.send_queue_resume_bytes > lim.max_send_queue_bytes)
    return Status::InvalidArgument(
        "tcp_limits: need 0 < max_send_queue_bytes and send_queue_resume_bytes <= it");
  if (lim.max_connections == 0 || lim.max_connections_per_address == 0)
    return Status::InvalidArgument("tcp_limits: connection limits must be positive");
  if (lim.accept_backoff_min.count() <= 0 || lim.accept_backoff_max < lim.accept_backoff_min)
    return Status::InvalidArgument("tcp_limits: need 0 < accept_backoff_min <= accept_backoff_max");
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
