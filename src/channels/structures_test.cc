// RingBuffer, SharedQueue and KvStore across three in-process nodes (tcp and fabric:shm), one
// ChannelThread per OS thread; the kvstore history is checked for linearizability by Porcupine
// (tests/porcupine). FARMEM_CHANNELS_FAULT=ring_checksum|ring_backpressure|queue_wait|kv_acks|
// kv_update_fence removes one protection and the matching test fails (docs/channels.md).
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "channels/channels_faults.h"
#include "channels/channels_test_util.h"

namespace farmem::channels {
namespace {

using namespace std::chrono_literals;
using testing_util::Fault;
using Clock = std::chrono::steady_clock;

class StructuresTest : public testing_util::ChannelsTest {};

// ---- RingBuffer --------------------------------------------------------------------------------

constexpr size_t kRingMax = 1024;

// Record k (1-based): its length and bytes, a function of k only, so a consumer can tell a lost,
// repeated, reordered or torn record.
size_t RecordLen(uint64_t k) {
  return 1 + (k * 37) % kRingMax;
}
void FillRecord(uint64_t k, uint8_t* out) {
  for (size_t j = 0; j < RecordLen(k); j++)
    out[j] = static_cast<uint8_t>(k * 131 + j * 7 + k / 256);
}

TEST_P(StructuresTest, RingBufferBackPressureAndErrors) {
  START_ALL_OR_SKIP();
  std::vector<RingBuffer> rings;
  for (NodeId n = 1; n <= 3; n++) {
    auto r = RingBuffer::Open(*M(n).thr, "ring/bp", 1, {1, 2, 3}, 4, 16);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    rings.push_back(std::move(*r));
  }
  for (auto& r : rings) ASSERT_TRUE(r.wait_ready(5s).ok());
  auto& prod = *M(1).thr;
  uint8_t buf[16] = {};
  EXPECT_EQ(rings[0].push(prod, buf, 0, 1s).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(rings[0].push(prod, buf, 17, 1s).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(rings[1].push(*M(2).thr, buf, 1, 1s).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(rings[0].pop(prod, buf, 16, 0ms).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(rings[1].pop(*M(2).thr, buf, 16, 0ms).status().code(), Code::kTimedOut);  // empty
  for (uint8_t i = 1; i <= 4; i++) {
    buf[0] = i;
    auto seq = rings[0].push(prod, buf, 1, 1s);
    ASSERT_TRUE(seq.ok()) << seq.status().ToString();
    EXPECT_EQ(*seq, i);
  }
  // Full: nobody released anything. The push is refused at its deadline, naming both consumers.
  buf[0] = 5;
  auto full = rings[0].push(prod, buf, 1, 200ms);
  EXPECT_EQ(full.status().code(), Code::kTimedOut);
  EXPECT_NE(full.status().ToString().find("consumers 2,3"), std::string::npos)
      << full.status().ToString();
  // Consumer 2 takes one: still full for consumer 3.
  auto len = rings[1].pop(*M(2).thr, buf, 16, 1s);
  ASSERT_TRUE(len.ok()) << len.status().ToString();
  EXPECT_EQ(buf[0], 1);
  ASSERT_TRUE(M(2).thr->fence_thread(5s).ok());
  full = rings[0].push(prod, buf, 1, 200ms);
  EXPECT_EQ(full.status().code(), Code::kTimedOut);
  EXPECT_NE(full.status().ToString().find("consumers 3 "), std::string::npos)
      << full.status().ToString();
  len = rings[2].pop(*M(3).thr, buf, 16, 1s);
  ASSERT_TRUE(len.ok());
  EXPECT_EQ(buf[0], 1);
  ASSERT_TRUE(M(3).thr->fence_thread(5s).ok());
  buf[0] = 5;
  auto seq = rings[0].push(prod, buf, 1, 1s);
  ASSERT_TRUE(seq.ok()) << seq.status().ToString();
  EXPECT_EQ(*seq, 5u);
  // Every consumer then reads 2..5 in order.
  for (NodeId n = 2; n <= 3; n++) {
    for (uint8_t want = 2; want <= 5; want++) {
      auto l = rings[n - 1].pop(*M(n).thr, buf, 16, 1s);
      ASSERT_TRUE(l.ok()) << "node " << n << " record " << int(want) << ": "
                          << l.status().ToString();
      EXPECT_EQ(buf[0], want);
    }
  }
  // The producer sees everything released.
  ASSERT_TRUE(M(2).thr->fence_thread(5s).ok());
  ASSERT_TRUE(M(3).thr->fence_thread(5s).ok());
  EXPECT_TRUE(rings[0].wait_released(prod, 5, 1s).ok());
  EXPECT_EQ(rings[0].wait_released(prod, 6, 100ms).code(), Code::kTimedOut);
}

// One producer, two consumers on their own threads, 8 slots, 1000 records of 1..1024 bytes: every
// consumer gets every record exactly once, in order, intact; the slots wrap 125 times and the
// consumers' random pauses make the producer wait (back-pressure). The producer's writes are
// placed in two parts (test hook), so half-written records are there to be seen.
TEST_P(StructuresTest, RingBufferExactlyOnceInOrderNeverTornStress) {
  START_ALL_OR_SKIP();
  const bool no_checksum = Fault("ring_checksum");
  const bool no_backpressure = Fault("ring_backpressure");
  if (no_checksum) testing::SetRingChecksumDisabled(true);
  if (no_backpressure) testing::SetRingBackpressureDisabled(true);
  constexpr uint64_t kRecords = 1000;
  std::vector<RingBuffer> rings;
  for (NodeId n = 1; n <= 3; n++) {
    auto r = RingBuffer::Open(*M(n).thr, "ring/stress", 1, {1, 2, 3}, 8, kRingMax);
    ASSERT_TRUE(r.ok());
    rings.push_back(std::move(*r));
  }
  for (auto& r : rings) ASSERT_TRUE(r.wait_ready(5s).ok());
  std::atomic<uint64_t> bad{0}, errors{0};
  std::vector<std::thread> consumers;
  for (NodeId n = 2; n <= 3; n++) {
    consumers.emplace_back([&, n] {
      std::mt19937 rng(n);
      auto& thr = *M(n).thr;
      uint8_t got[kRingMax], want[kRingMax];
      for (uint64_t k = 1; k <= kRecords; k++) {
        if (rng() % 64 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
        auto len = rings[n - 1].pop(thr, got, sizeof(got), 10s);
        if (!len.ok()) {
          if (errors++ == 0) ADD_FAILURE() << "node " << n << ": " << len.status().ToString();
          return;
        }
        FillRecord(k, want);
        if (*len != RecordLen(k) || std::memcmp(got, want, *len) != 0) bad++;
      }
      EXPECT_TRUE(thr.fence_thread(5s).ok());
    });
  }
  // The producer's writes land in two parts (seq first), so a consumer polling the slot does see
  // half-written records: only the checksum keeps them out.
  M(1).thr->testing_tear_writes(5us);
  uint8_t rec[kRingMax];
  for (uint64_t k = 1; k <= kRecords && errors.load() == 0; k++) {
    FillRecord(k, rec);
    auto seq = rings[0].push(*M(1).thr, rec, RecordLen(k), 10s);
    ASSERT_TRUE(seq.ok()) << seq.status().ToString();
    ASSERT_EQ(*seq, k);
  }
  for (auto& t : consumers) t.join();
  testing::SetRingChecksumDisabled(false);
  testing::SetRingBackpressureDisabled(false);
  std::printf("ringbuffer: %llu records x 2 consumers, %llu wrong, %llu errors\n",
              static_cast<unsigned long long>(kRecords),
              static_cast<unsigned long long>(bad.load()),
              static_cast<unsigned long long>(errors.load()));
  EXPECT_EQ(bad.load(), 0u) << "records lost, repeated, reordered or torn";
  EXPECT_EQ(errors.load(), 0u);
}

// ---- SharedQueue -------------------------------------------------------------------------------

TEST_P(StructuresTest, SharedQueueFifoFullAndEmpty) {
  START_ALL_OR_SKIP();
  std::vector<SharedQueue> qs;
  for (NodeId n = 1; n <= 3; n++) {
    auto q = SharedQueue::Open(*M(n).thr, "queue/unit", 2, {1, 2, 3}, 5);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    qs.push_back(*q);
  }
  for (auto& q : qs) ASSERT_TRUE(q.wait_ready(5s).ok());
  EXPECT_EQ(qs[0].pop(*M(1).thr, 1s).status().code(), Code::kNotFound);
  for (uint64_t v = 1; v <= 5; v++) ASSERT_TRUE(qs[v % 3].push(*M(v % 3 + 1).thr, v, 1s).ok());
  Status full = qs[0].push(*M(1).thr, 6, 1s);
  EXPECT_EQ(full.code(), Code::kResourceExhausted) << full.ToString();
  // Wraps: pop two, push two more, then everything comes out in push order.
  EXPECT_EQ(*qs[2].pop(*M(3).thr, 1s), 1u);
  EXPECT_EQ(*qs[1].pop(*M(2).thr, 1s), 2u);
  ASSERT_TRUE(qs[0].push(*M(1).thr, 6, 1s).ok());
  ASSERT_TRUE(qs[0].push(*M(1).thr, 7, 1s).ok());
  for (uint64_t v = 3; v <= 7; v++) {
    auto got = qs[v % 3].pop(*M(v % 3 + 1).thr, 1s);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, v);
  }
  EXPECT_EQ(qs[1].pop(*M(2).thr, 1s).status().code(), Code::kNotFound);
}

// A producer and a consumer thread on each of 3 nodes, 400 values per producer through 32 slots:
// the popped multiset equals the pushed one, and each consumer sees each producer's values in
// push order.
TEST_P(StructuresTest, SharedQueueExactlyOncePerProducerOrderConcurrent) {
  START_ALL_OR_SKIP();
  if (Fault("queue_wait")) testing::SetQueueWaitDisabled(true);
  constexpr uint64_t kPerProducer = 400;
  constexpr uint64_t kTotal = 3 * kPerProducer;
  std::vector<SharedQueue> qs;
  for (NodeId n = 1; n <= 3; n++) {
    auto q = SharedQueue::Open(*M(n).thr, "queue/stress", 1, {1, 2, 3}, 32);
    ASSERT_TRUE(q.ok());
    qs.push_back(*q);
  }
  for (auto& q : qs) ASSERT_TRUE(q.wait_ready(5s).ok());
  std::atomic<uint64_t> popped{0}, errors{0}, order{0};
  std::mutex mu;
  std::map<uint64_t, int> seen;
  std::vector<std::thread> ts;
  const auto deadline = Clock::now() + 20s;
  for (NodeId n = 1; n <= 3; n++) {
    ts.emplace_back([&, n] {  // producer: values (n << 32) | seq
      auto thr = M(n).mgr->make_thread();
      ASSERT_TRUE(thr.ok());
      for (uint64_t s = 1; s <= kPerProducer && Clock::now() < deadline;) {
        Status st = qs[n - 1].push(**thr, (uint64_t{n} << 32) | s, 5s);
        if (st.ok()) {
          s++;
        } else if (st.code() == Code::kResourceExhausted) {
          std::this_thread::sleep_for(50us);
        } else {
          if (errors++ == 0) ADD_FAILURE() << st.ToString();
          return;
        }
      }
    });
    ts.emplace_back([&, n] {  // consumer
      auto thr = M(n).mgr->make_thread();
      ASSERT_TRUE(thr.ok());
      uint64_t last[4] = {0, 0, 0, 0};
      while (popped.load() < kTotal && errors.load() == 0 && Clock::now() < deadline) {
        auto v = qs[n - 1].pop(**thr, 5s);
        if (!v.ok()) {
          if (v.status().code() == Code::kNotFound) {
            std::this_thread::sleep_for(50us);
            continue;
          }
          if (errors++ == 0) ADD_FAILURE() << v.status().ToString();
          return;
        }
        popped++;
        const uint64_t producer = *v >> 32, seq = *v & 0xffffffff;
        if (producer < 1 || producer > 3) {
          order++;
          continue;
        }
        if (seq <= last[producer]) order++;
        last[producer] = seq;
        std::lock_guard g(mu);
        seen[*v]++;
      }
    });
  }
  for (auto& t : ts) t.join();
  testing::SetQueueWaitDisabled(false);
  size_t missing = 0, duplicated = 0;
  for (NodeId n = 1; n <= 3; n++) {
    for (uint64_t s = 1; s <= kPerProducer; s++) {
      auto it = seen.find((uint64_t{n} << 32) | s);
      if (it == seen.end()) {
        missing++;
      } else if (it->second > 1) {
        duplicated += it->second - 1;
      }
    }
  }
  std::printf("queue: %llu popped, %zu missing, %zu duplicated, %llu out of order or foreign\n",
              static_cast<unsigned long long>(popped.load()), missing, duplicated,
              static_cast<unsigned long long>(order.load()));
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_EQ(missing, 0u);
  EXPECT_EQ(duplicated, 0u);
  EXPECT_EQ(order.load(), 0u) << "a producer's values out of order, or values never pushed";
}

// ---- SharedStateTable --------------------------------------------------------------------------

// Every node stores its row and broadcasts it, concurrently, 100 rounds; after each round's
// broadcast completed (and a barrier) every node reads every row at the round's value, whole.
// FARMEM_CHANNELS_FAULT=barrier_wait: nodes read before the others broadcast, and see old rows.
TEST_P(StructuresTest, SharedStateTableRowsConcurrent) {
  START_ALL_OR_SKIP();
  if (Fault("barrier_wait")) testing::SetBarrierWaitDisabled(true);
  struct Row {
    uint64_t w[6];
  };
  std::vector<SharedStateTable> tables;
  std::vector<Barrier> bars;
  for (NodeId n = 1; n <= 3; n++) {
    auto t = SharedStateTable::Open(*M(n).thr, "sst", {1, 2, 3}, sizeof(Row));
    auto b = Barrier::Open(*M(n).thr, "sst-bar", {1, 2, 3});
    ASSERT_TRUE(t.ok() && b.ok()) << t.status().ToString();
    tables.push_back(std::move(*t));
    bars.push_back(std::move(*b));
  }
  for (auto& t : tables) ASSERT_TRUE(t.wait_ready(5s).ok());
  for (auto& b : bars) ASSERT_TRUE(b.wait_ready(5s).ok());
  Row r{};
  EXPECT_EQ(tables[0].load(*M(1).thr, 4, &r).code(), Code::kInvalidArgument);
  std::atomic<int> wrong{0};
  std::vector<std::thread> ts;
  for (NodeId n = 1; n <= 3; n++) {
    ts.emplace_back([&, n] {
      auto& thr = *M(n).thr;
      for (uint64_t round = 1; round <= 100; round++) {
        Row mine;
        for (auto& x : mine.w) x = n * 1000000 + round;
        ASSERT_TRUE(tables[n - 1].store_mine(&mine).ok());
        auto key = tables[n - 1].push_broadcast(thr);
        ASSERT_TRUE(key.ok());
        ASSERT_TRUE(thr.wait(*key, 5s).ok());
        ASSERT_TRUE(bars[n - 1].arrive_and_wait(thr, 10s).ok());
        for (NodeId o = 1; o <= 3; o++) {
          Row got;
          ASSERT_TRUE(tables[n - 1].load(thr, o, &got).ok());
          for (uint64_t x : got.w) wrong += x != o * 1000000 + round;
        }
        ASSERT_TRUE(bars[n - 1].arrive_and_wait(thr, 10s).ok());  // nobody stores ahead
      }
    });
  }
  for (auto& t : ts) t.join();
  testing::SetBarrierWaitDisabled(false);
  EXPECT_EQ(wrong.load(), 0) << "rows not at the round's value after its broadcast";
}

INSTANTIATE_TEST_SUITE_P(Backends, StructuresTest, ::testing::Values("tcp", "fabric:shm"),
                         testing_util::BackendName);

}  // namespace
}  // namespace farmem::channels
