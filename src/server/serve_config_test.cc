// Tests of farmemd flag/config handling: defaults, flag precedence over the JSON config file,
// rejected values and unknown keys (so typos fail loudly instead of being ignored), and the
// object store keys (flat and nested in the file), and the control-plane flags (--cluster...).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include <CLI/CLI.hpp>

#include "common/net/host_port.h"
#include "server/serve.h"

namespace farmem {
namespace {

Result<ServerConfig> Resolve(std::vector<std::string> args) {
  CLI::App app;
  ServeFlags flags;
  AddServeFlags(app, flags);
  std::reverse(args.begin(), args.end());
  app.parse(args);  // CLI11's vector form takes the arguments in reverse order
  return ResolveServeConfig(flags);
}

std::string WriteConfig(const std::string& text) {
  std::string path = ::testing::TempDir() + "farmemd_cfg_" + std::to_string(getpid()) + ".json";
  std::ofstream(path) << text;
  return path;
}

TEST(ServeConfigTest, Defaults) {
  unsetenv("FARMEM_TOKEN");
  auto c = Resolve({});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->node.bootstrap_host, "127.0.0.1");
  EXPECT_EQ(c->node.bootstrap_port, 7700);
  EXPECT_EQ(c->node.transport.backend, "tcp");
  EXPECT_EQ(c->node.transport.provider, "shm");
  EXPECT_EQ(c->node.transport.listen_host, "127.0.0.1");
  EXPECT_EQ(c->node.transport.listen_port, 0);
  EXPECT_EQ(c->node.transport.cluster_token, "farmem");
  EXPECT_EQ(c->memory_bytes, 256ull << 20);
  EXPECT_EQ(c->pool_bytes, 16ull << 20);
}

TEST(ServeConfigTest, FlagsAndEnvironment) {
  setenv("FARMEM_TOKEN", "from-env", 1);
  auto c = Resolve({"--listen", "127.0.0.2:9000", "--backend", "fabric", "--provider",
                    "tcp;ofi_rxm", "--data-port", "9100", "--memory-mib", "64", "--pool-mib", "4",
                    "--workers", "3", "--name", "m1"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->node.bootstrap_host, "127.0.0.2");
  EXPECT_EQ(c->node.transport.listen_host, "127.0.0.2");
  EXPECT_EQ(c->node.transport.listen_port, 9100);
  EXPECT_EQ(c->node.transport.provider, "tcp;ofi_rxm");
  EXPECT_EQ(c->node.transport.cluster_token, "from-env");
  EXPECT_EQ(c->memory_bytes, 64ull << 20);
  EXPECT_EQ(c->pool_bytes, 4ull << 20);
  EXPECT_EQ(c->node.rpc_workers, 3);
  auto t = Resolve({"--token", "flag"});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->node.transport.cluster_token, "flag");
  unsetenv("FARMEM_TOKEN");
}

TEST(ServeConfigTest, ConfigFileAndFlagPrecedence) {
  unsetenv("FARMEM_TOKEN");
  std::string path = WriteConfig(
      R"({"listen": "127.0.0.1:7800", "memory_mib": 32, "pool-mib": 8, "token": "cfg",
          "data-host": "127.0.0.3", "name": "from-file"})");
  auto c = Resolve({"--config", path, "--name", "from-flag"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->node.bootstrap_port, 7800);
  EXPECT_EQ(c->memory_bytes, 32ull << 20);
  EXPECT_EQ(c->pool_bytes, 8ull << 20);
  EXPECT_EQ(c->node.transport.cluster_token, "cfg");
  EXPECT_EQ(c->node.transport.listen_host, "127.0.0.3");
  EXPECT_EQ(c->node.name, "from-flag");
  unlink(path.c_str());
}

TEST(ServeConfigTest, RejectsBadValues) {
  unsetenv("FARMEM_TOKEN");
  EXPECT_EQ(Resolve({"--listen", "nohost"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Resolve({"--listen", "127.0.0.1:70000"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Resolve({"--listen", "127.0.0.1:x"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Resolve({"--backend", "udp"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Resolve({"--memory-mib", "8", "--pool-mib", "16"}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(Resolve({"--pool-mib", "0"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Resolve({"--workers", "0"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Resolve({"--data-port", "-1"}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Resolve({"--config", "/nonexistent/farmemd.json"}).status().code(),
            Code::kInvalidArgument);
  std::string typo = WriteConfig(R"({"memroy-mib": 1})");
  auto t = Resolve({"--config", typo});
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
  EXPECT_NE(t.status().message().find("unknown config key"), std::string_view::npos);
  std::string wrong_type = WriteConfig(R"({"workers": "two"})");
  EXPECT_EQ(Resolve({"--config", wrong_type}).status().code(), Code::kInvalidArgument);
  std::string not_json = WriteConfig("listen = 1");
  EXPECT_EQ(Resolve({"--config", not_json}).status().code(), Code::kInvalidArgument);
  unlink(typo.c_str());
}

TEST(ServeConfigTest, ObjectStoreDefaults) {
  unsetenv("FARMEM_TOKEN");
  auto c = Resolve({});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const ObjectsConfig& o = c->objects;
  EXPECT_TRUE(o.enabled);
  EXPECT_EQ(o.block_size, 4096u);
  EXPECT_EQ(o.id_bits, 16);
  EXPECT_TRUE(o.hybrid);
  EXPECT_EQ(o.workers, 0u);  // = --workers
  EXPECT_EQ(o.worker_selection, WorkerSelection::kByConnection);
  EXPECT_EQ(o.correction, Correction::kAskOwner);
  EXPECT_EQ(o.reserve_bytes, 0u);       // = memory budget
  EXPECT_EQ(o.max_physical_bytes, 0u);  // = memory budget
  EXPECT_DOUBLE_EQ(o.compaction.threshold, 0.3);
  EXPECT_EQ(o.compaction.interval_ms, 100u);
  EXPECT_EQ(o.compaction.max_merges_per_round, 64u);
  EXPECT_EQ(o.compaction.max_merges_per_second, 500u);
}

TEST(ServeConfigTest, ObjectStoreFlags) {
  unsetenv("FARMEM_TOKEN");
  auto c = Resolve({"--objects-block-size",
                    "65536",
                    "--objects-id-bits",
                    "12",
                    "--objects-hybrid",
                    "false",
                    "--objects-workers",
                    "3",
                    "--objects-worker-selection",
                    "random",
                    "--objects-correction",
                    "scan",
                    "--objects-reserve-mib",
                    "512",
                    "--objects-max-physical-mib",
                    "128",
                    "--objects-compaction-threshold",
                    "0.5",
                    "--objects-compaction-interval-ms",
                    "0",
                    "--objects-compaction-max-merges-per-round",
                    "8",
                    "--objects-compaction-max-merges-per-second",
                    "0"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const ObjectsConfig& o = c->objects;
  EXPECT_EQ(o.block_size, 65536u);
  EXPECT_EQ(o.id_bits, 12);
  EXPECT_FALSE(o.hybrid);
  EXPECT_EQ(o.workers, 3u);
  EXPECT_EQ(o.worker_selection, WorkerSelection::kRandom);
  EXPECT_EQ(o.correction, Correction::kScan);
  EXPECT_EQ(o.reserve_bytes, 512ull << 20);
  EXPECT_EQ(o.max_physical_bytes, 128ull << 20);
  EXPECT_DOUBLE_EQ(o.compaction.threshold, 0.5);
  EXPECT_EQ(o.compaction.interval_ms, 0u);
  EXPECT_EQ(o.compaction.max_merges_per_round, 8u);
  EXPECT_EQ(o.compaction.max_merges_per_second, 0u);
  auto off = Resolve({"--objects-enabled", "false"});
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_FALSE(off->objects.enabled);
}

TEST(ServeConfigTest, ObjectStoreConfigFileFlatAndNested) {
  unsetenv("FARMEM_TOKEN");
  std::string path = WriteConfig(
      R"({"objects": {"block_size": 8192, "id-bits": 8, "correction": "scan",
                      "compaction": {"threshold": 0.25, "interval_ms": 50}},
          "objects-worker-selection": "random", "objects_enabled": true})");
  auto c = Resolve({"--config", path, "--objects-id-bits", "0"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const ObjectsConfig& o = c->objects;
  EXPECT_EQ(o.block_size, 8192u);
  EXPECT_EQ(o.id_bits, 0);  // the flag wins over the file
  EXPECT_EQ(o.correction, Correction::kScan);
  EXPECT_EQ(o.worker_selection, WorkerSelection::kRandom);
  EXPECT_DOUBLE_EQ(o.compaction.threshold, 0.25);
  EXPECT_EQ(o.compaction.interval_ms, 50u);
  unlink(path.c_str());
}

TEST(ServeConfigTest, ObjectStoreRejectsBadValues) {
  unsetenv("FARMEM_TOKEN");
  auto bad = [](std::vector<std::string> args, const char* needle) {
    auto c = Resolve(std::move(args));
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << needle;
    EXPECT_NE(c.status().message().find(needle), std::string_view::npos) << c.status().ToString();
  };
  bad({"--objects-block-size", "5000"}, "power of two");
  bad({"--objects-block-size", "2048"}, "power of two");
  bad({"--objects-block-size", "2097152"}, "power of two");
  // Too large for the setting's type: CLI11 refuses it while parsing (farmemd exits with 2).
  EXPECT_THROW((void)Resolve({"--objects-block-size", "8589934592"}), CLI::ParseError);
  bad({"--objects-id-bits", "4"}, "id_bits");
  bad({"--objects-worker-selection", "roundrobin"}, "connection");
  bad({"--objects-correction", "guess"}, "owner");
  bad({"--objects-compaction-threshold", "1.5"}, "threshold");
  bad({"--objects-compaction-max-merges-per-round", "0"}, "max_merges");
  bad({"--objects-workers", "5000"}, "workers");
  std::string wrong_type = WriteConfig(R"({"objects": {"hybrid": "yes"}})");
  bad({"--config", wrong_type}, "true or false");
  std::string typo = WriteConfig(R"({"objects": {"blocksize": 4096}})");
  bad({"--config", typo}, "unknown config key 'objects-blocksize'");
  std::string threshold = WriteConfig(R"({"objects-compaction-threshold": "high"})");
  bad({"--config", threshold}, "must be a number");
  unlink(wrong_type.c_str());
  unlink(typo.c_str());
  unlink(threshold.c_str());
}

TEST(ServeConfigTest, ServicesAreChosenByName) {
  unsetenv("FARMEM_TOKEN");
  auto all = Resolve({});
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->services, (std::vector<std::string>{"pools", "objects"}));
  auto pools = Resolve({"--services", "pools"});
  ASSERT_TRUE(pools.ok()) << pools.status().ToString();
  EXPECT_EQ(pools->services, (std::vector<std::string>{"pools"}));
  auto unknown = Resolve({"--services", "pools,tiers"});
  EXPECT_EQ(unknown.status().code(), Code::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("unknown service 'tiers'"), std::string_view::npos)
      << unknown.status().ToString();
  EXPECT_EQ(Resolve({"--services", "pools,pools"}).status().code(), Code::kInvalidArgument);
  std::string path = WriteConfig(R"({"services": ["objects"]})");
  auto from_file = Resolve({"--config", path});
  ASSERT_TRUE(from_file.ok()) << from_file.status().ToString();
  EXPECT_EQ(from_file->services, (std::vector<std::string>{"objects"}));
  unlink(path.c_str());
  // --tier-file adds the tiered region to the default list, not to an explicit --services.
  auto tier = Resolve(
      {"--tier-file", "/var/tmp/t.data", "--tier-capacity-mib", "8", "--tier-dram-mib", "4"});
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  EXPECT_EQ(tier->services, (std::vector<std::string>{"pools", "objects", "tier"}));
  auto no_tier = Resolve({"--tier-file", "/var/tmp/t.data", "--tier-capacity-mib", "8",
                          "--tier-dram-mib", "4", "--services", "pools"});
  ASSERT_TRUE(no_tier.ok()) << no_tier.status().ToString();
  EXPECT_EQ(no_tier->services, (std::vector<std::string>{"pools"}));
  // So do --tx-table and the tx service; both configured: both, in build order.
  auto tx = Resolve({"--tx-table", "acct:8:8:64"});
  ASSERT_TRUE(tx.ok()) << tx.status().ToString();
  EXPECT_EQ(tx->services, (std::vector<std::string>{"pools", "objects", "tx"}));
  auto both = Resolve({"--tx-table", "acct:8:8:64", "--tier-file", "/var/tmp/t.data",
                       "--tier-capacity-mib", "8", "--tier-dram-mib", "4"});
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->services, (std::vector<std::string>{"pools", "objects", "tier", "tx"}));
}

// The roles a farmemd joins the cluster with: "tx" exactly when it runs the tx service.
TEST(ServeConfigTest, ClusterMemberRolesNameTheTxService) {
  using Roles = std::vector<std::string>;
  EXPECT_EQ(ClusterMemberRoles({"pools", "objects"}), (Roles{"memory"}));
  EXPECT_EQ(ClusterMemberRoles({"pools", "objects", "tier"}), (Roles{"memory"}));
  EXPECT_EQ(ClusterMemberRoles({"pools", "objects", "tx"}), (Roles{"memory", "tx"}));
  EXPECT_EQ(ClusterMemberRoles({"tx"}), (Roles{"memory", "tx"}));
}

TEST(ServeConfigTest, ParseHostPort) {
  auto a = net::ParseHostPort("[::1]:80");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "::1");
  EXPECT_EQ(a->second, 80);
  EXPECT_FALSE(net::ParseHostPort(":80").ok());
  EXPECT_FALSE(net::ParseHostPort("host:").ok());
  EXPECT_FALSE(net::ParseHostPort("host:123456").ok());
}

// Resolves like farmemd and also returns the Cluster::Open options it would use.
struct Resolved {
  Result<ServerConfig> config = Status::Internal("unset");
  ClusterOptions cluster;
};
Resolved ResolveWithCluster(std::vector<std::string> args) {
  CLI::App app;
  ServeFlags flags;
  AddServeFlags(app, flags);
  std::reverse(args.begin(), args.end());
  app.parse(args);
  Resolved r;
  r.config = ResolveServeConfig(flags);
  r.cluster = ServeClusterOptions(flags.options);
  return r;
}

TEST(ServeConfigTest, ClusterDefaultsToNone) {
  unsetenv("FARMEM_CLUSTER_PASSWORD");
  Resolved r = ResolveWithCluster({});
  ASSERT_TRUE(r.config.ok()) << r.config.status().ToString();
  EXPECT_EQ(r.cluster.url, "");  // no --cluster: the daemon joins nothing, as before
  EXPECT_EQ(r.cluster.cluster_name, "default");
  EXPECT_EQ(r.cluster.lease_ttl, std::chrono::seconds(5));
  EXPECT_TRUE(r.cluster.create_if_missing);  // a daemon may be the first member
}

TEST(ServeConfigTest, ClusterFlags) {
  unsetenv("FARMEM_CLUSTER_PASSWORD");
  Resolved r = ResolveWithCluster(
      {"--cluster", "etcd://10.0.0.1:2379,10.0.0.2:2379", "--cluster-name", "prod.a-1",
       "--cluster-ttl", "2", "--cluster-user", "farmem", "--cluster-password", "pw", "--cluster-ca",
       "/ca.pem", "--cluster-cert", "/c.pem", "--cluster-key", "/k.pem"});
  ASSERT_TRUE(r.config.ok()) << r.config.status().ToString();
  EXPECT_EQ(r.cluster.url, "etcd://10.0.0.1:2379,10.0.0.2:2379");
  EXPECT_EQ(r.cluster.cluster_name, "prod.a-1");
  EXPECT_EQ(r.cluster.lease_ttl, std::chrono::seconds(2));
  EXPECT_EQ(r.cluster.user, "farmem");
  EXPECT_EQ(r.cluster.password, "pw");
  EXPECT_EQ(r.cluster.tls_ca_file, "/ca.pem");
  EXPECT_EQ(r.cluster.tls_cert_file, "/c.pem");
  EXPECT_EQ(r.cluster.tls_key_file, "/k.pem");
}

TEST(ServeConfigTest, ClusterConfigFileAndPasswordFromEnvironment) {
  setenv("FARMEM_CLUSTER_PASSWORD", "from-env", 1);
  std::string path = WriteConfig(
      R"({"cluster": "etcd://127.0.0.1:2379", "cluster_name": "from-file", "cluster-ttl": 7,
          "cluster-password": "from-file"})");
  Resolved r = ResolveWithCluster({"--config", path, "--cluster-name", "from-flag"});
  ASSERT_TRUE(r.config.ok()) << r.config.status().ToString();
  EXPECT_EQ(r.cluster.url, "etcd://127.0.0.1:2379");
  EXPECT_EQ(r.cluster.cluster_name, "from-flag");
  EXPECT_EQ(r.cluster.lease_ttl, std::chrono::seconds(7));
  EXPECT_EQ(r.cluster.password, "from-env");  // flag > environment > config file
  unsetenv("FARMEM_CLUSTER_PASSWORD");
  unlink(path.c_str());
}

TEST(ServeConfigTest, ClusterRejectsBadValues) {
  unsetenv("FARMEM_CLUSTER_PASSWORD");
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--cluster", "etcd://127.0.0.1:2379", "--cluster-ttl", "0"},
           {"--cluster", "etcd://127.0.0.1:2379", "--cluster-ttl", "3601"},
           {"--cluster", "etcd://127.0.0.1:2379", "--cluster-name", "has space"},
           {"--cluster", "etcd://127.0.0.1:2379", "--cluster-name", ""},
           {"--cluster", "etcd://127.0.0.1:2379", "--cluster-name", std::string(65, 'a')},
           // cluster settings without a cluster are a mistake, not something to ignore
           {"--cluster-name", "x"},
           {"--cluster-ttl", "3"},
           {"--cluster-advertise", "10.0.0.5"},
           // a wildcard listen address cannot be announced; a bad advertise is refused
           {"--cluster", "etcd://127.0.0.1:2379", "--listen", "0.0.0.0:7700"},
           {"--cluster", "etcd://127.0.0.1:2379", "--listen", "[::]:7700"},
           {"--cluster", "etcd://127.0.0.1:2379", "--cluster-advertise", "host:0"},
           {"--cluster", "etcd://127.0.0.1:2379", "--cluster-advertise", "fe80::1"},
           {"--cluster", "etcd://127.0.0.1:2379", "--cluster-advertise", ":7700"}}) {
    Resolved r = ResolveWithCluster(args);
    EXPECT_FALSE(r.config.ok()) << args[0] << " " << args[1];
    if (!r.config.ok()) {
      EXPECT_EQ(r.config.status().code(), Code::kInvalidArgument);
    }
  }
  std::string path = WriteConfig(R"({"cluster-ttl": "five"})");
  Resolved r = ResolveWithCluster({"--config", path});
  EXPECT_FALSE(r.config.ok());
  unlink(path.c_str());
}

TEST(ServeConfigTest, ClusterAdvertiseAddress) {
  auto advertised = [](std::vector<std::string> args, const std::string& bound) {
    CLI::App app;
    ServeFlags flags;
    AddServeFlags(app, flags);
    std::reverse(args.begin(), args.end());
    app.parse(args);
    EXPECT_TRUE(ResolveServeConfig(flags).ok());
    return ClusterAdvertiseAddress(flags.options, bound);
  };
  const std::string url = "etcd://127.0.0.1:2379";
  EXPECT_EQ(advertised({"--cluster", url}, "127.0.0.1:7700"), "127.0.0.1:7700");
  EXPECT_EQ(
      advertised({"--cluster", url, "--listen", "0.0.0.0:7700", "--cluster-advertise", "10.0.0.5"},
                 "0.0.0.0:7700"),
      "10.0.0.5:7700");
  EXPECT_EQ(advertised({"--cluster", url, "--listen", "0.0.0.0:0", "--cluster-advertise",
                        "node-a.example:7800"},
                       "0.0.0.0:41234"),
            "node-a.example:7800");
  EXPECT_EQ(
      advertised({"--cluster", url, "--listen", "[::]:7700", "--cluster-advertise", "[fd00::5]"},
                 "[::]:7700"),
      "[fd00::5]:7700");
}

}  // namespace
}  // namespace farmem
