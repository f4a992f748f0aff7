// Tests of SessionKeeper (the client half of sessions) against fake servers: plain nodes that
// answer SESSION_OPEN / KEEPALIVE / CLOSE themselves, one of them hanging on KEEPALIVE. The
// registry and the real services are tested in service_tests, pools_tests and objects tests.
#include "node/session_keeper.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/wait_for_test_util.h"
#include "common/wire_struct.h"
#include "node/node_test_util.h"
#include "node/session_wire.h"

namespace farmem {
namespace {

namespace wire = session_wire;
using namespace std::chrono_literals;

// A node playing farmemd's session RPCs: grants `id` with a 1 s lease, counts keepalives, and
// with `hang` set keeps each keepalive waiting `hang` before answering.
struct FakeSessionServer {
  std::unique_ptr<Node> node;
  std::atomic<int> keepalives{0};
  std::atomic<int> closes{0};

  static std::unique_ptr<FakeSessionServer> Start(const std::string& name, uint64_t id,
                                                  std::chrono::milliseconds hang) {
    auto s = std::make_unique<FakeSessionServer>();
    NodeConfig c = node::testing::MakeConfig("tcp", name);
    auto n = Node::Create(c);
    EXPECT_TRUE(n.ok()) << n.status().ToString();
    if (!n.ok()) return nullptr;
    FakeSessionServer* self = s.get();
    EXPECT_TRUE((*n)->register_rpc(wire::kOpOpen,
                                   [id](const RpcCall&, std::vector<std::byte>& reply) {
                                     reply = EncodeStruct(wire::OpenReply{id, 1000, 0});
                                     return Status::OK();
                                   })
                    .ok());
    EXPECT_TRUE((*n)->register_rpc(wire::kOpKeepalive,
                                   [self, hang](const RpcCall&, std::vector<std::byte>&) {
                                     if (hang.count() > 0) std::this_thread::sleep_for(hang);
                                     self->keepalives.fetch_add(1);
                                     return Status::OK();
                                   })
                    .ok());
    EXPECT_TRUE((*n)->register_rpc(wire::kOpClose,
                                   [self](const RpcCall&, std::vector<std::byte>& reply) {
                                     self->closes.fetch_add(1);
                                     reply = EncodeStruct(wire::CloseReply{0, 0});
                                     return Status::OK();
                                   })
                    .ok());
    EXPECT_TRUE((*n)->start().ok());
    s->node = std::move(*n);
    return s;
  }
};

// Keepalives went out one session after another: a server that hangs on KEEPALIVE (here 3 s per
// call, as a stopped or overloaded farmemd would until the operation timeout) held back the other
// server's renewals past its 1 s lease. Now each round sends them all at once.
TEST(SessionKeeperTest, AHangingServerDoesNotDelayTheOthersKeepalives) {
  auto hanging = FakeSessionServer::Start("hanging", 11, 3s);
  auto good = FakeSessionServer::Start("good", 22, 0ms);
  ASSERT_TRUE(hanging && good);
  std::string skip;
  auto client = node::testing::StartNode(node::testing::MakeConfig("tcp", "client"), &skip);
  ASSERT_TRUE(client) << skip;
  auto p1 = client->connect(hanging->node->bootstrap_address());
  auto p2 = client->connect(good->node->bootstrap_address());
  ASSERT_TRUE(p1.ok() && p2.ok());
  {
    SessionKeeper keeper(*client, SessionKeeperOptions{.ttl = 1000ms, .owner = "test"});
    ASSERT_TRUE(keeper.open(p1->id).ok());
    ASSERT_TRUE(keeper.open(p2->id).ok());
    EXPECT_EQ(keeper.session_id(p1->id), 11u);
    EXPECT_EQ(keeper.session_id(p2->id), 22u);
    EXPECT_EQ(keeper.granted_ttl(p2->id), 1000ms);
    // Every 333 ms: within 2.5 s the good server sees about 7; sequential rounds gave it 1.
    EXPECT_TRUE(testing::WaitFor([&] { return good->keepalives.load() >= 4; }, 2500ms))
        << "the good server got " << good->keepalives.load()
        << " keepalives in 2.5 s with a 1 s lease";
  }
  // ~SessionKeeper closed both sessions (the hanging server's close waits behind its keepalive).
  EXPECT_EQ(good->closes.load(), 1);
  client->stop();
  good->node->stop();
  hanging->node->stop();
}

}  // namespace
}  // namespace farmem
