// Coroutine Scheduler over a Node's context against another node's exported region: many tasks in
// flight on one thread (reads, FAA, RPCs), block_on returning values, and nested tasks.
// Runs per backend; unavailable backends are skipped.
#include <atomic>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "farmem/coro.h"
#include "farmem/node.h"
#include "node/node_test_util.h"
#include "transport/testing/watchdog.h"

namespace farmem {
namespace {

using farmem::node::testing::MakeConfig;
using farmem::node::testing::StartNode;
using farmem::testing::ScopedWatchdog;
using namespace std::chrono_literals;

constexpr uint16_t kOpAdd = kFirstUserOpcode + 5;

class SchedulerTest : public ::testing::TestWithParam<std::string> {
 public:  // coroutine lambdas in the tests reach the fixture through a pointer
  void SetUp() override {
    watchdog_ = std::make_unique<ScopedWatchdog>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), 60s);
    auto server = Node::Create(MakeConfig(GetParam(), "target"));
    if (!server.ok()) {
      if (server.status().code() == Code::kUnavailable) {
        GTEST_SKIP() << "backend " << GetParam() << " unavailable: " << server.status().ToString();
      }
      FAIL() << server.status().ToString();
    }
    server_ = std::move(*server);
    // Replies with the sum of the request's 8-byte words.
    ASSERT_TRUE(server_
                    ->register_rpc(kOpAdd,
                                   [](const RpcCall& call, std::vector<std::byte>& reply) {
                                     if (call.request.size() % 8 != 0) {
                                       return Status::InvalidArgument("need 8-byte words");
                                     }
                                     uint64_t sum = 0;
                                     for (size_t i = 0; i < call.request.size(); i += 8) {
                                       uint64_t v;
                                       std::memcpy(&v, call.request.data() + i, 8);
                                       sum += v;
                                     }
                                     reply.resize(8);
                                     std::memcpy(reply.data(), &sum, 8);
                                     return Status::OK();
                                   })
                    .ok());
    words_.assign(4096, 0);
    for (size_t i = 0; i < words_.size(); ++i) words_[i] = i * 3 + 1;
    auto info = server_->export_region("words", words_.data(), words_.size() * 8);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    ASSERT_TRUE(server_->start().ok());

    std::string skip;
    client_ = StartNode(MakeConfig(GetParam(), "initiator"), &skip);
    ASSERT_NE(client_, nullptr) << skip;
    auto peer = client_->connect(server_->bootstrap_address());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    peer_ = *peer;
    key_ = peer_.regions.at(0).key;
    auto sched = client_->make_scheduler();
    ASSERT_TRUE(sched.ok()) << sched.status().ToString();
    sched_ = std::move(*sched);
  }

  void TearDown() override {
    sched_.reset();
    if (client_) client_->stop();
    if (server_) server_->stop();
  }

  RemoteRef Word(size_t i) { return RemoteRef{peer_.id, key_, i * 8}; }

  std::unique_ptr<ScopedWatchdog> watchdog_;
  std::unique_ptr<Node> server_;
  std::unique_ptr<Node> client_;
  std::unique_ptr<Scheduler> sched_;
  std::vector<uint64_t> words_;
  PeerInfo peer_;
  RegionKey key_ = 0;
};

TEST_P(SchedulerTest, ManyTasksFetchAddOneCounter) {
  constexpr int kTasks = 32;
  constexpr int kAddsPerTask = 40;
  words_[0] = 0;
  std::vector<uint64_t> olds;
  int failures = 0;
  auto worker = [](SchedulerTest* t, std::vector<uint64_t>* out, int* fails) -> Task<void> {
    for (int i = 0; i < kAddsPerTask; ++i) {
      Result<uint64_t> old = co_await t->sched_->fetch_add(t->Word(0), 1);
      if (!old.ok()) {
        ++*fails;
        co_return;
      }
      out->push_back(*old);
    }
  };
  for (int i = 0; i < kTasks; ++i) sched_->spawn(worker(this, &olds, &failures));
  EXPECT_GT(sched_->live_tasks(), 1u);  // really in flight together, not one after another
  ASSERT_TRUE(sched_->run(30s).ok());
  EXPECT_EQ(failures, 0);
  // Every FAA saw a distinct previous value: exactly 0 .. N-1.
  ASSERT_EQ(olds.size(), static_cast<size_t>(kTasks * kAddsPerTask));
  std::set<uint64_t> distinct(olds.begin(), olds.end());
  EXPECT_EQ(distinct.size(), olds.size());
  EXPECT_EQ(*distinct.begin(), 0u);
  EXPECT_EQ(*distinct.rbegin(), static_cast<uint64_t>(kTasks * kAddsPerTask - 1));
  uint64_t final_value = 0;
  Status r = sched_->block_on(sched_->read(Word(0), &final_value, 8));
  ASSERT_TRUE(r.ok()) << r.ToString();
  EXPECT_EQ(final_value, static_cast<uint64_t>(kTasks * kAddsPerTask));
}

TEST_P(SchedulerTest, ManyConcurrentReadsSeeTheirOwnWords) {
  constexpr int kTasks = 64;
  std::vector<uint64_t> got(kTasks * 8, 0);
  int failures = 0;
  auto reader = [](SchedulerTest* t, int id, uint64_t* dst, int* fails) -> Task<void> {
    for (int j = 0; j < 8; ++j) {
      size_t idx = static_cast<size_t>(id) * 8 + static_cast<size_t>(j);
      Status s = co_await t->sched_->read(t->Word(idx), dst + j, 8);
      if (!s.ok()) ++*fails;
    }
  };
  for (int i = 0; i < kTasks; ++i) sched_->spawn(reader(this, i, got.data() + i * 8, &failures));
  ASSERT_TRUE(sched_->run(30s).ok());
  EXPECT_EQ(failures, 0);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], i * 3 + 1) << "word " << i;
}

TEST_P(SchedulerTest, BlockOnReturnsValues) {
  auto value = sched_->block_on(sched_->fetch_add(Word(10), 5));
  ASSERT_TRUE(value.ok()) << value.status().ToString();
  EXPECT_EQ(*value, 31u);
  auto cas = sched_->block_on(sched_->compare_swap(Word(10), 36, 1000));
  ASSERT_TRUE(cas.ok()) << cas.status().ToString();
  EXPECT_EQ(*cas, 36u);
  EXPECT_EQ(words_[10], 1000u);

  auto plain = [](int x) -> Task<int> { co_return x * 2; };
  EXPECT_EQ(sched_->block_on(plain(21)), 42);

  auto with_string = [](SchedulerTest* t) -> Task<std::string> {
    char buf[8];
    Status s = co_await t->sched_->read(t->Word(2), buf, 8);
    co_return s.ok() ? std::string("read ok") : s.ToString();
  };
  EXPECT_EQ(sched_->block_on(with_string(this)), "read ok");
}

// Leaf reads a word, middle sums two leaves, top sums two middles plus an RPC result.
Task<Result<uint64_t>> Leaf(Scheduler* s, RemoteRef ref) {
  uint64_t v = 0;
  Status st = co_await s->read(ref, &v, 8);
  if (!st.ok()) co_return st;
  co_return v;
}

TEST_P(SchedulerTest, NestedTasksAndRpcs) {
  Scheduler* s = sched_.get();
  auto middle = [](SchedulerTest* t, Scheduler* s, size_t a, size_t b) -> Task<Result<uint64_t>> {
    auto x = co_await Leaf(s, t->Word(a));
    auto y = co_await Leaf(s, t->Word(b));
    if (!x.ok()) co_return x.status();
    if (!y.ok()) co_return y.status();
    co_return *x + *y;
  };
  auto top = [&middle](SchedulerTest* t, Scheduler* s) -> Task<Result<uint64_t>> {
    auto m1 = co_await middle(t, s, 1, 2);  // 4 + 7
    auto m2 = co_await middle(t, s, 3, 4);  // 10 + 13
    if (!m1.ok()) co_return m1.status();
    if (!m2.ok()) co_return m2.status();
    uint64_t req[2] = {*m1, *m2};
    uint64_t sum = 0;
    auto r = co_await s->rpc(t->peer_.id, RpcImm(kOpAdd),
                             std::span<const std::byte>(reinterpret_cast<std::byte*>(req), 16),
                             std::span<std::byte>(reinterpret_cast<std::byte*>(&sum), 8));
    if (!r.ok()) co_return r.status();
    if (r->length != 8) co_return Status::Protocol("short reply");
    co_return sum;
  };
  auto result = s->block_on(top(this, s));
  ASSERT_TRUE(result.ok()) << result.status().ToString();
  EXPECT_EQ(*result, 34u);
}

TEST_P(SchedulerTest, ManyRpcsInFlight) {
  constexpr int kTasks = 24;
  int ok = 0, bad = 0;
  auto caller = [](SchedulerTest* t, uint64_t base, int* ok, int* bad) -> Task<void> {
    for (uint64_t i = 0; i < 5; ++i) {
      uint64_t req[3] = {base, i, 100};
      uint64_t sum = 0;
      auto r = co_await t->sched_->rpc(
          t->peer_.id, RpcImm(kOpAdd),
          std::span<const std::byte>(reinterpret_cast<std::byte*>(req), sizeof(req)),
          std::span<std::byte>(reinterpret_cast<std::byte*>(&sum), 8));
      if (r.ok() && sum == base + i + 100) {
        ++*ok;
      } else {
        ++*bad;
      }
    }
  };
  for (int i = 0; i < kTasks; ++i) sched_->spawn(caller(this, 1000u * i, &ok, &bad));
  ASSERT_TRUE(sched_->run(30s).ok());
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(ok, kTasks * 5);
}

TEST_P(SchedulerTest, SleepingTaskDoesNotStallTheOthers) {
  // One task sleeps for 2 s; meanwhile another does 50 reads on the same scheduler. The sleeper
  // must still be asleep when the reader is done (reads are ~µs each: a thread sleep in place of
  // the timer would make the reader wait the whole 2 s and finish after the sleeper).
  bool slept = false;
  bool sleeper_done_before_reader = false;
  int reads_ok = 0;
  auto sleeper = [](Scheduler* s, bool* done) -> Task<void> {
    co_await s->sleep_for(2s);
    *done = true;
  };
  auto reader = [](SchedulerTest* t, int* ok, bool* sleeper_done, bool* early) -> Task<void> {
    for (int i = 0; i < 50; ++i) {
      uint64_t v = 0;
      Status st = co_await t->sched_->read(t->Word(static_cast<size_t>(i)), &v, 8);
      if (st.ok() && v == static_cast<uint64_t>(i) * 3 + 1) ++*ok;
    }
    *early = *sleeper_done;
  };
  sched_->spawn(sleeper(sched_.get(), &slept));
  EXPECT_EQ(sched_->sleeping(), 1u);
  sched_->block_on(reader(this, &reads_ok, &slept, &sleeper_done_before_reader));
  EXPECT_EQ(reads_ok, 50);
  EXPECT_FALSE(sleeper_done_before_reader);
  ASSERT_TRUE(sched_->run(30s).ok());
  EXPECT_TRUE(slept);
  EXPECT_EQ(sched_->sleeping(), 0u);
}

TEST_P(SchedulerTest, SleepersWakeInDeadlineOrder) {
  std::vector<int> order;
  auto sleeper = [](Scheduler* s, std::chrono::milliseconds d, int id,
                    std::vector<int>* out) -> Task<void> {
    co_await s->sleep_for(d);
    out->push_back(id);
  };
  sched_->spawn(sleeper(sched_.get(), 30ms, 3, &order));
  sched_->spawn(sleeper(sched_.get(), 10ms, 1, &order));
  sched_->spawn(sleeper(sched_.get(), 20ms, 2, &order));
  sched_->spawn(sleeper(sched_.get(), 0ms, 0, &order));  // due at once: never suspends
  EXPECT_EQ(order, std::vector<int>{0});
  ASSERT_TRUE(sched_->run(30s).ok());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
}

INSTANTIATE_TEST_SUITE_P(Backends, SchedulerTest, ::testing::Values("tcp", "fabric:shm"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n) {
                             if (c == ':') c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace farmem
