// Tests of the Prometheus text MetricsWriter renders: HELP/TYPE lines, labels and escaping,
// integer and fractional values.
#include "service/metrics.h"

#include <gtest/gtest.h>

namespace farmem {
namespace {

TEST(MetricsWriterTest, RendersFamiliesSamplesAndLabels) {
  MetricsWriter w;
  w.gauge("farmem_uptime_seconds", "Seconds since start.", 1.5);
  w.counter("farmem_objects_compactions_total", "Merges.", 42);
  w.family("farmem_rpc_calls_total", MetricsWriter::Kind::kCounter, "RPCs served.");
  w.sample({{"service", "pools"}, {"op", "alloc_raw"}}, 3);
  w.sample({{"service", "x"}, {"op", "a\"b\\c\nd"}}, 0);
  const std::string& t = w.text();
  EXPECT_NE(t.find("# HELP farmem_uptime_seconds Seconds since start.\n"
                   "# TYPE farmem_uptime_seconds gauge\nfarmem_uptime_seconds 1.5\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("# TYPE farmem_objects_compactions_total counter\n"
                   "farmem_objects_compactions_total 42\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("farmem_rpc_calls_total{service=\"pools\",op=\"alloc_raw\"} 3\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("farmem_rpc_calls_total{service=\"x\",op=\"a\\\"b\\\\c\\nd\"} 0\n"),
            std::string::npos)
      << t;
}

}  // namespace
}  // namespace farmem
