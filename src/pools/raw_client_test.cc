// End-to-end tests: a MemoryServer and a client Node in one process over the native TCP backend
// on loopback. Allocation RPCs, one-sided data access on granted ranges, STAT contents, malformed
// and invalid requests (answered with errors while the server keeps serving), budget exhaustion.
#include "farmem/client.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <set>
#include <vector>

#include "farmem/server.h"
#include "pools/pools_wire.h"

namespace farmem {
namespace {

namespace proto = server_proto;

constexpr uint64_t kClientPool = 1 << 20;

class RawClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ServerConfig sc;
    sc.memory_bytes = 3 * kClientPool;
    sc.pool_bytes = kClientPool;
    sc.node.name = "test-farmemd";
    sc.node.transport.backend = "tcp";
    sc.node.transport.cluster_token = "secret";
    sc.node.rpc_workers = 2;
    auto s = MemoryServer::Create(sc);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->start().ok());

    auto n = MakeNode("secret");
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    node_ = std::move(*n);
    auto c = RawClient::Connect(*node_, server_->node().bootstrap_address());
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client_ = std::move(*c);
    auto sched = node_->make_scheduler();
    ASSERT_TRUE(sched.ok()) << sched.status().ToString();
    sched_ = std::move(*sched);
  }

  void TearDown() override {
    sched_.reset();
    client_.reset();
    if (node_) node_->stop();
    if (server_) server_->stop();
  }

  static Result<std::unique_ptr<Node>> MakeNode(const std::string& token) {
    NodeConfig nc;
    nc.name = "test-client";
    nc.transport.backend = "tcp";
    nc.transport.cluster_token = token;
    FARMEM_ASSIGN_OR_RETURN(auto node, Node::Create(nc));
    FARMEM_RETURN_IF_ERROR(node->start());
    return node;
  }

  // A raw RPC to the server with arbitrary bytes (to send malformed requests).
  Result<RpcReply> RawRpc(uint16_t opcode, std::vector<std::byte> request,
                          std::vector<std::byte>& reply) {
    return sched_->block_on(
        sched_->rpc(client_->server().id, RpcImm(opcode), request, std::span(reply)));
  }

  std::unique_ptr<MemoryServer> server_;
  std::unique_ptr<Node> node_;
  std::unique_ptr<RawClient> client_;
  std::unique_ptr<Scheduler> sched_;
};

TEST_F(RawClientTest, AllocWriteReadFree) {
  Scheduler& s = *sched_;
  Result<RawAllocation> a = s.block_on(client_->alloc_raw(s, 4000));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->length, 4032u);  // rounded up to 64
  EXPECT_EQ(a->ref.offset % 64, 0u);
  EXPECT_EQ(a->ref.peer, client_->server().id);

  std::vector<uint8_t> out(4000), in(4000, 0);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_TRUE(s.block_on(s.write(a->ref, out.data(), out.size(), true)).ok());
  ASSERT_TRUE(s.block_on(s.read(a->ref, in.data(), in.size())).ok());
  EXPECT_EQ(in, out);

  Result<uint64_t> old = s.block_on(s.fetch_add(a->ref, 5));
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  uint64_t first;
  std::memcpy(&first, out.data(), 8);
  EXPECT_EQ(*old, first);

  // A second allocation does not overlap the first.
  Result<RawAllocation> b = client_->alloc_raw(64);  // blocking version
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  if (b->ref.key == a->ref.key) {
    EXPECT_TRUE(b->ref.offset >= a->ref.offset + a->length ||
                b->ref.offset + b->length <= a->ref.offset);
  }
  EXPECT_TRUE(s.block_on(client_->free_raw(s, a->ref)).ok());
  EXPECT_TRUE(client_->free_raw(b->ref).ok());
  Status twice = client_->free_raw(b->ref);
  EXPECT_EQ(twice.code(), Code::kInvalidArgument) << twice.ToString();
  EXPECT_NE(twice.message().find("double free"), std::string_view::npos) << twice.ToString();
}

TEST_F(RawClientTest, OneSidedAccessIsBoundedByThePool) {
  Result<RawAllocation> a = client_->alloc_raw(64);
  ASSERT_TRUE(a.ok());
  RemoteRef past_end = a->ref;
  past_end.offset = kClientPool - 8;
  uint64_t buf[4];
  Status st = sched_->block_on(sched_->read(past_end, buf, sizeof(buf)));
  EXPECT_FALSE(st.ok());
}

TEST_F(RawClientTest, StatReportsPoolsAllocationsAndRpcCounts) {
  Result<RawAllocation> a = client_->alloc_raw(1000);
  ASSERT_TRUE(a.ok());
  Result<RawAllocation> b = client_->alloc_raw(64);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(client_->free_raw(b->ref).ok());
  EXPECT_FALSE(client_->alloc_raw(0).ok());

  Result<std::string> st = client_->stats_json();
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  const nlohmann::json j = nlohmann::json::parse(*st);
  EXPECT_EQ(j["node"], "test-farmemd");
  EXPECT_EQ(j["transport"]["name"], "tcp");
  EXPECT_EQ(j["transport"]["address"], server_->node().transport().local_address());
  EXPECT_EQ(j["bootstrap"], server_->node().bootstrap_address());
  EXPECT_GE(j["uptime_seconds"].get<double>(), 0.0);
  EXPECT_EQ(j["memory"]["budget_bytes"], 3 * kClientPool);
  EXPECT_EQ(j["memory"]["reserved_bytes"], 3 * kClientPool);
  EXPECT_EQ(j["memory"]["pools"], 1);
  EXPECT_EQ(j["memory"]["max_pools"], 3);
  EXPECT_EQ(j["memory"]["allocations"], 1);
  EXPECT_EQ(j["memory"]["allocated_bytes"], 1024);
  EXPECT_EQ(j["memory"]["free_bytes"], 3 * kClientPool - 1024);
  ASSERT_EQ(j["pools"].size(), 1u);
  EXPECT_EQ(j["pools"][0]["name"], "pool-0");
  EXPECT_EQ(j["pools"][0]["allocations"], 1);
  EXPECT_EQ(j["rpc"]["alloc_raw"]["calls"], 3);
  EXPECT_EQ(j["rpc"]["alloc_raw"]["errors"], 1);
  EXPECT_EQ(j["rpc"]["free_raw"]["calls"], 1);
  EXPECT_EQ(j["rpc"]["stat"]["calls"], 1);  // this call counts itself
  EXPECT_EQ(j["rpc"]["alloc_raw"]["opcode"], proto::kOpAllocRaw);
  // The in-process view agrees.
  EXPECT_EQ(nlohmann::json::parse(server_->stats_json())["memory"]["allocations"], 1);
}

TEST_F(RawClientTest, BadRequestsAreAnsweredAndServerKeepsServing) {
  std::vector<std::byte> reply(4096);
  auto code = [&](uint16_t op, size_t len) {
    Result<RpcReply> r = RawRpc(op, std::vector<std::byte>(len, std::byte{0x5a}), reply);
    return r.ok() ? Code::kOk : r.status().code();
  };
  EXPECT_EQ(code(proto::kOpAllocRaw, 3), Code::kProtocol);
  EXPECT_EQ(code(proto::kOpAllocRaw, 8), Code::kProtocol);  // the pre-session size
  EXPECT_EQ(code(proto::kOpAllocRaw, 17), Code::kProtocol);
  EXPECT_EQ(code(proto::kOpAllocRaw, 0), Code::kProtocol);
  EXPECT_EQ(code(proto::kOpFreeRaw, 8), Code::kProtocol);
  EXPECT_EQ(code(proto::kOpFreeRaw, 17), Code::kProtocol);
  EXPECT_EQ(code(proto::kOpStat, 1), Code::kProtocol);

  // Well-formed but invalid requests.
  EXPECT_EQ(client_->alloc_raw(0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(client_->alloc_raw(kClientPool + 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(client_->alloc_raw(~0ull).status().code(), Code::kInvalidArgument);
  Result<RawAllocation> a = client_->alloc_raw(256);
  ASSERT_TRUE(a.ok());
  RemoteRef forged = a->ref;
  forged.key ^= 0x1;
  EXPECT_EQ(client_->free_raw(forged).code(), Code::kNotFound);
  forged = a->ref;
  forged.offset += 64;
  Status inside = client_->free_raw(forged);
  EXPECT_EQ(inside.code(), Code::kInvalidArgument);
  EXPECT_NE(inside.message().find("inside the allocation"), std::string_view::npos)
      << inside.ToString();
  forged.offset = ~0ull;
  EXPECT_EQ(client_->free_raw(forged).code(), Code::kInvalidArgument);

  // Still serving, and the failed frees did not release anything.
  Result<RawAllocation> b = client_->alloc_raw(64);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(nlohmann::json::parse(server_->stats_json())["memory"]["allocations"], 2);
  EXPECT_TRUE(client_->free_raw(a->ref).ok());
  EXPECT_TRUE(client_->free_raw(b->ref).ok());
  auto j = nlohmann::json::parse(server_->stats_json());
  EXPECT_EQ(j["rpc"]["alloc_raw"]["errors"], 7);
  EXPECT_EQ(j["rpc"]["free_raw"]["errors"], 5);
  EXPECT_EQ(j["rpc"]["stat"]["errors"], 1);
}

TEST_F(RawClientTest, BudgetExhaustion) {
  std::vector<RawAllocation> got;
  for (int i = 0; i < 3; ++i) {
    Result<RawAllocation> a = client_->alloc_raw(kClientPool);
    ASSERT_TRUE(a.ok()) << i << ": " << a.status().ToString();
    got.push_back(*a);
  }
  Result<RawAllocation> full = client_->alloc_raw(64);
  EXPECT_EQ(full.status().code(), Code::kResourceExhausted) << full.status().ToString();
  EXPECT_EQ(nlohmann::json::parse(server_->stats_json())["memory"]["pools"], 3);

  ASSERT_TRUE(client_->free_raw(got[2].ref).ok());
  Result<RawAllocation> again = client_->alloc_raw(4096);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->ref.key, got[2].ref.key);
  // Data written into a later pool is readable (each pool is its own registered region).
  uint64_t v = 0x0123456789abcdefull, r = 0;
  ASSERT_TRUE(sched_->block_on(sched_->write(again->ref, &v, 8, true)).ok());
  ASSERT_TRUE(sched_->block_on(sched_->read(again->ref, &r, 8)).ok());
  EXPECT_EQ(r, v);
}

TEST_F(RawClientTest, ManyAllocationsInFlightOnCoroutines) {
  Scheduler& s = *sched_;
  constexpr int kN = 32;
  std::vector<Result<RawAllocation>> res(kN, Result<RawAllocation>(Status::Internal("unset")));
  auto one = [](RawClient* c, Scheduler* s, Result<RawAllocation>* out) -> Task<void> {
    *out = co_await c->alloc_raw(*s, 128);
  };
  for (int i = 0; i < kN; ++i) s.spawn(one(client_.get(), &s, &res[i]));
  ASSERT_TRUE(s.run(std::chrono::seconds(30)).ok());
  std::set<std::pair<uint64_t, uint64_t>> seen;
  for (auto& r : res) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(seen.insert({r->ref.key, r->ref.offset}).second);
  }
  EXPECT_EQ(nlohmann::json::parse(server_->stats_json())["memory"]["allocations"], kN);
}

TEST(RawClientConnectTest, WrongTokenAndUnreachableAddressFail) {
  ServerConfig sc;
  sc.memory_bytes = kClientPool;
  sc.pool_bytes = kClientPool;
  sc.node.transport.cluster_token = "right";
  auto server = MemoryServer::Create(sc);
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE((*server)->start().ok());

  NodeConfig nc;
  nc.transport.cluster_token = "wrong";
  auto node = Node::Create(nc);
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE((*node)->start().ok());
  auto c = RawClient::Connect(**node, (*server)->node().bootstrap_address());
  EXPECT_FALSE(c.ok());
  auto gone = RawClient::Connect(**node, "127.0.0.1:1");
  EXPECT_FALSE(gone.ok());
  (*node)->stop();
  (*server)->stop();
}

TEST(MemoryServerTest, RejectsBadConfig) {
  ServerConfig sc;
  sc.memory_bytes = kClientPool / 2;
  sc.pool_bytes = kClientPool;
  EXPECT_EQ(MemoryServer::Create(sc).status().code(), Code::kInvalidArgument);
  sc.memory_bytes = kClientPool;
  sc.pool_bytes = 1000;
  EXPECT_EQ(MemoryServer::Create(sc).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace farmem
