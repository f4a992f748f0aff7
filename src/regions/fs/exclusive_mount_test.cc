// An exclusive mount (RegionFsOptions::Sharing, the default for memory://) keeps every other
// mount of its namespace out: a second mount in the same process, exclusive or shared, is refused
// with "mounted already" and never serves (docs/regions.md "Several mounts").
// FARMEM_REGIONS_FAULT=no_claim lets the second one in and the test fails. Skips without
// /dev/fuse. Threads: the test's and the mounts' (RunRegionFs on threads of their own).
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>

#include "farmem/regionfs.h"
#include "regions/fs/mount_test_util.h"

namespace farmem {
namespace {

using namespace std::chrono_literals;

class ExclusiveMountTest : public RegionFsMountTest {
 protected:
  void SetUp() override {
    const char* f = std::getenv("FARMEM_REGIONS_FAULT");
    if (f != nullptr) std::printf("[ fault    ] FARMEM_REGIONS_FAULT=%s\n", f);
    Mount("exclusive", 16ull << 20);  // flagless: memory://regions, exclusive
  }
};

TEST_F(ExclusiveMountTest, ASecondMountOfTheNamespaceIsRefused) {
  for (auto sharing : {RegionFsOptions::Sharing::kAuto, RegionFsOptions::Sharing::kShared}) {
    std::string tmpl = "/tmp/farmem-second.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    RegionFsOptions o;
    o.mountpoint = tmpl;
    o.memory_bytes = 16ull << 20;
    o.threads = 1;
    o.sharing = sharing;
    std::promise<void> ready;
    auto served = ready.get_future();
    o.on_ready = [&ready] { ready.set_value(); };
    auto result = std::async(std::launch::async, [o] { return RunRegionFs(o); });
    // Mounted (ready) or refused (RunRegionFs returned), whichever comes first: a refusal
    // returns at once, so the test does not wait out the deadline when it passes.
    bool mounted = false;
    for (auto until = std::chrono::steady_clock::now() + 10s;
         std::chrono::steady_clock::now() < until;) {
      if (served.wait_for(10ms) == std::future_status::ready) {
        mounted = true;
        break;
      }
      if (result.wait_for(0s) == std::future_status::ready) break;
    }
    if (mounted) {
      // Let in: unmount it again so the test can end.
      (void)std::system(("fusermount3 -u " + tmpl + " 2>/dev/null").c_str());
    }
    Status st = result.get();
    rmdir(tmpl.c_str());
    EXPECT_FALSE(mounted) << "a second mount (sharing " << static_cast<int>(sharing)
                          << ") of an exclusively mounted namespace was let in";
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("mounted already"), std::string::npos) << st.ToString();
  }
}

}  // namespace
}  // namespace farmem
