// The one JSON "targets" writer of the farmem benchmarks: every benchmark's JSON holds `targets`,
// a list of {name, value, baseline, ratio, limit, result} (plus the round spread and a detail),
// and is written to a file the same way. Header-only; called by each benchmark's main thread.
#pragma once

#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_stats.h"
#include "farmem/status.h"

namespace farmem::bench {

// One of the targets as it goes into the JSON file.
struct TargetRecord {
  std::string name;
  double value = std::nan("");
  double baseline = std::nan("");
  // The judged ratio (median of per-round ratios, or value / baseline), with the rounds' spread
  // when the target was judged on rounds. nullopt = no ratio (written as null).
  std::optional<double> ratio;
  std::optional<double> ratio_min, ratio_max;
  std::vector<double> round_ratios;
  std::string limit;  // e.g. ">= 0.8x baseline", "== 0"
  TargetResult result = TargetResult::kUnknown;
  std::string detail;  // free text; left out when empty
  // Keys of a benchmark's own added to the entry (e.g. raw's "metric", "missing").
  nlohmann::json extra = nlohmann::json::object();
  // Judged on rounds: ratio_min, ratio_max and round_ratios are written (null / [] without a
  // valid round).
  bool judged_on_rounds = false;

  // ratio, ratio_min, ratio_max and round_ratios from an interleaved comparison (ratio stays
  // nullopt when it has no valid round).
  void SetRounds(const RoundRatios& r) {
    judged_on_rounds = true;
    if (r.ratios.empty()) return;
    ratio = r.median;
    ratio_min = r.min;
    ratio_max = r.max;
    round_ratios = r.ratios;
  }
};

namespace json_detail {
inline nlohmann::json OrNull(std::optional<double> v) {
  return v && std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
inline nlohmann::json OrNull(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}
}  // namespace json_detail

inline nlohmann::json TargetJson(const TargetRecord& t) {
  nlohmann::json x = {{"name", t.name},
                      {"value", json_detail::OrNull(t.value)},
                      {"baseline", json_detail::OrNull(t.baseline)},
                      {"ratio", json_detail::OrNull(t.ratio)},
                      {"limit", t.limit},
                      {"result", TargetResultName(t.result)}};
  if (t.judged_on_rounds || t.ratio_min || t.ratio_max || !t.round_ratios.empty()) {
    x["ratio_min"] = json_detail::OrNull(t.ratio_min);
    x["ratio_max"] = json_detail::OrNull(t.ratio_max);
    x["round_ratios"] = t.round_ratios;
  }
  if (!t.detail.empty()) x["detail"] = t.detail;
  if (t.extra.is_object())
    for (const auto& [k, v] : t.extra.items()) x[k] = v;
  return x;
}

inline nlohmann::json TargetsJson(std::span<const TargetRecord> targets) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& t : targets) a.push_back(TargetJson(t));
  return a;
}

// Writes `j` (2-space indented, newline at the end) to `path`.
inline Status WriteJsonFile(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) return Status::Internal("cannot write " + path);
  return Status::OK();
}

}  // namespace farmem::bench
