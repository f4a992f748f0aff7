// Tests of the RPC dispatcher with in-memory IncomingRpc fakes: opcode routing, error and exception
// replies, queue-full rejection, what happens to queued RPCs at Stop(), and inline handlers
// (run on the submitting thread; none runs after Stop()). No transport needed.
// End-to-end RPCs over a real transport are in node_test.cc.
#include "node/rpc_dispatcher.h"

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/testing/watchdog.h"

namespace farmem::node {
namespace {

using farmem::testing::ScopedWatchdog;
using namespace std::chrono_literals;

// Where a fake RPC's answer lands; waited on with a deadline.
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int answers = 0;
  Status error;  // OK for a normal reply
  uint32_t imm = 0;
  std::string payload;

  bool Wait(std::chrono::milliseconds limit) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return done; });
  }
};

class FakeRpc : public IncomingRpc {
 public:
  FakeRpc(uint32_t imm, std::string payload, std::shared_ptr<Outcome> out)
      : imm_(imm), payload_(std::move(payload)), out_(std::move(out)) {}
  ~FakeRpc() override {
    if (!answered_) (void)reply_error(Status::Aborted("dropped unanswered"));
  }
  uint32_t imm() const override { return imm_; }
  std::span<const std::byte> payload() const override {
    return {reinterpret_cast<const std::byte*>(payload_.data()), payload_.size()};
  }
  std::string_view source() const override { return "fake"; }
  Status reply(uint32_t imm, std::span<const std::byte> payload) override {
    return Finish(Status::OK(), imm,
                  std::string(reinterpret_cast<const char*>(payload.data()), payload.size()));
  }
  Status reply_error(const Status& status) override { return Finish(status, 0, ""); }

 private:
  Status Finish(const Status& err, uint32_t imm, std::string payload) {
    answered_ = true;
    std::lock_guard lock(out_->mu);
    out_->answers++;
    if (!out_->done) {
      out_->error = err;
      out_->imm = imm;
      out_->payload = std::move(payload);
      out_->done = true;
    }
    out_->cv.notify_all();
    return Status::OK();
  }

  uint32_t imm_;
  std::string payload_;
  std::shared_ptr<Outcome> out_;
  bool answered_ = false;
};

std::shared_ptr<Outcome> Call(RpcDispatcher& d, uint32_t imm, std::string payload) {
  auto out = std::make_shared<Outcome>();
  d.Submit(std::make_unique<FakeRpc>(imm, std::move(payload), out));
  return out;
}

Status Echo(const RpcCall& call, std::vector<std::byte>& reply) {
  reply.assign(call.request.begin(), call.request.end());
  return Status::OK();
}

TEST(RpcDispatcher, RoutesByLowSixteenBitsAndEchoes) {
  ScopedWatchdog wd("RoutesByLowSixteenBitsAndEchoes", 30s);
  RpcDispatcher d(16, 1 << 20);
  ASSERT_TRUE(d.Register(64, Echo).ok());
  ASSERT_TRUE(d.Start(2).ok());
  auto out = Call(d, 0xabcd0000u | 64u, "hello");  // high bits belong to the caller's framing
  ASSERT_TRUE(out->Wait(5s));
  EXPECT_TRUE(out->error.ok()) << out->error.ToString();
  EXPECT_EQ(out->payload, "hello");
  EXPECT_EQ(out->imm, 64u);
  EXPECT_EQ(out->answers, 1);
}

TEST(RpcDispatcher, ReplyVectorIsClearedBetweenCalls) {
  ScopedWatchdog wd("ReplyVectorIsClearedBetweenCalls", 30s);
  RpcDispatcher d(16, 1 << 20);
  ASSERT_TRUE(d.Register(70, [](const RpcCall&, std::vector<std::byte>& reply) {
                 EXPECT_TRUE(reply.empty());
                 reply.push_back(std::byte{'z'});
                 return Status::OK();
               }).ok());
  ASSERT_TRUE(d.Start(1).ok());
  for (int i = 0; i < 3; ++i) {
    auto out = Call(d, 70, "");
    ASSERT_TRUE(out->Wait(5s));
    EXPECT_EQ(out->payload, "z");
  }
}

TEST(RpcDispatcher, UnknownOpcodeErrorAndException) {
  ScopedWatchdog wd("UnknownOpcodeErrorAndException", 30s);
  RpcDispatcher d(16, 1 << 20);
  ASSERT_TRUE(d.Register(65, [](const RpcCall&, std::vector<std::byte>&) {
                 return Status::OutOfRange("index 7 past end");
               }).ok());
  ASSERT_TRUE(d.Register(66, [](const RpcCall&, std::vector<std::byte>&) -> Status {
                 throw std::runtime_error("kaboom");
               }).ok());
  ASSERT_TRUE(
      d.Register(67, [](const RpcCall&, std::vector<std::byte>&) -> Status { throw 5; }).ok());
  ASSERT_TRUE(d.Start(1).ok());

  auto unknown = Call(d, 99, "");
  ASSERT_TRUE(unknown->Wait(5s));
  EXPECT_EQ(unknown->error.code(), Code::kNotFound);
  EXPECT_EQ(unknown->error.message(), "no handler for opcode 99");

  auto err = Call(d, 65, "");
  ASSERT_TRUE(err->Wait(5s));
  EXPECT_EQ(err->error.code(), Code::kOutOfRange);
  EXPECT_EQ(err->error.message(), "index 7 past end");

  auto thrown = Call(d, 66, "");
  ASSERT_TRUE(thrown->Wait(5s));
  EXPECT_EQ(thrown->error.code(), Code::kInternal);
  EXPECT_NE(thrown->error.message().find("kaboom"), std::string_view::npos);

  auto odd = Call(d, 67, "");
  ASSERT_TRUE(odd->Wait(5s));
  EXPECT_EQ(odd->error.code(), Code::kInternal);

  auto st = d.stats();
  EXPECT_EQ(st.unknown_opcode, 1u);
  EXPECT_EQ(st.handler_errors, 1u);
  EXPECT_EQ(st.exceptions, 2u);
}

TEST(RpcDispatcher, OversizedReplyIsResourceExhausted) {
  ScopedWatchdog wd("OversizedReplyIsResourceExhausted", 30s);
  RpcDispatcher d(16, 8);
  ASSERT_TRUE(d.Register(64, Echo).ok());
  ASSERT_TRUE(d.Start(1).ok());
  auto out = Call(d, 64, "more than eight bytes");
  ASSERT_TRUE(out->Wait(5s));
  EXPECT_EQ(out->error.code(), Code::kResourceExhausted);
}

// Blocks the single worker inside a handler until released, so the queue can be filled.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool entered = false;
  bool open = false;
};

TEST(RpcDispatcher, QueueFullIsRejectedAndStopFailsQueued) {
  ScopedWatchdog wd("QueueFullIsRejectedAndStopFailsQueued", 30s);
  auto gate = std::make_shared<Gate>();
  RpcDispatcher d(2, 1 << 20);
  ASSERT_TRUE(d.Register(64, [gate](const RpcCall&, std::vector<std::byte>& reply) {
                 std::unique_lock lock(gate->mu);
                 gate->entered = true;
                 gate->cv.notify_all();
                 gate->cv.wait_for(lock, 10s, [&] { return gate->open; });
                 reply.push_back(std::byte{1});
                 return Status::OK();
               }).ok());
  ASSERT_TRUE(d.Start(1).ok());
  auto running = Call(d, 64, "");
  {
    std::unique_lock lock(gate->mu);
    ASSERT_TRUE(gate->cv.wait_for(lock, 5s, [&] { return gate->entered; }));
  }
  auto q1 = Call(d, 64, "");
  auto q2 = Call(d, 64, "");
  auto full = Call(d, 64, "");
  ASSERT_TRUE(full->Wait(5s));
  EXPECT_EQ(full->error.code(), Code::kResourceExhausted);
  EXPECT_EQ(d.stats().queue_full, 1u);

  // Stop lets the running handler finish and answer normally; queued RPCs fail. The gate opens
  // once Stop() has begun: a probe RPC is refused as "queue full" until then and as Unavailable
  // from the moment Stop() marks the dispatcher stopping (opening earlier would let the worker
  // run q1).
  std::thread opener([gate, &d] {
    const auto limit = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < limit) {
      auto probe = Call(d, 64, "");
      if (!probe->Wait(5s) || probe->error.code() == Code::kUnavailable) break;
      std::this_thread::yield();
    }
    std::lock_guard lock(gate->mu);
    gate->open = true;
    gate->cv.notify_all();
  });
  d.Stop();
  opener.join();
  ASSERT_TRUE(running->Wait(5s));
  EXPECT_TRUE(running->error.ok()) << running->error.ToString();
  ASSERT_TRUE(q1->Wait(5s));
  ASSERT_TRUE(q2->Wait(5s));
  EXPECT_EQ(q1->error.code(), Code::kUnavailable);
  EXPECT_EQ(q2->error.code(), Code::kUnavailable);

  auto late = Call(d, 64, "");
  ASSERT_TRUE(late->Wait(5s));
  EXPECT_EQ(late->error.code(), Code::kUnavailable);
  d.Stop();  // idempotent
}

TEST(RpcDispatcher, RegistrationRules) {
  RpcDispatcher d(4, 1 << 20);
  EXPECT_EQ(d.Register(64, nullptr).code(), Code::kInvalidArgument);
  EXPECT_TRUE(d.Register(64, Echo).ok());
  EXPECT_EQ(d.Register(64, Echo).code(), Code::kInvalidArgument);
  EXPECT_EQ(d.Start(0).code(), Code::kInvalidArgument);
  ASSERT_TRUE(d.Start(1).ok());
  EXPECT_EQ(d.Register(65, Echo).code(), Code::kInvalidArgument);
}

TEST(RpcDispatcher, SubmitBeforeStartIsUnavailable) {
  ScopedWatchdog wd("SubmitBeforeStartIsUnavailable", 30s);
  RpcDispatcher d(4, 1 << 20);
  auto out = Call(d, 64, "");
  ASSERT_TRUE(out->Wait(5s));
  EXPECT_EQ(out->error.code(), Code::kUnavailable);
}

TEST(RpcDispatcher, InlineHandlerRunsOnTheSubmittingThread) {
  ScopedWatchdog wd("InlineHandlerRunsOnTheSubmittingThread", 30s);
  RpcDispatcher d(4, 16);
  std::atomic<std::thread::id> ran_on{};
  ASSERT_TRUE(d.Register(
                   64,
                   [&](const RpcCall& call, std::vector<std::byte>& reply) {
                     ran_on = std::this_thread::get_id();
                     return Echo(call, reply);
                   },
                   RpcExecution::kInline)
                  .ok());
  ASSERT_TRUE(d.Register(
                   65, [](const RpcCall&, std::vector<std::byte>&) -> Status { throw 5; },
                   RpcExecution::kInline)
                  .ok());
  ASSERT_TRUE(d.Register(66, Echo).ok());  // a worker handler next to inline ones
  ASSERT_TRUE(d.Start(1).ok());

  // Inline: answered before Submit returns, on this thread.
  auto out = Call(d, 64, "abc");
  ASSERT_TRUE(out->done);
  EXPECT_TRUE(out->error.ok()) << out->error.ToString();
  EXPECT_EQ(out->payload, "abc");
  EXPECT_EQ(ran_on.load(), std::this_thread::get_id());
  // The same checks as on a worker: exceptions and oversized replies become errors.
  auto threw = Call(d, 65, "");
  ASSERT_TRUE(threw->done);
  EXPECT_EQ(threw->error.code(), Code::kInternal);
  auto big = Call(d, 64, std::string(17, 'x'));
  ASSERT_TRUE(big->done);
  EXPECT_EQ(big->error.code(), Code::kResourceExhausted);
  // Worker handlers still go through the queue.
  auto queued = Call(d, 66, "w");
  ASSERT_TRUE(queued->Wait(5s));
  EXPECT_EQ(queued->payload, "w");

  // The worker counts an RPC as served just after answering it: wait (bounded) for the count.
  const auto limit = std::chrono::steady_clock::now() + 5s;
  while (d.stats().served < 4 && std::chrono::steady_clock::now() < limit) {
    std::this_thread::yield();
  }
  const auto stats = d.stats();
  EXPECT_EQ(stats.served, 4u);
  EXPECT_EQ(stats.inline_served, 3u);
  EXPECT_EQ(stats.exceptions, 1u);

  d.Stop();
  auto late = Call(d, 64, "");
  ASSERT_TRUE(late->Wait(5s));
  EXPECT_EQ(late->error.code(), Code::kUnavailable);
}

// Stop() must wait for inline handlers already running on other threads, and none may start
// after Stop() returns: submitters race Stop and every handler checks it runs while "alive".
TEST(RpcDispatcher, StopWaitsForInlineHandlersAndNoneRunsAfter) {
  ScopedWatchdog wd("StopWaitsForInlineHandlersAndNoneRunsAfter", 60s);
  for (int round = 0; round < 20; ++round) {
    RpcDispatcher d(64, 1 << 20);
    std::atomic<bool> alive{true};
    std::atomic<int> after_stop{0}, ran{0};
    ASSERT_TRUE(d.Register(
                     64,
                     [&](const RpcCall&, std::vector<std::byte>& reply) {
                       if (!alive.load()) after_stop++;
                       ran++;
                       std::this_thread::sleep_for(std::chrono::microseconds(50));
                       if (!alive.load()) after_stop++;
                       reply.push_back(std::byte{1});
                       return Status::OK();
                     },
                     RpcExecution::kInline)
                    .ok());
    ASSERT_TRUE(d.Start(1).ok());
    std::atomic<bool> go{true};
    std::atomic<int> answered{0}, unavailable{0};
    std::vector<std::thread> submitters;
    for (int t = 0; t < 3; ++t) {
      submitters.emplace_back([&] {
        while (go.load()) {
          auto out = Call(d, 64, "");
          ASSERT_TRUE(out->Wait(5s));
          if (out->error.ok()) {
            answered++;
          } else {
            EXPECT_EQ(out->error.code(), Code::kUnavailable) << out->error.ToString();
            unavailable++;
          }
        }
      });
    }
    // Stop while handlers run: wait (bounded) until some have, not a fixed time that a loaded
    // machine may spend without scheduling the submitters at all.
    auto wait_for = [](const std::atomic<int>& n, int at_least) {
      const auto limit = std::chrono::steady_clock::now() + 10s;
      while (n.load() < at_least && std::chrono::steady_clock::now() < limit) {
        std::this_thread::yield();
      }
    };
    wait_for(ran, 1 + round % 5);
    d.Stop();
    alive = false;             // what the owner of the handler's state would now destroy
    wait_for(unavailable, 3);  // the submitters saw the stop
    go = false;
    for (auto& t : submitters) t.join();
    EXPECT_EQ(after_stop.load(), 0) << "an inline handler ran after Stop() returned";
    EXPECT_GT(ran.load(), 0);
    EXPECT_EQ(answered.load(), ran.load());
    EXPECT_GT(unavailable.load(), 0);
  }
}

// Stress for the worker wake-up protocol (rpc_dispatcher.h). Each submitter runs a closed loop
// (submit, wait for the answer, submit again) against its own dispatcher with two workers, so
// every submit lands just as a worker finished the previous RPC and is going idle: the window
// where a lost wake-up happens. Nothing else submits to that dispatcher, so a lost wake-up
// strands the RPC for good and its answer never comes (hang guard: 10 s per RPC). Three such
// pairs run at once. Every RPC must be answered exactly once, with OK.
TEST(RpcDispatcher, ClosedLoopSubmitsNeverLoseAWakeup) {
  ScopedWatchdog watchdog("ClosedLoopSubmitsNeverLoseAWakeup", 120s);
  constexpr int kPairs = 3, kIters = 3000;
  std::atomic<int> answered{0}, bad{0}, stranded{0};
  std::vector<std::thread> pairs;
  for (int t = 0; t < kPairs; ++t) {
    pairs.emplace_back([&] {
      RpcDispatcher d(64, 1 << 20);
      if (!d.Register(9, [](const RpcCall&, std::vector<std::byte>&) { return Status::OK(); })
               .ok() ||
          !d.Start(2).ok()) {
        bad.fetch_add(1);
        return;
      }
      for (int i = 0; i < kIters; ++i) {
        auto out = std::make_shared<Outcome>();
        d.Submit(std::make_unique<FakeRpc>(9, "x", out));
        if (!out->Wait(10000ms)) {
          stranded.fetch_add(1);
          break;
        }
        answered.fetch_add(1);
        std::lock_guard lock(out->mu);
        if (!out->error.ok() || out->answers != 1) bad.fetch_add(1);
      }
      d.Stop();
    });
  }
  for (auto& th : pairs) th.join();
  EXPECT_EQ(stranded.load(), 0) << "an RPC stayed queued with every worker asleep";
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(answered.load(), kPairs * kIters);
}

}  // namespace
}  // namespace farmem::node

namespace farmem::node {
namespace {

// A deferring handler returns at once; the answer comes from another thread, after Handle()
// returned, and reaches that RPC's caller; the handler's return value is not the answer.
TEST(RpcDispatcher, DeferredAnswerComesFromAnotherThreadAfterTheHandlerReturned) {
  ScopedWatchdog wd("DeferredAnswerComesFromAnotherThreadAfterTheHandlerReturned", 30s);
  RpcDispatcher d(16, 64);
  std::mutex mu;
  std::vector<DeferredReply> parked;
  ASSERT_TRUE(d.Register(80, [&](const RpcCall& call, std::vector<std::byte>& reply) {
                 DeferredReply h = call.defer();
                 EXPECT_TRUE(h.valid());
                 EXPECT_FALSE(call.defer().valid()) << "a call deferred twice";
                 std::lock_guard lock(mu);
                 parked.push_back(std::move(h));
                 reply.push_back(std::byte{'x'});  // ignored: the handle answers
                 return Status::Internal("ignored after defer()");
               }).ok());
  ASSERT_TRUE(d.Start(1).ok());
  auto a = Call(d, 80, "first");
  auto b = Call(d, 80, "second");
  auto c = Call(d, 80, std::string(8, 'y'));
  for (;;) {  // both handlers ran and returned; nothing answered yet
    {
      std::lock_guard lock(mu);
      if (parked.size() == 3) break;
    }
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_FALSE(a->Wait(0ms));
  EXPECT_FALSE(b->Wait(0ms));
  std::thread replier([&] {
    std::lock_guard lock(mu);
    // Reverse order: each answer is tied to its own RPC, not to arrival order.
    const std::string r(parked[1].request().size(), 'B');
    EXPECT_TRUE(parked[1]
                    .send(Status::OK(), {reinterpret_cast<const std::byte*>(r.data()), r.size()})
                    .ok());
    EXPECT_TRUE(parked[0].send(Status::NotFound("key 7")).ok());
    EXPECT_EQ(parked[0].send(Status::OK()).code(), Code::kFailedPrecondition);
    const std::string big(65, 'z');  // over the dispatcher's 64-byte reply limit
    EXPECT_TRUE(
        parked[2]
            .send(Status::OK(), {reinterpret_cast<const std::byte*>(big.data()), big.size()})
            .ok());
  });
  replier.join();
  ASSERT_TRUE(a->Wait(5s));
  ASSERT_TRUE(b->Wait(5s));
  ASSERT_TRUE(c->Wait(5s));
  EXPECT_EQ(a->error.code(), Code::kNotFound);
  EXPECT_EQ(a->answers, 1);
  EXPECT_TRUE(b->error.ok()) << b->error.ToString();
  EXPECT_EQ(b->payload, "BBBBBB");
  EXPECT_EQ(b->imm, 80u);
  EXPECT_EQ(c->error.code(), Code::kResourceExhausted) << c->error.ToString();
  const RpcDispatcher::Stats s = d.stats();
  EXPECT_EQ(s.deferred, 3u);
  EXPECT_EQ(s.handler_errors, 0u) << "a deferred handler's return value was counted";
}

// A handle dropped unsent answers its caller (Aborted) instead of leaving it to time out.
TEST(RpcDispatcher, DroppedDeferredHandleAnswersAborted) {
  ScopedWatchdog wd("DroppedDeferredHandleAnswersAborted", 30s);
  RpcDispatcher d(16, 1 << 20);
  ASSERT_TRUE(d.Register(81, [](const RpcCall& call, std::vector<std::byte>&) {
                 DeferredReply h = call.defer();
                 return Status::OK();  // h goes out of scope unsent
               }).ok());
  ASSERT_TRUE(d.Start(1).ok());
  auto out = Call(d, 81, "");
  ASSERT_TRUE(out->Wait(5s));
  EXPECT_EQ(out->error.code(), Code::kAborted) << out->error.ToString();
  EXPECT_EQ(out->answers, 1);
  DeferredReply none;
  EXPECT_EQ(none.send(Status::OK()).code(), Code::kFailedPrecondition);
}

}  // namespace
}  // namespace farmem::node
