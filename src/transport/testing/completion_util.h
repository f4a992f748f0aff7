// Helpers for tests that drive a farmem::Context: poll with a deadline (so a lost completion fails
// the test instead of hanging it), deterministic byte patterns, and aligned test buffers.
// Header-only: src/transport/testing/ is not part of any library.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "farmem/status.h"
#include "farmem/transport.h"

namespace farmem::testing {

// Polls `ctx` until `n` completions arrived or `limit` elapsed. On timeout the status says how
// many arrived; completions collected so far are lost (the test fails anyway).
inline Result<std::vector<Completion>> PollN(Context& ctx, size_t n,
                                             std::chrono::milliseconds limit) {
  std::vector<Completion> got;
  got.reserve(n);
  Completion batch[32];
  auto deadline = std::chrono::steady_clock::now() + limit;
  unsigned idle = 0;
  while (got.size() < n) {
    size_t k = ctx.poll(std::span<Completion>(batch, std::min<size_t>(32, n - got.size())));
    for (size_t i = 0; i < k; ++i) got.push_back(batch[i]);
    if (k > 0) {
      idle = 0;
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Status::TimedOut("got " + std::to_string(got.size()) + " of " + std::to_string(n) +
                              " completions before the deadline (" +
                              std::to_string(ctx.outstanding()) + " still outstanding)");
    }
    // poll() never blocks: back off a little so the progress thread gets the core on 2 vCPUs.
    if (++idle > 64) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      std::this_thread::yield();
    }
  }
  return got;
}

// Deterministic, seed-dependent bytes (xorshift), so misplaced or stale data is detected.
inline void FillPattern(std::span<std::byte> out, uint64_t seed) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 0x1234567ull;
  for (auto& b : out) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<std::byte>(x >> 24);
  }
}

inline std::vector<std::byte> Pattern(size_t len, uint64_t seed) {
  std::vector<std::byte> v(len);
  FillPattern(v, seed);
  return v;
}

// Page-aligned heap buffer (atomics need 8-byte aligned words; registration likes pages).
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t len) : len_(len) {
    size_t rounded = (len + 4095) / 4096 * 4096;
    data_.reset(static_cast<std::byte*>(std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded)));
    if (data_) std::memset(data_.get(), 0, rounded == 0 ? 4096 : rounded);
  }
  std::byte* data() const { return data_.get(); }
  size_t size() const { return len_; }
  std::span<std::byte> span() const { return {data_.get(), len_}; }
  std::span<std::byte> span(size_t off, size_t len) const { return {data_.get() + off, len}; }
  // The 8-byte word at `off`, accessed atomically: other threads (the transport's) may touch it.
  uint64_t load_word(size_t off) const {
    return __atomic_load_n(reinterpret_cast<uint64_t*>(data_.get() + off), __ATOMIC_SEQ_CST);
  }
  void store_word(size_t off, uint64_t v) const {
    __atomic_store_n(reinterpret_cast<uint64_t*>(data_.get() + off), v, __ATOMIC_SEQ_CST);
  }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte[], Free> data_;
  size_t len_ = 0;
};

}  // namespace farmem::testing
