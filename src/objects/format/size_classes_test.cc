// Tests for CoRM size classes: the rounding-waste bound for every payload size, alignment,
// geometry and argument errors.

#include "objects/format/size_classes.h"

#include <gtest/gtest.h>

#include "objects/format/object_layout.h"

namespace farmem::corm {
namespace {

TEST(SizeClasses, WasteBoundForEverySize) {
  // About a million sizes: plain checks in the loop, gtest only for the first failure (its
  // assertion macros cost more than the check itself; under ASan at -O0 they took 9 s).
  for (size_t bs : {size_t{4096}, size_t{65536}, size_t{1} << 20}) {
    auto sc = SizeClasses::Create(bs);
    ASSERT_TRUE(sc.ok()) << sc.status().ToString();
    double worst = 0;
    for (size_t p = 1; p <= sc->max_payload(); ++p) {
      auto c = sc->ClassFor(p);
      if (!c.ok()) FAIL() << "no class for payload " << p << ": " << c.status().ToString();
      const SizeClass& k = sc->at(*c);
      const size_t need = NeededSlotSize(p);
      const bool smallest = *c == 0 || sc->at(*c - 1).payload_capacity < p;
      if (k.payload_capacity < p || !smallest || k.slot_size < need) {
        FAIL() << "payload " << p << ": class " << *c << " capacity " << k.payload_capacity
               << " slot " << k.slot_size << " (needs " << need << ")"
               << (smallest ? "" : ", not the smallest class");
      }
      const double waste = double(k.slot_size - need) / double(k.slot_size);
      if (waste > kMaxRoundingWaste) FAIL() << "payload " << p << " slot " << k.slot_size;
      worst = std::max(worst, waste);
    }
    EXPECT_LT(worst, 1.0 / 9 + 1e-9) << bs;
  }
}

TEST(SizeClasses, GeometryIsConsistent) {
  auto sc = SizeClasses::Create(4096);
  ASSERT_TRUE(sc.ok());
  EXPECT_EQ(sc->at(0).slot_size, kMinSlotSize);
  EXPECT_EQ(sc->all().back().slot_size, 4096u);
  for (const SizeClass& k : sc->all()) {
    EXPECT_EQ(k.slot_size % 8, 0u);
    EXPECT_EQ(k.payload_capacity, PayloadCapacity(k.slot_size));
    EXPECT_EQ(k.slots_per_block, 4096 / k.slot_size);
    EXPECT_GE(k.slots_per_block, 1u);
  }
}

// Rule 1 of the block geometry: the classes with few slots per block tile the block, so every
// block of them leaves less than one 8-byte step per slot unused.
TEST(SizeClasses, LargeClassesTileTheBlock) {
  for (size_t bs : {size_t{4096}, size_t{32768}, size_t{1} << 20}) {
    auto sc = SizeClasses::Create(bs);
    ASSERT_TRUE(sc.ok()) << sc.status().ToString();
    for (uint32_t n = 1; n <= kTilingSlots; ++n) {
      const size_t slot = bs / n / kSlotAlign * kSlotAlign;
      auto c = sc->ClassFor(PayloadCapacity(slot));
      ASSERT_TRUE(c.ok());
      EXPECT_EQ(sc->at(*c).slot_size, slot) << "block " << bs << " n " << n;
      EXPECT_EQ(sc->at(*c).slots_per_block, n);
      EXPECT_GT(BlockFill(*sc, *c), 1.0 - double(kSlotAlign) * n / double(bs)) << bs << " " << n;
    }
  }
}

// Rule 2: the recommended block of a large object is filled to kMinBlockFill by its class and
// is the smallest such power of two; small objects keep the minimum block.
TEST(SizeClasses, RecommendedBlockSizeFillsTheBlock) {
  EXPECT_EQ(RecommendedBlockSize(64, 4096).value(), 4096u);
  EXPECT_EQ(RecommendedBlockSize(64, 65536).value(), 65536u);
  for (size_t payload : {size_t{1024}, size_t{2048}, size_t{3000}, size_t{4096}, size_t{8000}}) {
    auto bs = RecommendedBlockSize(payload, 4096);
    ASSERT_TRUE(bs.ok()) << payload;
    auto sc = SizeClasses::Create(*bs);
    ASSERT_TRUE(sc.ok());
    auto c = sc->ClassFor(payload);
    ASSERT_TRUE(c.ok());
    EXPECT_GE(BlockFill(*sc, *c), kMinBlockFill) << payload << " in " << *bs;
    // (8000 B fills an 8 KiB block's one tiling slot: a whole block, nothing wasted.)
    if (payload <= 4096) {
      EXPECT_GE(sc->at(*c).slots_per_block, 2u) << payload;
    }
    if (*bs > 4096) {  // the next smaller block is not filled well enough (or does not fit)
      auto smaller = SizeClasses::Create(*bs / 2);
      ASSERT_TRUE(smaller.ok());
      auto sc2 = smaller->ClassFor(payload);
      if (sc2.ok()) {
        EXPECT_LT(BlockFill(*smaller, *sc2), kMinBlockFill) << payload;
      }
    }
  }
  // Today's worst cases: 2 KiB objects no longer get one slot per 4 KiB block, nor 4 KiB
  // objects one per 8 KiB block.
  EXPECT_GT(RecommendedBlockSize(2048, 4096).value(), 4096u);
  EXPECT_GT(RecommendedBlockSize(4096, 4096).value(), 8192u);
  // Past kMaxGeometryBlock the smallest block that holds the object at all.
  EXPECT_EQ(RecommendedBlockSize(160 * 1024, 4096).value(), 256u * 1024);
  EXPECT_EQ(RecommendedBlockSize(0, 4096).status().code(), Code::kOutOfRange);
  EXPECT_EQ(RecommendedBlockSize(2u << 20, 4096).status().code(), Code::kOutOfRange);
  EXPECT_EQ(RecommendedBlockSize(64, 5000).status().code(), Code::kInvalidArgument);
}

TEST(SizeClasses, Errors) {
  EXPECT_EQ(SizeClasses::Create(2048).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(SizeClasses::Create(6000).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(SizeClasses::Create(size_t{2} << 20).status().code(), Code::kInvalidArgument);
  auto sc = SizeClasses::Create(4096);
  ASSERT_TRUE(sc.ok());
  EXPECT_EQ(sc->ClassFor(0).status().code(), Code::kOutOfRange);
  EXPECT_EQ(sc->ClassFor(sc->max_payload() + 1).status().code(), Code::kOutOfRange);
}

}  // namespace
}  // namespace farmem::corm
