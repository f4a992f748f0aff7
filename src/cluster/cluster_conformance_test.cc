// The Cluster contract, run against every backend: memory:// (a fresh store per test) and etcd://
// (one real etcd per test binary, started on first use). Each test uses its own cluster name, so
// tests share the etcd without seeing each other.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <future>
#include <set>

#include "cluster/backend.h"
#include "cluster/cluster_test_util.h"
#include "cluster/cluster_url.h"
#include "cluster/member_codec.h"
#include "cluster/testing/etcd_process.h"
#include "farmem/cluster.h"

namespace farmem::cluster {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using testing::EventLog;
using testing::UniqueName;
using testing::WaitUntil;
using Type = ClusterMemberEvent::Type;

// One etcd for the whole binary: starting one takes about a second, and cluster names keep the
// tests apart. Killed by the static's destructor at exit.
testing::EtcdProcess* SharedEtcd(Status* status) {
  static std::unique_ptr<testing::EtcdProcess> etcd;
  static Status start_status;
  static std::once_flag once;
  std::call_once(once, [] {
    etcd = std::make_unique<testing::EtcdProcess>();
    start_status = etcd->Start();
  });
  *status = start_status;
  return start_status.ok() ? etcd.get() : nullptr;
}

// A key's value, or the error in angle brackets (never aborts the binary on an error Result).
std::string ValueOf(Cluster& c, std::string_view key) {
  auto kv = c.get(key);
  return kv.ok() ? kv->value : "<" + kv.status().ToString() + ">";
}

// The number of live members, or -1 if members() failed.
int MemberCount(Cluster& c) {
  auto ms = c.members();
  return ms.ok() ? static_cast<int>(ms->size()) : -1;
}

class ClusterConformance : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "etcd") {
      if (!testing::EtcdAvailable()) GTEST_SKIP() << testing::EtcdBinary() << " not installed";
      Status st;
      auto* etcd = SharedEtcd(&st);
      ASSERT_NE(etcd, nullptr) << st.ToString();
      url_ = etcd->url();
    } else {
      url_ = "memory://" + UniqueName("store");
    }
    cluster_name_ = UniqueName();
  }

  ClusterOptions Options() const {
    ClusterOptions o;
    o.url = url_;
    o.cluster_name = cluster_name_;
    o.create_if_missing = true;
    o.call_timeout = 5000ms;
    return o;
  }

  std::unique_ptr<Cluster> Open(ClusterOptions o) {
    auto c = Cluster::Open(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::unique_ptr<Cluster> Open() { return Open(Options()); }

  static ClusterMember Member(std::string name, std::string address = "10.0.0.1:7000") {
    ClusterMember m;
    m.name = std::move(name);
    m.address = std::move(address);
    m.roles = {"memory", "client"};
    m.capacity_bytes = 1ull << 30;
    return m;
  }

  std::string url_;
  std::string cluster_name_;
};

TEST_P(ClusterConformance, PutGetRemoveList) {
  auto c = Open();
  ASSERT_TRUE(c);
  auto r0 = c->revision();
  ASSERT_TRUE(r0.ok()) << r0.status().ToString();
  std::vector<std::pair<std::string, std::string>> puts = {
      {"b/2", "two"}, {"a", "x"}, {"b/1", "one"}, {"c", ""}, {"b", "bee"}};
  int64_t last = *r0;
  for (const auto& [k, v] : puts) {
    auto rev = c->put(k, v);
    ASSERT_TRUE(rev.ok()) << rev.status().ToString();
    EXPECT_GT(*rev, last);
    last = *rev;
  }
  auto a = c->get("a");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->key, "a");
  EXPECT_EQ(a->value, "x");
  EXPECT_EQ(a->create_revision, a->mod_revision);
  EXPECT_FALSE(a->bound_to_lease);
  auto empty = c->get("c");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->value, "");

  auto rev = c->put("a", "y");
  ASSERT_TRUE(rev.ok());
  a = c->get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->value, "y");
  EXPECT_EQ(a->mod_revision, *rev);
  EXPECT_LT(a->create_revision, a->mod_revision);

  auto all = c->list("");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  std::vector<std::string> keys;
  for (const auto& kv : *all) keys.push_back(kv.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "b", "b/1", "b/2", "c"}));
  auto bs = c->list("b/");
  ASSERT_TRUE(bs.ok());
  ASSERT_EQ(bs->size(), 2u);
  EXPECT_EQ((*bs)[0].key, "b/1");
  EXPECT_EQ((*bs)[0].value, "one");
  EXPECT_EQ((*bs)[1].key, "b/2");
  auto none = c->list("zzz");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  EXPECT_TRUE(c->remove("b/1").ok());
  EXPECT_EQ(c->get("b/1").status().code(), Code::kNotFound);
  EXPECT_EQ(c->remove("b/1").code(), Code::kNotFound);
  EXPECT_EQ(c->get("never").status().code(), Code::kNotFound);
  EXPECT_EQ(c->remove("never").code(), Code::kNotFound);
  auto after = c->list("b");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->size(), 2u);  // "b" and "b/2"
  auto now = c->revision();
  ASSERT_TRUE(now.ok());
  EXPECT_GT(*now, last);
}

TEST_P(ClusterConformance, ClustersOnOneStoreAreIsolated) {
  auto a = Open();
  ASSERT_TRUE(a);
  auto o = Options();
  o.cluster_name = UniqueName("other");
  auto b = Open(o);
  ASSERT_TRUE(b);
  ASSERT_TRUE(a->put("k", "in-a").ok());
  EXPECT_EQ(b->get("k").status().code(), Code::kNotFound);
  auto bl = b->list("");
  ASSERT_TRUE(bl.ok());
  EXPECT_TRUE(bl->empty());
}

TEST_P(ClusterConformance, PutIfSemantics) {
  auto c = Open();
  ASSERT_TRUE(c);
  auto created = c->put_if("k", "v1", 0);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  auto again = c->put_if("k", "v2", 0);
  EXPECT_EQ(again.status().code(), Code::kFailedPrecondition);
  auto stale = c->put_if("k", "v2", *created - 1);
  EXPECT_EQ(stale.status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(ValueOf(*c, "k"), "v1");
  auto swapped = c->put_if("k", "v3", *created);
  ASSERT_TRUE(swapped.ok()) << swapped.status().ToString();
  EXPECT_EQ(ValueOf(*c, "k"), "v3");
  EXPECT_EQ(c->put_if("k", "v4", *created).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(c->put_if("absent", "v", 5).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(c->get("absent").status().code(), Code::kNotFound);
  EXPECT_EQ(c->put_if("k", "v", -1).status().code(), Code::kInvalidArgument);
}

// commit: every op in one revision when every compare holds, nothing written otherwise.
TEST_P(ClusterConformance, CommitAppliesAllOrNothing) {
  auto c = Open();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->put("a", "1").ok());
  ASSERT_TRUE(c->put("b", "2").ok());
  using Op = ClusterOp;
  const std::vector<Op> ops = {{Op::Type::kPut, "new", "x"},
                               {Op::Type::kRemove, "a", ""},
                               {Op::Type::kPut, "b", "3"},
                               {Op::Type::kRemove, "never-there", ""}};
  // A compare that fails: b is present, not absent; a value that differs; a value of an absent
  // key. Nothing is written.
  for (const auto& cmp : std::vector<std::vector<ClusterCompare>>{
           {{"a", "1"}, {"b", std::nullopt}}, {{"a", "2"}}, {{"nokey", ""}}}) {
    auto r = c->commit(cmp, ops);
    EXPECT_EQ(r.status().code(), Code::kFailedPrecondition) << r.status().ToString();
    EXPECT_EQ(ValueOf(*c, "a"), "1");
    EXPECT_EQ(ValueOf(*c, "b"), "2");
    EXPECT_EQ(c->get("new").status().code(), Code::kNotFound) << "a failed commit wrote";
  }
  auto rev = c->commit({{"a", "1"}, {"new", std::nullopt}}, ops);
  ASSERT_TRUE(rev.ok()) << rev.status().ToString();
  EXPECT_EQ(c->get("a").status().code(), Code::kNotFound);
  auto n = c->get("new");
  auto b = c->get("b");
  ASSERT_TRUE(n.ok() && b.ok());
  EXPECT_EQ(n->value, "x");
  EXPECT_EQ(b->value, "3");
  EXPECT_EQ(n->mod_revision, *rev) << "not one revision";
  EXPECT_EQ(b->mod_revision, *rev) << "not one revision";
  // Refused before anything is sent: a key twice, no ops, a bad key.
  EXPECT_EQ(
      c->commit({}, {{Op::Type::kPut, "d", "1"}, {Op::Type::kRemove, "d", ""}}).status().code(),
      Code::kInvalidArgument);
  EXPECT_EQ(c->commit({}, {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(c->commit({}, {{Op::Type::kPut, "", "1"}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(c->get("d").status().code(), Code::kNotFound);
}

// Exactly one of 8 simultaneous creates wins; the others see FailedPrecondition.
TEST_P(ClusterConformance, PutIfCreateRaceEightThreads) {
  auto c = Open();
  ASSERT_TRUE(c);
  for (int round = 0; round < 5; ++round) {
    std::string key = "race/" + std::to_string(round);
    std::barrier start(8);
    std::atomic<int> wins{0};
    std::atomic<int> lost{0};
    std::atomic<int> winner{-1};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        start.arrive_and_wait();
        auto r = c->put_if(key, std::to_string(t), 0);
        if (r.ok()) {
          wins.fetch_add(1);
          winner.store(t);
        } else if (r.status().code() == Code::kFailedPrecondition) {
          lost.fetch_add(1);
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(wins.load(), 1) << "round " << round;
    EXPECT_EQ(lost.load(), 7) << "round " << round;
    auto v = c->get(key);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(v->value, std::to_string(winner.load()));
  }
}

// Compare-and-set increments from 4 threads: no update is lost.
TEST_P(ClusterConformance, CasCounterConcurrentIncrements) {
  auto c = Open();
  ASSERT_TRUE(c);
  constexpr int kThreads = 4;
  // Enough rounds that the threads' read-modify-write windows really overlap (memory:// is fast).
  const int kEach = GetParam() == "memory" ? 500 : 25;
  std::barrier start(kThreads);
  ASSERT_TRUE(c->put("counter", "0").ok());
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      for (int i = 0; i < kEach; ++i) {
        for (int attempt = 0; attempt < 10000; ++attempt) {
          auto cur = c->get("counter");
          if (!cur.ok()) {
            errors.fetch_add(1);
            return;
          }
          int n = std::stoi(cur->value);
          std::this_thread::yield();  // widen the window another writer can slip into
          auto r = c->put_if("counter", std::to_string(n + 1), cur->mod_revision);
          if (r.ok()) break;
          if (r.status().code() != Code::kFailedPrecondition) {
            errors.fetch_add(1);
            return;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(ValueOf(*c, "counter"), std::to_string(kThreads * kEach));
}

struct Seen {
  ClusterWatchEvent::Type type;
  std::string key;
  std::string value;
  int64_t revision;
};

TEST_P(ClusterConformance, WatchDeliversEveryChangeInOrder) {
  auto c = Open();
  ASSERT_TRUE(c);
  EventLog<Seen> log;
  auto w = c->watch("w/", 0, [&](const ClusterWatchEvent& e) {
    log.Add({e.type, e.kv.key, e.kv.value, e.kv.mod_revision});
  });
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<Seen> expected;
  for (int i = 0; i < 20; ++i) {
    std::string k = "w/" + std::to_string(i % 5);
    if (i % 4 == 3) {
      auto r = c->remove(k);
      if (r.ok()) {
        auto rev = c->revision();  // nobody else writes: the delete's revision
        ASSERT_TRUE(rev.ok());
        expected.push_back({ClusterWatchEvent::Type::kDelete, k, "", *rev});
      }
    } else {
      auto r = c->put(k, "v" + std::to_string(i));
      ASSERT_TRUE(r.ok());
      expected.push_back({ClusterWatchEvent::Type::kPut, k, "v" + std::to_string(i), *r});
    }
    ASSERT_TRUE(c->put("x/" + std::to_string(i), "other prefix").ok());
  }
  ASSERT_TRUE(log.WaitForCount(expected.size(), 10s)) << log.size() << " of " << expected.size();
  std::this_thread::sleep_for(200ms);  // nothing more may come
  auto got = log.Get();
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].type, expected[i].type) << i;
    EXPECT_EQ(got[i].key, expected[i].key) << i;
    EXPECT_EQ(got[i].value, expected[i].value) << i;
    EXPECT_EQ(got[i].revision, expected[i].revision) << i;
  }
}

TEST_P(ClusterConformance, WatchFromPastRevisionReplays) {
  auto c = Open();
  ASSERT_TRUE(c);
  std::vector<int64_t> revs;
  for (int i = 0; i < 5; ++i) {
    auto r = c->put("p/" + std::to_string(i), "v");
    ASSERT_TRUE(r.ok());
    revs.push_back(*r);
  }
  EventLog<int64_t> log;
  auto w = c->watch("p/", revs[1], [&](const ClusterWatchEvent& e) { log.Add(e.kv.mod_revision); });
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(log.WaitForCount(4, 10s));
  auto r = c->put("p/late", "v");
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(log.WaitForCount(5, 10s));
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(log.Get(), (std::vector<int64_t>{revs[1], revs[2], revs[3], revs[4], *r}));
}

TEST_P(ClusterConformance, WatchFromZeroSeesOnlyNewChanges) {
  auto c = Open();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->put("z/old", "v").ok());
  EventLog<std::string> log;
  auto w = c->watch("z/", 0, [&](const ClusterWatchEvent& e) { log.Add(e.kv.key); });
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(c->put("z/new", "v").ok());
  ASSERT_TRUE(log.WaitForCount(1, 10s));
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(log.Get(), (std::vector<std::string>{"z/new"}));
}

// cancel() (and destroying the handle) from inside the callback returns; nothing is delivered
// after it.
TEST_P(ClusterConformance, CancelInsideCallbackDoesNotDeadlock) {
  auto c = Open();
  ASSERT_TRUE(c);
  for (bool destroy : {false, true}) {
    std::mutex mu;
    std::unique_ptr<ClusterWatch> handle;
    std::atomic<int> calls{0};
    std::promise<void> done;
    auto w = c->watch("cb/", 0, [&](const ClusterWatchEvent&) {
      calls.fetch_add(1);
      std::lock_guard l(mu);
      if (!handle) return;
      if (destroy) {
        handle.reset();
      } else {
        handle->cancel();
      }
      done.set_value();
    });
    ASSERT_TRUE(w.ok());
    {
      std::lock_guard l(mu);
      handle = std::move(*w);
    }
    ASSERT_TRUE(c->put("cb/1", "v").ok());
    auto fut = done.get_future();
    ASSERT_EQ(fut.wait_for(10s), std::future_status::ready) << "callback never cancelled";
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(c->put("cb/2", "v").ok());
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(calls.load(), 1) << (destroy ? "destroy" : "cancel");
    std::lock_guard l(mu);
    handle.reset();
  }
}

TEST_P(ClusterConformance, CancelFromOutsideWaitsForRunningCallback) {
  auto c = Open();
  ASSERT_TRUE(c);
  std::atomic<bool> in_callback{false};
  std::atomic<bool> finished{false};
  auto w = c->watch("slow/", 0, [&](const ClusterWatchEvent&) {
    in_callback = true;
    std::this_thread::sleep_for(300ms);
    finished = true;
  });
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(c->put("slow/1", "v").ok());
  ASSERT_TRUE(WaitUntil([&] { return in_callback.load(); }, 10s));
  (*w)->cancel();
  EXPECT_TRUE(finished.load()) << "cancel() returned while the callback was still running";
}

TEST_P(ClusterConformance, BadKeysAndValuesRejectedNothingWritten) {
  auto c = Open();
  ASSERT_TRUE(c);
  const std::vector<std::string> bad = {
      "",
      std::string(kClusterMaxKeyBytes + 1, 'k'),
      std::string("a\0b", 3),
      "\xff",
      "bad\x80key",
      "\xc0\xaf",          // overlong '/'
      "\xe0\x80\xaf",      // overlong '/', 3 bytes
      "\xed\xa0\x80",      // UTF-16 surrogate U+D800
      "\xf4\x90\x80\x80",  // above U+10FFFF
      "\xe2\x82",          // truncated
  };
  for (const auto& k : bad) {
    SCOPED_TRACE(::testing::PrintToString(k));
    EXPECT_EQ(ValidateClusterKey(k).code(), Code::kInvalidArgument);
    EXPECT_EQ(c->put(k, "v").status().code(), Code::kInvalidArgument);
    EXPECT_EQ(c->put_if(k, "v", 0).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(c->get(k).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(c->remove(k).code(), Code::kInvalidArgument);
    if (!k.empty()) {
      EXPECT_EQ(c->list(k).status().code(), Code::kInvalidArgument);
      EXPECT_EQ(c->watch(k, 0, [](const ClusterWatchEvent&) {}).status().code(),
                Code::kInvalidArgument);
    }
  }
  std::string big(kClusterMaxValueBytes + 1, 'v');
  EXPECT_EQ(c->put("big", big).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(c->put_if("big", big, 0).status().code(), Code::kInvalidArgument);
  auto all = c->list("");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->empty()) << all->size() << " keys written, first " << (*all)[0].key;

  // The limits themselves are fine, and so is any valid UTF-8.
  EXPECT_TRUE(ValidateClusterKey("ключ/ü€\xf0\x9d\x84\x9e").ok());
  EXPECT_TRUE(c->put("ключ/ü€\xf0\x9d\x84\x9e", "v").ok());
  std::string max_key(kClusterMaxKeyBytes, 'k');
  EXPECT_TRUE(c->put(max_key, "v").ok());
  auto at_limit = c->put("max-value", std::string(kClusterMaxValueBytes, 'v'));
  EXPECT_TRUE(at_limit.ok()) << at_limit.status().ToString();
  auto got = c->get("max-value");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->value.size(), kClusterMaxValueBytes);
}

TEST_P(ClusterConformance, OpenRejectsBadUrlAndClusterName) {
  for (std::string url : {"", "http://127.0.0.1:2379", "memory://", "memory://bad name",
                          "memory://a/b", "etcd://", "etcd://host", "etcd://host:0", "etcd://h:1,",
                          "etcd://h:1/path", "etcds://", "etcd:/h:1", "memory:x"}) {
    ClusterOptions o = Options();
    o.url = url;
    auto c = Cluster::Open(o);
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument) << url;
    EXPECT_NE(c.status().message().find("memory://NAME"), std::string_view::npos)
        << c.status().ToString();
  }
  for (std::string name :
       std::vector<std::string>{"", "a/b", "bad name", std::string(65, 'n'), "caf\xc3\xa9"}) {
    ClusterOptions o = Options();
    o.cluster_name = name;
    EXPECT_EQ(Cluster::Open(o).status().code(), Code::kInvalidArgument) << name;
  }
  ClusterOptions o = Options();
  o.cluster_name = std::string(64, 'n');
  EXPECT_TRUE(Cluster::Open(o).ok());
}

TEST_P(ClusterConformance, UnknownClusterWithoutCreateIsNotFoundNamingExisting) {
  auto a = Open();
  ASSERT_TRUE(a);
  auto o = Options();
  o.cluster_name = UniqueName("second");
  auto b = Open(o);
  ASSERT_TRUE(b);
  o.cluster_name = UniqueName("typo");
  o.create_if_missing = false;
  auto missing = Cluster::Open(o);
  ASSERT_EQ(missing.status().code(), Code::kNotFound) << missing.status().ToString();
  std::string_view msg = missing.status().message();
  EXPECT_NE(msg.find("'" + o.cluster_name + "'"), std::string_view::npos) << msg;
  EXPECT_NE(msg.find(cluster_name_), std::string_view::npos) << msg;
  EXPECT_NE(msg.find(b->options().cluster_name), std::string_view::npos) << msg;
  // Nothing was created by the failed open; an existing one opens without create.
  o.cluster_name = cluster_name_;
  EXPECT_TRUE(Cluster::Open(o).ok());
}

TEST_P(ClusterConformance, JoinMembersLeave) {
  auto c1 = Open();
  auto c2 = Open();
  ASSERT_TRUE(c1 && c2);
  EXPECT_FALSE(c1->joined());
  EXPECT_TRUE(c1->leave().ok());  // not joined: OK
  ASSERT_TRUE(c1->join(Member("node-b", "10.0.0.2:7000")).ok());
  auto st = c2->join(Member("node-a", "10.0.0.1:7000"));
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(c1->joined());
  auto ms = c1->members();
  ASSERT_TRUE(ms.ok()) << ms.status().ToString();
  ASSERT_EQ(ms->size(), 2u);
  EXPECT_EQ((*ms)[0].name, "node-a");
  EXPECT_EQ((*ms)[1].name, "node-b");
  EXPECT_EQ((*ms)[1].address, "10.0.0.2:7000");
  EXPECT_EQ((*ms)[1].roles, (std::vector<std::string>{"memory", "client"}));
  EXPECT_EQ((*ms)[1].capacity_bytes, 1ull << 30);
  EXPECT_GT((*ms)[1].revision, 0);
  EXPECT_GT((*ms)[1].lease_left.count(), 0);
  EXPECT_LE((*ms)[1].lease_left, Options().lease_ttl);
  EXPECT_EQ(c1->join(Member("again")).code(), Code::kFailedPrecondition);

  ASSERT_TRUE(c1->leave().ok());
  EXPECT_FALSE(c1->joined());
  ms = c2->members();
  ASSERT_TRUE(ms.ok());
  ASSERT_EQ(ms->size(), 1u);
  EXPECT_EQ((*ms)[0].name, "node-a");
  EXPECT_TRUE(c1->leave().ok());
  // Join again after leaving.
  ASSERT_TRUE(c1->join(Member("node-b")).ok());
  EXPECT_EQ(MemberCount(*c2), 2);
}

TEST_P(ClusterConformance, DuplicateNameJoinRefused) {
  auto c1 = Open();
  auto c2 = Open();
  ASSERT_TRUE(c1 && c2);
  ASSERT_TRUE(c1->join(Member("dup", "10.9.9.9:1234")).ok());
  auto st = c2->join(Member("dup", "10.1.1.1:1"));
  ASSERT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("member 'dup' already joined from 10.9.9.9:1234"),
            std::string_view::npos)
      << st.ToString();
  EXPECT_FALSE(c2->joined());
  auto ms = c2->members();
  ASSERT_TRUE(ms.ok());
  ASSERT_EQ(ms->size(), 1u);
  EXPECT_EQ((*ms)[0].address, "10.9.9.9:1234");
  EXPECT_EQ(c2->join(Member("bad name")).code(), Code::kInvalidArgument);
  EXPECT_EQ(c2->join(Member("")).code(), Code::kInvalidArgument);
  // The name is free again once its holder leaves.
  ASSERT_TRUE(c1->leave().ok());
  EXPECT_TRUE(c2->join(Member("dup", "10.1.1.1:1")).ok());
}

struct MemberSeen {
  Type type;
  std::string name;
  int64_t revision;
};

TEST_P(ClusterConformance, WatchMembersSeesJoinThenLeaveOnce) {
  auto watcher = Open();
  auto early = Open();
  auto late = Open();
  ASSERT_TRUE(watcher && early && late);
  ASSERT_TRUE(early->join(Member("early")).ok());
  EventLog<MemberSeen> log;
  std::atomic<int> errors{0};
  auto w = watcher->watch_members(
      [&](const ClusterMemberEvent& e) {
        log.Add({e.type, e.member.name, e.revision});
      },
      [&](const Status&) { errors.fetch_add(1); });
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(log.WaitForCount(1, 10s));
  ASSERT_TRUE(late->join(Member("late", "10.0.0.7:1")).ok());
  ASSERT_TRUE(log.WaitForCount(2, 10s));
  ASSERT_TRUE(late->leave().ok());
  ASSERT_TRUE(log.WaitForCount(3, 10s));
  std::this_thread::sleep_for(500ms);  // the delete after the leave must add nothing
  auto got = log.Get();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].type, Type::kJoin);
  EXPECT_EQ(got[0].name, "early");
  EXPECT_EQ(got[1].type, Type::kJoin);
  EXPECT_EQ(got[1].name, "late");
  EXPECT_EQ(got[2].type, Type::kLeave);
  EXPECT_EQ(got[2].name, "late");
  EXPECT_LT(got[0].revision, got[1].revision);
  EXPECT_LT(got[1].revision, got[2].revision);
  EXPECT_EQ(errors.load(), 0);
}

// A member that stops renewing (a killed process) is reported as kExpire within TTL + 1 s. The
// dead member is simulated by writing its key through a raw backend with a lease nobody renews.
TEST_P(ClusterConformance, DeadMemberExpiresWithinTtlPlusOneSecond) {
  auto watcher = Open();
  ASSERT_TRUE(watcher);
  EventLog<MemberSeen> log;
  auto w = watcher->watch_members([&](const ClusterMemberEvent& e) {
    log.Add({e.type, e.member.name, e.revision});
  });
  ASSERT_TRUE(w.ok());
  auto raw = OpenBackendForUrl(url_, Options());
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  auto deadline = [] { return Clock::now() + 5s; };
  auto lease = (*raw)->lease_grant(1000ms, deadline());
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  // What the store actually granted (etcd raises a TTL below its minimum, and reports the time
  // left in whole seconds, truncated): a renewal answers with the full TTL and restarts it now.
  auto granted_at = Clock::now();
  auto renewed = (*raw)->lease_keepalive(*lease, deadline());
  ASSERT_TRUE(renewed.ok()) << renewed.status().ToString();
  milliseconds ttl = std::max<milliseconds>(*renewed, 1000ms);
  std::string key = "/farmem/" + cluster_name_ + "/members/doomed";
  auto put =
      (*raw)->put(key, EncodeMember(Member("doomed"), MemberState::kUp), *lease, 0, deadline());
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  ASSERT_TRUE(log.WaitForCount(1, 10s));
  ASSERT_TRUE(log.WaitForCount(2, ttl + 1s + 500ms)) << "no kExpire";
  auto took = Clock::now() - granted_at;
  EXPECT_LE(took, ttl + 1s) << std::chrono::duration_cast<milliseconds>(took).count() << " ms";
  auto got = log.Get();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].type, Type::kJoin);
  EXPECT_EQ(got[1].type, Type::kExpire);
  EXPECT_EQ(got[1].name, "doomed");
  EXPECT_EQ(MemberCount(*watcher), 0);
}

TEST_P(ClusterConformance, KeysBoundToLeaseVanishWithLeave) {
  auto c = Open();
  auto other = Open();
  ASSERT_TRUE(c && other);
  EXPECT_EQ(c->put("bound", "v", {.bind_to_lease = true}).status().code(),
            Code::kFailedPrecondition);  // no membership yet
  ASSERT_TRUE(c->join(Member("holder")).ok());
  ASSERT_TRUE(c->put("bound", "v", {.bind_to_lease = true}).ok());
  ASSERT_TRUE(c->put_if("bound-cas", "v", 0, {.bind_to_lease = true}).ok());
  ASSERT_TRUE(c->put("plain", "v").ok());
  auto before = other->list("");
  ASSERT_TRUE(before.ok());
  ASSERT_EQ(before->size(), 3u);
  EXPECT_TRUE((*before)[0].bound_to_lease);  // "bound"
  EXPECT_TRUE((*before)[1].bound_to_lease);  // "bound-cas"
  EXPECT_FALSE((*before)[2].bound_to_lease);
  ASSERT_TRUE(c->leave().ok());
  auto after = other->list("");
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->size(), 1u);
  EXPECT_EQ((*after)[0].key, "plain");
}

TEST_P(ClusterConformance, DestructorLeavesAndWatchHandleOutlivesCluster) {
  auto watcher = Open();
  ASSERT_TRUE(watcher);
  EventLog<MemberSeen> log;
  auto w = watcher->watch_members([&](const ClusterMemberEvent& e) {
    log.Add({e.type, e.member.name, e.revision});
  });
  ASSERT_TRUE(w.ok());
  {
    auto member = Open();
    ASSERT_TRUE(member);
    ASSERT_TRUE(member->join(Member("short-lived")).ok());
    ASSERT_TRUE(log.WaitForCount(1, 10s));
  }
  ASSERT_TRUE(log.WaitForCount(2, 10s));
  EXPECT_EQ(log.Get()[1].type, Type::kLeave);
  auto kw = watcher->watch("k/", 0, [](const ClusterWatchEvent&) {});
  ASSERT_TRUE(kw.ok());
  watcher.reset();  // cancels both watches
  (*w)->cancel();   // still safe
  kw->reset();
  w->reset();
}

TEST_P(ClusterConformance, StatsJsonCountsCalls) {
  auto c = Open();
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->put("a", "1").ok());
  EXPECT_EQ(c->get("b").status().code(), Code::kNotFound);
  std::string s = c->stats_json();
  EXPECT_NE(s.find("\"calls\":2"), std::string::npos) << s;
  EXPECT_NE(s.find("\"failures\":0"), std::string::npos) << s;
  EXPECT_NE(s.find("\"rejoins\":0"), std::string::npos) << s;
  EXPECT_NE(s.find("\"keepalives\":"), std::string::npos) << s;
  EXPECT_NE(s.find("\"watches\":0"), std::string::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(Backends, ClusterConformance, ::testing::Values("memory", "etcd"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace farmem::cluster
