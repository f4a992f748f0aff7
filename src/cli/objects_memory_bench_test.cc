// Tests of the pure parts of `farmem bench objects-memory`: the trace generators (counts, sizes,
// ownership, LRU eviction invariants, determinism), trace specs, block-size choice, the ideal
// packing computation, reading a child's document and the target evaluation.
#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include <gtest/gtest.h>

#include "objects/format/size_classes.h"
#include "objects_memory_bench.h"
#include "objects_memory_trace.h"

namespace farmem::bench {
namespace {

Trace Gen(const TraceSpec& s) {
  auto t = GenerateTrace(s);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

TraceSpec Synthetic(uint32_t size, double fraction, uint32_t n, uint32_t threads = 1) {
  TraceSpec s;
  s.kind = TraceKind::kSynthetic;
  s.size = size;
  s.free_fraction = fraction;
  s.count = n;
  s.threads = threads;
  return s;
}

TraceSpec Redis(TraceKind k, uint32_t threads) {
  TraceSpec s;
  s.kind = k;
  s.threads = threads;
  return s;
}

// Every free in the trace is issued by the thread that allocated the object.
void ExpectOwnerFrees(const Trace& t) {
  std::map<uint32_t, size_t> owner;
  for (const auto& p : t.phases) {
    for (size_t th = 0; th < p.per_thread.size(); ++th) {
      for (const TraceOp& op : p.per_thread[th]) {
        if (op.is_free()) {
          ASSERT_TRUE(owner.count(op.obj)) << "free before alloc of " << op.obj;
          EXPECT_EQ(owner[op.obj], th) << "object " << op.obj;
        } else {
          owner[op.obj] = th;
        }
      }
    }
  }
}

TEST(ObjectsMemoryTrace, SyntheticCountsAndFrees) {
  for (uint32_t threads : {1u, 4u}) {
    const Trace t = Gen(Synthetic(256, 0.7, 1000, threads));
    ASSERT_EQ(t.phases.size(), 2u);
    EXPECT_EQ(t.num_objects, 1000u);
    EXPECT_EQ(t.phases[0].ops(), 1000u);
    EXPECT_EQ(t.phases[1].ops(), 700u);
    ASSERT_EQ(t.phases[0].per_thread.size(), threads);
    std::set<uint32_t> allocated, freed;
    for (const auto& ops : t.phases[0].per_thread) {
      for (const TraceOp& op : ops) {
        EXPECT_EQ(op.size, 256u);
        EXPECT_TRUE(allocated.insert(op.obj).second);
      }
    }
    for (const auto& ops : t.phases[1].per_thread) {
      for (const TraceOp& op : ops) {
        EXPECT_TRUE(op.is_free());
        EXPECT_TRUE(freed.insert(op.obj).second) << "double free of " << op.obj;
      }
    }
    EXPECT_EQ(allocated.size(), 1000u);
    EXPECT_EQ(freed.size(), 700u);
    ExpectOwnerFrees(t);
    auto live = LiveSizesAfter(t);
    ASSERT_TRUE(live.ok());
    EXPECT_EQ(live->size(), 300u);
  }
}

TEST(ObjectsMemoryTrace, SyntheticIsSeededAndRandom) {
  const Trace a = Gen(Synthetic(64, 0.5, 2000));
  const Trace b = Gen(Synthetic(64, 0.5, 2000));
  TraceSpec other = Synthetic(64, 0.5, 2000);
  other.seed = 7;
  const Trace c = Gen(other);
  auto freed = [](const Trace& t) {
    std::vector<uint32_t> v;
    for (const TraceOp& op : t.phases[1].per_thread[0]) v.push_back(op.obj);
    return v;
  };
  EXPECT_EQ(freed(a), freed(b));
  EXPECT_NE(freed(a), freed(c));
  // Not simply the first or last half: both halves lose objects.
  const auto f = freed(a);
  const auto low = std::count_if(f.begin(), f.end(), [](uint32_t o) { return o < 1000; });
  EXPECT_GT(low, 0);
  EXPECT_LT(low, 1000);
}

TEST(ObjectsMemoryTrace, SyntheticDefaultCountAndRejects) {
  EXPECT_EQ(DefaultSyntheticCount(64), (16u << 20) / 64);
  EXPECT_EQ(DefaultSyntheticCount(4096), 8192u);
  const Trace t = Gen(Synthetic(4096, 0.9, 0));
  EXPECT_EQ(t.num_objects, 8192u);
  EXPECT_EQ(t.phases[1].ops(), 7373u);  // llround(0.9 * 8192)
  EXPECT_FALSE(GenerateTrace(Synthetic(0, 0.5, 10)).ok());
  EXPECT_FALSE(GenerateTrace(Synthetic(64, 1.5, 10)).ok());
  EXPECT_FALSE(GenerateTrace(Synthetic(64, 0.5, 10, 0)).ok());
  EXPECT_FALSE(GenerateTrace(Synthetic(64, 0.5, 10, 1000)).ok());
}

TEST(ObjectsMemoryTrace, T1KeysAndValueSizes) {
  const Trace t = Gen(Redis(TraceKind::kT1, 4));
  ASSERT_EQ(t.phases.size(), 1u);
  EXPECT_EQ(t.phases[0].ops(), kT1Keys);
  uint64_t total = 0;
  uint32_t mn = UINT32_MAX, mx = 0;
  for (const auto& ops : t.phases[0].per_thread) {
    EXPECT_EQ(ops.size(), kT1Keys / 4);
    for (const TraceOp& op : ops) {
      ASSERT_FALSE(op.is_free());
      mn = std::min(mn, op.size);
      mx = std::max(mx, op.size);
      total += op.size;
    }
  }
  EXPECT_GE(mn, kT1KeyBytes + 1);
  EXPECT_LE(mx, kT1KeyBytes + kT1MaxValue);
  // Uniform values: the mean is near 8 KiB (fixed seed, so this is deterministic).
  const double mean = static_cast<double>(total) / kT1Keys;
  EXPECT_NEAR(mean, kT1KeyBytes + (1 + kT1MaxValue) / 2.0, 300.0);
  // Same sizes whatever the thread count: only the partition differs.
  const Trace one = Gen(Redis(TraceKind::kT1, 1));
  std::vector<uint32_t> by_obj(kT1Keys);
  for (const TraceOp& op : one.phases[0].per_thread[0]) by_obj[op.obj] = op.size;
  for (const auto& ops : t.phases[0].per_thread) {
    for (const TraceOp& op : ops) EXPECT_EQ(by_obj[op.obj], op.size);
  }
}

// Replays a t2 trace per shard: the live bytes never exceed the shard's cap after an insert, a
// free always evicts the shard's oldest live value, and evictions happen only when needed.
void CheckT2(uint32_t threads) {
  const Trace t = Gen(Redis(TraceKind::kT2, threads));
  ASSERT_EQ(t.phases.size(), 2u);
  const uint64_t cap = kT2CacheBytes / threads;
  uint64_t allocs = 0, frees = 0, live_total = 0;
  std::vector<std::deque<std::pair<uint32_t, uint32_t>>> fifo(threads);
  std::vector<uint64_t> live(threads, 0);
  for (size_t ph = 0; ph < 2; ++ph) {
    const uint32_t expect_size = ph == 0 ? kT2FirstSize : kT2SecondSize;
    for (uint32_t th = 0; th < threads; ++th) {
      uint64_t last_evicted = 0;  // size of the eviction just before this insert (0 = none)
      for (const TraceOp& op : t.phases[ph].per_thread[th]) {
        if (op.is_free()) {
          ASSERT_FALSE(fifo[th].empty());
          ASSERT_EQ(op.obj, fifo[th].front().first) << "not the least recently inserted";
          live[th] -= fifo[th].front().second;
          last_evicted = fifo[th].front().second;
          fifo[th].pop_front();
          ++frees;
          continue;
        }
        ASSERT_EQ(op.size, expect_size);
        // The last eviction was necessary: without it the insert would not have fit.
        if (last_evicted != 0) {
          ASSERT_GT(live[th] + last_evicted + op.size, cap);
        }
        live[th] += op.size;
        ASSERT_LE(live[th], cap);
        fifo[th].emplace_back(op.obj, op.size);
        ++allocs;
        last_evicted = 0;
      }
    }
  }
  EXPECT_EQ(allocs, uint64_t{kT2FirstCount} + kT2SecondCount);
  for (uint32_t th = 0; th < threads; ++th) {
    // The shard ends full: one more 300 B value would need an eviction.
    EXPECT_GT(live[th] + kT2SecondSize, cap);
    live_total += live[th];
  }
  // The cache ends full: about 100 MiB of values, ~51 MB of them the 300 B ones.
  EXPECT_LE(live_total, kT2CacheBytes);
  EXPECT_GT(live_total, kT2CacheBytes - uint64_t{threads} * kT2SecondSize);
  EXPECT_EQ(allocs - frees, LiveSizesAfter(t).value().size());
  // 170 000 x 300 B evict about 51 MB / 150 B = 340 000 small values (plus ~1000 in phase 1).
  EXPECT_GT(frees, 330000u);
  EXPECT_LT(frees, 350000u);
  ExpectOwnerFrees(t);
}

TEST(ObjectsMemoryTrace, T2LruInvariantsOneThread) {
  CheckT2(1);
}

TEST(ObjectsMemoryTrace, T2LruInvariantsSharded) {
  CheckT2(16);
}

TEST(ObjectsMemoryTrace, T3Phases) {
  const Trace t = Gen(Redis(TraceKind::kT3, 4));
  ASSERT_EQ(t.phases.size(), 3u);
  EXPECT_EQ(t.phases[0].ops(), kT3LargeCount);
  EXPECT_EQ(t.phases[1].ops(), kT3SmallCount);
  EXPECT_EQ(t.phases[2].ops(), kT3Removed);
  for (const auto& ops : t.phases[0].per_thread) {
    for (const TraceOp& op : ops) EXPECT_EQ(op.size, kT3LargeSize);
  }
  std::set<uint32_t> removed;
  for (const auto& ops : t.phases[2].per_thread) {
    for (const TraceOp& op : ops) {
      ASSERT_TRUE(op.is_free());
      EXPECT_GE(op.obj, kT3LargeCount) << "a large value was removed";
      EXPECT_TRUE(removed.insert(op.obj).second);
    }
  }
  EXPECT_EQ(removed.size(), kT3Removed);
  ExpectOwnerFrees(t);
  const auto live = LiveSizesAfter(t).value();
  EXPECT_EQ(live.size(), kT3LargeCount + kT3SmallCount - kT3Removed);
  EXPECT_EQ(std::count(live.begin(), live.end(), kT3LargeSize), kT3LargeCount);
  EXPECT_EQ(MaxObjectSize(t), kT3LargeSize);
}

TEST(ObjectsMemoryTrace, LiveSizesRejectsInconsistentTraces) {
  Trace t;
  t.num_objects = 2;
  TracePhase p;
  p.per_thread = {{{0, 10}, {0, 0}, {0, 0}}};
  t.phases.push_back(p);
  EXPECT_FALSE(LiveSizesAfter(t).ok());  // double free
  t.phases[0].per_thread = {{{1, 10}, {1, 20}}};
  EXPECT_FALSE(LiveSizesAfter(t).ok());  // allocated twice
  t.phases[0].per_thread = {{{5, 10}}};
  EXPECT_FALSE(LiveSizesAfter(t).ok());  // object out of range
}

TEST(ObjectsMemoryTrace, SpecRoundTripAndErrors) {
  TraceSpec s = Synthetic(2048, 0.7, 12345, 3);
  s.seed = 99;
  auto p = TraceSpec::Parse(s.ToString());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->kind, TraceKind::kSynthetic);
  EXPECT_EQ(p->size, 2048u);
  EXPECT_EQ(p->free_fraction, 0.7);
  EXPECT_EQ(p->count, 12345u);
  EXPECT_EQ(p->threads, 3u);
  EXPECT_EQ(p->seed, 99u);
  auto q = TraceSpec::Parse("t2:threads=16:seed=5");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->kind, TraceKind::kT2);
  EXPECT_EQ(q->threads, 16u);
  for (const char* bad : {"t9", "synthetic:size", "synthetic:size=x", "synthetic:free=0.5x",
                          "t1:color=3", "synthetic:size=99999999999"}) {
    EXPECT_FALSE(TraceSpec::Parse(bad).ok()) << bad;
  }
}

TEST(ObjectsMemoryBench, IdealPacking) {
  auto classes = corm::SizeClasses::Create(corm::GeometryOptions{}).value();
  // 64 B payload -> 80 B slots, 51 per 4 KiB block: 100 objects need 2 blocks.
  const uint32_t c64 = classes.ClassFor(64).value();
  ASSERT_EQ(classes.at(c64).slot_size, 80u);
  ASSERT_EQ(classes.at(c64).slots_per_block, 51u);
  ASSERT_EQ(classes.at(c64).block_bytes, 4096u);
  std::vector<uint32_t> live(100, 64);
  auto r = IdealMemory(live, classes).value();
  EXPECT_EQ(r.blocks, 2u);
  EXPECT_EQ(r.bytes, 8192u);
  EXPECT_EQ(r.classes_used, 1u);
  // Exactly full blocks: 102 objects still need 2 blocks; 103 need 3.
  live.assign(102, 64);
  EXPECT_EQ(IdealMemory(live, classes).value().blocks, 2u);
  live.push_back(64);
  EXPECT_EQ(IdealMemory(live, classes).value().blocks, 3u);
  // Classes are counted separately, each block with its class's size: one 1000 B object adds a
  // block of its own class (a 32 KiB block of 31 slots).
  live.push_back(1000);
  const uint32_t c1000 = classes.ClassFor(1000).value();
  auto mixed = IdealMemory(live, classes).value();
  EXPECT_EQ(mixed.blocks, 4u);
  EXPECT_EQ(mixed.bytes, 3u * 4096 + classes.at(c1000).block_bytes);
  EXPECT_EQ(mixed.classes_used, 2u);
  EXPECT_EQ(IdealMemory({}, classes).value().bytes, 0u);
  EXPECT_FALSE(IdealMemory({2u << 20}, classes).ok());  // larger than the largest class
}

nlohmann::json CormDoc(double before, double after) {
  return {{"config", {{"allocator", "corm"}}},
          {"after_trace", {{"accounted_bytes", before}, {"rss_bytes", before + 1}}},
          {"after_compaction", {{"accounted_bytes", after}, {"rss_bytes", after + 1}}},
          {"compaction", {{"merges", 3}, {"rounds", 2}}}};
}

TEST(ObjectsMemoryBench, FiguresFromChild) {
  const auto& all = AllSeries();
  const SeriesDef& hybrid = all[4];
  ASSERT_EQ(hybrid.key, "hybrid");
  auto f = FiguresFromChild(hybrid, CormDoc(100, 40));
  EXPECT_TRUE(f.error.empty()) << f.error;
  EXPECT_EQ(f.accounted, 40);
  EXPECT_EQ(f.rss, 41);
  EXPECT_EQ(f.accounted_before, 100);
  EXPECT_FALSE(FiguresFromChild(hybrid, {{"error", "boom"}}).error.empty());
  EXPECT_FALSE(FiguresFromChild(hybrid, nlohmann::json()).error.empty());
  // A jemalloc run whose child still used glibc (LD_PRELOAD ignored) is an error, not a result.
  const SeriesDef& je = all[6];
  ASSERT_EQ(je.key, "jemalloc");
  nlohmann::json glibc_doc = {{"config", {{"allocator", "glibc"}}},
                              {"after_trace", {{"accounted_bytes", 5}, {"rss_bytes", 6}}},
                              {"phases", {{{"accounted_bytes", 9}, {"rss_bytes", 9}}}}};
  EXPECT_NE(FiguresFromChild(je, glibc_doc).error.find("LD_PRELOAD"), std::string::npos);
  auto g = FiguresFromChild(all[5], glibc_doc);
  EXPECT_TRUE(g.error.empty()) << g.error;
  EXPECT_EQ(g.rss, 6);
  EXPECT_EQ(g.accounted_before, 9);
}

TraceFigures Fig(TraceSpec spec, uint64_t ideal, double hybrid, double corm0, double glibc_rss,
                 double hybrid_rss) {
  TraceFigures t;
  t.spec = spec;
  t.label = spec.Label();
  t.ideal.bytes = ideal;
  for (const auto& d : AllSeries()) {
    SeriesFigures s;
    s.key = d.key;
    s.accounted = d.key == "hybrid" ? hybrid : d.key == "corm0" ? corm0 : 1e9;
    s.rss = d.key == "hybrid" ? hybrid_rss : d.key == "glibc" ? glibc_rss : 1e9;
    t.series.push_back(s);
  }
  return t;
}

TEST(ObjectsMemoryBench, TargetsPassAndMiss) {
  std::vector<TraceFigures> traces = {
      Fig(Synthetic(4096, 0.9, 0), 1000, 1050, 5000, 30000, 1500),
      Fig(Synthetic(2048, 0.5, 0), 2000, 2100, 2100, 1, 1),
      Fig(Synthetic(64, 0.5, 0), 100, 500, 600, 1, 1),  // not covered by target 2
  };
  auto t = EvaluateMemoryTargets(traces);
  ASSERT_EQ(t.size(), 7u);  // 3 CoRM targets, then issue 15's 4
  EXPECT_EQ(t[0].result, "PASS");
  EXPECT_DOUBLE_EQ(*t[0].ratio, 1.0);  // 2100 / 2100 is the worst
  EXPECT_EQ(t[1].result, "PASS");
  EXPECT_DOUBLE_EQ(*t[1].ratio, 1.05);
  EXPECT_EQ(t[2].result, "PASS");
  EXPECT_DOUBLE_EQ(*t[2].ratio, 20.0);

  traces[1] = Fig(Synthetic(2048, 0.5, 0), 2000, 2300, 2200, 1, 1);  // 1.15x ideal, > CoRM-0
  traces[0] = Fig(Synthetic(4096, 0.9, 0), 1000, 1050, 5000, 2000, 1500);
  t = EvaluateMemoryTargets(traces);
  EXPECT_EQ(t[0].result, "MISS");
  EXPECT_NEAR(*t[0].ratio, 2300.0 / 2200, 1e-12);
  EXPECT_EQ(t[1].result, "MISS");
  EXPECT_NEAR(*t[1].ratio, 1.15, 1e-12);
  EXPECT_EQ(t[2].result, "MISS");

  // A failed series is not a measurement: the target that needs it is n/a.
  traces = {Fig(Synthetic(4096, 0.9, 0), 1000, 1050, 5000, 30000, 1500)};
  traces[0].series[5].error = "exit code 1";  // glibc
  t = EvaluateMemoryTargets(traces);
  EXPECT_EQ(t[2].result, "n/a");
  EXPECT_FALSE(t[2].ratio.has_value());
  EXPECT_EQ(EvaluateMemoryTargets({})[0].result, "n/a");
}

// Issue 15's series: glibc-trim and jemalloc-purge are read from the glibc / jemalloc child's
// figures after malloc_trim / purge; a purge that failed is an error, not a result; CoRM's
// figures carry the metadata and the trimmed RSS.
TEST(ObjectsMemoryBench, ReleasedSeriesAndMetadataFromChild) {
  const auto& all = AllSeries();
  ASSERT_EQ(all.size(), 9u);
  const SeriesDef& gt = all[7];
  const SeriesDef& jp = all[8];
  ASSERT_EQ(gt.key, "glibc_trim");
  ASSERT_EQ(jp.key, "jemalloc_purge");
  EXPECT_EQ(gt.from, "glibc");
  EXPECT_EQ(jp.from, "jemalloc");
  nlohmann::json glibc_doc = {
      {"config", {{"allocator", "glibc"}}},
      {"after_trace", {{"accounted_bytes", 50}, {"rss_bytes", 60}}},
      {"after_trace_released", {{"accounted_bytes", 20}, {"rss_bytes", 30}}}};
  auto g = FiguresFromChild(gt, glibc_doc);
  EXPECT_TRUE(g.error.empty()) << g.error;
  EXPECT_EQ(g.accounted, 20);
  EXPECT_EQ(g.rss, 30);
  EXPECT_EQ(FiguresFromChild(all[5], glibc_doc).rss, 60);  // plain glibc: before the trim
  // glibc-trim needs the glibc child: a jemalloc document is refused, and vice versa.
  EXPECT_FALSE(FiguresFromChild(jp, glibc_doc).error.empty());
  nlohmann::json je_doc = glibc_doc;
  je_doc["config"] = {{"allocator", "jemalloc"}, {"purge_failed", true}};
  EXPECT_NE(FiguresFromChild(jp, je_doc).error.find("purge"), std::string::npos);
  je_doc["config"].erase("purge_failed");
  EXPECT_TRUE(FiguresFromChild(jp, je_doc).error.empty());
  EXPECT_FALSE(FiguresFromChild(gt, je_doc).error.empty());

  nlohmann::json corm = CormDoc(100, 40);
  corm["after_compaction"]["metadata_bytes"] = 7;
  corm["after_compaction_released"] = {{"accounted_bytes", 40}, {"rss_bytes", 35}};
  auto h = FiguresFromChild(all[4], corm);
  EXPECT_TRUE(h.error.empty()) << h.error;
  EXPECT_EQ(h.metadata, 7);
  EXPECT_EQ(h.rss_released, 35);
  EXPECT_EQ(h.accounted_released, 40);
}

// Targets 4-7 (issue 15), on hybrid's RSS after compaction + trim.
TEST(ObjectsMemoryBench, Issue15TargetsPassAndMiss) {
  auto fig = [](TraceSpec spec, uint64_t live, double hybrid, double glibc_trim, double je_purge) {
    TraceFigures t;
    t.spec = spec;
    t.label = spec.Label();
    t.live_payload_bytes = live;
    for (const auto& d : AllSeries()) {
      SeriesFigures s;
      s.key = d.key;
      s.accounted = s.rss = 1e9;
      if (d.key == "hybrid") s.rss_released = hybrid;
      if (d.key == "glibc_trim") s.rss = glibc_trim;
      if (d.key == "jemalloc_purge") s.rss = je_purge;
      t.series.push_back(s);
    }
    return t;
  };
  TraceSpec t3;
  t3.kind = TraceKind::kT3;
  std::vector<TraceFigures> traces = {
      fig(Synthetic(256, 0.9, 0), 1000, 1200, 2000, 1400),  // 1.2x live, 0.86x jemalloc
      fig(Synthetic(64, 0.9, 0), 1000, 1400, 9000, 8000),   // 1.4x live
      fig(t3, 1000, 1450, 1700, 1650),                      // 1.45x live, 0.88x jemalloc
  };
  auto t = EvaluateMemoryTargets(traces);
  ASSERT_EQ(t.size(), 7u);
  EXPECT_EQ(t[3].result, "PASS");
  EXPECT_NEAR(*t[3].ratio, 1450.0 / 1650, 1e-12);
  EXPECT_EQ(*t[3].value, 1450);
  EXPECT_EQ(*t[3].baseline, 1650);  // the better of the two
  EXPECT_EQ(*t[3].limit, 0.9);
  EXPECT_EQ(t[4].result, "PASS");
  EXPECT_NEAR(*t[4].ratio, 1.2, 1e-12);
  EXPECT_EQ(t[5].result, "PASS");
  EXPECT_NEAR(*t[5].ratio, 1.4, 1e-12);
  EXPECT_EQ(t[6].result, "PASS");
  EXPECT_NEAR(*t[6].ratio, 1.45, 1e-12);

  traces[0] = fig(Synthetic(256, 0.9, 0), 1000, 1400, 2000, 1500);  // 1.4x live, 0.93x
  traces[2] = fig(t3, 1000, 1600, 1700, 1650);                      // 1.6x live
  t = EvaluateMemoryTargets(traces);
  EXPECT_EQ(t[3].result, "MISS");
  EXPECT_NEAR(*t[3].ratio, 1600.0 / 1650, 1e-12);
  EXPECT_EQ(t[4].result, "MISS");
  EXPECT_EQ(t[5].result, "PASS");
  EXPECT_EQ(t[6].result, "MISS");

  // The issue judges 1 and 4 threads: a t3 run on 16 threads that misses is shown, not judged.
  TraceSpec t3_16 = t3;
  t3_16.threads = 16;
  traces[0] = fig(Synthetic(256, 0.9, 0), 1000, 1200, 2000, 1400);
  traces[2] = fig(t3, 1000, 1450, 1700, 1650);
  traces.push_back(fig(t3_16, 1000, 1600, 1700, 1650));  // 1.6x live
  t = EvaluateMemoryTargets(traces);
  EXPECT_EQ(t[6].result, "PASS");
  EXPECT_NEAR(*t[6].ratio, 1.45, 1e-12);
  EXPECT_NE(t[6].detail.find("not judged, on 16-32 threads: worst 1.60x"), std::string::npos)
      << t[6].detail;

  // A hybrid run without the trimmed figure, or no malloc baseline, is n/a, not a PASS.
  traces = {fig(Synthetic(256, 0.9, 0), 1000, NAN, 2000, 1400)};
  t = EvaluateMemoryTargets(traces);
  EXPECT_EQ(t[3].result, "n/a");
  EXPECT_EQ(t[4].result, "n/a");
  traces = {fig(Synthetic(256, 0.9, 0), 1000, 1000, NAN, NAN)};
  traces[0].series[7].error = "exit code 1";
  traces[0].series[8].skipped = true;
  traces[0].series[8].error = "not found";
  EXPECT_EQ(EvaluateMemoryTargets(traces)[3].result, "n/a");
}

}  // namespace
}  // namespace farmem::bench
