// Key choosers for the object throughput benchmarks: uniform and Zipf(theta) over [0, n).
// Zipf uses the rejection-free method of Gray et al., "Quickly Generating Billion-Record Synthetic
// Databases" (SIGMOD 1994), the same one YCSB's ZipfianGenerator uses. Header-only (unit-tested).
#pragma once

#include <cmath>
#include <cstdint>
#include <numeric>

namespace farmem::bench {

// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast and good enough to pick keys; one per thread.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform double in [0, 1) from the top 53 bits.
  double NextDouble() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n) (n > 0); Lemire's multiply-shift, bias < n / 2^64.
  uint64_t Below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
  }

 private:
  uint64_t state_;
};

// zeta(n, theta) = sum_{i=1..n} 1 / i^theta. O(n): computed once per generator.
inline double Zeta(uint64_t n, double theta) {
  double sum = 0;
  for (uint64_t i = 1; i <= n; ++i) sum += 1.0 / std::pow(static_cast<double>(i), theta);
  return sum;
}

// Zipf(theta) ranks in [0, n): rank r is drawn with probability (1/(r+1)^theta) / zeta(n, theta),
// so rank 0 is the hottest. Valid for 0 < theta < 1 (the benchmark uses 0.99). Immutable after
// construction, so threads may share one and draw with their own SplitMix64.
class ZipfGenerator {
 public:
  ZipfGenerator(uint64_t n, double theta) : n_(n), theta_(theta) {
    zetan_ = Zeta(n, theta);
    const double zeta2 = Zeta(2, theta);
    alpha_ = 1.0 / (1.0 - theta);
    eta_ = (1.0 - std::pow(2.0 / static_cast<double>(n), 1.0 - theta)) / (1.0 - zeta2 / zetan_);
    half_pow_theta_ = 1.0 + std::pow(0.5, theta);
  }

  uint64_t Next(SplitMix64& rng) const {
    const double u = rng.NextDouble();
    const double uz = u * zetan_;
    if (uz < 1.0) return 0;
    if (uz < half_pow_theta_) return 1;
    auto r =
        static_cast<uint64_t>(static_cast<double>(n_) * std::pow(eta_ * u - eta_ + 1.0, alpha_));
    return r < n_ ? r : n_ - 1;  // u close to 1 can round up to n
  }

  uint64_t n() const { return n_; }
  double theta() const { return theta_; }
  double zetan() const { return zetan_; }
  // Exact probability of rank r under the distribution the generator approximates.
  double Probability(uint64_t r) const {
    return 1.0 / std::pow(static_cast<double>(r + 1), theta_) / zetan_;
  }

 private:
  uint64_t n_;
  double theta_;
  double zetan_ = 0, alpha_ = 0, eta_ = 0, half_pow_theta_ = 0;
};

// Spreads Zipf ranks over the key space, as YCSB's ScrambledZipfian does: without it the hottest
// keys are 0, 1, 2, ... — adjacent objects in the same blocks and cache lines, which flatters every
// system (and hides block-level effects). key = (rank * step + offset) mod n with gcd(step, n) = 1
// is a bijection, so the key popularities are exactly the rank popularities; step ~ 0.618 n puts
// consecutive ranks far apart.
class RankScrambler {
 public:
  explicit RankScrambler(uint64_t n) : n_(n == 0 ? 1 : n) {
    step_ = static_cast<uint64_t>(static_cast<double>(n_) * 0.6180339887498949);
    if (step_ == 0) step_ = 1;
    while (std::gcd(step_, n_) != 1) --step_;  // terminates: gcd(1, n) = 1
    offset_ = n_ / 3;
  }
  uint64_t operator()(uint64_t rank) const {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(rank) * step_ + offset_) % n_);
  }

 private:
  uint64_t n_, step_ = 1, offset_ = 0;
};

// What a benchmark client draws its next key from: uniform, or Zipf over n keys with its ranks
// scrambled (RankScrambler).
class KeyChooser {
 public:
  // zipf == nullptr: uniform. The generator must outlive the chooser.
  KeyChooser(uint64_t n, const ZipfGenerator* zipf, uint64_t seed)
      : n_(n), zipf_(zipf), rng_(seed), scramble_(n) {}
  uint64_t Next() { return zipf_ ? scramble_(zipf_->Next(rng_)) : rng_.Below(n_); }

 private:
  uint64_t n_;
  const ZipfGenerator* zipf_;
  SplitMix64 rng_;
  RankScrambler scramble_;
};

}  // namespace farmem::bench
