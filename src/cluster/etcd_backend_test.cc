// Tests of the etcd:// backend against a real etcd (EtcdProcess): the KV calls, leases, watches
// (including resume across etcd restarts/kills and compaction), faults and auth. Test threads plus
// the backend's watch threads (collectors lock their own mutex).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "cluster/backend.h"
#include "cluster/cluster_test_util.h"
#include "cluster/etcd_json.h"
#include "cluster/testing/etcd_process.h"

namespace farmem::cluster {
namespace {

using std::chrono::milliseconds;
using testing::EtcdAvailable;
using testing::EtcdProcess;
using testing::Soon;

Clock::time_point In(milliseconds d) {
  return Clock::now() + d;
}

std::unique_ptr<ClusterBackend> OpenOrDie(std::vector<std::string> endpoints,
                                          ClusterOptions options = {}) {
  auto b = OpenEtcdBackend(endpoints, false, options);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(b).value() : nullptr;
}

struct Written {
  int64_t revision;
  std::string key;
  bool is_delete;
};

// Events must be exactly the writes, in order: nothing missed, nothing repeated.
void ExpectExactly(const std::vector<BackendEvent>& got, const std::vector<Written>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].kv.mod_revision, want[i].revision) << "event " << i;
    EXPECT_EQ(got[i].kv.key, want[i].key) << "event " << i;
    EXPECT_EQ(got[i].is_delete, want[i].is_delete) << "event " << i;
  }
}

class EtcdBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdAvailable()) GTEST_SKIP() << "etcd not installed";
    Status s = etcd_.Start();
    ASSERT_TRUE(s.ok()) << s.ToString();
    backend_ = OpenOrDie({etcd_.endpoint()});
    ASSERT_NE(backend_, nullptr);
  }

  Result<int64_t> Put(std::string_view k, std::string_view v) {
    return backend_->put(k, v, 0, std::nullopt, Soon());
  }

  EtcdProcess etcd_;
  std::unique_ptr<ClusterBackend> backend_;
};

// ---- codec ------------------------------------------------------------------------------------

TEST(EtcdJsonTest, Base64RoundTripsEveryByteAndRejectsGarbage) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t len = 0; len < 260; ++len) {
    std::string s = all.substr(0, std::min<size_t>(len, 256)) + std::string(len > 256 ? 4 : 0, 'x');
    auto d = etcdjson::Base64Decode(etcdjson::Base64Encode(s));
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(*d, s);
  }
  EXPECT_EQ(etcdjson::Base64Encode("foo"), "Zm9v");
  EXPECT_FALSE(etcdjson::Base64Decode("Zm9").ok());
  EXPECT_FALSE(etcdjson::Base64Decode("Zm!v").ok());
  EXPECT_FALSE(etcdjson::Base64Decode("Z=9v").ok());
  EXPECT_FALSE(etcdjson::Base64Decode("Zg==Zm9v").ok());
}

TEST(EtcdJsonTest, PrefixRangeEndCarriesOver0xff) {
  EXPECT_EQ(etcdjson::PrefixRangeEnd("abc"), "abd");
  EXPECT_EQ(etcdjson::PrefixRangeEnd("a\xff"), "b");
  EXPECT_EQ(etcdjson::PrefixRangeEnd("a\xfe\xff\xff"), "a\xff");
  EXPECT_EQ(etcdjson::PrefixRangeEnd("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(etcdjson::PrefixRangeEnd(""), std::string(1, '\0'));
}

TEST(EtcdJsonTest, FieldsAreUntrusted) {
  auto j =
      etcdjson::Parse(R"({"a":"12","b":7,"c":"x1","d":{},"e":true,"kvs":[{"key":"!!"}]})", "t");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(*etcdjson::Int64(*j, "a"), 12);
  EXPECT_EQ(*etcdjson::Int64(*j, "b"), 7);
  EXPECT_EQ(*etcdjson::Int64(*j, "missing"), 0);
  EXPECT_EQ(etcdjson::Int64(*j, "c").status().code(), Code::kProtocol);
  EXPECT_EQ(etcdjson::Int64(*j, "d").status().code(), Code::kProtocol);
  EXPECT_EQ(etcdjson::Bool(*j, "a").status().code(), Code::kProtocol);
  EXPECT_EQ(etcdjson::ParseKvs(*j).status().code(), Code::kProtocol);
  EXPECT_EQ(etcdjson::Parse("{", "t").status().code(), Code::kProtocol);
  EXPECT_EQ(etcdjson::Parse("[1]", "t").status().code(), Code::kProtocol);
  auto e = etcdjson::Parse(
      R"({"error":"x","code":5,"message":"etcdserver: requested lease not found"})", "t");
  EXPECT_EQ(etcdjson::ErrorOf(*e, 404, "put").code(), Code::kNotFound);
  auto se = etcdjson::Parse(R"({"error":{"grpc_code":14,"message":"no leader"}})", "t");
  EXPECT_EQ(etcdjson::ErrorOf(*se, 200, "watch").code(), Code::kUnavailable);
}

// ---- key-value --------------------------------------------------------------------------------

TEST_F(EtcdBackendTest, PutGetRangeRemoveRevision) {
  auto r0 = backend_->revision(Soon());
  ASSERT_TRUE(r0.ok()) << r0.status().ToString();
  auto w1 = Put("/t/a", "1");
  ASSERT_TRUE(w1.ok()) << w1.status().ToString();
  EXPECT_GT(*w1, *r0);
  auto w2 = Put("/t/b", "2");
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE(Put("/u/c", "3").ok());
  auto g = backend_->get("/t/a", Soon());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value, "1");
  EXPECT_EQ(g->create_revision, *w1);
  EXPECT_EQ(g->mod_revision, *w1);
  EXPECT_EQ(g->lease, 0);
  EXPECT_EQ(backend_->get("/t/zz", Soon()).status().code(), Code::kNotFound);
  // A get is exact, not a prefix read.
  EXPECT_EQ(backend_->get("/t", Soon()).status().code(), Code::kNotFound);
  auto r = backend_->range("/t/", Soon());
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->kvs.size(), 2u);
  EXPECT_EQ(r->kvs[0].key, "/t/a");
  EXPECT_EQ(r->kvs[1].key, "/t/b");
  EXPECT_GE(r->revision, *w2 + 1);
  auto all = backend_->range("", Soon());
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->kvs.size(), 3u);
  auto d = backend_->remove("/t/a", Soon());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*backend_->revision(Soon()), *d);
  EXPECT_EQ(backend_->remove("/t/a", Soon()).status().code(), Code::kNotFound);
  EXPECT_EQ(backend_->get("/t/a", Soon()).status().code(), Code::kNotFound);
  EXPECT_EQ(backend_->kind(), "etcd");
}

TEST_F(EtcdBackendTest, BinaryKeysAndValuesEveryByte) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (int i = 0; i < 256; ++i) {
    std::string key = std::string("/bin/") + static_cast<char>(i);
    ASSERT_TRUE(backend_->put(key, all.substr(i) + all.substr(0, i), 0, std::nullopt, Soon()).ok());
  }
  auto r = backend_->range("/bin/", Soon());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->kvs.size(), 256u);
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(r->kvs[i].key, std::string("/bin/") + static_cast<char>(i));
    EXPECT_EQ(r->kvs[i].value, all.substr(i) + all.substr(0, i));
  }
  auto g = backend_->get(std::string("/bin/") + '\0', Soon());
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->value, all);
  EXPECT_TRUE(backend_->put("/empty", "", 0, std::nullopt, Soon()).ok());
  EXPECT_EQ(backend_->get("/empty", Soon())->value, "");
}

TEST_F(EtcdBackendTest, LargeValueOneMiB) {
  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 131) ^ (i >> 9));
  auto w = backend_->put("/big", big, 0, std::nullopt, Soon());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto g = backend_->get("/big", Soon());
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(g->value == big);
}

TEST_F(EtcdBackendTest, PrefixEndingIn0xff) {
  const std::vector<std::string> keys_written = {
      "p\xfe",         "p\xff", std::string("p\xff\x00", 3), "p\xff\xff",
      "p\xff\xff\x01", "q",     std::string("q\x00", 2)};
  for (const std::string& k : keys_written) {
    ASSERT_TRUE(Put(k, "v").ok());
  }
  auto r = backend_->range("p\xff", Soon());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::string> keys;
  for (auto& kv : r->kvs) keys.push_back(kv.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"p\xff", std::string("p\xff\x00", 3), "p\xff\xff",
                                            "p\xff\xff\x01"}));
  auto r2 = backend_->range("p\xff\xff", Soon());
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->kvs.size(), 2u);
}

TEST_F(EtcdBackendTest, PutIfComparesModRevision) {
  auto c = backend_->put("/k", "v1", 0, int64_t{0}, Soon());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto again = backend_->put("/k", "v2", 0, int64_t{0}, Soon());
  EXPECT_EQ(again.status().code(), Code::kFailedPrecondition) << again.status().ToString();
  EXPECT_EQ(backend_->get("/k", Soon())->value, "v1");
  auto wrong = backend_->put("/k", "v3", 0, *c + 100, Soon());
  EXPECT_EQ(wrong.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(wrong.status().message().find(std::to_string(*c)), std::string_view::npos)
      << wrong.status().ToString();
  EXPECT_EQ(backend_->get("/k", Soon())->value, "v1");
  auto right = backend_->put("/k", "v4", 0, *c, Soon());
  ASSERT_TRUE(right.ok()) << right.status().ToString();
  auto g = backend_->get("/k", Soon());
  EXPECT_EQ(g->value, "v4");
  EXPECT_EQ(g->mod_revision, *right);
  EXPECT_EQ(g->create_revision, *c);
  // After a delete the key is absent again: create works.
  ASSERT_TRUE(backend_->remove("/k", Soon()).ok());
  EXPECT_EQ(backend_->put("/k", "v5", 0, *right, Soon()).status().code(),
            Code::kFailedPrecondition);
  EXPECT_TRUE(backend_->put("/k", "v6", 0, int64_t{0}, Soon()).ok());
}

TEST_F(EtcdBackendTest, PutIfCreateRaceExactlyOneWins) {
  for (int round = 0; round < 5; ++round) {
    std::string key = "/race/" + std::to_string(round);
    std::atomic<int> wins{0}, losses{0}, others{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();
        auto r = backend_->put(key, "t" + std::to_string(t), 0, int64_t{0}, Soon());
        if (r.ok()) {
          wins++;
        } else if (r.status().code() == Code::kFailedPrecondition) {
          losses++;
        } else {
          others++;
        }
      });
    }
    go.store(true);
    for (auto& th : threads) th.join();
    EXPECT_EQ(wins.load(), 1);
    EXPECT_EQ(losses.load(), 7);
    EXPECT_EQ(others.load(), 0);
  }
}

// ---- leases -----------------------------------------------------------------------------------

TEST_F(EtcdBackendTest, LeaseGrantKeepaliveTimeLeftRevoke) {
  auto l = backend_->lease_grant(milliseconds(4500), Soon());
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  auto left = backend_->lease_time_left(*l, Soon());
  ASSERT_TRUE(left.ok()) << left.status().ToString();
  EXPECT_GT(left->count(), 3000);  // 4.5 s rounds up to 5 s
  EXPECT_LE(left->count(), 5000);
  auto ka = backend_->lease_keepalive(*l, Soon());
  ASSERT_TRUE(ka.ok()) << ka.status().ToString();
  EXPECT_EQ(ka->count(), 5000);
  ASSERT_TRUE(backend_->put("/leased", "x", *l, std::nullopt, Soon()).ok());
  EXPECT_EQ(backend_->get("/leased", Soon())->lease, *l);
  ASSERT_TRUE(backend_->lease_revoke(*l, Soon()).ok());
  EXPECT_EQ(backend_->get("/leased", Soon()).status().code(), Code::kNotFound);
  EXPECT_EQ(backend_->lease_revoke(*l, Soon()).code(), Code::kNotFound);
  EXPECT_EQ(backend_->lease_keepalive(*l, Soon()).status().code(), Code::kNotFound);
  EXPECT_EQ(backend_->lease_time_left(*l, Soon()).status().code(), Code::kNotFound);
  auto put = backend_->put("/leased", "y", *l, std::nullopt, Soon());
  EXPECT_EQ(put.status().code(), Code::kNotFound) << put.status().ToString();
  EXPECT_NE(put.status().message().find("lease not found"), std::string_view::npos);
  // Same through the compare-and-set path.
  EXPECT_EQ(backend_->put("/leased", "y", *l, int64_t{0}, Soon()).status().code(), Code::kNotFound);
  EXPECT_EQ(backend_->put("/x", "y", 12345, std::nullopt, Soon()).status().code(), Code::kNotFound);
}

TEST_F(EtcdBackendTest, LeasedKeysVanishAtExpiry) {
  auto l = backend_->lease_grant(milliseconds(1), Soon());  // rounds up to 1 s
  ASSERT_TRUE(l.ok());
  auto start = Clock::now();
  ASSERT_TRUE(backend_->put("/eph/a", "x", *l, std::nullopt, Soon()).ok());
  ASSERT_TRUE(backend_->put("/eph/b", "x", *l, int64_t{0}, Soon()).ok());
  ASSERT_TRUE(backend_->put("/keep", "x", 0, std::nullopt, Soon()).ok());
  while (Clock::now() - start < milliseconds(5000)) {
    auto r = backend_->range("/eph/", Soon());
    ASSERT_TRUE(r.ok());
    if (r->kvs.empty()) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
  // etcd's minimum lease TTL is 1.5 election timeouts (2 s by default), plus expiry scan slack.
  EXPECT_LT(took.count(), 3500) << "leased keys still there after " << took.count() << " ms";
  EXPECT_TRUE(backend_->range("/eph/", Soon())->kvs.empty());
  EXPECT_TRUE(backend_->get("/keep", Soon()).ok());
  EXPECT_EQ(backend_->lease_time_left(*l, Soon()).status().code(), Code::kNotFound);
}

// ---- watches ----------------------------------------------------------------------------------

TEST_F(EtcdBackendTest, WatchDeliversEveryPutAndDeleteInOrder) {
  testing::WatchCollector c;
  auto w = backend_->watch("/w/", 0, c.Events(), c.Errors());
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<Written> want;
  for (int i = 0; i < 150; ++i) {
    std::string key = "/w/" + std::to_string(i % 7);
    if (i % 5 == 4) {
      auto d = backend_->remove(key, Soon());
      if (d.ok()) want.push_back({*d, key, true});
    } else {
      auto p = Put(key, std::to_string(i));
      ASSERT_TRUE(p.ok());
      want.push_back({*p, key, false});
    }
    ASSERT_TRUE(Put("/other/" + std::to_string(i), "noise").ok());  // outside the prefix
  }
  ASSERT_TRUE(c.WaitEvents(want.size()));
  std::this_thread::sleep_for(milliseconds(200));  // nothing more may come
  ExpectExactly(c.Snapshot(), want);
  EXPECT_TRUE(c.errors.empty());
  // Values arrive as written.
  EXPECT_EQ(c.Snapshot()[0].kv.value, "0");
}

TEST_F(EtcdBackendTest, WatchFromPastRevision) {
  std::vector<Written> want;
  for (int i = 0; i < 10; ++i) {
    auto p = Put("/past/" + std::to_string(i), "v");
    ASSERT_TRUE(p.ok());
    want.push_back({*p, "/past/" + std::to_string(i), false});
  }
  testing::WatchCollector c;
  auto w = backend_->watch("/past/", want[3].revision, c.Events(), c.Errors());
  ASSERT_TRUE(w.ok());
  auto p = Put("/past/new", "v");
  ASSERT_TRUE(p.ok());
  std::vector<Written> expect(want.begin() + 3, want.end());
  expect.push_back({*p, "/past/new", false});
  ASSERT_TRUE(c.WaitEvents(expect.size()));
  std::this_thread::sleep_for(milliseconds(100));
  ExpectExactly(c.Snapshot(), expect);
}

// The etcd goes away (`kill`: SIGTERM+restart, or SIGKILL+restart) in the middle of a watch and
// writes follow at once after the restart, before the watch can have reconnected: they must all
// arrive (resume from last delivered + 1), none twice.
void WatchSurvivesRestart(EtcdProcess& etcd, ClusterBackend& backend, bool sigkill) {
  testing::WatchCollector c;
  auto w = backend.watch("/r/", 0, c.Events(), c.Errors());
  ASSERT_TRUE(w.ok());
  std::vector<Written> want;
  auto write = [&](int i) {
    std::string key = "/r/" + std::to_string(i % 4);
    auto p = backend.put(key, std::to_string(i), 0, std::nullopt, Soon());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    want.push_back({*p, key, false});
  };
  for (int i = 0; i < 20; ++i) write(i);
  ASSERT_TRUE(c.WaitEvents(want.size()));
  for (int round = 0; round < 2; ++round) {
    if (sigkill) {
      etcd.Kill();
    } else {
      etcd.Stop();
    }
    std::this_thread::sleep_for(milliseconds(300));  // the watch notices and starts retrying
    ASSERT_TRUE(etcd.Restart().ok());
    for (int i = 0; i < 20; ++i) write(100 * (round + 1) + i);
    ASSERT_TRUE(c.WaitEvents(want.size(), milliseconds(15000)))
        << "got " << c.Snapshot().size() << " of " << want.size();
  }
  std::this_thread::sleep_for(milliseconds(300));
  ExpectExactly(c.Snapshot(), want);
  EXPECT_TRUE(c.errors.empty());
}

TEST_F(EtcdBackendTest, WatchResumesAfterEtcdStopRestart) {
  WatchSurvivesRestart(etcd_, *backend_, false);
}

TEST_F(EtcdBackendTest, WatchResumesAfterEtcdKill) {
  WatchSurvivesRestart(etcd_, *backend_, true);
}

TEST_F(EtcdBackendTest, WatchFromCompactedRevisionFailsOnce) {
  std::vector<int64_t> revs;
  for (int i = 0; i < 10; ++i) revs.push_back(*Put("/c/" + std::to_string(i), "v"));
  std::string out;
  Status s = etcd_.Etcdctl({"compaction", std::to_string(revs[7])}, &out);
  ASSERT_TRUE(s.ok()) << s.ToString();
  testing::WatchCollector c;
  auto w = backend_->watch("/c/", revs[2], c.Events(), c.Errors());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(c.WaitErrors(1));
  std::this_thread::sleep_for(milliseconds(500));
  ASSERT_TRUE(Put("/c/late", "v").ok());
  std::this_thread::sleep_for(milliseconds(300));
  std::lock_guard<std::mutex> lock(c.mu);
  ASSERT_EQ(c.errors.size(), 1u);
  EXPECT_EQ(c.errors[0].code(), Code::kFailedPrecondition);
  EXPECT_NE(c.errors[0].message().find("compacted"), std::string_view::npos);
  EXPECT_NE(c.errors[0].message().find(std::to_string(revs[2])), std::string_view::npos)
      << c.errors[0].ToString();
  EXPECT_TRUE(c.events.empty());
  // From the compaction point on it is fine.
  testing::WatchCollector ok;
  auto w2 = backend_->watch("/c/", revs[7], ok.Events(), ok.Errors());
  ASSERT_TRUE(ok.WaitEvents(4));  // revs[7..9] and /c/late
}

TEST_F(EtcdBackendTest, CancelFromInsideTheCallback) {
  std::atomic<int> calls{0};
  std::unique_ptr<ClusterWatch> handle;
  std::mutex mu;
  std::condition_variable cv;
  bool cancelled = false;
  auto w = backend_->watch("/cx/", 0,
                           [&](const std::vector<BackendEvent>&) {
                             calls++;
                             std::lock_guard<std::mutex> lock(mu);
                             handle->cancel();  // must not deadlock joining itself
                             cancelled = true;
                             cv.notify_all();
                           },
                           {});
  ASSERT_TRUE(w.ok());
  {
    std::lock_guard<std::mutex> lock(mu);
    handle = std::move(w).value();
  }
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Put("/cx/k", std::to_string(i)).ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, milliseconds(10000), [&] { return cancelled; }));
  }
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(calls.load(), 1);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Put("/cx/k", std::to_string(i)).ok());
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(calls.load(), 1);
  std::lock_guard<std::mutex> lock(mu);
  handle.reset();
}

TEST_F(EtcdBackendTest, CancelStopsPromptlyAndNoCallbackAfter) {
  testing::WatchCollector c;
  auto w = backend_->watch("/cp/", 0, c.Events(), c.Errors());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(Put("/cp/a", "1").ok());
  ASSERT_TRUE(c.WaitEvents(1));
  auto start = Clock::now();
  (*w)->cancel();
  EXPECT_LT(Clock::now() - start, milliseconds(500));
  ASSERT_TRUE(Put("/cp/a", "2").ok());
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(c.Snapshot().size(), 1u);
}

// A TCP proxy in front of etcd that a test can cut (every connection closed, new ones refused) and
// restore on the same port, while the test keeps writing to etcd directly: the watch behind it
// provably misses those writes live and must fetch them on resume.
class CuttableProxy {
 public:
  explicit CuttableProxy(int target_port) : target_port_(target_port) {
    port_ = testing::FreeLoopbackPort();
    Restore();
  }
  ~CuttableProxy() { Cut(); }

  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

  void Cut() {
    stop_ = true;
    if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
    for (auto& t : threads_) t.join();
    threads_.clear();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
  }

  void Restore() {
    stop_ = false;
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a = Loopback(port_);
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) std::abort();
    ::listen(listen_fd_, 64);
    threads_.emplace_back([this] { AcceptLoop(); });
  }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    return a;
  }

  void AcceptLoop() {
    std::vector<std::thread> pumps;
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int c = ::accept(listen_fd_, nullptr, nullptr);
      if (c < 0) continue;
      int u = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a = Loopback(target_port_);
      if (::connect(u, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(c);
        ::close(u);
        continue;
      }
      pumps.emplace_back([this, c, u] { Pump(c, u); });
    }
    for (auto& t : pumps) t.join();
  }

  void Pump(int a, int b) {
    pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    char buf[65536];
    while (!stop_) {
      if (::poll(p, 2, 50) <= 0) continue;
      bool broken = false;
      for (int i = 0; i < 2; ++i) {
        if (p[i].revents == 0) continue;
        ssize_t n = ::recv(p[i].fd, buf, sizeof buf, 0);
        if (n <= 0 || ::send(p[1 - i].fd, buf, n, MSG_NOSIGNAL) != n) broken = true;
      }
      if (broken) break;
    }
    ::close(a);
    ::close(b);
  }

  int target_port_;
  int port_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// Writes made while the watch cannot reach etcd at all arrive after it can again, exactly once.
TEST_F(EtcdBackendTest, WatchResumesWithWritesMadeWhileCutOff) {
  CuttableProxy proxy(etcd_.client_port());
  auto watcher = OpenOrDie({proxy.endpoint()});
  testing::WatchCollector c;
  auto w = watcher->watch("/cut/", 0, c.Events(), c.Errors());
  ASSERT_TRUE(w.ok());
  std::vector<Written> want;
  auto write = [&](int i) {
    std::string key = "/cut/" + std::to_string(i % 3);
    auto p = Put(key, std::to_string(i));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    want.push_back({*p, key, false});
  };
  for (int i = 0; i < 10; ++i) write(i);
  ASSERT_TRUE(c.WaitEvents(want.size()));
  for (int round = 0; round < 2; ++round) {
    proxy.Cut();
    for (int i = 0; i < 10; ++i) write(100 * (round + 1) + i);  // the watch cannot see these now
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_LT(c.Snapshot().size(), want.size());
    proxy.Restore();
    for (int i = 0; i < 5; ++i) write(100 * (round + 1) + 50 + i);
    ASSERT_TRUE(c.WaitEvents(want.size()))
        << "got " << c.Snapshot().size() << " of " << want.size();
  }
  std::this_thread::sleep_for(milliseconds(300));
  ExpectExactly(c.Snapshot(), want);
  EXPECT_TRUE(c.errors.empty());
}

// ---- faults -----------------------------------------------------------------------------------

TEST(EtcdBackendFaultTest, NothingListeningIsUnavailableWithinTheDeadline) {
  int port = testing::FreeLoopbackPort();
  auto b = OpenOrDie({"127.0.0.1:" + std::to_string(port)});
  auto start = Clock::now();
  auto g = b->get("/x", In(milliseconds(1000)));
  auto took = Clock::now() - start;
  EXPECT_EQ(g.status().code(), Code::kUnavailable) << g.status().ToString();
  EXPECT_NE(g.status().message().find(std::to_string(port)), std::string_view::npos);
  EXPECT_LT(took, milliseconds(1100));
  EXPECT_EQ(b->revision(In(milliseconds(200))).status().code(), Code::kUnavailable);
  // A deadline already past is not a hang either.
  auto p = b->put("/x", "v", 0, std::nullopt, Clock::now() - milliseconds(1));
  EXPECT_TRUE(p.status().code() == Code::kTimedOut || p.status().code() == Code::kUnavailable);
}

TEST(EtcdBackendFaultTest, BadEndpointsAreInvalidArgument) {
  EXPECT_EQ(OpenEtcdBackend({}, false, {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(OpenEtcdBackend({"nohostport"}, false, {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(OpenEtcdBackend({"127.0.0.1:0"}, false, {}).status().code(), Code::kInvalidArgument);
}

TEST_F(EtcdBackendTest, PausedEtcdCallsReturnByDeadlineAndWatchRecovers) {
  testing::WatchCollector c;
  auto w = backend_->watch("/p/", 0, c.Events(), c.Errors());
  ASSERT_TRUE(w.ok());
  std::vector<Written> want;
  auto p = Put("/p/a", "1");
  ASSERT_TRUE(p.ok());
  want.push_back({*p, "/p/a", false});
  ASSERT_TRUE(c.WaitEvents(1));
  Status paused = etcd_.Pause();
  ASSERT_TRUE(paused.ok()) << paused.ToString();
  for (int i = 0; i < 3; ++i) {
    auto start = Clock::now();
    auto g = backend_->get("/p/a", In(milliseconds(500)));
    auto took = Clock::now() - start;
    EXPECT_TRUE(g.status().code() == Code::kTimedOut || g.status().code() == Code::kUnavailable)
        << g.status().ToString();
    EXPECT_LT(took, milliseconds(800));
  }
  // Long enough for the watch's idle probe to fail and the watch to re-open its stream.
  std::this_thread::sleep_for(milliseconds(3500));
  etcd_.Resume();
  for (int i = 0; i < 5; ++i) {
    auto q = Put("/p/b", std::to_string(i));
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    want.push_back({*q, "/p/b", false});
  }
  ASSERT_TRUE(c.WaitEvents(want.size()));
  std::this_thread::sleep_for(milliseconds(200));
  ExpectExactly(c.Snapshot(), want);
}

TEST_F(EtcdBackendTest, FirstEndpointDeadSecondServes) {
  std::string dead = "127.0.0.1:" + std::to_string(testing::FreeLoopbackPort());
  auto b = OpenOrDie({dead, etcd_.endpoint()});
  for (int i = 0; i < 3; ++i) {
    auto p = b->put("/two", std::to_string(i), 0, std::nullopt, Soon());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    auto g = b->get("/two", Soon());
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    EXPECT_EQ(g->value, std::to_string(i));
  }
  testing::WatchCollector c;
  auto w = b->watch("/two", 0, c.Events(), c.Errors());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(b->put("/two", "w", 0, std::nullopt, Soon()).ok());
  EXPECT_TRUE(c.WaitEvents(1));
  // A second backend starting with the dead one for its watch (no call made before) too.
  auto b2 = OpenOrDie({dead, etcd_.endpoint()});
  testing::WatchCollector c2;
  auto w2 = b2->watch("/two", 1, c2.Events(), c2.Errors());
  ASSERT_TRUE(w2.ok());
  EXPECT_TRUE(c2.WaitEvents(4));  // the three puts and "w"
}

// A fake etcd answering every request with one canned HTTP response.
class CannedServer {
 public:
  explicit CannedServer(std::string response) : response_(std::move(response)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 16);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      while (true) {
        int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        char buf[65536];
        std::string req;
        // Read the headers and the (small) body, then answer and close.
        while (req.find("\r\n\r\n") == std::string::npos) {
          ssize_t n = ::recv(c, buf, sizeof buf, 0);
          if (n <= 0) break;
          req.append(buf, n);
        }
        ::send(c, response_.data(), response_.size(), MSG_NOSIGNAL);
        ::shutdown(c, SHUT_RDWR);
        ::close(c);
      }
    });
  }
  ~CannedServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  std::string response_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

std::string HttpResponse(int status, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

TEST(EtcdBackendFaultTest, MalformedAnswersAreErrorsNotCrashes) {
  const std::vector<std::string> bodies = {
      "not json",
      "[]",
      R"({"kvs":"x"})",
      R"({"kvs":[{"key":"!!!!"}]})",
      R"({"kvs":[{"key":"YQ==","mod_revision":{}}]})",
      R"({"kvs":[7]})",
      R"({"header":{"revision":"abc"}})",
      R"({"header":"x","deleted":"1"})",
      R"({"result":[],"TTL":true,"ID":"x","succeeded":"yes","events":5})",
      R"({"error":{"grpc_code":"z"}})",
      "{\"a\":\"\xff\xfe\"}",
  };
  for (const std::string& body : bodies) {
    for (int status : {200, 400, 500}) {
      CannedServer server(HttpResponse(status, body));
      auto b = OpenOrDie({server.endpoint()});
      auto g = b->get("a", Soon());
      EXPECT_FALSE(g.ok()) << body;
      auto r = b->range("a", Soon());
      EXPECT_FALSE(r.ok() && !r->kvs.empty() && r->revision > 0) << body;
      auto p = b->put("a", "v", 0, int64_t{3}, Soon());
      EXPECT_FALSE(p.ok()) << body;
      EXPECT_FALSE(b->remove("a", Soon()).ok()) << body;
      EXPECT_FALSE(b->lease_grant(milliseconds(1000), Soon()).ok()) << body;
      EXPECT_FALSE(b->lease_keepalive(1, Soon()).ok()) << body;
      testing::WatchCollector c;
      auto w = b->watch("a", 5, c.Events(), c.Errors());
      ASSERT_TRUE(w.ok());
      std::this_thread::sleep_for(milliseconds(20));
      w->reset();
      EXPECT_TRUE(c.Snapshot().empty()) << body;
    }
  }
  CannedServer html(HttpResponse(502, "<html>bad gateway</html>"));
  auto b = OpenOrDie({html.endpoint()});
  auto g = b->get("a", Soon());
  EXPECT_EQ(g.status().code(), Code::kProtocol) << g.status().ToString();
  EXPECT_NE(g.status().message().find("502"), std::string_view::npos);
}

// ---- auth -------------------------------------------------------------------------------------

TEST_F(EtcdBackendTest, AuthRightPasswordWorksWrongIsPermissionDenied) {
  std::string out;
  ASSERT_TRUE(etcd_.Etcdctl({"user", "add", "root:pw"}, &out).ok()) << out;
  (void)etcd_.Etcdctl({"user", "grant-role", "root", "root"});
  ASSERT_TRUE(etcd_.Etcdctl({"auth", "enable"}, &out).ok()) << out;

  ClusterOptions good;
  good.user = "root";
  good.password = "pw";
  auto b = OpenOrDie({etcd_.endpoint()}, good);
  auto p = b->put("/auth/k", "v", 0, std::nullopt, Soon());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(b->get("/auth/k", Soon())->value, "v");
  testing::WatchCollector c;
  auto w = b->watch("/auth/", 0, c.Events(), c.Errors());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(b->put("/auth/k", "w", 0, std::nullopt, Soon()).ok());
  EXPECT_TRUE(c.WaitEvents(1));

  // etcd's simple tokens die with the process: the backend re-authenticates by itself, and so
  // does the watch.
  etcd_.Stop();
  ASSERT_TRUE(etcd_.Restart().ok());
  auto p2 = b->put("/auth/k", "x", 0, std::nullopt, Soon());
  ASSERT_TRUE(p2.ok()) << p2.status().ToString();
  EXPECT_TRUE(c.WaitEvents(2)) << "watch did not come back with a fresh token";

  ClusterOptions bad = good;
  bad.password = "wrong";
  auto wrong = OpenOrDie({etcd_.endpoint()}, bad)->get("/auth/k", Soon());
  EXPECT_EQ(wrong.status().code(), Code::kPermissionDenied) << wrong.status().ToString();
  auto none = backend_->get("/auth/k", Soon());  // no user at all
  EXPECT_EQ(none.status().code(), Code::kPermissionDenied) << none.status().ToString();
  testing::WatchCollector bc;
  auto bw = OpenOrDie({etcd_.endpoint()}, bad)->watch("/auth/", 1, bc.Events(), bc.Errors());
  ASSERT_TRUE(bw.ok());
  ASSERT_TRUE(bc.WaitErrors(1));
  EXPECT_EQ(bc.errors[0].code(), Code::kPermissionDenied);
}

}  // namespace
}  // namespace farmem::cluster
