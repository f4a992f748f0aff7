// Tests of the typed RPC helpers: fixed-size request/reply structs, replies of the wrong size
// (Protocol, with context), head + tail replies, remote errors with context, and BlockingRunner
// shared by several threads.
#include "node/rpc_call.h"

#include <gtest/gtest.h>

#include <thread>

#include "node/node_test_util.h"

namespace farmem {
namespace {

constexpr uint16_t kOpAddOne = kFirstUserOpcode + 10;        // u64 -> u64 + 1
constexpr uint16_t kOpShort = kFirstUserOpcode + 11;         // anything -> 3 bytes
constexpr uint16_t kOpHeadTail = kFirstUserOpcode + 12;      // u32 n -> u64 head + n bytes
constexpr uint16_t kOpFailNotFound = kFirstUserOpcode + 13;  // -> NotFound

struct Pair {
  uint64_t a;
  uint64_t b;
};

class RpcCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = Node::Create(node::testing::MakeConfig("tcp", "rpc-call-server"));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ASSERT_TRUE(server_
                    ->register_rpc(kOpAddOne,
                                   [](const RpcCall& c, std::vector<std::byte>& reply) -> Status {
                                     auto v = DecodeStruct<uint64_t>(c.request);
                                     if (!v) return Status::Protocol("want 8 bytes");
                                     reply = EncodeStruct<uint64_t>(*v + 1);
                                     return Status::OK();
                                   })
                    .ok());
    ASSERT_TRUE(server_
                    ->register_rpc(kOpShort,
                                   [](const RpcCall&, std::vector<std::byte>& reply) {
                                     reply.assign(3, std::byte{1});
                                     return Status::OK();
                                   })
                    .ok());
    ASSERT_TRUE(server_
                    ->register_rpc(kOpHeadTail,
                                   [](const RpcCall& c, std::vector<std::byte>& reply) -> Status {
                                     auto n = DecodeStruct<uint32_t>(c.request);
                                     if (!n) return Status::Protocol("want 4 bytes");
                                     reply = EncodeStruct<uint64_t>(0xfeed);
                                     reply.resize(8 + *n, std::byte{7});
                                     return Status::OK();
                                   })
                    .ok());
    ASSERT_TRUE(server_
                    ->register_rpc(kOpFailNotFound,
                                   [](const RpcCall&, std::vector<std::byte>&) {
                                     return Status::NotFound("no such thing");
                                   })
                    .ok());
    ASSERT_TRUE(server_->start().ok());
    auto c = Node::Create(node::testing::MakeConfig("tcp", "rpc-call-client"));
    ASSERT_TRUE(c.ok());
    client_ = std::move(*c);
    ASSERT_TRUE(client_->start().ok());
    auto peer = client_->connect(server_->bootstrap_address());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    peer_ = peer->id;
    auto sched = client_->make_scheduler();
    ASSERT_TRUE(sched.ok());
    sched_ = std::move(*sched);
  }

  std::unique_ptr<Node> server_, client_;
  PeerId peer_ = kInvalidPeer;
  std::unique_ptr<Scheduler> sched_;
};

TEST_F(RpcCallTest, FixedSizeStructsRoundTrip) {
  Result<uint64_t> r = sched_->block_on(
      CallStruct<uint64_t>(*sched_, peer_, kOpAddOne, uint64_t{41}, std::string("ADD_ONE")));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 42u);
}

TEST_F(RpcCallTest, AReplyOfTheWrongSizeIsAProtocolErrorWithContext) {
  Result<Pair> r = sched_->block_on(
      CallStruct<Pair>(*sched_, peer_, kOpShort, uint64_t{1}, std::string("SHORT 1")));
  ASSERT_EQ(r.status().code(), Code::kProtocol) << r.status().ToString();
  EXPECT_NE(r.status().message().find("SHORT 1: reply has 3 bytes, expected 16"),
            std::string_view::npos)
      << r.status().ToString();
}

TEST_F(RpcCallTest, RemoteErrorsKeepTheirCodeAndGainContext) {
  Result<uint64_t> r = sched_->block_on(
      CallStruct<uint64_t>(*sched_, peer_, kOpFailNotFound, uint64_t{1}, std::string("FAIL 1")));
  ASSERT_EQ(r.status().code(), Code::kNotFound) << r.status().ToString();
  EXPECT_NE(r.status().message().find("FAIL 1"), std::string_view::npos);
  EXPECT_NE(r.status().message().find("no such thing"), std::string_view::npos);
}

TEST_F(RpcCallTest, HeadAndTail) {
  std::vector<std::byte> buf(64);
  const auto req = EncodeStruct<uint32_t>(5);
  auto r = sched_->block_on(
      CallWithTail<uint64_t>(*sched_, peer_, kOpHeadTail, req, buf, std::string("HT 5")));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->head, 0xfeedu);
  ASSERT_EQ(r->tail.size(), 5u);
  EXPECT_EQ(r->tail[4], std::byte{7});
  // A reply shorter than the head.
  auto s = sched_->block_on(
      CallWithTail<Pair>(*sched_, peer_, kOpShort, req, buf, std::string("HT short")));
  EXPECT_EQ(s.status().code(), Code::kProtocol) << s.status().ToString();
}

TEST_F(RpcCallTest, BlockingRunnerServesSeveralThreadsOneCallAtATime) {
  BlockingRunner runner(*client_, "test");
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 50; ++i) {
        Result<uint64_t> r = runner.run([&](Scheduler& s) {
          return CallStruct<uint64_t>(s, peer_, kOpAddOne, uint64_t{i * 10 + t}, "ADD_ONE");
        });
        if (r.ok() && *r == i * 10 + t + 1) ok.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 200);
}

}  // namespace
}  // namespace farmem
