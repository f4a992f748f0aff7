// Tests for the pure parts of `farmem bench tiered`: the oracle hit ratio (bench/tiered_oracle.h)
// and the data words every file and write of the benchmark holds (bench/tiered_baseline.h).
#include "tiered_oracle.h"

#include <gtest/gtest.h>

#include "tiered_baseline.h"
#include "zipf.h"

namespace farmem::bench {
namespace {

TEST(TieredOracle, UniformAccessHitsTheShareOfUnitsHeld) {
  // 4096 items of 4 KiB in 16 KiB units: 1024 units, every one with mass 1/1024.
  EXPECT_NEAR(OracleHitRatio(4096, 4096, 16384, 256, nullptr), 0.25, 1e-9);
  EXPECT_NEAR(OracleHitRatio(4096, 4096, 16384, 0, nullptr), 0.0, 1e-12);
  EXPECT_DOUBLE_EQ(OracleHitRatio(4096, 4096, 16384, 1024, nullptr), 1.0);
  EXPECT_DOUBLE_EQ(OracleHitRatio(4096, 4096, 16384, 5000, nullptr), 1.0);
}

TEST(TieredOracle, ZipfConcentratesAccessesInFewUnits) {
  const ZipfGenerator z(1 << 16, 0.99);
  const double quarter = OracleHitRatio(1 << 16, 4096, 65536, 1024, &z);  // 1024 of 4096 units
  EXPECT_GT(quarter, 0.5);
  EXPECT_LT(quarter, 1.0);
  // More units held never hit less, and a single item per unit is the finest case.
  EXPECT_GE(OracleHitRatio(1 << 16, 4096, 65536, 2048, &z), quarter);
  EXPECT_GE(OracleHitRatio(1 << 16, 4096, 4096, 16384, &z), quarter);
  // The hottest unit holds at least the hottest item.
  EXPECT_GE(OracleHitRatio(1 << 16, 4096, 65536, 1, &z), z.Probability(0));
}

TEST(TieredOracle, EmptyInputIsZero) {
  EXPECT_EQ(OracleHitRatio(0, 4096, 65536, 1, nullptr), 0.0);
  EXPECT_EQ(OracleHitRatio(16, 0, 65536, 1, nullptr), 0.0);
}

TEST(TieredData, WordsDifferAtEveryAlignedOffset) {
  // The benchmark checks the first and last word of every read against DataWord(offset): a read
  // of the wrong offset (or a stale copy of a neighbour) must not match.
  for (uint64_t off = 0; off < (1u << 20); off += 8)
    ASSERT_NE(DataWord(off), DataWord(off + 8)) << off;
  EXPECT_NE(DataWord(0), DataWord(4096));
}

}  // namespace
}  // namespace farmem::bench
