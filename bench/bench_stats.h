// Statistics and formatting helpers for the farmem benchmarks (header-only so tests link nothing).
// Latency samples are nanoseconds; percentiles use the nearest-rank definition on the sample set.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace farmem::bench {

// Nearest-rank percentile: the smallest sample such that at least p% of the samples are <= it.
// Reorders `samples` (nth_element, O(n)). NaN for an empty set; p is clamped to [0, 100].
inline double Percentile(std::vector<int64_t>& samples, double p) {
  if (samples.empty()) return std::numeric_limits<double>::quiet_NaN();
  p = std::clamp(p, 0.0, 100.0);
  const size_t n = samples.size();
  // rank in 1..n; p = 0 maps to the minimum. p*n first keeps integral ranks exact (99*1000/100).
  size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(n) / 100.0));
  rank = std::clamp<size_t>(rank, 1, n);
  auto nth = samples.begin() + static_cast<std::ptrdiff_t>(rank - 1);
  std::nth_element(samples.begin(), nth, samples.end());
  return static_cast<double>(*nth);
}

struct LatencySummary {
  size_t count = 0;
  double p50_us = std::numeric_limits<double>::quiet_NaN();
  double p99_us = std::numeric_limits<double>::quiet_NaN();
  double min_us = std::numeric_limits<double>::quiet_NaN();
  double max_us = std::numeric_limits<double>::quiet_NaN();
  double mean_us = std::numeric_limits<double>::quiet_NaN();
};

// Summarise nanosecond samples in microseconds. Reorders `samples_ns`.
inline LatencySummary Summarize(std::vector<int64_t>& samples_ns) {
  LatencySummary s;
  s.count = samples_ns.size();
  if (samples_ns.empty()) return s;
  auto [mn, mx] = std::minmax_element(samples_ns.begin(), samples_ns.end());
  s.min_us = static_cast<double>(*mn) / 1e3;
  s.max_us = static_cast<double>(*mx) / 1e3;
  long double sum = 0;
  for (int64_t v : samples_ns) sum += static_cast<long double>(v);
  s.mean_us = static_cast<double>(sum / static_cast<long double>(samples_ns.size())) / 1e3;
  s.p50_us = Percentile(samples_ns, 50.0) / 1e3;
  s.p99_us = Percentile(samples_ns, 99.0) / 1e3;
  return s;
}

// value / baseline, or nullopt when either is missing, not finite, or the baseline is not positive
// (a ratio against a failed or empty baseline would be meaningless).
inline std::optional<double> Ratio(double value, double baseline) {
  if (!std::isfinite(value) || !std::isfinite(baseline) || baseline <= 0.0 || value < 0.0)
    return std::nullopt;
  return value / baseline;
}

// "0.85x", "12.3x", "150x"; "n/a" when there is no ratio. Precision shrinks as the value grows so
// columns stay narrow while small ratios keep two significant decimals.
inline std::string FormatRatio(std::optional<double> r) {
  if (!r || !std::isfinite(*r)) return "n/a";
  const double v = *r;
  if (v < 10.0) return fmt::format("{:.2f}x", v);
  if (v < 100.0) return fmt::format("{:.1f}x", v);
  return fmt::format("{:.0f}x", v);
}

// Throughput in operations per second, human readable: "950 /s", "823.4 k/s", "2.21 M/s".
inline std::string FormatRate(double ops_per_sec) {
  if (!std::isfinite(ops_per_sec) || ops_per_sec < 0) return "n/a";
  if (ops_per_sec >= 1e6) return fmt::format("{:.2f} M/s", ops_per_sec / 1e6);
  if (ops_per_sec >= 1e3) return fmt::format("{:.1f} k/s", ops_per_sec / 1e3);
  return fmt::format("{:.0f} /s", ops_per_sec);
}

// A latency in microseconds: "1.23 us", "45.6 us", "1234 us"; "n/a" when missing.
inline std::string FormatMicros(double us) {
  if (!std::isfinite(us) || us < 0) return "n/a";
  if (us < 10.0) return fmt::format("{:.2f} us", us);
  if (us < 1000.0) return fmt::format("{:.1f} us", us);
  return fmt::format("{:.0f} us", us);
}

// Per-round ratios of an interleaved comparison (subject and baseline measured in alternating
// rounds A B A B ...): ratio_i = subject_i / baseline_i for every round where both are valid;
// a target is judged on the median, printed with the min-max spread.
struct RoundRatios {
  std::vector<double> ratios;  // in round order, invalid rounds left out
  double median = std::nan("");
  double min = std::nan("");
  double max = std::nan("");
};

inline double MedianOf(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

inline RoundRatios PerRoundRatios(std::span<const double> subject,
                                  std::span<const double> baseline) {
  RoundRatios r;
  const size_t n = std::min(subject.size(), baseline.size());
  for (size_t i = 0; i < n; ++i)
    if (auto x = Ratio(subject[i], baseline[i])) r.ratios.push_back(*x);
  if (r.ratios.empty()) return r;
  r.median = MedianOf(r.ratios);
  r.min = *std::min_element(r.ratios.begin(), r.ratios.end());
  r.max = *std::max_element(r.ratios.begin(), r.ratios.end());
  return r;
}

// "1.23x (0.98-1.40x)": median ratio and the spread of the rounds.
inline std::string FormatRoundRatios(const RoundRatios& r) {
  if (r.ratios.empty()) return "n/a";
  return fmt::format("{} ({:.2f}-{:.2f}x, {} rounds)", FormatRatio(r.median), r.min, r.max,
                     r.ratios.size());
}

// Outcome of one of the targets ("value <= factor x baseline" or ">=").
enum class TargetResult { kPass, kMiss, kUnknown };

inline TargetResult CheckAtMost(double value, double baseline, double factor) {
  auto r = Ratio(value, baseline);
  if (!r) return TargetResult::kUnknown;
  return *r <= factor ? TargetResult::kPass : TargetResult::kMiss;
}

inline TargetResult CheckAtLeast(double value, double baseline, double factor) {
  auto r = Ratio(value, baseline);
  if (!r) return TargetResult::kUnknown;
  return *r >= factor ? TargetResult::kPass : TargetResult::kMiss;
}

inline const char* TargetResultName(TargetResult t) {
  switch (t) {
    case TargetResult::kPass:
      return "PASS";
    case TargetResult::kMiss:
      return "MISS";
    case TargetResult::kUnknown:
      return "n/a";
  }
  return "n/a";
}

}  // namespace farmem::bench
