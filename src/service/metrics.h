// MetricsWriter: builds Prometheus text exposition (format 0.0.4) from typed calls, so a service
// lists its counters and gauges once and farmemd's /metrics is generated, never hand-assembled.
// Not thread-safe: one writer per scrape.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace farmem {

class MetricsWriter {
 public:
  using Labels = std::initializer_list<std::pair<std::string_view, std::string_view>>;
  enum class Kind { kCounter, kGauge };

  // Starts a metric family: its HELP and TYPE lines. Samples of it follow with sample().
  void family(std::string_view name, Kind kind, std::string_view help);
  // One sample of the family started last (label values are escaped here).
  void sample(Labels labels, double value);
  // A family with one unlabelled sample.
  void counter(std::string_view name, std::string_view help, double value);
  void gauge(std::string_view name, std::string_view help, double value);

  const std::string& text() const { return out_; }

 private:
  std::string out_;
  std::string current_;  // name of the family being written
};

}  // namespace farmem
