// Channels across three in-process nodes on native TCP and fabric shm: joins, subsets, ack keys,
// fences, owned/atomic vars, barrier, ticket lock, a stopped node; one ChannelThread per OS thread.
// FARMEM_CHANNELS_FAULT=checksum|barrier_wait|fence|lock_wait|swap: one check fails (channels.md).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "channels/channels_faults.h"
#include "channels/channels_test_util.h"
#include "farmem/channels.h"

namespace farmem::channels {
namespace {

using namespace std::chrono_literals;
using testing_util::ChannelsTest;
using testing_util::Fault;
using testing_util::Member;
using Clock = std::chrono::steady_clock;

TEST_P(ChannelsTest, JoinBeforeAndAfterThePeerEndpointExists) {
  START_ALL_OR_SKIP();
  // Node 1 opens first: its joins reach nodes 2 and 3 before their endpoints exist and are kept.
  auto a = Channel::Open(*M(1).thr, "bar/sst/row0", {1, 2, 3}, 64);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->wait_ready(100ms).code(), Code::kTimedOut);
  std::this_thread::sleep_for(50ms);
  auto b = Channel::Open(*M(2).thr, "bar/sst/row0", {1, 2, 3}, 64);
  ASSERT_TRUE(b.ok());
  auto c = Channel::Open(*M(3).thr, "bar/sst/row0", {1, 2, 3}, 64);
  ASSERT_TRUE(c.ok());
  for (const auto* ch : {&*a, &*b, &*c}) {
    Status st = ch->wait_ready(5s);
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  // Each knows the others' slices: a write through the channel lands in the peer's slice.
  uint64_t v = 0xabcdef;
  auto key = M(1).thr->write(3, *a->slice_offset(3), &v, 8);
  ASSERT_TRUE(key.ok());
  ASSERT_TRUE(M(1).thr->wait(*key, 5s).ok());
  uint64_t got = 0;
  ASSERT_TRUE(M(3).thr->read_sync(3, *c->slice_offset(3), &got, 8).ok());
  EXPECT_EQ(got, v);
  // Opening the same name twice on a node is refused; a sub-channel gets a path name.
  EXPECT_EQ(Channel::Open(*M(1).thr, "bar/sst/row0", {1, 2}, 64).status().code(),
            Code::kFailedPrecondition);
  auto sub = a->Sub(*M(1).thr, "cells", 16);
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ(sub->name(), "bar/sst/row0/cells");
}

TEST_P(ChannelsTest, SlowPeerJoinsLaterAndWaitReadyNamesTheMissing) {
  ASSERT_TRUE(StartMember(1) || !skip_.empty());
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_TRUE(StartMember(2));
  // Node 3 is not up: connect reports it, the others work.
  Status st = M(1).mgr->connect(200ms);
  EXPECT_EQ(st.code(), Code::kTimedOut);
  EXPECT_NE(st.ToString().find("3"), std::string::npos) << st.ToString();
  ASSERT_EQ(M(2).mgr->connect(200ms).code(), Code::kTimedOut);
  auto a = Channel::Open(*M(1).thr, "slow", {1, 2, 3}, 8);
  auto b = Channel::Open(*M(2).thr, "slow", {1, 2, 3}, 8);
  ASSERT_TRUE(a.ok() && b.ok());
  st = a->wait_ready(200ms);
  EXPECT_EQ(st.code(), Code::kTimedOut);
  EXPECT_NE(st.ToString().find("nodes 3 have not joined"), std::string::npos) << st.ToString();
  // The slow peer arrives: it connects, opens, and its joins complete everyone.
  ASSERT_TRUE(StartMember(3));
  ASSERT_TRUE(M(3).mgr->connect(5s).ok());
  auto c = Channel::Open(*M(3).thr, "slow", {1, 2, 3}, 8);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(a->wait_ready(5s).ok());
  EXPECT_TRUE(b->wait_ready(5s).ok());
  EXPECT_TRUE(c->wait_ready(5s).ok());
  ASSERT_TRUE(M(1).mgr->connect(5s).ok());
  auto av = AtomicVar::Open(*M(1).thr, "slow/counter", 3, {1, 3});
  auto cv = AtomicVar::Open(*M(3).thr, "slow/counter", 3, {1, 3});
  ASSERT_TRUE(av.ok() && cv.ok());
  ASSERT_TRUE(av->wait_ready(5s).ok());
  EXPECT_EQ(*av->fetch_add(*M(1).thr, 5), 0u);
  EXPECT_EQ(*cv->load(*M(3).thr), 5u);
}

TEST_P(ChannelsTest, SubsetChannelSpansTwoOfThreeNodes) {
  START_ALL_OR_SKIP();
  auto a = OwnedVar<uint64_t>::Open(*M(1).thr, "pair", 1, {1, 3});
  auto c = OwnedVar<uint64_t>::Open(*M(3).thr, "pair", 1, {1, 3});
  ASSERT_TRUE(a.ok() && c.ok());
  ASSERT_TRUE(a->wait_ready(5s).ok());
  ASSERT_TRUE(c->wait_ready(5s).ok());
  ASSERT_TRUE(a->store(77).ok());
  auto key = a->push(*M(1).thr);
  ASSERT_TRUE(key.ok());
  ASSERT_TRUE(M(1).thr->wait(*key, 5s).ok());
  EXPECT_EQ(*c->load(*M(3).thr), 77u);
  // Node 2 is no member: a channel it opens with that name on other members does not join it.
  auto b = Channel::Open(*M(2).thr, "pair", {2, 3}, 24);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->wait_ready(200ms).code(), Code::kTimedOut);
}

TEST_P(ChannelsTest, AckKeysUnionAndWait) {
  START_ALL_OR_SKIP();
  auto a = Channel::Open(*M(1).thr, "acks", {1, 2, 3}, 64);
  auto b = Channel::Open(*M(2).thr, "acks", {1, 2, 3}, 64);
  auto c = Channel::Open(*M(3).thr, "acks", {1, 2, 3}, 64);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_TRUE(a->wait_ready(5s).ok());
  uint64_t v = 9;
  AckKey all;
  EXPECT_TRUE(all.empty());
  for (NodeId n : {2u, 3u}) {
    auto k = M(1).thr->write(n, *a->slice_offset(n), &v, 8);
    ASSERT_TRUE(k.ok());
    all |= *k;
  }
  EXPECT_EQ(all.size(), 2u);
  EXPECT_EQ((all | all).size(), 2u);
  ASSERT_TRUE(M(1).thr->wait(all, 5s).ok());
  EXPECT_TRUE(M(1).thr->query(all));
  // A held op keeps its key (and the union) pending until released.
  M(1).thr->testing_hold_next_write();
  auto held = M(1).thr->write(2, *a->slice_offset(2), &v, 8);
  ASSERT_TRUE(held.ok());
  EXPECT_FALSE(M(1).thr->query(*held | all));
  M(1).thr->testing_release_held();
  EXPECT_TRUE(M(1).thr->wait(*held | all, 5s).ok());
  // An op that fails reports through its key: a write outside the region.
  auto bad = M(1).thr->write(2, (1 << 20) - 4, &v, 8);
  if (bad.ok()) {
    EXPECT_FALSE(M(1).thr->wait(*bad, 5s).ok());
  }
}

// Message passing: data, fence, flag. The transport-level reordering is simulated by the
// channel thread's hold hook (neither native TCP nor fabric shm reorders two writes of one thread
// to one peer); the fence must post and complete the held data write before the flag.
TEST_P(ChannelsTest, FenceLitmusMessagePassing) {
  START_ALL_OR_SKIP();
  auto a = Channel::Open(*M(1).thr, "litmus", {1, 2}, 16);
  auto b = Channel::Open(*M(2).thr, "litmus", {1, 2}, 16);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->wait_ready(5s).ok());
  const uint64_t off = *a->slice_offset(2);
  const bool no_fence = Fault("fence");
  int violations = 0;
  for (uint64_t round = 1; round <= 100; round++) {
    auto& w = *M(1).thr;
    w.testing_hold_next_write();
    ASSERT_TRUE(w.write(2, off, &round, 8).ok());  // data
    if (!no_fence) {
      ASSERT_TRUE(w.fence_pair(2, 5s).ok());
    }
    auto flag = w.write(2, off + 8, &round, 8);
    ASSERT_TRUE(flag.ok());
    ASSERT_TRUE(w.wait(*flag, 5s).ok());
    uint64_t seen[2] = {0, 0};  // reader on node 2: plain read of its own memory
    ASSERT_TRUE(M(2).thr->read_sync(2, *b->slice_offset(2), seen, 16).ok());
    if (seen[1] == round && seen[0] != round) violations++;
    w.testing_release_held();
    ASSERT_TRUE(w.fence_thread(5s).ok());
  }
  EXPECT_EQ(violations, 0) << "flag seen without its data";
}

// What the real transport gives without any fence (docs/transport.md, "Ordering between
// operations"): native TCP places one thread's writes to one peer in posting order, so a reader
// that reads the flag and then the data never sees the data older than the flag. Nothing is
// promised on libfabric (FI_ORDER_NONE), so there the test only runs the fenced litmus above.
TEST_P(ChannelsTest, NativeTcpPlacesOneThreadsWritesInOrderConcurrent) {
  if (GetParam() != "tcp") GTEST_SKIP() << "no write order promised on " << GetParam();
  START_ALL_OR_SKIP();
  auto a = Channel::Open(*M(1).thr, "order", {1, 2}, 16);
  auto b = Channel::Open(*M(2).thr, "order", {1, 2}, 16);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->wait_ready(5s).ok());
  const uint64_t off = *a->slice_offset(2);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> checks{0}, inversions{0};
  std::thread reader([&] {
    auto thr = M(2).mgr->make_thread();
    ASSERT_TRUE(thr.ok());
    while (!stop.load()) {
      uint64_t flag = 0, data = 0;
      ASSERT_TRUE((*thr)->read_sync(2, off + 8, &flag, 8).ok());
      ASSERT_TRUE((*thr)->read_sync(2, off, &data, 8).ok());
      checks++;
      if (data < flag) inversions++;
    }
  });
  auto& w = *M(1).thr;
  const bool swap = Fault("swap");
  for (uint64_t r = 1; r <= (swap ? 2000u : 20000u); r++) {
    // FARMEM_CHANNELS_FAULT=swap posts the flag first and lets it land before the data (the
    // checker's own control: it must then see inversions).
    const uint64_t first = swap ? 8 : 0;
    ASSERT_TRUE(w.write(2, off + first, &r, 8).ok());  // data (no fence)
    if (swap) {
      ASSERT_TRUE(w.fence_thread(5s).ok());
      std::this_thread::sleep_for(20us);
    }
    ASSERT_TRUE(w.write(2, off + (8 - first), &r, 8).ok());  // flag
    if (r % 32 == 0) {
      ASSERT_TRUE(w.fence_thread(5s).ok());  // bound the ops in flight, not an ordering step
    }
  }
  ASSERT_TRUE(w.fence_thread(5s).ok());
  stop = true;
  reader.join();
  std::printf("order checks: %llu, inversions: %llu\n",
              static_cast<unsigned long long>(checks.load()),
              static_cast<unsigned long long>(inversions.load()));
  EXPECT_GT(checks.load(), 10u);
  EXPECT_EQ(inversions.load(), 0u)
      << "flag newer than data on native TCP, " << checks.load() << " checks";
}

TEST_P(ChannelsTest, GlobalFenceWaitsForOtherThreadsAndTimesOut) {
  START_ALL_OR_SKIP();
  auto a = Channel::Open(*M(1).thr, "gf", {1, 2}, 8);
  auto b = Channel::Open(*M(2).thr, "gf", {1, 2}, 8);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->wait_ready(5s).ok());
  auto other = M(1).mgr->make_thread();
  ASSERT_TRUE(other.ok());
  uint64_t v = 1;
  (*other)->testing_hold_next_write();
  ASSERT_TRUE((*other)->write(2, *a->slice_offset(2), &v, 8).ok());
  // The other thread's write is not placed (held): the global fence cannot pass.
  EXPECT_EQ(M(1).thr->fence_global(200ms).code(), Code::kTimedOut);
  (*other)->testing_release_held();
  ASSERT_TRUE((*other)->fence_thread(5s).ok());
  EXPECT_TRUE(M(1).thr->fence_global(5s).ok());
}

struct Big {
  uint64_t w[32];
};

TEST_P(ChannelsTest, OwnedVarNeverTornStress) {
  START_ALL_OR_SKIP();
  if (Fault("checksum")) testing::SetOwnedChecksumDisabled(true);
  std::vector<OwnedVar<Big>> vars;
  for (NodeId n = 1; n <= 3; n++) {
    auto v = OwnedVar<Big>::Open(*M(n).thr, "big", 1, {1, 2, 3});
    ASSERT_TRUE(v.ok());
    vars.push_back(std::move(*v));
  }
  for (auto& v : vars) ASSERT_TRUE(v.wait_ready(5s).ok());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> torn{0}, reads{0};
  auto check = [&](const Big& b) {
    reads++;
    for (uint64_t x : b.w) {
      if (x != b.w[0]) {
        torn++;
        return;
      }
    }
  };
  // Reader handles are copied before the writer starts (the writer's handle holds its seq).
  std::vector<OwnedVar<Big>> reader_vars = vars;
  std::vector<std::thread> readers;
  for (NodeId n = 1; n <= 3; n++) {
    readers.emplace_back([&, n] {
      auto thr = M(n).mgr->make_thread();
      ASSERT_TRUE(thr.ok());
      OwnedVar<Big>& v = reader_vars[n - 1];
      while (!stop.load()) {
        auto l = v.load(**thr);
        ASSERT_TRUE(l.ok()) << l.status().ToString();
        check(*l);
        if (n != 1) {
          auto p = v.pull(**thr);
          ASSERT_TRUE(p.ok()) << p.status().ToString();
          check(*p);
        }
      }
    });
  }
  std::thread writer([&] {
    Big b{};
    for (uint64_t i = 1; !stop.load(); i++) {
      for (auto& x : b.w) x = i;
      ASSERT_TRUE(vars[0].store(b).ok());
      auto k = vars[0].push(*M(1).thr);
      ASSERT_TRUE(k.ok());
      if (i % 8 == 0) {
        ASSERT_TRUE(M(1).thr->wait(*k, 5s).ok());
      }
    }
    ASSERT_TRUE(M(1).thr->fence_thread(5s).ok());
  });
  std::this_thread::sleep_for(1500ms);
  stop = true;
  writer.join();
  for (auto& t : readers) t.join();
  testing::SetOwnedChecksumDisabled(false);
  EXPECT_GT(reads.load(), 100u);
  EXPECT_EQ(torn.load(), 0u) << "torn values out of " << reads.load() << " reads";
}

TEST_P(ChannelsTest, AtomicVarFetchAddFromThreadsOnNodesIsExactConcurrent) {
  START_ALL_OR_SKIP();
  std::vector<AtomicVar> vars;
  for (NodeId n = 1; n <= 3; n++) {
    auto v = AtomicVar::Open(*M(n).thr, "counter", 2, {1, 2, 3});
    ASSERT_TRUE(v.ok());
    vars.push_back(*v);
  }
  for (auto& v : vars) ASSERT_TRUE(v.wait_ready(5s).ok());
  constexpr int kThreads = 2, kOps = 300;
  std::vector<std::vector<uint64_t>> seen(3 * kThreads);
  std::vector<std::thread> ts;
  for (NodeId n = 1; n <= 3; n++) {
    for (int t = 0; t < kThreads; t++) {
      ts.emplace_back([&, n, t] {
        auto thr = M(n).mgr->make_thread();
        ASSERT_TRUE(thr.ok());
        AtomicVar v = vars[n - 1];
        for (int i = 0; i < kOps; i++) {
          auto old = v.fetch_add(**thr, 1);
          ASSERT_TRUE(old.ok()) << old.status().ToString();
          seen[(n - 1) * kThreads + t].push_back(*old);
        }
      });
    }
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(*vars[0].load(*M(1).thr), uint64_t{3 * kThreads * kOps});
  std::vector<uint64_t> all;
  for (auto& s : seen) all.insert(all.end(), s.begin(), s.end());
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < all.size(); i++) ASSERT_EQ(all[i], i);
  // CAS at the home.
  EXPECT_EQ(*vars[2].compare_swap(*M(3).thr, 3 * kThreads * kOps, 7),
            uint64_t{3 * kThreads * kOps});
  EXPECT_EQ(*vars[1].load(*M(2).thr), 7u);
}

TEST_P(ChannelsTest, BarrierEpisodesStress) {
  START_ALL_OR_SKIP();
  if (Fault("barrier_wait")) testing::SetBarrierWaitDisabled(true);
  constexpr int kEpisodes = 200;
  std::vector<std::atomic<int>> entered(kEpisodes + 1);
  std::atomic<int> early{0}, stale{0};
  std::vector<Barrier> bars;
  std::vector<std::vector<OwnedVar<uint64_t>>> marks(3);  // marks[n][o]: owner o+1, at node n+1
  for (NodeId n = 1; n <= 3; n++) {
    auto b = Barrier::Open(*M(n).thr, "bar", {1, 2, 3});
    ASSERT_TRUE(b.ok());
    bars.push_back(std::move(*b));
    for (NodeId o = 1; o <= 3; o++) {
      auto v = OwnedVar<uint64_t>::Open(*M(n).thr, "bar-mark/" + std::to_string(o), o, {1, 2, 3});
      ASSERT_TRUE(v.ok());
      marks[n - 1].push_back(std::move(*v));
    }
  }
  for (auto& b : bars) ASSERT_TRUE(b.wait_ready(5s).ok());
  for (auto& ms : marks) {
    for (auto& m : ms) ASSERT_TRUE(m.wait_ready(5s).ok());
  }
  std::vector<std::thread> ts;
  for (NodeId n = 1; n <= 3; n++) {
    ts.emplace_back([&, n] {
      std::mt19937 rng(n);
      auto& thr = *M(n).thr;
      for (int k = 1; k <= kEpisodes; k++) {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        // Data written before the barrier (pushed, not waited for) ...
        ASSERT_TRUE(marks[n - 1][n - 1].store(static_cast<uint64_t>(k)).ok());
        ASSERT_TRUE(marks[n - 1][n - 1].push(thr).ok());
        entered[k]++;
        Status st = bars[n - 1].arrive_and_wait(thr, 10s);
        ASSERT_TRUE(st.ok()) << st.ToString();
        if (entered[k].load() != 3) early++;
        // ... is visible after it.
        for (NodeId o = 1; o <= 3; o++) {
          if (o == n) continue;
          auto v = marks[n - 1][o - 1].load(thr);
          ASSERT_TRUE(v.ok());
          if (*v < static_cast<uint64_t>(k)) stale++;
        }
      }
      ASSERT_TRUE(thr.fence_thread(5s).ok());
    });
  }
  for (auto& t : ts) t.join();
  testing::SetBarrierWaitDisabled(false);
  EXPECT_EQ(early.load(), 0) << "left an episode before everyone entered";
  EXPECT_EQ(stale.load(), 0) << "data written before the barrier not visible after it";
}

// A member that leaves an episode and then does not touch channels for a while (no polls) must
// not hold the others back: its arrival writes are not waited for, but they must leave before
// it returns. Each round uses fresh ChannelThreads whose contexts have not talked to the other
// node yet (so the arrival needs polls to go out: a connection to make on native TCP, a key
// lookup and a first post the shm provider refuses on fabric), whose own table is already warm
// (so the leaver sees the other's arrival at its first check), and the leaver stays idle after
// it returned. Without ChannelThread::flush at the barrier's exit, node 2 times out on fabric shm.
TEST_P(ChannelsTest, BarrierLeaverThatStopsPollingStillReleasesTheOthers) {
  START_ALL_OR_SKIP();
  constexpr int kRounds = 10;
  for (int r = 0; r < kRounds; r++) {
    const std::string name = "leaver/" + std::to_string(r);
    auto b1 = Barrier::Open(*M(1).thr, name, {1, 2});
    auto b2 = Barrier::Open(*M(2).thr, name, {1, 2});
    ASSERT_TRUE(b1.ok() && b2.ok());
    ASSERT_TRUE(b1->wait_ready(5s).ok() && b2->wait_ready(5s).ok());
    auto f1 = M(1).mgr->make_thread();
    auto f2 = M(2).mgr->make_thread();
    ASSERT_TRUE(f1.ok() && f2.ok());
    // Warm node 1's fresh context towards node 1 only (a read of its own region).
    uint64_t word = 0;
    ASSERT_TRUE((*f1)->read_sync(1, 0, &word, 8).ok());
    Status waiter;
    std::thread t2([&] { waiter = b2->arrive_and_wait(**f2, 3s); });
    // Node 2's arrival lands in node 1's table before node 1 arrives (not required: the check
    // only becomes weaker if it does not).
    std::this_thread::sleep_for(50ms);
    Status leaver = b1->arrive_and_wait(**f1, 3s);
    // Node 1 now stays away from its thread until node 2 is out.
    t2.join();
    ASSERT_TRUE(leaver.ok()) << leaver.ToString();
    ASSERT_TRUE(waiter.ok()) << "round " << r << ": " << waiter.ToString();
  }
}

// Mutual exclusion (a non-atomic remote read-increment-write inside the lock ends exact, an
// occupancy count stays 1) and FIFO (grants come in ticket order), 2 threads on each of 3 nodes.
TEST_P(ChannelsTest, TicketLockExcludesAndIsFifoConcurrent) {
  START_ALL_OR_SKIP();
  if (Fault("lock_wait")) testing::SetLockWaitDisabled(true);
  std::vector<TicketLock> locks;
  std::vector<Channel> data;
  for (NodeId n = 1; n <= 3; n++) {
    auto l = TicketLock::Open(*M(n).thr, "lock", 1, {1, 2, 3});
    auto d = Channel::Open(*M(n).thr, "lock-data", {1, 2, 3}, 8);
    ASSERT_TRUE(l.ok() && d.ok());
    locks.push_back(*l);
    data.push_back(*d);
  }
  for (auto& l : locks) ASSERT_TRUE(l.wait_ready(5s).ok());
  for (auto& d : data) ASSERT_TRUE(d.wait_ready(5s).ok());
  constexpr int kThreads = 2, kOps = 100;
  std::atomic<int> inside{0}, overlaps{0};
  std::mutex grants_mu;
  std::vector<uint64_t> grants;
  std::vector<std::thread> ts;
  for (NodeId n = 1; n <= 3; n++) {
    for (int t = 0; t < kThreads; t++) {
      ts.emplace_back([&, n] {
        auto thr = M(n).mgr->make_thread();
        ASSERT_TRUE(thr.ok());
        TicketLock l = locks[n - 1];
        const uint64_t off = *data[n - 1].slice_offset(2);
        for (int i = 0; i < kOps; i++) {
          uint64_t ticket = 0;
          Status st = l.lock(**thr, 10s, &ticket);
          ASSERT_TRUE(st.ok()) << st.ToString();
          if (inside.fetch_add(1) != 0) overlaps++;
          {
            std::lock_guard g(grants_mu);
            grants.push_back(ticket);
          }
          uint64_t v = 0;
          ASSERT_TRUE((*thr)->read_sync(2, off, &v, 8).ok());
          v++;
          ASSERT_TRUE((*thr)->write(2, off, &v, 8).ok());  // placed by unlock's fence
          inside.fetch_sub(1);
          ASSERT_TRUE(l.unlock(**thr, 5s).ok());
        }
      });
    }
  }
  for (auto& t : ts) t.join();
  testing::SetLockWaitDisabled(false);
  uint64_t total = 0;
  ASSERT_TRUE(M(1).thr->read_sync(2, *data[0].slice_offset(2), &total, 8).ok());
  EXPECT_EQ(overlaps.load(), 0) << "two holders at once";
  EXPECT_EQ(total, uint64_t{3 * kThreads * kOps}) << "lost updates inside the lock";
  size_t out_of_order = 0;
  for (size_t i = 0; i < grants.size(); i++) out_of_order += grants[i] != i;
  EXPECT_EQ(out_of_order, 0u) << "grants not in ticket order";
}

TEST_P(ChannelsTest, StoppedParticipantGivesErrorsWithinTimeout) {
  for (NodeId id = 1; id <= kNodes; id++) {
    if (!StartMember(id, 1000ms)) {
      if (!skip_.empty()) GTEST_SKIP() << skip_;
      FAIL();
    }
  }
  for (auto& m : members_) ASSERT_TRUE(m.mgr->connect(5s).ok());
  std::vector<Barrier> bars;
  std::vector<AtomicVar> atoms;
  for (NodeId n = 1; n <= 3; n++) {
    auto b = Barrier::Open(*M(n).thr, "dead/bar", {1, 2, 3});
    auto a = AtomicVar::Open(*M(n).thr, "dead/atom", 3, {1, 2, 3});
    ASSERT_TRUE(b.ok() && a.ok());
    bars.push_back(std::move(*b));
    atoms.push_back(*a);
  }
  for (auto& b : bars) ASSERT_TRUE(b.wait_ready(5s).ok());
  for (auto& a : atoms) ASSERT_TRUE(a.wait_ready(5s).ok());
  ASSERT_TRUE(atoms[0].fetch_add(*M(1).thr, 1).ok());
  // A lock homed at node 1, taken by node 3 before it goes away.
  auto lock1 = TicketLock::Open(*M(1).thr, "dead/lock", 1, {1, 3});
  auto lock3 = TicketLock::Open(*M(3).thr, "dead/lock", 1, {1, 3});
  ASSERT_TRUE(lock1.ok() && lock3.ok());
  ASSERT_TRUE(lock3->wait_ready(5s).ok());
  ASSERT_TRUE(lock3->lock(*M(3).thr, 5s).ok());
  // Node 3 is alive but does not arrive: the others time out naming it.
  {
    std::thread other([&] { EXPECT_FALSE(bars[1].arrive_and_wait(*M(2).thr, 300ms).ok()); });
    Status late = bars[0].arrive_and_wait(*M(1).thr, 300ms);
    other.join();
    EXPECT_EQ(late.code(), Code::kTimedOut);
    EXPECT_NE(late.ToString().find("nodes 3 did not arrive"), std::string::npos) << late.ToString();
  }
  // Node 3 goes away.
  M(3).thr.reset();
  M(3).node->stop();
  auto timed = [](auto fn, std::chrono::milliseconds limit) {
    const auto t0 = Clock::now();
    Status st = fn();
    const auto took = Clock::now() - t0;
    EXPECT_FALSE(st.ok());
    EXPECT_LT(took, limit) << st.ToString();
    return st;
  };
  // Barrier: 2 nodes arrive, the third never does -> error within the barrier's timeout (+1 s).
  std::thread other([&] {
    Status st = bars[1].arrive_and_wait(*M(2).thr, 1500ms);
    EXPECT_FALSE(st.ok());
  });
  Status st = timed([&] { return bars[0].arrive_and_wait(*M(1).thr, 1500ms); }, 2500ms);
  other.join();
  std::printf("barrier with a stopped member: %s\n", st.ToString().c_str());
  // Atomic homed at the dead node: error within op_timeout (1 s) + 1 s.
  st = timed([&] { return atoms[0].fetch_add(*M(1).thr, 1).status(); }, 2500ms);
  std::printf("atomic at a stopped home: %s\n", st.ToString().c_str());
  // The lock's holder is gone: acquiring errors at the deadline.
  st = timed([&] { return lock1->lock(*M(1).thr, 500ms); }, 1500ms);
  EXPECT_EQ(st.code(), Code::kTimedOut);
  std::printf("lock held by a stopped node: %s\n", st.ToString().c_str());
  // A new channel with the dead node: wait_ready errors at its deadline.
  auto ch = Channel::Open(*M(1).thr, "dead/new", {1, 3}, 8);
  ASSERT_TRUE(ch.ok());
  st = timed([&] { return ch->wait_ready(500ms); }, 1500ms);
  EXPECT_EQ(st.code(), Code::kTimedOut);
}

INSTANTIATE_TEST_SUITE_P(Backends, ChannelsTest, ::testing::Values("tcp", "fabric:shm"),
                         testing_util::BackendName);

}  // namespace
}  // namespace farmem::channels
