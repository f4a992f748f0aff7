// Unit tests of the regions sync primitives: an in-process MemoryServer (tcp, loopback), names in
// a memory:// cluster store, several users (each its own Node and RegionSync) on threads. Record
// codec, barrier/mutex/bell semantics, racing inits, abandoned mutex tickets, every error path.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include "regions/sync/sync_cell.h"
#include "regions/sync/sync_test_util.h"

namespace farmem::regions::sync {
namespace {

using namespace std::chrono_literals;
using testing::SyncUser;

TEST(SyncRecord, RoundTripsAndRejectsMalformed) {
  NameRecord r;
  r.kind = Kind::kMutex;
  r.parties = 0;
  r.nonce = 0xdeadbeef12345677ull;
  r.key = 0xabc;
  r.offset = 4096;
  r.address = "127.0.0.1:4242";
  auto back = DecodeNameRecord(EncodeNameRecord(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->kind, r.kind);
  EXPECT_EQ(back->nonce, r.nonce);
  EXPECT_EQ(back->key, r.key);
  EXPECT_EQ(back->offset, r.offset);
  EXPECT_EQ(back->address, r.address);
  for (const char* bad :
       {"", "farmem-sync", "farmem-sync 2 mutex 0 1 1 0 a:1", "farmem-sync 1 lock 0 1 1 0 a:1",
        "farmem-sync 1 barrier 0 1 1 0 a:1", "farmem-sync 1 mutex 0 1 1 3 a:1",
        "farmem-sync 1 mutex x 1 1 0 a:1", "farmem-sync 1 mutex 0 1 1 0 noport",
        "farmem-sync 1 mutex 0 1 1 0 a:1 x"}) {
    EXPECT_EQ(DecodeNameRecord(bad).status().code(), Code::kProtocol) << bad;
  }
  EXPECT_TRUE(ValidateSyncName("jobs/round-1.b_2").ok());
  EXPECT_EQ(ValidateSyncName("").code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateSyncName("a b").code(), Code::kInvalidArgument);
  EXPECT_EQ(ValidateSyncName(std::string(201, 'a')).code(), Code::kInvalidArgument);
}

class SyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::ApplyFaultFromEnv();
    auto s = testing::StartSyncServer();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    cluster_.url = "memory://regions-sync-" + std::to_string(counter_++);
    cluster_.create_if_missing = true;
  }
  void TearDown() override {
    users_.clear();
    if (server_) server_->stop();
  }
  RegionSync& User(size_t i) {
    while (users_.size() <= i) {
      auto u = SyncUser::Open(server_->node().bootstrap_address(), cluster_);
      EXPECT_TRUE(u.ok()) << u.status().ToString();
      if (!u.ok()) std::abort();
      users_.push_back(std::move(*u));
    }
    return *users_[i]->sync;
  }

  static inline int counter_ = 0;
  std::unique_ptr<MemoryServer> server_;
  ClusterOptions cluster_;
  std::vector<std::unique_ptr<SyncUser>> users_;
};

TEST_F(SyncTest, BarrierReleasesOnlyWhenAllArrivedAndIsReusable) {
  constexpr int kParties = 3, kRounds = 5;
  for (int i = 0; i < kParties; i++) ASSERT_TRUE(User(i).rbarrier_init("b", kParties).ok());
  std::atomic<int> arrived{0};
  std::atomic<int> early{0};
  std::vector<Status> errors(kParties);
  std::vector<std::thread> threads;
  for (int i = 0; i < kParties; i++) {
    threads.emplace_back([&, i] {
      for (int r = 0; r < kRounds; r++) {
        arrived.fetch_add(1);
        Status st = User(i).rbarrier_wait("b", 20s);
        if (!st.ok()) {
          errors[i] = st;
          return;
        }
        if (arrived.load() < (r + 1) * kParties) early.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) EXPECT_TRUE(e.ok()) << e.ToString();
  EXPECT_EQ(early.load(), 0) << "a party passed a round before all had arrived";
}

TEST_F(SyncTest, BarrierWaitTimesOutWithMissingParties) {
  ASSERT_TRUE(User(0).rbarrier_init("b2", 2).ok());
  Status st = User(0).rbarrier_wait("b2", 30ms);
  EXPECT_EQ(st.code(), Code::kTimedOut) << st.ToString();
  EXPECT_NE(st.message().find("1 of 2 parties missing"), std::string::npos) << st.ToString();
  // The timed-out arrival counted: one more arrival completes the round.
  EXPECT_TRUE(User(1).rbarrier_wait("b2", 20s).ok());
}

TEST_F(SyncTest, RacingInitsAgreeOnOneCell) {
  constexpr int kUsers = 4;
  for (int i = 0; i < kUsers; i++) User(i);
  std::vector<Status> st(kUsers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kUsers; i++) {
    threads.emplace_back([&, i] { st[i] = User(i).rbell_init("race"); });
  }
  for (auto& t : threads) t.join();
  for (auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  // One cell: rings through every user add up on it.
  for (int i = 0; i < kUsers; i++) ASSERT_TRUE(User(i).rbell_ring("race").ok());
  auto v = User(0).rbell_wait("race", 1s);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, uint64_t{kUsers});
}

TEST_F(SyncTest, MutexIsExclusiveAcrossUsers) {
  constexpr int kUsers = 3, kIters = 50;
  for (int i = 0; i < kUsers; i++) ASSERT_TRUE(User(i).rmutex_init("m").ok());
  int64_t plain = 0;  // protected by the remote mutex only
  std::atomic<int> inside{0}, overlaps{0};
  std::vector<Status> errors(kUsers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kUsers; i++) {
    threads.emplace_back([&, i] {
      for (int k = 0; k < kIters; k++) {
        Status st = User(i).rmutex_lock("m", 20s);
        if (!st.ok()) {
          errors[i] = st;
          return;
        }
        if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
        // A read-modify-write that loses updates unless the lock is exclusive.
        std::atomic_ref<int64_t> p(plain);
        const int64_t v = p.load(std::memory_order_relaxed);
        std::this_thread::yield();
        p.store(v + 1, std::memory_order_relaxed);
        inside.fetch_sub(1);
        st = User(i).rmutex_unlock("m");
        if (!st.ok()) {
          errors[i] = st;
          return;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) EXPECT_TRUE(e.ok()) << e.ToString();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(plain, int64_t{kUsers * kIters});
}

TEST_F(SyncTest, TimedOutMutexWaiterIsSkipped) {
  ASSERT_TRUE(User(0).rmutex_init("m").ok());
  ASSERT_TRUE(User(0).rmutex_lock("m", 1s).ok());
  // User 1 gives up: its ticket is abandoned.
  Status st = User(1).rmutex_lock("m", 30ms);
  EXPECT_EQ(st.code(), Code::kTimedOut) << st.ToString();
  // User 2 queues behind the abandoned ticket and still gets the lock once user 0 unlocks.
  std::atomic<bool> got{false};
  Status st2;
  User(2);
  std::thread t([&] {
    st2 = User(2).rmutex_lock("m", 20s);
    got = st2.ok();
  });
  std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(User(0).rmutex_unlock("m").ok());
  t.join();
  EXPECT_TRUE(got.load()) << st2.ToString();
  ASSERT_TRUE(User(2).rmutex_unlock("m").ok());
  // And user 1 can take it again.
  EXPECT_TRUE(User(1).rmutex_lock("m", 5s).ok());
  EXPECT_TRUE(User(1).rmutex_unlock("m").ok());
}

TEST_F(SyncTest, AbandonedTicketBeingServedIsPassedOn) {
  // The waiter times out exactly as it is served: whichever of unlocker and waiter sees the
  // abandon mark passes the ticket on; the lock must stay usable in every interleaving.
  ASSERT_TRUE(User(0).rmutex_init("m").ok());
  User(1);
  for (int i = 0; i < 20; i++) {
    ASSERT_TRUE(User(0).rmutex_lock("m", 5s).ok());
    Status waiter;
    std::thread t([&] { waiter = User(1).rmutex_lock("m", 2ms); });
    std::this_thread::sleep_for(std::chrono::microseconds(200 * (i % 10)));
    ASSERT_TRUE(User(0).rmutex_unlock("m").ok());
    t.join();
    if (waiter.ok()) {
      ASSERT_TRUE(User(1).rmutex_unlock("m").ok());
    } else {
      ASSERT_EQ(waiter.code(), Code::kTimedOut) << waiter.ToString();
    }
  }
  ASSERT_TRUE(User(0).rmutex_lock("m", 5s).ok()) << "the lock was left stuck";
  ASSERT_TRUE(User(0).rmutex_unlock("m").ok());
}

TEST_F(SyncTest, BellWaitReturnsEachChangeAndTimesOut) {
  ASSERT_TRUE(User(0).rbell_init("bell").ok());
  EXPECT_EQ(User(0).rbell_wait("bell", 20ms).status().code(), Code::kTimedOut);
  auto r = User(1).rbell_ring("bell");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 1u);
  auto v = User(0).rbell_wait("bell", 5s);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 1u);
  // No ring since the last wait: times out.
  EXPECT_EQ(User(0).rbell_wait("bell", 20ms).status().code(), Code::kTimedOut);
  ASSERT_TRUE(User(1).rbell_ring("bell").ok());
  ASSERT_TRUE(User(1).rbell_ring("bell").ok());
  v = User(0).rbell_wait("bell", 5s);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 3u);
}

TEST_F(SyncTest, BellCreatedAgainStartsFromZeroForWaiters) {
  ASSERT_TRUE(User(0).rbell_init("again").ok());
  for (int i = 0; i < 3; i++) ASSERT_TRUE(User(0).rbell_ring("again").ok());
  auto v = User(1).rbell_wait("again", 5s);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 3u);
  // Deleted and created again by another user: a new cell, counted from 0.
  ASSERT_TRUE(User(0).rdelete("again").ok());
  ASSERT_TRUE(User(0).rbell_init("again").ok());
  for (int i = 0; i < 3; i++) ASSERT_TRUE(User(0).rbell_ring("again").ok());
  // User 1's cached handle is stale: it looks the name up again and waits on the new cell.
  v = User(1).rbell_wait("again", 5s);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 3u);
}

TEST_F(SyncTest, ErrorsNameTheProblem) {
  RegionSync& s = User(0);
  EXPECT_EQ(s.rbarrier_wait("nope", 10ms).code(), Code::kNotFound);
  EXPECT_EQ(s.rbell_ring("nope").status().code(), Code::kNotFound);
  EXPECT_EQ(s.rdelete("nope").code(), Code::kNotFound);
  EXPECT_EQ(s.rbarrier_init("bad name", 2).code(), Code::kInvalidArgument);
  EXPECT_EQ(s.rbarrier_init("b", 0).code(), Code::kInvalidArgument);
  EXPECT_EQ(s.rbarrier_wait("b", -1ms).code(), Code::kInvalidArgument);
  ASSERT_TRUE(s.rbarrier_init("b", 2).ok());
  Status st = s.rbarrier_init("b", 3);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("n = 2"), std::string::npos) << st.ToString();
  st = s.rmutex_init("b");
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  st = s.rmutex_lock("b", 10ms);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("is a barrier, not a mutex"), std::string::npos) << st.ToString();
  EXPECT_EQ(s.rbell_wait("b", 10ms).status().code(), Code::kFailedPrecondition);
  ASSERT_TRUE(s.rmutex_init("m").ok());
  EXPECT_EQ(s.rmutex_unlock("m").code(), Code::kFailedPrecondition);
  ASSERT_TRUE(s.rmutex_lock("m", 1s).ok());
  EXPECT_EQ(s.rmutex_lock("m", 10ms).code(), Code::kFailedPrecondition);  // not recursive
  ASSERT_TRUE(s.rmutex_unlock("m").ok());
  // A name that is not a sync record: a clear error, not a crash.
  ASSERT_TRUE(users_[0]->cluster->put("regions/sync/garbage", "hello").ok());
  EXPECT_EQ(s.rbell_ring("garbage").status().code(), Code::kProtocol);
  // No RawClient: using works, creating does not.
  auto sync = RegionSync::Open(*users_[0]->node, *users_[0]->cluster, nullptr);
  ASSERT_TRUE(sync.ok());
  EXPECT_EQ((*sync)->rbell_init("new").code(), Code::kFailedPrecondition);
  EXPECT_TRUE((*sync)->rbarrier_init("b", 2).ok());  // agrees with the existing one
}

TEST_F(SyncTest, DeleteWakesWaitersWithNotFoundAndFreesTheName) {
  ASSERT_TRUE(User(0).rbell_init("gone").ok());
  User(1);
  Status waiter;
  std::thread t([&] { waiter = User(1).rbell_wait("gone", 20s).status(); });
  std::this_thread::sleep_for(20ms);
  ASSERT_TRUE(User(0).rdelete("gone").ok());
  t.join();
  EXPECT_EQ(waiter.code(), Code::kNotFound) << waiter.ToString();
  EXPECT_EQ(User(1).rbell_ring("gone").status().code(), Code::kNotFound);
  EXPECT_EQ(User(0).rdelete("gone").code(), Code::kNotFound);
  // The name can be created again, as another kind.
  ASSERT_TRUE(User(1).rmutex_init("gone").ok());
  EXPECT_TRUE(User(0).rmutex_lock("gone", 1s).ok());
  EXPECT_TRUE(User(0).rmutex_unlock("gone").ok());
}

}  // namespace
}  // namespace farmem::regions::sync
