// Tests for the CoRM block allocator: memfd-backed blocks, remapping a virtual block onto another
// block's pages, punching, home reference counts, budgets and accounting.

#include "server/corm/block_allocator.h"

#include <gtest/gtest.h>

#include <cstring>

namespace farmem::corm {
namespace {

BlockAllocatorOptions SmallOptions() {
  BlockAllocatorOptions o;
  o.block_size = 4096;
  o.reserve_bytes = 64 << 20;
  o.pool_bytes = 1 << 20;
  return o;
}

TEST(BlockAllocator, AllocWriteRemapPunch) {
  auto ba = BlockAllocator::Create(SmallOptions());
  ASSERT_TRUE(ba.ok()) << ba.status().ToString();
  auto& a = **ba;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.base()) % 4096, 0u);
  auto g1 = a.AllocBlock();
  auto g2 = a.AllocBlock();
  ASSERT_TRUE(g1.ok() && g2.ok());
  ASSERT_NE(g1->vblock, g2->vblock);
  ASSERT_NE(g1->pblock, g2->pblock);
  std::memset(a.VAddr(g1->vblock), 0x11, 4096);
  std::memset(a.VAddr(g2->vblock), 0x22, 4096);
  EXPECT_EQ(a.Stats().physical_bytes_held, 8192u);

  auto m2 = a.MappingOf(g2->vblock);
  ASSERT_TRUE(m2.ok());
  EXPECT_GE(m2->memfd, 0);

  // v1 now shows p2's pages: writes through either address are seen through both.
  ASSERT_TRUE(a.Remap(g1->vblock, g2->pblock).ok());
  EXPECT_EQ(a.VAddr(g1->vblock)[100], 0x22);
  a.VAddr(g2->vblock)[7] = 0x33;
  EXPECT_EQ(a.VAddr(g1->vblock)[7], 0x33);
  auto m1 = a.MappingOf(g1->vblock);
  ASSERT_TRUE(m1.ok());
  EXPECT_EQ(m1->memfd, m2->memfd);
  EXPECT_EQ(m1->file_offset, m2->file_offset);

  ASSERT_TRUE(a.ReleasePhysical(g1->pblock).ok());
  EXPECT_EQ(a.Stats().physical_bytes_held, 4096u);
  EXPECT_EQ(a.Stats().punches, 1u);
  // The punched block is reused and reads back as zeros.
  auto g3 = a.AllocBlock();
  ASSERT_TRUE(g3.ok());
  EXPECT_EQ(g3->pblock, g1->pblock);
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(a.VAddr(g3->vblock)[i], 0) << i;
}

TEST(BlockAllocator, HomeRefsGateVirtualRelease) {
  auto ba = BlockAllocator::Create(SmallOptions());
  ASSERT_TRUE(ba.ok());
  auto& a = **ba;
  auto g = a.AllocBlock();
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(a.AddHomeRef(g->vblock).ok());
  EXPECT_EQ(a.ReleaseVirtual(g->vblock).code(), Code::kInvalidArgument);
  auto r = a.DropHomeRef(g->vblock);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 0u);
  EXPECT_EQ(a.DropHomeRef(g->vblock).status().code(), Code::kInternal);  // underflow
  ASSERT_TRUE(a.ReleaseVirtual(g->vblock).ok());
  EXPECT_EQ(a.ReleaseVirtual(g->vblock).code(), Code::kInvalidArgument);  // twice
  EXPECT_EQ(a.MappingOf(g->vblock).status().code(), Code::kNotFound);
  // Reused by the next allocation.
  auto g2 = a.AllocBlock();
  ASSERT_TRUE(g2.ok());
  EXPECT_EQ(g2->vblock, g->vblock);
}

TEST(BlockAllocator, BudgetsAndErrors) {
  auto o = SmallOptions();
  o.max_physical_bytes = 3 * 4096;
  auto ba = BlockAllocator::Create(o);
  ASSERT_TRUE(ba.ok());
  auto& a = **ba;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a.AllocBlock().ok());
  EXPECT_EQ(a.AllocBlock().status().code(), Code::kResourceExhausted);
  EXPECT_EQ(a.Remap(100000, 0).code(), Code::kInvalidArgument);
  EXPECT_EQ(a.ReleasePhysical(999).code(), Code::kInvalidArgument);
  EXPECT_EQ(a.VBlockOf(0).status().code(), Code::kOutOfRange);

  auto bad = SmallOptions();
  bad.block_size = 3000;
  EXPECT_EQ(BlockAllocator::Create(bad).status().code(), Code::kInvalidArgument);
  bad = SmallOptions();
  bad.pool_bytes = 5000;
  EXPECT_EQ(BlockAllocator::Create(bad).status().code(), Code::kInvalidArgument);

  // Virtual range exhaustion.
  auto tiny = SmallOptions();
  tiny.reserve_bytes = 2 * 4096;
  auto t = BlockAllocator::Create(tiny);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->AllocBlock().ok());
  ASSERT_TRUE((*t)->AllocBlock().ok());
  EXPECT_EQ((*t)->AllocBlock().status().code(), Code::kResourceExhausted);
}

TEST(BlockAllocator, PoolsGrowAcrossMemfds) {
  auto o = SmallOptions();
  o.pool_bytes = 4 * 4096;
  auto ba = BlockAllocator::Create(o);
  ASSERT_TRUE(ba.ok());
  for (int i = 0; i < 10; ++i) {
    auto g = (*ba)->AllocBlock();
    ASSERT_TRUE(g.ok());
    (*ba)->VAddr(g->vblock)[0] = static_cast<uint8_t>(i);
  }
  EXPECT_EQ((*ba)->Stats().pools, 3u);
  EXPECT_EQ((*ba)->Stats().physical_blocks_in_use, 10u);
}

}  // namespace
}  // namespace farmem::corm
