// Target side of the libfabric backend: the main endpoint's receive buffers, RPC requests and key
// lookups served from them, IncomingRpc replies (sent from any thread, queued per destination),
// and the progress thread's loop (Core::ProgressLoop, the only thread reading the main CQ).
#include <linux/futex.h>
#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/log.h"
#include "transport/fabric/fabric_internal.h"
#include "transport/fabric/fabric_util.h"

namespace farmem::fabric::internal {

class FabricIncomingRpc : public IncomingRpc {
 public:
  FabricIncomingRpc(std::shared_ptr<Core> core, fi_addr_t dest, uint64_t seq, uint32_t imm,
                    std::vector<std::byte> payload, std::string source)
      : core_(std::move(core)),
        dest_(dest),
        seq_(seq),
        imm_(imm),
        payload_(std::move(payload)),
        source_(std::move(source)) {}
  ~FabricIncomingRpc() override {
    if (!replied_) {
      (void)reply_error(Status::Aborted("RPC dropped by the handler without a reply"));
    }
  }
  uint32_t imm() const override { return imm_; }
  std::span<const std::byte> payload() const override { return payload_; }
  std::string_view source() const override { return source_; }
  Status reply(uint32_t imm, std::span<const std::byte> payload) override {
    if (replied_) return Status::InvalidArgument("RPC already answered");
    if (payload.size() > core_->config().max_rpc_bytes) {
      return Status::InvalidArgument("RPC reply of " + std::to_string(payload.size()) +
                                     " bytes exceeds max_rpc_bytes");
    }
    replied_ = true;
    return core_->SendMain(dest_, MsgType::kRpcReply, imm, seq_, 0, payload);
  }
  Status reply_error(const Status& status) override {
    if (replied_) return Status::InvalidArgument("RPC already answered");
    replied_ = true;
    const Code code = status.ok() ? Code::kInternal : status.code();
    std::string_view msg = status.ok() ? "reply_error called with OK" : status.message();
    if (msg.size() > 4096) msg = msg.substr(0, 4096);
    return core_->SendMain(dest_, MsgType::kRpcReply, 0, seq_, static_cast<uint32_t>(code),
                           std::as_bytes(std::span(msg.data(), msg.size())));
  }

 private:
  std::shared_ptr<Core> core_;
  fi_addr_t dest_;
  uint64_t seq_;
  uint32_t imm_;
  std::vector<std::byte> payload_;
  std::string source_;
  bool replied_ = false;
};

Status Core::PostMainRecv(RecvBuf* rb) {
  void* desc = rb->mr ? fi_mr_desc(rb->mr) : nullptr;
  const ssize_t r =
      fi_recv(ep_, rb->data.get(), rb->capacity, desc, FI_ADDR_UNSPEC, static_cast<FiCtx*>(rb));
  if (r == -FI_EAGAIN) {
    repost_.push_back(rb);
    return Status::OK();
  }
  if (r != 0) return FiStatus("fi_recv(main)", r);
  return Status::OK();
}

Status Core::StartServing() {
  for (size_t i = 0; i < kMainRecvBuffers; ++i) {
    auto rb = std::make_unique<RecvBuf>();
    rb->kind = Kind::kRecv;
    rb->capacity = recv_capacity();
    rb->data.reset(new std::byte[rb->capacity]);
    if (need_local_desc()) {
      FARMEM_ASSIGN_OR_RETURN(rb->mr, RegisterLocal(rb->data.get(), rb->capacity, ep_));
    }
    FARMEM_RETURN_IF_ERROR(PostMainRecv(rb.get()));
    recv_bufs_.push_back(std::move(rb));
  }
  return Status::OK();
}

SendBuf* Core::TakeSendBuf() {
  if (!send_free_.empty()) {
    SendBuf* sb = send_free_.back();
    send_free_.pop_back();
    return sb;
  }
  auto sb = std::make_unique<SendBuf>();
  sb->kind = Kind::kSend;
  send_all_.push_back(std::move(sb));
  return send_all_.back().get();
}

void Core::ReleaseSendBuf(SendBuf* sb) {
  if (sb->mr != nullptr) {
    CloseFid(&sb->mr->fid);
    sb->mr = nullptr;
  }
  // Keep small buffers for reuse; give large ones back so one big reply does not pin memory.
  if (sb->data.capacity() > (64u << 10)) std::vector<std::byte>().swap(sb->data);
  send_free_.push_back(sb);
}

Status Core::SendMain(fi_addr_t dest, MsgType type, uint32_t imm, uint64_t seq,
                      uint32_t status_code, std::span<const std::byte> payload) {
  std::lock_guard lock(send_mu_);
  if (main_closed_ || stopped()) return Status::Unavailable("fabric transport stopped");
  SendBuf* sb = TakeSendBuf();
  BuildMessage(sb->data, type, imm, seq, status_code, {}, payload);
  sb->dest = dest;
  if (need_local_desc()) {
    auto mr = RegisterLocal(sb->data.data(), sb->data.size(), ep_);
    if (!mr.ok()) {
      ReleaseSendBuf(sb);
      return mr.status();
    }
    sb->mr = *mr;
  }
  auto it = send_queues_.find(dest);
  if (it == send_queues_.end()) {
    const ssize_t r = fi_send(ep_, sb->data.data(), sb->data.size(),
                              sb->mr ? fi_mr_desc(sb->mr) : nullptr, dest, static_cast<FiCtx*>(sb));
    if (r == 0) return Status::OK();
    if (r != -FI_EAGAIN) {
      ReleaseSendBuf(sb);
      return FiStatus("fi_send(reply)", r);
    }
    const auto now = Clock::now();
    it = send_queues_.try_emplace(dest).first;
    it->second.blocked_since = now;
    it->second.next_try = now;
  }
  // The requester gives up after its op_timeout; a reply the provider has not taken by then
  // (peer gone) is useless, and dropping it stops ofi_rxm's reconnect attempts.
  sb->expires = Clock::now() + config_.op_timeout;
  it->second.bufs.push_back(sb);
  Wake();
  return Status::OK();
}

Clock::time_point Core::DrainSendQueues() {
  std::lock_guard lock(send_mu_);
  auto next = Clock::time_point::max();
  if (main_closed_) return next;
  const auto now = Clock::now();
  for (auto it = send_queues_.begin(); it != send_queues_.end();) {
    DestQueue& q = it->second;
    size_t expired = 0;
    while (!q.bufs.empty() && q.bufs.front()->expires <= now) {
      ReleaseSendBuf(q.bufs.front());
      q.bufs.pop_front();
      ++expired;
    }
    if (expired != 0) {
      FARMEM_LOG_WARN(
          "fabric: dropped {} message(s) to a requester the provider could not reach for {} ms",
          expired, config_.op_timeout.count());
    }
    if (!q.bufs.empty() && q.next_try <= now) {
      while (!q.bufs.empty()) {
        SendBuf* sb = q.bufs.front();
        const ssize_t r =
            fi_send(ep_, sb->data.data(), sb->data.size(), sb->mr ? fi_mr_desc(sb->mr) : nullptr,
                    sb->dest, static_cast<FiCtx*>(sb));
        if (r == -FI_EAGAIN) break;
        q.bufs.pop_front();
        q.blocked_since = now;
        if (r != 0) {
          FARMEM_LOG_WARN("fabric: dropping reply: {}", fi_strerror(static_cast<int>(-r)));
          ReleaseSendBuf(sb);
        }
      }
      if (!q.bufs.empty()) q.next_try = NextRetry(q.blocked_since, now);
    }
    if (q.bufs.empty()) {
      it = send_queues_.erase(it);
      continue;
    }
    next = std::min(next, q.next_try);
    ++it;
  }
  return next;
}

Result<fi_addr_t> Core::ResolveMainAddr(std::span<const std::byte> name) {
  std::string key(reinterpret_cast<const char*>(name.data()), name.size());
  auto it = main_addrs_.find(key);
  if (it != main_addrs_.end()) return it->second;
  const std::vector<std::byte> av_name = AvName(info_, name);
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  const int n = fi_av_insert(av_, av_name.data(), 1, &addr, 0, nullptr);
  if (n != 1) return FiStatus("fi_av_insert(requester)", n < 0 ? n : -FI_EINVAL);
  main_addrs_.emplace(std::move(key), addr);
  return addr;
}

void Core::HandleMainMessage(std::span<const std::byte> bytes) {
  auto parsed = ParseMessage(bytes, std::max<uint32_t>(config_.max_rpc_bytes, 4096));
  if (!parsed.ok()) {
    FARMEM_LOG_WARN("fabric: dropping malformed message: {}", parsed.status().ToString());
    return;
  }
  const ParsedMsg& m = *parsed;
  const auto type = static_cast<MsgType>(m.header.type);
  if (type != MsgType::kRpcRequest && type != MsgType::kLookupRequest) {
    FARMEM_LOG_WARN("fabric: unexpected message type {} on the main endpoint", m.header.type);
    return;
  }
  if (m.name.empty()) {
    FARMEM_LOG_WARN("fabric: request without a reply address dropped");
    return;
  }
  auto dest = ResolveMainAddr(m.name);
  if (!dest.ok()) {
    FARMEM_LOG_WARN("fabric: cannot reach requester: {}", dest.status().ToString());
    return;
  }
  if (type == MsgType::kLookupRequest) {
    LookupReply reply{};
    Status st;
    if (m.payload.size() != sizeof(LookupRequest)) {
      st = Status::Protocol("malformed key lookup");
    } else {
      LookupRequest req;
      std::memcpy(&req, m.payload.data(), sizeof(req));
      std::lock_guard lock(reg_mu_);
      auto it = regions_.find(req.key);
      if (it == regions_.end()) {
        st = Status::NotFound("region key not registered at the peer");
      } else {
        reply.key = req.key;
        reply.remote_base = plan_.virt_addr ? reinterpret_cast<uint64_t>(it->second.addr) : 0;
        reply.length = it->second.length;
        reply.prov_key = it->second.prov_key;
        reply.flags = it->second.access == Access::kReadOnly ? kLookupReadOnly : 0;
        if (table_ != nullptr) {
          reply.table_id = table_id_;
          reply.table_pid = getpid();
          reply.table_fd = table_fd_;
          reply.table_slot = it->second.slot;
        }
      }
    }
    Status sent;
    if (st.ok()) {
      sent = SendMain(*dest, MsgType::kLookupReply, 0, m.header.seq, 0,
                      std::as_bytes(std::span(&reply, 1)));
    } else {
      const std::string_view msg = st.message();
      sent =
          SendMain(*dest, MsgType::kLookupReply, 0, m.header.seq, static_cast<uint32_t>(st.code()),
                   std::as_bytes(std::span(msg.data(), msg.size())));
    }
    if (!sent.ok()) FARMEM_LOG_WARN("fabric: lookup reply failed: {}", sent.ToString());
    return;
  }
  auto rpc = std::make_unique<FabricIncomingRpc>(
      shared_from_this(), *dest, m.header.seq, m.header.imm,
      std::vector<std::byte>(m.payload.begin(), m.payload.end()), NameToSource(info_, m.name));
  if (!handler_) {
    (void)rpc->reply_error(Status::Unavailable("no RPC handler installed"));
    return;
  }
  if (m.payload.size() > config_.max_rpc_bytes) {
    (void)rpc->reply_error(Status::InvalidArgument("RPC request exceeds max_rpc_bytes"));
    return;
  }
  handler_(std::move(rpc));
}

void Core::HandleMainCompletion(FiCtx* ctx, size_t len, const Status& error) {
  if (ctx == nullptr) return;
  if (ctx->kind == Kind::kSend) {
    auto* sb = static_cast<SendBuf*>(ctx);
    if (!error.ok()) FARMEM_LOG_DEBUG("fabric: reply send failed: {}", error.ToString());
    std::lock_guard lock(send_mu_);
    ReleaseSendBuf(sb);
    return;
  }
  if (ctx->kind == Kind::kRecv) {
    auto* rb = static_cast<RecvBuf*>(ctx);
    if (error.ok()) {
      HandleMainMessage(std::span<const std::byte>(rb->data.get(), std::min(len, rb->capacity)));
    } else if (error.code() != Code::kAborted) {
      FARMEM_LOG_DEBUG("fabric: receive failed: {}", error.ToString());
    }
    if (!stopped()) {
      Status st = PostMainRecv(rb);
      if (!st.ok()) FARMEM_LOG_WARN("fabric: {}", st.ToString());
    }
  }
}

void Core::Wake() {
  if (table_ != nullptr) {
    RingDoorbell(DoorbellOf(table_));
  } else if (wait_cq_) {
    fi_cq_signal(cq_);
  } else {
    wake_cv_.notify_one();
  }
}

void Core::ProgressLoop(std::atomic<bool>& stop) {
  // Short sleeps must not be rounded up by the default 50 us timer slack.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  std::atomic<uint32_t>* db = table_ ? DoorbellOf(table_) : nullptr;
  uint32_t seen = db ? db[0].load(std::memory_order_acquire) : 0;
  fi_cq_msg_entry entries[kCqBatch];
  auto last_busy = Clock::now();
  const auto spin = config_.spin_before_sleep;
  bool armed = false;  // doorbell "asleep" flag published; one more pass before sleeping
  bool block = false;  // next CQ read may block (CQ with a wait object)
  while (!stop.load(std::memory_order_acquire)) {
    const ssize_t n = block ? fi_cq_sread(cq_, entries, kCqBatch, nullptr, kIdleWaitMs)
                            : fi_cq_read(cq_, entries, kCqBatch);
    block = false;
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        HandleMainCompletion(static_cast<FiCtx*>(entries[i].op_context), entries[i].len,
                             Status::OK());
      }
      last_busy = Clock::now();
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) > 0) {
        char buf[256] = {};
        const char* text = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof(buf));
        HandleMainCompletion(static_cast<FiCtx*>(err.op_context), 0,
                             Status(CodeForFiError(err.err), std::string(fi_strerror(err.err)) +
                                                                 " (" + (text ? text : "") + ")"));
      }
      last_busy = Clock::now();
      continue;
    }
    if (n != -FI_EAGAIN && n != -FI_ETIMEDOUT) {
      FARMEM_LOG_WARN("fabric: fi_cq_read: {}", fi_strerror(int(-n)));
    }
    bool queued;
    {
      std::lock_guard lock(send_mu_);
      queued = !send_queues_.empty();
    }
    // Stay awake only while a queued send is due soon; a backed-off destination (peer gone)
    // is retried when it is due (the idle sleep below ends by then).
    auto next_send = Clock::time_point::max();
    if (queued) {
      next_send = DrainSendQueues();
      queued = next_send <= Clock::now() + kSendRetrySpin;
    }
    if (!repost_.empty()) {
      std::vector<RecvBuf*> again;
      again.swap(repost_);
      for (RecvBuf* rb : again) (void)PostMainRecv(rb);
    }
    // A ring seen here may be for work posted after this pass's CQ read: progress once more
    // before sleeping, whatever the spin setting. (Sleeping on the new counter value right away
    // lost that wake-up: with spin_before_sleep 0 and idle_wait_forever the operation hung.)
    bool rang = false;
    if (db != nullptr) {
      const uint32_t now_seen = db[0].load(std::memory_order_seq_cst);
      if (now_seen != seen) {  // a peer posted work for us: stay awake
        seen = now_seen;
        last_busy = Clock::now();
        rang = true;
      }
    }
    if (queued || rang || Clock::now() - last_busy < spin) {
      if (armed) {
        db[1].store(0, std::memory_order_relaxed);
        armed = false;
      }
      // On an oversubscribed machine the initiator may share our core: let it run.
      sched_yield();
      continue;
    }
    if (db != nullptr) {
      if (!armed) {
        db[1].store(1, std::memory_order_seq_cst);
        armed = true;
        continue;  // progress once more, then re-read the counter, then sleep
      }
      // Every operation of a peer that needs us rings the doorbell (AfterPost, AfterRefusal), so
      // the timeout only bounds our own retries: queued sends when due, receive buffers to
      // repost soon, anything else at kShmIdleWait.
      auto sleep = std::chrono::duration_cast<std::chrono::nanoseconds>(
          repost_.empty() ? kShmIdleWait : std::chrono::milliseconds(kIdleWaitMs));
      if (next_send != Clock::time_point::max()) {
        sleep = std::clamp(
            std::chrono::duration_cast<std::chrono::nanoseconds>(next_send - Clock::now()),
            std::chrono::nanoseconds(kSendRetrySpin), sleep);
      }
      timespec ts{static_cast<time_t>(sleep.count() / 1000000000),
                  static_cast<long>(sleep.count() % 1000000000)};
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&db[0]), FUTEX_WAIT, seen,
              options_.idle_wait_forever ? nullptr : &ts, nullptr, 0);
      db[1].store(0, std::memory_order_relaxed);
      armed = false;
    } else if (wait_cq_) {
      block = true;  // fi_cq_sread waits on the provider's fds and progresses on wake-up
    } else {
      std::unique_lock lock(wake_mu_);
      wake_cv_.wait_for(lock, kIdleSleep);
    }
  }
  if (armed) db[1].store(0, std::memory_order_relaxed);
}

}  // namespace farmem::fabric::internal
