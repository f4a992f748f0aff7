// Target side of the native TCP backend: the NIC thread (TcpTransport::NicLoop, epoll) accepts
// connections and serves READ/WRITE/CAS/FAA frames straight from registered memory, hands RPC
// frames to the RpcHandler and sends the replies (TcpIncomingRpc::reply from any thread).
#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/copy_epoch.h"
#include "common/log.h"
#include "common/net/socket.h"
#include "transport/tcp/frame_codec.h"
#include "transport/tcp/ordered_copy.h"
#include "transport/tcp/tcp_internal.h"

namespace farmem::tcp::internal {

void ServerConn::AccountLocked() {
  const size_t now = wbuf.size();
  if (now == accounted) return;
  auto& total = nic->stats.queued_total;
  if (now > accounted) {
    nic->stats.NoteTotal(total.fetch_add(now - accounted, std::memory_order_relaxed) + now -
                         accounted);
  } else {
    total.fetch_sub(accounted - now, std::memory_order_relaxed);
  }
  accounted = now;
}

Status ServerConn::FlushLocked() {
  struct Account {
    ServerConn& c;
    ~Account() { c.AccountLocked(); }
  } account{*this};
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
      if (!want_out) ArmLocked(true);
      return Status::OK();
    }
    // The NIC thread sees the socket error on its next read and closes the connection.
    wbuf.clear();
    wbuf.release_if_empty_above(kKeepBufferBytes);
    write_shut = true;
    return Status::Unavailable(fmt::format("send to {}: {}", peer_name, ErrnoText(err)));
  }
  wbuf.release_if_empty_above(kKeepBufferBytes);
  if (want_out) ArmLocked(false);
  return Status::OK();
}

void ServerConn::ArmLocked(bool out) {
  epoll_event ev{};
  ev.events = (paused ? 0u : static_cast<uint32_t>(EPOLLIN)) | (out ? EPOLLOUT : 0u);
  ev.data.u64 = id;
  (void)::epoll_ctl(epoll_fd, EPOLL_CTL_MOD, fd, &ev);
  want_out = out;
}

Status ServerConn::SubmitLocked() {
  nic->stats.NoteSendQueue(wbuf.size());
  AccountLocked();
  if (nic->nic_thread.load(std::memory_order_relaxed) == std::this_thread::get_id()) {
    if (!in_dirty) {
      in_dirty = true;
      nic->dirty.push_back(shared_from_this());
    }
    return Status::OK();
  }
  return FlushLocked();
}

namespace {

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
    AnsweredLocked();
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
    AnsweredLocked();
    if (conn_->closed || conn_->write_shut) {
      return Status::Unavailable(
          fmt::format("RPC reply dropped: connection from {} is closed", conn_->peer_name));
    }
    w::EncodeError(conn_->wbuf, seq_, code, msg);
    return conn_->SubmitLocked();
  }

  // Requires conn_->wmu (which guards `paused`). Once per RPC, with its answer.
  void AnsweredLocked() {
    conn_->rpcs_in_flight.fetch_sub(1, std::memory_order_acq_rel);
    if (conn_->paused && conn_->nic->wake_fd >= 0 &&
        conn_->nic->nic_thread.load(std::memory_order_relaxed) != std::this_thread::get_id()) {
      const uint64_t one = 1;
      (void)!::write(conn_->nic->wake_fd, &one, sizeof(one));
    }
  }

  std::shared_ptr<ServerConn> conn_;
  const uint64_t seq_;
  const uint32_t imm_;
  const uint32_t max_reply_;
  std::vector<std::byte> payload_;
  bool replied_ = false;
};

}  // namespace

// Locks held while serving a run of one-sided frames: taken once per batch rather than per
// frame, and dropped before anything that may re-enter (RPC handlers, closing). Order: regions
// before the connection's write lock (reply threads take only the latter, register only the
// former).
class TcpTransport::BatchLocks {
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

void TcpTransport::NicLoop() {
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
        const uint32_t ev = events[i].events;
        const bool hangup = (ev & (EPOLLERR | EPOLLHUP)) != 0;
        if ((ev & EPOLLOUT) || hangup) {
          std::lock_guard lock(conn->wmu);
          (void)conn->FlushLocked();  // on a hang-up this fails, clearing the queue
        }
        if (conn->paused) {  // only the NIC thread writes it: no lock needed to read it here
          // Reads resume from ResumePaused once the replies drain. A hang-up on a paused
          // connection whose replies cannot drain is final: close it rather than see the
          // (level-triggered) hang-up again in every round.
          if (hangup) ResumePaused();
          if (hangup && conns_.count(conn->id) != 0 && conn->paused) Drop(conn);
          continue;
        }
        if (ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) HandleReadable(conn);
      }
    }
    FlushDirty();
    const Clock::time_point now = Clock::now();
    if (!paused_.empty()) {
      ResumePaused();
      FlushDirty();  // what the resumed requests answered
    }
    if (!closing_.empty()) SweepClosing();
    if (!auth_waits_.empty()) SweepAuth(now);
    if (!listen_armed_) MaybeRearmListener(now);
  }
  FlushDirty();
}

void TcpTransport::FlushDirty() {
  // Includes replies that RPC handlers gave at once on this thread during the batch.
  for (auto& conn : nic_->dirty) {
    std::lock_guard lock(conn->wmu);
    conn->in_dirty = false;
    (void)conn->FlushLocked();
  }
  nic_->dirty.clear();
}

namespace {

// Closes a connection refused at accept, telling the peer why (best effort: one non-blocking
// send of a small error frame; the peer may see a reset instead if it already sent data).
void Refuse(int fd, const std::string& why) {
  w::ByteQueue q;
  w::EncodeError(q, 0, static_cast<uint16_t>(Code::kResourceExhausted), why);
  (void)!::send(fd, q.data(), q.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::close(fd);
}

}  // namespace

void TcpTransport::AcceptAll() {
  const TcpLimits& lim = shared_->config.tcp_limits;
  for (int accepted = 0; accepted < kMaxAcceptsPerRound;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int fd = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      switch (accept_backoff_.OnError(err, Clock::now())) {
        case net::AcceptBackoff::Action::kStop:
          return;
        case net::AcceptBackoff::Action::kRetry:
          continue;
        case net::AcceptBackoff::Action::kPause: {
          // Out of descriptors: the listener stays readable, so polling it again would spin.
          // Stop polling it until the back-off ends (MaybeRearmListener); open connections are
          // still served meanwhile.
          nic_->stats.accept_backoffs.fetch_add(1, std::memory_order_relaxed);
          epoll_event ev{};
          ev.events = 0;
          ev.data.u64 = kListenId;
          (void)::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, listen_fd_.get(), &ev);
          listen_armed_ = false;
          return;
        }
      }
      continue;
    }
    ++accepted;
    accept_backoff_.OnSuccess();
    std::string key = net::AddressKey(ss);
    if (conns_.size() >= lim.max_connections) {
      nic_->stats.refused_total.fetch_add(1, std::memory_order_relaxed);
      FARMEM_LOG_DEBUG("tcp: refusing {}: {} connections open", net::FormatSockaddr(ss),
                       conns_.size());
      Refuse(fd, fmt::format("too many connections (limit {})", lim.max_connections));
      continue;
    }
    auto count = per_address_.find(key);
    if (count != per_address_.end() && count->second >= lim.max_connections_per_address) {
      nic_->stats.refused_per_address.fetch_add(1, std::memory_order_relaxed);
      FARMEM_LOG_DEBUG("tcp: refusing {}: {} connections open from that address",
                       net::FormatSockaddr(ss), count->second);
      Refuse(fd, fmt::format("too many connections from this address (limit {})",
                             lim.max_connections_per_address));
      continue;
    }
    SetNoDelay(fd);
    const uint64_t id = next_conn_id_++;
    auto conn =
        std::make_shared<ServerConn>(id, fd, epoll_fd_.get(), net::FormatSockaddr(ss), nic_);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) < 0) {
      FARMEM_LOG_WARN("tcp NIC thread: epoll_ctl for {}: {}", conn->peer_name, ErrnoText(errno));
      ::close(fd);
      continue;
    }
    nic_->stats.accepted.fetch_add(1, std::memory_order_relaxed);
    nic_->stats.open.fetch_add(1, std::memory_order_relaxed);
    ++per_address_[key];
    conn->addr_key = std::move(key);
    auth_waits_.push_back({Clock::now() + lim.auth_timeout, id});
    conns_.emplace(id, std::move(conn));
  }
}

void TcpTransport::MaybeRearmListener(Clock::time_point now) {
  if (accept_backoff_.paused(now)) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenId;
  (void)::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, listen_fd_.get(), &ev);
  listen_armed_ = true;
}

void TcpTransport::Drop(const std::shared_ptr<ServerConn>& conn) {
  CloseConn(*conn);
  if (conn->paused) nic_->stats.throttled.fetch_sub(1, std::memory_order_relaxed);
  auto count = per_address_.find(conn->addr_key);
  if (count != per_address_.end() && --count->second == 0) per_address_.erase(count);
  nic_->stats.open.fetch_sub(1, std::memory_order_relaxed);
  conns_.erase(conn->id);
}

void TcpTransport::SweepAuth(Clock::time_point now) {
  while (!auth_waits_.empty() && auth_waits_.front().deadline <= now) {
    const uint64_t id = auth_waits_.front().id;
    auth_waits_.pop_front();
    auto it = conns_.find(id);
    if (it == conns_.end() || it->second->authenticated || it->second->closing) continue;
    nic_->stats.auth_timeouts.fetch_add(1, std::memory_order_relaxed);
    Fatal(it->second, Code::kTimedOut,
          fmt::format("no hello with the cluster token within {} ms",
                      shared_->config.tcp_limits.auth_timeout.count()),
          /*protocol_error=*/false);
  }
}

bool TcpTransport::ThrottleLocked(ServerConn& conn, const w::FrameView& f) {
  const TcpLimits& lim = shared_->config.tcp_limits;
  const size_t queued = conn.wbuf.size();
  const bool rpc_cap =
      f.opcode == w::Opcode::kRpc &&
      conn.rpcs_in_flight.load(std::memory_order_acquire) >= lim.max_rpcs_in_flight;
  // Bound on the reply this frame adds now (RPC replies come later, from the handler).
  size_t reply = 0;
  if (f.opcode == w::Opcode::kRead) {
    reply = sizeof(w::FrameHeader) + f.read.length;
  } else if (f.opcode != w::Opcode::kRpc) {
    reply = sizeof(w::FrameHeader) + w::kMaxErrorMessageBytes;
  }
  const uint64_t total = nic_->stats.queued_total.load(std::memory_order_relaxed);
  const bool over_total = total + reply > lim.max_total_send_queue_bytes;
  bool pause = rpc_cap;
  if (queued == 0) {
    // One reply is always sent, however large, unless the process-wide total is exceeded: then
    // only small ones, so every connection holding one large reply cannot add up without bound.
    pause = pause || (over_total && reply > kSmallReplyBytes);
  } else {
    pause = pause || queued + reply > lim.max_send_queue_bytes || over_total;
  }
  if (!pause) return false;
  conn.paused = true;
  conn.ArmLocked(conn.want_out);
  nic_->stats.backpressure_events.fetch_add(1, std::memory_order_relaxed);
  nic_->stats.throttled.fetch_add(1, std::memory_order_relaxed);
  paused_.push_back(conn.id);
  FARMEM_LOG_DEBUG("tcp: {} has {} reply bytes queued and {} RPCs unanswered: pausing its requests",
                   conn.peer_name, queued, conn.rpcs_in_flight.load(std::memory_order_relaxed));
  return true;
}

void TcpTransport::ResumePaused() {
  const size_t resume_below = shared_->config.tcp_limits.send_queue_resume_bytes;
  std::vector<uint64_t> ids;
  ids.swap(paused_);
  for (uint64_t id : ids) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    std::shared_ptr<ServerConn> conn = it->second;
    if (!conn->paused) continue;
    {
      std::lock_guard lock(conn->wmu);
      const bool rpcs_full = conn->rpcs_in_flight.load(std::memory_order_acquire) >=
                             shared_->config.tcp_limits.max_rpcs_in_flight;
      // A connection with replies queued also waits for the process-wide total to drain (one
      // with none resumes: its next frame is judged by ThrottleLocked again).
      const bool total_full =
          !conn->wbuf.empty() && nic_->stats.queued_total.load(std::memory_order_relaxed) >
                                     shared_->config.tcp_limits.total_send_queue_resume_bytes;
      if (!conn->closed && !conn->write_shut &&
          (conn->wbuf.size() > resume_below || rpcs_full || total_full)) {
        paused_.push_back(id);
        continue;
      }
      conn->paused = false;
      if (!conn->closed) conn->ArmLocked(conn->want_out);
    }
    nic_->stats.throttled.fetch_sub(1, std::memory_order_relaxed);
    // Requests already buffered would otherwise wait for more bytes from the peer, which may be
    // waiting for their replies.
    if (!conn->closing && !conn->rbuf.empty()) (void)ProcessFrames(conn);
  }
}

void TcpTransport::HandleReadable(const std::shared_ptr<ServerConn>& conn) {
  // Bounded so one busy peer cannot starve the others (epoll is level-triggered).
  const size_t max_unauth = shared_->config.tcp_limits.max_unauthenticated_bytes;
  for (int round = 0; round < 8; ++round) {
    if (conn->paused) return;  // back-pressure: further requests wait in the socket
    const size_t have = conn->rbuf.size();
    // How much this recv may add: before authentication only what a hello can need (the header
    // check in ProcessFrames refuses a first frame announcing more), after it one frame plus
    // one chunk. Requests beyond stay in the socket until these are served.
    const size_t cap = conn->closing ? kRecvChunk : conn->authenticated ? max_rbuf_ : max_unauth;
    if (have >= cap) return;  // only while paused with a full buffer; resumed by ResumePaused
    size_t want = conn->rneed > have ? std::max(kRecvChunk, conn->rneed - have) : kRecvChunk;
    want = std::min(want, cap - have);
    std::span<uint8_t> space = conn->rbuf.prepare(want);
    const size_t len = std::min(space.size(), cap - have);
    const ssize_t n = ::recv(conn->fd, space.data(), len, MSG_DONTWAIT);
    if (n > 0) {
      conn->rbuf.commit(static_cast<size_t>(n));
      if (conn->closing) {
        conn->rbuf.clear();  // draining after a fatal error
      } else if (!ProcessFrames(conn)) {
        return;
      }
      conn->rbuf.release_if_empty_above(kKeepBufferBytes);
      if (static_cast<size_t>(n) < len) return;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0) FARMEM_LOG_DEBUG("tcp: recv from {}: {}", conn->peer_name, ErrnoText(errno));
    Drop(conn);
    return;
  }
}

bool TcpTransport::ProcessFrames(const std::shared_ptr<ServerConn>& conn) {
  BatchLocks locks(regions_mu_, conn->wmu);
  uint64_t frames = 0;
  bool alive = true;
  const size_t max_unauth = shared_->config.tcp_limits.max_unauthenticated_bytes;
  for (;;) {
    if (!conn->authenticated && conn->rbuf.size() >= sizeof(w::FrameHeader)) {
      // Checked from the header alone, before anything is buffered for the body: an
      // unauthenticated peer must not make the target allocate what its frame announces.
      w::FrameHeader h;
      std::memcpy(&h, conn->rbuf.data(), sizeof(h));
      if (sizeof(w::FrameHeader) + uint64_t{h.body_len} > max_unauth) {
        nic_->stats.refused_unauthenticated_oversize.fetch_add(1, std::memory_order_relaxed);
        locks.Unlock();
        Fatal(conn, Code::kPermissionDenied,
              fmt::format("first frame of {} bytes exceeds the {} bytes allowed before the hello",
                          sizeof(w::FrameHeader) + uint64_t{h.body_len}, max_unauth),
              /*protocol_error=*/false);
        alive = false;
        break;
      }
    }
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
    if (conn->authenticated) {
      locks.Lock();                         // wbuf's size is read under wmu
      if (ThrottleLocked(*conn, f)) break;  // the frame stays buffered until replies drain
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

bool TcpTransport::TokenEquals(std::string_view a, std::string_view b) {
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

uint8_t* TcpTransport::Locate(uint64_t key, uint64_t offset, uint64_t len, bool modify, Code* code,
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
    *msg = fmt::format("region {:#x} is read-only: one-sided writes and atomics are refused", key);
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

bool TcpTransport::Serve(const std::shared_ptr<ServerConn>& conn_ptr, const w::FrameView& f,
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
      // Ascending aligned word stores, not memcpy: see ordered_copy.h ("Placement of one-sided
      // writes" in docs/transport.md).
      w::CopyForWrite(p, f.data.data(), f.data.size());
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
      // Counted before the handler can answer (and uncount it) on another thread.
      conn.rpcs_in_flight.fetch_add(1, std::memory_order_acq_rel);
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
      Fatal(conn_ptr, Code::kProtocol,
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

void TcpTransport::Fatal(const std::shared_ptr<ServerConn>& conn, Code code, const std::string& msg,
                         bool protocol_error) {
  if (protocol_error) {
    nic_->stats.protocol_errors.fetch_add(1, std::memory_order_relaxed);
    FARMEM_LOG_WARN("tcp: closing connection from {}: {}", conn->peer_name, msg);
  } else {
    FARMEM_LOG_DEBUG("tcp: closing connection from {}: {}", conn->peer_name, msg);
  }
  {
    std::lock_guard lock(conn->wmu);
    if (!conn->closed && !conn->write_shut) {
      w::EncodeError(conn->wbuf, 0, static_cast<uint16_t>(code), msg);
      (void)conn->FlushLocked();
      (void)::shutdown(conn->fd, SHUT_WR);
      conn->write_shut = true;
      conn->wbuf.clear();
      conn->AccountLocked();
    }
  }
  conn->closing = true;
  conn->close_deadline = Clock::now() + kCloseLinger;
  conn->rbuf.clear();
  closing_.push_back(conn->id);
}

void TcpTransport::SweepClosing() {
  const Clock::time_point now = Clock::now();
  size_t keep = 0;
  for (uint64_t id : closing_) {
    auto it = conns_.find(id);
    if (it == conns_.end()) continue;
    if (now >= it->second->close_deadline) {
      Drop(std::shared_ptr<ServerConn>(it->second));  // a copy: Drop erases the map entry
      continue;
    }
    closing_[keep++] = id;
  }
  closing_.resize(keep);
}

void TcpTransport::CloseConn(ServerConn& conn) {
  std::lock_guard lock(conn.wmu);
  if (conn.closed) return;
  conn.closed = true;
  conn.wbuf.clear();
  conn.AccountLocked();
  ::close(conn.fd);  // also removes it from the epoll set
}

}  // namespace farmem::tcp::internal
