// Concurrency stress for CoRM: writers publish (sequence, checksum) values, one-sided readers copy
// slots with atomic loads from the (possibly remapped) home address — each copy bracketed by a
// CopyEpoch the merges wait for, as the TCP NIC thread does — and run the consistency check,
// an RPC-path reader uses Store::Read, a churn thread keeps fragmenting, and a compaction loop runs
// throughout. No accepted read may be torn or older than the last write completed before it began.
// Ownership stress: allocating threads open and close sessions (owners) while compaction runs; a
// closer thread frees each closed session's objects with FreeOwned meanwhile.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/copy_epoch.h"
#include "objects/engine/compaction.h"
#include "objects/engine/engine_test_util.h"

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

struct StressCase {
  CorrectionMode correction;
  // 16: merges rarely collide (30 slots per block, 65536 IDs). 8: most merges collide and
  // re-draw IDs (docs/objects.md, "Merges that re-draw IDs").
  int id_bits;
  // Readers start every read from the pointer as allocated, never from a corrected one, so
  // reads of re-drawn objects go through their old IDs while merges run.
  bool old_pointers;
};

class Stress : public ::testing::TestWithParam<StressCase> {};

TEST_P(Stress, ReadersWritersAndCompaction) {
  const StressCase sc = GetParam();
  StoreOptions o;
  o.block_size = 4096;
  o.id_bits = sc.id_bits;
  o.workers = 2;
  o.reserve_bytes = 256 << 20;
  o.pool_bytes = 4 << 20;
  o.correction = sc.correction;
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
  engine_testing::ApplyObjectsFault(co);
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
  std::atomic<uint64_t> accepted{0}, torn_accepted{0}, wrong_object{0}, stale{0}, lost{0},
      retries{0}, corrections{0}, located{0}, writes{0}, errors{0};
  // A copy with a valid checksum is torn-free; it must also be the object read.
  auto check_value = [&](const std::vector<uint8_t>& value, size_t i, uint64_t floor) {
    uint32_t index;
    uint64_t seq;
    if (!ValidValue(value, &index, &seq)) {
      torn_accepted.fetch_add(1);
    } else if (index != i) {
      wrong_object.fetch_add(1);
    } else if (seq < floor) {
      stale.fetch_add(1);
    }
    accepted.fetch_add(1, std::memory_order_relaxed);
  };
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
      if (sc.old_pointers) p = objs[i].ptr;
      const uint64_t floor = objs[i].completed.load(std::memory_order_acquire);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      bool done = false;
      while (!done) {
        // The checks a client makes (ObjectClient::direct_read): the whole tag (ID and
        // generation bits) and the home block.
        const uint16_t tag = TagOf(p.id, p.gen, mask);
        SlotCheck c;
        {
          CopyEpoch::Scope copying(reader_epochs[id]);
          c = OneSidedReadSlot(p.addr, tag, hdr::kTagMask, p.size_class, slot);
        }
        if (c == SlotCheck::kOk && Header::Unpack(LoadHeader(slot.data())).home_block != p.block) {
          c = SlotCheck::kMoved;
        }
        if (c == SlotCheck::kOk) {
          DecodePayload(slot, p.addr, value);
          check_value(value, i, floor);
          done = true;
        } else if (c == SlotCheck::kMoved || c == SlotCheck::kFreed) {
          // Scan the home block one-sidedly (it shows wherever the object lives now).
          uint8_t* base = st.blocks().VAddr(p.block);
          {
            CopyEpoch::Scope copying(reader_epochs[id]);
            ReadSlotWords(base, block.data(), block.size());
          }
          const int64_t off =
              ScanBlockImage(block, slot_size, tag, hdr::kTagMask, p.size_class, p.block);
          if (off >= 0) {
            p.addr = reinterpret_cast<uint64_t>(base) + off;
            corrections.fetch_add(1, std::memory_order_relaxed);
          } else {
            // Not in the scan: a merge re-drew its ID. Ask the store, as read_any does.
            auto q = st.Locate(p, CorrectionMode::kAskOwner);
            if (q.ok()) {
              p = *q;
              located.fetch_add(1, std::memory_order_relaxed);
            } else if (q.status().code() != Code::kTimedOut) {
              lost.fetch_add(1);
              done = true;
            }
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
      if (sc.old_pointers) ptrs[i] = objs[i].ptr;
      auto got = st.Read(ptrs[i], value);
      if (!got.ok()) {
        lost.fetch_add(1);
        continue;
      }
      check_value(value, i, floor);
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
  EXPECT_EQ(wrong_object.load(), 0u) << "a read returned another object's bytes";
  EXPECT_EQ(stale.load(), 0u);
  EXPECT_EQ(lost.load(), 0u);
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_GT(accepted.load(), 0u);
  EXPECT_GT(writes.load(), 0u);
  EXPECT_GT(cs.compactions, 0u) << "compaction never ran: the test would prove nothing";
  if (sc.id_bits == 8) {
    EXPECT_GT(cs.ids_redrawn, 0u) << "no merge re-drew an ID: the test would prove nothing";
  }
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
      "accepted %llu writes %llu retries %llu corrections %llu located %llu compactions %llu "
      "moved %llu IDs re-drawn %llu\n",
      (unsigned long long)accepted.load(), (unsigned long long)writes.load(),
      (unsigned long long)retries.load(), (unsigned long long)corrections.load(),
      (unsigned long long)located.load(), (unsigned long long)cs.compactions,
      (unsigned long long)cs.objects_relocated, (unsigned long long)cs.ids_redrawn);
}

INSTANTIATE_TEST_SUITE_P(Correction, Stress,
                         ::testing::Values(StressCase{CorrectionMode::kAskOwner, 16, false},
                                           StressCase{CorrectionMode::kScan, 16, false},
                                           StressCase{CorrectionMode::kAskOwner, 8, true},
                                           StressCase{CorrectionMode::kScan, 8, true}),
                         [](const ::testing::TestParamInfo<StressCase>& info) {
                           return std::string(info.param.correction == CorrectionMode::kScan
                                                  ? "Scan"
                                                  : "AskOwner") +
                                  "Ids" + std::to_string(info.param.id_bits) +
                                  (info.param.old_pointers ? "OldPointers" : "");
                         });

// Deterministic bytes of object `key` (n of them).
std::vector<uint8_t> KeyBytes(uint64_t key, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(Mix(key * 1000003 + i));
  return v;
}

struct OwnedObj {
  ObjectPtr ptr;
  uint64_t key;
  size_t size;
};

struct Session {
  OwnerId owner;
  std::vector<OwnedObj> objs;  // live when the session was closed
};

// Allocating threads allocate and free objects of their open sessions (owners) and persistent
// ones, and now and then close a session: they stop allocating for it and hand it to a closer
// thread, which calls FreeOwned while the others keep allocating and compaction keeps moving
// objects between blocks. At the end: no object of a closed session is left (count 0, and every
// one of its pointers NotFound), every other object holds its own bytes, and StoreStats adds up.
TEST(StressOwnership, SessionsFreedWhileAllocatingAndCompacting) {
  StoreOptions o;
  o.block_size = 4096;
  o.id_bits = 16;
  o.workers = 2;
  o.reserve_bytes = 256 << 20;
  o.pool_bytes = 4 << 20;
  o.op_timeout = std::chrono::milliseconds(5000);
  // No virtual block is reused during the test, so a freed object's pointer must stay NotFound
  // (with reuse by another class it would be InvalidArgument, which says nothing about FreeOwned).
  o.vblock_quarantine = (256 << 20) / 4096;
  auto s = Store::Create(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Store& st = **s;
  CompactionOptions co;
  co.max_candidate_occupancy = 1.0;
  co.max_merges_per_round = 16;
  co.lock_timeout = std::chrono::seconds(5);
  Compactor comp(st, co);

  std::atomic<bool> stop{false};
  std::atomic<uint32_t> next_owner{1};
  std::atomic<uint64_t> errors{0}, freed_total{0}, free_owned_calls{0};
  std::mutex err_mu;
  std::string first_error;
  auto fail = [&](const std::string& what) {
    errors.fetch_add(1);
    std::lock_guard<std::mutex> lock(err_mu);
    if (first_error.empty()) first_error = what;
  };

  std::mutex q_mu;
  std::condition_variable q_cv;
  std::deque<Session> closing;
  bool allocators_done = false;
  std::vector<Session> closed;  // closer thread only, read after join

  constexpr int kAllocators = 3;
  constexpr size_t kOpen = 3;
  std::vector<std::vector<Session>> open(kAllocators);         // per thread, read after join
  std::vector<std::vector<OwnedObj>> persistent(kAllocators);  // per thread, read after join
  const size_t sizes[] = {24, 100, 230};
  std::vector<std::thread> allocators;
  for (int t = 0; t < kAllocators; ++t) {
    allocators.emplace_back([&, t] {
      std::mt19937_64 r(1000 + t);
      auto& sessions = open[t];
      auto& mine = persistent[t];
      uint64_t seq = 0;
      while (sessions.size() < kOpen) sessions.push_back({static_cast<OwnerId>(next_owner++), {}});
      size_t live = 0;  // objects this thread holds (bounded: the heap stays small)
      while (!stop.load(std::memory_order_relaxed)) {
        const uint64_t dice = r() % 1000;
        if (dice < 520 && live < 1500) {
          // Allocate for an open session (or, 1 in 5, a persistent object) and write its bytes.
          const bool pers = r() % 5 == 0;
          Session& sess = sessions[r() % sessions.size()];
          const OwnerId owner = pers ? kPersistentOwner : sess.owner;
          const size_t n = sizes[r() % 3];
          const uint64_t key = (uint64_t(t) << 40) | seq++;
          auto p = st.Alloc(n, static_cast<uint32_t>(r() % 2), owner);
          if (!p.ok()) {
            fail("alloc: " + p.status().ToString());
            continue;
          }
          ObjectPtr q = *p;
          Status w = st.Write(q, KeyBytes(key, n));
          if (!w.ok()) fail("write: " + w.ToString());
          (pers ? mine : sess.objs).push_back({*p, key, n});
          ++live;
        } else if (dice < 995) {
          // Free one (fragmentation for the compactor).
          auto& v = r() % 5 == 0 ? mine : sessions[r() % sessions.size()].objs;
          if (v.empty()) continue;
          const size_t k = r() % v.size();
          Status f = st.Free(v[k].ptr);
          if (!f.ok()) fail("free: " + f.ToString());
          v[k] = v.back();
          v.pop_back();
          --live;
        } else if (next_owner.load() < 60000) {  // OwnerId must not wrap to kPersistentOwner
          // Close a session: no allocation for it from now on; hand it to the closer.
          const size_t k = r() % sessions.size();
          live -= sessions[k].objs.size();
          Session done = std::move(sessions[k]);
          sessions[k] = {static_cast<OwnerId>(next_owner++), {}};
          {
            // Back-pressure: the closer keeps up (a few sessions queued at most).
            std::unique_lock<std::mutex> lock(q_mu);
            q_cv.wait(lock, [&] { return closing.size() < 4; });
            closing.push_back(std::move(done));
          }
          q_cv.notify_all();
        }
      }
    });
  }

  std::thread closer([&] {
    std::vector<uint8_t> out(256);
    while (true) {
      Session sess;
      {
        std::unique_lock<std::mutex> lock(q_mu);
        q_cv.wait(lock, [&] { return !closing.empty() || allocators_done; });
        if (closing.empty()) return;
        sess = std::move(closing.front());
        closing.pop_front();
      }
      q_cv.notify_all();
      auto n = st.FreeOwned(sess.owner);
      free_owned_calls.fetch_add(1);
      if (!n.ok()) {
        fail("FreeOwned(" + std::to_string(sess.owner) + "): " + n.status().ToString());
      } else if (*n != sess.objs.size()) {
        fail("FreeOwned(" + std::to_string(sess.owner) + ") freed " + std::to_string(*n) +
             ", the session had " + std::to_string(sess.objs.size()));
      } else {
        freed_total.fetch_add(*n);
      }
      if (st.OwnedObjects(sess.owner) != 0) fail("owner still counts objects after FreeOwned");
      for (const OwnedObj& x : sess.objs) {
        ObjectPtr q = x.ptr;
        auto rd = st.Read(q, std::span<uint8_t>(out.data(), x.size));
        if (rd.status().code() != Code::kNotFound) {
          fail("object of a freed session: read gives " + rd.status().ToString());
        }
      }
      closed.push_back(std::move(sess));
    }
  });

  std::thread compactor([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      auto r = comp.CompactAll();
      if (!r.ok()) fail("compaction: " + r.status().ToString());
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  std::this_thread::sleep_for(kDuration);
  stop.store(true);
  for (auto& t : allocators) t.join();
  {
    std::lock_guard<std::mutex> lock(q_mu);
    allocators_done = true;
  }
  q_cv.notify_all();
  closer.join();
  compactor.join();

  EXPECT_EQ(errors.load(), 0u) << first_error;
  const CompactionStats cs = comp.stats();
  EXPECT_GT(cs.compactions, 0u) << "compaction never ran: the test would prove nothing";
  EXPECT_GT(free_owned_calls.load(), 0u);
  // Freed sessions: nothing left, every pointer NotFound on the RPC paths.
  std::vector<uint8_t> out(256);
  for (const Session& sess : closed) {
    EXPECT_EQ(st.OwnedObjects(sess.owner), 0u) << "owner " << sess.owner;
    for (const OwnedObj& x : sess.objs) {
      ObjectPtr q = x.ptr;
      ASSERT_EQ(st.Read(q, std::span<uint8_t>(out.data(), x.size)).status().code(),
                Code::kNotFound);
      ASSERT_EQ(st.Locate(x.ptr, CorrectionMode::kAskOwner).status().code(), Code::kNotFound);
    }
  }
  // Survivors: open sessions' and persistent objects hold their own bytes.
  uint64_t owned = 0, pers = 0;
  auto check = [&](const OwnedObj& x) {
    ObjectPtr q = x.ptr;
    auto rd = st.Read(q, std::span<uint8_t>(out.data(), x.size));
    ASSERT_TRUE(rd.ok()) << rd.status().ToString();
    ASSERT_EQ(std::vector<uint8_t>(out.begin(), out.begin() + x.size), KeyBytes(x.key, x.size));
  };
  for (int t = 0; t < kAllocators; ++t) {
    for (const Session& sess : open[t]) {
      EXPECT_EQ(st.OwnedObjects(sess.owner), sess.objs.size()) << "owner " << sess.owner;
      for (const OwnedObj& x : sess.objs) check(x);
      owned += sess.objs.size();
    }
    for (const OwnedObj& x : persistent[t]) check(x);
    pers += persistent[t].size();
  }
  const StoreStats ss = st.Stats();
  EXPECT_EQ(ss.live_objects, owned + pers);
  EXPECT_EQ(ss.owned_objects, owned);
  EXPECT_EQ(ss.persistent_objects, pers);
  EXPECT_EQ(st.OwnedObjects(kPersistentOwner), pers);
  std::printf(
      "sessions freed %llu objects freed by FreeOwned %llu survivors %llu compactions %llu "
      "moved %llu\n",
      (unsigned long long)free_owned_calls.load(), (unsigned long long)freed_total.load(),
      (unsigned long long)(owned + pers), (unsigned long long)cs.compactions,
      (unsigned long long)cs.objects_copied);
}

}  // namespace
}  // namespace farmem::corm
