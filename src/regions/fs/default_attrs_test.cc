// rsetdefaultattr against a real mount (RunRegionFs on a thread of this process, embedded
// farmemd): a thread's defaults decide the attributes of what it creates, other threads keep
// inheriting from the directory, values are checked, clearing restores inheritance.
// Skips without /dev/fuse (FUSE needs it, and root to mount).
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "farmem/regionfs.h"

namespace farmem {
namespace {

using namespace std::chrono_literals;

class DefaultAttrsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "no /dev/fuse";
    char tmpl[] = "/tmp/farmem-defattr.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    RegionFsOptions o;
    o.mountpoint = dir_;
    o.memory_bytes = 16ull << 20;
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
  std::string Attr(const std::string& path, const char* name) {
    char buf[256];
    ssize_t n = getxattr(path.c_str(), name, buf, sizeof(buf));
    return n < 0 ? "error " + std::to_string(errno) : std::string(buf, static_cast<size_t>(n));
  }
  void Create(const std::string& path) {
    int fd = open(path.c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
    close(fd);
  }

  std::string dir_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool ready_ = false;
  std::optional<Status> result_;
};

TEST_F(DefaultAttrsTest, AThreadsDefaultsDecideWhatItCreatesAndNoOtherThreads) {
  // The root of a new mount is PERSISTENT and passes it on (docs/regions.md "Attributes").
  ASSERT_TRUE(rsetdefaultattr(dir_, "persistent", "0").ok());
  ASSERT_TRUE(rsetdefaultattr(dir_, "onewriter", "1").ok());
  auto got = rgetdefaultattr(dir_, "persistent");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "0");
  Create(dir_ + "/mine");
  ASSERT_EQ(mkdir((dir_ + "/mydir").c_str(), 0755), 0);
  EXPECT_EQ(Attr(dir_ + "/mine", "user.region.persistent"), "0") << "the default was not applied";
  EXPECT_EQ(Attr(dir_ + "/mine", "user.region.onewriter"), "1");
  EXPECT_EQ(Attr(dir_ + "/mydir", "user.region.persistent"), "0");
  // Another thread: no defaults, inherits from the root.
  std::thread other([&] {
    EXPECT_EQ(rgetdefaultattr(dir_, "persistent").status().code(), Code::kNotFound);
    Create(dir_ + "/theirs");
  });
  other.join();
  EXPECT_EQ(Attr(dir_ + "/theirs", "user.region.persistent"), "1")
      << "another thread's default leaked";
  EXPECT_EQ(Attr(dir_ + "/theirs", "user.region.onewriter"), "0");
  // Cleared: inheritance again.
  ASSERT_TRUE(rcleardefaultattr(dir_, "persistent").ok());
  EXPECT_EQ(rgetdefaultattr(dir_, "persistent").status().code(), Code::kNotFound);
  Create(dir_ + "/later");
  EXPECT_EQ(Attr(dir_ + "/later", "user.region.persistent"), "1");
  EXPECT_EQ(Attr(dir_ + "/later", "user.region.onewriter"), "1") << "the other default went too";
  ASSERT_TRUE(rcleardefaultattr(dir_, "onewriter").ok());
}

TEST_F(DefaultAttrsTest, BadDefaultsAreRefused) {
  EXPECT_EQ(rsetdefaultattr(dir_, "persistent", "2").code(), Code::kInvalidArgument);
  EXPECT_EQ(rsetdefaultattr(dir_, "ownerpid", "1").code(), Code::kInvalidArgument);  // EPERM
  EXPECT_EQ(rsetdefaultattr(dir_, "colour", "1").code(), Code::kInvalidArgument);    // ENOTSUP
  EXPECT_EQ(rsetdefaultattr(dir_, "hostalloc", "127.0.0.1:1").code(), Code::kInvalidArgument)
      << "a server that is not this mount's";
  EXPECT_FALSE(rsetdefaultattr("/tmp", "persistent", "0").ok()) << "not a farmem mount";
  // Nothing was recorded by the refused calls.
  EXPECT_EQ(rgetdefaultattr(dir_, "persistent").status().code(), Code::kNotFound);
  // Not listed among the root's attributes (they belong to threads, not to the root).
  char names[1024];
  ssize_t n = listxattr(dir_.c_str(), names, sizeof(names));
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(names, static_cast<size_t>(n)).find("default"), std::string::npos);
}

}  // namespace
}  // namespace farmem
