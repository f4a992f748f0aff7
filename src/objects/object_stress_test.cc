// Stress test of one-sided reads under concurrent writes and compaction (the required
// test). Writers RPC-write self-checking values (object index, sequence number, checksum);
// readers direct_read / read_any them; a churn thread frees and allocates filler objects and runs
// compaction rounds. Every accepted read must carry a valid checksum, the right index, and a
// sequence number no older than the last write completed before the read began. Runs
// FARMEM_STRESS_SECONDS (default 5) per backend.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "objects/object_test_util.h"

namespace farmem {
namespace {

using objects_test::ObjectEnv;
using Clock = std::chrono::steady_clock;

constexpr size_t kValueSize = 120;  // spans two or three cachelines of its slot
constexpr int kTracked = 128;       // objects whose contents are checked
constexpr int kFillersPerTracked = 3;
constexpr int kWriters = 2;
constexpr int kLanes = 4;  // operations in flight per writer/reader thread (coroutines)
constexpr int kHot = kWriters * kLanes;  // objects 0..kHot-1 are the lanes' first objects
constexpr uint64_t kMinRounds = 3;       // churn + compaction rounds the run must complete

double StressSeconds() {
  const char* env = std::getenv("FARMEM_STRESS_SECONDS");
  if (env == nullptr) return 5.0;
  const double s = std::atof(env);
  return s > 0 ? s : 5.0;
}

// Collects failures from many threads; the first few messages are kept for the report.
class Failures {
 public:
  void Add(const std::string& msg) {
    count_.fetch_add(1);
    std::lock_guard lock(mu_);
    if (messages_.size() < 10) messages_.push_back(msg);
  }
  uint64_t count() const { return count_.load(); }
  std::string Report() const {
    std::lock_guard lock(mu_);
    std::string out;
    for (const auto& m : messages_) out += m + "\n";
    return out;
  }

 private:
  std::atomic<uint64_t> count_{0};
  mutable std::mutex mu_;
  std::vector<std::string> messages_;
};

class ObjectStress : public ::testing::TestWithParam<std::string> {};

TEST_P(ObjectStress, ReadsStayConsistentUnderWritesAndCompaction) {
  ObjectsConfig cfg = ObjectEnv::DefaultObjects();
  auto env = ObjectEnv::Start(GetParam(), cfg);
  ASSERT_TRUE(env->server);
  ObjectClientOptions scan_opts;
  scan_opts.correction = Correction::kScan;
  ObjectClientOptions owner_opts;
  owner_opts.correction = Correction::kAskOwner;
  auto scan_client = env->Connect(scan_opts);
  auto owner_client = env->Connect(owner_opts);
  ASSERT_TRUE(scan_client.ok()) << scan_client.status().ToString();
  ASSERT_TRUE(owner_client.ok()) << owner_client.status().ToString();
  ObjectClient& sc = **scan_client;
  ObjectClient& oc = **owner_client;

  // Tracked objects interleaved with fillers of the same class, so freeing fillers leaves the
  // tracked objects' blocks fragmented and compaction has to move them.
  std::vector<Ptr> tracked(kTracked);
  std::vector<Ptr> fillers;
  for (int i = 0; i < kTracked; ++i) {
    Result<Ptr> a = sc.alloc(kValueSize);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    tracked[i] = *a;
    auto v = objects_test::MakeValue(kValueSize, i, 0);
    ASSERT_TRUE(sc.write(tracked[i], v).ok());
    for (int f = 0; f < kFillersPerTracked; ++f) {
      Result<Ptr> b = sc.alloc(kValueSize);
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      fillers.push_back(*b);
    }
  }
  // completed[i]: sequence number of the last write of object i that has returned OK.
  std::vector<std::atomic<uint64_t>> completed(kTracked);
  for (auto& c : completed) c.store(0);

  Failures failures;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, writes{0}, merges{0}, churn_ops{0};
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(StressSeconds()));

  // Writers: kWriters threads with kLanes coroutines each, all with one write in flight. Object
  // i belongs to one lane only (thread i % kWriters, lane i / kWriters % kLanes), so its
  // sequence numbers only grow and a lane's Ptr copies are corrected by that lane alone.
  auto write_lane = [](ObjectClient* c, Scheduler* s, std::vector<Ptr> ptrs, int w, int lane,
                       std::atomic<bool>* stop, std::vector<std::atomic<uint64_t>>* completed,
                       std::atomic<uint64_t>* writes, Failures* failures) -> Task<void> {
    std::vector<int> mine;
    for (int i = 0; i < kTracked; ++i) {
      if (i % kWriters == w && (i / kWriters) % kLanes == lane) mine.push_back(i);
    }
    std::vector<uint64_t> seq(kTracked, 0);
    std::mt19937_64 rng(1000 + w * kLanes + lane);
    while (!stop->load() && !mine.empty()) {
      // Half of the writes go to the lane's hot object (its first), so reads and writes of the
      // same slot overlap often enough to exercise the torn/locked checks.
      const int i = (rng() & 1) ? mine.front() : mine[rng() % mine.size()];
      const auto v = objects_test::MakeValue(kValueSize, i, ++seq[i]);
      Status st = co_await c->write(*s, ptrs[i], v);
      if (!st.ok()) {
        failures->Add("write " + std::to_string(i) + ": " + st.ToString());
        continue;
      }
      (*completed)[i].store(seq[i], std::memory_order_release);
      writes->fetch_add(1);
    }
  };
  auto writer = [&](int w) {
    auto made = env->node->make_scheduler();
    if (!made.ok()) return failures.Add("writer scheduler: " + made.status().ToString());
    Scheduler& s = **made;
    for (int lane = 0; lane < kLanes; ++lane) {
      s.spawn(write_lane(&sc, &s, tracked, w, lane, &stop, &completed, &writes, &failures));
    }
    Status ran = s.run(std::chrono::minutes(2));
    if (!ran.ok()) failures.Add("writer: " + ran.ToString());
  };

  // Readers: mode 0 direct_read (scan_read on Moved), 1 read_any with scan, 2 read_any asking
  // the owner; kLanes coroutines per thread, each with its own Ptr copies (a Ptr is corrected
  // in place, so two reads in flight must not share one).
  auto read_lane = [&](ObjectClient* c, Scheduler* s, int mode, int lane) -> Task<void> {
    std::vector<Ptr> ptrs = tracked;
    std::vector<std::byte> out(kValueSize);
    std::mt19937_64 rng(2000 + mode * kLanes + lane);
    while (!stop.load()) {
      // Half of the reads hit the hot objects 0..kHot-1 (each one some lane's hot object).
      const int i = static_cast<int>((rng() & 1) ? rng() % kHot : rng() % kTracked);
      const uint64_t floor = completed[i].load(std::memory_order_acquire);
      Result<size_t> r = Status::Internal("unset");
      if (mode == 0) {
        r = co_await c->direct_read(*s, ptrs[i], out);
        if (!r.ok() && r.status().code() == Code::kMoved) {
          r = co_await c->scan_read(*s, ptrs[i], out);
        }
      } else {
        r = co_await c->read_any(*s, ptrs[i], out);
      }
      if (!r.ok()) {
        failures.Add("reader " + std::to_string(mode) + " object " + std::to_string(i) + ": " +
                     r.status().ToString());
        continue;
      }
      const auto v = objects_test::CheckValue(out);
      if (!v.checksum_ok || v.index != static_cast<uint64_t>(i) || v.seq < floor) {
        failures.Add("reader " + std::to_string(mode) + " object " + std::to_string(i) +
                     ": accepted a bad value (checksum " + (v.checksum_ok ? "ok" : "BAD") +
                     ", index " + std::to_string(v.index) + ", seq " + std::to_string(v.seq) +
                     ", completed before the read " + std::to_string(floor) + ")");
      }
      reads.fetch_add(1);
    }
  };
  auto reader = [&](int mode) {
    auto made = env->node->make_scheduler();
    if (!made.ok()) return failures.Add("reader scheduler: " + made.status().ToString());
    Scheduler& s = **made;
    for (int lane = 0; lane < kLanes; ++lane) {
      s.spawn(read_lane(mode == 2 ? &oc : &sc, &s, mode, lane));
    }
    Status ran = s.run(std::chrono::minutes(2));
    if (!ran.ok()) failures.Add("reader: " + ran.ToString());
  };

  // Churn: free half of the fillers at random, compact, allocate as many again, repeat. Frees
  // and allocs of one batch are in flight together (coroutines on one scheduler) so a round stays
  // short even when every RPC is slow on a loaded machine.
  auto churn = [&] {
    auto made = env->node->make_scheduler();
    if (!made.ok()) return failures.Add("churn scheduler: " + made.status().ToString());
    Scheduler& s = **made;
    std::mt19937_64 rng(3000);
    std::vector<Ptr> mine = fillers;
    auto free_one = [](ObjectClient* c, Scheduler* s, Ptr p, Failures* f) -> Task<void> {
      Status st = co_await c->free(*s, p);
      if (!st.ok()) f->Add("churn free: " + st.ToString());
    };
    auto alloc_one = [](ObjectClient* c, Scheduler* s, std::vector<Ptr>* out,
                        Failures* f) -> Task<void> {
      Result<Ptr> a = co_await c->alloc(*s, kValueSize);
      if (!a.ok()) {
        f->Add("churn alloc: " + a.status().ToString());
      } else {
        out->push_back(*a);
      }
    };
    while (!stop.load()) {
      std::shuffle(mine.begin(), mine.end(), rng);
      const size_t keep = mine.size() / 2;
      for (size_t k = keep; k < mine.size(); ++k) s.spawn(free_one(&sc, &s, mine[k], &failures));
      mine.resize(keep);
      Status ran = s.run(std::chrono::seconds(30));
      if (!ran.ok()) return failures.Add("churn frees: " + ran.ToString());
      Result<CompactResult> c = s.block_on(sc.compact(s, 0));
      if (!c.ok()) {
        failures.Add("compact: " + c.status().ToString());
      } else {
        merges.fetch_add(c->merges);
      }
      const size_t missing = fillers.size() - mine.size();
      for (size_t k = 0; k < missing; ++k) s.spawn(alloc_one(&sc, &s, &mine, &failures));
      ran = s.run(std::chrono::seconds(30));
      if (!ran.ok()) return failures.Add("churn allocs: " + ran.ToString());
      churn_ops.fetch_add(1);
    }
  };

  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) threads.emplace_back(writer, w);
  for (int m = 0; m < 3; ++m) threads.emplace_back(reader, m);
  threads.emplace_back(churn);
  // Run for the configured time, but at least kMinRounds compaction rounds (a heavily loaded
  // machine can make RPCs slow), capped at three times the configured time.
  const auto hard_stop = deadline + 2 * (deadline - Clock::now());
  while (failures.count() == 0 && Clock::now() < hard_stop &&
         (Clock::now() < deadline || churn_ops.load() < kMinRounds)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop.store(true);
  for (auto& t : threads) t.join();

  EXPECT_EQ(failures.count(), 0u) << failures.Report();
  // The run must have exercised what it claims to test.
  EXPECT_GT(reads.load(), 100u);
  EXPECT_GT(writes.load(), 100u);
  EXPECT_GE(churn_ops.load(), kMinRounds);
  EXPECT_GT(merges.load(), 0u) << "compaction never merged a block";
  const ObjectClientStats ss = sc.stats(), os = oc.stats();
  EXPECT_GT(ss.moved + os.moved, 0u) << "no reader ever saw a moved object";

  // Final check: every tracked object holds exactly the last completed write.
  std::vector<std::byte> out(kValueSize);
  for (int i = 0; i < kTracked; ++i) {
    Ptr p = tracked[i];
    Result<size_t> r = sc.read_any(p, out);
    ASSERT_TRUE(r.ok()) << i << ": " << r.status().ToString();
    const auto v = objects_test::CheckValue(out);
    EXPECT_TRUE(v.checksum_ok) << i;
    EXPECT_EQ(v.index, static_cast<uint64_t>(i));
    EXPECT_EQ(v.seq, completed[i].load()) << i;
  }
  std::printf(
      "[stress %s] %.1f s: %llu reads, %llu writes, %llu merges, %llu churn rounds; scan client "
      "moved %llu corrected %llu torn %llu locked %llu; owner client moved %llu corrected %llu\n",
      GetParam().c_str(), StressSeconds(), (unsigned long long)reads.load(),
      (unsigned long long)writes.load(), (unsigned long long)merges.load(),
      (unsigned long long)churn_ops.load(), (unsigned long long)ss.moved,
      (unsigned long long)ss.corrections, (unsigned long long)ss.torn_retries,
      (unsigned long long)ss.locked_retries, (unsigned long long)os.moved,
      (unsigned long long)os.corrections);
}

INSTANTIATE_TEST_SUITE_P(Backends, ObjectStress, ::testing::Values("tcp", "fabric:shm"),
                         [](const auto& info) {
                           return info.param == "tcp" ? std::string("tcp")
                                                      : std::string("fabric_shm");
                         });

}  // namespace
}  // namespace farmem
