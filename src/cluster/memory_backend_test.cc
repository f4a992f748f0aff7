// The memory:// backend on its own: revisions, leases and their expiry, the shared registry,
// watch history/compaction and the outage hook (SetMemoryStoreAvailable).
#include <gtest/gtest.h>

#include "cluster/backend.h"
#include "cluster/cluster_test_util.h"
#include "cluster/memory_backend.h"

namespace farmem::cluster {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using testing::EventLog;
using testing::Soon;
using testing::UniqueName;

std::unique_ptr<ClusterBackend> OpenStore(const std::string& name) {
  auto b = OpenMemoryBackend(name, ClusterOptions{});
  EXPECT_TRUE(b.ok());
  return std::move(*b);
}

TEST(MemoryBackend, RevisionsLikeEtcd) {
  auto b = OpenStore(UniqueName());
  EXPECT_EQ(*b->revision(Soon()), 1);
  auto r = b->put("/k", "v", 0, std::nullopt, Soon());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 2);
  auto kv = b->get("/k", Soon());
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(kv->create_revision, 2);
  EXPECT_EQ(kv->mod_revision, 2);
  EXPECT_EQ(*b->put("/k", "w", 0, 2, Soon()), 3);
  EXPECT_EQ(b->put("/k", "x", 0, 2, Soon()).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(b->put("/k", "x", 0, 0, Soon()).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(*b->remove("/k", Soon()), 4);
  EXPECT_EQ(b->remove("/k", Soon()).status().code(), Code::kNotFound);
  EXPECT_EQ(*b->revision(Soon()), 4);
}

TEST(MemoryBackend, SameNameSharesStoreWhileHeld) {
  std::string name = UniqueName();
  auto a = OpenStore(name);
  auto b = OpenStore(name);
  auto other = OpenStore(UniqueName("other"));
  ASSERT_TRUE(a->put("/k", "v", 0, std::nullopt, Soon()).ok());
  EXPECT_EQ(b->get("/k", Soon())->value, "v");
  EXPECT_EQ(other->get("/k", Soon()).status().code(), Code::kNotFound);
  a.reset();
  b.reset();
  // The last holder is gone, and so is the store.
  auto c = OpenStore(name);
  EXPECT_EQ(c->get("/k", Soon()).status().code(), Code::kNotFound);
  EXPECT_EQ(*c->revision(Soon()), 1);
}

TEST(MemoryBackend, LeaseExpiryDeletesAllItsKeysInOneRevision) {
  auto b = OpenStore(UniqueName());
  auto lease = b->lease_grant(300ms, Soon());
  ASSERT_TRUE(lease.ok());
  for (const char* k : {"/l/a", "/l/b", "/l/c"}) {
    ASSERT_TRUE(b->put(k, "v", *lease, std::nullopt, Soon()).ok());
  }
  ASSERT_TRUE(b->put("/l/free", "v", 0, std::nullopt, Soon()).ok());
  EXPECT_EQ(b->put("/l/x", "v", 424242, std::nullopt, Soon()).status().code(), Code::kNotFound);
  EventLog<BackendEvent> log;
  auto w = b->watch("/l/", 0,
                    [&](const std::vector<BackendEvent>& evs) {
                      for (const auto& e : evs) log.Add(e);
                    },
                    {});
  ASSERT_TRUE(w.ok());
  auto left = b->lease_time_left(*lease, Soon());
  ASSERT_TRUE(left.ok());
  EXPECT_GT(left->count(), 0);
  EXPECT_LE(*left, 300ms);
  ASSERT_TRUE(log.WaitForCount(3, 2s));
  auto got = log.Get();
  for (const auto& e : got) {
    EXPECT_TRUE(e.is_delete);
    EXPECT_EQ(e.kv.mod_revision, got[0].kv.mod_revision);
  }
  EXPECT_EQ(b->range("/l/", Soon())->kvs.size(), 1u);
  EXPECT_EQ(b->lease_keepalive(*lease, Soon()).status().code(), Code::kNotFound);
  EXPECT_EQ(b->lease_time_left(*lease, Soon()).status().code(), Code::kNotFound);
  EXPECT_EQ(b->lease_revoke(*lease, Soon()).code(), Code::kNotFound);
}

TEST(MemoryBackend, KeepaliveExtendsAndRevokeDeletes) {
  auto b = OpenStore(UniqueName());
  auto lease = b->lease_grant(300ms, Soon());
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(b->put("/k", "v", *lease, std::nullopt, Soon()).ok());
  for (int i = 0; i < 6; ++i) {
    std::this_thread::sleep_for(100ms);
    auto ka = b->lease_keepalive(*lease, Soon());
    ASSERT_TRUE(ka.ok()) << i;
    EXPECT_EQ(*ka, 300ms);
  }
  EXPECT_TRUE(b->get("/k", Soon()).ok());  // 600 ms > TTL, kept alive
  // Rebinding a key to no lease takes it out of the lease's reach.
  ASSERT_TRUE(b->put("/unbound", "v", *lease, std::nullopt, Soon()).ok());
  ASSERT_TRUE(b->put("/unbound", "v", 0, std::nullopt, Soon()).ok());
  ASSERT_TRUE(b->lease_revoke(*lease, Soon()).ok());
  EXPECT_EQ(b->get("/k", Soon()).status().code(), Code::kNotFound);
  EXPECT_TRUE(b->get("/unbound", Soon()).ok());
}

TEST(MemoryBackend, UnavailableCallsReturnByTheirDeadline) {
  std::string name = UniqueName();
  auto b = OpenStore(name);
  auto lease = b->lease_grant(10s, Soon());
  ASSERT_TRUE(lease.ok());
  for (bool hang : {false, true}) {
    SetMemoryStoreAvailable(name, false, hang);
    auto check = [&](const char* what, auto&& call) {
      auto start = Clock::now();
      Status st = call(start + 200ms);
      auto took = Clock::now() - start;
      EXPECT_EQ(st.code(), Code::kUnavailable) << what;
      EXPECT_LT(took, 700ms) << what;
      if (hang) {
        EXPECT_GE(took, 190ms) << what << ": a hung store answers nothing before its deadline";
      }
    };
    auto status = [](const auto& r) { return r.ok() ? Status::OK() : r.status(); };
    check("get", [&](auto d) { return status(b->get("/k", d)); });
    check("range", [&](auto d) { return status(b->range("/", d)); });
    check("put", [&](auto d) { return status(b->put("/k", "v", 0, std::nullopt, d)); });
    check("remove", [&](auto d) { return status(b->remove("/k", d)); });
    check("revision", [&](auto d) { return status(b->revision(d)); });
    check("grant", [&](auto d) { return status(b->lease_grant(1s, d)); });
    check("keepalive", [&](auto d) { return status(b->lease_keepalive(*lease, d)); });
    check("time_left", [&](auto d) { return status(b->lease_time_left(*lease, d)); });
    check("revoke", [&](auto d) { return b->lease_revoke(*lease, d); });
  }
  SetMemoryStoreAvailable(name, true);
  EXPECT_TRUE(b->revision(Soon()).ok());
  EXPECT_TRUE(b->lease_keepalive(*lease, Soon()).ok());
}

TEST(MemoryBackend, CompactedStartRevisionErrorsOnce) {
  std::string name = UniqueName();
  auto b = OpenStore(name);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(b->put("/c", "v", 0, std::nullopt, Soon()).ok());
  CompactMemoryStore(name, 5);
  EventLog<Status> errors;
  std::atomic<int> events{0};
  auto w = b->watch(
      "/c", 2, [&](const std::vector<BackendEvent>&) { events.fetch_add(1); },
      [&](const Status& st) { errors.Add(st); });
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(errors.WaitForCount(1, 2s));
  ASSERT_TRUE(b->put("/c", "after", 0, std::nullopt, Soon()).ok());
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(errors.size(), 1u);
  EXPECT_EQ(events.load(), 0);
  EXPECT_EQ(errors.Get()[0].code(), Code::kFailedPrecondition);
  EXPECT_NE(errors.Get()[0].message().find("compacted"), std::string_view::npos);
  // From the compaction revision on, history is still there.
  EventLog<int64_t> revs;
  auto ok = b->watch("/c", 5,
                     [&](const std::vector<BackendEvent>& evs) {
                       for (const auto& e : evs) revs.Add(e.kv.mod_revision);
                     },
                     {});
  ASSERT_TRUE(ok.ok());
  ASSERT_TRUE(revs.WaitForCount(3, 2s));
  EXPECT_EQ(revs.Get(), (std::vector<int64_t>{5, 6, 7}));
}

// A callback that blocks delays only its own watch.
TEST(MemoryBackend, SlowCallbackDoesNotStallOtherWatchesOrTheStore) {
  auto b = OpenStore(UniqueName());
  std::atomic<bool> release{false};
  auto slow = b->watch("/", 0,
                       [&](const std::vector<BackendEvent>&) {
                         testing::WaitUntil([&] { return release.load(); }, 10s);
                       },
                       {});
  ASSERT_TRUE(slow.ok());
  EventLog<int64_t> fast;
  auto w = b->watch("/", 0,
                    [&](const std::vector<BackendEvent>& evs) {
                      for (const auto& e : evs) fast.Add(e.kv.mod_revision);
                    },
                    {});
  ASSERT_TRUE(w.ok());
  auto start = Clock::now();
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(b->put("/k", "v", 0, std::nullopt, Soon()).ok());
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_TRUE(fast.WaitForCount(50, 2s));
  release = true;
}

}  // namespace
}  // namespace farmem::cluster
