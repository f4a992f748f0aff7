// Deferred RPC replies (RpcCall::defer, DeferredReply) over a real transport (tcp, fabric:shm):
// answers sent later from another thread reach the right callers; an answer to a caller that
// timed out or whose connection closed is dropped safely; a handler that never answers is bounded
// by the caller's timeout. Test thread plus one replier thread; the handler runs on RPC workers.
#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "farmem/node.h"
#include "node/node_test_util.h"
#include "transport/testing/watchdog.h"

namespace farmem {
namespace {

using farmem::node::testing::MakeConfig;
using farmem::node::testing::StartNode;
using farmem::testing::ScopedWatchdog;
using namespace std::chrono_literals;

constexpr uint16_t kOpPark = kFirstUserOpcode;         // defers and parks the handle
constexpr uint16_t kOpEchoNow = kFirstUserOpcode + 1;  // answers at once

std::span<const std::byte> StrBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}
std::string Str(std::span<const std::byte> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

class DeferredReplies : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    watchdog_ = std::make_unique<ScopedWatchdog>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), 60s);
    NodeConfig sc = MakeConfig(GetParam(), "server");
    sc.rpc_workers = 1;  // parked calls must not hold the only worker
    auto server = Node::Create(sc);
    if (!server.ok()) {
      if (server.status().code() == Code::kUnavailable) GTEST_SKIP() << server.status().ToString();
      FAIL() << server.status().ToString();
    }
    server_ = std::move(*server);
    ASSERT_TRUE(server_
                    ->register_rpc(kOpPark,
                                   [this](const RpcCall& call, std::vector<std::byte>&) {
                                     DeferredReply h = call.defer();
                                     if (!h.valid()) return Status::Internal("cannot defer");
                                     std::lock_guard lock(mu_);
                                     parked_.push_back(std::move(h));
                                     return Status::OK();
                                   })
                    .ok());
    ASSERT_TRUE(server_
                    ->register_rpc(kOpEchoNow,
                                   [](const RpcCall& call, std::vector<std::byte>& reply) {
                                     reply.assign(call.request.begin(), call.request.end());
                                     return Status::OK();
                                   })
                    .ok());
    ASSERT_TRUE(server_->start().ok());
  }

  void TearDown() override {
    {
      std::lock_guard lock(mu_);
      parked_.clear();  // before the node: handles must not outlive their transport
    }
    for (auto& c : clients_) c->stop();
    if (server_) server_->stop();
  }

  // A client node whose operations time out after `timeout`, connected to the server.
  Node* Client(std::chrono::milliseconds timeout, PeerId* peer) {
    NodeConfig cc = MakeConfig(GetParam(), "client" + std::to_string(clients_.size()));
    cc.transport.op_timeout = timeout;
    std::string skip;
    auto c = StartNode(cc, &skip);
    EXPECT_NE(c, nullptr) << skip;
    if (c == nullptr) return nullptr;
    auto p = c->connect(server_->bootstrap_address());
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    *peer = p.ok() ? p->id : kInvalidPeer;
    clients_.push_back(std::move(c));
    return clients_.back().get();
  }

  size_t Parked() {
    std::lock_guard lock(mu_);
    return parked_.size();
  }
  // Waits (generously) until `n` calls are parked.
  bool WaitParked(size_t n) {
    for (int i = 0; i < 20000 && Parked() < n; ++i) std::this_thread::sleep_for(1ms);
    return Parked() >= n;
  }
  DeferredReply Take(size_t i) {
    std::lock_guard lock(mu_);
    return std::move(parked_.at(i));
  }

  std::unique_ptr<ScopedWatchdog> watchdog_;
  std::unique_ptr<Node> server_;
  std::vector<std::unique_ptr<Node>> clients_;
  std::mutex mu_;
  std::vector<DeferredReply> parked_;
};

struct CallResult {
  Status status;
  std::string reply;
  bool done = false;
};

Task<void> CallOne(Scheduler& sched, PeerId peer, uint16_t op, std::string request,
                   CallResult* out) {
  std::vector<std::byte> buf(4096);
  Result<RpcReply> r = co_await sched.rpc(peer, RpcImm(op), StrBytes(request), buf);
  out->status = r.ok() ? Status::OK() : r.status();
  if (r.ok()) out->reply = Str({buf.data(), r->length});
  out->done = true;
}

CallResult Call(Scheduler& sched, PeerId peer, uint16_t op, std::string request) {
  CallResult out;
  sched.block_on(CallOne(sched, peer, op, std::move(request), &out));
  return out;
}

// The transport took the late answer or said the connection is gone; nothing else.
void ExpectDropped(const Status& sent) {
  EXPECT_TRUE(sent.ok() || sent.code() == Code::kUnavailable) << sent.ToString();
}

TEST_P(DeferredReplies, AnswersFromAnotherThreadReachTheirOwnCallers) {
  PeerId peer = kInvalidPeer;
  Node* client = Client(10s, &peer);
  ASSERT_NE(client, nullptr);
  auto sched = client->make_scheduler();
  ASSERT_TRUE(sched.ok());
  Scheduler& s = **sched;
  constexpr int kCalls = 8;
  std::vector<CallResult> results(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    s.spawn(CallOne(s, peer, kOpPark, "call-" + std::to_string(i), &results[i]));
  }
  CallResult echo;
  bool all_parked = false;
  std::thread replier([&] {
    all_parked = WaitParked(kCalls);
    if (!all_parked) return;
    // All eight parked, none answered: the server's one worker still answers other calls.
    auto sched2 = client->make_scheduler();  // this thread's own context
    if (sched2.ok()) echo = Call(**sched2, peer, kOpEchoNow, "quick");
    // Answer in reverse order of arrival, each with its own request's bytes.
    for (int i = kCalls - 1; i >= 0; --i) {
      DeferredReply h = Take(static_cast<size_t>(i));
      const std::string r = "re:" + Str(h.request());
      EXPECT_TRUE(h.send(Status::OK(), StrBytes(r)).ok());
    }
  });
  EXPECT_TRUE(s.run(30s).ok());
  replier.join();
  ASSERT_TRUE(all_parked);
  EXPECT_TRUE(echo.status.ok()) << echo.status.ToString();
  EXPECT_EQ(echo.reply, "quick");
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(results[i].done);
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.ToString();
    EXPECT_EQ(results[i].reply, "re:call-" + std::to_string(i));
  }
}

TEST_P(DeferredReplies, AnswerAfterTheCallerTimedOutIsDroppedAndTheConnectionStaysRight) {
  PeerId peer = kInvalidPeer;
  Node* client = Client(300ms, &peer);
  ASSERT_NE(client, nullptr);
  auto sched = client->make_scheduler();
  ASSERT_TRUE(sched.ok());
  const CallResult late = Call(**sched, peer, kOpPark, "late");
  // Never answered while the caller waited: bounded by its op_timeout.
  EXPECT_EQ(late.status.code(), Code::kTimedOut) << late.status.ToString();
  ASSERT_TRUE(WaitParked(1));
  DeferredReply h = Take(0);
  ExpectDropped(h.send(Status::OK(), StrBytes("too late")));
  EXPECT_FALSE(h.valid());
  // The stale answer is not taken for a later call's on the same connection.
  for (int i = 0; i < 3; ++i) {
    const CallResult echo = Call(**sched, peer, kOpEchoNow, "fresh" + std::to_string(i));
    EXPECT_TRUE(echo.status.ok()) << echo.status.ToString();
    EXPECT_EQ(echo.reply, "fresh" + std::to_string(i));
  }
}

TEST_P(DeferredReplies, AnswerAfterTheConnectionClosedIsDroppedAndTheServerServesOn) {
  PeerId peer = kInvalidPeer;
  Node* client = Client(1s, &peer);
  ASSERT_NE(client, nullptr);
  {
    auto sched = client->make_scheduler();
    ASSERT_TRUE(sched.ok());
    const CallResult parked = Call(**sched, peer, kOpPark, "orphan");
    EXPECT_EQ(parked.status.code(), Code::kTimedOut) << parked.status.ToString();
    ASSERT_TRUE(WaitParked(1));
  }
  client->stop();  // its connections close with the call unanswered
  // Let the server see the close before it answers (the answer is dropped either way).
  std::this_thread::sleep_for(100ms);
  DeferredReply h = Take(0);
  ExpectDropped(h.send(Status::OK(), StrBytes("nobody listens")));
  // The server serves a new client.
  PeerId peer2 = kInvalidPeer;
  Node* other = Client(10s, &peer2);
  ASSERT_NE(other, nullptr);
  auto sched = other->make_scheduler();
  ASSERT_TRUE(sched.ok());
  const CallResult echo = Call(**sched, peer2, kOpEchoNow, "still here");
  EXPECT_TRUE(echo.status.ok()) << echo.status.ToString();
  EXPECT_EQ(echo.reply, "still here");
}

TEST_P(DeferredReplies, DroppedHandleAnswersAbortedAtOnce) {
  PeerId peer = kInvalidPeer;
  Node* client = Client(30s, &peer);
  ASSERT_NE(client, nullptr);
  auto sched = client->make_scheduler();
  ASSERT_TRUE(sched.ok());
  std::thread dropper([&] {
    if (WaitParked(1)) DeferredReply gone = Take(0);  // destroyed unsent
  });
  const CallResult r = Call(**sched, peer, kOpPark, "dropped");
  dropper.join();
  EXPECT_EQ(r.status.code(), Code::kAborted) << r.status.ToString();
}

INSTANTIATE_TEST_SUITE_P(Backends, DeferredReplies, ::testing::Values("tcp", "fabric:shm"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "tcp" ? "tcp" : "fabric_shm";
                         });

}  // namespace
}  // namespace farmem
