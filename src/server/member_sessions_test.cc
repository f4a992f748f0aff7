// farmemd --cluster and client sessions (docs/sessions.md): a client that opened its session as
// cluster member M loses its session allocations as soon as M's membership lease expires
// (EndSessionsOfExpiredMembers), long before the session's own lease would run out; sessions
// of other clients, and persistent allocations, stay. The dying member is simulated by writing its
// membership key through a raw memory:// backend under a 1 s lease nobody renews.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <thread>

#include "cluster/backend.h"
#include "cluster/cluster_url.h"
#include "cluster/member_codec.h"
#include "farmem/client.h"
#include "farmem/cluster.h"
#include "farmem/server.h"
#include "server/serve.h"

namespace farmem {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

TEST(MemberSessionsTest, AnExpiredMemberLosesItsSessionsAtOnce) {
  ClusterOptions co;
  co.url = "memory://member-sessions-test";
  co.cluster_name = "c";
  co.create_if_missing = true;
  auto cluster = Cluster::Open(co);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();

  ServerConfig sc;
  sc.memory_bytes = 1 << 20;
  sc.pool_bytes = 1 << 20;
  sc.node.transport.backend = "tcp";
  sc.node.transport.cluster_token = "secret";
  sc.services = {"pools"};
  auto server = MemoryServer::Create(sc);
  ASSERT_TRUE(server.ok());
  ASSERT_TRUE((*server)->start().ok());
  auto watch = EndSessionsOfExpiredMembers(**cluster, **server);
  ASSERT_TRUE(watch.ok()) << watch.status().ToString();

  // The doomed member: its key under a lease that nobody renews.
  auto raw = cluster::OpenBackendForUrl(co.url, co);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  const auto deadline = [] { return std::chrono::steady_clock::now() + 5s; };
  auto lease = (*raw)->lease_grant(1000ms, deadline());
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ClusterMember doomed;
  doomed.name = "doomed";
  doomed.roles = {"client"};
  ASSERT_TRUE((*raw)
                  ->put("/farmem/c/members/doomed",
                        cluster::EncodeMember(doomed, cluster::MemberState::kUp), *lease, 0,
                        deadline())
                  .ok());

  NodeConfig nc;
  nc.transport.backend = "tcp";
  nc.transport.cluster_token = "secret";
  auto node = Node::Create(nc);
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE((*node)->start().ok());
  RawClientOptions member;
  member.session_ttl = 60s;  // only the membership can end it within this test
  member.cluster_member = "doomed";
  auto c = RawClient::Connect(**node, (*server)->node().bootstrap_address(), member);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  RawClientOptions other;
  other.session_ttl = 60s;
  auto bystander = RawClient::Connect(**node, (*server)->node().bootstrap_address(), other);
  ASSERT_TRUE(bystander.ok());
  ASSERT_TRUE((*c)->alloc_raw(4096).ok());
  ASSERT_TRUE((*c)->alloc_raw(4096, Lifetime::kPersistent).ok());
  ASSERT_TRUE((*bystander)->alloc_raw(4096).ok());
  auto stat = [&] { return json::parse((*server)->stats_json()); };
  EXPECT_EQ(stat()["memory"]["owned_allocations"], 2);

  const auto start = std::chrono::steady_clock::now();
  while (stat()["sessions"]["member_expired_total"] != 1) {
    ASSERT_LT(std::chrono::steady_clock::now() - start, 10s) << stat()["sessions"].dump();
    std::this_thread::sleep_for(20ms);
  }
  const json s = stat();
  EXPECT_EQ(s["memory"]["owned_allocations"], 1);  // the bystander's
  EXPECT_EQ(s["memory"]["persistent_allocations"], 1);
  EXPECT_EQ(s["sessions"]["open"], 1);
  EXPECT_EQ(s["sessions"]["expired_total"], 0);

  bystander->reset();
  c->reset();
  (*watch)->cancel();
  watch->reset();
  (*node)->stop();
  (*server)->stop();
}

}  // namespace
}  // namespace farmem
