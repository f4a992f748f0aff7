// Helpers of the cluster tests: unique store/cluster names per test and a thread-safe event log a
// test waits on (with a timeout) while watch callbacks append to it from their threads.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/backend.h"

namespace farmem::cluster::testing {

// A test call's deadline: 3 s from now (an etcd round trip on a loaded runner stays far inside it).
inline Clock::time_point Soon() {
  return Clock::now() + std::chrono::milliseconds(3000);
}

// [A-Za-z0-9_.-]{1,64}, unique per call in this process and across processes (pid), readable
// (the current test's name).
inline std::string UniqueName(std::string_view tag = "") {
  static std::atomic<int> counter{0};
  std::string base;
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info()) {
    base = info->name();
  }
  std::string out;
  for (char c : base) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-';
    out += ok ? c : '_';
  }
  std::string suffix = std::string(tag) + "-" + std::to_string(::getpid()) + "-" +
                       std::to_string(counter.fetch_add(1));
  if (out.size() + suffix.size() > 64) out.resize(64 - std::min<size_t>(64, suffix.size()));
  return out + suffix;
}

// Polls `pred` every 10 ms until it holds or `timeout` passes.
inline bool WaitUntil(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

template <typename E>
class EventLog {
 public:
  void Add(const E& e) {
    {
      std::lock_guard l(mu_);
      events_.push_back(e);
    }
    cv_.notify_all();
  }
  // True once at least n events arrived, false at the timeout.
  bool WaitForCount(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock l(mu_);
    return cv_.wait_for(l, timeout, [&] { return events_.size() >= n; });
  }
  std::vector<E> Get() const {
    std::lock_guard l(mu_);
    return events_;
  }
  size_t size() const {
    std::lock_guard l(mu_);
    return events_.size();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<E> events_;
};

// Collects what a backend watch delivers (events, the first revision of every callback, errors);
// tests wait on it with a timeout while the watch's thread appends.
struct WatchCollector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<BackendEvent> events;
  std::vector<int64_t> batch_revisions;  // first revision of every callback
  std::vector<Status> errors;

  BackendWatchCallback Events() {
    return [this](const std::vector<BackendEvent>& evs) {
      std::lock_guard<std::mutex> lock(mu);
      if (!evs.empty()) batch_revisions.push_back(evs.front().kv.mod_revision);
      events.insert(events.end(), evs.begin(), evs.end());
      cv.notify_all();
    };
  }
  ClusterWatchErrorCallback Errors() {
    return [this](const Status& s) {
      std::lock_guard<std::mutex> lock(mu);
      errors.push_back(s);
      cv.notify_all();
    };
  }
  bool WaitEvents(size_t n, std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return events.size() >= n; });
  }
  bool WaitErrors(size_t n, std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return errors.size() >= n; });
  }
  size_t Count() {
    std::lock_guard<std::mutex> lock(mu);
    return events.size();
  }
  std::vector<BackendEvent> Snapshot() {
    std::lock_guard<std::mutex> lock(mu);
    return events;
  }
};

}  // namespace farmem::cluster::testing
