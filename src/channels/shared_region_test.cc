// SharedRegion across three in-process nodes (tcp and fabric:shm), driven by the test thread: every
// node's slot in every copy, the local view, bounds and membership errors, the fence litmus for
// each fence kind, a stopped member. FARMEM_CHANNELS_FAULT=fence drops the litmus's fence (fails).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "channels/channels_test_util.h"
#include "farmem/channels.h"

namespace farmem::channels {
namespace {

using namespace std::chrono_literals;
using testing_util::Fault;
using testing_util::kSanitizerBuild;

// Plain run only (docs/testing.md): the region adds no synchronisation of its own for the
// sanitizers to check beyond what ChannelThread's tests already run under them.
class SharedRegionTest : public testing_util::ChannelsTest {
 protected:
  void SetUp() override {
    if (kSanitizerBuild) GTEST_SKIP() << "shared region tests run in the plain build only";
    ChannelsTest::SetUp();
  }
  // Opens `name` (`bytes` on each of `members`) on every member and waits until all joined.
  std::vector<SharedRegion> OpenOn(const std::string& name, std::vector<NodeId> members,
                                   size_t bytes) {
    std::vector<SharedRegion> out;
    for (NodeId n : members) {
      auto r = SharedRegion::Open(*M(n).thr, name, members, bytes);
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (r.ok()) out.push_back(std::move(*r));
    }
    for (auto& r : out) EXPECT_TRUE(r.wait_ready(5s).ok());
    return out;
  }
};

constexpr size_t kSlot = 40;  // not a multiple of 8: byte copies, no word alignment assumed

std::vector<std::byte> Pattern(NodeId writer, NodeId copy, size_t n) {
  std::vector<std::byte> b(n);
  for (size_t i = 0; i < n; i++) b[i] = static_cast<std::byte>(writer * 31 + copy * 7 + i);
  return b;
}

// Every node writes its slot in every copy (its own included); node 1 then fences per pair, node 2
// its thread, node 3 globally; every copy read back by every node is exact, and so is each node's
// local view. A store into the local view is then read remotely.
TEST_P(SharedRegionTest, EveryNodeWritesItsSlotInEveryCopy) {
  START_ALL_OR_SKIP();
  auto regions = OpenOn("sr/slots", {1, 2, 3}, 3 * kSlot + 1);
  ASSERT_EQ(regions.size(), 3u);
  for (NodeId w = 1; w <= 3; w++) {
    for (NodeId c = 1; c <= 3; c++) {
      auto key = regions[w - 1].write(*M(w).thr, c, (w - 1) * kSlot, Pattern(w, c, kSlot));
      ASSERT_TRUE(key.ok()) << key.status().ToString();
    }
  }
  for (NodeId c = 1; c <= 3; c++) ASSERT_TRUE(M(1).thr->fence_pair(c, 5s).ok());
  ASSERT_TRUE(M(2).thr->fence_thread(5s).ok());
  ASSERT_TRUE(M(3).thr->fence_global(5s).ok());
  for (NodeId r = 1; r <= 3; r++) {
    for (NodeId c = 1; c <= 3; c++) {
      std::vector<std::byte> got(3 * kSlot + 1);
      auto key = regions[r - 1].read(*M(r).thr, c, 0, got);
      ASSERT_TRUE(key.ok());
      ASSERT_TRUE(M(r).thr->wait(*key, 5s).ok());
      for (NodeId w = 1; w <= 3; w++) {
        EXPECT_EQ(0, std::memcmp(got.data() + (w - 1) * kSlot, Pattern(w, c, kSlot).data(), kSlot))
            << "node " << r << " reading node " << c << "'s copy, slot of node " << w;
      }
      EXPECT_EQ(got.back(), std::byte{0}) << "the last byte was never written";
    }
  }
  for (NodeId c = 1; c <= 3; c++) {
    auto view = regions[c - 1].local();
    ASSERT_EQ(view.size(), 3 * kSlot + 1);
    for (NodeId w = 1; w <= 3; w++) {
      EXPECT_EQ(0, std::memcmp(view.data() + (w - 1) * kSlot, Pattern(w, c, kSlot).data(), kSlot))
          << "node " << c << "'s local view, slot of node " << w;
    }
  }
  // Node 2 stores into its local copy; node 3 reads it one-sided.
  regions[1].local().back() = std::byte{0x5a};
  std::byte last{};
  auto key = regions[2].read(*M(3).thr, 2, 3 * kSlot, std::span<std::byte>(&last, 1));
  ASSERT_TRUE(key.ok());
  ASSERT_TRUE(M(3).thr->wait(*key, 5s).ok());
  EXPECT_EQ(last, std::byte{0x5a});
}

TEST_P(SharedRegionTest, BoundsSizeAndMembershipErrors) {
  START_ALL_OR_SKIP();
  auto& t1 = *M(1).thr;
  EXPECT_EQ(SharedRegion::Open(t1, "sr/zero", {1, 2}, 0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(SharedRegion::Open(t1, "sr/huge", {1, 2}, SIZE_MAX).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(SharedRegion::Open(t1, "sr/stranger", {1, 9}, 8).status().code(),
            Code::kInvalidArgument);
  auto regions = OpenOn("sr/b", {1, 2}, 64);
  ASSERT_EQ(regions.size(), 2u);
  auto& r = regions[0];
  EXPECT_EQ(SharedRegion::Open(t1, "sr/b", {1, 2}, 64).status().code(),
            Code::kFailedPrecondition);  // already open here
  std::vector<std::byte> buf(16);
  auto code = [](const Result<AckKey>& k) { return k.ok() ? Code::kOk : k.status().code(); };
  EXPECT_EQ(code(r.write(t1, 2, 48, buf)), Code::kOk);  // the last 16 bytes
  EXPECT_EQ(code(r.write(t1, 2, 49, buf)), Code::kOutOfRange);
  EXPECT_EQ(code(r.write(t1, 2, 64, std::span(buf).first(1))), Code::kOutOfRange);
  EXPECT_EQ(code(r.write(t1, 2, UINT64_MAX - 4, buf)), Code::kOutOfRange);  // no wrap-around
  EXPECT_EQ(code(r.read(t1, 1, 60, buf)), Code::kOutOfRange);
  EXPECT_EQ(code(r.write(t1, 2, 0, {})), Code::kInvalidArgument);
  EXPECT_EQ(code(r.read(t1, 3, 0, buf)), Code::kInvalidArgument);   // a participant, no member
  EXPECT_EQ(code(r.write(t1, 7, 0, buf)), Code::kInvalidArgument);  // no participant at all
  auto bad = r.write(t1, 2, 49, buf);
  EXPECT_NE(bad.status().ToString().find("outside the region's 64 bytes"), std::string::npos)
      << bad.status().ToString();
  ASSERT_TRUE(t1.fence_thread(5s).ok());
  // A member that has not opened the region yet: kFailedPrecondition, nothing posted.
  auto early = SharedRegion::Open(t1, "sr/late", {1, 3}, 32);
  ASSERT_TRUE(early.ok());
  EXPECT_EQ(code(early->write(t1, 3, 0, std::span(buf).first(8))), Code::kFailedPrecondition);
  // The same name with another size never joins.
  auto other = SharedRegion::Open(*M(3).thr, "sr/late", {1, 3}, 48);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(early->wait_ready(300ms).code(), Code::kTimedOut);
}

// Message passing through a region: data write, fence, flag write; the reader (node 2, its own
// copy, read through the transport and through the local view) that sees the flag sees the data.
// The data write is held back by the ChannelThread test hook (a transport that places it late), so
// only the fence can order it: FARMEM_CHANNELS_FAULT=fence drops the fence and the test fails.
TEST_P(SharedRegionTest, FenceLitmusMessagePassingEachFenceKind) {
  START_ALL_OR_SKIP();
  auto regions = OpenOn("sr/litmus", {1, 2}, 16);
  ASSERT_EQ(regions.size(), 2u);
  auto& w = *M(1).thr;
  auto& r = *M(2).thr;
  const bool no_fence = Fault("fence");
  for (const char* kind : {"pair", "thread", "global"}) {
    int violations = 0, local_violations = 0;
    for (uint64_t round = 1; round <= 50; round++) {
      const auto bytes = std::as_bytes(std::span(&round, 1));
      w.testing_hold_next_write();
      ASSERT_TRUE(regions[0].write(w, 2, 0, bytes).ok());  // data
      if (!no_fence) {
        Status st = std::string(kind) == "pair"     ? w.fence_pair(2, 5s)
                    : std::string(kind) == "thread" ? w.fence_thread(5s)
                                                    : w.fence_global(5s);
        ASSERT_TRUE(st.ok()) << kind << ": " << st.ToString();
      }
      auto flag = regions[0].write(w, 2, 8, bytes);
      ASSERT_TRUE(flag.ok());
      ASSERT_TRUE(w.wait(*flag, 5s).ok());
      uint64_t seen[2] = {0, 0};
      auto key = regions[1].read(r, 2, 0, std::as_writable_bytes(std::span(seen)));
      ASSERT_TRUE(key.ok());
      ASSERT_TRUE(r.wait(*key, 5s).ok());
      if (seen[1] == round && seen[0] != round) violations++;
      // The local view, once the flag was seen through the transport.
      uint64_t data = 0;
      std::memcpy(&data, regions[1].local().data(), 8);
      if (seen[1] == round && data != round) local_violations++;
      w.testing_release_held();
      ASSERT_TRUE(w.fence_thread(5s).ok());
    }
    std::printf("fence %s: %d of 50 rounds flag without data (%d in the local view)\n", kind,
                violations, local_violations);
    EXPECT_EQ(violations, 0) << kind << " fence: flag seen without its data";
    EXPECT_EQ(local_violations, 0) << kind << " fence: local view without the data";
  }
}

// Node 3 stops: reads and writes of its copy error within op_timeout (0.5 s) + 1 s, never hang;
// node 2's copy stays usable.
TEST_P(SharedRegionTest, StoppedMemberGivesErrorsWithinTimeout) {
  START_ALL_OR_SKIP(500ms);
  auto regions = OpenOn("sr/dead", {1, 2, 3}, 64);
  ASSERT_EQ(regions.size(), 3u);
  auto& t1 = *M(1).thr;
  std::vector<std::byte> buf(64, std::byte{1});
  ASSERT_TRUE(t1.wait(*regions[0].write(t1, 3, 0, buf), 5s).ok());
  M(3).thr.reset();
  M(3).node->stop();
  testing_util::ExpectErrorWithin("write to a stopped member", 1500ms, [&] {
    auto key = regions[0].write(t1, 3, 0, buf);
    return key.ok() ? t1.wait(*key, 5s) : key.status();
  });
  testing_util::ExpectErrorWithin("read from a stopped member", 1500ms, [&] {
    auto key = regions[0].read(t1, 3, 0, buf);
    return key.ok() ? t1.wait(*key, 5s) : key.status();
  });
  auto key = regions[0].write(t1, 2, 0, buf);
  ASSERT_TRUE(key.ok());
  EXPECT_TRUE(t1.wait(*key, 5s).ok()) << "node 2's copy after node 3 stopped";
}

INSTANTIATE_TEST_SUITE_P(Backends, SharedRegionTest, ::testing::Values("tcp", "fabric:shm"),
                         testing_util::BackendName);

}  // namespace
}  // namespace farmem::channels
