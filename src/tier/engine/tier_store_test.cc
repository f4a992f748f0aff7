// Tests of TierStore on a real file: round trips of unaligned reads and writes across units under a
// budget of a few units, cold reads from the file, what the mapped range and the bitmap show, the
// exact budget, write-back, the grace hook's place in a demotion, punched frames under a pinned
// reader, refused options and bad input. Mostly single-threaded (the grace tests use one helper).
#include "tier/engine/tier_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/copy_epoch.h"
#include "tier/engine/tier_test_util.h"

namespace farmem::tier {
namespace {

using testing::CachedPages;
using testing::DirectCopy;
using testing::MustRead;
using testing::RandomBytes;
using testing::SmallOptions;
using testing::TempDir;

constexpr uint64_t kUnit = 16 * 1024;

bool AllPattern(const uint8_t* p, size_t n, uint64_t pattern) {
  for (size_t i = 0; i < n; i += 8) {
    if (LoadWord(p + i) != pattern) return false;
  }
  return true;
}

class TierStoreRoundTrip : public ::testing::TestWithParam<bool> {};

TEST_P(TierStoreRoundTrip, RandomUnalignedReadsAndWritesAcrossUnits) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const uint64_t units = 16, budget = 3;
  TierOptions o = SmallOptions(dir.File("tier"), units, budget);
  o.direct_io = GetParam();
  std::vector<uint8_t> model(units * kUnit, 0);
  std::mt19937_64 rng(42);
  {
    auto s = TierStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    TierStore& t = **s;
    for (int it = 0; it < 600; ++it) {
      const int op = static_cast<int>(rng() % 10);
      const uint64_t off = rng() % model.size();
      const size_t len =
          1 + static_cast<size_t>(rng() % std::min<uint64_t>(3 * kUnit, model.size() - off));
      if (op < 4) {
        auto data = RandomBytes(rng, len);
        ASSERT_TRUE(t.Write(off, data).ok());
        std::memcpy(model.data() + off, data.data(), len);
      } else if (op < 7) {
        auto got = MustRead(t, off, len);
        ASSERT_EQ(0, std::memcmp(got.data(), model.data() + off, len))
            << "read at " << off << "+" << len;
      } else if (op == 7) {
        Status st = t.Promote(static_cast<uint32_t>(rng() % units));
        ASSERT_TRUE(st.ok() || st.code() == Code::kResourceExhausted) << st.ToString();
      } else if (op == 8) {
        ASSERT_TRUE(t.Demote(static_cast<uint32_t>(rng() % units)).ok());
      } else {
        std::vector<uint64_t> counts(units);
        for (auto& c : counts) c = rng() % 4 == 0 ? rng() % 1000 : 0;
        auto rep = t.RunPeriod(counts);
        ASSERT_TRUE(rep.ok());
        ASSERT_TRUE(rep->error.ok()) << rep->error.ToString();
      }
      const TierStats st = t.Stats();
      ASSERT_LE(st.resident_units + st.quarantined_frames, budget);
      uint64_t resident = 0;
      for (uint8_t r : t.Residency()) resident += r;
      ASSERT_LE(resident, budget);
    }
    auto all = MustRead(t, 0, model.size());
    ASSERT_EQ(all, model);
    const TierStats st = t.Stats();
    EXPECT_GT(st.promotions, 0u);
    EXPECT_GT(st.demotions, 0u);
    EXPECT_GT(st.writebacks, 0u);
    EXPECT_GT(st.reads_dram, 0u);
    EXPECT_GT(st.reads_file, 0u);
    // Demote everything: the file alone must hold the data.
    for (uint32_t u = 0; u < units; ++u) ASSERT_TRUE(t.Demote(u).ok());
    ASSERT_EQ(MustRead(t, 0, model.size()), model);
    for (uint32_t u = 0; u < 3; ++u) ASSERT_TRUE(t.Promote(u).ok());
    auto last = RandomBytes(rng, 100);
    std::memcpy(model.data() + 5, last.data(), last.size());
    ASSERT_TRUE(t.Write(5, last).ok());  // unit 0 resident and dirty at close
  }
  // Closing writes back dirty units: a new store on the same file reads the same bytes.
  auto s = TierStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(MustRead(**s, 0, model.size()), model);
  if (o.direct_io) {
    // O_DIRECT keeps the backing file out of the page cache (<= 1 % of its pages cached).
    const int64_t cached = CachedPages(o.path, model.size());
    ASSERT_GE(cached, 0);
    EXPECT_LE(cached * 100, int64_t(model.size() / kPageSize))
        << cached << " of " << model.size() / kPageSize << " pages cached";
  }
}

INSTANTIATE_TEST_SUITE_P(DirectAndBuffered, TierStoreRoundTrip, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "ODirect" : "Buffered";
                         });

TEST(TierStore, ColdReadsReturnFileData) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.File("tier");
  std::mt19937_64 rng(7);
  auto data = RandomBytes(rng, 4 * kUnit);
  {
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
    close(fd);
  }
  auto s = TierStore::Open(SmallOptions(path, 4, 1));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  EXPECT_EQ(MustRead(t, 0, data.size()), data);
  auto part = MustRead(t, kUnit - 3, 7);
  EXPECT_EQ(0, std::memcmp(part.data(), data.data() + kUnit - 3, 7));
  const TierStats st = t.Stats();
  EXPECT_EQ(st.reads_dram, 0u);
  EXPECT_EQ(st.reads_file, 6u);  // 4 units, then 2 unit parts
  EXPECT_EQ(st.resident_units, 0u);
  // Promoted, the same bytes come from DRAM.
  ASSERT_TRUE(t.Promote(2).ok());
  EXPECT_EQ(MustRead(t, 0, data.size()), data);
  EXPECT_EQ(t.Stats().reads_dram, 1u);
}

TEST(TierStore, MappedRangeShowsPatternWhenColdAndDataWhenResident) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto s = TierStore::Open(SmallOptions(dir.File("tier"), 4, 2));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  const uint64_t magic = t.magic_word();
  ASSERT_TRUE(IsValidMagic(magic));
  std::mt19937_64 rng(9);
  auto data = RandomBytes(rng, 4 * kUnit);
  ASSERT_TRUE(t.Write(0, data).ok());  // cold: to the file
  EXPECT_TRUE(AllPattern(t.base(), 4 * kUnit, magic));
  ASSERT_TRUE(t.Promote(1).ok());
  std::vector<uint8_t> copy(4 * kUnit);
  DirectCopy(t.base(), 0, copy);
  EXPECT_TRUE(AllPattern(copy.data(), kUnit, magic));
  EXPECT_EQ(0, std::memcmp(copy.data() + kUnit, data.data() + kUnit, kUnit));
  EXPECT_TRUE(AllPattern(copy.data() + 2 * kUnit, 2 * kUnit, magic));
  // Bitmap: pages 4..7 (unit 1) resident.
  const uint64_t bits = __atomic_load_n(&t.bitmap()[0], __ATOMIC_SEQ_CST);
  EXPECT_EQ(bits, 0xF0u);
  // The client's path: detect missing pages, fetch only those.
  auto missing = FindMissingPages(0, copy, magic);
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ((*missing)[0], 0xFF0Fu);
  const uint64_t file_reads = t.Stats().reads_file;
  ASSERT_TRUE(t.ReadPages(0, copy, *missing).ok());
  EXPECT_EQ(copy, data);
  EXPECT_EQ(t.Stats().reads_dram, 0u) << "resident pages were not asked for";
  EXPECT_GT(t.Stats().reads_file, file_reads);
  // Demoted: the pattern again, bits clear.
  ASSERT_TRUE(t.Demote(1).ok());
  DirectCopy(t.base(), 0, copy);
  EXPECT_TRUE(AllPattern(copy.data(), copy.size(), magic));
  EXPECT_EQ(__atomic_load_n(&t.bitmap()[0], __ATOMIC_SEQ_CST), 0u);
  EXPECT_EQ(MustRead(t, 0, data.size()), data);
}

// A one-sided copy paused across a remap: the first half of a page is copied from the frame,
// the unit is demoted (or promoted), the second half is copied. The pattern words in the copy mark
// the page missing, and the sparse fetch returns the right bytes.
TEST(TierStore, CopyPausedAcrossARemapIsDetectedAndRefetched) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto s = TierStore::Open(SmallOptions(dir.File("tier"), 2, 1));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  std::mt19937_64 rng(11);
  auto data = RandomBytes(rng, 2 * kPageSize);
  ASSERT_TRUE(t.Write(0, data).ok());
  for (bool demote : {true, false}) {
    SCOPED_TRACE(demote ? "demotion" : "promotion");
    if (demote) {
      ASSERT_TRUE(t.Promote(0).ok());
    } else {
      ASSERT_TRUE(t.Demote(0).ok());
    }
    std::vector<uint8_t> copy(2 * kPageSize);
    const size_t half = kPageSize + kPageSize / 2;  // page 0 whole, page 1 half
    DirectCopy(t.base(), 0, std::span<uint8_t>(copy.data(), half));
    ASSERT_TRUE((demote ? t.Demote(0) : t.Promote(0)).ok());
    DirectCopy(t.base(), half, std::span<uint8_t>(copy.data() + half, copy.size() - half));
    auto missing = FindMissingPages(0, copy, t.magic_word());
    ASSERT_TRUE(missing.ok());
    EXPECT_EQ((*missing)[0], demote ? 0b10u : 0b11u);
    ASSERT_TRUE(t.ReadPages(0, copy, *missing).ok());
    EXPECT_EQ(copy, data);
  }
}

TEST(TierStore, DataEqualToThePatternZerosAndFfReadBackExactly) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto s = TierStore::Open(SmallOptions(dir.File("tier"), 2, 2));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  const uint64_t magic = t.magic_word();
  std::vector<uint8_t> data(kUnit, 0x5c);
  for (size_t i = 0; i < kPageSize; i += 8) std::memcpy(data.data() + i, &magic, 8);
  std::memset(data.data() + kPageSize, 0, kPageSize);
  std::memset(data.data() + 2 * kPageSize, 0xff, kPageSize);
  ASSERT_TRUE(t.Write(0, data).ok());
  ASSERT_TRUE(t.Promote(0).ok());
  std::vector<uint8_t> copy(kUnit);
  DirectCopy(t.base(), 0, copy);
  auto missing = FindMissingPages(0, copy, magic);
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ((*missing)[0], 0b0001u) << "only the page holding the pattern is a (false) miss";
  ASSERT_TRUE(t.ReadPages(0, copy, *missing).ok());
  EXPECT_EQ(copy, data);
  // Cold, the same bytes come from the file.
  ASSERT_TRUE(t.Demote(0).ok());
  EXPECT_EQ(MustRead(t, 0, kUnit), data);
}

TEST(TierStore, BudgetIsExact) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto s = TierStore::Open(SmallOptions(dir.File("tier"), 32, 2));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  EXPECT_EQ(t.budget_units(), 2u);
  ASSERT_TRUE(t.Promote(0).ok());
  ASSERT_TRUE(t.Promote(0).ok());  // already resident: no second frame
  ASSERT_TRUE(t.Promote(5).ok());
  EXPECT_EQ(t.Promote(6).code(), Code::kResourceExhausted);
  EXPECT_EQ(t.Stats().resident_units, 2u);
  EXPECT_EQ(t.Stats().free_frames, 0u);
  ASSERT_TRUE(t.Demote(0).ok());
  ASSERT_TRUE(t.Demote(0).ok());  // already cold
  ASSERT_TRUE(t.Promote(6).ok());
  EXPECT_EQ(t.Stats().resident_units, 2u);
  // The period fills to the budget and never beyond.
  // (Skewed: with at most 10 units any counts are "uniform", max <= sum <= 10 x average.)
  std::vector<uint64_t> counts(32, 0);
  counts[1] = 900;
  counts[2] = 800;
  auto rep = t.RunPeriod(counts);
  ASSERT_TRUE(rep.ok());
  EXPECT_TRUE(rep->error.ok()) << rep->error.ToString();
  EXPECT_FALSE(rep->uniform);
  EXPECT_EQ(rep->demoted, (std::vector<uint32_t>{6, 5}));
  EXPECT_EQ(rep->promoted, (std::vector<uint32_t>{1, 2}));
  std::vector<uint8_t> want(32, 0);
  want[1] = want[2] = 1;
  EXPECT_EQ(t.Residency(), want);
  // A budget above the capacity gives one frame per unit.
  auto big = TierStore::Open(SmallOptions(dir.File("big"), 2, 10));
  ASSERT_TRUE(big.ok());
  EXPECT_EQ((*big)->budget_units(), 2u);
}

TEST(TierStore, DemotionWritesBackOnlyDirtyUnits) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.File("tier");
  auto s = TierStore::Open(SmallOptions(path, 2, 1));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  ASSERT_TRUE(t.Promote(0).ok());
  ASSERT_TRUE(t.Demote(0).ok());
  EXPECT_EQ(t.Stats().writebacks, 0u);
  ASSERT_TRUE(t.Promote(0).ok());
  const char msg[] = "written while resident";
  ASSERT_TRUE(
      t.Write(100, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(msg), sizeof(msg)))
          .ok());
  EXPECT_EQ(t.Stats().writes_dram, 1u);
  ASSERT_TRUE(t.Demote(0).ok());
  EXPECT_EQ(t.Stats().writebacks, 1u);
  // The file itself has it (read around the store).
  const int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char buf[sizeof(msg)] = {};
  ASSERT_EQ(pread(fd, buf, sizeof(buf), 100), static_cast<ssize_t>(sizeof(buf)));
  close(fd);
  EXPECT_STREQ(buf, msg);
}

// I2: the grace hook runs after the unit shows the pattern and its bits are clear, and before the
// frame can be reused (with a budget of one frame, a promotion from inside the hook finds none).
TEST(TierStore, GraceHookRunsAfterTheRemapAndBeforeTheFrameIsReused) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TierOptions o = SmallOptions(dir.File("tier"), 4, 1);
  TierStore* store = nullptr;
  int calls = 0;
  std::vector<std::string> problems;
  o.grace = [&]() -> Status {
    ++calls;
    if (!AllPattern(store->base(), kUnit, store->magic_word())) {
      problems.push_back("unit 0 not yet mapped to the pattern");
    }
    if (__atomic_load_n(&store->bitmap()[0], __ATOMIC_SEQ_CST) != 0) {
      problems.push_back("bits still set");
    }
    if (store->IsResident(0)) problems.push_back("unit 0 still resident");
    Status p = store->Promote(1);
    if (p.code() != Code::kResourceExhausted) {
      problems.push_back("frame reusable inside the grace period: " + p.ToString());
    }
    return Status::OK();
  };
  auto s = TierStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  store = s->get();
  ASSERT_TRUE(store->Promote(0).ok());
  ASSERT_TRUE(store->Demote(0).ok());
  EXPECT_EQ(calls, 1) << "demotion must call the grace hook";
  EXPECT_TRUE(problems.empty()) << problems.front();
  ASSERT_TRUE(store->Promote(1).ok()) << "the frame is free once the demotion returned";
  ASSERT_TRUE(store->Demote(3).ok());  // cold already: no grace period needed
  EXPECT_EQ(calls, 1);
}

TEST(TierStore, FailedGracePeriodKeepsTheFrameOutOfUse) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TierOptions o = SmallOptions(dir.File("tier"), 4, 1);
  bool fail = true;
  o.grace = [&]() -> Status {
    return fail ? Status::TimedOut("a copy is still running") : Status::OK();
  };
  auto s = TierStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  const uint8_t v[3] = {1, 2, 3};
  ASSERT_TRUE(t.Promote(0).ok());
  ASSERT_TRUE(t.Write(10, v).ok());
  Status st = t.Demote(0);
  EXPECT_EQ(st.code(), Code::kTimedOut) << st.ToString();
  EXPECT_FALSE(t.IsResident(0));
  EXPECT_EQ(MustRead(t, 10, 3), std::vector<uint8_t>(v, v + 3)) << "cold and written back";
  EXPECT_EQ(t.Stats().quarantined_frames, 1u);
  EXPECT_EQ(t.Promote(1).code(), Code::kResourceExhausted) << "quarantined frame reused";
  EXPECT_EQ(t.Stats().grace_failures, 2u);
  fail = false;
  ASSERT_TRUE(t.Promote(1).ok()) << "a passing grace period frees the quarantined frame";
  EXPECT_EQ(t.Stats().quarantined_frames, 0u);
}

// A transport that pins pages (CMA, GUP) keeps the physical pages it pinned, so a frame must be
// punched before another unit is read into it. vmsplice pins the pages of unit 0 into a pipe
// (like a copy that pinned them and copies later); unit 0 is demoted and unit 1 promoted into the
// same (only) frame; the pipe must still give unit 0's bytes, never unit 1's.
TEST(TierStore, PinnedPagesOfADemotedFrameNeverShowTheNextUnit) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto s = TierStore::Open(SmallOptions(dir.File("tier"), 2, 1));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  std::vector<uint8_t> a(kUnit, 'A'), b(kUnit, 'B');
  ASSERT_TRUE(t.Write(0, a).ok());
  ASSERT_TRUE(t.Write(kUnit, b).ok());
  ASSERT_TRUE(t.Promote(0).ok());
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  iovec iov{const_cast<uint8_t*>(t.base()), kPageSize};
  ASSERT_EQ(vmsplice(p[1], &iov, 1, 0), static_cast<ssize_t>(kPageSize));
  ASSERT_TRUE(t.Demote(0).ok());
  ASSERT_TRUE(t.Promote(1).ok());
  std::vector<uint8_t> got(kPageSize);
  ASSERT_EQ(read(p[0], got.data(), got.size()), static_cast<ssize_t>(kPageSize));
  close(p[0]);
  close(p[1]);
  EXPECT_EQ(got, std::vector<uint8_t>(kPageSize, 'A')) << "a pinned page showed another unit";
}

// A copy that started before the remap (here: pages pinned into a pipe, read 100 ms later, inside
// a CopyEpoch like the NIC thread's) is waited for: the demotion returns only after it ended, and
// the copy gets unit 0's bytes although unit 1 is promoted into the same frame right after.
TEST(TierStore, DemotionWaitsForACopyThatStartedBeforeTheRemap) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  TierOptions o = SmallOptions(dir.File("tier"), 2, 1);
  CopyEpoch epoch;
  o.grace = [&]() -> Status {
    const CopyEpoch* epochs[] = {&epoch};
    if (!WaitForCopies(epochs, std::chrono::steady_clock::now() + std::chrono::seconds(5))) {
      return Status::TimedOut("copy still running");
    }
    return Status::OK();
  };
  auto s = TierStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  ASSERT_TRUE(t.Write(0, std::vector<uint8_t>(kUnit, 'A')).ok());
  ASSERT_TRUE(t.Write(kUnit, std::vector<uint8_t>(kUnit, 'B')).ok());
  ASSERT_TRUE(t.Promote(0).ok());
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  std::atomic<bool> started{false}, done{false};
  std::vector<uint8_t> got(kPageSize);
  std::thread copier([&] {
    CopyEpoch::Scope copy(epoch);
    iovec iov{const_cast<uint8_t*>(t.base()), kPageSize};
    if (vmsplice(p[1], &iov, 1, 0) != static_cast<ssize_t>(kPageSize)) return;
    started.store(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (read(p[0], got.data(), got.size()) != static_cast<ssize_t>(kPageSize)) return;
    done.store(true);
  });
  while (!started.load()) std::this_thread::yield();
  ASSERT_TRUE(t.Demote(0).ok());
  EXPECT_TRUE(done.load()) << "the demotion returned while a copy that started before the remap "
                              "was still running";
  ASSERT_TRUE(t.Promote(1).ok());
  copier.join();
  close(p[0]);
  close(p[1]);
  EXPECT_EQ(got, std::vector<uint8_t>(kPageSize, 'A'));
}

TEST(TierStore, RefusesTmpfsBacking) {
  struct statfs st;
  if (statfs("/dev/shm", &st) != 0 || static_cast<unsigned long>(st.f_type) != 0x01021994) {
    GTEST_SKIP() << "/dev/shm is not tmpfs here";
  }
  const std::string path = "/dev/shm/farmem-tier-test-" + std::to_string(getpid());
  auto s = TierStore::Open(SmallOptions(path, 2, 1));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("tmpfs"), std::string_view::npos) << s.status().ToString();
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "nothing created on tmpfs";
}

TEST(TierStore, RefusesBadOptions) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.File("tier");
  auto code = [](TierOptions o) { return TierStore::Open(o).status().code(); };
  TierOptions o = SmallOptions(path, 4, 2);
  TierOptions x = o;
  x.unit_size = 3 * kPageSize;
  EXPECT_EQ(code(x), Code::kInvalidArgument);
  x = o;
  x.capacity = o.capacity + kPageSize;
  EXPECT_EQ(code(x), Code::kInvalidArgument);
  x = o;
  x.dram_budget = 0;
  EXPECT_EQ(code(x), Code::kInvalidArgument);
  x = o;
  x.dram_budget = kUnit + 1;
  EXPECT_EQ(code(x), Code::kInvalidArgument);
  x = o;
  x.fill_percent = 0;
  EXPECT_EQ(code(x), Code::kInvalidArgument);
  x = o;
  x.fill_percent = 101;
  EXPECT_EQ(code(x), Code::kInvalidArgument);
  x = o;
  x.magic_word = ~uint64_t{0};
  EXPECT_EQ(code(x), Code::kInvalidArgument);
  x = o;
  x.path = "";
  EXPECT_EQ(code(x), Code::kInvalidArgument);
  x = o;
  x.path = dir.File("no/such/dir/tier");
  EXPECT_NE(code(x), Code::kOk);
  // More units than the kernel lets one process map: refused before anything is created.
  x = o;
  x.unit_size = kPageSize;
  x.capacity = uint64_t{1} << 40;
  x.path = dir.File("huge");
  auto huge = TierStore::Open(x);
  EXPECT_EQ(huge.status().code(), Code::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("max_map_count"), std::string_view::npos)
      << huge.status().ToString();
  EXPECT_NE(access(x.path.c_str(), F_OK), 0);
}

TEST(TierStore, RefusesBadRanges) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto s = TierStore::Open(SmallOptions(dir.File("tier"), 4, 2));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  TierStore& t = **s;
  const uint64_t cap = t.geometry().capacity;
  std::vector<uint8_t> buf(16);
  EXPECT_EQ(t.Read(0, std::span<uint8_t>()).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.Write(0, std::span<const uint8_t>()).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.Read(cap, buf).code(), Code::kOutOfRange);
  EXPECT_EQ(t.Read(cap - 8, buf).code(), Code::kOutOfRange);
  EXPECT_EQ(t.Write(cap - 8, buf).code(), Code::kOutOfRange);
  EXPECT_EQ(t.Read(~uint64_t{0} - 4, buf).code(), Code::kOutOfRange);
  EXPECT_EQ(t.Write(~uint64_t{0} - 4, buf).code(), Code::kOutOfRange);
  EXPECT_EQ(t.Promote(4).code(), Code::kOutOfRange);
  EXPECT_EQ(t.Demote(~uint32_t{0}).code(), Code::kOutOfRange);
  std::vector<uint64_t> mask = {0b11};  // [4090, 4106) spans 2 pages
  EXPECT_TRUE(t.ReadPages(4090, buf, mask).ok());
  std::vector<uint64_t> past = {0b111};
  EXPECT_EQ(t.ReadPages(4090, buf, past).code(), Code::kInvalidArgument);
  EXPECT_EQ(t.ReadPages(4090, buf, {}).code(), Code::kInvalidArgument);
  std::vector<uint64_t> counts(3);
  EXPECT_EQ(t.RunPeriod(counts).status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(t.IsResident(99));
}

}  // namespace
}  // namespace farmem::tier
