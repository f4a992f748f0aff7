// Raw ranges and client sessions (docs/sessions.md), end to end over native TCP on loopback:
// ranges a client allocates are freed when it is destroyed (SESSION_CLOSE) or when its lease runs
// out; persistent ranges survive; FREE_RAW then session end never frees twice; an unknown session
// is refused; keepalives hold a short lease for many TTLs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <thread>

#include "common/wait_for_test_util.h"
#include "common/wire_struct.h"
#include "farmem/client.h"
#include "farmem/server.h"
#include "node/session_wire.h"
#include "pools/pools_wire.h"
#include "server/local_server_test_util.h"

namespace farmem {
namespace {

namespace proto = server_proto;
namespace wire = session_wire;
using namespace std::chrono_literals;
using nlohmann::json;

constexpr uint64_t kSessionPool = 1 << 20;

using testing::WaitFor;

class RawSessionsTest : public testing::LocalServerTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(
        StartServer({"pools"}, 3 * kSessionPool, kSessionPool, "session-client"));
  }

  std::unique_ptr<RawClient> Connect(RawClientOptions o = {}) {
    auto c = RawClient::Connect(*node_, server_->node().bootstrap_address(), o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  json Memory() const { return json::parse(server_->stats_json())["memory"]; }
  json Sessions() const { return json::parse(server_->stats_json())["sessions"]; }

  // A raw RPC on `peer` with a struct body; the reply's bytes in `reply`.
  template <typename Req>
  Status Call(RawClient& via, uint16_t op, const Req& req, std::vector<std::byte>& reply) {
    auto sched = node_->make_scheduler();
    if (!sched.ok()) return sched.status();
    const std::vector<std::byte> body = EncodeStruct(req);
    reply.assign(256, std::byte{0});
    Result<RpcReply> r = (*sched)->block_on(
        (*sched)->rpc(via.server().id, RpcImm(op), std::span<const std::byte>(body), reply));
    if (!r.ok()) return r.status();
    reply.resize(r->length);
    return Status::OK();
  }
};

TEST_F(RawSessionsTest, DestroyingTheClientFreesItsSessionRangesButNotPersistentOnes) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(Sessions()["open"], 1);
  auto owned1 = c->alloc_raw(4096);
  auto owned2 = c->alloc_raw(100);
  auto kept = c->alloc_raw(8192, Lifetime::kPersistent);
  ASSERT_TRUE(owned1.ok() && owned2.ok() && kept.ok());
  EXPECT_FALSE(owned1->persistent);
  EXPECT_TRUE(kept->persistent);
  json m = Memory();
  EXPECT_EQ(m["allocations"], 3);
  EXPECT_EQ(m["owned_allocations"], 2);
  EXPECT_EQ(m["owned_bytes"], 4096 + 128);
  EXPECT_EQ(m["persistent_allocations"], 1);
  EXPECT_EQ(m["persistent_bytes"], 8192);
  c.reset();  // SESSION_CLOSE
  m = Memory();
  EXPECT_EQ(m["allocations"], 1);
  EXPECT_EQ(m["allocated_bytes"], 8192);
  EXPECT_EQ(m["owned_allocations"], 0);
  EXPECT_EQ(m["owned_bytes"], 0);
  const json s = Sessions();
  EXPECT_EQ(s["open"], 0);
  EXPECT_EQ(s["closed_total"], 1);
  EXPECT_EQ(s["raw_bytes_freed_total"], 4096 + 128);
  // The persistent range is still usable by another client, and freeable.
  auto other = Connect();
  ASSERT_NE(other, nullptr);
  EXPECT_TRUE(other->free_raw(kept->ref).ok());
  EXPECT_EQ(Memory()["allocations"], 0);
}

TEST_F(RawSessionsTest, FreeThenSessionEndDoesNotFreeTwice) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto a = c->alloc_raw(4096);
  auto b = c->alloc_raw(4096);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(c->free_raw(a->ref).ok());
  // Another client gets the freed range (first fit), persistent: it must survive c's end.
  auto other = Connect();
  ASSERT_NE(other, nullptr);
  auto reuse = other->alloc_raw(4096, Lifetime::kPersistent);
  ASSERT_TRUE(reuse.ok());
  EXPECT_EQ(reuse->ref.offset, a->ref.offset);
  c.reset();
  const json m = Memory();
  EXPECT_EQ(m["allocations"], 1);
  EXPECT_EQ(m["persistent_allocations"], 1);
  EXPECT_EQ(Sessions()["raw_bytes_freed_total"], 4096);
  EXPECT_TRUE(other->free_raw(reuse->ref).ok());  // still live: not freed by c's end
}

TEST_F(RawSessionsTest, UnknownOrExpiredSessionIsRefusedWithAClearError) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<std::byte> reply;
  Status st = Call(*c, proto::kOpAllocRaw, proto::AllocRawRequest{4096, 0x1234567}, reply);
  EXPECT_EQ(st.code(), Code::kNotFound);
  EXPECT_NE(st.message().find("session expired or unknown"), std::string_view::npos)
      << st.ToString();
  EXPECT_EQ(Memory()["allocations"], 0);
}

// A client that stops renewing (here: a session opened by hand and never kept alive) loses its
// ranges once the lease runs out, and allocating in it is refused from then on.
TEST_F(RawSessionsTest, ExpiredLeaseFreesTheSessionRanges) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto kept = c->alloc_raw(64, Lifetime::kPersistent);
  ASSERT_TRUE(kept.ok());
  std::vector<std::byte> reply;
  // Setting up takes a few RPCs, and a loaded CI runner has stalled them past the 1 s lease
  // itself: keep the session alive by hand while allocating, and start over with a new session
  // if the lease ran out anyway (each such session must expire too: counted in `opened`).
  uint64_t session = 0;
  int opened = 0;
  for (bool ready = false; !ready;) {
    ASSERT_LT(opened, 5) << "could not hold a 1 s lease long enough to allocate 4 ranges";
    wire::OpenRequest open{};
    open.ttl_ms = 1000;  // the shortest lease a server grants
    ASSERT_TRUE(Call(*c, wire::kOpOpen, open, reply).ok());
    ++opened;
    auto granted = DecodeStruct<wire::OpenReply>(reply);
    ASSERT_TRUE(granted.has_value());
    EXPECT_EQ(granted->ttl_ms, 1000u);
    session = granted->session_id;
    ready = true;
    for (int i = 0; i < 4 && ready; ++i) {
      ready = Call(*c, wire::kOpKeepalive, wire::KeepaliveRequest{session}, reply).ok() &&
              Call(*c, proto::kOpAllocRaw, proto::AllocRawRequest{1000, session}, reply).ok();
    }
    ready = ready && Call(*c, wire::kOpKeepalive, wire::KeepaliveRequest{session}, reply).ok() &&
            Memory()["owned_allocations"] == 4;
  }
  ASSERT_TRUE(WaitFor([&] { return Memory()["owned_allocations"] == 0; }, 5s)) << Memory().dump();
  EXPECT_EQ(Memory()["allocations"], 1);
  ASSERT_TRUE(WaitFor([&] { return Sessions()["expired_total"] == opened; }, 5s))
      << Sessions().dump();
  EXPECT_EQ(Sessions()["open"], 1);  // c's own session is kept alive by its keeper
  EXPECT_EQ(Call(*c, proto::kOpAllocRaw, proto::AllocRawRequest{64, session}, reply).code(),
            Code::kNotFound);
  EXPECT_EQ(Call(*c, wire::kOpKeepalive, wire::KeepaliveRequest{session}, reply).code(),
            Code::kNotFound);
}

TEST_F(RawSessionsTest, KeepalivesHoldAShortLeaseForManyTtls) {
  RawClientOptions o;
  o.session_ttl = 1s;
  auto c = Connect(o);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->session_ttl(), 1s);
  auto a = c->alloc_raw(4096);
  ASSERT_TRUE(a.ok());
  std::this_thread::sleep_for(3500ms);  // 3.5 leases
  EXPECT_EQ(Memory()["owned_allocations"], 1);
  EXPECT_EQ(Sessions()["expired_total"], 0);
  const SessionClientStats s = c->session_stats();
  EXPECT_GE(s.keepalives, 6u);
  EXPECT_EQ(s.lost, 0u);
  EXPECT_TRUE(c->free_raw(a->ref).ok());
}

// The session ended behind the client's back (as when the process stalled past its lease): the
// next allocation is refused for the stale session, the client opens a new one, retries, counts
// the loss; the old session's ranges are gone.
TEST_F(RawSessionsTest, LostSessionIsReplacedAndCounted) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  auto before = c->alloc_raw(4096);
  ASSERT_TRUE(before.ok());
  const uint64_t old_id = c->session_id();
  std::vector<std::byte> reply;
  ASSERT_TRUE(Call(*c, wire::kOpClose, wire::CloseRequest{old_id}, reply).ok());
  EXPECT_EQ(Memory()["allocations"], 0);
  auto after = c->alloc_raw(4096);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_NE(c->session_id(), old_id);
  EXPECT_EQ(c->session_stats().lost, 1u);
  EXPECT_EQ(Memory()["owned_allocations"], 1);
  c.reset();
  EXPECT_EQ(Memory()["allocations"], 0);
  EXPECT_EQ(Sessions()["open"], 0);
}

TEST_F(RawSessionsTest, MaxSessionsRefusesConnect) {
  TearDown();
  ServerConfig sc;
  sc.memory_bytes = kSessionPool;
  sc.pool_bytes = kSessionPool;
  sc.node.transport.backend = "tcp";
  sc.node.transport.cluster_token = "secret";
  sc.services = {"pools"};
  sc.sessions.max_sessions = 1;
  auto s = MemoryServer::Create(sc);
  ASSERT_TRUE(s.ok());
  server_ = std::move(*s);
  ASSERT_TRUE(server_->start().ok());
  NodeConfig nc;
  nc.transport.backend = "tcp";
  nc.transport.cluster_token = "secret";
  auto n = Node::Create(nc);
  ASSERT_TRUE(n.ok());
  node_ = std::move(*n);
  ASSERT_TRUE(node_->start().ok());
  auto first = Connect();
  ASSERT_NE(first, nullptr);
  auto second = RawClient::Connect(*node_, server_->node().bootstrap_address());
  EXPECT_EQ(second.status().code(), Code::kResourceExhausted) << second.status().ToString();
  first.reset();
  EXPECT_TRUE(RawClient::Connect(*node_, server_->node().bootstrap_address()).ok());
}

}  // namespace
}  // namespace farmem
