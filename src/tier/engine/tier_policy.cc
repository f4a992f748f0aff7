// TeRM hotspot policy (see tier_policy.h): ranking with hysteresis, budget target, uniform rule
// (pure; any thread), and the decayed heat (TierHeat; its owner's thread).
#include "tier/engine/tier_policy.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace farmem::tier {

uint64_t TierPolicy::TargetUnits(uint64_t budget_units, uint32_t fill_percent) {
  if (budget_units == 0 || fill_percent == 0) return 0;
  const uint64_t t = budget_units / 100 * fill_percent + budget_units % 100 * fill_percent / 100;
  return std::max<uint64_t>(t, 1);
}

uint64_t TierPolicy::TargetFor(uint64_t budget_units, uint64_t unit_count, uint32_t fill_percent) {
  // A budget that holds every unit keeps no room free: all of them may be resident.
  if (budget_units >= unit_count) return unit_count;
  return std::min<uint64_t>(TargetUnits(budget_units, fill_percent), unit_count);
}

Result<TierPolicyDecision> TierPolicy::Decide(const TierPolicyInput& in) {
  if (in.counts.size() != in.resident.size()) {
    return Status::InvalidArgument("policy input: " + std::to_string(in.counts.size()) +
                                   " counts for " + std::to_string(in.resident.size()) + " units");
  }
  if (in.fill_percent == 0 || in.fill_percent > 100) {
    return Status::InvalidArgument("policy fill percent must be in 1..100, got " +
                                   std::to_string(in.fill_percent));
  }
  if (in.counts.size() > (uint64_t{1} << 31)) {
    return Status::InvalidArgument("policy input has more than 2^31 units");
  }
  if (in.hysteresis_percent > kMaxHysteresisPercent) {
    return Status::InvalidArgument("policy hysteresis percent must be at most " +
                                   std::to_string(kMaxHysteresisPercent) + ", got " +
                                   std::to_string(in.hysteresis_percent));
  }
  TierPolicyDecision d;
  const size_t n = in.counts.size();
  d.target_units = TargetFor(in.budget_units, n, in.fill_percent);
  if (n == 0) return d;
  const uint64_t max = *std::max_element(in.counts.begin(), in.counts.end());
  if (max == 0) return d;  // nothing was accessed: no information, nothing moves
  // Average without overflow: sum in 128 bits.
  unsigned __int128 sum = 0;
  for (uint64_t c : in.counts) sum += c;
  // max <= 10 * sum / n  <=>  max * n <= 10 * sum
  d.uniform = static_cast<unsigned __int128>(max) * n <= sum * kUniformFactor;

  // Score in 128 bits: heat * (100 + hysteresis) for resident units, heat * 100 for cold ones.
  auto score = [&](uint32_t u) {
    if (in.resident[u] != 1) return static_cast<unsigned __int128>(in.counts[u]) * 100u;
    return static_cast<unsigned __int128>(in.counts[u]) * (100u + in.hysteresis_percent) +
           static_cast<unsigned __int128>(in.hysteresis_heat) * 100u;
  };
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  auto hotter = [&](uint32_t a, uint32_t b) {
    const bool ra = in.resident[a] != 0, rb = in.resident[b] != 0;  // 1 or 2: resident
    if (d.uniform && ra != rb) return ra;
    const unsigned __int128 sa = score(a), sb = score(b);
    if (sa != sb) return sa > sb;
    if (ra != rb) return ra;
    return a < b;
  };
  std::sort(order.begin(), order.end(), hotter);
  for (size_t rank = 0; rank < n; ++rank) {
    const uint32_t u = order[rank];
    const bool keep = rank < d.target_units;
    if (in.resident[u] && !keep) d.demote.push_back(u);
    if (!in.resident[u] && keep && in.counts[u] > 0) d.promote.push_back(u);
  }
  std::reverse(d.demote.begin(), d.demote.end());  // coldest first
  return d;
}

Result<TierHeat> TierHeat::Make(size_t units, uint32_t keep_percent) {
  if (keep_percent > kMaxKeepPercent) {
    return Status::InvalidArgument("heat keep percent must be at most " +
                                   std::to_string(kMaxKeepPercent) + ", got " +
                                   std::to_string(keep_percent));
  }
  TierHeat h;
  h.heat_.assign(units, 0);
  h.keep_percent_ = keep_percent;
  return h;
}

Result<TierHeat::Update> TierHeat::Add(std::span<const uint64_t> counts,
                                       std::span<const uint8_t> resident) {
  if (counts.size() != heat_.size() || resident.size() != heat_.size()) {
    return Status::InvalidArgument("heat: " + std::to_string(counts.size()) + " counts and " +
                                   std::to_string(resident.size()) + " residency bytes for " +
                                   std::to_string(heat_.size()) + " units");
  }
  Update up;
  long double all = 0, hit = 0;
  for (size_t u = 0; u < counts.size(); ++u) {
    all += static_cast<long double>(counts[u]);
    if (resident[u]) hit += static_cast<long double>(counts[u]);
  }
  if (all == 0) return up;
  up.accessed = true;
  const double share = static_cast<double>(hit / all);
  up.shifted = share < last_resident_share_ * 3 / 4;
  if (up.shifted) {
    follow_share_ = last_resident_share_ * kCaughtUpShare;
    follow_left_ = kFollowPeriods;
  } else if (follow_left_ > 0) {
    if (share >= follow_share_) {
      follow_left_ = 0;  // caught up
    } else {
      --follow_left_;
      up.following = true;
    }
  }
  last_resident_share_ = share;
  const uint32_t keep = up.shifted ? 0 : keep_percent_;
  for (size_t u = 0; u < heat_.size(); ++u) {
    const unsigned __int128 kept = static_cast<unsigned __int128>(heat_[u]) * keep / 100;
    const unsigned __int128 h = kept + static_cast<unsigned __int128>(counts[u]) * kOne;
    heat_[u] = h > ~uint64_t{0} ? ~uint64_t{0} : static_cast<uint64_t>(h);
  }
  return up;
}

}  // namespace farmem::tier
