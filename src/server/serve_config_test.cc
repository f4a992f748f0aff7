// Tests of farmemd flag/config handling: defaults, flag precedence over the JSON config file,
// rejected values and unknown keys (so typos fail loudly instead of being ignored).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

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

TEST(ServeConfigTest, ParseHostPort) {
  auto a = ParseHostPort("[::1]:80");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "::1");
  EXPECT_EQ(a->second, 80);
  EXPECT_FALSE(ParseHostPort(":80").ok());
  EXPECT_FALSE(ParseHostPort("host:").ok());
  EXPECT_FALSE(ParseHostPort("host:123456").ok());
}

}  // namespace
}  // namespace farmem
