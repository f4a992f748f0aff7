// Short transfers of the tier store's file IO: with TierStoreFaults::short_io (SIMULATED: every
// io-ring operation of two pages or more is submitted for half its length, so the kernel really
// moves fewer bytes and the completion says so) every read, sparse read, cold write, promotion and
// write-back must still move every byte, or fail; a file cut short under the store is an error,
// never zeros. FARMEM_TIER_FAULT=accept_short takes a short completion as the whole operation
// and the round-trip test fails. Single-threaded.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "tier/engine/tier_store.h"
#include "tier/engine/tier_test_util.h"

namespace farmem::tier {
namespace {

using testing::RandomBytes;
using testing::SmallOptions;
using testing::TempDir;

constexpr uint64_t kShortIoUnit = 16 * 1024;

// Param: O_DIRECT or buffered file IO. Open() makes a store of `units` units under a budget of
// `budget` in a fresh directory, with the FARMEM_TIER_FAULT faults and `short_io`.
class TierShortIo : public ::testing::TestWithParam<bool> {
 protected:
  void Open(uint64_t units, uint64_t budget, bool short_io) {
    ASSERT_TRUE(dir_.ok());
    o_ = SmallOptions(dir_.File("tier"), units, budget);
    o_.direct_io = GetParam();
    o_.faults = testing::TierFaultsFromEnv();
    o_.faults.short_io = short_io;
    auto opened = TierStore::Open(o_);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store_ = std::move(*opened);
  }
  TempDir dir_;
  TierOptions o_;
  std::unique_ptr<TierStore> store_;
};

TEST_P(TierShortIo, ShortTransfersAreContinuedAndNoStaleByteIsReturned) {
  const uint64_t units = 8;
  ASSERT_NO_FATAL_FAILURE(Open(units, 2, true));
  TierStore& t = *store_;
  std::vector<uint8_t> model(units * kShortIoUnit, 0);
  std::mt19937_64 rng(7);
  const auto check = [&](uint64_t off, const std::vector<uint8_t>& got,
                         const char* what) -> ::testing::AssertionResult {
    if (std::memcmp(got.data(), model.data() + off, got.size()) == 0) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << what << " at " << off << "+" << got.size()
           << " returned bytes that were never written there (a short transfer not continued?)";
  };
  for (int it = 0; it < 150; ++it) {
    const int op = static_cast<int>(rng() % 10);
    const uint64_t off = rng() % model.size();
    const size_t len =
        1 + static_cast<size_t>(rng() % std::min<uint64_t>(2 * kShortIoUnit, model.size() - off));
    if (op < 4) {
      auto data = RandomBytes(rng, len);
      Status st = t.Write(off, data);
      ASSERT_TRUE(st.ok()) << st.ToString();
      std::memcpy(model.data() + off, data.data(), len);
    } else if (op < 6) {
      std::vector<uint8_t> got(len, 0xEE);
      Status st = t.Read(off, got);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_TRUE(check(off, got, "Read"));
    } else if (op == 6) {
      // Sparse read of every page: the path TIER_READ takes.
      std::vector<uint8_t> got(len, 0xEE);
      std::vector<uint64_t> mask((PagesSpanned(off, len) + 63) / 64, ~uint64_t{0});
      const uint64_t pages = PagesSpanned(off, len);
      if (pages % 64 != 0) mask.back() = (uint64_t{1} << (pages % 64)) - 1;
      Status st = t.ReadPages(off, got, mask);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_TRUE(check(off, got, "ReadPages"));
    } else if (op < 9) {
      // Promotions read a whole unit, demotions of dirty units write one back.
      const auto u = static_cast<uint32_t>(rng() % units);
      Status st = op == 7 ? t.Promote(u) : t.Demote(u);
      ASSERT_TRUE(st.ok() || st.code() == Code::kResourceExhausted) << st.ToString();
    } else {
      Status st = t.Sync();
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
  }
  // Everything through the file once more: demote all, read cold, promote two, read again.
  for (uint32_t u = 0; u < units; ++u) ASSERT_TRUE(t.Demote(u).ok());
  std::vector<uint8_t> all(model.size(), 0xEE);
  ASSERT_TRUE(t.Read(0, all).ok());
  ASSERT_TRUE(check(0, all, "cold Read of the whole region"));
  ASSERT_TRUE(t.Promote(0).ok());
  ASSERT_TRUE(t.Promote(units - 1).ok());
  std::fill(all.begin(), all.end(), 0xEE);
  ASSERT_TRUE(t.Read(0, all).ok());
  ASSERT_TRUE(check(0, all, "Read of the whole region after promotions"));
  const TierStats s = t.Stats();
  // The simulation took effect: without short completions this test would prove nothing.
  EXPECT_GT(s.io_short_completions, 50u);
  EXPECT_GT(s.promotions, 0u);
  EXPECT_GT(s.writebacks, 0u);
  EXPECT_GT(s.writes_file, 0u);
  EXPECT_GT(s.reads_file, 0u);
}

TEST_P(TierShortIo, AFileCutUnderTheStoreIsAnErrorNotZeros) {
  ASSERT_NO_FATAL_FAILURE(Open(4, 1, false));
  TierStore& t = *store_;
  std::mt19937_64 rng(8);
  const auto data = RandomBytes(rng, kShortIoUnit);
  ASSERT_TRUE(t.Write(3 * kShortIoUnit, data).ok());  // cold: straight to the file
  // Someone cuts the backing file to two units behind the store's back.
  const int fd = ::open(o_.path.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(2 * kShortIoUnit)), 0);
  ::close(fd);
  std::vector<uint8_t> got(kShortIoUnit, 0xEE);
  const Status st = t.Read(3 * kShortIoUnit, got);
  EXPECT_EQ(st.code(), Code::kIoError) << "a cold read past the cut end of the file returned "
                                       << st.ToString() << " (zeros as data?)";
  EXPECT_NE(st.ToString().find("end of the file"), std::string::npos) << st.ToString();
  const Status promote = t.Promote(3);
  EXPECT_EQ(promote.code(), Code::kIoError) << promote.ToString();
  EXPECT_FALSE(t.IsResident(3));
}

INSTANTIATE_TEST_SUITE_P(DirectIo, TierShortIo, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("direct") : std::string("buffered");
                         });

}  // namespace
}  // namespace farmem::tier
