// Unit tests of `farmem bench tx --servers` (bench/tx_bench.h) that need no network namespaces:
// the TATP table sizing scripts/bench_tx_netns starts its farmemds with, and the clear errors for
// options that do not go with --servers or a server that is not there. Main thread only.
#include <gtest/gtest.h>

#include <fmt/format.h>

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

TEST(TxBenchServers, RefusesOptionsThatNeedLocalServers) {
  TxBenchOptions o;
  o.servers = {"127.0.0.1:1"};
  o.json_path = "";
  o.only = "kv";  // the KV part starts (and pins) its own farmemd
  EXPECT_EQ(RunTxBench(o), 2);
  o.only = "";
  o.backends = {"tcp", "fabric:shm"};  // the servers run one backend
  EXPECT_EQ(RunTxBench(o), 2);
  o.backends = {"udp"};
  EXPECT_EQ(RunTxBench(o), 2);
}

TEST(TxBenchServers, UnreachableServerIsAnErrorNotAHang) {
  TxBenchOptions o;
  o.servers = {"127.0.0.1:1"};  // nothing listens on port 1
  o.json_path = "";
  EXPECT_EQ(RunTxBench(o), 1);
}

}  // namespace
}  // namespace farmem
