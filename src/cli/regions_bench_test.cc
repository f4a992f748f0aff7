// Tests for the output parsers of `farmem bench regions` (bench/regions_bench.h): sysbench fileio's
// "read, MiB/s" line and fio's JSON write bandwidth, including the malformed cases.
#include "regions_bench.h"

#include <string>

#include <gtest/gtest.h>

namespace farmem {
namespace {

// The tail of a real `sysbench fileio ... run` (sysbench 1.0.20).
constexpr const char* kSysbench = R"(File operations:
    reads/s:                      476030.00
    writes/s:                     0.00
    fsyncs/s:                     0.00

Throughput:
    read, MiB/s:                  7432.43
    written, MiB/s:               0.00

General statistics:
    total time:                          1.0002s
)";

TEST(RegionsBenchParseTest, SysbenchReadMiBps) {
  auto v = ParseSysbenchReadMiBps(kSysbench);
  ASSERT_TRUE(v.has_value());
  EXPECT_DOUBLE_EQ(*v, 7432.43);
}

TEST(RegionsBenchParseTest, SysbenchMissingOrMalformed) {
  EXPECT_FALSE(ParseSysbenchReadMiBps("").has_value());
  EXPECT_FALSE(ParseSysbenchReadMiBps("written, MiB/s: 3.0\n").has_value());
  EXPECT_FALSE(ParseSysbenchReadMiBps("read, MiB/s:   oops\n").has_value());
  EXPECT_FALSE(ParseSysbenchReadMiBps("read, MiB/s: -1\n").has_value());
  EXPECT_FALSE(ParseSysbenchReadMiBps("read, MiB/s:").has_value());
}

TEST(RegionsBenchParseTest, FioWriteBandwidth) {
  const std::string fio = R"(note: both iodepth >= 1 and synchronous I/O engine are selected
{"fio version": "fio-3.33", "jobs": [{"jobname": "seqwrite",
  "read": {"bw_bytes": 0}, "write": {"bw_bytes": 1048576000, "runtime": 64}}]})";
  auto v = ParseFioWriteBytesPerSec(fio);
  ASSERT_TRUE(v.has_value());
  EXPECT_DOUBLE_EQ(*v, 1048576000.0);
}

TEST(RegionsBenchParseTest, FioMissingOrMalformed) {
  EXPECT_FALSE(ParseFioWriteBytesPerSec("").has_value());
  EXPECT_FALSE(ParseFioWriteBytesPerSec("fio: no jobs").has_value());
  EXPECT_FALSE(ParseFioWriteBytesPerSec("{\"jobs\": []}").has_value());
  EXPECT_FALSE(ParseFioWriteBytesPerSec("{\"jobs\": [{\"write\": {}}]}").has_value());
  EXPECT_FALSE(
      ParseFioWriteBytesPerSec("{\"jobs\": [{\"write\": {\"bw_bytes\": 0}}]}").has_value());
  EXPECT_FALSE(
      ParseFioWriteBytesPerSec("{\"jobs\": [{\"write\": {\"bw_bytes\": \"x\"}}]}").has_value());
  EXPECT_FALSE(ParseFioWriteBytesPerSec("{\"jobs\": [").has_value());
}

}  // namespace
}  // namespace farmem
