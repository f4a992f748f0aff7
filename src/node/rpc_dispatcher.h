// RPC dispatch of a Node: the transport's progress thread hands each arriving RPC to Submit()
// (never blocks), a bounded queue buffers it, and worker threads take it in batches, run the
// registered handler and answer; handlers registered RpcExecution::kInline run in Submit()
// itself. A handler may instead defer its answer (RpcCall::defer(): the DeferredReply handle takes
// the IncomingRpc, which transports let be answered from any thread, later). A worker only sleeps
// (futex on wake_seq_) when the queue is empty, and Submit() only wakes one when one sleeps. The
// handler table is frozen at Start(), so workers and Submit() read it without locking.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "farmem/node.h"
#include "farmem/status.h"
#include "farmem/transport.h"

namespace farmem::node {

class RpcDispatcher {
 public:
  struct Stats {
    uint64_t served = 0;      // handler ran and its reply (or error) was handed to the transport
    uint64_t queue_full = 0;  // rejected with ResourceExhausted
    uint64_t unknown_opcode = 0;  // rejected with NotFound
    uint64_t handler_errors = 0;  // handler returned a non-OK status
    uint64_t exceptions = 0;      // handler threw (answered with Internal)
    uint64_t inline_served = 0;   // of `served`, run on the progress thread (kInline)
    uint64_t deferred = 0;        // handler called RpcCall::defer(): answered later by its handle
  };

  // `queue_capacity` RPCs may wait for a worker; `max_reply_bytes` is the transport's limit.
  RpcDispatcher(size_t queue_capacity, uint32_t max_reply_bytes);
  ~RpcDispatcher();
  RpcDispatcher(const RpcDispatcher&) = delete;
  RpcDispatcher& operator=(const RpcDispatcher&) = delete;

  // Only before Start(); replaces nothing (a second registration of an opcode is an error).
  Status Register(uint16_t opcode, RpcFunction fn, RpcExecution execution = RpcExecution::kWorker);
  Status Start(int workers);
  // Runs an inline handler right here; otherwise never blocks: queues the RPC, or answers at once
  // with an error when the queue is full or dispatch is stopped.
  void Submit(std::unique_ptr<IncomingRpc> rpc);
  // Lets running handlers finish (inline ones too), joins the workers and fails still-queued
  // RPCs with Unavailable; afterwards no handler runs. Idempotent.
  void Stop();

  Stats stats() const;

 private:
  struct Handler {
    RpcFunction fn;
    RpcExecution execution = RpcExecution::kWorker;
  };

  void WorkerLoop();
  // Runs an inline handler on the calling thread; false when it is not one (or not serving).
  bool TryInline(std::unique_ptr<IncomingRpc>& rpc);
  // Runs the handler; answers unless the handler deferred (then `rpc` is empty on return).
  void Handle(std::unique_ptr<IncomingRpc>& rpc, std::vector<std::byte>& reply);

  const size_t capacity_;
  const uint32_t max_reply_bytes_;
  std::unordered_map<uint16_t, Handler> handlers_;  // frozen once frozen_ is set
  bool any_inline_ = false;                         // frozen with handlers_

  // Inline calls race with Stop() without taking mu_ (Dekker-style, seq_cst): Submit counts
  // itself in inline_running_, then reads serving_; Stop clears serving_, then waits for
  // inline_running_ to drain. So after Stop() no inline handler runs.
  std::atomic<bool> frozen_{false};   // handlers_ final (set by Start, never cleared)
  std::atomic<bool> serving_{false};  // started and not stopping
  std::atomic<int> inline_running_{0};

  // Worker wake-up without a condition variable hand-off per RPC. A worker that finds the queue
  // empty counts itself in sleepers_, reads wake_seq_, checks the queue again under mu_, and only
  // then blocks in wake_seq_.wait(seen). Submit() pushes under mu_, bumps wake_seq_, and calls
  // notify_one() only if sleepers_ > 0 (seq_cst both sides, Dekker-style): either Submit sees the
  // sleeper and wakes it (or its wait sees wake_seq_ changed), or the worker's second check sees
  // the RPC. Stress test: RpcDispatcher.ClosedLoopSubmitsNeverLoseAWakeup.
  std::atomic<uint32_t> wake_seq_{0};
  std::atomic<int> sleepers_{0};

  std::mutex mu_;
  std::deque<std::unique_ptr<IncomingRpc>> queue_;
  bool started_ = false;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
  std::mutex stop_mu_;  // serializes Stop() callers

  std::atomic<uint64_t> served_{0}, queue_full_{0}, unknown_opcode_{0}, handler_errors_{0},
      exceptions_{0}, inline_served_{0}, deferred_{0};
};

}  // namespace farmem::node
