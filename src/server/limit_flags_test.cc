// Tests of `--limit KEY=VALUE`: every key reaches its field, bad items are refused with the key
// named (nothing applied), inconsistent combinations are refused, and farmemd's flag parsing
// carries the items into the node's listener limits and the metrics endpoint's.
#include "server/limit_flags.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <CLI/CLI.hpp>

#include "server/serve.h"

namespace farmem {
namespace {

using std::chrono::milliseconds;

TEST(LimitFlagsTest, EveryKeySetsItsField) {
  ListenerLimits l;
  ASSERT_TRUE(
      ApplyLimitItems(
          {"tcp.max_unauthenticated_bytes=1024", "tcp.auth_timeout_ms=700",
           "tcp.max_send_queue_bytes=8388608", "tcp.send_queue_resume_bytes=1048576",
           "tcp.max_total_send_queue_bytes=33554432", "tcp.total_send_queue_resume_bytes=16777216",
           "tcp.max_rpcs_in_flight=9", "tcp.max_connections_per_address=3",
           "tcp.max_connections=30", "tcp.accept_backoff_min_ms=5", "tcp.accept_backoff_max_ms=50",
           "bootstrap.handshake_timeout_ms=900", "bootstrap.max_open_handshakes=40",
           "bootstrap.max_open_handshakes_per_address=4", "bootstrap.accept_backoff_min_ms=6",
           "bootstrap.accept_backoff_max_ms=60", "metrics.max_connections=7",
           "metrics.max_request_bytes=4096", "metrics.deadline_ms=800"},
          l)
          .ok());
  EXPECT_EQ(l.tcp.max_unauthenticated_bytes, 1024u);
  EXPECT_EQ(l.tcp.auth_timeout, milliseconds(700));
  EXPECT_EQ(l.tcp.max_send_queue_bytes, 8u << 20);
  EXPECT_EQ(l.tcp.send_queue_resume_bytes, 1u << 20);
  EXPECT_EQ(l.tcp.max_total_send_queue_bytes, 32u << 20);
  EXPECT_EQ(l.tcp.total_send_queue_resume_bytes, 16u << 20);
  EXPECT_EQ(l.tcp.max_rpcs_in_flight, 9u);
  EXPECT_EQ(l.tcp.max_connections_per_address, 3u);
  EXPECT_EQ(l.tcp.max_connections, 30u);
  EXPECT_EQ(l.tcp.accept_backoff_min, milliseconds(5));
  EXPECT_EQ(l.tcp.accept_backoff_max, milliseconds(50));
  EXPECT_EQ(l.bootstrap.handshake_timeout, milliseconds(900));
  EXPECT_EQ(l.bootstrap.max_open_handshakes, 40u);
  EXPECT_EQ(l.bootstrap.max_open_handshakes_per_address, 4u);
  EXPECT_EQ(l.bootstrap.accept_backoff_min, milliseconds(6));
  EXPECT_EQ(l.bootstrap.accept_backoff_max, milliseconds(60));
  EXPECT_EQ(l.metrics.max_connections, 7);
  EXPECT_EQ(l.metrics.max_request_bytes, 4096u);
  EXPECT_EQ(l.metrics.deadline, milliseconds(800));
  // Every key is in the help text with its default.
  const std::string help = LimitKeysHelp();
  EXPECT_NE(help.find("tcp.max_rpcs_in_flight (64)"), std::string::npos) << help;
  EXPECT_NE(help.find("metrics.deadline_ms (2000)"), std::string::npos) << help;
  EXPECT_EQ(std::count(help.begin(), help.end(), '('), 19);
}

TEST(LimitFlagsTest, BadItemsAreRefusedAndChangeNothing) {
  const ListenerLimits defaults;
  for (const char* bad :
       {"tcp.max_connections", "tcp.max_conections=5", "tcp.max_connections=",
        "tcp.max_connections=-1", "tcp.max_connections=5x", "tcp.max_connections=0",
        "metrics.max_request_bytes=8", "tcp.max_send_queue_bytes=99999999999999999999"}) {
    ListenerLimits l;
    const Status st = ApplyLimitItems({"tcp.max_rpcs_in_flight=5", bad}, l);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find(bad), std::string::npos) << st.ToString();
    EXPECT_EQ(l.tcp.max_rpcs_in_flight, defaults.tcp.max_rpcs_in_flight) << bad;
  }
  ListenerLimits l;
  EXPECT_NE(ApplyLimitItems({"nope=1"}, l).message().find("tcp.max_rpcs_in_flight"),
            std::string::npos)
      << "an unknown key's error lists the known ones";
  for (const char* inconsistent :
       {"tcp.send_queue_resume_bytes=134217728", "tcp.total_send_queue_resume_bytes=134217728",
        "tcp.accept_backoff_min_ms=5000", "bootstrap.accept_backoff_min_ms=5000"}) {
    EXPECT_EQ(ApplyLimitItems({inconsistent}, l).code(), Code::kInvalidArgument) << inconsistent;
  }
}

TEST(LimitFlagsTest, FarmemdFlagReachesTheListeners) {
  CLI::App app;
  ServeFlags flags;
  AddServeFlags(app, flags);
  std::vector<std::string> args = {"--limit",
                                   "tcp.max_rpcs_in_flight=8,bootstrap.max_open_handshakes=32,"
                                   "metrics.max_connections=4"};
  std::reverse(args.begin(), args.end());
  app.parse(args);  // CLI11's vector form takes the arguments in reverse order
  auto c = ResolveServeConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->node.transport.tcp_limits.max_rpcs_in_flight, 8u);
  EXPECT_EQ(c->node.bootstrap_limits.max_open_handshakes, 32u);
  EXPECT_EQ(flags.options.metrics_limits.max_connections, 4);

  CLI::App app2;
  ServeFlags flags2;
  AddServeFlags(app2, flags2);
  std::vector<std::string> bad = {"tcp.max_rpcs_in_flight=0", "--limit"};
  app2.parse(bad);
  EXPECT_EQ(ResolveServeConfig(flags2).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace farmem
