// Helpers of the tx engine tests: 8-byte keys and values from integers, a manual lease clock, and
// a one-sided reader that copies an item or a bucket out of a TxTable's region the way the native
// TCP NIC thread does (ordered word copy). Used by the test threads only.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tx/engine/tx_table.h"
#include "tx/format/tx_layout.h"

namespace farmem::tx::testing {

inline std::vector<std::byte> K(uint64_t k) {
  std::vector<std::byte> b(8);
  std::memcpy(b.data(), &k, 8);
  return b;
}

// A value of `size` bytes whose every word is `fill`.
inline std::vector<std::byte> V(uint64_t fill, size_t size) {
  std::vector<std::byte> b(size);
  for (size_t i = 0; i + 8 <= size; i += 8) std::memcpy(b.data() + i, &fill, 8);
  return b;
}

inline uint64_t Word(std::span<const std::byte> b, size_t i) {
  uint64_t w;
  std::memcpy(&w, b.data() + i * 8, 8);
  return w;
}

// A lease clock the test moves by hand.
struct ManualClock {
  std::atomic<uint64_t> ns{1'000'000'000};
  std::function<uint64_t()> fn() {
    return [this] { return ns.load(std::memory_order_relaxed); };
  }
};

// One-sided copy of the item at `offset` (ordered, word by word, like the TCP NIC thread).
inline std::vector<std::byte> CopyItem(const TxTable& t, uint64_t offset) {
  std::vector<std::byte> out(ItemBytes(t.geometry()));
  OrderedCopy(t.region() + offset, out.data(), out.size());
  return out;
}

inline std::vector<std::byte> CopyBucket(const TxTable& t, uint64_t bucket) {
  std::vector<std::byte> out(BucketBytes(t.geometry()));
  OrderedCopy(t.region() + BucketOffset(t.geometry(), bucket), out.data(), out.size());
  return out;
}

}  // namespace farmem::tx::testing
