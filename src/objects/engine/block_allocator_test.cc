// Tests for the CoRM block allocator: memfd-backed blocks, remapping a virtual block onto another
// block's pages, punching, home reference counts, budgets and accounting, and that unmapped
// virtual blocks read as zeros without costing memory.

#include "objects/engine/block_allocator.h"

#include <gtest/gtest.h>

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

namespace farmem::corm {
namespace {

// Resident set size of this process in bytes (/proc/self/statm), or 0 if unreadable.
uint64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return n == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

// Sum of every byte of [p, p + len), read the way a transport thread would (plain loads).
uint64_t ByteSum(const uint8_t* p, size_t len) {
  uint64_t sum = 0;
  for (size_t i = 0; i < len; ++i) sum += p[i];
  return sum;
}

// Sum of every byte of [p, p + len), read by the kernel with process_vm_readv on ourselves, which
// is how libfabric shm (CMA) reads a peer's memory; it also keeps sanitizer shadow memory out of
// the RSS measurement. Sets *err to errno if the kernel refuses.
uint64_t ByteSumViaKernel(const uint8_t* p, size_t len, int* err) {
  static std::vector<uint8_t> buf(1 << 20);
  uint64_t sum = 0;
  *err = 0;
  for (size_t off = 0; off < len; off += buf.size()) {
    const size_t n = std::min(buf.size(), len - off);
    iovec local{buf.data(), n};
    iovec remote{const_cast<uint8_t*>(p + off), n};
    const ssize_t got = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
    if (got != static_cast<ssize_t>(n)) {
      *err = got < 0 ? errno : EIO;
      return sum;
    }
    sum += ByteSum(buf.data(), n);
  }
  return sum;
}

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

// Blocks of several base blocks (spans): contiguous pages of one pool, power-of-two spans
// aligned to themselves, remapped only onto spans of their own length, and every base block
// accounted.
TEST(BlockAllocator, SpansAreContiguousAlignedAndRemappedWhole) {
  auto o = SmallOptions();
  o.pool_bytes = 16 * 4096;
  auto ba = BlockAllocator::Create(o);
  ASSERT_TRUE(ba.ok()) << ba.status().ToString();
  auto& a = **ba;
  auto one = a.AllocBlock(1);
  auto four = a.AllocBlock(4);
  auto three = a.AllocBlock(3);  // not a power of two: no alignment
  auto four2 = a.AllocBlock(4);
  ASSERT_TRUE(one.ok() && four.ok() && three.ok() && four2.ok());
  EXPECT_EQ(four->vblock % 4, 0u);
  EXPECT_EQ(four2->vblock % 4, 0u);
  EXPECT_EQ(a.Stats().physical_blocks_in_use, 12u);
  EXPECT_EQ(a.Stats().virtual_blocks_in_use, 12u);
  // Every byte of a span is its own memory (one mapping of consecutive pool pages).
  std::memset(a.VAddr(four->vblock), 0x44, 4 * 4096);
  std::memset(a.VAddr(four2->vblock), 0x55, 4 * 4096);
  std::memset(a.VAddr(three->vblock), 0x33, 3 * 4096);
  EXPECT_EQ(ByteSum(a.VAddr(four->vblock), 4 * 4096), 0x44u * 4 * 4096);
  auto m = a.MappingOf(four->vblock);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->span, 4u);
  // The skipped virtual block before the first aligned span serves a later 1-block span.
  auto gap = a.AllocBlock(1);
  ASSERT_TRUE(gap.ok());
  EXPECT_LT(gap->vblock, four2->vblock) << "an alignment gap is reused";
  // Remap a whole span onto another of the same length; other lengths are refused.
  ASSERT_TRUE(a.Remap(four->vblock, four2->pblock).ok());
  EXPECT_EQ(ByteSum(a.VAddr(four->vblock), 4 * 4096), 0x55u * 4 * 4096);
  EXPECT_EQ(a.Remap(four->vblock, three->pblock).code(), Code::kInvalidArgument);
  EXPECT_EQ(a.Remap(three->vblock, four->pblock).code(), Code::kInvalidArgument);
  // Releasing punches and frees all of a span's base blocks.
  ASSERT_TRUE(a.ReleasePhysical(four->pblock).ok());
  EXPECT_EQ(a.Stats().physical_blocks_in_use, 9u);
  auto again = a.AllocBlock(4);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->pblock, four->pblock) << "a freed span is reused for its length";
  for (size_t i = 0; i < 4 * 4096; ++i) ASSERT_EQ(a.VAddr(again->vblock)[i], 0) << i;
  ASSERT_TRUE(a.ReleaseVirtual(three->vblock).ok());
  EXPECT_EQ(a.Stats().virtual_blocks_in_use, 14u);  // 1 + 4 + 4 + 1 + 4
  // Bad spans.
  EXPECT_EQ(a.AllocBlock(0).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(a.AllocBlock(17).status().code(), Code::kInvalidArgument) << "larger than a pool";
}

// A span never straddles two pools: the tail of a pool that is too short is skipped (and kept
// for a span of its length).
TEST(BlockAllocator, SpansStayInsideOnePool) {
  auto o = SmallOptions();
  o.pool_bytes = 8 * 4096;
  auto ba = BlockAllocator::Create(o);
  ASSERT_TRUE(ba.ok());
  auto& a = **ba;
  auto first = a.AllocBlock(5);
  auto second = a.AllocBlock(5);  // 3 blocks left in pool 0: goes to pool 1
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(a.Stats().pools, 2u);
  EXPECT_EQ(first->pblock / 8, 0u);
  EXPECT_EQ(second->pblock / 8, 1u);
  auto m = a.MappingOf(second->vblock);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->file_offset, 0u);
  std::memset(a.VAddr(second->vblock), 0x77, 5 * 4096);
  EXPECT_EQ(ByteSum(a.VAddr(second->vblock), 5 * 4096), 0x77u * 5 * 4096);
  auto tail = a.AllocBlock(3);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail->pblock, 5u) << "pool 0's skipped tail serves a span of its length";
  EXPECT_EQ(a.Stats().pools, 2u);
}

// The quarantine counts base blocks released after a span, whatever their spans.
TEST(BlockAllocator, QuarantineCountsBaseBlocks) {
  auto o = SmallOptions();
  o.vblock_quarantine = 8;
  auto ba = BlockAllocator::Create(o);
  ASSERT_TRUE(ba.ok());
  auto& a = **ba;
  auto s = a.AllocBlock(2);
  auto big = a.AllocBlock(8);
  ASSERT_TRUE(s.ok() && big.ok());
  ASSERT_TRUE(a.ReleasePhysical(s->pblock).ok());
  ASSERT_TRUE(a.ReleaseVirtual(s->vblock).ok());
  auto next = a.AllocBlock(2);
  ASSERT_TRUE(next.ok());
  EXPECT_NE(next->vblock, s->vblock) << "quarantined: nothing released after it";
  ASSERT_TRUE(a.ReleasePhysical(big->pblock).ok());
  ASSERT_TRUE(a.ReleaseVirtual(big->vblock).ok());  // 8 base blocks released after it
  auto reused = a.AllocBlock(2);
  ASSERT_TRUE(reused.ok());
  EXPECT_EQ(reused->vblock, s->vblock);
}

TEST(BlockAllocator, ReleasedBlockReadsAsZeros) {
  auto ba = BlockAllocator::Create(SmallOptions());
  ASSERT_TRUE(ba.ok()) << ba.status().ToString();
  auto& a = **ba;
  auto g = a.AllocBlock();
  auto keep = a.AllocBlock();
  ASSERT_TRUE(g.ok() && keep.ok());
  uint8_t* stale = a.VAddr(g->vblock);  // a pointer a client may still hold
  std::memset(stale, 0x5a, 4096);
  std::memset(a.VAddr(keep->vblock), 0x6b, 4096);
  const BlockAllocatorStats before = a.Stats();

  ASSERT_TRUE(a.ReleaseVirtual(g->vblock).ok());
  // Reading through the stale pointer does not fault and shows zeros: a zero header has the
  // allocated bit clear, so a one-sided reader sees "freed" and corrects its pointer.
  EXPECT_EQ(ByteSum(stale, 4096), 0u);
  // The neighbour is untouched; only the virtual block went (its physical block is the
  // caller's to release), so the physical accounting is unchanged.
  EXPECT_EQ(ByteSum(a.VAddr(keep->vblock), 4096), 0x6bu * 4096);
  const BlockAllocatorStats after = a.Stats();
  EXPECT_EQ(after.virtual_blocks_in_use, before.virtual_blocks_in_use - 1);
  EXPECT_EQ(after.physical_bytes_held, before.physical_bytes_held);
  EXPECT_EQ(after.physical_blocks_in_use, before.physical_blocks_in_use);
  EXPECT_EQ(a.MappingOf(g->vblock).status().code(), Code::kNotFound);

  // Releasing the physical block too changes nothing for the reader.
  ASSERT_TRUE(a.ReleasePhysical(g->pblock).ok());
  EXPECT_EQ(ByteSum(stale, 4096), 0u);
  EXPECT_EQ(a.Stats().physical_bytes_held, before.physical_bytes_held - 4096);

  // The virtual block is reused by the next allocation, mapped writable again.
  auto again = a.AllocBlock();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->vblock, g->vblock);
  EXPECT_EQ(ByteSum(stale, 4096), 0u);
  stale[17] = 3;
  EXPECT_EQ(stale[17], 3);
}

TEST(BlockAllocator, UnmappedRangeReadsAsZerosWithoutMemory) {
  auto o = SmallOptions();
  o.reserve_bytes = size_t{128} << 20;
  auto ba = BlockAllocator::Create(o);
  ASSERT_TRUE(ba.ok()) << ba.status().ToString();
  auto& a = **ba;
  // A few blocks in use and a few released, the rest never mapped.
  for (int i = 0; i < 8; ++i) {
    auto g = a.AllocBlock();
    ASSERT_TRUE(g.ok());
    std::memset(a.VAddr(g->vblock), 0x77, 4096);
    if (i % 2 == 0) {
      ASSERT_TRUE(a.ReleaseVirtual(g->vblock).ok());
      ASSERT_TRUE(a.ReleasePhysical(g->pblock).ok());
    }
  }
  const BlockAllocatorStats stats_before = a.Stats();
  const uint64_t rss_before = ResidentBytes();
  ASSERT_GT(rss_before, 0u) << "cannot read /proc/self/statm";
  // Read the whole 128 MiB reservation as a CMA reader would: no EFAULT anywhere, and only the
  // 4 live blocks hold non-zero bytes.
  int err = 0;
  const uint64_t sum = ByteSumViaKernel(a.base(), a.reserve_bytes(), &err);
  if (err == ENOSYS || err == EPERM) GTEST_SKIP() << "process_vm_readv is not allowed here";
  ASSERT_EQ(err, 0) << "process_vm_readv of the reservation failed: " << std::strerror(err);
  EXPECT_EQ(sum, 4u * 4096 * 0x77);
  const uint64_t rss_after = ResidentBytes();
  // Reads of never-mapped or released blocks map the shared zero page, which is not counted in
  // RSS; if they allocated memory, RSS would grow by the 128 MiB read. The slack covers other
  // threads of the test binary and page-table-free noise.
  EXPECT_LT(rss_after, rss_before + (size_t{16} << 20))
      << "reading the unmapped range grew RSS from " << rss_before << " to " << rss_after;
  const BlockAllocatorStats stats_after = a.Stats();
  EXPECT_EQ(stats_after.physical_bytes_held, stats_before.physical_bytes_held);
  EXPECT_EQ(stats_after.virtual_blocks_in_use, stats_before.virtual_blocks_in_use);
  EXPECT_EQ(stats_after.pool_bytes_total, stats_before.pool_bytes_total);
}

}  // namespace
}  // namespace farmem::corm
