// The cached-reads option of the TeRM engine (TierOptions::cached_reads: a buffered RWF_NOWAIT
// read first, O_DIRECT when a page is not cached): right bytes whether the pages are cached or
// not, never stale after a cold write; and a disabled microbenchmark against O_DIRECT alone
// (run with --gtest_also_run_disabled_tests; docs/tier.md "Cached reads"). Test thread only.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "tier/engine/tier_store.h"
#include "tier/engine/tier_test_util.h"

namespace farmem::tier {
namespace {

using testing::CachedPages;
using testing::MustRead;
using testing::RandomBytes;
using testing::SmallOptions;
using testing::TempDir;

// Reads the whole file through the page cache (what makes its pages cached).
bool WarmPageCache(const std::string& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::vector<char> buf(1 << 20);
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(done));
    if (n <= 0) break;
    done += static_cast<uint64_t>(n);
  }
  ::close(fd);
  return done == bytes;
}

// Drops the file's clean pages from the page cache.
bool DropPageCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::fdatasync(fd) == 0 && ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0;
  ::close(fd);
  return ok;
}

// Drops the file's pages until mincore finds none of its first `bytes` cached (up to ~1 s): the
// drop is advice, and the kernel keeps a page it still holds elsewhere. A TSan run under load once
// saw the first read below served whole from the page cache right after one drop.
bool DropUntilUncached(const std::string& path, uint64_t bytes) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (!DropPageCache(path)) return false;
    if (CachedPages(path, bytes) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(TierStoreCachedReads, CachedAndUncachedPagesReadRightAndWritesAreNeverStale) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TierOptions o = SmallOptions(dir.File("tier"), 8, 1);
  o.cached_reads = true;
  auto store = TierStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  TierStore& t = **store;
  std::mt19937_64 rng(9);
  std::vector<uint8_t> model = RandomBytes(rng, o.capacity);
  ASSERT_TRUE(t.Write(0, model).ok());  // every unit cold: O_DIRECT writes

  // Not cached: the RWF_NOWAIT read misses, the O_DIRECT read serves it. Whether the kernel
  // honours RWF_NOWAIT here is not ours to decide: clean-clone CI runs on this machine (plain and
  // ASan, 2026-12-02) saw the read served whole 5 times in a row right after mincore found no page
  // cached. The bytes are checked either way; the fallback's count only when the kernel missed.
  for (int attempt = 0; attempt < 5 && t.Stats().cached_read_misses == 0; ++attempt) {
    ASSERT_TRUE(DropUntilUncached(o.path, o.capacity))
        << CachedPages(o.path, o.capacity) << " pages stay cached after dropping them";
    EXPECT_EQ(MustRead(t, 5000, 9000),
              std::vector<uint8_t>(model.begin() + 5000, model.begin() + 14000));
  }
  if (t.Stats().cached_read_misses == 0) {
    std::printf(
        "[ note     ] the kernel served 5 RWF_NOWAIT reads of uncached pages whole: the O_DIRECT "
        "fallback was not reached in this run\n");
  }
  const uint64_t hits = t.Stats().cached_read_hits;
  // Cached (warmed through the page cache): served by the buffered read, no file IO.
  ASSERT_TRUE(WarmPageCache(o.path, o.capacity));
  const uint64_t io_before = t.Stats().io_read_bytes;
  EXPECT_EQ(MustRead(t, 100, 20000),
            std::vector<uint8_t>(model.begin() + 100, model.begin() + 20100));
  EXPECT_GT(t.Stats().cached_read_hits, hits);
  EXPECT_EQ(t.Stats().io_read_bytes, io_before) << "a cached read went to the file";
  // A cold write over cached pages (O_DIRECT invalidates them): the next read sees the new bytes.
  for (int round = 0; round < 20; ++round) {
    const uint64_t off = rng() % (o.capacity - 6000);
    const std::vector<uint8_t> w = RandomBytes(rng, 1 + rng() % 6000);
    std::copy(w.begin(), w.end(), model.begin() + static_cast<ptrdiff_t>(off));
    ASSERT_TRUE(t.Write(off, w).ok());
    ASSERT_TRUE(WarmPageCache(o.path, o.capacity));
    const uint64_t at = off > 3000 ? off - 3000 : 0;
    const size_t n = std::min<uint64_t>(12000, o.capacity - at);
    ASSERT_EQ(MustRead(t, at, n),
              std::vector<uint8_t>(model.begin() + static_cast<ptrdiff_t>(at),
                                   model.begin() + static_cast<ptrdiff_t>(at + n)))
        << "round " << round << ": stale bytes after a cold write";
  }
  EXPECT_EQ(MustRead(t, 0, o.capacity), model);
}

// Microbenchmark (no assertions on time): 4 KiB reads of cold pages at random offsets of a
// 64 MiB file, single thread, (a) O_DIRECT only, (b) cached reads with every page cached,
// (c) cached reads with no page cached (RWF_NOWAIT miss + O_DIRECT). Prints us per read and the
// page-cache share after (c) (does the RWF_NOWAIT attempt start readahead?).
TEST(TierStoreCachedReads, DISABLED_MicrobenchCachedVsDirect4KiB) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  constexpr uint64_t kUnits = 64, kUnit = 1 << 20, kReads = 20000;
  const std::string path = dir.File("tier");
  {
    TierOptions o = SmallOptions(path, kUnits, 1, kUnit);
    auto s = TierStore::Open(o);
    ASSERT_TRUE(s.ok());
    std::mt19937_64 rng(1);
    const std::vector<uint8_t> data = RandomBytes(rng, kUnit);
    for (uint64_t u = 0; u < kUnits; ++u) ASSERT_TRUE((*s)->Write(u * kUnit, data).ok());
  }
  auto run = [&](bool cached, bool warm, const char* name) {
    TierOptions o = SmallOptions(path, kUnits, 1, kUnit);
    o.cached_reads = cached;
    auto s = TierStore::Open(o);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(DropPageCache(path));
    if (warm) {
      ASSERT_TRUE(WarmPageCache(path, kUnits * kUnit));
    }
    std::mt19937_64 rng(2);
    std::vector<uint8_t> out(4096);
    const auto t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; i < kReads; ++i) {
      ASSERT_TRUE((*s)->Read((rng() % (kUnits * kUnit / 4096)) * 4096, out).ok());
    }
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        kReads;
    const TierStats st = (*s)->Stats();
    std::printf(
        "[ measure  ] %-34s %7.2f us/read  hits %llu misses %llu  cached pages %lld/%llu\n", name,
        us, (unsigned long long)st.cached_read_hits, (unsigned long long)st.cached_read_misses,
        (long long)CachedPages(path, kUnits * kUnit), (unsigned long long)(kUnits * kUnit / 4096));
  };
  for (int round = 0; round < 3; ++round) {
    run(false, false, "O_DIRECT only");
    run(true, true, "cached reads, every page cached");
    run(true, false, "cached reads, no page cached");
  }
}

}  // namespace
}  // namespace farmem::tier
