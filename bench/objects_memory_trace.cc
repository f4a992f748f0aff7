// Trace generators for `farmem bench objects-memory` (see objects_memory_trace.h). Own PRNG and
// bounded draws (no std distributions), so a trace is identical in every process and build.

#include "objects_memory_trace.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <string_view>
#include <utility>

#include <fmt/format.h>

namespace farmem::bench {
namespace {

// SplitMix64: tiny, fast, and fully specified, unlike std::uniform_int_distribution.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) (multiply-high; the bias is below 2^-32 for our n).
  uint32_t Below(uint32_t n) {
    return static_cast<uint32_t>((static_cast<unsigned __int128>(Next()) * n) >> 64);
  }

 private:
  uint64_t s_;
};

// The first k of a seeded Fisher-Yates shuffle of `items`: a uniform random k-subset in random
// order.
std::vector<uint32_t> RandomSubset(std::vector<uint32_t> items, size_t k, Rng& rng) {
  k = std::min(k, items.size());
  for (size_t i = 0; i < k; ++i) {
    const size_t j = i + rng.Below(static_cast<uint32_t>(items.size() - i));
    std::swap(items[i], items[j]);
  }
  items.resize(k);
  return items;
}

TracePhase NewPhase(std::string name, uint32_t threads) {
  TracePhase p;
  p.name = std::move(name);
  p.per_thread.resize(threads);
  return p;
}

Trace Synthetic(const TraceSpec& spec) {
  Trace t;
  t.spec = spec;
  const uint32_t n = spec.count != 0 ? spec.count : DefaultSyntheticCount(spec.size);
  t.spec.count = n;
  t.num_objects = n;
  const uint32_t threads = spec.threads;
  // Object i belongs to thread i % threads for its whole life.
  TracePhase alloc = NewPhase(fmt::format("alloc {} x {} B", n, spec.size), threads);
  for (uint32_t i = 0; i < n; ++i) alloc.per_thread[i % threads].push_back({i, spec.size});
  const auto k = static_cast<size_t>(std::llround(spec.free_fraction * n));
  Rng rng(spec.seed);
  std::vector<uint32_t> all(n);
  for (uint32_t i = 0; i < n; ++i) all[i] = i;
  TracePhase frees =
      NewPhase(fmt::format("free {} ({:.0f}%)", k, spec.free_fraction * 100), threads);
  for (uint32_t i : RandomSubset(std::move(all), k, rng)) {
    frees.per_thread[i % threads].push_back({i, 0});
  }
  t.phases.push_back(std::move(alloc));
  t.phases.push_back(std::move(frees));
  return t;
}

Trace T1(const TraceSpec& spec) {
  Trace t;
  t.spec = spec;
  t.num_objects = kT1Keys;
  Rng rng(spec.seed);
  // Each object is one key-value pair: the 8-byte key stored in front of its value.
  TracePhase set = NewPhase(fmt::format("set {} keys", kT1Keys), spec.threads);
  for (uint32_t i = 0; i < kT1Keys; ++i) {
    const uint32_t value = 1 + rng.Below(kT1MaxValue);
    set.per_thread[i % spec.threads].push_back({i, kT1KeyBytes + value});
  }
  t.phases.push_back(std::move(set));
  return t;
}

Trace T2(const TraceSpec& spec) {
  Trace t;
  t.spec = spec;
  const uint32_t threads = spec.threads;
  t.num_objects = kT2FirstCount + kT2SecondCount;
  // One LRU cache per thread (keys sharded round-robin, like T Redis shards), each capped at
  // 100 MiB / T of live value bytes. Values are only inserted, so "least recently used" is
  // "least recently inserted": a FIFO per shard.
  const uint64_t cap = kT2CacheBytes / threads;
  std::vector<std::deque<std::pair<uint32_t, uint32_t>>> fifo(threads);
  std::vector<uint64_t> live(threads, 0);
  TracePhase first =
      NewPhase(fmt::format("insert {} x {} B", kT2FirstCount, kT2FirstSize), threads);
  TracePhase second =
      NewPhase(fmt::format("insert {} x {} B", kT2SecondCount, kT2SecondSize), threads);
  for (uint32_t i = 0; i < t.num_objects; ++i) {
    const bool in_first = i < kT2FirstCount;
    const uint32_t size = in_first ? kT2FirstSize : kT2SecondSize;
    const uint32_t s = i % threads;
    auto& ops = (in_first ? first : second).per_thread[s];
    // Evict before inserting (Redis frees memory before running a write over maxmemory).
    while (!fifo[s].empty() && live[s] + size > cap) {
      ops.push_back({fifo[s].front().first, 0});
      live[s] -= fifo[s].front().second;
      fifo[s].pop_front();
    }
    ops.push_back({i, size});
    fifo[s].emplace_back(i, size);
    live[s] += size;
  }
  t.phases.push_back(std::move(first));
  t.phases.push_back(std::move(second));
  return t;
}

Trace T3(const TraceSpec& spec) {
  Trace t;
  t.spec = spec;
  const uint32_t threads = spec.threads;
  t.num_objects = kT3LargeCount + kT3SmallCount;
  TracePhase large =
      NewPhase(fmt::format("insert {} x {} KiB", kT3LargeCount, kT3LargeSize / 1024), threads);
  for (uint32_t i = 0; i < kT3LargeCount; ++i) {
    large.per_thread[i % threads].push_back({i, kT3LargeSize});
  }
  TracePhase small =
      NewPhase(fmt::format("insert {} x {} B", kT3SmallCount, kT3SmallSize), threads);
  std::vector<uint32_t> smalls;
  smalls.reserve(kT3SmallCount);
  for (uint32_t k = 0; k < kT3SmallCount; ++k) {
    const uint32_t i = kT3LargeCount + k;
    small.per_thread[k % threads].push_back({i, kT3SmallSize});
    smalls.push_back(i);
  }
  Rng rng(spec.seed);
  TracePhase removed = NewPhase(fmt::format("remove {} small", kT3Removed), threads);
  for (uint32_t i : RandomSubset(std::move(smalls), kT3Removed, rng)) {
    removed.per_thread[(i - kT3LargeCount) % threads].push_back({i, 0});
  }
  t.phases.push_back(std::move(large));
  t.phases.push_back(std::move(small));
  t.phases.push_back(std::move(removed));
  return t;
}

Result<uint64_t> ParseUint(std::string_view key, std::string_view v) {
  if (v.empty()) return Status::InvalidArgument(fmt::format("trace spec: empty value for {}", key));
  uint64_t x = 0;
  for (char c : v) {
    if (c < '0' || c > '9' || x > UINT64_MAX / 10) {
      return Status::InvalidArgument(fmt::format("trace spec: bad number '{}' for {}", v, key));
    }
    x = x * 10 + static_cast<uint64_t>(c - '0');
  }
  return x;
}

}  // namespace

size_t TracePhase::ops() const {
  size_t n = 0;
  for (const auto& v : per_thread) n += v.size();
  return n;
}

const char* TraceKindName(TraceKind k) {
  switch (k) {
    case TraceKind::kSynthetic:
      return "synthetic";
    case TraceKind::kT1:
      return "t1";
    case TraceKind::kT2:
      return "t2";
    case TraceKind::kT3:
      return "t3";
  }
  return "?";
}

uint32_t DefaultSyntheticCount(uint32_t size) {
  if (size == 0) return 0;
  return std::max<uint32_t>(8192, static_cast<uint32_t>((uint64_t{16} << 20) / size));
}

std::string TraceSpec::ToString() const {
  if (kind == TraceKind::kSynthetic) {
    // %.17g round-trips the fraction exactly.
    return fmt::format("synthetic:size={}:free={:.17g}:n={}:threads={}:seed={}", size,
                       free_fraction, count, threads, seed);
  }
  return fmt::format("{}:threads={}:seed={}", TraceKindName(kind), threads, seed);
}

std::string TraceSpec::Label() const {
  switch (kind) {
    case TraceKind::kSynthetic:
      return fmt::format("synthetic {} B, {:.0f}% freed{}", size, free_fraction * 100,
                         threads > 1 ? fmt::format(", {} threads", threads) : "");
    case TraceKind::kT1:
      return fmt::format("t1 10k keys 1 B-16 KiB, {} thread{}", threads, threads > 1 ? "s" : "");
    case TraceKind::kT2:
      return fmt::format("t2 LRU 100 MiB, {} thread{}", threads, threads > 1 ? "s" : "");
    case TraceKind::kT3:
      return fmt::format("t3 160 KiB + 150 B, {} thread{}", threads, threads > 1 ? "s" : "");
  }
  return "?";
}

Result<TraceSpec> TraceSpec::Parse(const std::string& text) {
  TraceSpec s;
  std::string_view rest = text;
  auto next = [&rest]() {
    const size_t pos = rest.find(':');
    std::string_view field = rest.substr(0, pos);
    rest = pos == std::string_view::npos ? std::string_view() : rest.substr(pos + 1);
    return field;
  };
  const std::string_view kind = next();
  if (kind == "synthetic") {
    s.kind = TraceKind::kSynthetic;
  } else if (kind == "t1") {
    s.kind = TraceKind::kT1;
  } else if (kind == "t2") {
    s.kind = TraceKind::kT2;
  } else if (kind == "t3") {
    s.kind = TraceKind::kT3;
  } else {
    return Status::InvalidArgument(
        fmt::format("trace spec '{}': kind must be synthetic, t1, t2 or t3", text));
  }
  while (!rest.empty()) {
    const std::string_view field = next();
    const size_t eq = field.find('=');
    if (eq == std::string_view::npos) {
      return Status::InvalidArgument(
          fmt::format("trace spec '{}': field '{}' lacks '='", text, field));
    }
    const std::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
    if (key == "free") {
      const std::string v(value);
      char* end = nullptr;
      s.free_fraction = std::strtod(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size()) {
        return Status::InvalidArgument(fmt::format("trace spec: bad fraction '{}'", v));
      }
      continue;
    }
    FARMEM_ASSIGN_OR_RETURN(uint64_t x, ParseUint(key, value));
    if (key == "seed") {
      s.seed = x;
    } else if (x > UINT32_MAX) {
      return Status::InvalidArgument(fmt::format("trace spec: {}={} too large", key, x));
    } else if (key == "size") {
      s.size = static_cast<uint32_t>(x);
    } else if (key == "n") {
      s.count = static_cast<uint32_t>(x);
    } else if (key == "threads") {
      s.threads = static_cast<uint32_t>(x);
    } else {
      return Status::InvalidArgument(fmt::format("trace spec '{}': unknown field '{}'", text, key));
    }
  }
  return s;
}

Result<Trace> GenerateTrace(const TraceSpec& spec) {
  if (spec.threads == 0 || spec.threads > 256) {
    return Status::InvalidArgument(fmt::format("threads {} outside 1..256", spec.threads));
  }
  switch (spec.kind) {
    case TraceKind::kSynthetic:
      if (spec.size == 0 || spec.size > (64u << 20)) {
        return Status::InvalidArgument(fmt::format("object size {} outside 1..64 MiB", spec.size));
      }
      if (!(spec.free_fraction >= 0.0 && spec.free_fraction <= 1.0)) {
        return Status::InvalidArgument(
            fmt::format("free fraction {} outside [0, 1]", spec.free_fraction));
      }
      if (spec.count > (64u << 20)) {
        return Status::InvalidArgument(fmt::format("object count {} above 64 Mi", spec.count));
      }
      return Synthetic(spec);
    case TraceKind::kT1:
      return T1(spec);
    case TraceKind::kT2:
      return T2(spec);
    case TraceKind::kT3:
      return T3(spec);
  }
  return Status::InvalidArgument("unknown trace kind");
}

Result<std::vector<uint32_t>> LiveSizesAfter(const Trace& trace) {
  std::vector<uint32_t> size(trace.num_objects, 0);  // 0 = not live
  std::vector<uint8_t> seen(trace.num_objects, 0);
  for (const TracePhase& p : trace.phases) {
    for (const auto& ops : p.per_thread) {
      for (const TraceOp& op : ops) {
        if (op.obj >= trace.num_objects) {
          return Status::Internal(
              fmt::format("trace op on object {} of {}", op.obj, trace.num_objects));
        }
        if (op.is_free()) {
          if (size[op.obj] == 0) {
            return Status::Internal(fmt::format("trace frees dead object {}", op.obj));
          }
          size[op.obj] = 0;
        } else {
          if (seen[op.obj]) {
            return Status::Internal(fmt::format("trace allocates object {} twice", op.obj));
          }
          seen[op.obj] = 1;
          size[op.obj] = op.size;
        }
      }
    }
  }
  std::vector<uint32_t> live;
  for (uint32_t s : size) {
    if (s != 0) live.push_back(s);
  }
  return live;
}

uint32_t MaxObjectSize(const Trace& trace) {
  uint32_t m = 0;
  for (const TracePhase& p : trace.phases) {
    for (const auto& ops : p.per_thread) {
      for (const TraceOp& op : ops) m = std::max(m, op.size);
    }
  }
  return m;
}

}  // namespace farmem::bench
