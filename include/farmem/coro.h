// A small C++20 coroutine scheduler over one transport Context (Storm's user-level threads).
// User code reads like blocking calls (`co_await sched.read(...)`) while many operations are in
// flight on one thread, and `co_await sched.sleep_for(d)` waits without stalling the others.
// Single-threaded: a Scheduler and its tasks belong to the thread running it.
#pragma once

#include <algorithm>
#include <chrono>
#include <coroutine>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "farmem/status.h"
#include "farmem/transport.h"

namespace farmem {

template <typename T = void>
class Task;

namespace detail {

struct PromiseBase {
  std::coroutine_handle<> continuation;  // who awaits us (resumed when we finish)
  std::exception_ptr exception;

  std::suspend_always initial_suspend() noexcept { return {}; }
  struct FinalAwaiter {
    bool await_ready() noexcept { return false; }
    template <typename P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      auto c = h.promise().continuation;
      return c ? c : std::noop_coroutine();
    }
    void await_resume() noexcept {}
  };
  FinalAwaiter final_suspend() noexcept { return {}; }
  void unhandled_exception() { exception = std::current_exception(); }
};

template <typename T>
struct Promise : PromiseBase {
  std::optional<T> value;
  Task<T> get_return_object();
  template <typename U>
  void return_value(U&& v) {
    value.emplace(std::forward<U>(v));
  }
};

template <>
struct Promise<void> : PromiseBase {
  Task<void> get_return_object();
  void return_void() {}
};

}  // namespace detail

// A lazily started coroutine returning T. Awaiting it runs it; it is destroyed with the Task.
template <typename T>
class [[nodiscard]] Task {
 public:
  using promise_type = detail::Promise<T>;
  using Handle = std::coroutine_handle<promise_type>;

  Task() = default;
  explicit Task(Handle h) : h_(h) {}
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;
  ~Task() {
    if (h_) h_.destroy();
  }

  bool done() const { return !h_ || h_.done(); }
  Handle handle() const { return h_; }

  bool await_ready() const noexcept { return !h_ || h_.done(); }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> awaiting) noexcept {
    h_.promise().continuation = awaiting;
    return h_;
  }
  T await_resume() {
    if (h_.promise().exception) std::rethrow_exception(h_.promise().exception);
    if constexpr (!std::is_void_v<T>) return std::move(*h_.promise().value);
  }

 private:
  Handle h_;
};

namespace detail {
template <typename T>
Task<T> Promise<T>::get_return_object() {
  return Task<T>(std::coroutine_handle<Promise<T>>::from_promise(*this));
}
inline Task<void> Promise<void>::get_return_object() {
  return Task<void>(std::coroutine_handle<Promise<void>>::from_promise(*this));
}
}  // namespace detail

// What an RPC returns to the caller: the reply's immediate data and length (bytes are in the
// caller's reply buffer).
struct RpcReply {
  uint32_t imm = 0;
  uint32_t length = 0;
};

class Scheduler {
 public:
  explicit Scheduler(std::unique_ptr<Context> context) : ctx_(std::move(context)) {}
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  Context& context() { return *ctx_; }

  // An operation posted to the context; co_await yields its Completion. The coroutine is resumed
  // by run()/block_on() when poll() returns the completion.
  class OpAwaiter {
   public:
    template <typename PostFn>
    OpAwaiter(Scheduler* s, PostFn&& post) : sched_(s) {
      post_status_ = post(reinterpret_cast<uint64_t>(this));
    }
    bool await_ready() const noexcept { return !post_status_.ok(); }
    void await_suspend(std::coroutine_handle<> h) noexcept {
      waiter_ = h;
      ++sched_->waiting_;
    }
    Completion await_resume() {
      if (!post_status_.ok()) {
        Completion c;
        c.status = post_status_;
        return c;
      }
      return std::move(completion_);
    }

   private:
    friend class Scheduler;
    Scheduler* sched_;
    Status post_status_;
    Completion completion_;
    std::coroutine_handle<> waiter_;
  };

  // Awaitable wrappers returning Status / Result. Buffers must outlive the co_await.
  Task<Status> read(RemoteRef src, void* dst, size_t len) {
    Completion c =
        co_await OpAwaiter(this, [&](uint64_t id) { return ctx_->post_read(src, dst, len, id); });
    co_return c.status;
  }
  Task<Status> write(RemoteRef dst, const void* src, size_t len, bool delivery_complete = false) {
    Completion c = co_await OpAwaiter(
        this, [&](uint64_t id) { return ctx_->post_write(dst, src, len, id, delivery_complete); });
    co_return c.status;
  }
  Task<Result<uint64_t>> compare_swap(RemoteRef dst, uint64_t expected, uint64_t desired) {
    uint64_t old = 0;
    Completion c = co_await OpAwaiter(this, [&](uint64_t id) {
      return ctx_->post_compare_swap(dst, expected, desired, &old, id);
    });
    if (!c.status.ok()) co_return c.status;
    co_return old;
  }
  Task<Result<uint64_t>> fetch_add(RemoteRef dst, uint64_t add) {
    uint64_t old = 0;
    Completion c = co_await OpAwaiter(
        this, [&](uint64_t id) { return ctx_->post_fetch_add(dst, add, &old, id); });
    if (!c.status.ok()) co_return c.status;
    co_return old;
  }
  Task<Result<RpcReply>> rpc(PeerId peer, uint32_t imm, std::span<const std::byte> request,
                             std::span<std::byte> reply) {
    Completion c = co_await OpAwaiter(
        this, [&](uint64_t id) { return ctx_->post_rpc(peer, imm, request, reply, id); });
    if (!c.status.ok()) co_return c.status;
    co_return RpcReply{c.reply_imm, c.reply_length};
  }

  // Reads the segments of one region in order (every byte of one before any of the next): a
  // seqlock's version, the data, the version again. In one copy, without suspending, where the
  // context can (Context::read_ordered_now: shm), else one awaited read after another. Every
  // kOrderedReadsPerYield-th read done in place still yields once, so a coroutine that only reads
  // cannot keep its siblings' completions waiting.
  Task<Status> read_ordered(PeerId peer, RegionKey key, std::span<const ReadSegment> segments) {
    if (std::optional<Status> done = ctx_->read_ordered_now(peer, key, segments)) {
      if (++ordered_reads_in_place_ % kOrderedReadsPerYield == 0) co_await yield();
      co_return *done;
    }
    for (const ReadSegment& seg : segments) {
      Status st = co_await read(RemoteRef{peer, key, seg.offset}, seg.dst, seg.len);
      if (!st.ok()) co_return st;
    }
    co_return Status::OK();
  }
  static constexpr uint64_t kOrderedReadsPerYield = 8;

  // Suspends the calling coroutine until its scheduler's next poll_once (after the completions
  // and sleepers already due there); other coroutines run meanwhile.
  class YieldAwaiter {
   public:
    explicit YieldAwaiter(Scheduler* s) : sched_(s) {}
    bool await_ready() const noexcept { return false; }
    void await_suspend(std::coroutine_handle<> h) {
      sched_->timers_.push(Timer{std::chrono::steady_clock::now(), sched_->timer_seq_++, h});
    }
    void await_resume() const noexcept {}

   private:
    Scheduler* sched_;
  };
  YieldAwaiter yield() { return YieldAwaiter(this); }

  // Suspends the calling coroutine until `until` (checked on every poll_once, so the wake-up is as
  // late as the thread's next poll); other coroutines of this scheduler keep running meanwhile.
  class SleepAwaiter {
   public:
    SleepAwaiter(Scheduler* s, std::chrono::steady_clock::time_point until)
        : sched_(s), until_(until) {}
    bool await_ready() const noexcept { return std::chrono::steady_clock::now() >= until_; }
    void await_suspend(std::coroutine_handle<> h) {
      sched_->timers_.push(Timer{until_, sched_->timer_seq_++, h});
    }
    void await_resume() const noexcept {}

   private:
    Scheduler* sched_;
    std::chrono::steady_clock::time_point until_;
  };
  SleepAwaiter sleep_until(std::chrono::steady_clock::time_point until) {
    return SleepAwaiter(this, until);
  }
  template <typename Rep, typename Period>
  SleepAwaiter sleep_for(std::chrono::duration<Rep, Period> d) {
    return SleepAwaiter(this,
                        std::chrono::steady_clock::now() +
                            std::chrono::duration_cast<std::chrono::steady_clock::duration>(d));
  }

  // Start `task` now; the scheduler owns it until it finishes. Exceptions escaping a spawned task
  // terminate the program (tasks report failures through Status).
  void spawn(Task<void> task) {
    auto h = task.handle();
    tasks_.push_back(std::move(task));
    h.resume();
    reap();
  }

  // Drive the context until every spawned task has finished or `timeout` passes (each operation
  // also has the transport's own timeout, so this only guards against a task that never ends).
  // Between completions the thread spins for idle_spin(), then blocks in Context::wait() until a
  // completion may be there or the next sleeper is due (see IdleWait).
  Status run(std::chrono::milliseconds timeout = std::chrono::hours(24)) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    IdleWait idle(this);
    while (!tasks_.empty()) {
      if (poll_once()) {
        idle.Reset();
        continue;
      }
      if (std::chrono::steady_clock::now() > deadline)
        return Status::TimedOut("scheduler: tasks still running at deadline");
      idle.Wait(deadline);
    }
    return Status::OK();
  }

  // Run `task` (and anything spawned) until `task` finishes; returns its value.
  template <typename T>
  T block_on(Task<T> task) {
    bool finished = false;
    std::optional<std::conditional_t<std::is_void_v<T>, int, T>> out;
    auto wrapper = [](Task<T> t, bool* fin, decltype(out)* o) -> Task<void> {
      if constexpr (std::is_void_v<T>) {
        co_await t;
        o->emplace(0);
      } else {
        o->emplace(co_await t);
      }
      *fin = true;
    };
    spawn(wrapper(std::move(task), &finished, &out));
    IdleWait idle(this);
    while (!finished) {
      if (poll_once()) {
        idle.Reset();
      } else {
        idle.Wait(std::chrono::steady_clock::now() + kIdleMaxBlock);
      }
    }
    if constexpr (!std::is_void_v<T>) return std::move(*out);
  }

  // How long run()/block_on() keep polling an idle context before they block in
  // Context::wait(). The default, 0, still polls twice in a row before blocking. With more busy
  // threads than cores (the 2-CPU machine: 8 clients, the server's NIC thread) any longer spin
  // takes the core from the thread that would produce the completion: measured there in
  // back-to-back runs (objects-throughput, uniform), a 20 us spin gave 96 k/s (1 client) and
  // 203 k/s (8 clients) one-sided reads against 222 k/s and 363 k/s without. With spare cores
  // a spin of a few microseconds saves the wake-up (~5-10 us) of a blocked thread.
  void set_idle_spin(std::chrono::microseconds spin) { idle_spin_ = spin; }
  std::chrono::microseconds idle_spin() const { return idle_spin_; }
  static constexpr std::chrono::microseconds kDefaultIdleSpin{0};

  // Poll completions once and resume their coroutines, then resume the sleepers whose time has
  // come. Returns true if anything happened.
  bool poll_once() {
    Completion batch[32];
    size_t n = ctx_->poll(std::span<Completion>(batch, 32));
    for (size_t i = 0; i < n; ++i) {
      auto* aw = reinterpret_cast<OpAwaiter*>(batch[i].wr_id);
      aw->completion_ = std::move(batch[i]);
      --waiting_;
      aw->waiter_.resume();
    }
    if (!timers_.empty()) {
      const auto now = std::chrono::steady_clock::now();
      // Only timers due now: a sleeper resumed here that sleeps again waits for a later poll.
      std::vector<std::coroutine_handle<>> due;
      while (!timers_.empty() && timers_.top().until <= now) {
        due.push_back(timers_.top().waiter);
        timers_.pop();
      }
      for (auto h : due) h.resume();
      n += due.size();
    }
    if (n) reap();
    return n > 0;
  }

  size_t live_tasks() const { return tasks_.size(); }
  size_t sleeping() const { return timers_.size(); }

 private:
  // What run() and block_on() do between empty polls: keep polling for idle_spin_ (a completion
  // usually arrives within microseconds), then block in Context::wait() until the transport has
  // something (socket readiness on native TCP), the next sleeper is due or `limit`, whichever is
  // first. No fixed-interval sleeps: a blocked thread costs no CPU and wakes when its reply
  // lands.
  class IdleWait {
   public:
    explicit IdleWait(Scheduler* s) : s_(s) {}
    void Reset() { idle_ = false; }
    void Wait(std::chrono::steady_clock::time_point limit) {
      const auto now = std::chrono::steady_clock::now();
      if (!idle_) {
        idle_ = true;
        idle_since_ = now;
        return;
      }
      if (now - idle_since_ < s_->idle_spin_) return;
      auto until = limit;
      if (!s_->timers_.empty() && s_->timers_.top().until < until) until = s_->timers_.top().until;
      s_->ctx_->wait(until);
    }

   private:
    Scheduler* s_;
    bool idle_ = false;
    std::chrono::steady_clock::time_point idle_since_{};
  };
  // block_on has no deadline of its own; wait() returns at least this often anyway.
  static constexpr std::chrono::milliseconds kIdleMaxBlock{100};

  void reap() {
    for (auto it = tasks_.begin(); it != tasks_.end();) {
      if (it->done()) {
        if (it->handle().promise().exception) std::terminate();
        it = tasks_.erase(it);
      } else {
        ++it;
      }
    }
  }

  struct Timer {
    std::chrono::steady_clock::time_point until;
    uint64_t seq;  // FIFO among equal deadlines
    std::coroutine_handle<> waiter;
    bool operator>(const Timer& o) const {
      return until != o.until ? until > o.until : seq > o.seq;
    }
  };

  std::unique_ptr<Context> ctx_;
  std::chrono::microseconds idle_spin_ = kDefaultIdleSpin;
  std::deque<Task<void>> tasks_;
  size_t waiting_ = 0;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  uint64_t ordered_reads_in_place_ = 0;  // read_ordered calls the context did in place
  uint64_t timer_seq_ = 0;
};

}  // namespace farmem
