// TxClient::Connect(node, cluster): the tx servers found through the control plane's membership
// (memory:// backend, in-process farmemds of TxEnv joined as farmemd --cluster joins them, with
// ClusterMemberRoles): only members with role "tx" are connected to, a cluster without one is a
// NotFound naming its members, and a partition whose member left is a clear error.
// Threads: the test's main thread; the servers' and the cluster backends' own threads.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cluster/cluster_test_util.h"
#include "farmem/cluster.h"
#include "farmem/tx.h"
#include "server/serve.h"
#include "tx/client/tx_test_env.h"

namespace farmem::tx_test {
namespace {

class TxDiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.url = "memory://" + cluster::testing::UniqueName("store");
    options_.cluster_name = "txd";
    options_.create_if_missing = true;
  }

  // A handle of its own per member: a member is one joined handle.
  std::unique_ptr<Cluster> Open() {
    auto c = Cluster::Open(options_);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  Cluster* Join(const std::string& name, const std::string& address,
                std::vector<std::string> roles) {
    auto c = Open();
    if (!c) return nullptr;
    ClusterMember m;
    m.name = name;
    m.address = address;
    m.roles = std::move(roles);
    const Status st = c->join(m);
    EXPECT_TRUE(st.ok()) << st.ToString();
    members_.push_back(std::move(c));
    return members_.back().get();
  }
  // Every server of `env` joins as farmemd --cluster would, named tx-0, tx-1, ...
  void JoinServers(TxEnv& env) {
    for (size_t p = 0; p < env.servers.size(); ++p) {
      const std::vector<std::string> roles = ClusterMemberRoles(env.servers[p]->services());
      EXPECT_EQ(roles, (std::vector<std::string>{"memory", "tx"}));
      Join("tx-" + std::to_string(p), env.addresses[p], roles);
    }
  }

  ClusterOptions options_;
  std::vector<std::unique_ptr<Cluster>> members_;
};

TEST_F(TxDiscoveryTest, ConnectsToTheMembersWithRoleTxOnly) {
  auto env = TxEnv::Start("tcp", 2, {"bank:8:8:32:2"});
  ASSERT_NE(env->node, nullptr);
  JoinServers(*env);
  // A memory-only member at a port nothing listens on: connecting to it would fail Connect.
  Join("plain", "127.0.0.1:1", {"memory"});
  Join("a-client", "", {"client", "tx"});  // no address: not a server, whatever its roles
  auto lookup = Open();
  ASSERT_NE(lookup, nullptr);
  auto client = TxClient::Connect(*env->node, *lookup);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto table = (*client)->table("bank");
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  // Keys over both partitions: inserted, then read back in one transaction.
  auto tx = BlockingTx::Create(**client, *env->node);
  ASSERT_TRUE(tx.ok()) << tx.status().ToString();
  constexpr uint64_t kKeys = 24;
  for (uint64_t k = 0; k < kKeys; ++k) {
    (*tx)->start();
    ASSERT_TRUE((*tx)->insert(*table, Key(k), Value(100 + k, 8)).ok());
    ASSERT_TRUE((*tx)->commit().ok());
  }
  (*tx)->start();
  for (uint64_t k = 0; k < kKeys; ++k) {
    auto v = (*tx)->read(*table, Key(k));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(U64(*v), 100 + k);
  }
  EXPECT_TRUE((*tx)->commit().ok());
  // Both partitions were written: each server holds some of the keys.
  for (auto& s : env->servers) {
    const auto stats = nlohmann::json::parse(s->stats_json());
    EXPECT_GT(stats["tx"]["tables"][0]["live_items"].get<uint64_t>(), 0u) << stats["tx"].dump();
  }
}

TEST_F(TxDiscoveryTest, NoMemberServingTxIsNotFoundNamingTheMembers) {
  auto env = TxEnv::Start("tcp", 1, {"bank:8:8:32:2"});
  ASSERT_NE(env->node, nullptr);
  auto lookup = Open();
  ASSERT_NE(lookup, nullptr);
  auto none = TxClient::Connect(*env->node, *lookup);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kNotFound);
  EXPECT_NE(none.status().message().find("members: none"), std::string::npos)
      << none.status().ToString();
  Join("mem-1", env->addresses[0], {"memory"});  // serves tx, but did not say so
  Join("mem-0", "127.0.0.1:1", {"memory", "client"});
  auto only_memory = TxClient::Connect(*env->node, *lookup);
  ASSERT_FALSE(only_memory.ok());
  EXPECT_EQ(only_memory.status().code(), Code::kNotFound);
  EXPECT_NE(only_memory.status().message().find("no member of cluster 'txd' serves tx (role 'tx'; "
                                                "members: mem-0, mem-1)"),
            std::string::npos)
      << only_memory.status().ToString();
}

TEST_F(TxDiscoveryTest, APartitionWhoseMemberLeftIsAClearError) {
  auto env = TxEnv::Start("tcp", 2, {"bank:8:8:32:2"});
  ASSERT_NE(env->node, nullptr);
  JoinServers(*env);
  ASSERT_EQ(members_.size(), 2u);
  ASSERT_TRUE(members_[1]->leave().ok());  // tx-1, holding partition 1, leaves
  auto lookup = Open();
  ASSERT_NE(lookup, nullptr);
  auto client = TxClient::Connect(*env->node, *lookup);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), Code::kFailedPrecondition);
  const std::string m(client.status().message());
  EXPECT_NE(m.find("no server holds partition 1 of table bank"), std::string::npos) << m;
  EXPECT_NE(m.find("tx members of cluster 'txd': tx-0"), std::string::npos) << m;
}

}  // namespace
}  // namespace farmem::tx_test
