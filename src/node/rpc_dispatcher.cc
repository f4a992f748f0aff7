// RPC worker pool of a Node (see rpc_dispatcher.h). The progress thread only locks a mutex to
// enqueue (and makes a futex wake only when a worker sleeps); handlers run on workers, which take
// queued RPCs in batches and reuse one reply vector. Inline handlers run on the progress thread
// without touching the mutex.
#include "node/rpc_dispatcher.h"

#include <exception>
#include <string>
#include <thread>

#include "common/log.h"

namespace farmem::node {

RpcDispatcher::RpcDispatcher(size_t queue_capacity, uint32_t max_reply_bytes)
    : capacity_(queue_capacity), max_reply_bytes_(max_reply_bytes) {}

RpcDispatcher::~RpcDispatcher() {
  Stop();
}

Status RpcDispatcher::Register(uint16_t opcode, RpcFunction fn, RpcExecution execution) {
  if (!fn) return Status::InvalidArgument("empty RPC handler for opcode " + std::to_string(opcode));
  std::lock_guard lock(mu_);
  if (started_ || stopping_) {
    return Status::InvalidArgument("RPC handlers must be registered before the node starts");
  }
  if (!handlers_.emplace(opcode, Handler{std::move(fn), execution}).second) {
    return Status::InvalidArgument("opcode " + std::to_string(opcode) + " already registered");
  }
  if (execution == RpcExecution::kInline) any_inline_ = true;
  return Status::OK();
}

Status RpcDispatcher::Start(int workers) {
  if (workers < 1) return Status::InvalidArgument("rpc_workers must be at least 1");
  std::lock_guard lock(mu_);
  if (stopping_) return Status::Unavailable("RPC dispatcher stopped");
  if (started_) return Status::OK();
  started_ = true;
  frozen_.store(true, std::memory_order_release);
  serving_.store(true);
  workers_.reserve(static_cast<size_t>(workers));
  for (int i = 0; i < workers; ++i) {
    try {
      workers_.emplace_back([this] { WorkerLoop(); });
    } catch (const std::system_error& e) {
      // Workers already running keep serving; Stop() joins them.
      return Status::ResourceExhausted(std::string("cannot start RPC worker: ") + e.what());
    }
  }
  return Status::OK();
}

void RpcDispatcher::Submit(std::unique_ptr<IncomingRpc> rpc) {
  if (!rpc) return;
  if (TryInline(rpc)) return;
  Status reject;
  {
    std::lock_guard lock(mu_);
    if (!started_ || stopping_) {
      reject = Status::Unavailable("node is not serving RPCs (stopped or not started)");
    } else if (queue_.size() >= capacity_) {
      queue_full_++;
      reject = Status::ResourceExhausted("RPC queue full (" + std::to_string(capacity_) +
                                         " waiting); retry later");
    } else {
      queue_.push_back(std::move(rpc));
    }
  }
  if (!reject.ok()) {
    Status s = rpc->reply_error(reject);
    if (!s.ok()) FARMEM_LOG_DEBUG("rpc: could not send rejection: {}", s.ToString());
    return;
  }
  wake_seq_.fetch_add(1);
  if (sleepers_.load() > 0) wake_seq_.notify_one();
}

bool RpcDispatcher::TryInline(std::unique_ptr<IncomingRpc>& rpc) {
  if (!frozen_.load(std::memory_order_acquire) || !any_inline_) return false;
  const auto opcode = static_cast<uint16_t>(rpc->imm() & 0xffffu);
  auto it = handlers_.find(opcode);
  if (it == handlers_.end() || it->second.execution != RpcExecution::kInline) return false;
  inline_running_.fetch_add(1);
  if (!serving_.load()) {
    // Stopping (or start failed): the queued path answers with the right error.
    inline_running_.fetch_sub(1);
    return false;
  }
  // One reply buffer per progress thread, reused like a worker's.
  thread_local std::vector<std::byte> reply;
  Handle(rpc, reply);
  inline_served_++;
  rpc.reset();
  inline_running_.fetch_sub(1);
  return true;
}

void RpcDispatcher::Stop() {
  std::lock_guard stop_lock(stop_mu_);
  std::deque<std::unique_ptr<IncomingRpc>> left;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    serving_.store(false);
    left.swap(queue_);
  }
  wake_seq_.fetch_add(1);
  wake_seq_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  workers_.clear();
  // Inline handlers that saw serving_ set are finishing on the progress thread.
  while (inline_running_.load() != 0) std::this_thread::yield();
  for (auto& rpc : left) {
    Status s = rpc->reply_error(Status::Unavailable("node stopping"));
    if (!s.ok()) FARMEM_LOG_DEBUG("rpc: could not fail queued RPC: {}", s.ToString());
  }
}

RpcDispatcher::Stats RpcDispatcher::stats() const {
  Stats s;
  s.served = served_.load();
  s.queue_full = queue_full_.load();
  s.unknown_opcode = unknown_opcode_.load();
  s.handler_errors = handler_errors_.load();
  s.exceptions = exceptions_.load();
  s.inline_served = inline_served_.load();
  s.deferred = deferred_.load();
  return s;
}

void RpcDispatcher::WorkerLoop() {
  // At most this many RPCs per lock round trip, so one worker does not hoard a burst that idle
  // workers could share.
  constexpr size_t kBatch = 16;
  std::vector<std::byte> reply;
  std::vector<std::unique_ptr<IncomingRpc>> batch;
  batch.reserve(kBatch);
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) return;  // queued RPCs are failed by Stop()
      while (!queue_.empty() && batch.size() < kBatch) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    if (!batch.empty()) {
      for (auto& rpc : batch) {
        Handle(rpc, reply);
        rpc.reset();
      }
      batch.clear();
      continue;
    }
    // Idle: announce, look again, then block (see the protocol in rpc_dispatcher.h).
    sleepers_.fetch_add(1);
    const uint32_t seen = wake_seq_.load();
    bool idle;
    {
      std::lock_guard lock(mu_);
      idle = queue_.empty() && !stopping_;
    }
    if (idle) wake_seq_.wait(seen);
    sleepers_.fetch_sub(1);
  }
}

void RpcDispatcher::Handle(std::unique_ptr<IncomingRpc>& owned, std::vector<std::byte>& reply) {
  IncomingRpc& rpc = *owned;
  const uint16_t opcode = static_cast<uint16_t>(rpc.imm() & 0xffffu);
  auto it = handlers_.find(opcode);
  Status st;
  if (it == handlers_.end()) {
    unknown_opcode_++;
    st = Status::NotFound("no handler for opcode " + std::to_string(opcode));
  } else {
    reply.clear();
    RpcCall call;
    call.opcode = opcode;
    call.request = rpc.payload();
    call.source = rpc.source();
    call.deferrable = &owned;
    call.max_reply_bytes = max_reply_bytes_;
    try {
      st = it->second.fn(call, reply);
      if (!st.ok() && owned) handler_errors_++;
    } catch (const std::exception& e) {
      exceptions_++;
      st = Status::Internal("RPC handler for opcode " + std::to_string(opcode) +
                            " threw: " + e.what());
    } catch (...) {
      exceptions_++;
      st = Status::Internal("RPC handler for opcode " + std::to_string(opcode) +
                            " threw a non-standard exception");
    }
    if (!owned) {
      // Deferred: the handle owns the answer (and the RPC). Whatever the handler returned after
      // deferring is not the caller's answer.
      deferred_++;
      if (!st.ok()) {
        FARMEM_LOG_DEBUG("rpc: opcode {} deferred, then returned {} (ignored)", opcode,
                         st.ToString());
      }
      return;
    }
    if (!st.ok() && st.code() == Code::kInternal) {
      FARMEM_LOG_WARN("rpc: opcode {} from {}: {}", opcode, rpc.source(), st.ToString());
    }
    if (st.ok() && reply.size() > max_reply_bytes_) {
      st = Status::ResourceExhausted("reply of " + std::to_string(reply.size()) +
                                     " bytes exceeds max_rpc_bytes " +
                                     std::to_string(max_reply_bytes_));
    }
  }
  // Counted before the reply goes out, so a caller that has its answer also sees it counted.
  served_++;
  Status sent = st.ok() ? rpc.reply(RpcImm(opcode), reply) : rpc.reply_error(st);
  if (!sent.ok()) {
    FARMEM_LOG_DEBUG("rpc: answer to opcode {} from {} not sent: {}", opcode, rpc.source(),
                     sent.ToString());
  }
  // A handler that once produced a huge reply should not pin that memory forever.
  if (reply.capacity() > (1u << 20) && reply.size() < (1u << 16)) {
    reply.clear();
    reply.shrink_to_fit();
  }
}

}  // namespace farmem::node

namespace farmem {

DeferredReply RpcCall::defer() const {
  DeferredReply d;
  if (deferrable == nullptr || !*deferrable) return d;
  d.rpc_ = std::move(*deferrable);
  d.opcode_ = opcode;
  d.max_reply_bytes_ = max_reply_bytes;
  return d;
}

DeferredReply::DeferredReply(DeferredReply&&) noexcept = default;
DeferredReply& DeferredReply::operator=(DeferredReply&& other) noexcept {
  if (this != &other) {
    // An unsent handle being overwritten is dropped: its caller gets Aborted (IncomingRpc's rule).
    rpc_ = std::move(other.rpc_);
    opcode_ = other.opcode_;
    max_reply_bytes_ = other.max_reply_bytes_;
  }
  return *this;
}
// An unsent IncomingRpc answers Aborted when destroyed (transport.h).
DeferredReply::~DeferredReply() = default;

std::span<const std::byte> DeferredReply::request() const {
  return rpc_ ? rpc_->payload() : std::span<const std::byte>();
}

Status DeferredReply::send(const Status& status, std::span<const std::byte> payload) {
  if (!rpc_) return Status::FailedPrecondition("deferred RPC reply already sent or not deferred");
  std::unique_ptr<IncomingRpc> rpc = std::move(rpc_);
  if (status.ok() && max_reply_bytes_ != 0 && payload.size() > max_reply_bytes_) {
    return rpc->reply_error(Status::ResourceExhausted("reply of " + std::to_string(payload.size()) +
                                                      " bytes exceeds max_rpc_bytes " +
                                                      std::to_string(max_reply_bytes_)));
  }
  return status.ok() ? rpc->reply(RpcImm(opcode_), payload) : rpc->reply_error(status);
}

}  // namespace farmem
