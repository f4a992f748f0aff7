// PoolSet tests: lazy memfd pools inside one reservation, registration, allocation across pools,
// budget exhaustion, frees with wrong keys, and freed memory handed out again zeroed.
#include "pools/pool_set.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace farmem {
namespace {

constexpr uint64_t kPool = 1 << 20;

struct Registry {
  std::vector<std::string> names;
  RegisterPoolFn fn() {
    return [this](const std::string& name, void*, size_t) -> Result<RegionKey> {
      names.push_back(name);
      return RegionKey{0x1000 + names.size()};
    };
  }
};

TEST(PoolSetTest, ValidatesSizes) {
  Registry reg;
  EXPECT_EQ(PoolSet::Create(4 * kPool, 1000, reg.fn()).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PoolSet::Create(kPool / 2, kPool, reg.fn()).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(PoolSet::Create(kPool, 0, reg.fn()).status().code(), Code::kInvalidArgument);
}

TEST(PoolSetTest, PoolsAreCreatedLazilyAndMapMemfdPages) {
  Registry reg;
  auto set = PoolSet::Create(4 * kPool, kPool, reg.fn());
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  PoolSet& ps = **set;
  EXPECT_EQ(ps.pool_count(), 0u);
  EXPECT_EQ(ps.max_pools(), 4u);

  auto a = ps.allocate(4096);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_EQ(ps.pool_count(), 1u);
  ASSERT_EQ(reg.names, std::vector<std::string>{"pool-0"});
  const Pool* p = ps.pool(0);
  EXPECT_EQ(a->key, p->key);

  // Write through the pool's mapping; a second, independent mapping of the memfd sees the bytes,
  // so the pool really is backed by the shared file (what compaction's remap relies on).
  std::memset(p->addr + a->offset, 0xab, 4096);
  void* view = mmap(nullptr, kPool, PROT_READ, MAP_SHARED, p->fd, 0);
  ASSERT_NE(view, MAP_FAILED);
  const auto* bytes = static_cast<const unsigned char*>(view);
  for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(bytes[a->offset + i], 0xab) << i;
  munmap(view, kPool);
}

TEST(PoolSetTest, GrowsUntilBudgetThenExhausted) {
  Registry reg;
  auto set = PoolSet::Create(3 * kPool, kPool, reg.fn());
  ASSERT_TRUE(set.ok());
  PoolSet& ps = **set;
  std::vector<PoolAllocation> got;
  for (int i = 0; i < 3; ++i) {
    auto a = ps.allocate(kPool);  // a whole pool each
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    got.push_back(*a);
  }
  EXPECT_EQ(ps.pool_count(), 3u);
  // Consecutive slots of the one reservation.
  EXPECT_EQ(ps.pool(1)->addr, ps.pool(0)->addr + kPool);
  EXPECT_EQ(ps.pool(2)->addr, ps.pool(0)->addr + 2 * kPool);
  auto full = ps.allocate(64);
  EXPECT_EQ(full.status().code(), Code::kResourceExhausted) << full.status().ToString();
  EXPECT_EQ(ps.allocate(kPool + 1).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ps.allocate(0).status().code(), Code::kInvalidArgument);

  ASSERT_TRUE(ps.free(got[1].key, got[1].offset).ok());
  auto again = ps.allocate(128);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->key, got[1].key);
  EXPECT_EQ(ps.pool_count(), 3u);
}

TEST(PoolSetTest, FreeChecksKeyAndOffset) {
  Registry reg;
  auto set = PoolSet::Create(2 * kPool, kPool, reg.fn());
  ASSERT_TRUE(set.ok());
  PoolSet& ps = **set;
  auto a = ps.allocate(1000);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->length, 1024u);
  EXPECT_EQ(ps.free(a->key + 99, a->offset).status().code(), Code::kNotFound);
  EXPECT_EQ(ps.free(a->key, a->offset + 64).status().code(), Code::kInvalidArgument);
  auto freed = ps.free(a->key, a->offset);
  ASSERT_TRUE(freed.ok());
  EXPECT_EQ(*freed, 1024u);
  auto twice = ps.free(a->key, a->offset);
  EXPECT_EQ(twice.status().code(), Code::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("pool-0"), std::string_view::npos);
}

TEST(PoolSetTest, RegistrationFailureLeavesNoPool) {
  auto set = PoolSet::Create(2 * kPool, kPool, [](const std::string&, void*, size_t) {
    return Result<RegionKey>(Status::ResourceExhausted("no more memory regions"));
  });
  ASSERT_TRUE(set.ok());
  auto a = (*set)->allocate(64);
  EXPECT_EQ(a.status().code(), Code::kResourceExhausted);
  EXPECT_EQ((*set)->pool_count(), 0u);
}

// Concurrent allocations never overlap (each thread's pattern survives) and concurrent growth
// never creates more pools than the budget allows.
TEST(PoolSetTest, ConcurrentAllocateFreeAndGrowth) {
  Registry reg;
  std::mutex reg_mu;
  auto set = PoolSet::Create(4 * kPool, kPool,
                             [&](const std::string& n, void* a, size_t l) -> Result<RegionKey> {
                               std::lock_guard lock(reg_mu);
                               return reg.fn()(n, a, l);
                             });
  ASSERT_TRUE(set.ok());
  PoolSet& ps = **set;
  constexpr int kThreads = 4;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<PoolAllocation> mine;
      for (int i = 0; i < 300; ++i) {
        auto a = ps.allocate(64 + (i % 7) * 64);
        if (!a.ok()) {
          failures++;
          continue;
        }
        const Pool* p = nullptr;
        for (size_t k = 0; k < ps.pool_count(); ++k) {
          if (ps.pool(k)->key == a->key) p = ps.pool(k);
        }
        if (!p) {
          failures++;
          continue;
        }
        std::memset(p->addr + a->offset, t + 1, a->length);
        mine.push_back(*a);
        if (i % 3 == 0) {
          PoolAllocation f = mine.front();
          mine.erase(mine.begin());
          for (size_t k = 0; k < ps.pool_count(); ++k) {
            const Pool* q = ps.pool(k);
            if (q->key != f.key) continue;
            for (uint64_t b = 0; b < f.length; ++b) {
              if (q->addr[f.offset + b] != std::byte(t + 1)) failures++;
            }
          }
          if (!ps.free(f.key, f.offset).ok()) failures++;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);

  // Now race to fill the budget with whole-pool allocations.
  std::atomic<int> granted{0};
  threads.clear();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 4; ++i) {
        if (ps.allocate(kPool).ok()) granted++;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_LE(ps.pool_count(), 4u);
  EXPECT_LE(granted.load(), 4);
  EXPECT_EQ(ps.allocate(kPool).status().code(), Code::kResourceExhausted);
}

// A freed range whose ends share pages with live neighbours is handed out again zeroed: its whole
// pages are punched and its partial pages zeroed in place (ALLOC_RAW's promise, docs/server.md),
// while the neighbours keep their bytes. FARMEM_POOLS_FAULT=no_edge_zero fails it.
TEST(PoolSetTest, FreedRangesAreAllocatedAgainZeroed) {
  if (const char* f = std::getenv("FARMEM_POOLS_FAULT"))
    std::printf("[ fault    ] FARMEM_POOLS_FAULT=%s\n", f);
  Registry reg;
  auto set = PoolSet::Create(kPool, kPool, reg.fn());
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  PoolSet& ps = **set;
  auto a = ps.allocate(100), b = ps.allocate(3 * 4096 + 1000), c = ps.allocate(100);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const Pool* p = ps.pool(0);
  for (auto* r : {&*a, &*b, &*c}) std::memset(p->addr + r->offset, 0xee, r->length);
  ASSERT_TRUE(ps.free(b->key, b->offset).ok());
  ps.release_pages(b->key, b->offset, b->length);
  auto again = ps.allocate(3 * 4096 + 1000);
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->offset, b->offset);  // first fit: the same range
  size_t nonzero = 0;
  for (uint64_t i = 0; i < again->length; ++i)
    nonzero += p->addr[again->offset + i] != std::byte{0};
  EXPECT_EQ(nonzero, 0u) << "bytes of the freed range survived into the new allocation";
  for (auto* r : {&*a, &*c})
    for (uint64_t i = 0; i < r->length; ++i)
      ASSERT_EQ(p->addr[r->offset + i], std::byte{0xee}) << "a neighbour lost byte " << i;
}

}  // namespace
}  // namespace farmem
