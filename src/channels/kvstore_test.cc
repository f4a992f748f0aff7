// KvStore across three in-process nodes (tcp and fabric:shm): operations and their errors, and a
// concurrent history (3 nodes x 2 client threads, 8 hot keys, unique values) checked for
// linearizability by Porcupine through tests/porcupine (built with Go; skipped when Go is not
// installed). FARMEM_CHANNELS_FAULT=kv_acks|kv_update_fence must make that check fail; 256-byte
// values are never read torn (FARMEM_CHANNELS_FAULT=kv_checksum must make that check fail).
#include <unistd.h>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "channels/channels_faults.h"
#include "channels/channels_test_util.h"
#include "channels/kv_history.h"

namespace farmem::channels {
namespace {

using namespace std::chrono_literals;
using testing_util::Fault;
using Clock = std::chrono::steady_clock;

class KvStoreTest : public testing_util::ChannelsTest {
 protected:
  // Opens the store on all three nodes and waits until every node's endpoints joined.
  bool OpenStores(const std::string& name, KvConfig config) {
    for (NodeId n = 1; n <= 3; n++) {
      auto kv = KvStore::Open(*M(n).thr, name, {1, 2, 3}, config);
      EXPECT_TRUE(kv.ok()) << kv.status().ToString();
      if (!kv.ok()) return false;
      kv_.push_back(std::move(*kv));
    }
    for (auto& kv : kv_) {
      Status st = kv->wait_ready(5s);
      EXPECT_TRUE(st.ok()) << st.ToString();
      if (!st.ok()) return false;
    }
    return true;
  }
  void TearDown() override {
    kv_.clear();  // tracker threads stop before the nodes do
    ChannelsTest::TearDown();
  }
  KvStore& K(NodeId n) { return *kv_[n - 1]; }
  void RunCheckedHistory(const std::string& name, bool inject);
  std::vector<std::unique_ptr<KvStore>> kv_;
};

TEST_P(KvStoreTest, OperationsAcrossNodesAndTheirErrors) {
  START_ALL_OR_SKIP();
  KvConfig config;
  config.slots_per_node = 2;
  config.locks = 16;
  ASSERT_TRUE(OpenStores("kv/unit", config));
  auto& t1 = *M(1).thr;
  auto& t2 = *M(2).thr;
  auto& t3 = *M(3).thr;
  EXPECT_EQ(K(2).get(t2, 7).status().code(), Code::kNotFound);  // index miss
  ASSERT_TRUE(K(1).insert(t1, 7, 70).ok());
  // Insert returned: every node's index has the key, and the value is valid.
  EXPECT_EQ(*K(2).get(t2, 7), 70u);
  EXPECT_EQ(*K(3).get(t3, 7), 70u);
  EXPECT_EQ(K(3).insert(t3, 7, 71).code(), Code::kFailedPrecondition);
  ASSERT_TRUE(K(2).update(t2, 7, 72).ok());  // the value stays on node 1
  EXPECT_EQ(*K(1).get(t1, 7), 72u);
  EXPECT_EQ(*K(3).get(t3, 7), 72u);
  EXPECT_EQ(K(3).update(t3, 8, 1).code(), Code::kNotFound);
  ASSERT_TRUE(K(3).erase(t3, 7).ok());
  for (NodeId n = 1; n <= 3; n++) {
    EXPECT_EQ(K(n).get(*M(n).thr, 7).status().code(), Code::kNotFound) << "node " << n;
  }
  EXPECT_EQ(K(1).erase(t1, 7).code(), Code::kNotFound);
  // Node 1 has two slots: the one freed by node 3's erase (freed by node 1's tracker) is reused
  // with a new counter.
  ASSERT_TRUE(K(1).insert(t1, 1, 10).ok());
  ASSERT_TRUE(K(1).insert(t1, 2, 20).ok());
  Status full = K(1).insert(t1, 3, 30);
  EXPECT_EQ(full.code(), Code::kResourceExhausted) << full.ToString();
  ASSERT_TRUE(K(2).insert(t2, 3, 30).ok());  // node 2's own slots
  ASSERT_TRUE(K(2).erase(t2, 1).ok());
  // The freed slot comes back once node 1's tracker applied the erase (erase waited for it).
  ASSERT_TRUE(K(1).insert(t1, 4, 40).ok());
  EXPECT_EQ(*K(3).get(t3, 4), 40u);
  EXPECT_EQ(K(3).get(t3, 1).status().code(), Code::kNotFound);
  EXPECT_EQ(*K(1).get(t1, 2), 20u);
  EXPECT_EQ(*K(1).get(t1, 3), 30u);

  // Asynchronous gets, 16 in flight on one thread: keys 1..16, of which 2 (node 1), 3 (node 2)
  // and 4 (node 1) are present.
  std::array<KvGet, 16> gets;
  std::array<uint64_t, 16> outs{};
  auto out = [&](size_t j) { return std::as_writable_bytes(std::span<uint64_t>(&outs[j], 1)); };
  for (size_t j = 0; j < gets.size(); j++) {
    ASSERT_TRUE(K(3).get_async(t3, j + 1, out(j), &gets[j]).ok());
  }
  // A present key's read is in flight until polled: its handle cannot be started again.
  EXPECT_FALSE(gets[1].done());
  EXPECT_EQ(K(3).get_async(t3, 9, out(1), &gets[1]).code(), Code::kFailedPrecondition);
  for (size_t j = 0; j < gets.size(); j++) {
    Status st = K(3).get_wait(t3, gets[j]);
    EXPECT_TRUE(gets[j].done());
    EXPECT_EQ(gets[j].key(), j + 1);
    if (j + 1 >= 2 && j + 1 <= 4) {
      ASSERT_TRUE(st.ok()) << "key " << j + 1 << ": " << st.ToString();
      EXPECT_EQ(outs[j], (j + 1) * 10);
    } else {
      EXPECT_EQ(st.code(), Code::kNotFound) << "key " << j + 1 << ": " << st.ToString();
    }
  }
  // A done handle is reused; a wrong size is an outcome, at once.
  ASSERT_TRUE(K(2).get_async(t2, 3, out(0), &gets[0]).ok());
  EXPECT_TRUE(K(2).get_wait(t2, gets[0]).ok());
  EXPECT_EQ(outs[0], 30u);
  ASSERT_TRUE(K(2).get_async(t2, 3, out(0).first(4), &gets[0]).ok());
  EXPECT_TRUE(gets[0].done());
  EXPECT_EQ(gets[0].status().code(), Code::kInvalidArgument);
}

// Where the Go toolchain is: $GO, /usr/local/go/bin/go, or `go` on PATH; empty when absent.
std::string FindGo() {
  if (const char* g = std::getenv("GO"); g != nullptr && access(g, X_OK) == 0) return g;
  if (access("/usr/local/go/bin/go", X_OK) == 0) return "/usr/local/go/bin/go";
  if (std::system("command -v go >/dev/null 2>&1") == 0) return "go";
  return "";
}

// 3 nodes x 2 client threads (in one process), 400 steps per client (100 in sanitizer builds) of
// kv_history.h's mix on its 8 hot keys, every written value unique; every 4th step a burst of 2..6
// asynchronous gets in flight at once, each recorded as its own operation; invoke and return
// times from CLOCK_MONOTONIC (steady_clock). Porcupine checks the history, partitioned by key.
// With `inject`, every 8th step of a client first makes the next modification of its node fail
// at a random step (KvStore::testing_fail_next): a modification that then fails claims to have
// had no effect, so it is left out of the history, and the history must still check.
void KvStoreTest::RunCheckedHistory(const std::string& name, bool inject) {
  const std::string go = FindGo();
  if (go.empty()) {
    GTEST_SKIP() << "Go is not installed (no $GO, /usr/local/go/bin/go or go on PATH): the "
                    "kvstore history cannot be checked by Porcupine";
  }
  const std::string dir = ::testing::TempDir() + "kvcheck-" + std::to_string(getpid());
  const std::string checker = dir + "/kvcheck";
  const std::string build_log = dir + "/build.log";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  const std::string build = "cd " FARMEM_PORCUPINE_DIR " && GOFLAGS=-mod=mod " + go + " build -o " +
                            checker + " . >" + build_log + " 2>&1";
  if (std::system(build.c_str()) != 0) {
    std::ifstream log(build_log);
    std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    GTEST_SKIP() << "could not build the Porcupine checker (module not downloadable?): " << text;
  }
  const bool no_acks = Fault("kv_acks");
  const bool no_fence = Fault("kv_update_fence");
  const bool no_rollback = Fault("kv_rollback");
  if (no_acks) testing::SetKvAcksDisabled(true);
  if (no_fence) testing::SetKvUpdateFenceDisabled(true);
  if (no_rollback) testing::SetKvRollbackDisabled(true);
  KvConfig config;
  config.locks = 64;
  config.timeout = 10s;  // generous: TSan on shm holds locks for long
  ASSERT_TRUE(OpenStores(name, config));
  constexpr int kThreadsPerNode = 2, kOps = testing_util::kSanitizerBuild ? 100 : 400;
  std::vector<std::vector<KvHistoryOp>> hist(3 * kThreadsPerNode);
  std::atomic<int> errors{0};
  std::atomic<long> async_gets{0};  // bursts of asynchronous gets
  std::atomic<long> failed{0};      // modifications failed on purpose, left out
  std::vector<std::thread> ts;
  for (NodeId n = 1; n <= 3; n++) {
    for (int t = 0; t < kThreadsPerNode; t++) {
      const int client = static_cast<int>(n - 1) * kThreadsPerNode + t;
      ts.emplace_back([&, n, client] {
        auto thr = M(n).mgr->make_thread();
        ASSERT_TRUE(thr.ok());
        std::mt19937_64 rng(client + 1);
        for (int i = 0; i < kOps; i++) {
          if (inject && i % 8 == 5) {
            K(n).testing_fail_next(static_cast<KvStore::FailPoint>(1 + rng() % 4));
          }
          Status st;
          if (KvHistoryNext(K(n), **thr, client, i, rng, SIZE_MAX, &hist[client], &st)) {
            async_gets += 1;
          }
          if (inject && !st.ok() && st.ToString().find("injected failure") != std::string::npos) {
            failed += 1;
            continue;
          }
          if (!st.ok()) {
            // An operation with an unknown outcome cannot be checked: this client stops, the
            // test fails, and the others' operations are still checked (a get has no effect; a
            // failed modification may make the check report an illegal history as well).
            if (errors++ == 0) ADD_FAILURE() << "client " << client << ": " << st.ToString();
            return;
          }
        }
      });
    }
  }
  for (auto& t : ts) t.join();
  testing::SetKvAcksDisabled(false);
  testing::SetKvUpdateFenceDisabled(false);
  testing::SetKvRollbackDisabled(false);
  const std::string file =
      dir + "/history-" + name.substr(3) + "-" + GetParam().substr(0, 3) + ".txt";
  ASSERT_TRUE(WriteKvHistory(file, hist)) << "cannot write " << file;
  const std::string check_log = dir + "/check.log";
  const int rc = std::system((checker + " " + file + " >" + check_log + " 2>&1").c_str());
  std::ifstream log(check_log);
  std::string result((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  size_t ops = 0;
  for (const auto& h : hist) ops += h.size();
  std::printf(
      "%zu operations (%ld bursts of asynchronous gets, %ld failed modifications left "
      "out); porcupine (%s): %s",
      ops, async_gets.load(), failed.load(), file.c_str(), result.c_str());
  EXPECT_EQ(errors.load(), 0);
  if (inject) {
    EXPECT_GT(failed.load(), 0);
  }
  EXPECT_EQ(rc, 0) << "history not linearizable (or not checkable): " << result
                   << " history kept in " << file;
  if (rc == 0 && errors.load() == 0) std::filesystem::remove_all(dir);
}

TEST_P(KvStoreTest, LinearizableHistoryPorcupineConcurrent) {
  START_ALL_OR_SKIP();
  RunCheckedHistory("kv/lin", false);
}

// The same with modifications failing at random steps (FARMEM_CHANNELS_FAULT=kv_rollback: the
// failed ones leave effects, and the check fails).
TEST_P(KvStoreTest, FailedModificationsLeaveALinearizableHistoryConcurrent) {
  START_ALL_OR_SKIP();
  RunCheckedHistory("kv/linfail", true);
}

// Values of 256 bytes (32 words; word i of version v is v << 8 | i, so a value mixing two versions
// is seen). Node 1's updater places every update in two parts (word 0 first, the rest 20 us later:
// the ChannelThread tear hook), while a thread on node 2 and one on node 3 get the key: a get
// never returns a torn value, and each reader's versions never go back. With
// FARMEM_CHANNELS_FAULT=kv_checksum (get skips the checksum) torn values are returned.
TEST_P(KvStoreTest, MultiWordValuesNeverTornConcurrent) {
  START_ALL_OR_SKIP();
  const bool no_checksum = Fault("kv_checksum");
  testing::SetKvChecksumDisabled(no_checksum);
  KvConfig config;
  config.value_bytes = 256;
  config.locks = 16;
  ASSERT_TRUE(OpenStores("kv/wide", config));
  constexpr size_t kWords = 32;
  constexpr uint64_t kKey = 7;
  using Value = std::array<uint64_t, kWords>;
  auto make = [](uint64_t version) {
    Value v;
    for (size_t i = 0; i < kWords; i++) v[i] = version << 8 | i;
    return v;
  };
  auto bytes = [](const Value& v) { return std::as_bytes(std::span<const uint64_t>(v)); };
  // Sizes other than value_bytes are refused, the one-word calls too.
  Value one = make(1);
  EXPECT_EQ(K(1).insert(*M(1).thr, kKey, bytes(one).first(8)).code(), Code::kInvalidArgument);
  EXPECT_EQ(K(1).insert(*M(1).thr, kKey, 5).code(), Code::kInvalidArgument);
  EXPECT_EQ(K(1).get(*M(1).thr, kKey).status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(K(1).insert(*M(1).thr, kKey, bytes(one)).ok());

  std::atomic<bool> done{false};
  std::atomic<uint64_t> last_version{1};
  std::thread updater([&] {
    auto thr = M(1).mgr->make_thread();
    ASSERT_TRUE(thr.ok());
    (*thr)->testing_tear_writes(20us);
    const auto end = Clock::now() + 1s;
    for (uint64_t v = 2; v <= 3000 && Clock::now() < end; v++) {
      Status st = K(1).update(**thr, kKey, bytes(make(v)));
      ASSERT_TRUE(st.ok()) << st.ToString();
      last_version = v;
    }
    done = true;
  });
  std::atomic<uint64_t> torn{0}, backwards{0}, reads{0};
  std::vector<std::thread> readers;
  for (NodeId n = 2; n <= 3; n++) {
    readers.emplace_back([&, n] {
      auto thr = M(n).mgr->make_thread();
      ASSERT_TRUE(thr.ok());
      uint64_t seen = 0;
      Value got;
      while (!done.load()) {
        Status st = K(n).get(**thr, kKey, std::as_writable_bytes(std::span<uint64_t>(got)));
        ASSERT_TRUE(st.ok()) << st.ToString();
        reads++;
        const uint64_t version = got[0] >> 8;
        if (got != make(version)) {
          torn++;
          continue;
        }
        if (version < seen) backwards++;
        seen = version;
      }
    });
  }
  updater.join();
  for (auto& t : readers) t.join();
  testing::SetKvChecksumDisabled(false);
  std::printf("%s: %llu updates, %llu gets, %llu torn, %llu going back\n", GetParam().c_str(),
              static_cast<unsigned long long>(last_version.load() - 1),
              static_cast<unsigned long long>(reads.load()),
              static_cast<unsigned long long>(torn.load()),
              static_cast<unsigned long long>(backwards.load()));
  EXPECT_GT(reads.load(), 0u);
  EXPECT_EQ(torn.load(), 0u);
  EXPECT_EQ(backwards.load(), 0u);
  Value final_value;
  ASSERT_TRUE(
      K(3).get(*M(3).thr, kKey, std::as_writable_bytes(std::span<uint64_t>(final_value))).ok());
  EXPECT_EQ(final_value, make(last_version.load()));
}

// A member goes away (node 3 stopped; op_timeout 500 ms): the ringbuffer producer, the queue homed
// there and the kvstore return errors within their deadlines, never hang, and a get of a value
// that lived there errors instead of returning a stale value.
TEST_P(KvStoreTest, StoppedMemberGivesErrorsNotHangs) {
  if (Fault("ring_partial_seq")) testing::SetRingPartialSeqDisabled(true);
  struct Restore {
    ~Restore() { testing::SetRingPartialSeqDisabled(false); }
  } restore;
  for (NodeId id = 1; id <= kNodes; id++) {
    if (!StartMember(id, 500ms)) {
      if (!skip_.empty()) GTEST_SKIP() << skip_;
      FAIL();
    }
  }
  for (auto& m : members_) ASSERT_TRUE(m.mgr->connect(5s).ok());
  KvConfig config;
  config.timeout = 500ms;
  config.locks = 16;
  ASSERT_TRUE(OpenStores("kv/dead", config));
  std::vector<RingBuffer> rings;
  std::vector<SharedQueue> queues;
  for (NodeId n = 1; n <= 3; n++) {
    auto r = RingBuffer::Open(*M(n).thr, "dead/ring", 1, {1, 2, 3}, 4, 8);
    auto q = SharedQueue::Open(*M(n).thr, "dead/queue", 3, {1, 2, 3}, 8);
    ASSERT_TRUE(r.ok() && q.ok());
    rings.push_back(std::move(*r));
    queues.push_back(*q);
  }
  for (auto& r : rings) ASSERT_TRUE(r.wait_ready(5s).ok());
  for (auto& q : queues) ASSERT_TRUE(q.wait_ready(5s).ok());
  for (auto [n, key] : {std::pair<NodeId, uint64_t>{3, 33}, {1, 11}}) {  // values on nodes 3, 1
    Status st = K(n).insert(*M(n).thr, key, key * 10);
    ASSERT_TRUE(st.ok()) << "insert " << key << " (set-up, 500 ms deadlines): " << st.ToString();
  }
  ASSERT_TRUE(queues[0].push(*M(1).thr, 5, 1s).ok());
  uint64_t one = 1;
  ASSERT_TRUE(rings[0].push(*M(1).thr, &one, 8, 1s).ok());
  // Node 3 goes away (its store's tracker first, then its node).
  kv_[2].reset();
  M(3).thr.reset();
  M(3).node->stop();
  auto timed = [](const char* what, auto fn) {
    testing_util::ExpectErrorWithin(std::string(what) + " with node 3 stopped", 2500ms, fn);
  };
  auto& t1 = *M(1).thr;
  timed("ringbuffer push", [&] { return rings[0].push(t1, &one, 8, 1s).status(); });
  // That record reached node 2 (its seq is used) and the next one names node 3 at once: node 2
  // pops both, in order (FARMEM_CHANNELS_FAULT=ring_partial_seq: the seq is used again and node
  // 2 never sees the second).
  {
    uint64_t two = 2;
    std::vector<NodeId> unreached;
    Status again = rings[0].push(t1, &two, 8, 1s, &unreached).status();
    EXPECT_FALSE(again.ok());
    EXPECT_EQ(unreached, std::vector<NodeId>{3}) << again.ToString();
    for (uint64_t want : {uint64_t{1}, uint64_t{1}, uint64_t{2}}) {
      uint64_t got = 0;
      auto len = rings[1].pop(*M(2).thr, &got, 8, 1s);
      EXPECT_TRUE(len.ok()) << "node 2 pop: " << len.status().ToString();
      EXPECT_EQ(got, want);
    }
  }
  timed("queue push", [&] { return queues[0].push(t1, 6, 1s); });
  timed("queue pop", [&] { return queues[0].pop(t1, 1s).status(); });
  timed("kvstore get of a value on node 3", [&] { return K(1).get(t1, 33).status(); });
  timed("kvstore asynchronous gets of a value on node 3 and one on node 1", [&] {
    KvGet dead, live;
    uint64_t a = 0, b = 0;
    EXPECT_TRUE(
        K(1).get_async(t1, 33, std::as_writable_bytes(std::span<uint64_t>(&a, 1)), &dead).ok());
    EXPECT_TRUE(
        K(1).get_async(t1, 11, std::as_writable_bytes(std::span<uint64_t>(&b, 1)), &live).ok());
    Status live_st = K(1).get_wait(t1, live);
    EXPECT_TRUE(live_st.ok()) << live_st.ToString();
    EXPECT_EQ(b, 110u);
    return K(1).get_wait(t1, dead);
  });
  timed("kvstore insert, lock at node 1 or 2, tracker of node 3 gone", [&] {
    // A key whose lock is not homed at node 3 (that case is an error too, from the lock).
    Status st;
    for (uint64_t key = 12; key < 20; key++) {
      st = K(1).insert(t1, key, 120);
      if (st.ToString().find(" lock ") == std::string::npos) break;
    }
    EXPECT_NE(st.ToString().find("ringbuffer 'kv/dead/tracker/1'"), std::string::npos)
        << st.ToString();
    return st;
  });
  // Reads of values on the living nodes still work.
  auto v = K(2).get(*M(2).thr, 11);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 110u);
}

// ---- Failed modifications (docs/channels.md, "Failed modifications") ---------------------------

// The rule the next tests check: a modification that returned OK took effect for every node, one
// that returned an error took effect for none. `Present` expects key `key` with `value` on every
// node (get), `Absent` expects every node to see it absent: get and update say kNotFound, and
// node `inserter` can insert it (then it is erased again). Each wrong answer is counted.
class KvFailureTest : public KvStoreTest {
 protected:
  void Present(uint64_t key, uint64_t value, const std::string& what) {
    for (NodeId n = 1; n <= 3; n++) {
      auto v = K(n).get(*M(n).thr, key);
      if (!v.ok() || *v != value) {
        wrong_++;
        ADD_FAILURE() << what << ": node " << n << " get of key " << key << " gives "
                      << (v.ok() ? std::to_string(*v) : v.status().ToString()) << ", want "
                      << value;
      }
    }
  }
  void Absent(uint64_t key, NodeId inserter, const std::string& what) {
    for (NodeId n = 1; n <= 3; n++) {
      Status g = K(n).get(*M(n).thr, key).status();
      Status u = K(n).update(*M(n).thr, key, 1);
      for (const Status& st : {g, u}) {
        if (st.code() != Code::kNotFound) {
          wrong_++;
          ADD_FAILURE() << what << ": node " << n << " sees key " << key
                        << " (want not found): " << st.ToString();
        }
      }
    }
    Status ins = K(inserter).insert(*M(inserter).thr, key, 7);
    if (!ins.ok()) {
      wrong_++;
      ADD_FAILURE() << what << ": node " << inserter << " cannot insert key " << key << ": "
                    << ins.ToString();
      return;
    }
    Present(key, 7, what + ", inserted again");
    Status er = K(inserter).erase(*M(inserter).thr, key);
    EXPECT_TRUE(er.ok()) << er.ToString();
  }
  void SetUpFaults() {
    if (testing_util::Fault("kv_rollback")) testing::SetKvRollbackDisabled(true);
    if (testing_util::Fault("kv_catch_up")) testing::SetKvCatchUpDisabled(true);
    if (testing_util::Fault("kv_ticket_order")) testing::SetKvTicketOrderDisabled(true);
  }
  void TearDown() override {
    std::printf("%d wrong answers\n", wrong_);
    testing::SetKvRollbackDisabled(false);
    testing::SetKvCatchUpDisabled(false);
    testing::SetKvTicketOrderDisabled(false);
    KvStoreTest::TearDown();
  }
  int wrong_ = 0;
};

// An insert on node 1 fails at each step in turn (a test hook makes the step fail as a transport
// failure would): before anything left the node (the slot write, a full tracker ring), after every
// node received its record (the wait for the acknowledgements), and after every node applied it
// (the write that makes the slot valid). Each time no node sees the key afterwards, another node
// can insert it, and no slot of node 1 is lost. FARMEM_CHANNELS_FAULT=kv_rollback (no undo) makes
// it fail.
TEST_P(KvFailureTest, FailedInsertLeavesNoTraceOnAnyNode) {
  START_ALL_OR_SKIP();
  SetUpFaults();
  KvConfig config;
  config.slots_per_node = 4;
  config.locks = 16;
  config.timeout = 2s;
  ASSERT_TRUE(OpenStores("kv/rollback", config));
  using F = KvStore::FailPoint;
  const std::vector<std::pair<F, const char*>> points = {{F::kSlotWrite, "slot write"},
                                                         {F::kRingFull, "tracker ring full"},
                                                         {F::kAcks, "acknowledgements"},
                                                         {F::kValidWrite, "valid write"}};
  for (size_t i = 0; i < points.size(); i++) {
    const uint64_t key = 100 + i;
    K(1).testing_fail_next(points[i].first);
    Status st = K(1).insert(*M(1).thr, key, 1000 + i);
    std::printf("insert failing at the %s: %s\n", points[i].second, st.ToString().c_str());
    EXPECT_FALSE(st.ok()) << points[i].second;
    Absent(key, static_cast<NodeId>(1 + (i + 1) % 3), std::string("after ") + points[i].second);
  }
  // Every slot of node 1 is free again.
  for (uint64_t key = 200; key < 204; key++) {
    Status st = K(1).insert(*M(1).thr, key, key);
    if (!st.ok()) {
      wrong_++;
      ADD_FAILURE() << "node 1 lost a slot: insert of key " << key << ": " << st.ToString();
    }
  }
  EXPECT_EQ(wrong_, 0);
}

// An erase fails before its linearization point (the tracker ring full: nothing changed, the key
// stays on every node) and after it (the acknowledgements: the erase completes and returns OK,
// the key is gone for every node). FARMEM_CHANNELS_FAULT=kv_rollback makes it fail: the first
// erase changes the home's slot and leaves the other nodes' entries, the second returns an error
// although the key is gone.
TEST_P(KvFailureTest, FailedEraseIsAllOrNothing) {
  START_ALL_OR_SKIP();
  SetUpFaults();
  KvConfig config;
  config.locks = 16;
  config.timeout = 2s;
  ASSERT_TRUE(OpenStores("kv/erase", config));
  ASSERT_TRUE(K(1).insert(*M(1).thr, 300, 3000).ok());
  using F = KvStore::FailPoint;
  uint64_t value = 3000;
  for (auto [n, point, name] : {std::tuple<NodeId, F, const char*>{2, F::kRingFull, "ring full"},
                                {3, F::kAcks, "acknowledgements"}}) {
    K(n).testing_fail_next(point);
    Status st = K(n).erase(*M(n).thr, 300);
    std::printf("erase on node %u failing at the %s: %s\n", n, name, st.ToString().c_str());
    if (st.ok()) {
      Absent(300, 2, std::string("after an erase that returned OK (") + name + ")");
      ASSERT_TRUE(K(1).insert(*M(1).thr, 300, ++value).ok());
    } else {
      Present(300, value, std::string("after an erase that failed (") + name + ")");
      Status up = K(3).update(*M(3).thr, 300, ++value);
      if (!up.ok()) {
        wrong_++;
        ADD_FAILURE() << "update after a failed erase: " << up.ToString();
      }
      Present(300, value, "updated after a failed erase");
    }
  }
  EXPECT_EQ(wrong_, 0);
}

// Node 3's tracker applies node 1's insert record but holds back its acknowledgement (test hook),
// so node 1's insert times out and is rolled back; node 3 has not applied the abort. Node 3's
// gets already answer "not found" (the slot never became valid), and its modifications of the
// key first apply the abort (the lock's catch-up row): while its tracker is held they fail with
// kTimedOut instead of answering "exists" or updating a key that is not there; once it runs, node
// 3 inserts the key. FARMEM_CHANNELS_FAULT=kv_catch_up makes it fail.
TEST_P(KvFailureTest, RolledBackInsertIsCaughtUpBeforeASlowNodesNextModification) {
  START_ALL_OR_SKIP();
  SetUpFaults();
  KvConfig config;
  config.locks = 16;
  config.timeout = 300ms;
  ASSERT_TRUE(OpenStores("kv/slow", config));
  K(3).testing_hold_tracker(1, KvStore::TrackerHold::kHoldAfterApply);
  Status st = K(1).insert(*M(1).thr, 400, 4000);
  std::printf("insert with node 3 slow: %s\n", st.ToString().c_str());
  EXPECT_FALSE(st.ok());
  auto& t3 = *M(3).thr;
  Status g = K(3).get(t3, 400).status();
  Status u = K(3).update(t3, 400, 4001);
  Status i = K(3).insert(t3, 400, 4002);
  std::printf("node 3, tracker held: get %s; update %s; insert %s\n", g.ToString().c_str(),
              u.ToString().c_str(), i.ToString().c_str());
  if (g.code() != Code::kNotFound) wrong_++, ADD_FAILURE() << "get: " << g.ToString();
  if (u.ok()) wrong_++, ADD_FAILURE() << "update of an absent key returned OK";
  if (i.code() == Code::kFailedPrecondition || i.ok()) {
    wrong_++, ADD_FAILURE() << "insert: " << i.ToString();
  }
  K(3).testing_hold_tracker(1, KvStore::TrackerHold::kRun);
  st = K(3).insert(t3, 400, 4003);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (st.ok()) Present(400, 4003, "inserted by node 3 after catching up");
  EXPECT_EQ(wrong_, 0);
}

// Node 3's tracker takes nothing from node 1's ring (test hook): node 1's insert of a key is
// rolled back, then node 2 inserts the key (node 3 applies that at once). When node 3's tracker
// runs again it applies node 1's old insert and its abort: the old insert must not replace node
// 2's newer entry (it carries an older ticket of the key's lock), or the abort would leave node 3
// without the key. FARMEM_CHANNELS_FAULT=kv_ticket_order makes it fail.
TEST_P(KvFailureTest, LateRecordsNeverReplaceANewerEntry) {
  START_ALL_OR_SKIP();
  SetUpFaults();
  KvConfig config;
  config.locks = 16;
  config.timeout = 300ms;
  ASSERT_TRUE(OpenStores("kv/late", config));
  K(3).testing_hold_tracker(1, KvStore::TrackerHold::kHold);
  Status st = K(1).insert(*M(1).thr, 500, 5000);
  std::printf("insert with node 3 not taking node 1's records: %s\n", st.ToString().c_str());
  EXPECT_FALSE(st.ok());
  ASSERT_TRUE(K(2).insert(*M(2).thr, 500, 5001).ok());
  K(3).testing_hold_tracker(1, KvStore::TrackerHold::kRun);
  // Node 3's update catches up with node 1's records first (the lock is marked), then updates.
  st = K(3).update(*M(3).thr, 500, 5002);
  std::printf("node 3's update after its tracker ran: %s\n", st.ToString().c_str());
  if (!st.ok()) wrong_++, ADD_FAILURE() << "update on node 3: " << st.ToString();
  Present(500, st.ok() ? 5002 : 5001, "after node 3 applied the late records");
  EXPECT_EQ(wrong_, 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, KvFailureTest, ::testing::Values("tcp", "fabric:shm"),
                         testing_util::BackendName);

INSTANTIATE_TEST_SUITE_P(Backends, KvStoreTest, ::testing::Values("tcp", "fabric:shm"),
                         testing_util::BackendName);

}  // namespace
}  // namespace farmem::channels
