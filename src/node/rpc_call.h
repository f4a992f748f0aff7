// The one way a client makes a request/reply RPC (encode, post, await, check the reply's size,
// decode, give errors context) and the one blocking wrapper synchronous callers share. Every
// client (RawClient, ObjectClient, the designs to come) uses these instead of its own copy.
// CallRpc & co. run on the caller's Scheduler thread; BlockingRunner is thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "common/wire_struct.h"
#include "farmem/coro.h"
#include "farmem/node.h"
#include "farmem/status.h"

// co_return a non-OK Status from an expression (a coroutine cannot use FARMEM_RETURN_IF_ERROR).
#define FARMEM_CO_RETURN_IF_ERROR(expr) \
  do {                                  \
    ::farmem::Status _st = (expr);      \
    if (!_st.ok()) co_return _st;       \
  } while (0)

namespace farmem {

// Sends `request` as RPC `opcode` to `peer` and awaits the reply in `reply` (whose size bounds
// it). Returns the reply's bytes (a prefix of `reply`). Errors carry `what` as context
// ("ALLOC_RAW 4096: TimedOut: ...").
Task<Result<std::span<const std::byte>>> CallRpc(Scheduler& sched, PeerId peer, uint16_t opcode,
                                                 std::span<const std::byte> request,
                                                 std::span<std::byte> reply, std::string what);

// A request struct and a reply struct of fixed sizes (common/wire_struct.h); a reply of any
// other size is a Protocol error. `Request` may be std::span<const std::byte> for a raw body.
// The request is taken by value: a Task starts suspended, so a reference to a temporary would
// dangle by the time it runs (ASan caught exactly that). Spans here and in CallRpc/CallWithTail
// are views: their bytes must outlive the awaited task.
template <typename Reply, typename Request>
Task<Result<Reply>> CallStruct(Scheduler& sched, PeerId peer, uint16_t opcode, Request request,
                               std::string what) {
  static_assert(std::is_trivially_copyable_v<Reply>);
  std::byte buf[sizeof(Reply)];
  std::span<const std::byte> body;
  std::vector<std::byte> encoded;
  if constexpr (std::is_same_v<Request, std::span<const std::byte>>) {
    body = request;
  } else {
    encoded = EncodeStruct(request);
    body = encoded;
  }
  Result<std::span<const std::byte>> r = co_await CallRpc(sched, peer, opcode, body, buf, what);
  if (!r.ok()) co_return r.status();
  std::optional<Reply> reply = DecodeStruct<Reply>(*r);
  if (!reply) {
    co_return Status::Protocol(what + ": reply has " + std::to_string(r->size()) +
                               " bytes, expected " + std::to_string(sizeof(Reply)));
  }
  co_return *reply;
}

// A reply made of a fixed-size head and a variable tail (OBJ_READ: pointer, then payload). The
// tail points into `reply`, which must hold at least sizeof(Head).
template <typename Head>
struct HeadAndTail {
  Head head;
  std::span<const std::byte> tail;
};
template <typename Head>
Task<Result<HeadAndTail<Head>>> CallWithTail(Scheduler& sched, PeerId peer, uint16_t opcode,
                                             std::span<const std::byte> request,
                                             std::span<std::byte> reply, std::string what) {
  static_assert(std::is_trivially_copyable_v<Head>);
  Result<std::span<const std::byte>> r =
      co_await CallRpc(sched, peer, opcode, request, reply, what);
  if (!r.ok()) co_return r.status();
  if (r->size() < sizeof(Head)) {
    co_return Status::Protocol(what + ": reply has " + std::to_string(r->size()) +
                               " bytes, less than its " + std::to_string(sizeof(Head)) +
                               "-byte head");
  }
  HeadAndTail<Head> out;
  std::memcpy(&out.head, r->data(), sizeof(Head));
  out.tail = r->subspan(sizeof(Head));
  co_return out;
}

// Synchronous callers of a coroutine API: one scheduler of `node`, made on first use, shared
// under a mutex (one call at a time). `make(sched)` returns a Task<Result<T>> or Task<Status>.
class BlockingRunner {
 public:
  explicit BlockingRunner(Node& node, std::string owner) : node_(node), owner_(std::move(owner)) {}

  template <typename Fn>
  auto run(Fn&& make) {
    using R = decltype(std::declval<Scheduler&>().block_on(make(std::declval<Scheduler&>())));
    std::lock_guard lock(mu_);
    if (!sched_) {
      auto made = node_.make_scheduler();
      if (!made.ok()) return R(made.status().WithContext(owner_ + " scheduler"));
      sched_ = std::move(*made);
    }
    return sched_->block_on(make(*sched_));
  }

 private:
  Node& node_;
  const std::string owner_;
  std::mutex mu_;  // one blocking call at a time on sched_
  std::unique_ptr<Scheduler> sched_;
};

}  // namespace farmem
