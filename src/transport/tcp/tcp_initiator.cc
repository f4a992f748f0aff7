// Initiator side of the native TCP backend: TcpContext, one per thread and used by that thread
// only. Batches request frames per connection, flushes them once per poll(), decodes responses
// into Completions, expires ops at their deadlines and blocks in wait() (ppoll).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/net/socket.h"
#include "transport/tcp/frame_codec.h"
#include "transport/tcp/tcp_internal.h"

namespace farmem::tcp::internal {

TcpContext::~TcpContext() {
  for (auto& c : conns_) {
    if (c && c->fd >= 0) ::close(c->fd);
  }
}

Status TcpContext::post_read(const RemoteRef& src, void* dst, size_t len, uint64_t wr_id) {
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

Status TcpContext::post_write(const RemoteRef& dst, const void* src, size_t len, uint64_t wr_id,
                              bool delivery_complete) {
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

Status TcpContext::post_compare_swap(const RemoteRef& dst, uint64_t expected, uint64_t desired,
                                     uint64_t* old_value, uint64_t wr_id) {
  return PostAtomic(w::Opcode::kCompareSwap, OpType::kCompareSwap, dst, expected, desired,
                    old_value, wr_id);
}

Status TcpContext::post_fetch_add(const RemoteRef& dst, uint64_t add, uint64_t* old_value,
                                  uint64_t wr_id) {
  return PostAtomic(w::Opcode::kFetchAdd, OpType::kFetchAdd, dst, add, 0, old_value, wr_id);
}

Status TcpContext::post_rpc(PeerId peer, uint32_t imm, std::span<const std::byte> request,
                            std::span<std::byte> reply, uint64_t wr_id) {
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

size_t TcpContext::poll(std::span<Completion> out) {
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

void TcpContext::wait(Clock::time_point deadline) {
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

Status TcpContext::PostAtomic(w::Opcode wop, OpType type, const RemoteRef& dst, uint64_t a,
                              uint64_t b, uint64_t* old_value, uint64_t wr_id) {
  if (old_value == nullptr) return Status::InvalidArgument("old_value pointer is null");
  FARMEM_ASSIGN_OR_RETURN(Conn * c, ConnFor(dst.peer));
  const uint64_t seq = NewOp(type, c, wr_id, nullptr, 8, old_value, true);
  if (c->fd < 0) return FailNew(seq, c);
  w::EncodeAtomic(c->sbuf, wop, seq, dst.key, dst.offset, a, b);
  Queued(c);
  return Status::OK();
}

std::string TcpContext::PeerText(const Conn* c) const {
  return fmt::format("peer {} ({})", c->peer, c->address);
}

Result<TcpContext::Conn*> TcpContext::ConnFor(PeerId peer) {
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

void TcpContext::Connect(Conn* c) {
  bool connected = false;
  Result<net::Fd> fd = net::StartConnect(c->addr.sa(), c->addr.len, &connected);
  if (!fd.ok()) {
    c->last_error = fd.status().WithContext(PeerText(c));
    return;
  }
  ++stats_.connects;
  c->fd = fd->release();
  c->state = connected ? ConnState::kConnected : ConnState::kConnecting;
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

uint64_t TcpContext::NewOp(OpType type, Conn* c, uint64_t wr_id, void* dst, size_t len,
                           uint64_t* old_value, bool awaits_response) {
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

Status TcpContext::FailNew(uint64_t seq, Conn* c) {
  Complete(static_cast<uint32_t>(seq), c->last_error.ok()
                                           ? Status::Unavailable("not connected to " + PeerText(c))
                                           : c->last_error);
  return Status::OK();
}

void TcpContext::Queued(Conn* c) {
  ++stats_.frames_posted;
  MarkDirty(c);
  if (c->sbuf.size() >= kEagerFlushBytes) Flush(c);
}

bool TcpContext::needs_progress() const {
  for (const Conn* c : dirty_) {
    if (c->dirty) return true;
  }
  return false;
}

void TcpContext::MarkDirty(Conn* c) {
  if (!c->dirty) {
    c->dirty = true;
    dirty_.push_back(c);
  }
}

TcpContext::Op* TcpContext::Find(uint64_t seq, PeerId peer) {
  const auto slot = static_cast<uint32_t>(seq);
  if (slot >= ops_.size()) return nullptr;
  Op& op = ops_[slot];
  if (!op.active || op.gen != static_cast<uint32_t>(seq >> 32) || op.peer != peer) return nullptr;
  return &op;
}

void TcpContext::Complete(uint32_t slot, Status status, uint32_t imm, uint32_t reply_len) {
  Op& op = ops_[slot];
  Completion& out = ready_.emplace_back();
  out.wr_id = op.wr_id;
  out.op = op.type;
  out.status = std::move(status);
  out.reply_imm = imm;
  out.reply_length = reply_len;
  if (op.awaits_response && op.peer < conns_.size() && conns_[op.peer]) --conns_[op.peer]->awaiting;
  op.active = false;
  op.dst = nullptr;
  op.old_value = nullptr;
  if (++op.gen == 0) op.gen = 1;  // seq 0 is reserved for connection-level frames
  free_.push_back(slot);
  --active_count_;
}

void TcpContext::Progress() {
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

void TcpContext::CheckConnect(Conn* c, Clock::time_point now) {
  pollfd p{c->fd, POLLOUT, 0};
  const int r = ::poll(&p, 1, 0);
  if (r > 0) {
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
    if (err != 0) {
      FailConn(c,
               Status::Unavailable(fmt::format("connect to {}: {}", PeerText(c), ErrnoText(err))));
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

void TcpContext::Flush(Conn* c) {
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

void TcpContext::Receive(Conn* c) {
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
    FailConn(c, Status::Unavailable(fmt::format("recv from {}: {}", PeerText(c), ErrnoText(err))));
    return;
  }
}

bool TcpContext::DecodeResponses(Conn* c) {
  static constexpr w::DecodeLimits kLimits{w::kMaxIoBytes, w::kMaxRpcBytes};
  for (;;) {
    w::FrameView f;
    const w::DecodeResult r = w::DecodeFrame(c->rbuf.readable(), kLimits, &f);
    if (r.state == w::DecodeState::kNeedMore) {
      c->rneed = r.needed;
      return true;
    }
    if (r.state == w::DecodeState::kError) {
      FailConn(c,
               Status::Protocol(fmt::format("malformed frame from {}: {}", PeerText(c), r.error)));
      return false;
    }
    if (!HandleResponse(c, f)) return false;
    c->rbuf.consume(f.frame_size);
  }
}

bool TcpContext::HandleResponse(Conn* c, const w::FrameView& f) {
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
        Complete(
            slot,
            Status::ResourceExhausted(fmt::format(
                "RPC reply of {} bytes exceeds the {} byte reply buffer", f.data.size(), op->len)),
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

void TcpContext::ExpireOps(Clock::time_point now) {
  Clock::time_point earliest = Clock::time_point::max();
  for (uint32_t slot = 0; slot < ops_.size(); ++slot) {
    Op& op = ops_[slot];
    if (!op.active) continue;
    if (op.deadline <= now) {
      const Conn* c = conns_[op.peer].get();
      Complete(slot, Status::TimedOut(fmt::format("{} to {} timed out after {} ms",
                                                  OpTypeName(op.type), PeerText(c), timeout_ms_)));
    } else {
      earliest = std::min(earliest, op.deadline);
    }
  }
  next_deadline_ = earliest;
}

void TcpContext::FailConn(Conn* c, const Status& status) {
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

void TcpContext::AbortAll() {
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

}  // namespace farmem::tcp::internal
