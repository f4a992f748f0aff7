// A TieredClient killed (SIGKILL) with 64 reads and writes in flight against a real tiered
// farmemd (a child process; server/adversarial's Farmemd handle): afterwards farmemd keeps
// serving, holds nothing for the dead client (no tier RPC in flight, no quarantined frame, every
// frame accounted for, no session, its connections gone) and the next promotion round completes.
// The client is this test binary again (fork + exec of /proc/self/exe running the disabled test
// DISABLED_DoomedClientProcess), so it starts as a fresh process whatever ran before.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/client.h"
#include "farmem/tier.h"
#include "server/adversarial/adversarial_test_util.h"
#include "tier/engine/tier_test_util.h"

namespace farmem::tier {
namespace {

using adversarial::Farmemd;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr uint64_t kUnitKib = 64;
constexpr int kLanes = 64;  // operations in flight in the killed client

NodeConfig ClientConfig(const std::string& name) {
  return node::testing::MakeConfig("tcp", name, std::string(adversarial::kToken));
}

// One lane of the doomed client: reads and writes (one in three) of 1 B - 64 KiB at random
// offsets, one after another, forever; `done` counts completed operations.
Task<void> Lane(Scheduler& sched, TieredClient& c, uint64_t seed, std::atomic<uint64_t>& done) {
  std::mt19937_64 rng(seed);
  const uint64_t cap = c.info().capacity;
  std::vector<std::byte> buf(64 << 10, std::byte{0x42});
  for (;;) {
    const size_t len = 1 + rng() % buf.size();
    const uint64_t off = rng() % (cap - len + 1);
    const std::span<std::byte> part(buf.data(), len);
    if (rng() % 3 == 0) {
      (void)co_await c.write(sched, off, part);
    } else {
      (void)co_await c.read(sched, off, part);
    }
    done.fetch_add(1, std::memory_order_relaxed);
  }
}

// The child: connects, keeps kLanes operations in flight, writes one byte to `ready_fd` once
// every lane has completed a few, and goes on until it is killed. Exits 2 on a setup failure.
[[noreturn]] void RunDoomedClient(const std::string& bootstrap, int ready_fd) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  auto node = Node::Create(ClientConfig("tier-doomed"));
  if (!node.ok() || !(*node)->start().ok()) ::_exit(2);
  auto client = TieredClient::Connect(**node, bootstrap);
  if (!client.ok()) ::_exit(2);
  auto sched = (*node)->make_scheduler();
  if (!sched.ok()) ::_exit(2);
  std::atomic<uint64_t> done{0};
  for (int l = 0; l < kLanes; ++l) (*sched)->spawn(Lane(**sched, **client, 1000 + l, done));
  // A watcher tells the parent from a thread of its own (the scheduler thread runs the lanes).
  std::thread watcher([&] {
    while (done.load() < 4 * kLanes) std::this_thread::sleep_for(1ms);
    const char r = 'r';
    (void)!::write(ready_fd, &r, 1);
  });
  (void)(*sched)->run(24h);
  ::_exit(3);  // unreachable: the lanes never end
}

constexpr int kReadyFd = 100;
constexpr const char* kBootstrapEnv = "FARMEM_TIER_DOOMED_CLIENT_OF";
constexpr const char* kDoomedTest = "TierKilledClient.DISABLED_DoomedClientProcess";

// The doomed client's process (started by the test below; skipped when run by hand).
TEST(TierKilledClient, DISABLED_DoomedClientProcess) {
  const char* bootstrap = std::getenv(kBootstrapEnv);
  if (bootstrap == nullptr) GTEST_SKIP() << "the client process of the test below";
  RunDoomedClient(bootstrap, kReadyFd);
}

struct Stat {
  json doc;
  const json& tier() const { return doc["tier"]; }
};

TEST(TierKilledClient, SixtyFourOperationsInFlightLeaveNothingBehind) {
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  // 8 MiB of 64 KiB units (128), 2 MiB of DRAM (32 frames), a period every 100 ms.
  auto d = Farmemd::Start(
      {{"--tier-file", dir.File("tier.data"), "--tier-capacity-mib", "8", "--tier-dram-mib", "2",
        "--tier-unit-kib", std::to_string(kUnitKib), "--tier-period-ms", "100"}});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  Farmemd& farmemd = **d;

  // The client: this binary again, running only DISABLED_DoomedClientProcess, which writes one
  // byte to descriptor kReadyFd once its operations run. Everything is built before fork: the
  // child calls only dup2 and execve.
  int pipefd[2];
  ASSERT_EQ(::pipe2(pipefd, O_CLOEXEC), 0);
  std::string self = "/proc/self/exe", filter = "--gtest_filter=" + std::string(kDoomedTest),
              disabled = "--gtest_also_run_disabled_tests",
              env_bootstrap = std::string(kBootstrapEnv) + "=" + farmemd.bootstrap();
  std::vector<char*> argv{self.data(), filter.data(), disabled.data(), nullptr};
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
  envp.push_back(env_bootstrap.data());
  envp.push_back(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::dup2(pipefd[1], kReadyFd);  // dup2 clears O_CLOEXEC on the copy
    ::execve(self.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  pollfd p{pipefd[0], POLLIN, 0};
  const int ready = ::poll(&p, 1, 60000);
  char r = 0;
  const bool running = ready == 1 && ::read(pipefd[0], &r, 1) == 1;
  ::close(pipefd[0]);
  if (!running) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    FAIL() << "the client did not start its operations within 60 s; farmemd stderr: "
           << farmemd.stderr_tail();
  }

  // Our own STAT reader (a RawClient on a node of its own).
  auto node = Node::Create(ClientConfig("tier-observer"));
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE((*node)->start().ok());
  auto raw = RawClient::Connect(**node, farmemd.bootstrap());
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  auto stat = [&]() -> Stat {
    auto s = (*raw)->stats_json();
    if (!s.ok()) {
      ADD_FAILURE() << "STAT: " << s.status().ToString();
      return Stat{json::object({{"tier", json::object()}})};
    }
    return Stat{json::parse(*s)};
  };
  // Kill while farmemd is serving the doomed client (its 64 lanes keep 64 operations in flight
  // at every instant): two STATs in a row show its tier RPCs still arriving.
  auto tier_calls = [&] {
    const Stat st = stat();
    const json& rpc = st.doc["rpc"];
    uint64_t n = 0;
    for (const char* op : {"tier_read", "tier_write"}) {
      if (rpc.contains(op)) n += rpc[op]["calls"].get<uint64_t>();
    }
    return n;
  };
  const uint64_t calls_before = tier_calls();
  const uint64_t conns_before = stat().doc["limits"]["tcp"]["open_connections"].get<uint64_t>();
  const auto active_by = Clock::now() + 30s;
  uint64_t calls_at_kill = calls_before;
  while (calls_at_kill == calls_before && Clock::now() < active_by) calls_at_kill = tier_calls();
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
      << "the client ended by itself (status " << wstatus << ")";
  std::printf("[ measure  ] killed the client after %llu tier RPCs, still arriving\n",
              static_cast<unsigned long long>(calls_at_kill));
  EXPECT_GT(calls_at_kill, calls_before) << "the client's RPCs had stopped before the kill";

  // Nothing left behind: no tier RPC in flight, no frame in quarantine, every frame accounted
  // for, no session, the dead client's connections closed, no reply queued for it.
  Stat s;
  const auto deadline = Clock::now() + 15s;
  for (;;) {
    s = stat();
    const json& t = s.tier();
    const bool idle =
        t.value("rpc_in_flight", int64_t{-1}) == 0 &&
        t.value("quarantined_frames", uint64_t{1}) == 0 &&
        t.value("resident_units", uint64_t{0}) + t.value("free_frames", uint64_t{0}) ==
            t.value("budget_units", uint64_t{1});
    if (idle || Clock::now() > deadline) break;
    std::this_thread::sleep_for(50ms);
  }
  ::waitpid(farmemd.pid(), nullptr, WNOHANG);
  ASSERT_EQ(::kill(farmemd.pid(), 0), 0) << "farmemd died; stderr: " << farmemd.stderr_tail();
  const json& t = s.tier();
  EXPECT_EQ(t["rpc_in_flight"], 0) << t.dump();
  EXPECT_EQ(t["quarantined_frames"], 0) << t.dump();
  EXPECT_EQ(t["resident_units"].get<uint64_t>() + t["free_frames"].get<uint64_t>(),
            t["budget_units"].get<uint64_t>())
      << t.dump();
  EXPECT_LE(t["resident_units"].get<uint64_t>(), t["budget_units"].get<uint64_t>());
  EXPECT_EQ(s.doc["sessions"]["open"], 1) << "only the observer's session: " << s.doc["sessions"];
  const json& tcp = s.doc["limits"]["tcp"];
  EXPECT_LT(tcp["open_connections"].get<uint64_t>(), conns_before)
      << "the dead client's connections are still open: " << tcp.dump();
  EXPECT_EQ(tcp["queued_reply_bytes"], 0) << tcp.dump();
  std::printf("[ measure  ] open connections %llu before the kill, %llu after\n",
              static_cast<unsigned long long>(conns_before),
              static_cast<unsigned long long>(tcp["open_connections"].get<uint64_t>()));

  // farmemd keeps serving: a new client writes and reads back across units.
  auto tc = TieredClient::Connect(**node, farmemd.bootstrap());
  ASSERT_TRUE(tc.ok()) << tc.status().ToString();
  TieredClient& c = **tc;
  std::mt19937_64 rng(5);
  std::vector<std::byte> data(200 << 10), back(200 << 10);
  for (auto& b : data) b = static_cast<std::byte>(rng());
  ASSERT_TRUE(c.write(3 * (kUnitKib << 10) + 17, data).ok());
  ASSERT_TRUE(c.read(3 * (kUnitKib << 10) + 17, back).ok());
  EXPECT_EQ(back, data);

  // The next promotion round completes: make one unit the only hot one; the period promotes it.
  // The hot unit changes every round (100, 101, ...): the dead client's random accesses may have
  // left unit 100 resident already, and a resident unit is never promoted again.
  const uint64_t promotions = s.tier()["promotions"].get<uint64_t>();
  const uint64_t periods = s.tier()["periods"].get<uint64_t>();
  const uint64_t period_errors = s.tier()["period_errors"].get<uint64_t>();
  std::vector<std::byte> small(64);
  bool promoted = false;
  const auto promote_by = Clock::now() + 20s;
  for (uint64_t round = 0; !promoted && Clock::now() < promote_by; ++round) {
    const uint64_t hot = (100 + round % 20) * (kUnitKib << 10);
    for (int i = 0; i < 500; ++i) ASSERT_TRUE(c.read(hot + 64 * (i % 1000), small).ok());
    ASSERT_TRUE(c.refresh().ok());
    std::this_thread::sleep_for(150ms);
    const json after = stat().tier();
    promoted = after["promotions"].get<uint64_t>() > promotions &&
               after["periods"].get<uint64_t>() > periods &&
               after["period_errors"].get<uint64_t>() == period_errors;
  }
  const json last = stat().tier();
  EXPECT_TRUE(promoted) << "no promotion round completed after the kill: " << last.dump();
  std::printf("[ measure  ] after the kill: promotions %llu -> %llu, periods %llu -> %llu\n",
              static_cast<unsigned long long>(promotions),
              static_cast<unsigned long long>(last["promotions"].get<uint64_t>()),
              static_cast<unsigned long long>(periods),
              static_cast<unsigned long long>(last["periods"].get<uint64_t>()));
  tc->reset();
  raw->reset();
  (*node)->stop();
}

}  // namespace
}  // namespace farmem::tier
