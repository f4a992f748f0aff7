// The step log `farmem demo`'s parts share: one line per checked, timed step and a pass/fail
// tally. Used by the demo's main thread only.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace farmem::cli {

using Clock = std::chrono::steady_clock;

inline double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Prints one line per step and counts failures.
class StepLog {
 public:
  bool Report(const std::string& step, bool ok, double micros, const std::string& detail) {
    std::printf("  %-22s %-4s %10.1f µs  %s\n", step.c_str(), ok ? "ok" : "FAIL", micros,
                detail.c_str());
    std::fflush(stdout);
    (ok ? passed_ : failed_)++;
    return ok;
  }
  int passed() const { return passed_; }
  int failed() const { return failed_; }

 private:
  int passed_ = 0;
  int failed_ = 0;
};

}  // namespace farmem::cli
