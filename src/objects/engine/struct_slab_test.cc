// Tests for the block struct slab (lowest free slot first, pages given back and constructed
// again), the struct grace period, and Store::CompactBlockStructs: structs of live blocks packed
// down, pages of dead ones given back only after every stale user is done, objects intact.

#include "objects/engine/struct_slab.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "objects/engine/compaction.h"
#include "objects/engine/engine_test_util.h"
#include "objects/engine/store.h"
#include "objects/engine/struct_grace.h"

namespace farmem::corm {
namespace {

using Clock = std::chrono::steady_clock;

struct Item {
  uint64_t a = 7;  // constructed value: 0 would mean "never constructed"
  uint64_t pad[30] = {};
};

TEST(StructSlab, LowestFreeFirstAndPagesGoBack) {
  StructSlab<Item> slab;
  ASSERT_TRUE(slab.Init(4096).ok());
  constexpr size_t kPer = StructSlab<Item>::kPerPage;
  std::vector<Item*> items;
  for (size_t i = 0; i < 4 * kPer; ++i) {
    Item* it = slab.Take();
    ASSERT_NE(it, nullptr);
    EXPECT_EQ(slab.IndexOf(it), i) << "lowest free slot first";
    EXPECT_EQ(it->a, 7u);
    it->a = 100 + i;
    items.push_back(it);
  }
  EXPECT_EQ(slab.Stats().resident_pages, 4u);
  // Free pages 1 and 2 entirely and one struct of page 0.
  for (size_t i = kPer; i < 3 * kPer; ++i) slab.Put(items[i]);
  slab.Put(items[3]);
  EXPECT_EQ(slab.Take(), items[3]) << "the lowest free slot again";
  const std::vector<size_t> pages = slab.BeginRelease();
  ASSERT_EQ(pages, (std::vector<size_t>{1, 2}));
  // Pages being given back are out of circulation.
  Item* next = slab.Take();
  EXPECT_EQ(slab.IndexOf(next), 4 * kPer);
  slab.FinishRelease(pages);
  EXPECT_EQ(slab.Stats().resident_pages, 3u);
  EXPECT_EQ(slab.Stats().pages_released, 2u);
  // A slot of a page given back is constructed again when taken (it read as zeros meanwhile).
  Item* again = slab.Take();
  EXPECT_EQ(slab.IndexOf(again), kPer);
  EXPECT_EQ(again->a, 7u) << "constructed again, not the old value";
  EXPECT_EQ(items[0]->a, 100u) << "structs in use are untouched";
  EXPECT_EQ(slab.AllConstructed().size(), 4 * kPer + 1 - 2 * kPer + 1);
  // Take below a struct: only lower slots.
  EXPECT_EQ(slab.Take(items[0]), nullptr);
}

TEST(StructSlab, AbortedReleaseKeepsThePages) {
  StructSlab<Item> slab;
  ASSERT_TRUE(slab.Init(1024).ok());
  Item* a = slab.Take();
  a->a = 55;
  slab.Put(a);
  const std::vector<size_t> pages = slab.BeginRelease();
  ASSERT_EQ(pages.size(), 1u);
  slab.AbortRelease(pages);
  Item* b = slab.Take();
  EXPECT_EQ(b, a);
  EXPECT_EQ(b->a, 55u) << "not given back, not constructed again";
}

TEST(StructGrace, WaitsForUsesThatBeganBefore) {
  StructGrace g;
  EXPECT_TRUE(g.Synchronize(Clock::now() + std::chrono::milliseconds(10)));
  auto scope = std::make_unique<StructGrace::Scope>(g);
  EXPECT_FALSE(g.Synchronize(Clock::now() + std::chrono::milliseconds(20)))
      << "a use that began before must hold the grace period";
  // Also the next call, although the epoch flipped in the first one.
  EXPECT_FALSE(g.Synchronize(Clock::now() + std::chrono::milliseconds(20)));
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    EXPECT_TRUE(g.Synchronize(Clock::now() + std::chrono::seconds(10)));
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(done.load());
  scope.reset();
  waiter.join();
  EXPECT_TRUE(done.load());
  // A use that begins after the flip does not hold an earlier grace period forever: users keep
  // entering and leaving while Synchronize runs.
  std::atomic<bool> stop{false};
  std::thread user([&] {
    while (!stop) StructGrace::Scope s(g);
  });
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(g.Synchronize(Clock::now() + std::chrono::seconds(10)));
  }
  stop = true;
  user.join();
}

StoreOptions StructTestStore() {
  StoreOptions o;
  o.workers = 2;
  o.reserve_bytes = 256 << 20;
  o.pool_bytes = 4 << 20;
  o.seed = 77;
  return o;
}

std::vector<uint8_t> StructTestBytes(uint64_t k, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(k * 131 + i);
  return v;
}

// 400 blocks of 200 B objects; every block but one in eight is emptied (their structs die), the
// survivors sit scattered over the struct pages. CompactBlockStructs moves them down and gives
// the emptied pages back; every object reads back through its pointer.
TEST(StoreStructs, LiveStructsArePackedAndDeadPagesGoBack) {
  auto s = Store::Create(StructTestStore());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Store& st = **s;
  engine_testing::ApplyObjectsFault(st);
  const uint32_t cls = st.classes().ClassFor(200).value();
  const uint32_t per_block = st.classes().at(cls).slots_per_block;
  constexpr uint32_t kBlocks = 400;
  std::vector<ObjectPtr> ptrs;
  for (uint32_t i = 0; i < kBlocks * per_block; ++i) {
    auto p = st.Alloc(200, i % 2);
    ASSERT_TRUE(p.ok());
    ObjectPtr q = *p;
    ASSERT_TRUE(st.Write(q, StructTestBytes(i, 200)).ok());
    ptrs.push_back(q);
  }
  ASSERT_EQ(st.Stats().live_blocks, kBlocks);
  const StructSlabStats peak = st.StructStats();
  EXPECT_EQ(peak.in_use, kBlocks);
  // Empty 7 of every 8 blocks (by the block an object is homed in).
  std::vector<bool> keep(ptrs.size());
  std::map<uint32_t, uint32_t> rank;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    const uint32_t r =
        rank.emplace(ptrs[i].block, static_cast<uint32_t>(rank.size())).first->second;
    keep[i] = r % 8 == 5;
    if (!keep[i]) {
      ASSERT_TRUE(st.Free(ptrs[i]).ok());
    }
  }
  EXPECT_EQ(st.Stats().live_blocks, kBlocks / 8);
  auto r = st.CompactBlockStructs(Clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const StructSlabStats after = st.StructStats();
  EXPECT_EQ(after.in_use, kBlocks / 8);
  constexpr size_t kPer = StructSlab<detail::Block>::kPerPage;
  // Packed into the lowest slots: their pages plus at most one more stay.
  EXPECT_LE(after.resident_pages, (kBlocks / 8 + kPer - 1) / kPer + 1)
      << "moved " << r->moved << ", pages given back " << r->pages_released;
  EXPECT_GT(r->moved, 0u);
  EXPECT_FALSE(r->grace_timed_out);
  std::vector<uint8_t> out(200);
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (!keep[i]) continue;
    ObjectPtr q = ptrs[i];
    auto n = st.Read(q, out);
    ASSERT_TRUE(n.ok()) << i << ": " << n.status().ToString();
    ASSERT_EQ(out, StructTestBytes(i, 200)) << i;
  }
  // The accounting follows the structs, and the counters match a recount.
  EXPECT_LE(st.Stats().metadata.block_structs,
            after.resident_pages * StructSlab<detail::Block>::kPage + after.bookkeeping_bytes);
  auto recount = st.RecountMetadata();
  ASSERT_TRUE(recount.ok());
  EXPECT_EQ(st.Stats().metadata, *recount);
  // New blocks reuse the low slots (constructed again where pages went back).
  for (uint32_t i = 0; i < 4 * per_block; ++i) ASSERT_TRUE(st.Alloc(200, 0).ok());
  EXPECT_EQ(st.StructStats().in_use, kBlocks / 8 + 4);
}

// A thread that loaded a block struct pointer before the block died (inside a grace scope, as
// LockBlockOf is between loading table_ and validating) keeps the struct's page resident: the
// page goes back only after that use ended. (FARMEM_OBJECTS_FAULT=no_struct_grace gives it back
// at once and this test fails.)
TEST(StoreStructs, PagesOfDeadStructsWaitForStaleUsers) {
  auto s = Store::Create(StructTestStore());
  ASSERT_TRUE(s.ok());
  Store& st = **s;
  engine_testing::ApplyObjectsFault(st);
  const uint32_t per_block = st.classes().at(st.classes().ClassFor(200).value()).slots_per_block;
  constexpr size_t kPer = StructSlab<detail::Block>::kPerPage;
  std::vector<ObjectPtr> ptrs;
  for (uint32_t i = 0; i < 3 * kPer * per_block; ++i) ptrs.push_back(st.Alloc(200, 0).value());
  for (const ObjectPtr& p : ptrs) ASSERT_TRUE(st.Free(p).ok());
  ASSERT_EQ(st.Stats().live_blocks, 0u);
  // A stale user, as LockBlockOf holds it from loading a struct pointer until it is validated.
  auto stale = std::make_unique<StructGrace::Scope>(st.grace_for_testing());
  auto r = st.CompactBlockStructs(Clock::now() + std::chrono::milliseconds(50));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->pages_released, 0u) << "a page went back while a stale user could touch it";
  EXPECT_TRUE(r->grace_timed_out);
  EXPECT_GE(st.StructStats().resident_pages, 3u);
  stale.reset();
  r = st.CompactBlockStructs(Clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(r.ok());
  EXPECT_GE(r->pages_released, 3u);
  EXPECT_EQ(st.StructStats().resident_pages, 0u);
}

// Readers, writers, allocators and freers on every worker while compaction rounds (each followed
// by struct packing and page release) run continuously: every object reads back its own last
// value, nothing is lost, no operation fails, and the metadata counters match a recount.
TEST(StoreStructs, StressMovesAndReleasesUnderLoad) {
  auto s = Store::Create(StructTestStore());
  ASSERT_TRUE(s.ok());
  Store& st = **s;
  engine_testing::ApplyObjectsFault(st);
  CompactionOptions co;
  co.max_candidate_occupancy = 1.0;
  Compactor comp(st, co);
  constexpr int kThreads = 3;
  constexpr size_t kSize = 120;
  const auto until = Clock::now() + std::chrono::milliseconds(1500);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> failures{0}, ops{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t + 1);
      std::vector<std::pair<ObjectPtr, uint64_t>> mine;  // pointer, value key
      uint64_t key = uint64_t(t) << 40;
      std::vector<uint8_t> out(kSize);
      // Phases of growth (to 1,500 objects, ~50 blocks) and shrinking (to 64): whole blocks, and
      // so whole pages of their structs, empty and fill again while the structs move.
      bool growing = true;
      while (!stop.load()) {
        if (growing && mine.size() >= 1500) growing = false;
        if (!growing && mine.size() <= 64) growing = true;
        const int op = static_cast<int>(rng() % 10);
        if ((growing ? op < 6 : op < 1) || mine.size() < 64) {
          auto p = st.Alloc(kSize, t % 2);
          if (!p.ok()) {
            ++failures;
            continue;
          }
          ObjectPtr q = *p;
          if (!st.Write(q, StructTestBytes(++key, kSize)).ok()) ++failures;
          mine.emplace_back(q, key);
        } else if (op < 7) {
          const size_t i = rng() % mine.size();
          if (!st.Free(mine[i].first).ok()) ++failures;
          mine[i] = mine.back();
          mine.pop_back();
        } else {
          auto& [p, k] = mine[rng() % mine.size()];
          auto n = st.Read(p, out);
          if (!n.ok() || out != StructTestBytes(k, kSize)) ++failures;
        }
        ++ops;
      }
      for (auto& [p, k] : mine) {
        auto n = st.Read(p, out);
        if (!n.ok() || out != StructTestBytes(k, kSize)) ++failures;
      }
    });
  }
  uint64_t moved = 0, released = 0;
  while (Clock::now() < until) {
    (void)comp.CompactAll();
    auto r = st.CompactBlockStructs(Clock::now() + std::chrono::milliseconds(200));
    ASSERT_TRUE(r.ok());
    moved += r->moved;
    released += r->pages_released;
  }
  stop = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0u) << ops.load() << " operations";
  EXPECT_GT(ops.load(), 1000u);
  const CompactionStats cs = comp.stats();
  EXPECT_GT(cs.compactions, 0u);
  EXPECT_GT(moved + cs.structs_moved, 0u) << "struct moves never happened: vacuous";
  EXPECT_GT(released + cs.struct_pages_released, 0u) << "no page went back: vacuous";
  auto recount = st.RecountMetadata();
  ASSERT_TRUE(recount.ok());
  EXPECT_EQ(st.Stats().metadata, *recount);
}

}  // namespace
}  // namespace farmem::corm
