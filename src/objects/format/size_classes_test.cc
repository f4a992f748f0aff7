// Tests for CoRM size classes: the rounding-waste bound for every payload size, alignment,
// geometry and argument errors.

#include "objects/format/size_classes.h"

#include <gtest/gtest.h>

#include "objects/format/object_layout.h"

namespace farmem::corm {
namespace {

TEST(SizeClasses, WasteBoundForEverySize) {
  for (size_t bs : {size_t{4096}, size_t{65536}, size_t{1} << 20}) {
    auto sc = SizeClasses::Create(bs);
    ASSERT_TRUE(sc.ok()) << sc.status().ToString();
    double worst = 0;
    for (size_t p = 1; p <= sc->max_payload(); ++p) {
      auto c = sc->ClassFor(p);
      ASSERT_TRUE(c.ok()) << p;
      const SizeClass& k = sc->at(*c);
      ASSERT_GE(k.payload_capacity, p);
      if (*c > 0) {
        ASSERT_LT(sc->at(*c - 1).payload_capacity, p) << "not the smallest class";
      }
      const size_t need = NeededSlotSize(p);
      ASSERT_GE(k.slot_size, need);
      const double waste = double(k.slot_size - need) / double(k.slot_size);
      ASSERT_LE(waste, kMaxRoundingWaste) << "payload " << p << " slot " << k.slot_size;
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
