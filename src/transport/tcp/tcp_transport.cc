// Native batched TCP transport. Target side: one NIC thread per transport (epoll) serves
// READ/WRITE/CAS/FAA frames straight from registered memory and hands RPCs to the RpcHandler.
// Initiator side: TcpContext batches request frames per connection and flushes them once per
// poll().
#include "transport/tcp/tcp_transport.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/copy_epoch.h"
#include "common/log.h"
#include "transport/tcp/frame_codec.h"
#include "transport/tcp/ordered_copy.h"

namespace farmem {
namespace {

namespace w = tcpwire;
using Clock = std::chrono::steady_clock;

// epoll user data of the two non-connection fds; connection ids start above them.
constexpr uint64_t kListenId = 0;
constexpr uint64_t kWakeId = 1;
// How long a connection closed for a protocol error keeps draining input, so the error frame is
// not destroyed by a TCP reset before the peer reads it.
constexpr auto kCloseLinger = std::chrono::seconds(1);
// Upper bound for one blocking epoll_wait, so stop() stays prompt even if a wakeup were lost.
constexpr int kEpollSleepMs = 50;
// Initiator send buffers flush inside post once they hold this much, bounding their memory.
constexpr size_t kEagerFlushBytes = 256 * 1024;
constexpr size_t kRecvChunk = 64 * 1024;

std::string ErrnoText(int err) {
  return std::strerror(err);
}

void SetNoDelay(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

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

std::string FormatSockaddr(const sockaddr_storage& ss) {
  char ip[INET6_ADDRSTRLEN] = "?";
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
    return fmt::format("{}:{}", ip, ntohs(a->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
    return fmt::format("[{}]:{}", ip, ntohs(a->sin6_port));
  }
  return "unknown";
}

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// State shared by a transport and every context it created, so contexts may outlive it safely.
struct Shared {
  explicit Shared(TransportConfig c)
      : config(std::move(c)), stop_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  const TransportConfig config;
  std::atomic<bool> stopped{false};
  // Becomes readable (and stays so) when the transport stops, so a context blocked in wait()
  // returns at once and its poll() aborts what is pending. -1 if eventfd failed (wait() then
  // also wakes at the earliest op deadline, which it always does).
  const Fd stop_fd;
  void SignalStop() {
    stopped.store(true, std::memory_order_release);
    if (stop_fd.get() >= 0) {
      const uint64_t one = 1;
      (void)!::write(stop_fd.get(), &one, sizeof(one));
    }
  }

  struct Peer {
    std::string address;
    SockAddr addr;
  };
  std::mutex peers_mu;
  std::vector<Peer> peers;  // index = PeerId
  std::unordered_map<std::string, PeerId> peer_ids;
};

// ---------------------------------------------------------------------------------------------
// Target side.

struct ServerStats {
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> frames{0};
  std::atomic<uint64_t> sends{0};
  std::atomic<uint64_t> protocol_errors{0};
  std::atomic<uint64_t> read_copy_waits{0};
};

class ServerConn;

// NIC-thread bookkeeping that connections reach from IncomingRpc::reply.
struct NicShared {
  ServerStats stats;
  std::atomic<std::thread::id> nic_thread{};
  // Connections with responses appended during the current batch; flushed at its end (NIC only).
  std::vector<std::shared_ptr<ServerConn>> dirty;
};

class ServerConn : public std::enable_shared_from_this<ServerConn> {
 public:
  ServerConn(uint64_t id, int fd, int epoll_fd, std::string peer, std::shared_ptr<NicShared> nic)
      : id(id), fd(fd), epoll_fd(epoll_fd), peer_name(std::move(peer)), nic(std::move(nic)) {}

  const uint64_t id;
  const int fd;  // closed (and never used again) once `closed` is set, under wmu
  const int epoll_fd;
  const std::string peer_name;
  const std::shared_ptr<NicShared> nic;

  // NIC thread only.
  bool authenticated = false;
  bool closing = false;
  bool in_dirty = false;
  Clock::time_point close_deadline{};
  w::ByteQueue rbuf;
  size_t rneed = 0;

  // The write side may be used from any thread (RPC replies).
  std::mutex wmu;
  w::ByteQueue wbuf;        // guarded by wmu
  bool closed = false;      // guarded by wmu: fd closed
  bool write_shut = false;  // guarded by wmu: no more output (error sent or send failed)
  bool want_out = false;    // guarded by wmu: EPOLLOUT armed

  // Requires wmu. Sends what the socket takes; arms EPOLLOUT for the rest.
  Status FlushLocked() {
    if (closed || write_shut) {
      wbuf.clear();
      return Status::Unavailable(fmt::format("connection from {} is closed", peer_name));
    }
    while (!wbuf.empty()) {
      const ssize_t n = ::send(fd, wbuf.data(), wbuf.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        nic->stats.sends.fetch_add(1, std::memory_order_relaxed);
        wbuf.consume(static_cast<size_t>(n));
        continue;
      }
      const int err = n < 0 ? errno : EPIPE;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        if (!want_out) {
          epoll_event ev{};
          ev.events = EPOLLIN | EPOLLOUT;
          ev.data.u64 = id;
          (void)::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &ev);
          want_out = true;
        }
        return Status::OK();
      }
      // The NIC thread sees the socket error on its next read and closes the connection.
      wbuf.clear();
      write_shut = true;
      return Status::Unavailable(fmt::format("send to {}: {}", peer_name, ErrnoText(err)));
    }
    if (want_out) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = id;
      (void)::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &ev);
      want_out = false;
    }
    return Status::OK();
  }

  // Requires wmu. On the NIC thread defers the send to the end of the batch (one syscall for all
  // responses of a batch); on other threads sends at once.
  Status SubmitLocked() {
    if (nic->nic_thread.load(std::memory_order_relaxed) == std::this_thread::get_id()) {
      if (!in_dirty) {
        in_dirty = true;
        nic->dirty.push_back(shared_from_this());
      }
      return Status::OK();
    }
    return FlushLocked();
  }
};

class TcpIncomingRpc final : public IncomingRpc {
 public:
  TcpIncomingRpc(std::shared_ptr<ServerConn> conn, uint64_t seq, uint32_t imm,
                 std::span<const uint8_t> payload, uint32_t max_reply)
      : conn_(std::move(conn)),
        seq_(seq),
        imm_(imm),
        max_reply_(max_reply),
        payload_(reinterpret_cast<const std::byte*>(payload.data()),
                 reinterpret_cast<const std::byte*>(payload.data()) + payload.size()) {}

  ~TcpIncomingRpc() override {
    if (!replied_) {
      (void)reply_error(Status::Aborted("the RPC handler dropped the request without a reply"));
    }
  }

  uint32_t imm() const override { return imm_; }
  std::span<const std::byte> payload() const override { return payload_; }
  std::string_view source() const override { return conn_->peer_name; }

  Status reply(uint32_t imm, std::span<const std::byte> payload) override {
    if (replied_) return Status::InvalidArgument("RPC already answered");
    if (payload.size() > max_reply_) {
      const std::string msg =
          fmt::format("RPC reply of {} bytes exceeds max_rpc_bytes {}", payload.size(), max_reply_);
      (void)SendError(static_cast<uint16_t>(Code::kResourceExhausted), msg);
      return Status::InvalidArgument(msg);
    }
    replied_ = true;
    std::lock_guard lock(conn_->wmu);
    if (conn_->closed || conn_->write_shut) {
      return Status::Unavailable(
          fmt::format("RPC reply dropped: connection from {} is closed", conn_->peer_name));
    }
    w::EncodeRpc(conn_->wbuf, w::Opcode::kRpcResp, seq_, imm, payload.data(),
                 static_cast<uint32_t>(payload.size()));
    return conn_->SubmitLocked();
  }

  Status reply_error(const Status& status) override {
    if (replied_) return Status::InvalidArgument("RPC already answered");
    const Code code = status.ok() ? Code::kInternal : status.code();
    return SendError(
        static_cast<uint16_t>(code),
        status.ok() ? std::string_view("reply_error called with OK status") : status.message());
  }

 private:
  Status SendError(uint16_t code, std::string_view msg) {
    replied_ = true;
    std::lock_guard lock(conn_->wmu);
    if (conn_->closed || conn_->write_shut) {
      return Status::Unavailable(
          fmt::format("RPC reply dropped: connection from {} is closed", conn_->peer_name));
    }
    w::EncodeError(conn_->wbuf, seq_, code, msg);
    return conn_->SubmitLocked();
  }

  std::shared_ptr<ServerConn> conn_;
  const uint64_t seq_;
  const uint32_t imm_;
  const uint32_t max_reply_;
  std::vector<std::byte> payload_;
  bool replied_ = false;
};

// ---------------------------------------------------------------------------------------------
// Initiator side.

class TcpContext final : public Context {
 public:
  explicit TcpContext(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {
    timeout_ms_ = shared_->config.op_timeout.count();
  }

  ~TcpContext() override {
    for (auto& c : conns_) {
      if (c && c->fd >= 0) ::close(c->fd);
    }
  }

  Status post_read(const RemoteRef& src, void* dst, size_t len, uint64_t wr_id) override {
    if (len > w::kMaxIoBytes)
      return Status::InvalidArgument(
          fmt::format("read of {} bytes exceeds the {} byte limit", len, w::kMaxIoBytes));
    if (dst == nullptr && len != 0) return Status::InvalidArgument("read into a null buffer");
    FARMEM_ASSIGN_OR_RETURN(Conn * c, ConnFor(src.peer));
    const uint64_t seq = NewOp(OpType::kRead, c, wr_id, dst, len, nullptr, true);
    if (c->fd < 0) return FailNew(seq, c);
    w::EncodeRead(c->sbuf, seq, src.key, src.offset, static_cast<uint32_t>(len));
    Queued(c);
    return Status::OK();
  }

  Status post_write(const RemoteRef& dst, const void* src, size_t len, uint64_t wr_id,
                    bool delivery_complete) override {
    if (len > w::kMaxIoBytes)
      return Status::InvalidArgument(
          fmt::format("write of {} bytes exceeds the {} byte limit", len, w::kMaxIoBytes));
    if (src == nullptr && len != 0) return Status::InvalidArgument("write from a null buffer");
    FARMEM_ASSIGN_OR_RETURN(Conn * c, ConnFor(dst.peer));
    const uint64_t seq = NewOp(OpType::kWrite, c, wr_id, nullptr, len, nullptr, delivery_complete);
    if (c->fd < 0) return FailNew(seq, c);
    // The data is copied into the send buffer here, so the source is reusable once it is sent.
    w::EncodeWrite(c->sbuf, seq, dst.key, dst.offset, src, static_cast<uint32_t>(len),
                   delivery_complete);
    if (!delivery_complete) {
      c->flush_waiters.push_back({c->bytes_sent + c->sbuf.size(), seq});
    }
    Queued(c);
    return Status::OK();
  }

  Status post_compare_swap(const RemoteRef& dst, uint64_t expected, uint64_t desired,
                           uint64_t* old_value, uint64_t wr_id) override {
    return PostAtomic(w::Opcode::kCompareSwap, OpType::kCompareSwap, dst, expected, desired,
                      old_value, wr_id);
  }

  Status post_fetch_add(const RemoteRef& dst, uint64_t add, uint64_t* old_value,
                        uint64_t wr_id) override {
    return PostAtomic(w::Opcode::kFetchAdd, OpType::kFetchAdd, dst, add, 0, old_value, wr_id);
  }

  Status post_rpc(PeerId peer, uint32_t imm, std::span<const std::byte> request,
                  std::span<std::byte> reply, uint64_t wr_id) override {
    if (request.size() > shared_->config.max_rpc_bytes)
      return Status::InvalidArgument(fmt::format("RPC request of {} bytes exceeds max_rpc_bytes {}",
                                                 request.size(), shared_->config.max_rpc_bytes));
    if (reply.data() == nullptr && !reply.empty())
      return Status::InvalidArgument("RPC reply buffer is null");
    FARMEM_ASSIGN_OR_RETURN(Conn * c, ConnFor(peer));
    const uint64_t seq = NewOp(OpType::kRpc, c, wr_id, reply.data(), reply.size(), nullptr, true);
    if (c->fd < 0) return FailNew(seq, c);
    w::EncodeRpc(c->sbuf, w::Opcode::kRpc, seq, imm, request.data(),
                 static_cast<uint32_t>(request.size()));
    Queued(c);
    return Status::OK();
  }

  size_t poll(std::span<Completion> out) override {
    if (shared_->stopped.load(std::memory_order_acquire)) {
      if (!aborted_) AbortAll();
    } else {
      Progress();
    }
    const size_t avail = ready_.size() - ready_head_;
    const size_t n = std::min(avail, out.size());
    for (size_t i = 0; i < n; ++i) out[i] = std::move(ready_[ready_head_ + i]);
    ready_head_ += n;
    if (ready_head_ == ready_.size()) {
      ready_.clear();
      ready_head_ = 0;
    }
    return n;
  }

  size_t outstanding() const override { return active_count_ + (ready_.size() - ready_head_); }

  // Sends what is queued, then blocks in ppoll() on the connections that owe this context a
  // response (POLLIN), still have bytes to send or are connecting (POLLOUT), and on the
  // transport's stop eventfd, until one is ready, `deadline` or the earliest op deadline.
  void wait(Clock::time_point deadline) override {
    if (shared_->stopped.load(std::memory_order_acquire)) return;
    Progress();
    if (ready_.size() > ready_head_) return;
    if (active_count_ > 0 && next_deadline_ < deadline) deadline = next_deadline_;
    pollfds_.clear();
    if (shared_->stop_fd.get() >= 0) pollfds_.push_back({shared_->stop_fd.get(), POLLIN, 0});
    for (auto& up : conns_) {
      const Conn* c = up.get();
      if (c == nullptr || c->fd < 0) continue;
      short events = 0;
      if (c->state == ConnState::kConnecting || !c->sbuf.empty()) events |= POLLOUT;
      if (c->state == ConnState::kConnected && c->awaiting > 0) events |= POLLIN;
      if (events != 0) pollfds_.push_back({c->fd, events, 0});
    }
    const auto now = Clock::now();
    if (deadline <= now) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    ++stats_.waits;
    (void)::ppoll(pollfds_.data(), pollfds_.size(), &ts, nullptr);
  }

  const TcpContextStats& stats() const { return stats_; }

 private:
  struct Op {
    uint32_t gen = 1;  // part of the wire seq; bumped on completion so late responses miss
    bool active = false;
    bool awaits_response = false;
    OpType type = OpType::kRead;
    PeerId peer = kInvalidPeer;
    uint64_t wr_id = 0;
    Clock::time_point deadline{};
    void* dst = nullptr;  // read destination or RPC reply buffer
    size_t len = 0;       // read length or RPC reply capacity
    uint64_t* old_value = nullptr;
  };

  struct FlushWaiter {
    uint64_t end;  // stream offset just past the frame: the op completes once this much is sent
    uint64_t seq;
  };

  enum class ConnState : uint8_t { kClosed, kConnecting, kConnected };

  struct Conn {
    PeerId peer = kInvalidPeer;
    std::string address;
    SockAddr addr;
    int fd = -1;
    ConnState state = ConnState::kClosed;
    Clock::time_point connect_deadline{};
    Status last_error;  // why the last connection failed (for ops posted while it cannot open)
    w::ByteQueue sbuf;
    w::ByteQueue rbuf;
    size_t rneed = 0;
    uint64_t bytes_sent = 0;  // stream bytes handed to the kernel since connect
    uint32_t awaiting = 0;    // active ops waiting for a response frame on this connection
    bool dirty = false;       // sbuf has bytes and the conn is in dirty_
    std::vector<FlushWaiter> flush_waiters;
    size_t flush_head = 0;
  };

  Status PostAtomic(w::Opcode wop, OpType type, const RemoteRef& dst, uint64_t a, uint64_t b,
                    uint64_t* old_value, uint64_t wr_id) {
    if (old_value == nullptr) return Status::InvalidArgument("old_value pointer is null");
    FARMEM_ASSIGN_OR_RETURN(Conn * c, ConnFor(dst.peer));
    const uint64_t seq = NewOp(type, c, wr_id, nullptr, 8, old_value, true);
    if (c->fd < 0) return FailNew(seq, c);
    w::EncodeAtomic(c->sbuf, wop, seq, dst.key, dst.offset, a, b);
    Queued(c);
    return Status::OK();
  }

  std::string PeerText(const Conn* c) const {
    return fmt::format("peer {} ({})", c->peer, c->address);
  }

  Result<Conn*> ConnFor(PeerId peer) {
    if (shared_->stopped.load(std::memory_order_acquire))
      return Status::Unavailable("transport stopped");
    Conn* c = peer < conns_.size() ? conns_[peer].get() : nullptr;
    if (c == nullptr) {
      Shared::Peer info;
      {
        std::lock_guard lock(shared_->peers_mu);
        if (peer >= shared_->peers.size())
          return Status::NotFound(fmt::format("unknown peer id {}", peer));
        info = shared_->peers[peer];
      }
      if (conns_.size() <= peer) conns_.resize(peer + 1);
      conns_[peer] = std::make_unique<Conn>();
      c = conns_[peer].get();
      c->peer = peer;
      c->address = std::move(info.address);
      c->addr = info.addr;
    }
    if (c->state == ConnState::kClosed) Connect(c);
    return c;
  }

  // Starts a non-blocking connect; the hello is queued first so requests can follow at once.
  void Connect(Conn* c) {
    const int fd =
        ::socket(c->addr.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      c->last_error =
          Status::Unavailable(fmt::format("socket for {}: {}", PeerText(c), ErrnoText(errno)));
      return;
    }
    SetNoDelay(fd);
    int rc;
    do {
      rc = ::connect(fd, c->addr.sa(), c->addr.len);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0 && errno != EINPROGRESS) {
      const int err = errno;
      ::close(fd);
      c->last_error =
          Status::Unavailable(fmt::format("connect to {}: {}", PeerText(c), ErrnoText(err)));
      return;
    }
    ++stats_.connects;
    c->fd = fd;
    c->state = rc == 0 ? ConnState::kConnected : ConnState::kConnecting;
    c->connect_deadline = Clock::now() + shared_->config.connect_timeout;
    c->sbuf.clear();
    c->rbuf.clear();
    c->rneed = 0;
    c->bytes_sent = 0;
    c->flush_waiters.clear();
    c->flush_head = 0;
    w::EncodeHello(c->sbuf, shared_->config.cluster_token);
    MarkDirty(c);
  }

  uint64_t NewOp(OpType type, Conn* c, uint64_t wr_id, void* dst, size_t len, uint64_t* old_value,
                 bool awaits_response) {
    uint32_t slot;
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slot = static_cast<uint32_t>(ops_.size());
      ops_.emplace_back();
    }
    Op& op = ops_[slot];
    op.active = true;
    op.awaits_response = awaits_response;
    op.type = type;
    op.peer = c->peer;
    op.wr_id = wr_id;
    op.deadline = Clock::now() + shared_->config.op_timeout;
    op.dst = dst;
    op.len = len;
    op.old_value = old_value;
    if (op.deadline < next_deadline_) next_deadline_ = op.deadline;
    ++active_count_;
    if (awaits_response) ++c->awaiting;
    return (uint64_t{op.gen} << 32) | slot;
  }

  // An op posted while its connection could not be opened completes with the connect error.
  Status FailNew(uint64_t seq, Conn* c) {
    Complete(static_cast<uint32_t>(seq),
             c->last_error.ok() ? Status::Unavailable("not connected to " + PeerText(c))
                                : c->last_error);
    return Status::OK();
  }

  void Queued(Conn* c) {
    ++stats_.frames_posted;
    MarkDirty(c);
    if (c->sbuf.size() >= kEagerFlushBytes) Flush(c);
  }

  void MarkDirty(Conn* c) {
    if (!c->dirty) {
      c->dirty = true;
      dirty_.push_back(c);
    }
  }

  Op* Find(uint64_t seq, PeerId peer) {
    const auto slot = static_cast<uint32_t>(seq);
    if (slot >= ops_.size()) return nullptr;
    Op& op = ops_[slot];
    if (!op.active || op.gen != static_cast<uint32_t>(seq >> 32) || op.peer != peer) return nullptr;
    return &op;
  }

  void Complete(uint32_t slot, Status status, uint32_t imm = 0, uint32_t reply_len = 0) {
    Op& op = ops_[slot];
    Completion& out = ready_.emplace_back();
    out.wr_id = op.wr_id;
    out.op = op.type;
    out.status = std::move(status);
    out.reply_imm = imm;
    out.reply_length = reply_len;
    if (op.awaits_response && op.peer < conns_.size() && conns_[op.peer])
      --conns_[op.peer]->awaiting;
    op.active = false;
    op.dst = nullptr;
    op.old_value = nullptr;
    if (++op.gen == 0) op.gen = 1;  // seq 0 is reserved for connection-level frames
    free_.push_back(slot);
    --active_count_;
  }

  void Progress() {
    const Clock::time_point now = Clock::now();
    if (!dirty_.empty()) {
      size_t keep = 0;
      for (size_t i = 0; i < dirty_.size(); ++i) {
        Conn* c = dirty_[i];
        if (!c->dirty) continue;
        if (c->state == ConnState::kConnecting) CheckConnect(c, now);
        if (c->state == ConnState::kConnected) Flush(c);
        if (c->dirty) dirty_[keep++] = c;
      }
      dirty_.resize(keep);
    }
    for (auto& up : conns_) {
      Conn* c = up.get();
      if (c != nullptr && c->state == ConnState::kConnected && c->awaiting > 0) Receive(c);
    }
    if (active_count_ > 0 && now >= next_deadline_) ExpireOps(Clock::now());
  }

  void CheckConnect(Conn* c, Clock::time_point now) {
    pollfd p{c->fd, POLLOUT, 0};
    const int r = ::poll(&p, 1, 0);
    if (r > 0) {
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
      if (err != 0) {
        FailConn(
            c, Status::Unavailable(fmt::format("connect to {}: {}", PeerText(c), ErrnoText(err))));
        return;
      }
      c->state = ConnState::kConnected;
      return;
    }
    if (now >= c->connect_deadline) {
      FailConn(c, Status::TimedOut(fmt::format("connect to {} timed out after {} ms", PeerText(c),
                                               shared_->config.connect_timeout.count())));
    }
  }

  void Flush(Conn* c) {
    if (c->state != ConnState::kConnected) return;
    while (!c->sbuf.empty()) {
      const ssize_t n = ::send(c->fd, c->sbuf.data(), c->sbuf.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        ++stats_.send_calls;
        c->sbuf.consume(static_cast<size_t>(n));
        c->bytes_sent += static_cast<uint64_t>(n);
        continue;
      }
      const int err = n < 0 ? errno : EPIPE;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      FailConn(c, Status::Unavailable(fmt::format("send to {}: {}", PeerText(c), ErrnoText(err))));
      return;
    }
    if (c->sbuf.empty()) c->dirty = false;
    // Writes without delivery-complete finish once their frame left the send buffer.
    while (c->flush_head < c->flush_waiters.size() &&
           c->flush_waiters[c->flush_head].end <= c->bytes_sent) {
      const uint64_t seq = c->flush_waiters[c->flush_head++].seq;
      if (Find(seq, c->peer) != nullptr) Complete(static_cast<uint32_t>(seq), Status::OK());
    }
    if (c->flush_head == c->flush_waiters.size()) {
      c->flush_waiters.clear();
      c->flush_head = 0;
    }
  }

  void Receive(Conn* c) {
    for (;;) {
      const size_t have = c->rbuf.size();
      const size_t want = c->rneed > have ? std::max(kRecvChunk, c->rneed - have) : kRecvChunk;
      std::span<uint8_t> space = c->rbuf.prepare(want);
      const ssize_t n = ::recv(c->fd, space.data(), space.size(), MSG_DONTWAIT);
      if (n > 0) {
        ++stats_.recv_calls;
        c->rbuf.commit(static_cast<size_t>(n));
        if (!DecodeResponses(c)) return;
        if (static_cast<size_t>(n) < space.size() || c->awaiting == 0) return;
        continue;
      }
      if (n == 0) {
        FailConn(c, Status::Unavailable(PeerText(c) + " closed the connection"));
        return;
      }
      const int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      FailConn(c,
               Status::Unavailable(fmt::format("recv from {}: {}", PeerText(c), ErrnoText(err))));
      return;
    }
  }

  // Returns false once the connection failed (its buffers are gone).
  bool DecodeResponses(Conn* c) {
    static constexpr w::DecodeLimits kLimits{w::kMaxIoBytes, w::kMaxRpcBytes};
    for (;;) {
      w::FrameView f;
      const w::DecodeResult r = w::DecodeFrame(c->rbuf.readable(), kLimits, &f);
      if (r.state == w::DecodeState::kNeedMore) {
        c->rneed = r.needed;
        return true;
      }
      if (r.state == w::DecodeState::kError) {
        FailConn(
            c, Status::Protocol(fmt::format("malformed frame from {}: {}", PeerText(c), r.error)));
        return false;
      }
      if (!HandleResponse(c, f)) return false;
      c->rbuf.consume(f.frame_size);
    }
  }

  bool HandleResponse(Conn* c, const w::FrameView& f) {
    ++stats_.frames_received;
    if (w::IsRequestOpcode(f.header.opcode)) {
      FailConn(c, Status::Protocol(PeerText(c) + " sent a request frame to an initiator"));
      return false;
    }
    const std::string_view text(reinterpret_cast<const char*>(f.data.data()), f.data.size());
    if (f.opcode == w::Opcode::kError && f.header.seq == 0) {
      FailConn(c, Status(static_cast<Code>(f.header.code),
                         fmt::format("{} refused the connection: {}", PeerText(c), text)));
      return false;
    }
    Op* op = Find(f.header.seq, c->peer);
    if (op == nullptr) {
      // A response for an op that already completed (timed out): its buffers are not touched.
      ++stats_.stale_responses;
      return true;
    }
    const auto slot = static_cast<uint32_t>(f.header.seq);
    bool match = false;
    switch (f.opcode) {
      case w::Opcode::kError:
        Complete(slot, Status(static_cast<Code>(f.header.code), text));
        return true;
      case w::Opcode::kReadResp:
        if (op->type != OpType::kRead || f.data.size() != op->len) break;
        if (!f.data.empty()) std::memcpy(op->dst, f.data.data(), f.data.size());
        match = true;
        break;
      case w::Opcode::kWriteResp:
        match = op->type == OpType::kWrite && op->awaits_response;
        break;
      case w::Opcode::kAtomicResp:
        if (op->type != OpType::kCompareSwap && op->type != OpType::kFetchAdd) break;
        *op->old_value = f.atomic_resp.old_value;
        match = true;
        break;
      case w::Opcode::kRpcResp:
        if (op->type != OpType::kRpc) break;
        if (f.data.size() > op->len) {
          Complete(slot,
                   Status::ResourceExhausted(
                       fmt::format("RPC reply of {} bytes exceeds the {} byte reply buffer",
                                   f.data.size(), op->len)),
                   f.rpc.imm, static_cast<uint32_t>(f.data.size()));
          return true;
        }
        if (!f.data.empty()) std::memcpy(op->dst, f.data.data(), f.data.size());
        Complete(slot, Status::OK(), f.rpc.imm, static_cast<uint32_t>(f.data.size()));
        return true;
      default:
        break;
    }
    if (!match) {
      FailConn(c, Status::Protocol(
                      fmt::format("{} answered a {} with a mismatched response frame (opcode {})",
                                  PeerText(c), OpTypeName(op->type), f.header.opcode)));
      return false;
    }
    Complete(slot, Status::OK());
    return true;
  }

  void ExpireOps(Clock::time_point now) {
    Clock::time_point earliest = Clock::time_point::max();
    for (uint32_t slot = 0; slot < ops_.size(); ++slot) {
      Op& op = ops_[slot];
      if (!op.active) continue;
      if (op.deadline <= now) {
        const Conn* c = conns_[op.peer].get();
        Complete(slot,
                 Status::TimedOut(fmt::format("{} to {} timed out after {} ms", OpTypeName(op.type),
                                              PeerText(c), timeout_ms_)));
      } else {
        earliest = std::min(earliest, op.deadline);
      }
    }
    next_deadline_ = earliest;
  }

  // Closes the connection and fails every op that was sent over it; the next post reconnects.
  void FailConn(Conn* c, const Status& status) {
    if (c->fd >= 0) ::close(c->fd);
    c->fd = -1;
    c->state = ConnState::kClosed;
    c->last_error = status;
    c->sbuf.clear();
    c->rbuf.clear();
    c->rneed = 0;
    c->dirty = false;
    c->flush_waiters.clear();
    c->flush_head = 0;
    for (uint32_t slot = 0; slot < ops_.size(); ++slot) {
      if (ops_[slot].active && ops_[slot].peer == c->peer) Complete(slot, status);
    }
  }

  void AbortAll() {
    aborted_ = true;
    const Status st = Status::Aborted("transport stopped");
    for (uint32_t slot = 0; slot < ops_.size(); ++slot) {
      if (ops_[slot].active) Complete(slot, st);
    }
    for (auto& c : conns_) {
      if (c && c->fd >= 0) FailConn(c.get(), st);
    }
    dirty_.clear();
  }

  std::shared_ptr<Shared> shared_;
  int64_t timeout_ms_ = 0;
  std::vector<std::unique_ptr<Conn>> conns_;  // index = PeerId; created on first use
  std::vector<Conn*> dirty_;                  // conns with unsent bytes (or still connecting)
  std::vector<Op> ops_;
  std::vector<uint32_t> free_;
  size_t active_count_ = 0;
  Clock::time_point next_deadline_ = Clock::time_point::max();  // no active op expires earlier
  std::vector<Completion> ready_;
  size_t ready_head_ = 0;
  bool aborted_ = false;
  std::vector<pollfd> pollfds_;  // wait()'s set, reused
  TcpContextStats stats_;
};

// ---------------------------------------------------------------------------------------------

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TransportConfig& config)
      : shared_(std::make_shared<Shared>(config)),
        nic_(std::make_shared<NicShared>()),
        rng_(std::random_device{}()) {
    limits_.max_io_bytes = w::kMaxIoBytes;
    limits_.max_rpc_bytes = config.max_rpc_bytes;
  }

  ~TcpTransport() override { stop(); }

  std::string name() const override { return "tcp"; }
  std::string local_address() const override {
    std::lock_guard lock(lifecycle_mu_);
    return local_address_;
  }

  void set_rpc_handler(RpcHandler handler) override { handler_ = std::move(handler); }

  Status start() override {
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

  void stop() override {
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

  Result<MemoryRegion> register_memory(void* addr, size_t len, Access access) override {
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

  Status deregister_memory(RegionKey key) override {
    // Taking the lock exclusively waits out any NIC-thread access to the region in progress.
    std::unique_lock lock(regions_mu_);
    if (regions_.erase(key) == 0)
      return Status::NotFound(fmt::format("region key {:#x} is not registered", key));
    return Status::OK();
  }

  Status wait_for_read_copies(std::chrono::steady_clock::time_point deadline) override {
    // One NIC thread serves every read, each copy bracketed by read_copies_.
    nic_->stats.read_copy_waits.fetch_add(1, std::memory_order_relaxed);
    const CopyEpoch* nic[] = {&read_copies_};
    if (WaitForCopies(nic, deadline)) return Status::OK();
    return Status::TimedOut("tcp transport: a one-sided read copy is still in progress");
  }

  Result<PeerId> add_peer(std::string_view address) override {
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

  Result<std::unique_ptr<Context>> create_context() override {
    if (shared_->stopped.load()) return Status::Unavailable("tcp transport stopped");
    return std::unique_ptr<Context>(std::make_unique<TcpContext>(shared_));
  }

  TcpTransportStats stats() const {
    TcpTransportStats s;
    s.connections_accepted = nic_->stats.accepted.load(std::memory_order_relaxed);
    s.frames_served = nic_->stats.frames.load(std::memory_order_relaxed);
    s.send_calls = nic_->stats.sends.load(std::memory_order_relaxed);
    s.protocol_errors = nic_->stats.protocol_errors.load(std::memory_order_relaxed);
    s.read_copy_waits = nic_->stats.read_copy_waits.load(std::memory_order_relaxed);
    return s;
  }

 private:
  void NicLoop() {
    nic_->nic_thread.store(std::this_thread::get_id());
    const auto spin = shared_->config.spin_before_sleep;
    epoll_event events[64];
    Clock::time_point last_work = Clock::now();
    while (!stop_requested_.load(std::memory_order_acquire)) {
      const bool spinning = spin.count() > 0 && Clock::now() - last_work < spin;
      const int n = ::epoll_wait(epoll_fd_.get(), events, 64, spinning ? 0 : kEpollSleepMs);
      if (n < 0) {
        if (errno == EINTR) continue;
        FARMEM_LOG_ERROR("tcp NIC thread: epoll_wait: {}", ErrnoText(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      if (n > 0) last_work = Clock::now();
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[i].data.u64;
        if (id == kListenId) {
          AcceptAll();
        } else if (id == kWakeId) {
          uint64_t v;
          (void)!::read(wake_fd_.get(), &v, sizeof(v));
        } else {
          auto it = conns_.find(id);
          if (it == conns_.end()) continue;  // closed earlier in this batch
          std::shared_ptr<ServerConn> conn = it->second;
          if (events[i].events & EPOLLOUT) {
            std::lock_guard lock(conn->wmu);
            (void)conn->FlushLocked();
          }
          if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) HandleReadable(conn);
        }
      }
      FlushDirty();
      if (!closing_.empty()) SweepClosing();
    }
    FlushDirty();
  }

  void FlushDirty() {
    // Includes replies that RPC handlers gave at once on this thread during the batch.
    for (auto& conn : nic_->dirty) {
      std::lock_guard lock(conn->wmu);
      conn->in_dirty = false;
      (void)conn->FlushLocked();
    }
    nic_->dirty.clear();
  }

  void AcceptAll() {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      const int fd = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
          FARMEM_LOG_WARN("tcp NIC thread: accept: {}", ErrnoText(errno));
        return;
      }
      SetNoDelay(fd);
      const uint64_t id = next_conn_id_++;
      auto conn = std::make_shared<ServerConn>(id, fd, epoll_fd_.get(), FormatSockaddr(ss), nic_);
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = id;
      if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) < 0) {
        FARMEM_LOG_WARN("tcp NIC thread: epoll_ctl for {}: {}", conn->peer_name, ErrnoText(errno));
        ::close(fd);
        continue;
      }
      nic_->stats.accepted.fetch_add(1, std::memory_order_relaxed);
      conns_.emplace(id, std::move(conn));
    }
  }

  void HandleReadable(const std::shared_ptr<ServerConn>& conn) {
    // Bounded so one busy peer cannot starve the others (epoll is level-triggered).
    for (int round = 0; round < 8; ++round) {
      const size_t have = conn->rbuf.size();
      const size_t want =
          conn->rneed > have ? std::max(kRecvChunk, conn->rneed - have) : kRecvChunk;
      std::span<uint8_t> space = conn->rbuf.prepare(want);
      const ssize_t n = ::recv(conn->fd, space.data(), space.size(), MSG_DONTWAIT);
      if (n > 0) {
        conn->rbuf.commit(static_cast<size_t>(n));
        if (conn->closing) {
          conn->rbuf.clear();  // draining after a fatal error
        } else if (!ProcessFrames(conn)) {
          return;
        }
        if (static_cast<size_t>(n) < space.size()) return;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      if (n < 0) FARMEM_LOG_DEBUG("tcp: recv from {}: {}", conn->peer_name, ErrnoText(errno));
      CloseConn(*conn);
      conns_.erase(conn->id);
      return;
    }
  }

  // Locks held while serving a run of one-sided frames: taken once per batch rather than per
  // frame, and dropped before anything that may re-enter (RPC handlers, closing). Order: regions
  // before the connection's write lock (reply threads take only the latter, register only the
  // former).
  class BatchLocks {
   public:
    BatchLocks(std::shared_mutex& regions, std::mutex& wmu) : regions_mu_(regions), wmu_(wmu) {}
    void Lock() {
      if (!regions_.owns_lock()) regions_ = std::shared_lock(regions_mu_);
      if (!wlock_.owns_lock()) wlock_ = std::unique_lock(wmu_);
    }
    void Unlock() {
      if (wlock_.owns_lock()) wlock_.unlock();
      if (regions_.owns_lock()) regions_.unlock();
    }

   private:
    std::shared_mutex& regions_mu_;
    std::mutex& wmu_;
    std::shared_lock<std::shared_mutex> regions_;
    std::unique_lock<std::mutex> wlock_;
  };

  // Serves every complete frame in the connection's buffer. False once the connection is closing.
  bool ProcessFrames(const std::shared_ptr<ServerConn>& conn) {
    BatchLocks locks(regions_mu_, conn->wmu);
    uint64_t frames = 0;
    bool alive = true;
    for (;;) {
      w::FrameView f;
      const w::DecodeResult r = w::DecodeFrame(conn->rbuf.readable(), limits_, &f);
      if (r.state == w::DecodeState::kNeedMore) {
        conn->rneed = r.needed;
        break;
      }
      if (r.state == w::DecodeState::kError) {
        locks.Unlock();
        Fatal(conn, Code::kProtocol, fmt::format("malformed frame: {}", r.error));
        alive = false;
        break;
      }
      ++frames;
      if (!Serve(conn, f, locks)) {
        alive = false;
        break;
      }
      conn->rbuf.consume(f.frame_size);
    }
    locks.Unlock();
    nic_->stats.frames.fetch_add(frames, std::memory_order_relaxed);
    return alive;
  }

  static bool TokenEquals(std::string_view a, std::string_view b) {
    // Runtime independent of where the first difference is.
    uint8_t diff = a.size() == b.size() ? 0 : 1;
    const size_t n = std::max(a.size(), b.size());
    for (size_t i = 0; i < n; ++i) {
      const uint8_t x = i < a.size() ? static_cast<uint8_t>(a[i]) : 0;
      const uint8_t y = i < b.size() ? static_cast<uint8_t>(b[i]) : 0;
      diff |= x ^ y;
    }
    return diff == 0;
  }

  // Checks [offset, offset+len) of region `key` and, for WRITE/CAS/FAA (`modify`), that the
  // region is writable; returns the address or sets an error. Checked in this order: key, access,
  // bounds (alignment is the caller's), so a read-only region never reaches the memory code.
  uint8_t* Locate(uint64_t key, uint64_t offset, uint64_t len, bool modify, Code* code,
                  std::string* msg) {
    auto it = regions_.find(key);
    if (it == regions_.end()) {
      *code = Code::kNotFound;
      *msg = fmt::format("region key {:#x} is not registered", key);
      return nullptr;
    }
    const MemoryRegion& r = it->second;
    if (modify && r.access == Access::kReadOnly) {
      *code = Code::kPermissionDenied;
      *msg =
          fmt::format("region {:#x} is read-only: one-sided writes and atomics are refused", key);
      return nullptr;
    }
    if (offset > r.length || len > r.length - offset) {
      *code = Code::kOutOfRange;
      *msg = fmt::format("offset {} + length {} is outside region {:#x} of {} bytes", offset, len,
                         key, r.length);
      return nullptr;
    }
    return static_cast<uint8_t*>(r.addr) + offset;
  }

  bool Serve(const std::shared_ptr<ServerConn>& conn_ptr, const w::FrameView& f,
             BatchLocks& locks) {
    ServerConn& conn = *conn_ptr;
    if (!conn.authenticated) {
      locks.Unlock();
      if (f.opcode != w::Opcode::kHello) {
        Fatal(conn_ptr, Code::kPermissionDenied,
              "the first frame must be a hello carrying the cluster token");
        return false;
      }
      const std::string_view token(reinterpret_cast<const char*>(f.data.data()), f.data.size());
      if (!TokenEquals(token, shared_->config.cluster_token)) {
        Fatal(conn_ptr, Code::kPermissionDenied, "wrong cluster token");
        return false;
      }
      conn.authenticated = true;
      return true;
    }
    const uint64_t seq = f.header.seq;
    Code code = Code::kOk;
    std::string msg;
    switch (f.opcode) {
      case w::Opcode::kRead: {
        locks.Lock();
        const uint8_t* p = Locate(f.read.key, f.read.offset, f.read.length, false, &code, &msg);
        if (p == nullptr) break;
        if (conn.closed || conn.write_shut) return true;
        uint8_t* out = w::EncodeReadResp(conn.wbuf, seq, f.read.length);
        // Ascending aligned word loads, not memcpy: see ordered_copy.h. The epoch lets a memory
        // owner wait for this copy before it remaps the range (wait_for_read_copies).
        {
          CopyEpoch::Scope copying(read_copies_);
          w::CopyForRead(out, p, f.read.length);
        }
        (void)conn.SubmitLocked();
        return true;
      }
      case w::Opcode::kWrite: {
        locks.Lock();
        uint8_t* p = Locate(f.write.key, f.write.offset, f.data.size(), true, &code, &msg);
        if (p == nullptr) break;
        if (!f.data.empty()) std::memcpy(p, f.data.data(), f.data.size());
        if ((f.header.flags & w::kFlagDeliveryAck) && !conn.closed && !conn.write_shut) {
          w::EncodeWriteResp(conn.wbuf, seq);
          (void)conn.SubmitLocked();
        }
        return true;
      }
      case w::Opcode::kCompareSwap:
      case w::Opcode::kFetchAdd: {
        locks.Lock();
        uint8_t* p = Locate(f.atomic.key, f.atomic.offset, 8, true, &code, &msg);
        if (p == nullptr) break;
        if (reinterpret_cast<uintptr_t>(p) % 8 != 0) {
          code = Code::kInvalidArgument;
          msg = fmt::format("atomic at offset {} of region {:#x} is not 8-byte aligned",
                            f.atomic.offset, f.atomic.key);
          break;
        }
        // atomic_ref makes this atomic against local threads and other connections too.
        std::atomic_ref<uint64_t> word(*reinterpret_cast<uint64_t*>(p));
        uint64_t old;
        if (f.opcode == w::Opcode::kCompareSwap) {
          old = f.atomic.operand;
          word.compare_exchange_strong(old, f.atomic.operand2, std::memory_order_seq_cst);
        } else {
          old = word.fetch_add(f.atomic.operand, std::memory_order_seq_cst);
        }
        if (conn.closed || conn.write_shut) return true;
        w::EncodeAtomicResp(conn.wbuf, seq, old);
        (void)conn.SubmitLocked();
        return true;
      }
      case w::Opcode::kRpc: {
        locks.Unlock();  // the handler may answer at once, taking the write lock
        auto rpc = std::make_unique<TcpIncomingRpc>(conn_ptr, seq, f.rpc.imm, f.data,
                                                    shared_->config.max_rpc_bytes);
        if (handler_) {
          handler_(std::move(rpc));
        } else {
          (void)rpc->reply_error(Status::Unavailable("no RPC handler is installed on this node"));
        }
        return true;
      }
      case w::Opcode::kHello:
        locks.Unlock();
        Fatal(conn_ptr, Code::kProtocol, "duplicate hello");
        return false;
      default:
        locks.Unlock();
        Fatal(
            conn_ptr, Code::kProtocol,
            fmt::format("unexpected response frame (opcode {}) sent to a target", f.header.opcode));
        return false;
    }
    // A per-operation failure: answer it; the connection stays up. The locks are held here.
    if (!conn.closed && !conn.write_shut) {
      w::EncodeError(conn.wbuf, seq, static_cast<uint16_t>(code), msg);
      (void)conn.SubmitLocked();
    }
    return true;
  }

  // Sends a connection-level error frame, stops writing and drains input until the peer closes.
  void Fatal(const std::shared_ptr<ServerConn>& conn, Code code, const std::string& msg) {
    nic_->stats.protocol_errors.fetch_add(1, std::memory_order_relaxed);
    FARMEM_LOG_WARN("tcp: closing connection from {}: {}", conn->peer_name, msg);
    {
      std::lock_guard lock(conn->wmu);
      if (!conn->closed && !conn->write_shut) {
        w::EncodeError(conn->wbuf, 0, static_cast<uint16_t>(code), msg);
        (void)conn->FlushLocked();
        (void)::shutdown(conn->fd, SHUT_WR);
        conn->write_shut = true;
        conn->wbuf.clear();
      }
    }
    conn->closing = true;
    conn->close_deadline = Clock::now() + kCloseLinger;
    conn->rbuf.clear();
    closing_.push_back(conn->id);
  }

  void SweepClosing() {
    const Clock::time_point now = Clock::now();
    size_t keep = 0;
    for (uint64_t id : closing_) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      if (now >= it->second->close_deadline) {
        CloseConn(*it->second);
        conns_.erase(it);
        continue;
      }
      closing_[keep++] = id;
    }
    closing_.resize(keep);
  }

  static void CloseConn(ServerConn& conn) {
    std::lock_guard lock(conn.wmu);
    if (conn.closed) return;
    conn.closed = true;
    conn.wbuf.clear();
    ::close(conn.fd);  // also removes it from the epoll set
  }

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<NicShared> nic_;
  RpcHandler handler_;
  w::DecodeLimits limits_;

  mutable std::mutex lifecycle_mu_;  // start/stop/local_address
  bool started_ = false;
  std::string local_address_;
  Fd listen_fd_, epoll_fd_, wake_fd_;
  std::thread thread_;
  std::atomic<bool> stop_requested_{false};

  // Registered regions; the NIC thread holds it shared while touching region memory.
  std::shared_mutex regions_mu_;
  std::unordered_map<RegionKey, MemoryRegion> regions_;
  std::mt19937_64 rng_;    // guarded by regions_mu_
  CopyEpoch read_copies_;  // odd while the NIC thread copies region memory into a READ response

  // NIC thread only (and stop() after the thread joined).
  std::unordered_map<uint64_t, std::shared_ptr<ServerConn>> conns_;
  std::vector<uint64_t> closing_;
  uint64_t next_conn_id_ = 2;
};

}  // namespace

Result<std::unique_ptr<Transport>> CreateTcpTransport(const TransportConfig& config) {
  if (config.listen_host.empty()) return Status::InvalidArgument("listen_host is empty");
  if (config.cluster_token.size() > w::kMaxTokenBytes)
    return Status::InvalidArgument(
        fmt::format("cluster_token is longer than {} bytes", w::kMaxTokenBytes));
  if (config.max_rpc_bytes > w::kMaxRpcBytes)
    return Status::InvalidArgument(fmt::format("max_rpc_bytes {} exceeds the wire limit {}",
                                               config.max_rpc_bytes, w::kMaxRpcBytes));
  if (config.op_timeout.count() <= 0 || config.connect_timeout.count() <= 0)
    return Status::InvalidArgument("op_timeout and connect_timeout must be positive");
  return std::unique_ptr<Transport>(std::make_unique<TcpTransport>(config));
}

Result<TcpContextStats> GetTcpContextStats(const Context& context) {
  const auto* c = dynamic_cast<const TcpContext*>(&context);
  if (c == nullptr) return Status::InvalidArgument("not a tcp transport context");
  return c->stats();
}

Result<TcpTransportStats> GetTcpTransportStats(const Transport& transport) {
  const auto* t = dynamic_cast<const TcpTransport*>(&transport);
  if (t == nullptr) return Status::InvalidArgument("not a tcp transport");
  return t->stats();
}

}  // namespace farmem
