// Concurrency stress for CoRM: writers publish (sequence, checksum) values, one-sided readers copy
// slots with atomic loads from the (possibly remapped) home address — each copy bracketed by a
// CopyEpoch the merges wait for, as the TCP NIC thread does — and run the consistency check,
// an RPC-path reader uses Store::Read, a churn thread keeps fragmenting, and a compaction loop runs
// throughout. No accepted read may be torn or older than the last write completed before it began.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "common/copy_epoch.h"
#include "objects/engine/compaction.h"

namespace farmem::corm {
namespace {

constexpr size_t kValueSize = 120;  // spans 2-3 cachelines: exercises the line versions
constexpr auto kDuration = std::chrono::milliseconds(1500);

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

// Value: [index u32][pad u32][seq u64][filler ...][checksum u64 over everything before it].
std::vector<uint8_t> MakeValue(uint32_t index, uint64_t seq) {
  std::vector<uint8_t> v(kValueSize);
  std::memcpy(v.data(), &index, 4);
  std::memcpy(v.data() + 8, &seq, 8);
  for (size_t i = 16; i < kValueSize - 8; ++i) v[i] = static_cast<uint8_t>(Mix(seq * 131 + i));
  uint64_t sum = 0;
  for (size_t i = 0; i < kValueSize - 8; ++i) sum = Mix(sum + v[i] + i);
  std::memcpy(v.data() + kValueSize - 8, &sum, 8);
  return v;
}

bool ValidValue(const std::vector<uint8_t>& v, uint32_t* index, uint64_t* seq) {
  uint64_t sum = 0, stored;
  for (size_t i = 0; i < kValueSize - 8; ++i) sum = Mix(sum + v[i] + i);
  std::memcpy(&stored, v.data() + kValueSize - 8, 8);
  std::memcpy(index, v.data(), 4);
  std::memcpy(seq, v.data() + 8, 8);
  return sum == stored;
}

struct Tracked {
  ObjectPtr ptr;                       // as allocated (writers correct their own copy)
  std::atomic<uint64_t> completed{0};  // last sequence whose Write() returned
};

class Stress : public ::testing::TestWithParam<CorrectionMode> {};

TEST_P(Stress, ReadersWritersAndCompaction) {
  StoreOptions o;
  o.block_size = 4096;
  o.id_bits = 16;
  o.workers = 2;
  o.reserve_bytes = 256 << 20;
  o.pool_bytes = 4 << 20;
  o.correction = GetParam();
  o.op_timeout = std::chrono::milliseconds(5000);
  auto s = Store::Create(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Store& st = **s;
  // The one-sided readers below copy store memory without locks, as the TCP NIC thread does:
  // each copy is bracketed by the reader's epoch, and merges wait for copies in progress.
  constexpr int kOneSidedReaders = 2;
  CopyEpoch reader_epochs[kOneSidedReaders];
  const CopyEpoch* readers[] = {&reader_epochs[0], &reader_epochs[1]};
  CompactionOptions co;
  co.max_candidate_occupancy = 1.0;
  co.max_merges_per_round = 8;
  co.lock_timeout = std::chrono::seconds(5);  // a preempted reader must not make merges give up
  co.wait_for_readers = [&](std::chrono::steady_clock::time_point deadline) {
    return WaitForCopies(readers, deadline);
  };
  Compactor comp(st, co);

  // Fragmented start: 4 of every 5 objects freed, the rest tracked.
  std::mt19937_64 rng(5);
  std::vector<ObjectPtr> all;
  for (int i = 0; i < 2500; ++i) {
    auto p = st.Alloc(kValueSize, static_cast<uint32_t>(i % 2));
    ASSERT_TRUE(p.ok());
    all.push_back(*p);
  }
  std::shuffle(all.begin(), all.end(), rng);
  const size_t n = all.size() / 5;
  std::vector<Tracked> objs(n);
  for (size_t i = 0; i < all.size(); ++i) {
    if (i < n) {
      objs[i].ptr = all[i];
      ASSERT_TRUE(st.Write(objs[i].ptr, MakeValue(static_cast<uint32_t>(i), 0)).ok());
    } else {
      ASSERT_TRUE(st.Free(all[i]).ok());
    }
  }
  const uint32_t cls = all[0].size_class;
  const uint32_t slot_size = st.SlotSize(cls);
  const uint16_t mask = st.IdMask(cls);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> accepted{0}, torn_accepted{0}, stale{0}, lost{0}, retries{0},
      corrections{0}, writes{0}, errors{0};
  std::vector<std::thread> threads;

  constexpr int kWriters = 2;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      std::vector<ObjectPtr> mine;
      std::vector<uint64_t> seq;
      for (size_t i = w; i < n; i += kWriters) {
        mine.push_back(objs[i].ptr);
        seq.push_back(0);
      }
      std::mt19937 r(100 + w);
      while (!stop.load(std::memory_order_relaxed)) {
        const size_t k = r() % mine.size();
        const size_t i = w + k * kWriters;
        const uint64_t next = seq[k] + 1;
        Status wst = st.Write(mine[k], MakeValue(static_cast<uint32_t>(i), next));
        if (!wst.ok()) {
          errors.fetch_add(1);
          continue;
        }
        seq[k] = next;
        objs[i].completed.store(next, std::memory_order_release);
        writes.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }

  auto one_sided_reader = [&](int id) {
    std::vector<ObjectPtr> ptrs;
    for (auto& t : objs) ptrs.push_back(t.ptr);
    std::vector<uint8_t> slot(slot_size), value(kValueSize), block(o.block_size);
    std::mt19937 r(200 + id);
    while (!stop.load(std::memory_order_relaxed)) {
      const size_t i = r() % n;
      ObjectPtr& p = ptrs[i];
      const uint64_t floor = objs[i].completed.load(std::memory_order_acquire);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      bool done = false;
      while (!done) {
        SlotCheck c;
        {
          CopyEpoch::Scope copying(reader_epochs[id]);
          c = OneSidedReadSlot(p.addr, p.id, mask, p.size_class, slot);
        }
        if (c == SlotCheck::kOk) {
          DecodePayload(slot, p.addr, value);
          uint32_t index;
          uint64_t seq;
          if (!ValidValue(value, &index, &seq) || index != i) torn_accepted.fetch_add(1);
          if (seq < floor) stale.fetch_add(1);
          accepted.fetch_add(1, std::memory_order_relaxed);
          done = true;
        } else if (c == SlotCheck::kMoved || c == SlotCheck::kFreed) {
          // Scan the home block one-sidedly (it shows wherever the object lives now).
          uint8_t* base = st.blocks().VAddr(p.block);
          {
            CopyEpoch::Scope copying(reader_epochs[id]);
            ReadSlotWords(base, block.data(), block.size());
          }
          const int64_t off = ScanBlockImage(block, slot_size, p.id, mask, p.size_class);
          if (off >= 0) {
            p.addr = reinterpret_cast<uint64_t>(base) + off;
            corrections.fetch_add(1, std::memory_order_relaxed);
          }
          retries.fetch_add(1, std::memory_order_relaxed);
        } else {
          retries.fetch_add(1, std::memory_order_relaxed);
          std::this_thread::yield();
        }
        if (!done && std::chrono::steady_clock::now() > deadline) {
          lost.fetch_add(1);
          done = true;
        }
      }
    }
  };
  for (int id = 0; id < kOneSidedReaders; ++id) threads.emplace_back(one_sided_reader, id);

  // RPC-path reader.
  threads.emplace_back([&] {
    std::vector<ObjectPtr> ptrs;
    for (auto& t : objs) ptrs.push_back(t.ptr);
    std::vector<uint8_t> value(kValueSize);
    std::mt19937 r(300);
    while (!stop.load(std::memory_order_relaxed)) {
      const size_t i = r() % n;
      const uint64_t floor = objs[i].completed.load(std::memory_order_acquire);
      auto got = st.Read(ptrs[i], value);
      if (!got.ok()) {
        lost.fetch_add(1);
        continue;
      }
      uint32_t index;
      uint64_t seq;
      if (!ValidValue(value, &index, &seq) || index != i) torn_accepted.fetch_add(1);
      if (seq < floor) stale.fetch_add(1);
      accepted.fetch_add(1, std::memory_order_relaxed);
    }
  });

  // Churn: allocate and free filler objects of the same class so fragmentation keeps coming.
  threads.emplace_back([&] {
    std::vector<ObjectPtr> fill;
    std::mt19937 r(400);
    while (!stop.load(std::memory_order_relaxed)) {
      if (fill.size() < 300 || r() % 2 == 0) {
        auto p = st.Alloc(kValueSize, r() % 2);
        if (p.ok()) {
          fill.push_back(*p);
        } else {
          errors.fetch_add(1);
        }
      } else {
        const size_t k = r() % fill.size();
        if (!st.Free(fill[k]).ok()) errors.fetch_add(1);
        fill[k] = fill.back();
        fill.pop_back();
      }
    }
    for (auto& p : fill) {
      if (!st.Free(p).ok()) errors.fetch_add(1);
    }
  });

  // Compaction loop.
  threads.emplace_back([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      auto r = comp.CompactClass(cls);
      if (!r.ok()) errors.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  std::this_thread::sleep_for(kDuration);
  stop.store(true);
  for (auto& t : threads) t.join();

  const CompactionStats cs = comp.stats();
  EXPECT_EQ(torn_accepted.load(), 0u);
  EXPECT_EQ(stale.load(), 0u);
  EXPECT_EQ(lost.load(), 0u);
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_GT(accepted.load(), 0u);
  EXPECT_GT(writes.load(), 0u);
  EXPECT_GT(cs.compactions, 0u) << "compaction never ran: the test would prove nothing";
  // Final state: every object holds exactly its last completed write, through its old pointer.
  std::vector<uint8_t> value(kValueSize);
  for (size_t i = 0; i < n; ++i) {
    ObjectPtr p = objs[i].ptr;
    auto got = st.Read(p, value);
    ASSERT_TRUE(got.ok()) << "object " << i << ": " << got.status().ToString();
    uint32_t index;
    uint64_t seq;
    ASSERT_TRUE(ValidValue(value, &index, &seq)) << "object " << i << " corrupted";
    EXPECT_EQ(index, i);
    EXPECT_EQ(seq, objs[i].completed.load());
  }
  EXPECT_EQ(st.Stats().live_objects, n);
  RecordProperty("accepted", std::to_string(accepted.load()));
  RecordProperty("compactions", std::to_string(cs.compactions));
  std::printf(
      "accepted %llu writes %llu retries %llu corrections %llu compactions %llu moved %llu\n",
      (unsigned long long)accepted.load(), (unsigned long long)writes.load(),
      (unsigned long long)retries.load(), (unsigned long long)corrections.load(),
      (unsigned long long)cs.compactions, (unsigned long long)cs.objects_relocated);
}

INSTANTIATE_TEST_SUITE_P(Correction, Stress,
                         ::testing::Values(CorrectionMode::kAskOwner, CorrectionMode::kScan));

}  // namespace
}  // namespace farmem::corm
