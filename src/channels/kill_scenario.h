// Test-only: the "participant SIGKILLed in the middle of each channel's use" scenario (docs/
// channels.md, "Failures"), shared by kill_test.cc (nodes 1 and 2 in the test process, node 3 a
// child) and `farmem bench channels-node --workload kill` (one process per network namespace,
// tests/channels_kill_netns_test.sh): the channels every participant opens, one step of the
// victim's use of them, and the survivors' checks after the victim is gone. Each participant
// calls it from one thread with its own ChannelThread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "farmem/channels.h"

namespace farmem::channels {

inline constexpr uint64_t kKillVictimKey = 3000;    // inserted by the victim (node 3) at start
inline constexpr uint64_t kKillSurvivorKey = 1001;  // inserted by node 1 before the kill
inline constexpr size_t kKillRingCapacity = 4;

// Channels every participant opens (same names, members and sizes): the ringbuffer's producer is
// node 1, the queue, atomic var, owned var and lock3 live at node 3 (the victim), `held` is homed
// at node 1 and taken by the victim, which never releases it.
struct KillChannels {
  std::unique_ptr<KvStore> kv;
  std::vector<RingBuffer> ring;  // one element each (the handles have no default state)
  std::vector<SharedQueue> queue;
  std::vector<Barrier> barrier;
  std::vector<TicketLock> lock3;
  std::vector<TicketLock> held;
  std::vector<AtomicVar> atom;
  std::vector<OwnedVar<uint64_t>> owned;
};

// Opens them, waits until every member joined, and passes one barrier episode with the others.
inline Status OpenKillChannels(ChannelThread& thr, KillChannels* out,
                               std::chrono::milliseconds ready = std::chrono::seconds(20)) {
  KvConfig config;
  // Generous for the set-up under load (an insert waits for every node's tracker); the survivors'
  // errors after the kill come at once from the transport, or at this deadline for a key lock
  // the victim held.
  config.timeout = std::chrono::seconds(2);
  config.locks = 16;
  const std::vector<NodeId> all = {1, 2, 3};
  auto kv = KvStore::Open(thr, "kill/kv", all, config);
  if (!kv.ok()) return kv.status();
  auto r = RingBuffer::Open(thr, "kill/ring", 1, all, kKillRingCapacity, 8);
  if (!r.ok()) return r.status();
  auto q = SharedQueue::Open(thr, "kill/queue", 3, all, 64);
  if (!q.ok()) return q.status();
  auto b = Barrier::Open(thr, "kill/bar", all);
  if (!b.ok()) return b.status();
  auto l3 = TicketLock::Open(thr, "kill/lock3", 3, all);
  if (!l3.ok()) return l3.status();
  auto held = TicketLock::Open(thr, "kill/held", 1, all);
  if (!held.ok()) return held.status();
  auto atom = AtomicVar::Open(thr, "kill/atom", 3, all);
  if (!atom.ok()) return atom.status();
  auto owned = OwnedVar<uint64_t>::Open(thr, "kill/owned", 3, all);
  if (!owned.ok()) return owned.status();
  out->kv = std::move(*kv);
  out->ring.push_back(std::move(*r));
  out->queue.push_back(*q);
  out->barrier.push_back(std::move(*b));
  out->lock3.push_back(std::move(*l3));
  out->held.push_back(std::move(*held));
  out->atom.push_back(std::move(*atom));
  out->owned.push_back(std::move(*owned));
  for (Status st : {out->kv->wait_ready(ready), out->ring[0].wait_ready(ready),
                    out->queue[0].wait_ready(ready), out->barrier[0].wait_ready(ready),
                    out->lock3[0].wait_ready(ready), out->held[0].wait_ready(ready),
                    out->atom[0].wait_ready(ready), out->owned[0].wait_ready(ready)}) {
    if (!st.ok()) return st;
  }
  // Every participant passes one barrier episode before the victim is killed.
  return out->barrier[0].arrive_and_wait(thr, ready);
}

// The victim's start: it takes `held` for good and inserts its key.
inline Status KillVictimStart(ChannelThread& thr, KillChannels& ch) {
  Status st = ch.held[0].lock(thr, std::chrono::seconds(20));
  if (!st.ok()) return st;
  return ch.kv->insert(thr, kKillVictimKey, 1);
}

// Step `i` (1, 2, ...) of the victim's use of every channel (errors ignored: it only has to be
// in the middle of something when it dies).
inline void KillVictimStep(ChannelThread& thr, KillChannels& ch, uint64_t i) {
  using std::chrono::milliseconds;
  uint8_t buf[8];
  (void)ch.ring[0].pop(thr, buf, sizeof(buf), milliseconds(1));
  (void)ch.kv->update(thr, kKillVictimKey, i);
  (void)ch.kv->get(thr, 1000 + i % 8);
  (void)ch.queue[0].pop(thr, milliseconds(1));
  (void)ch.atom[0].fetch_add(thr, 1);
  if (ch.owned[0].store(i).ok()) {
    auto k = ch.owned[0].push(thr);
    if (k.ok()) (void)thr.wait(*k, milliseconds(200));
  }
  if (ch.lock3[0].lock(thr, milliseconds(200)).ok())
    (void)ch.lock3[0].unlock(thr, milliseconds(200));
}

// One survivor check: what was called, its outcome and how long it took.
struct KillCheck {
  std::string what;
  Status status;
  int64_t ms = 0;
  bool want_error = true;  // false: a call on the survivors that must still work
  bool passed = false;
};

// The survivor `self` (1 or 2) after the victim was killed, each call expected to fail within
// `limit` (never hang, never return the dead node's old value), then the calls that must still
// work: its own view of a key whose insert failed at the dead node's tracker (rolled back:
// absent), and the survivors' value kKillSurvivorKey. Keys it inserts: key_base, key_base + 1, ...
// The groups of checks run at once, each on its own thread (each with its own ChannelThread from
// `mgr`): on a transport that notices a death only at op_timeout, one after another would take
// a dozen of them.
inline std::vector<KillCheck> KillSurvivorChecks(Manager& mgr, KillChannels& ch, NodeId self,
                                                 uint64_t key_base,
                                                 std::chrono::milliseconds limit) {
  using std::chrono::milliseconds;
  using Check = std::pair<std::string, std::function<Status(ChannelThread&)>>;
  struct Group {
    std::vector<Check> checks;
    std::vector<bool> want_error;
  };
  std::vector<Group> groups;
  auto group = [&](std::vector<Check> checks, std::vector<bool> want_error) {
    groups.push_back(Group{std::move(checks), std::move(want_error)});
  };
  const uint64_t one = 1;
  if (self == ch.ring[0].producer()) {
    group({{"ringbuffer push",
            [&](ChannelThread& t) {
              return ch.ring[0].push(t, &one, 8, milliseconds(500)).status();
            }}},
          {true});
  }
  group(
      {{"queue push", [&](ChannelThread& t) { return ch.queue[0].push(t, 8, milliseconds(500)); }},
       {"queue pop",
        [&](ChannelThread& t) { return ch.queue[0].pop(t, milliseconds(500)).status(); }}},
      {true, true});
  group({{"kvstore get of the dead node's value",
          [&](ChannelThread& t) { return ch.kv->get(t, kKillVictimKey).status(); }}},
        {true});
  if (self == 1) {
    // One survivor only: the other would wait for this one's hold of the key lock first.
    group({{"kvstore update of the dead node's value",
            [&](ChannelThread& t) { return ch.kv->update(t, kKillVictimKey, 5); }}},
          {true});
  }
  uint64_t failed_key = 0;
  group({{"kvstore insert",
          [&](ChannelThread& t) {
            // Until one fails at its tracker broadcast (a key whose lock is not homed at the
            // dead node).
            Status st;
            for (uint64_t key = key_base; key < key_base + 32; key++) {
              st = ch.kv->insert(t, key, 1);
              failed_key = key;
              if (!st.ok() && st.ToString().find("/tracker/") != std::string::npos) break;
            }
            return st;
          }},
         {"kvstore: the failed insert left no key here",
          [&](ChannelThread& t) {
            Status up = ch.kv->update(t, failed_key, 2);
            Status get = ch.kv->get(t, failed_key).status();
            if (up.code() != Code::kNotFound || get.code() != Code::kNotFound) {
              return Status::Internal("key " + std::to_string(failed_key) + ": update " +
                                      up.ToString() + ", get " + get.ToString() +
                                      " (want not found)");
            }
            return Status::OK();
          }},
         {"kvstore get of a survivor's value",
          [&](ChannelThread& t) {
            auto v = ch.kv->get(t, kKillSurvivorKey);
            if (!v.ok()) return v.status();
            return *v == 11 ? Status::OK()
                            : Status::Internal("value " + std::to_string(*v) + ", want 11");
          }}},
        {true, false, false});
  group({{"barrier",
          [&](ChannelThread& t) { return ch.barrier[0].arrive_and_wait(t, milliseconds(500)); }}},
        {true});
  group({{"ticket lock homed at the dead node",
          [&](ChannelThread& t) { return ch.lock3[0].lock(t, milliseconds(500)); }}},
        {true});
  group({{"ticket lock the dead node held",
          [&](ChannelThread& t) { return ch.held[0].lock(t, milliseconds(500)); }}},
        {true});
  group({{"atomic var homed at the dead node",
          [&](ChannelThread& t) { return ch.atom[0].fetch_add(t, 1).status(); }}},
        {true});
  group({{"owned var pull from the dead owner",
          [&](ChannelThread& t) { return ch.owned[0].pull(t).status(); }}},
        {true});
  std::vector<std::vector<KillCheck>> results(groups.size());
  std::vector<std::thread> threads;
  for (size_t g = 0; g < groups.size(); g++) {
    threads.emplace_back([&, g] {
      auto thr = mgr.make_thread();
      for (size_t i = 0; i < groups[g].checks.size(); i++) {
        const auto& [what, fn] = groups[g].checks[i];
        const bool want_error = groups[g].want_error[i];
        const auto t0 = std::chrono::steady_clock::now();
        KillCheck c{what, thr.ok() ? fn(**thr) : thr.status(), 0, want_error, false};
        c.ms =
            std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0).count();
        c.passed = (want_error ? !c.status.ok() : c.status.ok()) && c.ms < limit.count();
        results[g].push_back(std::move(c));
      }
    });
  }
  for (auto& t : threads) t.join();
  std::vector<KillCheck> out;
  for (auto& r : results) {
    for (auto& c : r) out.push_back(std::move(c));
  }
  return out;
}

}  // namespace farmem::channels
