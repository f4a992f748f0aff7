// RegionStore tests against embedded farmemds (loopback TCP) and a memory:// cluster store: data
// round trips across chunks, holes, truncation, deferred frees, ENOSPC, ONEWRITER, the namespace
// operations, fallocate, OWNERPID, HOSTALLOC, the reports and reloading the namespace from the
// store. FARMEM_REGIONS_FAULT=no_zero|no_tail|no_pin|no_rollback|no_onewriter|no_prealloc|
// no_punch_zero|no_reap|no_revoke|reap_persistent|no_hostalloc|no_rewatch removes one protection;
// the test guarding it then fails. The OWNERPID tests fork children (they only block on a pipe and
// _exit) to be regions' owner processes.
#include "regions/engine/region_store.h"

#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "regions/engine/region_store_test_util.h"

namespace farmem::regions {
namespace {

using testing::RandomBytes;
using testing::RegionEnv;

class RegionStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::FaultName().empty())
      std::printf("[ fault    ] FARMEM_REGIONS_FAULT=%s\n", testing::FaultName().c_str());
  }
  void Open(int servers = 1, uint64_t budget = 16ull << 20, bool persistent = false) {
    ASSERT_TRUE(env_.Start(servers, budget, persistent).ok());
    auto s = env_.OpenStore();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  uint64_t Create(std::string_view name, uint64_t parent = kRootIno) {
    auto a = store_->create(parent, name, 0644, who_);
    EXPECT_TRUE(a.ok()) << a.status().ToString();
    return a.ok() ? a->ino : 0;
  }
  // A stand-in owner process: a child blocked on a pipe (fork: it only reads and _exits) that
  // exits when *release is closed.
  static pid_t SpawnOwner(int* release) {
    int pipefd[2];
    if (pipe(pipefd) != 0) return -1;
    pid_t child = fork();
    if (child == 0) {
      char c;
      close(pipefd[1]);
      (void)!read(pipefd[0], &c, 1);
      _exit(0);
    }
    close(pipefd[0]);
    *release = pipefd[1];
    return child;
  }
  // Lets the owner exit, reaps it, then calls ReapOwners until it deletes something (10 s bound).
  std::vector<ReapedRegion> EndOwner(pid_t child, int release) {
    close(release);
    int status = 0;
    EXPECT_EQ(waitpid(child, &status, 0), child);
    for (int i = 0; i < 100; ++i) {  // the pidfd is readable at once
      auto r = store_->ReapOwners(std::chrono::milliseconds(100));
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      if (!r.ok() || !r->empty()) return r.ok() ? *r : std::vector<ReapedRegion>{};
    }
    return {};
  }
  // A directory in the root with region attribute `xattr` set to 1 (its files inherit it).
  uint64_t MkdirWith(std::string_view name, std::string_view xattr) {
    auto d = store_->mkdir(kRootIno, name, 0755, who_);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    if (!d.ok()) return 0;
    EXPECT_TRUE(store_->setxattr(d->ino, xattr, "1").ok());
    return d->ino;
  }
  std::vector<std::byte> Read(uint64_t ino, uint64_t off, size_t n) {
    return testing::ReadBytes(*store_, ino, off, n);
  }
  static size_t CountNonZero(const std::vector<std::byte>& v) {
    return static_cast<size_t>(
        std::count_if(v.begin(), v.end(), [](std::byte b) { return b != std::byte{0}; }));
  }

  RegionEnv env_;
  std::unique_ptr<RegionStore> store_;
  Caller who_{1000, 1000, 4242};
};

TEST_F(RegionStoreTest, WritesReadBackAcrossChunksAndUnalignedOffsets) {
  Open();
  uint64_t f = Create("data");
  auto data = RandomBytes(3 * kChunkBytes + 777, 1);
  ASSERT_TRUE(store_->write(f, 0, data).ok());
  // Overwrite a range straddling a chunk boundary.
  auto patch = RandomBytes(5000, 2);
  uint64_t at = kChunkBytes - 1234;
  ASSERT_TRUE(store_->write(f, at, patch).ok());
  std::copy(patch.begin(), patch.end(), data.begin() + static_cast<ptrdiff_t>(at));
  EXPECT_EQ(Read(f, 0, data.size() + 100), data);  // short read at end of file
  auto attr = store_->getattr(f);
  ASSERT_TRUE(attr.ok());
  EXPECT_EQ(attr->size, data.size());
  EXPECT_EQ(attr->chunks, 4u);
  EXPECT_EQ(attr->owner_pid, 4242);
  EXPECT_EQ(Read(f, data.size(), 10).size(), 0u);
}

TEST_F(RegionStoreTest, HolesReadZeroWithoutRemoteReads) {
  Open();
  uint64_t f = Create("sparse");
  auto tail = RandomBytes(100, 3);
  ASSERT_TRUE(store_->write(f, 5 * kStepBytes / 2, tail).ok());
  auto attr = store_->getattr(f);
  ASSERT_TRUE(attr.ok());
  EXPECT_EQ(attr->chunks, 1u);  // only the written chunk exists
  uint64_t before = store_->stats().remote_reads;
  auto zeros = Read(f, 0, 5 * kStepBytes / 2);
  EXPECT_EQ(CountNonZero(zeros), 0u);
  EXPECT_EQ(store_->stats().remote_reads, before);
}

// A chunk freed by one region and handed to another must not show the first region's bytes.
TEST_F(RegionStoreTest, ReusedChunkReadsZeroOutsideWhatWasWritten) {
  Open();
  uint64_t keep = Create("keep");  // keeps the unit alive so its chunks are reused in place
  ASSERT_TRUE(store_->write(keep, 0, RandomBytes(10, 4)).ok());
  uint64_t old = Create("old");
  std::vector<std::byte> ab(2 * kChunkBytes, std::byte{0xab});
  ASSERT_TRUE(store_->write(old, 0, ab).ok());
  ASSERT_TRUE(store_->unlink(kRootIno, "old").ok());
  uint64_t fresh = Create("new");
  std::vector<std::byte> one(1, std::byte{7});
  ASSERT_TRUE(store_->write(fresh, 100, one).ok());
  ASSERT_TRUE(store_->setattr(fresh, SetAttrRequest{.size = 2 * kChunkBytes}).ok());
  auto got = Read(fresh, 0, 2 * kChunkBytes);
  EXPECT_EQ(got[100], std::byte{7});
  EXPECT_EQ(CountNonZero(got), 1u) << "bytes of the deleted region are readable";
}

// A chunk never used since its unit was granted is zero already (ALLOC_RAW's promise): a small
// write into a new file sends only its own bytes, and the rest of the chunk still reads zero.
// (A reused chunk is zeroed: ReusedChunkReadsZeroOutsideWhatWasWritten, which no_touched fails.)
TEST_F(RegionStoreTest, NeverUsedChunksAreNotZeroedOverTheWire) {
  Open();
  uint64_t f = Create("small");
  const uint64_t before = store_->stats().remote_writes;
  std::vector<std::byte> some(3000, std::byte{0x5a});
  ASSERT_TRUE(store_->write(f, 100, some).ok());
  EXPECT_EQ(store_->stats().remote_writes - before, 1u) << "a fresh chunk was zeroed over the wire";
  ASSERT_TRUE(store_->setattr(f, SetAttrRequest{.size = kChunkBytes}).ok());
  auto got = Read(f, 0, kChunkBytes);
  EXPECT_EQ(CountNonZero(got), some.size());
}

TEST_F(RegionStoreTest, TruncateShrinkThenGrowReadsZeroAndFreesChunks) {
  Open();
  uint64_t f = Create("t");
  std::vector<std::byte> cd(3 * kChunkBytes, std::byte{0xcd});
  ASSERT_TRUE(store_->write(f, 0, cd).ok());
  uint64_t cut = kChunkBytes + 1000;
  auto a = store_->setattr(f, SetAttrRequest{.size = cut});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->chunks, 2u);
  EXPECT_EQ(store_->stats().chunks_in_use, 2u);
  ASSERT_TRUE(store_->setattr(f, SetAttrRequest{.size = 4 * kChunkBytes}).ok());
  auto got = Read(f, 0, 4 * kChunkBytes);
  ASSERT_EQ(got.size(), 4 * kChunkBytes);
  EXPECT_EQ(CountNonZero(got), cut) << "bytes past a shrink came back after growing";
  // Shrink to zero: every chunk goes, the unit returns to the server.
  ASSERT_TRUE(store_->setattr(f, SetAttrRequest{.size = 0}).ok());
  EXPECT_EQ(store_->stats().chunks_in_use, 0u);
  EXPECT_EQ(store_->stats().units, 0u);
}

TEST_F(RegionStoreTest, OpenHandlesKeepChunksOfUnlinkedAndShrunkFiles) {
  Open();
  uint64_t f = Create("pinned");
  auto data = RandomBytes(2 * kChunkBytes, 5);
  ASSERT_TRUE(store_->write(f, 0, data).ok());
  auto h = store_->open(f, false);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(store_->setattr(f, SetAttrRequest{.size = 0}).ok());
  EXPECT_EQ(store_->stats().chunks_in_use, 2u) << "a shrink freed chunks a handle still has";
  ASSERT_TRUE(store_->write(f, 0, data).ok());
  ASSERT_TRUE(store_->unlink(kRootIno, "pinned").ok());
  EXPECT_EQ(store_->stats().chunks_in_use, 4u) << "an unlink freed chunks a handle still has";
  EXPECT_EQ(Read(f, 0, data.size()), data);  // still readable through the handle
  ASSERT_TRUE(store_->release(*h).ok());
  EXPECT_EQ(store_->stats().chunks_in_use, 0u);
  EXPECT_FALSE(store_->getattr(f).ok());
}

TEST_F(RegionStoreTest, EnospcChangesNothingAndSpaceIsReusableAfterDelete) {
  Open(1, 8ull << 20);  // 8 MiB: 4 units of 2 MiB
  uint64_t keep = Create("keep");
  auto kept = RandomBytes(kChunkBytes + 5, 6);
  ASSERT_TRUE(store_->write(keep, 0, kept).ok());
  uint64_t fill = Create("fill");
  auto mib = RandomBytes(1 << 20, 7);
  uint64_t written = 0;
  Status st;
  for (int i = 0; i < 16; ++i) {
    st = store_->write(fill, written, mib);
    if (!st.ok()) break;
    written += mib.size();
  }
  ASSERT_FALSE(st.ok()) << "8 MiB never ran out";
  EXPECT_EQ(ErrnoOf(st), ENOSPC) << st.ToString();
  RegionStoreStats s = store_->stats();
  EXPECT_EQ(s.chunks_in_use, 2 + written / kChunkBytes) << "the failed write left chunks allocated";
  auto fa = store_->getattr(fill);
  ASSERT_TRUE(fa.ok());
  EXPECT_EQ(fa->size, written);
  EXPECT_EQ(Read(keep, 0, kept.size()), kept);
  auto sfs = store_->statfs();
  ASSERT_TRUE(sfs.ok()) << sfs.status().ToString();
  EXPECT_EQ(sfs->budget_bytes, 8ull << 20);
  // Delete, and the same amount fits again.
  ASSERT_TRUE(store_->unlink(kRootIno, "fill").ok());
  uint64_t again = Create("again");
  for (uint64_t off = 0; off < written; off += mib.size())
    ASSERT_TRUE(store_->write(again, off, mib).ok()) << "space not reusable at " << off;
  EXPECT_EQ(Read(again, written - mib.size(), mib.size()), mib);
}

// ZERO_RANGE over data, a punched hole and the end: the range reads zero (chunks it had are
// zeroed in place, the hole gets a chunk), the rest is untouched; KEEP_SIZE keeps the size.
TEST_F(RegionStoreTest, FallocateZeroRangeZeroesAllocatesAndExtends) {
  Open(1, 8ull << 20);
  uint64_t f = Create("f");
  auto data = RandomBytes(4 * kChunkBytes, 13);
  ASSERT_TRUE(store_->write(f, 0, data).ok());
  ASSERT_TRUE(
      store_->fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, kChunkBytes, kChunkBytes)
          .ok());
  std::fill(data.begin() + kChunkBytes, data.begin() + 2 * kChunkBytes, std::byte{0});
  ASSERT_EQ(store_->getattr(f)->chunks, 3u);
  // [chunk/2, 2.5 chunks): half of chunk 0, the hole at chunk 1, half of chunk 2.
  ASSERT_TRUE(store_->fallocate(f, FALLOC_FL_ZERO_RANGE, kChunkBytes / 2, 2 * kChunkBytes).ok());
  std::fill(data.begin() + kChunkBytes / 2, data.begin() + 5 * kChunkBytes / 2, std::byte{0});
  EXPECT_EQ(Read(f, 0, data.size()), data) << "the range is not zero or the rest was damaged";
  EXPECT_EQ(store_->getattr(f)->chunks, 4u) << "ZERO_RANGE did not allocate the hole";
  EXPECT_EQ(store_->getattr(f)->size, 4 * kChunkBytes);
  // KEEP_SIZE past the end allocates without extending; without it the size grows.
  ASSERT_TRUE(store_
                  ->fallocate(f, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 4 * kChunkBytes - 10,
                              kChunkBytes)
                  .ok());
  EXPECT_EQ(store_->getattr(f)->size, 4 * kChunkBytes);
  EXPECT_EQ(store_->getattr(f)->chunks, 5u);
  std::fill(data.end() - 10, data.end(), std::byte{0});
  EXPECT_EQ(Read(f, 0, data.size()), data);
  ASSERT_TRUE(store_->fallocate(f, FALLOC_FL_ZERO_RANGE, 4 * kChunkBytes, 100).ok());
  EXPECT_EQ(store_->getattr(f)->size, 4 * kChunkBytes + 100);
  EXPECT_EQ(CountNonZero(Read(f, 4 * kChunkBytes - 10, 110)), 0u);
}

TEST_F(RegionStoreTest, FallocatePreallocatesPunchesAndChangesNothingOnEnospc) {
  Open(1, 8ull << 20);  // 8 MiB: 64 chunks
  uint64_t f = Create("f");
  auto chunks = [&](uint64_t ino) {
    auto a = store_->getattr(ino);
    EXPECT_TRUE(a.ok());
    return a.ok() ? a->chunks : 0;
  };
  // Mode 0 allocates and extends; KEEP_SIZE allocates past the end without extending.
  ASSERT_TRUE(store_->fallocate(f, 0, 0, 3 * kChunkBytes + 1).ok());
  EXPECT_EQ(store_->getattr(f)->size, 3 * kChunkBytes + 1);
  EXPECT_EQ(chunks(f), 4u) << "mode 0 did not allocate";
  ASSERT_TRUE(store_->fallocate(f, FALLOC_FL_KEEP_SIZE, 0, 6 * kChunkBytes).ok());
  EXPECT_EQ(store_->getattr(f)->size, 3 * kChunkBytes + 1);
  EXPECT_EQ(chunks(f), 6u) << "KEEP_SIZE did not allocate past the end";
  EXPECT_EQ(CountNonZero(Read(f, 0, 3 * kChunkBytes + 1)), 0u);
  // Punch [chunk/2, 2.5 chunks): chunk 1 goes, halves of chunks 0 and 2 read zero.
  auto data = RandomBytes(4 * kChunkBytes, 11);
  ASSERT_TRUE(store_->write(f, 0, data).ok());
  ASSERT_TRUE(store_
                  ->fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, kChunkBytes / 2,
                              2 * kChunkBytes)
                  .ok());
  EXPECT_EQ(chunks(f), 5u) << "the whole chunk was not freed";
  std::fill(data.begin() + kChunkBytes / 2, data.begin() + 5 * kChunkBytes / 2, std::byte{0});
  EXPECT_EQ(Read(f, 0, data.size()), data) << "punched range not zero or the rest damaged";
  EXPECT_EQ(store_->getattr(f)->size, 4 * kChunkBytes);
  // Other modes are refused.
  EXPECT_EQ(ErrnoOf(store_->fallocate(f, FALLOC_FL_PUNCH_HOLE, 0, 1)), ENOTSUP);
  EXPECT_EQ(ErrnoOf(store_->fallocate(f, FALLOC_FL_COLLAPSE_RANGE, 0, kChunkBytes)), ENOTSUP);
  // More than the budget: ENOSPC, nothing allocated, the size unchanged.
  uint64_t g = Create("g");
  uint64_t before = store_->stats().chunks_in_use;
  EXPECT_EQ(ErrnoOf(store_->fallocate(g, 0, 0, 16ull << 20)), ENOSPC);
  EXPECT_EQ(store_->stats().chunks_in_use, before) << "the failed fallocate left chunks";
  EXPECT_EQ(store_->getattr(g)->size, 0u);
  // Preallocated chunks are a promise: with the servers full, writes there still succeed.
  ASSERT_TRUE(store_->fallocate(g, 0, 0, 2 * kChunkBytes).ok());
  uint64_t fill = Create("fill");
  auto mib = RandomBytes(1 << 20, 12);
  Status st;
  for (uint64_t off = 0; st.ok() && off < (16ull << 20); off += mib.size())
    st = store_->write(fill, off, mib);
  ASSERT_EQ(ErrnoOf(st), ENOSPC) << "8 MiB never ran out";
  auto two = RandomBytes(2 * kChunkBytes, 13);
  Status w = store_->write(g, 0, two);
  ASSERT_TRUE(w.ok()) << "a write into preallocated chunks failed: " << w.ToString();
  EXPECT_EQ(Read(g, 0, two.size()), two);
}

TEST_F(RegionStoreTest, ReportsDescribeHostsPoolsOpenRegionsAndFiles) {
  Open(1, 8ull << 20);
  uint64_t f = Create("a b=c", MkdirWith("d", "user.region.onewriter"));
  ASSERT_TRUE(store_->write(f, kChunkBytes, RandomBytes(10, 14)).ok());  // chunk 0 a hole
  auto h = store_->open(f, false);
  ASSERT_TRUE(h.ok());
  auto text = [&](std::string_view name) {
    auto r = store_->report(name);
    EXPECT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    return r.ok() ? *r : std::string();
  };
  std::string files = text("files");
  EXPECT_NE(
      files.find(
          "path=/d/a%20b%3Dc ino=" + std::to_string(f) +
          " size=" + std::to_string(kChunkBytes + 10) +
          " chunks=1 persistent=0 multihosted=0 onewriter=1 ownerpid=4242 hostalloc=- vaddr=- "
          "map=1:1.0\n"),
      std::string::npos)
      << files;
  EXPECT_EQ(text("open"),
            "ino=" + std::to_string(f) + " path=/d/a%20b%3Dc opens=1 writers=0 mounts=1\n");
  EXPECT_EQ(text("hosts"), "server=0 address=" + env_.options.servers[0] +
                               " units=1 chunks_in_use=1 used_bytes=131072\n");
  EXPECT_NE(text("pools").find("gid=1 server=0 address=" + env_.options.servers[0]),
            std::string::npos);
  EXPECT_NE(
      text("pools").find(" used_bitmap=0001 chunks_in_use=1 owner=" + store_->mount_id() + "\n"),
      std::string::npos)
      << text("pools");
  std::string mem = text("memusage");
  EXPECT_TRUE(mem.starts_with("budget_bytes=8388608 ")) << mem;
  EXPECT_NE(mem.find(" used_bytes=131072 units=1 unit_bytes=2097152 chunks_in_use=1 "),
            std::string::npos)
      << mem;
  EXPECT_EQ(ErrnoOf(store_->report("nope").status()), ENOENT);
  ASSERT_TRUE(store_->release(*h).ok());
  EXPECT_EQ(text("open"), "");
}

TEST_F(RegionStoreTest, NonPersistentRegionsDieWithTheirOwnerProcess) {
  Open(1, 8ull << 20);
  int release = -1;
  pid_t child = SpawnOwner(&release);
  ASSERT_GT(child, 0);
  Caller owner{1000, 1000, child};
  auto eph = store_->mkdir(kRootIno, "eph", 0755, owner);
  auto keep = store_->mkdir(kRootIno, "keep", 0755, owner);
  ASSERT_TRUE(eph.ok() && keep.ok());
  ASSERT_TRUE(store_->setxattr(keep->ino, "user.region.persistent", "1").ok());
  auto doomed = store_->create(eph->ino, "f", 0644, owner);
  auto kept = store_->create(keep->ino, "f", 0644, owner);
  auto mine = store_->create(eph->ino, "mine", 0644, Caller{0, 0, getpid()});
  ASSERT_TRUE(doomed.ok() && kept.ok() && mine.ok());
  EXPECT_EQ(doomed->owner_pid, child);
  auto data = RandomBytes(kChunkBytes + 1, 15);
  ASSERT_TRUE(store_->write(doomed->ino, 0, data).ok());
  ASSERT_TRUE(store_->write(kept->ino, 0, data).ok());
  auto other = store_->open(doomed->ino, false);  // another opener
  ASSERT_TRUE(other.ok());
  uint64_t chunks_before = store_->stats().chunks_in_use;
  auto nothing = store_->ReapOwners(std::chrono::milliseconds(0));
  ASSERT_TRUE(nothing.ok());
  EXPECT_TRUE(nothing->empty()) << "reaped while the owner lives";
  std::vector<ReapedRegion> reaped = EndOwner(child, release);
  ASSERT_EQ(reaped.size(), 1u) << "the non-persistent region was not deleted with its owner";
  EXPECT_EQ(reaped[0].parent, eph->ino);
  EXPECT_EQ(reaped[0].name, "f");
  EXPECT_EQ(ErrnoOf(store_->lookup(eph->ino, "f").status()), ENOENT);
  EXPECT_TRUE(store_->lookup(keep->ino, "f").ok()) << "the PERSISTENT region went too";
  EXPECT_TRUE(store_->lookup(eph->ino, "mine").ok()) << "a live owner's region went";
  std::vector<std::byte> buf(10);
  EXPECT_EQ(ErrnoOf(store_->read(doomed->ino, 0, buf).status()), EIO) << "revoked region readable";
  EXPECT_EQ(ErrnoOf(store_->write(doomed->ino, 0, data)), EIO) << "revoked region writable";
  EXPECT_EQ(store_->stats().chunks_in_use, chunks_before) << "freed while another opener has it";
  ASSERT_TRUE(store_->release(*other).ok());
  EXPECT_EQ(store_->stats().chunks_in_use, chunks_before - 2) << "memory not returned";
  EXPECT_EQ(Read(kept->ino, 0, data.size()), data);
}

TEST_F(RegionStoreTest, OwnersAreWatchedAgainAfterAReload) {
  Open(1, 8ull << 20, /*persistent=*/true);  // root not PERSISTENT (RegionStoreOptions default)
  int release = -1;
  pid_t child = SpawnOwner(&release);
  ASSERT_GT(child, 0);
  auto f = store_->create(kRootIno, "f", 0644, Caller{0, 0, child});
  ASSERT_TRUE(f.ok());
  store_.reset();  // a remount, while the owner lives
  auto again = env_.OpenStore();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  store_ = std::move(*again);
  auto none = store_->ReapOwners(std::chrono::milliseconds(0));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty()) << "reaped after the reload while the owner lives";
  auto reaped = EndOwner(child, release);
  ASSERT_EQ(reaped.size(), 1u) << "the reloaded region's owner is not watched";
  EXPECT_EQ(reaped[0].ino, f->ino);
  EXPECT_EQ(ErrnoOf(store_->lookup(kRootIno, "f").status()), ENOENT);
  // And a store opened after the owner is gone deletes the region at its first ReapOwners.
  pid_t gone = SpawnOwner(&release);
  ASSERT_GT(gone, 0);
  ASSERT_TRUE(store_->create(kRootIno, "g", 0644, Caller{0, 0, gone}).ok());
  store_.reset();
  close(release);
  int status = 0;
  ASSERT_EQ(waitpid(gone, &status, 0), gone);
  auto third = env_.OpenStore();
  ASSERT_TRUE(third.ok()) << third.status().ToString();
  store_ = std::move(*third);
  auto at_once = store_->ReapOwners(std::chrono::milliseconds(0));
  ASSERT_TRUE(at_once.ok());
  ASSERT_EQ(at_once->size(), 1u) << "a region whose owner died while unmounted survived";
  EXPECT_EQ((*at_once)[0].name, "g");
}

TEST_F(RegionStoreTest, OneWriterIsInheritedAndASecondWriterGetsEbusy) {
  Open();
  uint64_t f = Create("f", MkdirWith("solo", "user.region.onewriter"));
  auto v = store_->getxattr(f, "user.region.onewriter");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, "1");
  auto w1 = store_->open(f, true);
  ASSERT_TRUE(w1.ok());
  auto w2 = store_->open(f, true);
  ASSERT_FALSE(w2.ok()) << "a second writer was let in";
  EXPECT_EQ(ErrnoOf(w2.status()), EBUSY);
  auto r = store_->open(f, false);
  EXPECT_TRUE(r.ok());
  ASSERT_TRUE(store_->release(*w1).ok());
  auto w3 = store_->open(f, true);
  EXPECT_TRUE(w3.ok());
  // A file outside the directory does not inherit it.
  uint64_t g = Create("g");
  EXPECT_EQ(*store_->getxattr(g, "user.region.onewriter"), "0");
  EXPECT_EQ(ErrnoOf(store_->setxattr(g, "user.region.onewriter", "yes")), EINVAL);
  EXPECT_EQ(ErrnoOf(store_->getxattr(g, "user.other").status()), ENODATA);
  EXPECT_EQ(ErrnoOf(store_->setxattr(g, "system.posix_acl_access", "x")), ENOTSUP);
  EXPECT_EQ(ErrnoOf(store_->setxattr(g, "user.region.ownerpid", "1")), EPERM);
}

// FIXVADDR: files inherit the attribute and each holds its own 8 GiB slot of the fixed range
// (user.region.vaddr), kept across a reload; clearing the attribute or deleting the file gives
// the slot back; the address cannot be set.
TEST_F(RegionStoreTest, FixvaddrRegionsHoldDistinctAddressesOfTheFixedRange) {
  Open(1, 16ull << 20, /*persistent=*/true);
  uint64_t dir = MkdirWith("fixed", "user.region.fixvaddr");
  uint64_t f1 = Create("f1", dir), f2 = Create("f2", dir), g = Create("g");
  auto addr = [&](uint64_t ino) -> uint64_t {
    auto v = store_->getxattr(ino, "user.region.vaddr");
    return v.ok() ? std::strtoull(v->c_str(), nullptr, 16) : 0;
  };
  EXPECT_EQ(addr(f1), FixVaddrOf(0));
  EXPECT_EQ(addr(f2), FixVaddrOf(1)) << "two regions share a fixed address";
  EXPECT_EQ(ErrnoOf(store_->getxattr(g, "user.region.vaddr").status()), ENODATA);
  EXPECT_EQ(ErrnoOf(store_->getxattr(dir, "user.region.vaddr").status()), ENODATA)
      << "a directory holds no address (it passes the attribute on)";
  EXPECT_EQ(ErrnoOf(store_->setxattr(g, "user.region.vaddr", "0x100000000000")), EPERM);
  ASSERT_TRUE(store_->setxattr(g, "user.region.fixvaddr", "1").ok());
  EXPECT_EQ(addr(g), FixVaddrOf(2));
  auto desc = store_->map_descriptor(g);
  ASSERT_TRUE(desc.ok());
  EXPECT_EQ(desc->vaddr, FixVaddrOf(2)) << "the map descriptor does not carry the address";
  ASSERT_TRUE(store_->setxattr(f1, "user.region.fixvaddr", "0").ok());
  EXPECT_EQ(ErrnoOf(store_->getxattr(f1, "user.region.vaddr").status()), ENODATA);
  uint64_t f3 = Create("f3", dir);
  EXPECT_EQ(addr(f3), FixVaddrOf(0)) << "a cleared region's slot was not given back";
  ASSERT_TRUE(store_->unlink(dir, "f2").ok());
  uint64_t f4 = Create("f4", dir);
  EXPECT_EQ(addr(f4), FixVaddrOf(1)) << "a deleted region's slot was not given back";
  store_.reset();
  auto again = env_.OpenStore();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  store_ = std::move(*again);
  EXPECT_EQ(addr(g), FixVaddrOf(2));
  EXPECT_EQ(addr(f3), FixVaddrOf(0));
  EXPECT_EQ(addr(f4), FixVaddrOf(1));
}

TEST_F(RegionStoreTest, NamespaceOperations) {
  Open();
  auto d = store_->mkdir(kRootIno, "dir", 0755, who_);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(ErrnoOf(store_->mkdir(kRootIno, "dir", 0755, who_).status()), EEXIST);
  uint64_t a = Create("a", d->ino);
  uint64_t b = Create("b", d->ino);
  ASSERT_TRUE(store_->write(a, 0, RandomBytes(10, 8)).ok());
  ASSERT_TRUE(store_->write(b, 0, RandomBytes(kChunkBytes * 2, 9)).ok());
  EXPECT_EQ(ErrnoOf(store_->rmdir(kRootIno, "dir")), ENOTEMPTY);
  // mv a over b: b's chunks go back, the name b now holds a's data.
  ASSERT_TRUE(store_->rename(d->ino, "a", d->ino, "b", false).ok());
  EXPECT_EQ(store_->stats().chunks_in_use, 1u);
  auto lb = store_->lookup(d->ino, "b");
  ASSERT_TRUE(lb.ok());
  EXPECT_EQ(lb->ino, a);
  EXPECT_EQ(ErrnoOf(store_->lookup(d->ino, "a").status()), ENOENT);
  auto sub = store_->mkdir(d->ino, "sub", 0700, who_);
  ASSERT_TRUE(sub.ok());
  EXPECT_EQ(ErrnoOf(store_->rename(kRootIno, "dir", sub->ino, "x", false)), EINVAL);
  auto ln = store_->symlink(d->ino, "ln", "../elsewhere", who_);
  ASSERT_TRUE(ln.ok());
  EXPECT_EQ(*store_->readlink(ln->ino), "../elsewhere");
  auto list = store_->readdir(d->ino);
  ASSERT_TRUE(list.ok());
  std::vector<std::string> names;
  for (auto& e : *list) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{".", "..", "b", "ln", "sub"}));
  EXPECT_EQ(store_->getattr(d->ino)->nlink, 3u);
  EXPECT_FALSE(store_->getattr(b).ok()) << "the replaced file still exists";
  EXPECT_EQ(ErrnoOf(store_->unlink(d->ino, "sub")), EISDIR);
  ASSERT_TRUE(store_->rmdir(d->ino, "sub").ok());
  EXPECT_EQ(ErrnoOf(store_->create(kRootIno, "a/b", 0644, who_).status()), EINVAL);
  EXPECT_EQ(ErrnoOf(store_->create(kRootIno, std::string(256, 'x'), 0644, who_).status()),
            ENAMETOOLONG);
  auto m = store_->setattr(a, SetAttrRequest{.mode = 0600, .uid = 7});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->mode, S_IFREG | 0600);
  EXPECT_EQ(m->uid, 7u);
}

TEST_F(RegionStoreTest, NamespaceAndDataReloadFromTheClusterStore) {
  Open(1, 16ull << 20, /*persistent=*/true);
  auto d = store_->mkdir(kRootIno, "d", 0755, who_);
  ASSERT_TRUE(d.ok());
  uint64_t f = Create("f", d->ino);
  auto data = RandomBytes(kChunkBytes + 99, 10);
  ASSERT_TRUE(store_->write(f, 3 * kChunkBytes, data).ok());
  store_.reset();
  auto again = env_.OpenStore();
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  store_ = std::move(*again);
  auto ld = store_->lookup(kRootIno, "d");
  ASSERT_TRUE(ld.ok());
  auto lf = store_->lookup(ld->ino, "f");
  ASSERT_TRUE(lf.ok());
  EXPECT_EQ(lf->size, 3 * kChunkBytes + data.size());
  EXPECT_EQ(Read(lf->ino, 3 * kChunkBytes, data.size()), data);
  EXPECT_EQ(store_->stats().chunks_in_use, 2u);
  // New inodes do not reuse old numbers.
  EXPECT_GT(Create("g"), lf->ino);
  // A store with session units refuses metadata that names units of an earlier one.
  store_.reset();
  env_.options.persistent_units = false;
  auto session = env_.OpenStore();
  ASSERT_FALSE(session.ok());
  EXPECT_EQ(session.status().code(), Code::kFailedPrecondition) << session.status().ToString();
  env_.options.persistent_units = true;
  // Hostile metadata: a store refuses to open on it, and says why.
  ASSERT_TRUE(env_.meta->put("inode/99", "garbage").ok());
  auto bad = env_.OpenStore();
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("inode/99"), std::string_view::npos);
  ASSERT_TRUE(env_.meta->remove("inode/99").ok());
  ASSERT_TRUE(env_.OpenStore().ok());
  // A directory cycle cut off from the root (d2 in d3, d3 in d2) and a second name for a file.
  auto put_dirent = [&](uint64_t parent, const std::string& name, uint64_t ino) {
    DirentRecord d{ino};
    return env_.meta->put("dirent/" + std::to_string(parent) + "/" + name,
                          std::string(reinterpret_cast<const char*>(&d), sizeof(d)));
  };
  ASSERT_TRUE(put_dirent(ld->ino, "again", lf->ino).ok());
  auto twice = env_.OpenStore();
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("more than one name"), std::string_view::npos);
  ASSERT_TRUE(env_.meta->remove("dirent/" + std::to_string(ld->ino) + "/again").ok());
  InodeRecord dir;
  dir.h.mode = S_IFDIR | 0755;
  dir.h.nlink = 2;
  for (uint64_t ino : {500u, 501u}) {
    dir.h.ino = ino;
    ASSERT_TRUE(env_.meta->put("inode/" + std::to_string(ino), EncodeInode(dir)).ok());
  }
  ASSERT_TRUE(put_dirent(500, "x", 501).ok());
  ASSERT_TRUE(put_dirent(501, "y", 500).ok());
  auto cycle = env_.OpenStore();
  ASSERT_FALSE(cycle.ok());
  EXPECT_NE(cycle.status().message().find("not reachable"), std::string_view::npos)
      << cycle.status().ToString();
}

TEST_F(RegionStoreTest, HostallocPicksTheServersARegionUses) {
  Open(3, 16ull << 20);
  const auto& addr = env_.options.servers;
  auto allocated = [&](size_t server) {
    auto j = nlohmann::json::parse(env_.servers[server]->stats_json());
    return j["memory"]["allocated_bytes"].get<uint64_t>();
  };
  auto d = store_->mkdir(kRootIno, "on2", 0755, who_);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*store_->getxattr(d->ino, "user.region.hostalloc"), "") << "default: all servers";
  EXPECT_EQ(ErrnoOf(store_->setxattr(d->ino, "user.region.hostalloc", "127.0.0.1:1")), EINVAL);
  EXPECT_EQ(ErrnoOf(store_->setxattr(d->ino, "user.region.hostalloc", addr[2] + ",")), EINVAL);
  ASSERT_TRUE(store_->setxattr(d->ino, "user.region.hostalloc", addr[2]).ok());
  // Inherited; a single-host region lives on the (first) listed server.
  uint64_t f = Create("f", d->ino);
  EXPECT_EQ(*store_->getxattr(f, "user.region.hostalloc"), addr[2]);
  auto data = RandomBytes(kStepBytes + 1, 16);
  ASSERT_TRUE(store_->write(f, 0, data).ok());
  EXPECT_EQ(Read(f, 0, data.size()), data);
  EXPECT_EQ(allocated(0), 0u) << "HOSTALLOC ignored: data on server 0";
  EXPECT_EQ(allocated(2), 2 * kStepBytes);
  EXPECT_EQ(ErrnoOf(store_->setxattr(f, "user.region.hostalloc", addr[1])), EBUSY);
  // MULTIHOSTED over two of the three, round-robin in the list's order.
  auto m = store_->mkdir(kRootIno, "pair", 0755, who_);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(store_->setxattr(m->ino, "user.region.multihosted", "1").ok());
  ASSERT_TRUE(store_->setxattr(m->ino, "user.region.hostalloc", addr[1] + "," + addr[0]).ok());
  uint64_t g = Create("g", m->ino);
  ASSERT_TRUE(store_->write(g, 0, RandomBytes(2 * kStepBytes, 17)).ok());
  EXPECT_EQ(allocated(0), kStepBytes);
  EXPECT_EQ(allocated(1), kStepBytes);
  EXPECT_EQ(allocated(2), 2 * kStepBytes) << "a region used a server not in its HOSTALLOC";
  // removexattr: back to all servers.
  ASSERT_TRUE(store_->removexattr(d->ino, "user.region.hostalloc").ok());
  EXPECT_EQ(*store_->getxattr(d->ino, "user.region.hostalloc"), "");
}

TEST_F(RegionStoreTest, MultihostedRegionsSpreadIn2MiBSteps) {
  Open(2, 16ull << 20);
  uint64_t f = Create("f", MkdirWith("multi", "user.region.multihosted"));
  auto data = RandomBytes(2 * kStepBytes, 11);
  ASSERT_TRUE(store_->write(f, 0, data).ok());
  EXPECT_EQ(Read(f, 0, data.size()), data);
  for (auto& s : env_.servers) {
    auto j = nlohmann::json::parse(s->stats_json());
    EXPECT_EQ(j["memory"]["allocated_bytes"].get<uint64_t>(), kStepBytes)
        << "each server holds one 2 MiB step";
  }
  // A plain region stays on the home server.
  uint64_t g = Create("g");
  ASSERT_TRUE(store_->write(g, 0, data).ok());
  auto home = nlohmann::json::parse(env_.servers[0]->stats_json());
  EXPECT_EQ(home["memory"]["allocated_bytes"].get<uint64_t>(), 3 * kStepBytes);
}

}  // namespace
}  // namespace farmem::regions
