// TeRM hotspot policy: from per-unit access heat (TierHeat: counts summed over clients, decayed
// across periods), the current residency and the DRAM budget, which units to promote and which to
// demote. TierPolicy::Decide is a pure function (no threads, no state); TierHeat is the state
// between periods, owned by TierStore and updated by its one period caller.
//
// Rules (paper + artifact, plus decay and hysteresis; docs/tier.md "Hotspot policy"):
//   heat     = heat * keep_percent / 100 + this period's count * kOne (TierHeat, fixed point).
//              keep 0 = the count of one period only (the artifact's rule, which churns: a
//              stable Zipf hot set has many units of nearly equal count at the cut, and sampling
//              noise reorders them).
//   target   = floor(budget_units * fill_percent / 100), at least 1 when budget and fill are > 0:
//              the number of units that may be resident after the period; every unit when the
//              budget holds them all (no reason to leave room then).
//   max == 0 → nothing moves (no information).
//   uniform  = max <= 10 * average (average over all units): resident units rank first, so the
//              resident set is kept (no churn) and only free room is filled with the hottest.
//   skewed   = rank by score, highest first: score = heat for cold units, heat * (100 +
//              hysteresis_percent) / 100 + hysteresis_heat for resident ones (resident 1; a
//              unit resident only because the free-room fill brought it in and not counted
//              since, resident 2, has no bonus: any counted cold unit outranks it), so a cold unit
//              displaces a resident one only when it is that much hotter (the relative bar for
//              busy units, the absolute one for units whose counts are a few accesses a period,
//              where Poisson noise is large); ties keep resident units first, then lower index.
//              The caller drops both for a period in which the hot set moved, and for the
//              periods after it until the resident set caught up (TierHeat::Update).
//   The top `target` units of the ranking are kept or promoted (a unit with heat 0 is never
//   promoted); resident units outside it are demoted. Already-resident units are never promoted.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "farmem/status.h"

namespace farmem::tier {

struct TierPolicyInput {
  std::span<const uint64_t> counts;  // per unit: heat (TierHeat) or one period's counts
  // Per unit (same size as counts): 0 cold, 1 resident, 2 resident by the free-room fill and
  // not counted since (ranked as resident, without the hysteresis bonus).
  std::span<const uint8_t> resident;
  uint64_t budget_units = 0;        // frames of the DRAM budget
  uint32_t fill_percent = 95;       // 1..100
  uint32_t hysteresis_percent = 0;  // 0..1000: resident units' bonus in the skewed ranking
  uint64_t hysteresis_heat = 0;     // and an absolute bonus, in the units of `counts`
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

  static constexpr uint32_t kMaxHysteresisPercent = 1000;

  // InvalidArgument when counts and resident differ in size, fill_percent is not in 1..100,
  // hysteresis_percent is above 1000, or there are more than 2^31 units.
  static Result<TierPolicyDecision> Decide(const TierPolicyInput& in);
  static uint64_t TargetUnits(uint64_t budget_units, uint32_t fill_percent);
  // The target of a region of `unit_count` units: every unit when the budget holds them all,
  // else TargetUnits (what Decide puts in target_units).
  static uint64_t TargetFor(uint64_t budget_units, uint64_t unit_count, uint32_t fill_percent);
};

// Access heat per unit across periods: heat = heat * keep_percent / 100 + count * kOne, saturating
// at 2^64 - 1. With keep k a unit's heat tends to rate / (1 - k) (keep 88: ~8 periods' counts);
// a moved hot set restarts it (Add's shift rule), so long memory does not hold an old set in
// place (docs/tier.md "Hotspot policy").
// Fixed point (kOne per access) because most units at the cut of a large region are seen less
// than once a period: in whole accesses, 1 * 50 / 100 truncates to 0, so a unit seen once was
// forgotten the next period and the heat of sparse units was one period's count (memoryless).
class TierHeat {
 public:
  static constexpr uint32_t kMaxKeepPercent = 99;  // 100 would never forget
  // Heat of one access. 2^8: a single access survives 8 halvings (keep 50) before it reads 0.
  static constexpr uint64_t kOne = 256;
  // `accesses` in heat units, saturating (the policy's absolute hysteresis bar is given in
  // accesses).
  static uint64_t FromAccesses(uint64_t accesses) {
    return accesses > ~uint64_t{0} / kOne ? ~uint64_t{0} : accesses * kOne;
  }

  // What Add saw.
  struct Update {
    bool accessed = false;  // some count was > 0 (else nothing changed)
    bool shifted = false;   // the hot set moved: heat restarted from this period's counts
    // A period after a shift in which the resident set has not caught up yet (resident share
    // below kCaughtUpShare of the share before the move; at most kFollowPeriods): the caller drops
    // the hysteresis as in the shift's own period. Why: the shift's period promotes by one period's
    // counts, and near the cut of a sparse region many of those units were seen once by chance;
    // with the hysteresis bar they would then hold their frames for periods while the long
    // memory lets their heat fade slowly (`farmem bench tiered`, 16,384 units: no recovery in 5 s).
    bool following = false;
    // The caller ranks this period without the hysteresis (TierStore::RunPeriod does).
    bool free_ranking() const { return shifted || following; }
  };
  // Following ends once the resident share is back to 99 % of the share before the move: a
  // 95 % bar ended it with ~0.82 of 0.87 resident (bench tiered, 16,384 units), and the
  // hysteresis then held that set at ~75 % of the throughput before the move. At most about
  // one heat memory (keep 88 %: ~8 periods' counts), so a set that cannot get back as much
  // (a flatter new hot set) returns to the hysteresis.
  static constexpr double kCaughtUpShare = 0.99;
  static constexpr uint32_t kFollowPeriods = 8;

  // InvalidArgument when keep_percent is above 99.
  static Result<TierHeat> Make(size_t units, uint32_t keep_percent);
  // Folds one period's counts in; `resident` is the residency the counts were made against.
  // Every count 0: nothing changes (an idle period carries no information: the heat, and so the
  // resident set, stays). Shift: when the share of this period's accesses that hit resident units
  // is below 3/4 of the previous period's, the hot set moved; the old heat (and the hysteresis,
  // which the caller drops for this period) would only hold the old set in place, so the heat
  // restarts from this period's counts. InvalidArgument when a size is wrong.
  Result<Update> Add(std::span<const uint64_t> counts, std::span<const uint8_t> resident);
  std::span<const uint64_t> heat() const { return heat_; }

 private:
  std::vector<uint64_t> heat_;
  uint32_t keep_percent_ = 0;
  double last_resident_share_ = 0;  // of the last period with accesses
  double follow_share_ = 0;         // the share that ends following (Update::following)
  uint32_t follow_left_ = 0;        // periods of following left
};

}  // namespace farmem::tier
