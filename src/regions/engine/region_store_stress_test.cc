// RegionStore under concurrency: writer threads fill their own files with a per-file tag byte
// while others truncate, delete and re-create them, and readers check that every byte they get
// is either that file's tag or zero — never another region's bytes (a chunk freed while a read
// or write was in flight and handed to another file would show a foreign tag). Bounded by
// iteration counts, not time. And writes to one region that overlap in flight (disjoint and
// overlapping ranges from several threads) end equal to a model.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "regions/engine/region_store.h"
#include "regions/engine/region_store_test_util.h"

namespace farmem::regions {
namespace {

TEST(RegionStoreStress, ConcurrentWritersTruncatersAndReadersNeverSeeForeignBytes) {
  if (!testing::FaultName().empty())
    std::printf("[ fault    ] FARMEM_REGIONS_FAULT=%s\n", testing::FaultName().c_str());
  testing::RegionEnv env;
  ASSERT_TRUE(env.Start(1, 16ull << 20).ok());
  auto opened = env.OpenStore();
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  RegionStore& store = **opened;
  constexpr int kFiles = 4;
  constexpr int kRounds = 60;
  std::vector<uint64_t> inos(kFiles);
  Caller who{0, 0, 1};
  for (int i = 0; i < kFiles; ++i) {
    auto a = store.create(kRootIno, "f" + std::to_string(i), 0644, who);
    ASSERT_TRUE(a.ok());
    inos[i] = a->ino;
  }
  std::atomic<int> foreign{0}, errors{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kFiles; ++i) {
    // Writer + truncater of file i (its tag is i + 1).
    threads.emplace_back([&, i] {
      std::vector<std::byte> buf(3 * kChunkBytes / 2, static_cast<std::byte>(i + 1));
      for (int r = 0; r < kRounds; ++r) {
        uint64_t off = (static_cast<uint64_t>(r) * 77777) % (4 * kChunkBytes);
        Status s = store.write(inos[i], off, buf);
        if (!s.ok() && ErrnoOf(s) != ENOSPC) errors++;
        auto t = store.setattr(inos[i], SetAttrRequest{.size = off / 3});
        if (!t.ok()) errors++;
      }
    });
    // Reader of file i, with a handle open.
    threads.emplace_back([&, i] {
      auto h = store.open(inos[i], false);
      if (!h.ok()) {
        errors++;
        return;
      }
      std::vector<std::byte> out(6 * kChunkBytes);
      for (int r = 0; r < kRounds * 2; ++r) {
        auto n = store.read(inos[i], 0, out);
        if (!n.ok()) {
          errors++;
          continue;
        }
        for (size_t k = 0; k < *n; ++k) {
          if (out[k] != std::byte{0} && out[k] != static_cast<std::byte>(i + 1)) {
            foreign++;
            break;
          }
        }
      }
      (void)store.release(*h);
    });
  }
  // Churn: a fifth file repeatedly created, filled with its own tag, and deleted, so freed chunks
  // keep moving between regions.
  threads.emplace_back([&] {
    std::vector<std::byte> buf(2 * kChunkBytes, std::byte{0x77});
    for (int r = 0; r < kRounds; ++r) {
      auto a = store.create(kRootIno, "churn", 0644, who);
      if (!a.ok()) {
        errors++;
        continue;
      }
      (void)store.write(a->ino, 0, buf);
      if (!store.unlink(kRootIno, "churn").ok()) errors++;
    }
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(foreign.load(), 0) << "a reader saw another region's bytes";
  for (int i = 0; i < kFiles; ++i)
    ASSERT_TRUE(store.unlink(kRootIno, "f" + std::to_string(i)).ok());
  EXPECT_EQ(store.stats().chunks_in_use, 0u);
}

// Threads write disjoint slices of the same fresh (reused) chunks at once (each chunk is allocated
// by one of them, which zeroes the rest of it: the slices the others write must not be zeroed
// over), a
// reader meanwhile sees only the model's bytes or zeros, and then threads write one unaligned
// range spanning three chunks over and over with a byte of their own: that range must end up
// holding one write's byte throughout (overlapping writes one at a time), the rest untouched.
// FARMEM_REGIONS_FAULT=no_range_lock fails it; serial_writes passes.
TEST(RegionStoreStress, ConcurrentWritesToOneRegionMatchTheModel) {
  if (!testing::FaultName().empty())
    std::printf("[ fault    ] FARMEM_REGIONS_FAULT=%s\n", testing::FaultName().c_str());
  testing::RegionEnv env;
  ASSERT_TRUE(env.Start(1, 32ull << 20).ok());
  auto opened = env.OpenStore();
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  RegionStore& store = **opened;
  constexpr int kThreads = 4;
  constexpr uint64_t kChunks = 12;  // within the keeper unit's 15 used chunks
  constexpr uint64_t kSlice = kChunkBytes / kThreads;
  constexpr int kRounds = 20;
  Caller who{0, 0, 1};
  // A keeper file that filled a whole unit and was cut to one byte: the unit stays, and its other
  // 15 chunks were used, so the rounds' files get reused chunks, which their writes must zero
  // (never-used ones are zero from ALLOC_RAW and need no zeroing, so no race).
  auto keeper = store.create(kRootIno, "keeper", 0644, who);
  ASSERT_TRUE(keeper.ok());
  ASSERT_TRUE(store.write(keeper->ino, 0, std::vector<std::byte>(kStepBytes, std::byte{1})).ok());
  ASSERT_TRUE(store.setattr(keeper->ino, SetAttrRequest{.size = 1}).ok());
  int mismatched_rounds = 0;
  std::atomic<int> errors{0}, foreign{0};
  for (int r = 0; r < kRounds; ++r) {
    auto a = store.create(kRootIno, "model", 0644, who);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    const uint64_t ino = a->ino;
    const auto model = testing::RandomBytes(kChunks * kChunkBytes, 1000 + r);
    std::atomic<bool> go{false}, done{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();
        for (uint64_t c = 0; c < kChunks; ++c) {
          uint64_t off = c * kChunkBytes + static_cast<uint64_t>(t) * kSlice;
          Status s = store.write(ino, off, std::span(model).subspan(off, kSlice));
          if (!s.ok()) errors++;
        }
      });
    std::thread reader([&] {
      std::vector<std::byte> out(kChunks * kChunkBytes);
      while (!done.load()) {
        auto n = store.read(ino, 0, out);
        if (!n.ok()) {
          errors++;
          return;
        }
        for (size_t k = 0; k < *n; ++k)
          if (out[k] != std::byte{0} && out[k] != model[k]) {
            foreign++;
            break;
          }
      }
    });
    go = true;
    for (auto& t : threads) t.join();
    done = true;
    reader.join();
    if (testing::ReadBytes(store, ino, 0, model.size()) != model) ++mismatched_rounds;
    ASSERT_TRUE(store.unlink(kRootIno, "model").ok());
  }
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(foreign.load(), 0) << "a reader saw bytes that are neither the model's nor zero";
  EXPECT_EQ(mismatched_rounds, 0) << "rounds whose disjoint writes did not add up to the model";

  // Overlapping writes: [kFrom, kFrom + kLen) spans three chunks at unaligned ends.
  auto a = store.create(kRootIno, "overlap", 0644, who);
  ASSERT_TRUE(a.ok());
  const auto base = testing::RandomBytes(kChunks * kChunkBytes, 7);
  ASSERT_TRUE(store.write(a->ino, 0, base).ok());
  constexpr uint64_t kFrom = kChunkBytes / 2 + 100, kLen = 2 * kChunkBytes + 1000;
  constexpr int kWrites = 40;
  std::set<int> values;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    for (int w = 0; w < kWrites; ++w) values.insert(1 + t * kWrites + w);
    threads.emplace_back([&, t] {
      for (int w = 0; w < kWrites; ++w) {
        std::vector<std::byte> buf(kLen, static_cast<std::byte>(1 + t * kWrites + w));
        if (!store.write(a->ino, kFrom, buf).ok()) errors++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  auto got = testing::ReadBytes(store, a->ino, 0, base.size());
  ASSERT_EQ(got.size(), base.size());
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + kFrom, base.begin()));
  EXPECT_TRUE(std::equal(got.begin() + kFrom + kLen, got.end(), base.begin() + kFrom + kLen));
  const std::byte v = got[kFrom];
  size_t torn = static_cast<size_t>(std::count_if(got.begin() + kFrom, got.begin() + kFrom + kLen,
                                                  [&](std::byte b) { return b != v; }));
  EXPECT_EQ(torn, 0u) << "bytes of the overlapped range that are not the last write's";
  EXPECT_TRUE(values.contains(static_cast<int>(v)));
  ASSERT_TRUE(store.unlink(kRootIno, "overlap").ok());
  ASSERT_TRUE(store.unlink(kRootIno, "keeper").ok());
  EXPECT_EQ(store.stats().chunks_in_use, 0u);
}

}  // namespace
}  // namespace farmem::regions
