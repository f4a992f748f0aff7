// The client's check for libfabric shm without CMA (tier/client/shm_cma.h): the server pid from a
// fabric address, FI_SHM_DISABLE_CMA, and a process without ptrace permission (a child that drops
// to another uid) — there TieredClient must read by TIER_READ only. Test thread (and its child).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tier/client/shm_cma.h"
#include "tier/service/tier_service_test_util.h"

namespace farmem::tier {
namespace {

TEST(TierShmCma, ServerPidComesFromTheFabricAddress) {
  EXPECT_EQ(ShmServerPid("66695f73686d3a2f2f00.29498.3.6602656910973280129"), 29498);
  EXPECT_EQ(ShmServerPid("66695f73686d3a2f2f00.77"), 77);
  EXPECT_EQ(ShmServerPid("66695f73686d3a2f2f00"), 0);
  EXPECT_EQ(ShmServerPid("66695f73686d3a2f2f00.x.3.4"), 0);
  EXPECT_EQ(ShmServerPid("66695f73686d3a2f2f00.-5.3.4"), 0);
  EXPECT_EQ(ShmServerPid("66695f73686d3a2f2f00.12x.3"), 0);
}

TEST(TierShmCma, DisabledByTheEnvironmentOrWithoutPtracePermission) {
  const int self = static_cast<int>(::getpid());
  EXPECT_TRUE(ShmUsesCma(self, nullptr));
  EXPECT_TRUE(ShmUsesCma(self, "0"));
  EXPECT_TRUE(ShmUsesCma(self, "off"));
  for (const char* on : {"1", "yes", "TRUE", "On"}) EXPECT_FALSE(ShmUsesCma(self, on)) << on;
  EXPECT_FALSE(ShmUsesCma(0, nullptr));
  // A process of another uid without CAP_SYS_PTRACE may not read ours: no CMA. As root, a child
  // drops to nobody; otherwise pid 1 (another uid's process) is the server.
  if (::geteuid() != 0) {
    EXPECT_FALSE(ShmUsesCma(1, nullptr));
    return;
  }
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    ::_exit(ShmUsesCma(static_cast<int>(::getppid()), nullptr) ? 1 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 2) << "could not drop to uid 65534";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "a process without ptrace permission was said to use CMA";
}

TEST(TierShmCma, ClientOnShmWithoutCmaReadsByRpcAndReadsRight) {
  auto env = testing::TierEnv::Start("fabric:shm", 16, 2);
  ASSERT_TRUE(env->service);
  auto with_cma = env->Connect();
  ASSERT_TRUE(with_cma.ok()) << with_cma.status().ToString();
  EXPECT_TRUE((*with_cma)->info().one_sided);
  // The variable as libfabric would see it at start (the transport reads it once, so the
  // rest of this process is not affected; only the client's check is).
  ::setenv("FI_SHM_DISABLE_CMA", "1", 1);
  auto without = env->Connect();
  ::unsetenv("FI_SHM_DISABLE_CMA");
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  TieredClient& c = **without;
  EXPECT_FALSE(c.info().one_sided);
  ASSERT_TRUE(env->service->store().Promote(0).ok());
  std::vector<std::byte> data(5000, std::byte{0x3c}), back(5000);
  ASSERT_TRUE(c.write(100, data).ok());
  ASSERT_TRUE(c.read(100, back).ok());
  EXPECT_EQ(back, data);
  EXPECT_EQ(c.stats().one_sided_reads, 0u);
  EXPECT_GT(c.stats().rpc_reads, 0u);
}

}  // namespace
}  // namespace farmem::tier
