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
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "farmem/regionfs.h"
#include "regions/fs/mount_test_util.h"

namespace farmem {
namespace {

using namespace std::chrono_literals;

class DefaultAttrsTest : public RegionFsMountTest {
 protected:
  void SetUp() override { Mount("defattr", 16ull << 20); }
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
