// AddressCache (address_cache.h): find/put/erase against a std::map model with tags chosen to
// collide (long probe runs, wrap-around, backward-shift deletion, growth), and a multi-thread
// stress whose invariant is that a find only ever returns an offset put for that tag.
#include "tx/client/address_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <thread>
#include <vector>

namespace farmem::tx {
namespace {

std::vector<std::byte> Key(uint64_t v) {
  std::vector<std::byte> k(8);
  std::memcpy(k.data(), &v, 8);
  return k;
}

TEST(AddressCache, PutFindEraseByKey) {
  AddressCache c;
  EXPECT_FALSE(c.find(1, Key(7)).has_value());
  c.put(1, Key(7), 4096);
  c.put(2, Key(7), 8192);  // the same key in another table is another entry
  EXPECT_EQ(c.find(1, Key(7)), 4096u);
  EXPECT_EQ(c.find(2, Key(7)), 8192u);
  c.put(1, Key(7), 12288);  // replaced
  EXPECT_EQ(c.find(1, Key(7)), 12288u);
  EXPECT_EQ(c.size(), 2u);
  c.erase(1, Key(7));
  EXPECT_FALSE(c.find(1, Key(7)).has_value());
  EXPECT_EQ(c.find(2, Key(7)), 8192u);
  c.erase(1, Key(7));  // erasing what is not there is a no-op
  EXPECT_EQ(c.size(), 1u);
  EXPECT_NE(AddressCache::Tag(0, {}), 0u);
}

// Tags that all fall in one shard and in a few home slots, so runs are long, wrap around the
// end of the table and interleave; random puts, replaces and erases are checked against a map
// after every step. Removing the backward shift from erase_tag makes later finds miss entries.
TEST(AddressCache, MatchesAMapUnderCollidingTags) {
  for (uint64_t seed = 1; seed <= 10; seed++) {
    AddressCache c;
    std::map<uint64_t, uint64_t> model;
    std::mt19937_64 rng(seed);
    std::vector<uint64_t> tags;
    for (uint64_t i = 0; i < 400; i++) {
      // shard 5; home slot one of 8 values near the top of the first table's 64 slots (wrap)
      const uint64_t home = 60 + (i % 8);
      tags.push_back((uint64_t{5} << 58) | (i << 12) | home);
    }
    for (int step = 0; step < 4000; step++) {
      const uint64_t tag = tags[rng() % (step < 2000 ? 60 : tags.size())];
      const int op = static_cast<int>(rng() % 3);
      if (op == 0) {
        const uint64_t off = rng();
        c.put_tag(tag, off);
        model[tag] = off;
      } else if (op == 1) {
        c.erase_tag(tag);
        model.erase(tag);
      }
      for (uint64_t t : tags) {
        auto got = c.find_tag(t);
        auto it = model.find(t);
        if (it == model.end()) {
          ASSERT_FALSE(got.has_value()) << "seed " << seed << " step " << step;
        } else {
          ASSERT_TRUE(got.has_value()) << "seed " << seed << " step " << step;
          ASSERT_EQ(*got, it->second) << "seed " << seed << " step " << step;
        }
      }
      ASSERT_EQ(c.size(), model.size());
    }
  }
}

TEST(AddressCache, HoldsManyKeys) {
  AddressCache c;
  constexpr uint64_t kKeys = 200000;
  for (uint64_t k = 0; k < kKeys; k++) c.put(3, Key(k), k * 64);
  EXPECT_EQ(c.size(), kKeys);
  for (uint64_t k = 0; k < kKeys; k++) ASSERT_EQ(c.find(3, Key(k)), k * 64) << k;
  for (uint64_t k = 0; k < kKeys; k += 2) c.erase(3, Key(k));
  EXPECT_EQ(c.size(), kKeys / 2);
  for (uint64_t k = 0; k < kKeys; k++) {
    if (k % 2 == 0) {
      ASSERT_FALSE(c.find(3, Key(k)).has_value()) << k;
    } else {
      ASSERT_EQ(c.find(3, Key(k)), k * 64) << k;
    }
  }
}

// Threads put, replace, erase and find overlapping keys at once (growth included). Each key's
// offsets encode the key, so a find that returns another key's offset, a torn value or a value
// never put is caught.
TEST(AddressCache, ConcurrentThreadsNeverSeeAnotherKeysOffset) {
  AddressCache c;
  constexpr uint64_t kKeys = 5000;
  constexpr int kThreads = 4;
  std::atomic<uint64_t> bad{0}, hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t + 1);
      for (int i = 0; i < 200000; i++) {
        const uint64_t k = rng() % kKeys;
        const auto key = Key(k);
        switch (rng() % 4) {
          case 0:
          case 1:
            c.put(9, key, (k << 20) | (rng() % 1000));
            break;
          case 2:
            c.erase(9, key);
            break;
          default:
            if (auto got = c.find(9, key)) {
              hits++;
              if ((*got >> 20) != k || (*got & 0xfffff) >= 1000) bad++;
            }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(hits.load(), 0u);
  size_t present = 0;
  for (uint64_t k = 0; k < kKeys; k++) present += c.find(9, Key(k)).has_value();
  EXPECT_EQ(c.size(), present);
}

}  // namespace
}  // namespace farmem::tx
