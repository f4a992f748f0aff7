// Tests for the NIC thread's READ and WRITE copies (ordered_copy.h): exact bytes for every
// alignment and size, which path is taken, and that the word paths load (store) in ascending
// order against a live writer (reader). FARMEM_TRANSPORT_FAULT=write_descending makes the write
// order test fail.
#include "transport/tcp/ordered_copy.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

namespace farmem::tcpwire {
namespace {

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// Copies Pattern bytes of every size between every pair of offsets with `copy` (CopyForRead or
// CopyForWrite) and checks the bytes, that nothing outside the copy was written, and which path
// was taken: the word path exactly when `word_side(src_off, dst_off)` is 8-aligned and so is the
// size.
template <typename Copy, typename WordSide>
void CheckEveryAlignmentAndSize(Copy copy, WordSide word_side, std::initializer_list<size_t> srcs,
                                std::initializer_list<size_t> dsts, uint32_t seed) {
  // 8-aligned backing store; src/dst offsets move the pointers off alignment.
  std::vector<uint64_t> src_words(1024 + 16);
  std::vector<uint64_t> dst_words(1024 + 16);
  auto* src_base = reinterpret_cast<uint8_t*>(src_words.data());
  auto* dst_base = reinterpret_cast<uint8_t*>(dst_words.data());
  const size_t sizes[] = {0, 1, 7, 8, 9, 15, 16, 24, 31, 32, 40, 56, 64, 72, 100, 4096, 4104, 8000};
  for (size_t size : sizes) {
    for (size_t src_off : srcs) {
      for (size_t dst_off : dsts) {
        SCOPED_TRACE("size " + std::to_string(size) + " src+" + std::to_string(src_off) + " dst+" +
                     std::to_string(dst_off));
        const auto data = Pattern(size, seed++);
        const size_t dst_bytes = dst_words.size() * 8;
        std::memset(dst_base, 0xcd, dst_bytes);
        if (size != 0) std::memcpy(src_base + src_off, data.data(), size);
        const bool words = copy(dst_base + dst_off, src_base + src_off, size);
        EXPECT_EQ(words, word_side(src_off, dst_off) % 8 == 0 && size % 8 == 0);
        if (size != 0) {
          ASSERT_EQ(std::memcmp(dst_base + dst_off, data.data(), size), 0);
        }
        for (size_t i = 0; i < dst_bytes; ++i) {
          if (i >= dst_off && i < dst_off + size) continue;
          ASSERT_EQ(dst_base[i], 0xcd) << "byte " << i << " outside the copy was written";
        }
      }
    }
  }
}

TEST(OrderedCopy, CopiesEveryAlignmentAndSize) {
  // A READ takes the word path when its source (the registered memory) is aligned.
  CheckEveryAlignmentAndSize([](void* d, const void* s, size_t n) { return CopyForRead(d, s, n); },
                             [](size_t src, size_t) { return src; }, {0, 1, 4, 7, 8, 16},
                             {0, 1, 3, 8}, 1);
}

// A writer publishes round k by storing k into every word from the LAST to the first, each with
// release order (as a CoRM writer stores the tail before the header). A copy in ascending order
// with acquire loads that sees round k in word i has synchronised with the writer's store to word
// i, so every later (higher) word, stored before it, holds at least k: the copied words are
// non-decreasing. A copy that loads some higher words before lower ones breaks this whenever the
// writer passes between the two loads. 64 KiB copies make that likely enough to be seen (tried:
// a descending or high-half-first copy was caught in every trial run, ~15 times per 20000).
// Sanitized builds copy ~10x slower (ASan at -O0 took 21 s for the full count): they stop at a
// tenth of the overlapping copies, still thousands of races with the writer.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr size_t kOverlapsWanted = 2000;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
constexpr size_t kOverlapsWanted = 2000;
#else
constexpr size_t kOverlapsWanted = 20000;
#endif
#else
constexpr size_t kOverlapsWanted = 20000;
#endif

TEST(OrderedCopy, WordPathLoadsInAscendingOrder) {
  constexpr size_t kWords = 8192;
  static uint64_t shared[kWords];
  for (auto& w : shared) std::atomic_ref<uint64_t>(w).store(0, std::memory_order_relaxed);
  std::atomic<bool> stop{false};
  std::atomic<bool> started{false};
  std::thread writer([&] {
    for (uint64_t k = 1; !stop.load(std::memory_order_relaxed); ++k) {
      for (size_t i = kWords; i-- > 0;) {
        std::atomic_ref<uint64_t>(shared[i]).store(k, std::memory_order_release);
      }
      started.store(true, std::memory_order_relaxed);
    }
  });
  while (!started.load()) std::this_thread::yield();
  std::vector<uint64_t> copy(kWords);
  size_t torn = 0, overlapped = 0;
  // Bounded by iterations, not time; stops early once enough copies raced with the writer.
  for (int iter = 0; iter < 200000 && overlapped < kOverlapsWanted && torn == 0; ++iter) {
    if (!CopyForRead(copy.data(), shared, kWords * 8)) {
      ADD_FAILURE() << "an aligned copy did not take the word path";
      break;
    }
    for (size_t i = 1; i < kWords; ++i) {
      if (copy[i] < copy[i - 1]) ++torn;
    }
    if (copy[0] != copy[kWords - 1]) ++overlapped;
  }
  stop.store(true);
  writer.join();
  EXPECT_EQ(torn, 0u) << "a later word was older than an earlier one: not an ascending copy";
  // Not asserted (scheduling decides it), but shown so a run that never overlapped is visible.
  std::cout << "copies that overlapped a writer round: " << overlapped << "\n";
}

TEST(OrderedCopy, WriteCopiesEveryAlignmentAndSize) {
  // A WRITE takes the word path when its destination (the registered memory) is aligned.
  CheckEveryAlignmentAndSize([](void* d, const void* s, size_t n) { return CopyForWrite(d, s, n); },
                             [](size_t, size_t dst) { return dst; }, {0, 1, 4, 8}, {0, 1, 3, 8, 16},
                             7);
}

// The mirror of the read test: CopyForWrite places round k (every word k) over and over while a
// reader acquire-loads the words from the LAST to the first. A word seen at round k was stored
// after every lower word of that round (ascending release stores), so every lower word loaded
// later holds at least k: the loaded words never increase towards the start. A copy that stores
// a higher word before a lower one breaks this whenever the reader passes between the two
// stores (FARMEM_TRANSPORT_FAULT=write_descending stores them from the last to the first).
TEST(OrderedCopy, WritePathStoresInAscendingOrder) {
  const char* fault = std::getenv("FARMEM_TRANSPORT_FAULT");
  const bool descending = fault != nullptr && std::string(fault) == "write_descending";
  g_write_descending.store(descending);
  constexpr size_t kWords = 8192;
  static uint64_t shared[kWords];
  for (auto& w : shared) std::atomic_ref<uint64_t>(w).store(0, std::memory_order_relaxed);
  std::atomic<bool> stop{false};
  std::atomic<bool> started{false};
  std::thread writer([&] {
    std::vector<uint64_t> round(kWords);
    for (uint64_t k = 1; !stop.load(std::memory_order_relaxed); ++k) {
      std::fill(round.begin(), round.end(), k);
      CopyForWrite(shared, round.data(), kWords * 8);
      started.store(true, std::memory_order_relaxed);
    }
  });
  while (!started.load()) std::this_thread::yield();
  std::vector<uint64_t> seen(kWords);
  size_t torn = 0, overlapped = 0;
  for (int iter = 0; iter < 200000 && overlapped < kOverlapsWanted && torn == 0; ++iter) {
    for (size_t i = kWords; i-- > 0;) {
      seen[i] = std::atomic_ref<uint64_t>(shared[i]).load(std::memory_order_acquire);
    }
    for (size_t i = 1; i < kWords; ++i) {
      if (seen[i - 1] < seen[i]) ++torn;
    }
    if (seen[0] != seen[kWords - 1]) ++overlapped;
  }
  stop.store(true);
  writer.join();
  g_write_descending.store(false);
  EXPECT_EQ(torn, 0u) << "a lower word was older than a higher one seen first: not an ascending "
                         "placement";
  std::cout << "reads that overlapped a write: " << overlapped << ", out of order: " << torn
            << "\n";
}

}  // namespace
}  // namespace farmem::tcpwire
