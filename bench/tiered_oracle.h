// The oracle hit ratio of `farmem bench tiered`: the share of accesses that fall into the
// `target_units` hottest units when the hottest units are known exactly (what a perfect hotspot
// policy reaches). Pure and header-only (unit-tested in src/cli); any thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "zipf.h"

namespace farmem::bench {

// Items [0, items) of `item_size` bytes laid out from offset 0; key = RankScrambler(items)(rank)
// as KeyChooser draws them. zipf == nullptr: uniform. Returns a value in [0, 1].
inline double OracleHitRatio(uint64_t items, uint64_t item_size, uint64_t unit_size,
                             uint64_t target_units, const ZipfGenerator* zipf) {
  if (items == 0 || item_size == 0 || unit_size == 0) return 0;
  const uint64_t units = (items * item_size + unit_size - 1) / unit_size;
  if (target_units >= units) return 1;
  std::vector<double> mass(units, 0.0);
  const RankScrambler scramble(items);
  for (uint64_t rank = 0; rank < items; ++rank) {
    const double p = zipf ? zipf->Probability(rank) : 1.0 / static_cast<double>(items);
    mass[scramble(rank) * item_size / unit_size] += p;
  }
  std::nth_element(mass.begin(), mass.begin() + static_cast<std::ptrdiff_t>(target_units),
                   mass.end(), std::greater<>());
  double hit = 0;
  for (uint64_t u = 0; u < target_units; ++u) hit += mass[u];
  return std::clamp(hit, 0.0, 1.0);
}

}  // namespace farmem::bench
