// Cluster behaviour that needs control over the store, hence memory:// only: outages (calls by
// their deadline, membership surviving or re-joining, watches resuming), compaction, and a stress
// test of watchers against concurrent writers.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "cluster/cluster_test_util.h"
#include "cluster/memory_backend.h"
#include "farmem/cluster.h"

namespace farmem::cluster {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using testing::EventLog;
using testing::UniqueName;
using testing::WaitUntil;
using Clock = std::chrono::steady_clock;
using Type = ClusterMemberEvent::Type;

class ClusterOutage : public ::testing::Test {
 protected:
  void SetUp() override { store_ = UniqueName("store"); }
  void TearDown() override { SetMemoryStoreAvailable(store_, true); }

  ClusterOptions Options(milliseconds ttl = 5000ms) const {
    ClusterOptions o;
    o.url = "memory://" + store_;
    o.cluster_name = "outage";
    o.create_if_missing = true;
    o.lease_ttl = ttl;
    o.call_timeout = 300ms;
    return o;
  }
  std::unique_ptr<Cluster> Open(milliseconds ttl = 5000ms) {
    auto c = Cluster::Open(Options(ttl));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  static ClusterMember Member(std::string name) {
    ClusterMember m;
    m.name = std::move(name);
    m.address = "127.0.0.1:1";
    return m;
  }
  void Outage(bool down, bool hang = false) { SetMemoryStoreAvailable(store_, !down, hang); }

  std::string store_;
};

TEST_F(ClusterOutage, CallsReturnUnavailableByTheirDeadline) {
  auto c = Open();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->put("k", "v").ok());
  for (bool hang : {false, true}) {
    Outage(true, hang);
    auto check = [&](const char* what, const Status& st, Clock::time_point start) {
      auto took = Clock::now() - start;
      EXPECT_EQ(st.code(), Code::kUnavailable) << what << ": " << st.ToString();
      EXPECT_LT(took, 300ms + 500ms) << what;
    };
    auto st = [](const auto& r) { return r.ok() ? Status::OK() : r.status(); };
    auto t = Clock::now();
    check("get", st(c->get("k")), t);
    t = Clock::now();
    check("put", st(c->put("k", "w")), t);
    t = Clock::now();
    check("put_if", st(c->put_if("k", "w", 0)), t);
    t = Clock::now();
    check("remove", c->remove("k"), t);
    t = Clock::now();
    check("list", st(c->list("")), t);
    t = Clock::now();
    check("revision", st(c->revision()), t);
    t = Clock::now();
    check("members", st(c->members()), t);
    t = Clock::now();
    check("join", c->join(Member("m")), t);
    t = Clock::now();
    auto opened = Cluster::Open(Options());
    check("open", st(opened), t);
    EXPECT_NE(opened.status().message().find("memory://" + store_), std::string_view::npos)
        << opened.status().ToString();
  }
  Outage(false);
  EXPECT_EQ(c->get("k")->value, "v");  // nothing was written while down
  EXPECT_FALSE(c->joined());
  std::string stats = c->stats_json();
  EXPECT_EQ(stats.find("\"failures\":0"), std::string::npos) << stats;
}

TEST_F(ClusterOutage, MemberSurvivesOutageShorterThanTtl) {
  auto watcher = Open();
  auto member = Open(1200ms);
  ASSERT_TRUE(watcher && member);
  EventLog<Type> log;
  auto w = watcher->watch_members([&](const ClusterMemberEvent& e) { log.Add(e.type); });
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(member->join(Member("steady")).ok());
  ASSERT_TRUE(log.WaitForCount(1, 5s));
  std::this_thread::sleep_for(500ms);  // a few renewals
  Outage(true);
  std::this_thread::sleep_for(600ms);
  Outage(false);
  std::this_thread::sleep_for(1500ms);  // past the TTL: had it not renewed, it would be gone
  EXPECT_EQ(log.Get(), (std::vector<Type>{Type::kJoin}));
  auto ms = watcher->members();
  ASSERT_TRUE(ms.ok());
  ASSERT_EQ(ms->size(), 1u);
  std::string stats = member->stats_json();
  EXPECT_NE(stats.find("\"rejoins\":0"), std::string::npos) << stats;
  EXPECT_EQ(stats.find("\"keepalives\":0,"), std::string::npos) << stats;
}

TEST_F(ClusterOutage, MemberExpiresDuringLongOutageThenRejoins) {
  auto watcher = Open();
  auto member = Open(600ms);
  ASSERT_TRUE(watcher && member);
  EventLog<Type> log;
  auto w = watcher->watch_members([&](const ClusterMemberEvent& e) { log.Add(e.type); });
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(member->join(Member("phoenix")).ok());
  ASSERT_TRUE(member->put("owned/by-phoenix", "data", {.bind_to_lease = true}).ok());
  ASSERT_TRUE(member->put("owned/gone", "data", {.bind_to_lease = true}).ok());
  ASSERT_TRUE(member->remove("owned/gone").ok());  // forgotten: must not come back
  ASSERT_TRUE(log.WaitForCount(1, 5s));
  Outage(true, /*hang=*/true);
  std::this_thread::sleep_for(1500ms);  // > TTL: the store expires the lease meanwhile
  EXPECT_EQ(log.size(), 1u) << "a watch delivered during the outage";
  Outage(false);
  ASSERT_TRUE(log.WaitForCount(3, 5s));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(log.Get(), (std::vector<Type>{Type::kJoin, Type::kExpire, Type::kJoin}));
  EXPECT_TRUE(member->joined());
  ASSERT_TRUE(WaitUntil([&] { return watcher->get("owned/by-phoenix").ok(); }, 3s));
  auto kv = watcher->get("owned/by-phoenix");
  EXPECT_TRUE(kv->bound_to_lease);
  EXPECT_EQ(kv->value, "data");
  EXPECT_EQ(watcher->get("owned/gone").status().code(), Code::kNotFound);
  std::string stats = member->stats_json();
  EXPECT_NE(stats.find("\"rejoins\":1"), std::string::npos) << stats;
  // The new lease is alive and renewed: still there well past another TTL.
  std::this_thread::sleep_for(1200ms);
  EXPECT_EQ(watcher->members()->size(), 1u);
  ASSERT_TRUE(member->leave().ok());
  ASSERT_TRUE(log.WaitForCount(4, 5s));
  EXPECT_EQ(log.Get().back(), Type::kLeave);
  EXPECT_EQ(watcher->get("owned/by-phoenix").status().code(), Code::kNotFound);
}

// Changes made while the store is unreachable (here: a lease expiring) are delivered after it
// returns, each once, in order, with everything before and after.
TEST_F(ClusterOutage, WatchResumesWithoutMissingOrRepeating) {
  auto c = Open();
  auto holder = Open(500ms);
  ASSERT_TRUE(c && holder);
  auto start = c->revision();
  ASSERT_TRUE(start.ok());
  EventLog<int64_t> log;
  auto w = c->watch("r/", 0, [&](const ClusterWatchEvent& e) { log.Add(e.kv.mod_revision); });
  ASSERT_TRUE(w.ok());
  std::vector<int64_t> expected;
  for (int i = 0; i < 10; ++i) expected.push_back(*c->put("r/" + std::to_string(i), "v"));
  ASSERT_TRUE(holder->join(Member("holder")).ok());
  for (int i = 0; i < 3; ++i) {
    expected.push_back(*holder->put("r/leased" + std::to_string(i), "v", {.bind_to_lease = true}));
  }
  ASSERT_TRUE(log.WaitForCount(expected.size(), 5s));
  Outage(true);
  std::this_thread::sleep_for(1200ms);  // the holder's lease expires: 3 deletes, one revision
  size_t during = log.size();
  Outage(false);
  // The holder is back too (re-join re-puts its keys): let it settle before the final writes.
  ASSERT_TRUE(WaitUntil([&] { return holder->get("r/leased2").ok(); }, 5s));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c->put("r/after" + std::to_string(i), "v").ok());
  auto end = c->revision();
  ASSERT_TRUE(end.ok());
  // Every committed change under r/, from the store's own view: list() after + what was deleted.
  ASSERT_TRUE(WaitUntil([&] { return !log.Get().empty() && log.Get().back() == *end; }, 5s));
  auto got = log.Get();
  EXPECT_EQ(during, expected.size()) << "a watch delivered during the outage";
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
  // 3 deletes share the expiry revision; everything else is one event per revision.
  std::set<int64_t> distinct(got.begin(), got.end());
  EXPECT_EQ(got.size(), distinct.size() + 2) << "an event missing or repeated";
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), got.begin()));
  EXPECT_EQ(got.size(), expected.size() + 3 /*expiry*/ + 3 /*re-put*/ + 5);
}

TEST_F(ClusterOutage, CompactedStartRevisionCallsOnErrorOnce) {
  auto c = Open();
  ASSERT_TRUE(c);
  int64_t first = *c->put("h/a", "1");
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c->put("h/b", std::to_string(i)).ok());
  CompactMemoryStore(store_, *c->revision());
  EventLog<Status> errors;
  std::atomic<int> events{0};
  auto w = c->watch(
      "h/", first, [&](const ClusterWatchEvent&) { events.fetch_add(1); },
      [&](const Status& st) { errors.Add(st); });
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(errors.WaitForCount(1, 3s));
  ASSERT_TRUE(c->put("h/c", "after").ok());
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(errors.size(), 1u);
  EXPECT_EQ(events.load(), 0);
  EXPECT_EQ(errors.Get()[0].code(), Code::kFailedPrecondition);
  EXPECT_NE(errors.Get()[0].message().find("compacted"), std::string_view::npos);
}

// Writers race put_if/remove on shared keys while watchers (started before, and one started
// mid-way from the initial revision) follow: each watcher sees exactly the committed revisions.
TEST_F(ClusterOutage, WatchersSeeEveryCommittedRevisionStress) {
  auto c = Open();
  ASSERT_TRUE(c);
  constexpr int kWriters = 4;
  constexpr int kOpsEach = 300;
  int64_t start = *c->revision();
  std::vector<std::unique_ptr<EventLog<int64_t>>> logs;
  std::vector<std::unique_ptr<ClusterWatch>> watches;
  auto add_watch = [&] {
    logs.push_back(std::make_unique<EventLog<int64_t>>());
    auto* log = logs.back().get();
    auto w = c->watch("s/", start + 1,
                      [log](const ClusterWatchEvent& e) { log->Add(e.kv.mod_revision); });
    ASSERT_TRUE(w.ok());
    watches.push_back(std::move(*w));
  };
  for (int i = 0; i < 3; ++i) add_watch();
  std::mutex mu;
  std::vector<int64_t> committed;
  std::atomic<int> unexpected{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < kWriters; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; i < kOpsEach; ++i) {
        std::string key = "s/" + std::to_string((i + t) % 7);
        int64_t rev = 0;
        if ((i + t) % 3 == 0) {
          auto kv = c->get(key);
          if (kv.ok()) {
            auto r = c->remove(key);
            if (r.ok()) {
              // remove() returns no revision: find the delete among the watchers' later.
              rev = -1;
            } else if (r.code() != Code::kNotFound) {
              unexpected.fetch_add(1);
            }
          }
        } else {
          auto kv = c->get(key);
          int64_t expected = kv.ok() ? kv->mod_revision : 0;
          auto r = c->put_if(key, std::to_string(t), expected);
          if (r.ok()) {
            rev = *r;
          } else if (r.status().code() != Code::kFailedPrecondition) {
            unexpected.fetch_add(1);
          }
        }
        if (rev != 0) {
          std::lock_guard l(mu);
          committed.push_back(rev);
        }
      }
    });
  }
  std::this_thread::sleep_for(20ms);
  add_watch();  // joins mid-way: replays from the start, then follows live
  for (auto& w : writers) w.join();
  EXPECT_EQ(unexpected.load(), 0);
  int64_t end = *c->revision();
  // Only the writers write, so every revision in (start, end] is one of their changes.
  std::vector<int64_t> all;
  for (int64_t r = start + 1; r <= end; ++r) all.push_back(r);
  size_t puts = std::count_if(committed.begin(), committed.end(), [](int64_t r) { return r > 0; });
  size_t removes = committed.size() - puts;
  ASSERT_EQ(all.size(), puts + removes);
  for (auto& log : logs) {
    ASSERT_TRUE(log->WaitForCount(all.size(), 20s)) << log->size() << " of " << all.size();
  }
  std::this_thread::sleep_for(200ms);
  for (size_t i = 0; i < logs.size(); ++i) {
    EXPECT_EQ(logs[i]->Get(), all) << "watcher " << i;
  }
  watches.clear();
}

}  // namespace
}  // namespace farmem::cluster
