// TeRM hotspot policy: from one period's per-unit access counts (summed over clients), the current
// residency and the DRAM budget, which units to promote and which to demote. A pure function of
// its input (no threads, no state), called by TierStore::RunPeriod on the caller's thread.
//
// Rules (paper + artifact, docs/tier.md "Hotspot policy"):
//   target   = floor(budget_units * fill_percent / 100), at least 1 when budget and fill are > 0:
//              the number of units that may be resident after the period.
//   max == 0 → nothing moves (no information this period).
//   uniform  = max <= 10 * average (average over all units): resident units rank first, so the
//              resident set is kept (no churn) and only free room is filled with the hottest.
//   skewed   = rank by count, highest first; ties keep resident units first, then lower index.
//   The top `target` units of the ranking are kept or promoted (a unit with count 0 is never
//   promoted); resident units outside it are demoted. Already-resident units are never promoted.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "farmem/status.h"

namespace farmem::tier {

struct TierPolicyInput {
  std::span<const uint64_t> counts;   // per unit, this period
  std::span<const uint8_t> resident;  // per unit, 1 = resident now (same size as counts)
  uint64_t budget_units = 0;          // frames of the DRAM budget
  uint32_t fill_percent = 85;         // 1..100
};

struct TierPolicyDecision {
  std::vector<uint32_t> demote;   // resident units to make cold, coldest first
  std::vector<uint32_t> promote;  // cold units to make resident, hottest first
  bool uniform = false;           // max <= 10 * average: the resident set was kept
  uint64_t target_units = 0;
};

class TierPolicy {
 public:
  // The uniformity threshold: access counts whose maximum is within this factor of the average
  // are "uniform" (artifact: 10).
  static constexpr uint64_t kUniformFactor = 10;

  // InvalidArgument when counts and resident differ in size, fill_percent is not in 1..100, or
  // there are more than 2^31 units.
  static Result<TierPolicyDecision> Decide(const TierPolicyInput& in);
  static uint64_t TargetUnits(uint64_t budget_units, uint32_t fill_percent);
};

}  // namespace farmem::tier
