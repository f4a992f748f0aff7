// Unit tests of `farmem bench tx --servers` (bench/tx_bench.h) that need no network namespaces:
// the TATP and KV table sizing scripts/bench_tx_netns starts its farmemds with, and the clear
// errors for options that do not go with --servers or a server that is not there. Main thread.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <string>

#include "tatp_workload.h"
#include "tx_bench.h"

namespace farmem {
namespace {

TEST(TxBenchServers, PrintsTatpTablesSplitOverThePartitions) {
  TxBenchOptions o;
  o.subscribers = 3000;
  o.tatp_alpha = 0.5;
  o.print_tatp_tables = 3;
  testing::internal::CaptureStdout();
  EXPECT_EQ(RunTxBench(o), 0);
  namespace tatp = bench::tatp;
  // Per partition: 1000 subscribers; rows SUB 1, SEC 1, AI 2.5, SF 2.5, CF 3.75 per subscriber,
  // at load 0.5.
  EXPECT_EQ(
      testing::internal::GetCapturedStdout(),
      fmt::format("sub:8:{}:2000:1,sec:8:{}:2000:1,ai:8:{}:5000:1,sf:8:{}:5000:1,cf:8:{}:7500:1\n",
                  tatp::kSubscriberBytes, tatp::kSecondaryBytes, tatp::kAccessInfoBytes,
                  tatp::kSpecialFacilityBytes, tatp::kCallForwardingBytes));
}

TEST(TxBenchServers, PrintsKvTableSplitOverThePartitions) {
  TxBenchOptions o;
  o.kv_keys = 30000;
  o.alpha = 0.5;
  o.print_kv_table = 3;
  testing::internal::CaptureStdout();
  EXPECT_EQ(RunTxBench(o), 0);
  // 10000 keys per partition at load 0.5: 20000 buckets; keys past their main bucket
  // (10000 - 20000 (1 - e^-0.5) = 2131, 10.7 % of the buckets, x 1.3 = 14 %) fit the default 25 %.
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "kv:8:8:20000:1 25\n");
  o.alpha = 1.0;  // 10000 buckets, 3679 past their bucket: 36.8 % x 1.3 -> 48 %
  testing::internal::CaptureStdout();
  EXPECT_EQ(RunTxBench(o), 0);
  EXPECT_EQ(testing::internal::GetCapturedStdout(), "kv:8:8:10000:1 48\n");
}

TEST(TxBenchServers, RefusesOptionsThatNeedLocalServers) {
  TxBenchOptions o;
  o.servers = {"127.0.0.1:1"};
  o.json_path = "";
  o.backends = {"tcp", "fabric:shm"};  // the servers run one backend
  EXPECT_EQ(RunTxBench(o), 2);
  o.backends = {"udp"};
  EXPECT_EQ(RunTxBench(o), 2);
}

TEST(TxBenchServers, RefusesServerPidsAndRedisThatDoNotFit) {
  TxBenchOptions o;
  o.json_path = "";
  o.server_pids = {static_cast<int>(::getpid())};
  EXPECT_EQ(RunTxBench(o), 2);  // --server-pids without --servers
  o.server_pids.clear();
  o.redis_addr = "127.0.0.1:6379";
  EXPECT_EQ(RunTxBench(o), 2);  // --redis without --servers: the local run starts its own
  o.redis_addr.clear();
  o.servers = {"127.0.0.1:1", "127.0.0.1:2"};
  o.server_pids = {static_cast<int>(::getpid())};
  EXPECT_EQ(RunTxBench(o), 2);  // one pid for two servers
  o.servers = {"127.0.0.1:1"};
  o.server_pids = {0};
  EXPECT_EQ(RunTxBench(o), 2);  // not a process
  o.server_pids.clear();
  for (const char* bad : {"127.0.0.1", "127.0.0.1:", ":6379", "127.0.0.1:70000", "h:0", "h:6x"}) {
    o.redis_addr = bad;
    EXPECT_EQ(RunTxBench(o), 2) << bad;
  }
}

TEST(TxBenchServers, UnreachableServerIsAnErrorNotAHang) {
  TxBenchOptions o;
  o.servers = {"127.0.0.1:1"};  // nothing listens on port 1
  o.json_path = "";
  EXPECT_EQ(RunTxBench(o), 1);
  o.only = "kv";  // the KV part against the servers: the same clear error
  o.server_pids = {static_cast<int>(::getpid())};
  EXPECT_EQ(RunTxBench(o), 1);
  o.only = "tatp";
  o.redis_addr = "127.0.0.1:1";  // nor does Redis
  EXPECT_EQ(RunTxBench(o), 1);
}

}  // namespace
}  // namespace farmem
