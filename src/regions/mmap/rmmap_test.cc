// rmmap tests against an embedded farmemd and a memory:// cluster store: faults fetch what the
// store holds, holes fill with zeros without remote reads, rmarkdirty / write-protect + rsync write
// back, rclearcache refetches, a dead server gives SIGBUS. FARMEM_REGIONS_MMAP_FAULT=no_fetch|
// no_dirty|no_wp removes a protection and the matching test fails. Main thread plus the mappings'
// handler threads.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <csetjmp>
#include <csignal>
#include <cstring>
#include <thread>

#include "farmem/regions.h"
#include "regions/engine/region_store.h"
#include "regions/engine/region_store_test_util.h"

namespace farmem::regions {
namespace {

using testing::RandomBytes;
using testing::RegionEnv;

constexpr size_t kPage = 4096;

class RmmapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const char* f = std::getenv("FARMEM_REGIONS_MMAP_FAULT"))
      std::printf("[ fault    ] FARMEM_REGIONS_MMAP_FAULT=%s\n", f);
    ASSERT_TRUE(env_.Start(1, 16ull << 20).ok());
    auto s = env_.OpenStore();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  uint64_t Create(std::string_view name, const std::vector<std::byte>& data) {
    auto a = store_->create(kRootIno, name, 0644, who_);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    if (!a.ok()) return 0;
    if (!data.empty()) {
      EXPECT_TRUE(store_->write(a->ino, 0, data).ok());
    }
    return a->ino;
  }
  std::vector<std::byte> Read(uint64_t ino, uint64_t off, size_t n) {
    return testing::ReadBytes(*store_, ino, off, n);
  }

  // rmmap of `name` when write-protect tracking is on, else nullptr (an rmmap failure is also
  // reported as a test failure).
  std::byte* MapWithWriteProtect(std::string_view name) {
    auto p = rmmap(*store_, name);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return nullptr;
    auto st = rmmap_stats(*p);
    if (st.ok() && st->write_protect) return static_cast<std::byte*>(*p);
    (void)rmunmap(*p);
    return nullptr;
  }

  RegionEnv env_;
  std::unique_ptr<RegionStore> store_;
  Caller who_{0, 0, 4242};
};

TEST_F(RmmapTest, FaultsFetchWhatTheStoreHolds) {
  auto data = RandomBytes(3 * kPage + 100, 1);
  Create("r", data);
  auto p = rmmap(*store_, "/r");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto* b = static_cast<std::byte*>(*p);
  EXPECT_EQ(0, std::memcmp(b, data.data(), data.size()));
  // Past the region's size, the last page reads zero.
  for (size_t i = data.size(); i < 4 * kPage; ++i) ASSERT_EQ(b[i], std::byte{0}) << i;
  auto st = rmmap_stats(*p);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->faults, 4u);
  EXPECT_TRUE(rmunmap(*p).ok());
  EXPECT_EQ(rmunmap(*p).code(), Code::kNotFound);
}

TEST_F(RmmapTest, ThreadsFaultingTheSamePagesAllSeeTheData) {
  auto data = RandomBytes(64 * kPage, 2);
  Create("r", data);
  auto p = rmmap(*store_, "r");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto* b = static_cast<const std::byte*>(*p);
  std::vector<std::thread> ts;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([&] {
      if (std::memcmp(b, data.data(), data.size()) != 0) bad++;
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_TRUE(rmunmap(*p).ok());
}

TEST_F(RmmapTest, HolesReadZeroWithoutRemoteReads) {
  uint64_t ino = Create("sparse", {});
  SetAttrRequest req;
  req.size = 1 << 20;
  ASSERT_TRUE(store_->setattr(ino, req).ok());
  auto page = RandomBytes(kPage, 3);
  ASSERT_TRUE(store_->write(ino, 512 * 1024, page).ok());
  auto p = rmmap(*store_, "sparse");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto* b = static_cast<const std::byte*>(*p);
  uint64_t before = store_->stats().remote_reads;
  for (size_t off = 0; off < 256 * 1024; ++off) ASSERT_EQ(b[off], std::byte{0}) << off;
  EXPECT_EQ(store_->stats().remote_reads, before) << "holes were read remotely";
  EXPECT_EQ(0, std::memcmp(b + 512 * 1024, page.data(), kPage));
  EXPECT_GT(store_->stats().remote_reads, before);
  EXPECT_TRUE(rmunmap(*p).ok());
}

TEST_F(RmmapTest, MarkDirtyAndRsyncWriteBack) {
  auto data = RandomBytes(4 * kPage, 4);
  uint64_t ino = Create("r", data);
  auto p = rmmap(*store_, "r");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto* b = static_cast<std::byte*>(*p);
  auto expect = data;
  // Page 1: a partial write marked dirty; page 2: zeroed by rmarkdirty(zero); page 3 only read:
  // not written back.
  std::memset(b + kPage + 10, 0x5a, 100);
  std::memset(expect.data() + kPage + 10, 0x5a, 100);
  ASSERT_TRUE(rmarkdirty(b + kPage + 10, 100, false).ok());
  ASSERT_TRUE(rmarkdirty(b + 2 * kPage, kPage, true).ok());
  std::memset(expect.data() + 2 * kPage, 0, kPage);
  EXPECT_EQ(b[3 * kPage], data[3 * kPage]);
  ASSERT_TRUE(rsync(b, 4 * kPage).ok());
  EXPECT_EQ(Read(ino, 0, 4 * kPage), expect);
  auto st = rmmap_stats(b);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->pages_written, 2u);
  EXPECT_TRUE(rmunmap(b).ok());
}

TEST_F(RmmapTest, PlainStoresAreTrackedByWriteProtect) {
  auto data = RandomBytes(8 * kPage, 9);
  uint64_t ino = Create("r", data);
  std::byte* b = MapWithWriteProtect("r");
  if (b == nullptr) GTEST_SKIP() << "rmmap failed or no userfaultfd write-protect (see above)";
  auto expect = data;
  // Page 0 read first (installed write-protected), then stored to; page 5 stored to on its
  // first touch (a write fault); the rest only read.
  EXPECT_EQ(b[0], data[0]);
  for (size_t i : {size_t{0}, 5 * kPage + 7}) {
    b[i] = ~b[i];
    expect[i] = ~expect[i];
  }
  EXPECT_EQ(0, std::memcmp(b + kPage, data.data() + kPage, kPage));
  ASSERT_TRUE(rsync(b, 8 * kPage).ok());
  EXPECT_EQ(Read(ino, 0, 8 * kPage), expect);
  // rsync re-protected the pages: a second store to page 0 is caught again.
  b[1] = ~b[1];
  expect[1] = ~expect[1];
  ASSERT_TRUE(rsync(b, 8 * kPage).ok());
  EXPECT_EQ(Read(ino, 0, 8 * kPage), expect);
  auto st = rmmap_stats(b);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->pages_written, 3u);
  EXPECT_TRUE(rmunmap(b).ok());
}

TEST_F(RmmapTest, ClearCacheRefetchesAndRefusesDirtyPages) {
  auto data = RandomBytes(2 * kPage, 5);
  uint64_t ino = Create("r", data);
  auto p = rmmap(*store_, "r");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto* b = static_cast<std::byte*>(*p);
  EXPECT_EQ(0, std::memcmp(b, data.data(), data.size()));
  auto fresh = RandomBytes(2 * kPage, 6);
  ASSERT_TRUE(store_->write(ino, 0, fresh).ok());
  EXPECT_EQ(0, std::memcmp(b, data.data(), data.size())) << "no coherence: the cache stays";
  ASSERT_TRUE(rclearcache(b, 2 * kPage).ok());
  EXPECT_EQ(0, std::memcmp(b, fresh.data(), fresh.size()));
  ASSERT_TRUE(rmarkdirty(b, 1, false).ok());
  EXPECT_EQ(rclearcache(b, kPage).code(), Code::kFailedPrecondition);
  EXPECT_TRUE(rmunmap(b).ok());
}

TEST_F(RmmapTest, BadInputGivesErrors) {
  Create("r", RandomBytes(kPage, 7));
  EXPECT_EQ(rmmap(*store_, "nope").status().code(), Code::kNotFound);
  ASSERT_TRUE(store_->mkdir(kRootIno, "d", 0755, who_).ok());
  EXPECT_EQ(rmmap(*store_, "d").status().code(), Code::kInvalidArgument);
  Create("empty", {});
  EXPECT_EQ(rmmap(*store_, "empty").status().code(), Code::kInvalidArgument);
  int x = 0;
  EXPECT_EQ(rsync(&x, 4).code(), Code::kNotFound);
  auto p = rmmap(*store_, "r");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(rmarkdirty(*p, 2 * kPage, false).code(), Code::kInvalidArgument);
  EXPECT_TRUE(rmunmap(*p).ok());
}

// rsync racing plain stores from another thread: after the writer stops, one more rsync must
// leave the store equal to the mapping (a store that landed after its page's bit was cleared but
// escaped re-protection would be lost here).
TEST_F(RmmapTest, RsyncRacingStoresLosesNone) {
  constexpr size_t kPages = 8;
  uint64_t ino = Create("r", RandomBytes(kPages * kPage, 10));
  std::byte* b = MapWithWriteProtect("r");
  if (b == nullptr) GTEST_SKIP() << "rmmap failed or no userfaultfd write-protect (see above)";
  std::atomic<bool> done{false};
  std::thread writer([&] {
    auto* w = reinterpret_cast<volatile uint64_t*>(b);
    for (uint64_t i = 1; i <= 20000; ++i) w[(i * 613) % (kPages * kPage / 8)] = i;
    done = true;
  });
  int syncs = 0;
  while (!done || syncs == 0) {
    ASSERT_TRUE(rsync(b, kPages * kPage).ok());
    ++syncs;
  }
  writer.join();
  ASSERT_TRUE(rsync(b, kPages * kPage).ok());
  auto back = Read(ino, 0, kPages * kPage);
  ASSERT_EQ(back.size(), kPages * kPage);
  EXPECT_EQ(0, std::memcmp(back.data(), b, back.size())) << syncs << " rsyncs raced the writer";
  EXPECT_TRUE(rmunmap(b).ok());
}

// rprefetch installs the missing pages of a range without faults (the fault counter stays at what
// the test touched itself), skips pages already present (a dirty page keeps its store), the data
// is what the store holds, zeros past the size, and (with write-protect tracking) a store to a
// prefetched page is written back by rsync. Fails with no_prefetch (every page faults).
TEST_F(RmmapTest, PrefetchInstallsMissingPagesWithoutFaults) {
  constexpr size_t kPages = 40;  // two 128 KiB chunks and a partial third: parallel reads
  auto data = RandomBytes(kPages * kPage - 100, 11);
  uint64_t ino = Create("r", data);
  auto p = rmmap(*store_, "r");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto* b = static_cast<std::byte*>(*p);
  // Page 3 present and dirty before the prefetch: it must be skipped, not refetched over.
  b[3 * kPage] = ~data[3 * kPage];
  ASSERT_TRUE(rmarkdirty(b + 3 * kPage, 1, false).ok());
  auto st = rmmap_stats(b);
  ASSERT_TRUE(st.ok());
  const uint64_t faults_before = st->faults;
  EXPECT_EQ(faults_before, 1u);
  ASSERT_TRUE(rprefetch(b, kPages * kPage).ok());
  st = rmmap_stats(b);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->prefetched, kPages - 1);
  EXPECT_EQ(b[3 * kPage], ~data[3 * kPage]) << "a present page was overwritten";
  EXPECT_EQ(0, std::memcmp(b + 4 * kPage, data.data() + 4 * kPage, data.size() - 4 * kPage));
  EXPECT_EQ(0, std::memcmp(b, data.data(), 3 * kPage));
  for (size_t i = data.size(); i < kPages * kPage; ++i) ASSERT_EQ(b[i], std::byte{0}) << i;
  st = rmmap_stats(b);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->faults, faults_before) << "prefetched pages faulted on access";
  // Everything present now: a second prefetch installs nothing.
  ASSERT_TRUE(rprefetch(b, kPages * kPage).ok());
  EXPECT_EQ(rmmap_stats(b)->prefetched, kPages - 1);
  // A plain store to a prefetched page is tracked like one to a fetched page (installed
  // write-protected), so rsync writes it back.
  if (st->write_protect) {
    b[20 * kPage + 5] = ~data[20 * kPage + 5];
    ASSERT_TRUE(rsync(b, kPages * kPage).ok());
    EXPECT_EQ(Read(ino, 20 * kPage + 5, 1), std::vector<std::byte>{~data[20 * kPage + 5]})
        << "a store to a prefetched page was not written back";
  }
  EXPECT_EQ(rprefetch(b, (kPages + 1) * kPage).code(), Code::kInvalidArgument);
  int x = 0;
  EXPECT_EQ(rprefetch(&x, 4).code(), Code::kNotFound);
  EXPECT_TRUE(rmunmap(b).ok());
}

// rprefetch racing faults from another thread on the same pages: a page the thread faulted in
// after rprefetch's mincore makes its UFFDIO_COPY stop with EEXIST, and rprefetch must skip that
// page and install the rest (not fail, not overwrite); every page then holds the store's bytes.
TEST_F(RmmapTest, PrefetchRacingFaultsSkipsPagesFaultedMeanwhile) {
  constexpr size_t kPages = 64;
  auto data = RandomBytes(kPages * kPage, 12);
  Create("r", data);
  auto p = rmmap(*store_, "r");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto* b = static_cast<std::byte*>(*p);
  for (int iter = 0; iter < 40; ++iter) {
    ASSERT_TRUE(rclearcache(b, kPages * kPage).ok());
    std::atomic<int> bad{0};
    std::thread reader([&] {
      for (size_t i = kPages; i-- > 0;)  // from the end, towards the prefetch
        if (*reinterpret_cast<volatile std::byte*>(b + i * kPage + 7) != data[i * kPage + 7]) bad++;
    });
    Status st = rprefetch(b, kPages * kPage);
    reader.join();
    ASSERT_TRUE(st.ok()) << "iteration " << iter << ": " << st.ToString();
    ASSERT_EQ(bad.load(), 0) << "iteration " << iter;
    ASSERT_EQ(0, std::memcmp(b, data.data(), data.size())) << "iteration " << iter;
  }
  EXPECT_TRUE(rmunmap(b).ok());
}

sigjmp_buf g_jmp;
void OnSigbus(int) {
  siglongjmp(g_jmp, 1);
}

TEST_F(RmmapTest, DeadServerGivesSigbusNotAHang) {
  auto data = RandomBytes(2 * kPage, 8);
  Create("r", data);
  auto p = rmmap(*store_, "r");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto* b = static_cast<volatile std::byte*>(*p);
  env_.servers[0]->stop();
  struct sigaction sa {
  }, old{};
  sa.sa_handler = OnSigbus;
  sigaction(SIGBUS, &sa, &old);
  volatile bool got_sigbus = false;
  if (sigsetjmp(g_jmp, 1) == 0) {
    (void)b[0];
  } else {
    got_sigbus = true;
  }
  sigaction(SIGBUS, &old, nullptr);
  EXPECT_TRUE(got_sigbus);
  auto st = rmmap_stats(*p);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->fetch_errors, 1u);
  EXPECT_TRUE(rmunmap(*p).ok());
}

}  // namespace
}  // namespace farmem::regions
