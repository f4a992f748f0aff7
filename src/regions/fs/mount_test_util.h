// Test fixture base for tests against a real farmem mount: RunRegionFs on a thread of the test
// process (embedded farmemd, memory:// metadata) in a fresh /tmp directory, unmounted at the end.
// Skips without /dev/fuse (FUSE needs it, and root to mount).
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "farmem/regionfs.h"

namespace farmem {

class RegionFsMountTest : public ::testing::Test {
 protected:
  // Call from SetUp (or a test): mounts at a new /tmp/farmem-<name>.XXXXXX (dir_) with
  // `memory_bytes` of embedded memory and returns once the mount serves requests (a fatal failure
  // or a skip if not).
  void Mount(const std::string& name, uint64_t memory_bytes) {
    RegionFsOptions o;
    o.memory_bytes = memory_bytes;
    Mount(name, std::move(o));
  }
  // The same with options of the test's own (servers, token, metadata URL); 2 FUSE threads.
  void Mount(const std::string& name, RegionFsOptions o) {
    using namespace std::chrono_literals;
    if (access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "no /dev/fuse";
    std::string tmpl = "/tmp/farmem-" + name + ".XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    o.mountpoint = dir_;
    o.threads = 2;
    o.on_ready = [this] {
      std::lock_guard lock(mu_);
      ready_ = true;
      cv_.notify_all();
    };
    thread_ = std::thread([this, o] {
      Status st = RunRegionFs(o);
      std::lock_guard lock(mu_);
      result_ = st;
      cv_.notify_all();
    });
    std::unique_lock lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, 20s, [&] { return ready_ || result_.has_value(); }))
        << "the mount was not ready within 20 s";
    ASSERT_TRUE(ready_) << "mount failed: " << result_->ToString();
  }
  void TearDown() override {
    if (thread_.joinable()) {
      if (std::system(("fusermount3 -u " + dir_ + " 2>/dev/null").c_str()) != 0)
        (void)std::system(("fusermount3 -uz " + dir_ + " 2>/dev/null").c_str());
      thread_.join();
    }
    if (!dir_.empty()) rmdir(dir_.c_str());
  }

  std::string dir_;  // the mount point

 private:
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool ready_ = false;
  std::optional<Status> result_;
};

}  // namespace farmem
