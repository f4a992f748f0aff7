// RegionStore under concurrency: writer threads fill their own files with a per-file tag byte
// while others truncate, delete and re-create them, and readers check that every byte they get
// is either that file's tag or zero — never another region's bytes (a chunk freed while a read
// or write was in flight and handed to another file would show a foreign tag). Bounded by
// iteration counts, not time.
#include <gtest/gtest.h>

#include <atomic>
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

}  // namespace
}  // namespace farmem::regions
