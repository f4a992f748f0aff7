// Prometheus text rendering for MetricsWriter: HELP/TYPE lines, label escaping, number format.
#include "service/metrics.h"

#include <cmath>

#include <fmt/format.h>

namespace farmem {
namespace {

// Label values escape backslash, quote and newline (exposition format 0.0.4).
void AppendLabelValue(std::string& out, std::string_view v) {
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
}

void AppendValue(std::string& out, double value) {
  if (std::isnan(value)) {
    out += "NaN";
  } else if (value == std::floor(value) && std::fabs(value) < 1e15) {
    out += fmt::format("{}", static_cast<int64_t>(value));  // counts print without ".0"
  } else {
    out += fmt::format("{}", value);
  }
}

}  // namespace

void MetricsWriter::family(std::string_view name, Kind kind, std::string_view help) {
  current_ = name;
  out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name,
                      kind == Kind::kCounter ? "counter" : "gauge");
}

void MetricsWriter::sample(Labels labels, double value) {
  out_ += current_;
  if (labels.size() > 0) {
    out_ += '{';
    bool first = true;
    for (const auto& [k, v] : labels) {
      if (!first) out_ += ',';
      first = false;
      out_ += k;
      out_ += "=\"";
      AppendLabelValue(out_, v);
      out_ += '"';
    }
    out_ += '}';
  }
  out_ += ' ';
  AppendValue(out_, value);
  out_ += '\n';
}

void MetricsWriter::counter(std::string_view name, std::string_view help, double value) {
  family(name, Kind::kCounter, help);
  sample({}, value);
}

void MetricsWriter::gauge(std::string_view name, std::string_view help, double value) {
  family(name, Kind::kGauge, help);
  sample({}, value);
}

}  // namespace farmem
