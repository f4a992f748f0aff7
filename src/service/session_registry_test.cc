// Tests of SessionRegistry (docs/sessions.md): open / keepalive / close, lease expiry by the
// reaper, max sessions, TTL clamping, the guard-vs-end handshake (an allocation in flight while its
// session ends is freed by the end listener, never leaked), and malformed SESSION_* requests.
#include "service/session_registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <set>
#include <thread>

#include "common/wait_for_test_util.h"
#include "common/wire_struct.h"
#include "node/session_wire.h"

namespace farmem {
namespace {

namespace wire = session_wire;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// The shared poll with this file's usual deadline.
template <typename Cond>
bool WaitFor(Cond cond, std::chrono::milliseconds limit = 5000ms) {
  return testing::WaitFor(cond, limit);
}

// A fake service's allocations: owner per allocation, freed by the end listener.
struct FakeOwned {
  std::mutex mu;
  std::multiset<SessionIndex> live;  // one entry per live owned allocation
  std::atomic<uint64_t> ended{0};

  void Add(SessionIndex i) {
    std::lock_guard lock(mu);
    if (i != kPersistentIndex) live.insert(i);
  }
  SessionFreed End(SessionIndex i) {
    std::lock_guard lock(mu);
    SessionFreed f;
    f.objects = live.count(i);
    f.raw_bytes = 64 * f.objects;
    live.erase(i);
    ended.fetch_add(1);
    return f;
  }
  size_t Count(SessionIndex i) {
    std::lock_guard lock(mu);
    return live.count(i);
  }
};

SessionOptions Short() {
  SessionOptions o;
  o.ttl_min = 50ms;
  o.ttl_max = 60s;
  o.reap_interval = 10ms;
  return o;
}

TEST(SessionRegistryTest, OpenKeepaliveCloseFreesTheOwnedAllocations) {
  FakeOwned owned;
  SessionRegistry r(Short());
  r.add_end_listener([&](SessionIndex i) { return owned.End(i); });
  auto a = r.open(10s, "a");
  auto b = r.open(10s, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->id, 0u);
  EXPECT_NE(a->id, b->id);
  EXPECT_NE(a->index, b->index);
  EXPECT_NE(a->index, kPersistentIndex);
  for (int i = 0; i < 3; ++i) {
    auto g = r.acquire(a->id);
    ASSERT_TRUE(g.ok());
    EXPECT_EQ(g->index(), a->index);
    owned.Add(g->index());
  }
  {
    auto g = r.acquire(b->id);
    ASSERT_TRUE(g.ok());
    owned.Add(g->index());
  }
  EXPECT_TRUE(r.keepalive(a->id).ok());
  auto freed = r.close(a->id);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(freed->objects, 3u);
  EXPECT_EQ(freed->raw_bytes, 192u);
  EXPECT_EQ(owned.Count(a->index), 0u);
  EXPECT_EQ(owned.Count(b->index), 1u);  // the other session keeps its allocation
  // The ended session is gone for every call.
  EXPECT_EQ(r.keepalive(a->id).code(), Code::kNotFound);
  EXPECT_EQ(r.close(a->id).status().code(), Code::kNotFound);
  EXPECT_EQ(r.acquire(a->id).status().code(), Code::kNotFound);
  EXPECT_EQ(r.acquire(12345).status().code(), Code::kNotFound);
  const SessionRegistryStats s = r.stats();
  EXPECT_EQ(s.open, 1u);
  EXPECT_EQ(s.opened_total, 2u);
  EXPECT_EQ(s.closed_total, 1u);
  EXPECT_EQ(s.objects_freed_total, 3u);
  EXPECT_EQ(s.raw_bytes_freed_total, 192u);
  EXPECT_EQ(s.unknown_total, 4u);
}

TEST(SessionRegistryTest, PersistentGuardNeedsNoSession) {
  SessionRegistry r(Short());
  auto g = r.acquire(wire::kPersistentSession);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->index(), kPersistentIndex);
}

TEST(SessionRegistryTest, TtlIsClampedToTheServersRange) {
  SessionOptions o = Short();
  o.ttl_min = 1s;
  o.ttl_max = 5s;
  o.ttl_default = 3s;
  SessionRegistry r(o);
  EXPECT_EQ(r.open(10ms, "")->ttl, 1s);
  EXPECT_EQ(r.open(1h, "")->ttl, 5s);
  EXPECT_EQ(r.open(2500ms, "")->ttl, 2500ms);
  EXPECT_EQ(r.open(0ms, "")->ttl, 3s);
}

TEST(SessionRegistryTest, ReaperEndsExpiredSessionsAndKeepaliveKeepsOnesAlive) {
  FakeOwned owned;
  SessionRegistry r(Short());
  r.add_end_listener([&](SessionIndex i) { return owned.End(i); });
  r.start();
  auto dead = r.open(100ms, "dead");
  auto live = r.open(100ms, "live");
  ASSERT_TRUE(dead.ok() && live.ok());
  owned.Add(r.acquire(dead->id)->index());
  owned.Add(r.acquire(live->id)->index());
  // Keep `live` alive for many TTLs while `dead` is left alone.
  const auto until = Clock::now() + 600ms;
  while (Clock::now() < until) {
    ASSERT_TRUE(r.keepalive(live->id).ok());
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(WaitFor([&] { return r.stats().expired_total == 1; }));
  EXPECT_EQ(owned.Count(dead->index), 0u);
  EXPECT_EQ(owned.Count(live->index), 1u);
  EXPECT_EQ(r.keepalive(dead->id).code(), Code::kNotFound);
  EXPECT_TRUE(r.keepalive(live->id).ok());
  EXPECT_EQ(r.stats().objects_freed_total, 1u);
  // Stop renewing: the second one expires too.
  EXPECT_TRUE(WaitFor([&] { return r.stats().expired_total == 2; }));
  EXPECT_EQ(owned.Count(live->index), 0u);
  EXPECT_EQ(r.stats().open, 0u);
  r.stop();
}

TEST(SessionRegistryTest, AnExpiredLeaseRefusesAllocationsBeforeTheReaperRuns) {
  SessionRegistry r(Short());  // no reaper started
  auto s = r.open(50ms, "x");
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(WaitFor([&] { return !r.acquire(s->id).ok(); }));
  EXPECT_EQ(r.acquire(s->id).status().code(), Code::kNotFound);
  EXPECT_EQ(r.keepalive(s->id).code(), Code::kNotFound);  // no resurrection
  EXPECT_EQ(r.reap(), 1u);
  EXPECT_EQ(r.stats().expired_total, 1u);
}

TEST(SessionRegistryTest, MaxSessionsIsResourceExhaustedAndIndicesAreReused) {
  SessionOptions o = Short();
  o.max_sessions = 3;
  SessionRegistry r(o);
  std::vector<SessionGrant> g;
  for (int i = 0; i < 3; ++i) g.push_back(*r.open(10s, ""));
  auto extra = r.open(10s, "");
  EXPECT_EQ(extra.status().code(), Code::kResourceExhausted);
  EXPECT_EQ(r.stats().refused_total, 1u);
  ASSERT_TRUE(r.close(g[1].id).ok());
  auto again = r.open(10s, "");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->index, g[1].index);
  EXPECT_NE(again->id, g[1].id);
}

// The race the guard exists for: allocations in flight while the session ends. Every allocation
// that got a guard is recorded before the listener runs (so it is freed), and none is recorded
// for an index after its session ended (so nothing leaks into the next session of that index).
TEST(SessionRegistryTest, RaceAllocationsInFlightWhileTheSessionEndsAreNeverLeaked) {
  for (int round = 0; round < 50; ++round) {
    FakeOwned owned;
    SessionRegistry r(Short());
    std::atomic<bool> ended{false};
    std::atomic<int> late_records{0};
    r.add_end_listener([&](SessionIndex i) {
      SessionFreed f = owned.End(i);
      ended.store(true);
      return f;
    });
    auto s = r.open(10s, "race");
    ASSERT_TRUE(s.ok());
    std::atomic<int> granted{0}, refused{0};
    std::vector<std::thread> allocators;
    for (int t = 0; t < 3; ++t) {
      allocators.emplace_back([&] {
        for (int i = 0; i < 200; ++i) {
          auto g = r.acquire(s->id);
          if (!g.ok()) {
            refused.fetch_add(1);
            continue;
          }
          std::this_thread::yield();  // widen the window between acquire and record
          if (ended.load()) late_records.fetch_add(1);
          owned.Add(g->index());
          granted.fetch_add(1);
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50 * (round % 10)));
    auto freed = r.close(s->id);
    for (auto& t : allocators) t.join();
    ASSERT_TRUE(freed.ok());
    EXPECT_EQ(late_records.load(), 0) << "an allocation was recorded after its session ended";
    EXPECT_EQ(owned.Count(s->index), 0u) << "leaked past the session end";
    EXPECT_EQ(freed->objects, static_cast<uint64_t>(granted.load()));
    EXPECT_EQ(granted.load() + refused.load(), 600);
  }
}

TEST(SessionRegistryTest, ConcurrentCloseAndReapEndASessionOnce) {
  FakeOwned owned;
  SessionRegistry r(Short());
  r.add_end_listener([&](SessionIndex i) { return owned.End(i); });
  auto s = r.open(50ms, "");
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(WaitFor([&] { return !r.acquire(s->id).ok(); }));
  std::atomic<int> ok{0};
  std::thread a([&] { ok += r.close(s->id).ok(); });
  std::thread b([&] { ok += static_cast<int>(r.reap()); });
  a.join();
  b.join();
  EXPECT_EQ(ok.load(), 1);
  EXPECT_EQ(owned.ended.load(), 1u);
}

TEST(SessionRegistryTest, EndMemberEndsOnlyThatMembersFlaggedSessions) {
  FakeOwned owned;
  SessionRegistry r(Short());
  r.add_end_listener([&](SessionIndex i) { return owned.End(i); });
  auto a = r.open(10s, "node-a", /*cluster_member=*/true);
  auto a2 = r.open(10s, "node-a", /*cluster_member=*/true);
  auto plain = r.open(10s, "node-a");  // same label, not opened as a member
  auto b = r.open(10s, "node-b", /*cluster_member=*/true);
  ASSERT_TRUE(a.ok() && a2.ok() && plain.ok() && b.ok());
  for (const auto& g : {*a, *a2, *plain, *b}) owned.Add(r.acquire(g.id)->index());
  EXPECT_EQ(r.end_member("node-a"), 2u);
  EXPECT_EQ(owned.Count(a->index) + owned.Count(a2->index), 0u);
  EXPECT_EQ(owned.Count(plain->index), 1u);
  EXPECT_EQ(owned.Count(b->index), 1u);
  EXPECT_EQ(r.keepalive(a->id).code(), Code::kNotFound);
  EXPECT_EQ(r.stats().member_expired_total, 2u);
  EXPECT_EQ(r.end_member("node-a"), 0u);
  EXPECT_EQ(r.end_member("nobody"), 0u);
}

TEST(SessionRegistryTest, MalformedRequestsAreErrorsNeverCrashes) {
  SessionRegistry r(Short());
  std::vector<std::byte> reply;
  auto call = [&](uint16_t op, std::vector<std::byte> body) {
    reply.clear();
    RpcCall c{op, body, "test"};
    if (op == wire::kOpOpen) return r.ServeOpen(c, reply);
    if (op == wire::kOpKeepalive) return r.ServeKeepalive(c, reply);
    return r.ServeClose(c, reply);
  };
  for (uint16_t op : {wire::kOpOpen, wire::kOpKeepalive, wire::kOpClose}) {
    for (size_t n : {0, 1, 7, 9, 55, 57, 200}) {
      std::vector<std::byte> junk(n, std::byte{0xab});
      EXPECT_EQ(call(op, junk).code(), Code::kProtocol) << op << " " << n;
      EXPECT_TRUE(reply.empty());
    }
  }
  // Garbage of the right size: unknown flags, unknown ids.
  std::vector<std::byte> junk(sizeof(wire::OpenRequest), std::byte{0xff});
  EXPECT_EQ(call(wire::kOpOpen, junk).code(), Code::kInvalidArgument);  // flag bits unknown
  EXPECT_EQ(call(wire::kOpKeepalive, EncodeStruct(wire::KeepaliveRequest{42})).code(),
            Code::kNotFound);
  EXPECT_EQ(call(wire::kOpClose, EncodeStruct(wire::CloseRequest{0})).code(), Code::kNotFound);
  // A well-formed OPEN with a label that fills the field (no NUL), then keepalive and close.
  wire::OpenRequest open{};
  open.ttl_ms = 2000;
  std::memset(open.label, 'x', sizeof(open.label));
  ASSERT_TRUE(call(wire::kOpOpen, EncodeStruct(open)).ok());
  auto rep = DecodeStruct<wire::OpenReply>(reply);
  ASSERT_TRUE(rep.has_value());
  EXPECT_EQ(rep->ttl_ms, 2000u);
  EXPECT_TRUE(call(wire::kOpKeepalive, EncodeStruct(wire::KeepaliveRequest{rep->session_id})).ok());
  EXPECT_TRUE(reply.empty());
  ASSERT_TRUE(call(wire::kOpClose, EncodeStruct(wire::CloseRequest{rep->session_id})).ok());
  EXPECT_EQ(reply.size(), sizeof(wire::CloseReply));
}

}  // namespace
}  // namespace farmem
