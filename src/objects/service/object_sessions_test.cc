// Objects and client sessions (docs/sessions.md), end to end over native TCP on loopback: objects
// a client allocates are freed when the ObjectClient is destroyed (SESSION_CLOSE) or its lease
// runs out (raw OBJ_ALLOC in a hand-opened session that is never renewed); persistent objects
// survive; OBJ_FREE then session end never frees twice; an unknown session is refused; keepalives
// hold a short lease for many TTLs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <thread>

#include "common/wait_for_test_util.h"
#include "common/wire_struct.h"
#include "farmem/objects.h"
#include "farmem/server.h"
#include "node/session_wire.h"
#include "objects/format/object_wire.h"
#include "server/local_server_test_util.h"

namespace farmem {
namespace {

namespace wire = object_wire;
namespace swire = session_wire;
using namespace std::chrono_literals;
using nlohmann::json;

using testing::WaitFor;

class ObjectSessionsTest : public testing::LocalServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartServer({"objects"}, 8 << 20, 1 << 20, "objects-session-client"));
    auto sched = node_->make_scheduler();
    ASSERT_TRUE(sched.ok());
    sched_ = std::move(*sched);
  }
  void TearDown() override {
    sched_.reset();
    LocalServerTest::TearDown();
  }

  std::unique_ptr<ObjectClient> Connect(ObjectClientOptions o = {}) {
    const std::vector<std::string> servers{server_->node().bootstrap_address()};
    auto c = ObjectClient::Connect(*node_, servers, o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  json Objects() const { return json::parse(server_->stats_json())["objects"]; }
  json Sessions() const { return json::parse(server_->stats_json())["sessions"]; }

  // A raw RPC to the server (connected through `node_`) with a struct body.
  template <typename Req>
  Result<std::vector<std::byte>> Call(uint16_t op, const Req& req) {
    if (peer_ == kInvalidPeer) {
      auto p = node_->connect(server_->node().bootstrap_address());
      if (!p.ok()) return p.status();
      peer_ = p->id;
    }
    const std::vector<std::byte> body = EncodeStruct(req);
    std::vector<std::byte> reply(256);
    Result<RpcReply> r =
        sched_->block_on(sched_->rpc(peer_, RpcImm(op), std::span<const std::byte>(body), reply));
    if (!r.ok()) return r.status();
    reply.resize(r->length);
    return reply;
  }

  std::unique_ptr<Scheduler> sched_;
  PeerId peer_ = kInvalidPeer;
};

TEST_F(ObjectSessionsTest, DestroyingTheClientFreesItsSessionObjectsButNotPersistentOnes) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<Ptr> owned;
  for (int i = 0; i < 20; ++i) {
    auto p = c->alloc(100 + i);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_FALSE(p->persistent());
    owned.push_back(*p);
  }
  auto kept = c->alloc(64, 0, Lifetime::kPersistent);
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->persistent());
  const std::string text = "still here";
  ASSERT_TRUE(c->write(*kept, std::as_bytes(std::span(text))).ok());
  EXPECT_TRUE(kept->persistent());  // a pointer correction keeps the lifetime flag
  json o = Objects();
  EXPECT_EQ(o["live_objects"], 21);
  EXPECT_EQ(o["owned_objects"], 20);
  EXPECT_EQ(o["persistent_objects"], 1);
  c.reset();  // SESSION_CLOSE
  o = Objects();
  EXPECT_EQ(o["live_objects"], 1);
  EXPECT_EQ(o["owned_objects"], 0);
  EXPECT_EQ(o["persistent_objects"], 1);
  EXPECT_EQ(Sessions()["objects_freed_total"], 20);
  // The persistent object is readable by the next client.
  auto next = Connect();
  ASSERT_NE(next, nullptr);
  std::vector<std::byte> out(64);
  auto n = next->read(*kept, out);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(std::memcmp(out.data(), text.data(), text.size()), 0);
  // ... but an object of the ended session is gone.
  EXPECT_EQ(next->read(owned[0], out).status().code(), Code::kNotFound);
  EXPECT_TRUE(next->free(*kept).ok());
}

TEST_F(ObjectSessionsTest, FreeThenSessionEndDoesNotFreeTwice) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto a = c->alloc(100);
  auto b = c->alloc(100);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(c->free(*a).ok());
  // Another client gets a slot of the same class, persistent: it must survive c's end.
  auto other = Connect();
  ASSERT_NE(other, nullptr);
  auto reuse = other->alloc(100, 0, Lifetime::kPersistent);
  ASSERT_TRUE(reuse.ok());
  c.reset();
  EXPECT_EQ(Sessions()["objects_freed_total"], 1);  // only b
  EXPECT_EQ(Objects()["live_objects"], 1);
  std::vector<std::byte> out(8);
  EXPECT_TRUE(other->read(*reuse, out).ok());
  EXPECT_TRUE(other->free(*reuse).ok());
}

TEST_F(ObjectSessionsTest, UnknownSessionIsRefusedWithAClearError) {
  auto r = Call(wire::kOpAlloc, wire::AllocRequest{64, 0xdeadbeef});
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_NE(r.status().message().find("session expired or unknown"), std::string_view::npos)
      << r.status().ToString();
  EXPECT_EQ(Objects()["live_objects"], 0);
}

TEST_F(ObjectSessionsTest, ExpiredLeaseFreesTheSessionObjects) {
  swire::OpenRequest open{};
  open.ttl_ms = 1000;
  auto opened = Call(swire::kOpOpen, open);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  auto grant = DecodeStruct<swire::OpenReply>(*opened);
  ASSERT_TRUE(grant.has_value());
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(Call(wire::kOpAlloc, wire::AllocRequest{200, grant->session_id}).ok());
  }
  ASSERT_TRUE(Call(wire::kOpAlloc, wire::AllocRequest{200, 0}).ok());  // persistent
  EXPECT_EQ(Objects()["owned_objects"], 10);
  ASSERT_TRUE(WaitFor([&] { return Objects()["owned_objects"] == 0; }, 5s)) << Objects().dump();
  EXPECT_EQ(Objects()["live_objects"], 1);
  EXPECT_EQ(Sessions()["expired_total"], 1);
  EXPECT_EQ(Call(wire::kOpAlloc, wire::AllocRequest{200, grant->session_id}).status().code(),
            Code::kNotFound);
}

TEST_F(ObjectSessionsTest, KeepalivesHoldAShortLeaseForManyTtls) {
  ObjectClientOptions o;
  o.session_ttl = 1s;
  auto c = Connect(o);
  ASSERT_NE(c, nullptr);
  auto p = c->alloc(64);
  ASSERT_TRUE(p.ok());
  std::this_thread::sleep_for(3500ms);
  EXPECT_EQ(Objects()["owned_objects"], 1);
  EXPECT_EQ(Sessions()["expired_total"], 0);
  EXPECT_GE(c->session_stats().keepalives, 6u);
  EXPECT_EQ(c->session_stats().lost, 0u);
  std::vector<std::byte> out(8);
  EXPECT_TRUE(c->read(*p, out).ok());
}

}  // namespace
}  // namespace farmem
