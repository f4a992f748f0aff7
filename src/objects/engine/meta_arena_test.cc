// MetaArena / ArenaArray tests: lowest-address first fit, emptied pages leave the process's RSS
// (checked with mincore), arrays move down into lower holes. Fault switch:
// FARMEM_OBJECTS_FAULT=no_meta_release keeps emptied pages (the RSS check must then fail).

#include "objects/engine/meta_arena.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "objects/engine/engine_test_util.h"

namespace farmem::corm {
namespace {

std::unique_ptr<MetaArena> NewArena(size_t bytes) {
  auto a = MetaArena::Create(bytes);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  if (engine_testing::ObjectsFault() == "no_meta_release") {
    std::printf("[ fault    ] FARMEM_OBJECTS_FAULT=no_meta_release\n");
    (*a)->set_release_pages(false);
  }
  return std::move(a).value();
}

TEST(MetaArena, FirstFitTakesTheLowestHole) {
  auto a = NewArena(1 << 20);
  auto* x = static_cast<uint8_t*>(a->Alloc(100));  // 7 units
  auto* y = static_cast<uint8_t*>(a->Alloc(16));
  auto* z = static_cast<uint8_t*>(a->Alloc(40));
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(y, x + 112);
  EXPECT_EQ(z, y + 16);
  a->Free(x, 100);
  EXPECT_EQ(a->Alloc(48), x);       // fits in the hole at the bottom
  EXPECT_EQ(a->Alloc(64), x + 48);  // the rest of it (4 units of 7)
  EXPECT_EQ(a->Alloc(1), z + 48);   // the hole is full: above z
  EXPECT_EQ(a->Stats().allocated_bytes, 48u + 64u + 16u + 48u + 16u);
  EXPECT_EQ(a->AllocBelow(16, x), nullptr);       // nothing free below x
  EXPECT_EQ(a->Alloc(size_t{2} << 20), nullptr);  // larger than the reservation
}

TEST(MetaArena, EmptiedPagesLeaveTheProcess) {
  auto a = NewArena(4 << 20);
  constexpr size_t kBlock = 1000;  // not page-aligned: runs straddle pages
  std::vector<void*> p;
  for (int i = 0; i < 400; ++i) {
    p.push_back(a->Alloc(kBlock));
    std::memset(p.back(), 0x5A, kBlock);
  }
  const int64_t all = a->KernelResidentPages();
  ASSERT_GE(all, 97);                                               // 400 x 1008 B
  for (size_t i = 0; i + 1 < p.size(); ++i) a->Free(p[i], kBlock);  // keep only the last one
  const MetaArenaStats s = a->Stats();
  EXPECT_EQ(s.allocated_bytes, 1008u);
  EXPECT_LE(s.resident_bytes, 2 * MetaArena::kPage);
  // The kernel agrees: the pages that held only freed runs are gone from RSS.
  EXPECT_LE(a->KernelResidentPages(), 2) << "of " << all << " pages resident before the frees";
  // A released page is usable again (reads zeros, then holds new data).
  auto* q = static_cast<uint8_t*>(a->Alloc(kBlock));
  EXPECT_EQ(q, p[0]);
  std::memset(q, 1, kBlock);
  EXPECT_EQ(q[kBlock - 1], 1);
}

TEST(ArenaArray, GrowsErasesAndMovesDown) {
  auto a = NewArena(1 << 20);
  void* low = a->Alloc(256);  // a hole to move into, once freed
  ArenaArray<uint32_t> v;
  for (uint32_t i = 0; i < 10; ++i) ASSERT_TRUE(v.PushBack(*a, i));
  ASSERT_EQ(v.size(), 10u);
  EXPECT_GE(v.capacity(), 10u);
  v.Erase(v.begin() + 3);
  ASSERT_EQ(v.size(), 9u);
  EXPECT_EQ(v[3], 4u);
  EXPECT_EQ(v[8], 9u);
  const uint32_t* before = v.data();
  a->Free(low, 256);
  v.Relocate(*a);
  EXPECT_LT(v.data(), before);
  EXPECT_EQ(static_cast<const void*>(v.data()), low);
  EXPECT_EQ(v[0], 0u);
  EXPECT_EQ(v[8], 9u);
  ASSERT_TRUE(v.Assign(*a, 5, 7u));
  EXPECT_EQ(v.size(), 5u);
  EXPECT_EQ(v[4], 7u);
  v.Release(*a);
  EXPECT_EQ(a->Stats().allocated_bytes, 0u);
  EXPECT_EQ(v.MemoryBytes(), 0u);
}

}  // namespace
}  // namespace farmem::corm
