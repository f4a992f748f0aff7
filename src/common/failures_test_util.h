// Test helper: collects the failures that many threads of a stress test find (a count and the
// first few messages), so a test reports them once instead of failing inside worker threads.
// Thread-safe: Add from any thread; count and Report at the end.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace farmem::testing {

class Failures {
 public:
  void Add(const std::string& message) {
    count_.fetch_add(1);
    std::lock_guard lock(mu_);
    if (messages_.size() < kKept) messages_.push_back(message);
  }
  uint64_t count() const { return count_.load(); }
  std::string Report() const {
    std::lock_guard lock(mu_);
    std::string out;
    for (const auto& m : messages_) out += m + "\n";
    return out;
  }

 private:
  static constexpr size_t kKept = 10;
  std::atomic<uint64_t> count_{0};
  mutable std::mutex mu_;
  std::vector<std::string> messages_;
};

}  // namespace farmem::testing
