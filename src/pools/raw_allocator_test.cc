// Unit tests of the first-fit raw allocator: alignment, coalescing, exhaustion, invalid frees, and
// a long random alloc/free run checked against a shadow model.
#include "pools/raw_allocator.h"

#include <gtest/gtest.h>

#include <iterator>
#include <map>
#include <random>

namespace farmem {
namespace {

TEST(RawAllocatorTest, AlignsAndRoundsUp) {
  auto a = NewFirstFitAllocator(4096);
  Result<uint64_t> x = a->allocate(1);
  Result<uint64_t> y = a->allocate(65);
  Result<uint64_t> z = a->allocate(64);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  EXPECT_EQ(*x % kRawAlignment, 0u);
  EXPECT_EQ(*y % kRawAlignment, 0u);
  EXPECT_EQ(*z % kRawAlignment, 0u);
  EXPECT_EQ(*a->allocation_length(*x), 64u);
  EXPECT_EQ(*a->allocation_length(*y), 128u);
  EXPECT_EQ(*a->allocation_length(*z), 64u);
  EXPECT_EQ(a->stats().allocated_bytes, 256u);
  EXPECT_EQ(a->stats().allocations, 3u);
}

TEST(RawAllocatorTest, RejectsZeroAndOversize) {
  auto a = NewFirstFitAllocator(4096);
  EXPECT_EQ(a->allocate(0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(a->allocate(4097).status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(a->allocate(4096).ok());
}

TEST(RawAllocatorTest, ExhaustionAndReuse) {
  auto a = NewFirstFitAllocator(1024);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 16; ++i) {
    auto r = a->allocate(64);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    offs.push_back(*r);
  }
  EXPECT_EQ(a->allocate(1).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(a->stats().free_bytes, 0u);
  ASSERT_TRUE(a->free(offs[5]).ok());
  auto again = a->allocate(64);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, offs[5]);
}

TEST(RawAllocatorTest, CoalescesNeighbours) {
  auto a = NewFirstFitAllocator(64 * 4);
  uint64_t o[4];
  for (auto& x : o) x = *a->allocate(64);
  // Free in an order that needs merging with the previous, the next, and both neighbours.
  ASSERT_TRUE(a->free(o[0]).ok());
  ASSERT_TRUE(a->free(o[2]).ok());
  EXPECT_EQ(a->stats().free_ranges, 2u);
  ASSERT_TRUE(a->free(o[1]).ok());  // joins [0] and [2]
  EXPECT_EQ(a->stats().free_ranges, 1u);
  EXPECT_EQ(a->stats().largest_free, 192u);
  ASSERT_TRUE(a->free(o[3]).ok());  // joins with the previous range
  EXPECT_EQ(a->stats().free_ranges, 1u);
  EXPECT_EQ(a->stats().largest_free, 256u);
  // The whole range is one block again.
  auto all = a->allocate(256);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, 0u);
}

TEST(RawAllocatorTest, DoubleFreeIsAnErrorAndChangesNothing) {
  auto a = NewFirstFitAllocator(4096);
  uint64_t x = *a->allocate(128);
  uint64_t y = *a->allocate(128);
  ASSERT_TRUE(a->free(x).ok());
  auto st = a->free(x);
  EXPECT_EQ(st.status().code(), Code::kInvalidArgument);
  EXPECT_NE(st.status().message().find("double free"), std::string_view::npos)
      << st.status().ToString();
  EXPECT_EQ(a->stats().allocations, 1u);
  EXPECT_EQ(*a->allocation_length(y), 128u);
}

TEST(RawAllocatorTest, ForgedFreesAreRejected) {
  auto a = NewFirstFitAllocator(4096);
  uint64_t x = *a->allocate(256);
  auto inside = a->free(x + 64);
  EXPECT_EQ(inside.status().code(), Code::kInvalidArgument);
  EXPECT_NE(inside.status().message().find("inside the allocation"), std::string_view::npos);
  EXPECT_EQ(a->free(x + 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(a->free(1 << 20).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(a->free(~0ull).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(a->stats().allocations, 1u);
  EXPECT_TRUE(a->free(x).ok());
}

// Random alloc/free against a shadow map: no overlaps, alignment, accounting, and the free list
// coalesces back into one range at the end.
TEST(RawAllocatorTest, RandomAgainstShadowModel) {
  constexpr uint64_t kCap = 1 << 20;
  auto a = NewFirstFitAllocator(kCap);
  std::mt19937_64 rng(12345);
  std::map<uint64_t, uint64_t> live;  // offset -> rounded length
  uint64_t live_bytes = 0;
  for (int i = 0; i < 20000; ++i) {
    bool do_alloc = live.empty() || rng() % 100 < 55;
    if (do_alloc) {
      uint64_t len = 1 + rng() % (rng() % 8 == 0 ? 65536 : 512);
      auto r = a->allocate(len);
      if (!r.ok()) {
        ASSERT_EQ(r.status().code(), Code::kResourceExhausted);
        ASSERT_LT(a->stats().largest_free, len);
        continue;
      }
      uint64_t off = *r;
      uint64_t size = (len + 63) / 64 * 64;
      ASSERT_EQ(off % 64, 0u);
      ASSERT_LE(off + size, kCap);
      auto next = live.lower_bound(off);
      if (next != live.end()) {
        ASSERT_LE(off + size, next->first);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, off);
      }
      live[off] = size;
      live_bytes += size;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      auto r = a->free(it->first);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_EQ(*r, it->second);
      live_bytes -= it->second;
      live.erase(it);
    }
    auto s = a->stats();
    ASSERT_EQ(s.allocated_bytes, live_bytes);
    ASSERT_EQ(s.allocations, live.size());
    ASSERT_EQ(s.free_bytes, kCap - live_bytes);
  }
  for (auto& [off, len] : live) ASSERT_TRUE(a->free(off).ok());
  auto s = a->stats();
  EXPECT_EQ(s.free_ranges, 1u);
  EXPECT_EQ(s.largest_free, kCap);
}

}  // namespace
}  // namespace farmem
