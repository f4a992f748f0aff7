// Tests for the CoRM slot layout: encode/decode at every cacheline alignment, the consistency
// check's five outcomes, re-lay when moving between alignments, and the word-atomic publish.

#include "objects/format/object_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

namespace farmem::corm {
namespace {

std::vector<uint8_t> RandomPayload(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> p(n);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  return p;
}

// 0x1000-aligned fake base: only the address arithmetic matters for encode/decode.
constexpr uint64_t kBase = 0x7f0000000000ull;

TEST(ObjectLayout, CapacityHoldsAtEveryAlignment) {
  for (size_t size = 16; size <= 4096; size += 8) {
    for (uint64_t a = 0; a < 64; a += 8) {
      const size_t versions = LineVersionBytes(kBase + a, size);
      ASSERT_LE(versions, MaxLineVersionBytes(size)) << size << " @" << a;
      ASSERT_GE(size - kHeaderBytes - versions - 1, PayloadCapacity(size)) << size << " @" << a;
    }
  }
}

TEST(ObjectLayout, EncodeDecodeRoundTripAtEveryAlignment) {
  for (size_t size : {16, 64, 72, 136, 200, 1024, 4096}) {
    const auto payload = RandomPayload(PayloadCapacity(size), static_cast<uint32_t>(size));
    for (uint64_t a = 0; a < 64; a += 8) {
      const uint64_t addr = kBase + a;
      std::vector<uint8_t> image(size);
      Header h{0x1234, false, false, true, 77, 9};
      EncodeSlot(image, addr, h, payload);
      // Every line start inside the slot and the last byte carry the version.
      for (size_t i = 8; i < size; ++i) {
        if ((addr + i) % 64 == 0 || i == size - 1) {
          ASSERT_EQ(image[i], 77) << size << " @" << a << " byte " << i;
        }
      }
      std::vector<uint8_t> out(payload.size());
      ASSERT_EQ(DecodePayload(image, addr, out), payload.size());
      ASSERT_EQ(out, payload) << size << " @" << a;
      EXPECT_EQ(CheckSlot(image, addr, 0x1234, 0xFFFF, 0), SlotCheck::kOk);
    }
  }
}

// DecodePayload copies runs between version bytes; compare it with a byte-by-byte decode for
// every slot size up to 1 KiB, every alignment and output lengths from empty to past capacity.
TEST(ObjectLayout, DecodeMatchesBytewiseDecodeForEveryLength) {
  for (size_t size = 16; size <= 1024; size += 8) {
    const size_t cap = PayloadCapacity(size);
    for (uint64_t a = 0; a < 64; a += 8) {
      const uint64_t addr = kBase + a;
      const auto image = RandomPayload(size, static_cast<uint32_t>(size * 64 + a));
      std::vector<uint8_t> expected;
      for (size_t i = kHeaderBytes; i < size && expected.size() < cap; ++i) {
        if (!IsVersionByte(addr, size, i)) expected.push_back(image[i]);
      }
      ASSERT_EQ(expected.size(), cap) << size << " @" << a;
      for (size_t len : {size_t{0}, size_t{1}, size_t{7}, cap / 2, cap - std::min(cap, size_t{1}),
                         cap, cap + 5}) {
        std::vector<uint8_t> out(len, 0xEE);
        const size_t n = std::min(len, cap);
        ASSERT_EQ(DecodePayload(image, addr, out), n) << size << " @" << a << " len " << len;
        ASSERT_TRUE(
            std::equal(out.begin(), out.begin() + static_cast<ptrdiff_t>(n), expected.begin()))
            << size << " @" << a << " len " << len;
        // Bytes past the payload are left alone.
        for (size_t k = n; k < len; ++k) ASSERT_EQ(out[k], 0xEE) << size << " @" << a;
      }
    }
  }
}

TEST(ObjectLayout, VersionPositionsDependOnAlignment) {
  const size_t size = 136;
  std::vector<uint8_t> a(size), b(size);
  const auto payload = RandomPayload(PayloadCapacity(size), 1);
  EncodeSlot(a, kBase + 0, Header{1, false, false, true, 5, 0}, payload);
  EncodeSlot(b, kBase + 8, Header{1, false, false, true, 5, 0}, payload);
  EXPECT_NE(a, b);  // same payload, different byte positions
}

TEST(ObjectLayout, CheckDetectsEachState) {
  const size_t size = 200;
  const uint64_t addr = kBase + 40;  // line starts at +24, +88, +152
  const auto payload = RandomPayload(PayloadCapacity(size), 2);
  std::vector<uint8_t> image(size);
  Header h{0x0ABC, false, false, true, 3, 1};
  EncodeSlot(image, addr, h, payload);
  ASSERT_EQ(CheckSlot(image, addr, 0x0ABC, 0x0FFF, 0), SlotCheck::kOk);
  EXPECT_EQ(CheckSlot(image, addr, 0x0ABD, 0x0FFF, 0), SlotCheck::kMoved);
  EXPECT_EQ(CheckSlot(image, addr, 0x0ABD, 0, 0), SlotCheck::kOk);  // offset-only: IDs ignored

  for (size_t line : {24u, 88u, 152u}) {
    auto torn = image;
    torn[line] = 4;
    EXPECT_EQ(CheckSlot(torn, addr, 0x0ABC, 0x0FFF, 0), SlotCheck::kTorn) << line;
  }
  auto torn_tail = image;
  torn_tail[size - 1] = 2;
  EXPECT_EQ(CheckSlot(torn_tail, addr, 0x0ABC, 0x0FFF, 0), SlotCheck::kTorn);

  for (bool compaction : {false, true}) {
    auto locked = image;
    Header lh = h;
    (compaction ? lh.compacting : lh.locked) = true;
    const uint64_t w = lh.Pack();
    std::memcpy(locked.data(), &w, 8);
    EXPECT_EQ(CheckSlot(locked, addr, 0x0ABC, 0x0FFF, 0), SlotCheck::kLocked);
  }
  auto freed = image;
  Header fh = h;
  fh.allocated = false;
  const uint64_t w = fh.Pack();
  std::memcpy(freed.data(), &w, 8);
  EXPECT_EQ(CheckSlot(freed, addr, 0x0ABC, 0x0FFF, 0), SlotCheck::kFreed);
}

// Moving a slot to an offset with a different alignment mod 64 must re-lay the version bytes;
// the payload survives every (from, to) pair and the check passes at the destination.
TEST(ObjectLayout, ReLayBetweenEveryAlignment) {
  for (size_t size : {16, 56, 64, 72, 120, 136, 248, 520, 4096}) {
    const auto payload = RandomPayload(PayloadCapacity(size), static_cast<uint32_t>(size * 7));
    for (uint64_t from = 0; from < 64; from += 8) {
      std::vector<uint8_t> src(size);
      const Header h{0x77, false, true, true, 200, 3};
      EncodeSlot(src, kBase + from, h, payload);
      for (uint64_t to = 0; to < 64; to += 8) {
        const uint64_t dst_addr = kBase + 0x1000 + to;
        std::vector<uint8_t> dst(size);
        ReLaySlot(src, kBase + from, dst, dst_addr);
        std::vector<uint8_t> out(payload.size());
        DecodePayload(dst, dst_addr, out);
        ASSERT_EQ(out, payload) << "size " << size << " from " << from << " to " << to;
        // Header copied verbatim (compaction bit included); clear it to run the check.
        Header dh = h;
        dh.compacting = false;
        const uint64_t w = dh.Pack();
        std::memcpy(dst.data(), &w, 8);
        ASSERT_EQ(CheckSlot(dst, dst_addr, 0x77, 0xFF, 0), SlotCheck::kOk)
            << "size " << size << " from " << from << " to " << to;
        // And it equals a fresh encode at the destination.
        std::vector<uint8_t> fresh(size);
        EncodeSlot(fresh, dst_addr, dh, payload);
        ASSERT_EQ(dst, fresh);
      }
    }
  }
}

TEST(ObjectLayout, PublishSlotWritesTheImage) {
  alignas(64) uint64_t mem[64] = {};
  auto* base = reinterpret_cast<uint8_t*>(mem);
  for (uint64_t a = 0; a < 64; a += 8) {
    const size_t size = 136;
    std::vector<uint8_t> image(size);
    const auto payload = RandomPayload(PayloadCapacity(size), static_cast<uint32_t>(a));
    EncodeSlot(image, reinterpret_cast<uint64_t>(base + a), Header{9, false, false, true, 1, 0},
               payload);
    PublishSlot(base + a, image);
    std::vector<uint8_t> copy(size);
    ReadSlotWords(base + a, copy.data(), size);
    EXPECT_EQ(copy, image);
    EXPECT_EQ(CheckSlot(copy, reinterpret_cast<uint64_t>(base + a), 9, 0xFFFF, 0), SlotCheck::kOk);
  }
}

}  // namespace
}  // namespace farmem::corm
