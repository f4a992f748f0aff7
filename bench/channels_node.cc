// One participant process of `farmem bench channels` (`farmem bench channels-node`): a Node and a
// channels Manager over the static participant list, one workload, one JSON line on stdout. One
// thread (plus the node's own transport/RPC threads); every participant runs the same code.
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_stats.h"
#include "channels/channel_wire.h"
#include "channels/channels_faults.h"
#include "channels/kill_scenario.h"
#include "channels/kv_history.h"
#include "channels_bench.h"
#include "farmem/channels.h"
#include "farmem/node.h"
#include "zipf.h"

namespace farmem {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using channels::AckKey;
using channels::ChannelThread;
using channels::NodeId;

constexpr auto kReadyTimeout = 60s;
constexpr auto kBarrierTimeout = 60s;
constexpr auto kLockTimeout = 30s;
constexpr auto kOpTimeout = 30s;
constexpr int64_t kInitialBalance = 1000;
constexpr auto kKillOpTimeout = 2s;
constexpr auto kKillCheckLimit = 5s;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The participants and the objects every workload shares: a start/end barrier.
struct Participant {
  const ChannelsNodeOptions& o;
  NodeId self;
  std::vector<NodeId> members;
  std::unique_ptr<Node> node;
  std::unique_ptr<channels::Manager> mgr;
  std::unique_ptr<ChannelThread> thr;
  std::unique_ptr<channels::Barrier> sync;  // start and end of every workload (not timed)

  Status Sync() { return sync->arrive_and_wait(*thr, kBarrierTimeout); }
};

// Bytes of channel state this node holds for the workload, plus room for the small channels.
size_t RegionBytes(const ChannelsNodeOptions& o) {
  size_t bytes = size_t{1} << 20;
  if (o.workload == "transfer") {
    const size_t n = o.peers.size();
    bytes += (static_cast<size_t>(o.accounts) + n - 1) / n * 8 +
             static_cast<size_t>(o.locks_per_node) * n * 64;
  }
  return (bytes + 4095) / 4096 * 4096;
}

Status Start(Participant& p) {
  NodeConfig c;
  c.name = fmt::format("channels-bench-{}", p.self);
  const std::string& me = p.o.peers[p.self - 1];
  const size_t colon = me.rfind(':');
  if (colon == std::string::npos) return Status::InvalidArgument("peer '" + me + "': no port");
  c.bootstrap_host = me.substr(0, colon);
  c.bootstrap_port = static_cast<uint16_t>(std::stoul(me.substr(colon + 1)));
  if (p.o.backend.rfind("fabric:", 0) == 0) {
    c.transport.backend = "fabric";
    c.transport.provider = p.o.backend.substr(7);
  } else {
    c.transport.backend = p.o.backend;
  }
  c.transport.listen_host = c.bootstrap_host;
  if (p.o.nic_spin_us >= 0)
    c.transport.spin_before_sleep = std::chrono::microseconds(p.o.nic_spin_us);
  // The kill scenario checks that the survivors' calls fail within seconds of the death.
  c.transport.op_timeout = p.o.workload == "kill" ? kKillOpTimeout : kOpTimeout;
  auto node = Node::Create(c);
  if (!node.ok()) return node.status();
  p.node = std::move(*node);
  channels::ManagerConfig mc;
  mc.self = p.self;
  for (size_t i = 0; i < p.o.peers.size(); i++) {
    mc.participants.push_back({static_cast<NodeId>(i + 1), p.o.peers[i]});
    p.members.push_back(static_cast<NodeId>(i + 1));
  }
  mc.region_bytes = RegionBytes(p.o);
  auto mgr = channels::Manager::Create(*p.node, mc);
  if (!mgr.ok()) return mgr.status();
  p.mgr = std::move(*mgr);
  if (Status st = p.node->start(); !st.ok()) return st;
  if (Status st = p.mgr->connect(kReadyTimeout); !st.ok()) return st;
  auto thr = p.mgr->make_thread();
  if (!thr.ok()) return thr.status();
  p.thr = std::move(*thr);
  auto bar = channels::Barrier::Open(*p.thr, "bench/sync", p.members);
  if (!bar.ok()) return bar.status();
  p.sync = std::make_unique<channels::Barrier>(std::move(*bar));
  return p.sync->wait_ready(kReadyTimeout);
}

// Transfer transactions: account i lives on node i % n + 1 in slot i / n of channel
// "xfer/accounts"; it is guarded by ticket lock (i / n) % L of its node (the layout of the MPI
// baseline's windows). Locks are taken in (lock index, node) order, so transfers never wait in a
// cycle. The sum of all balances must stay accounts x 1000 (checked by the benchmark).
Status Transfer(Participant& p, nlohmann::json& out) {
  const ChannelsNodeOptions& o = p.o;
  ChannelThread& t = *p.thr;
  const size_t n = p.members.size();
  const size_t slots = (static_cast<size_t>(o.accounts) + n - 1) / n;
  auto accounts = channels::Channel::Open(t, "xfer/accounts", p.members, slots * 8);
  if (!accounts.ok()) return accounts.status();
  std::vector<channels::TicketLock> locks;  // [(node - 1) * L + k]
  for (NodeId home : p.members) {
    for (int k = 0; k < o.locks_per_node; k++) {
      auto l =
          channels::TicketLock::Open(t, fmt::format("xfer/lock/{}/{}", home, k), home, p.members);
      if (!l.ok()) return l.status();
      locks.push_back(std::move(*l));
    }
  }
  if (Status st = accounts->wait_ready(kReadyTimeout); !st.ok()) return st;
  for (auto& l : locks)
    if (Status st = l.wait_ready(kReadyTimeout); !st.ok()) return st;
  std::vector<uint64_t> base(n + 1);
  for (NodeId m : p.members) {
    auto off = accounts->slice_offset(m);
    if (!off.ok()) return off.status();
    base[m] = *off;
  }
  // This node's accounts start with the initial balance (before the start barrier, so before any
  // remote access).
  auto* mine = reinterpret_cast<int64_t*>(accounts->local_slice());
  for (size_t s = 0; s < slots; s++)
    mine[s] = s * n + (p.self - 1) < static_cast<size_t>(o.accounts) ? kInitialBalance : 0;
  if (Status st = p.Sync(); !st.ok()) return st;

  std::mt19937_64 rng(0x9e3779b97f4a7c15ULL * (p.self + 1));
  std::uniform_int_distribution<long> pick(0, o.accounts - 1);
  long ops = 0, acquisitions = 0;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(o.seconds);
  while (Clock::now() < end) {
    long a = pick(rng), b = pick(rng);
    while (b == a) b = pick(rng);
    const int64_t amount = static_cast<int64_t>(rng() % 10) + 1;
    struct Acc {
      NodeId node;
      size_t lock;  // index in `locks`
      uint64_t offset;
      int64_t value;
    } acc[2];
    for (int k = 0; k < 2; k++) {
      const size_t i = static_cast<size_t>(k == 0 ? a : b);
      const size_t slot = i / n;
      const NodeId node = static_cast<NodeId>(i % n + 1);
      acc[k] = {node, (node - 1) * o.locks_per_node + slot % o.locks_per_node,
                base[node] + slot * 8, 0};
    }
    const bool same = acc[0].lock == acc[1].lock;
    // Order by (lock index within the node, node), as the MPI baseline's (window, rank).
    auto key = [&](const Acc& x) { return std::make_pair(x.lock % o.locks_per_node, x.node); };
    const int first = key(acc[0]) <= key(acc[1]) ? 0 : 1;
    const int nlocks = same ? 1 : 2;
    for (int k = 0; k < nlocks; k++) {
      if (Status st = locks[acc[k == 0 ? first : 1 - first].lock].lock(t, kLockTimeout); !st.ok())
        return st;
    }
    acquisitions += nlocks;
    AckKey reads;
    for (auto& x : acc) {
      auto r = t.read(x.node, x.offset, &x.value, 8);
      if (!r.ok()) return r.status();
      reads |= *r;
    }
    if (Status st = t.wait(reads, kOpTimeout); !st.ok()) return st;
    acc[0].value -= amount;
    acc[1].value += amount;
    for (auto& x : acc) {
      // Writes copy their source at posting; unlock's thread fence places them.
      if (auto w = t.write(x.node, x.offset, &x.value, 8); !w.ok()) return w.status();
    }
    for (int k = nlocks - 1; k >= 0; k--) {
      if (Status st = locks[acc[k == 0 ? first : 1 - first].lock].unlock(t, kLockTimeout); !st.ok())
        return st;
    }
    ops++;
  }
  const double secs = SecondsSince(t0);
  if (Status st = p.Sync(); !st.ok()) return st;
  // Every transfer's writes were placed before its unlock and before the end barrier.
  int64_t sum = 0;
  for (size_t s = 0; s < slots; s++) sum += mine[s];
  out["ops"] = ops;
  out["seconds"] = secs;
  out["acquisitions"] = acquisitions;
  out["balance_sum"] = sum;
  return Status::OK();
}

// One ticket lock at node 1 around a non-atomic read, +1, write of a counter at node 1; the final
// counter must equal the number of acquisitions.
Status Lock(Participant& p, nlohmann::json& out) {
  ChannelThread& t = *p.thr;
  auto lock = channels::TicketLock::Open(t, "one/lock", 1, p.members);
  if (!lock.ok()) return lock.status();
  auto counter = channels::Channel::Open(t, "one/counter", p.members, 8);
  if (!counter.ok()) return counter.status();
  if (Status st = lock->wait_ready(kReadyTimeout); !st.ok()) return st;
  if (Status st = counter->wait_ready(kReadyTimeout); !st.ok()) return st;
  auto off = counter->slice_offset(1);
  if (!off.ok()) return off.status();
  if (Status st = p.Sync(); !st.ok()) return st;
  long ops = 0;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(p.o.seconds);
  while (Clock::now() < end) {
    if (Status st = lock->lock(t, kLockTimeout); !st.ok()) return st;
    uint64_t v = 0;
    if (Status st = t.read_sync(1, *off, &v, 8); !st.ok()) return st;
    v++;
    if (auto w = t.write(1, *off, &v, 8); !w.ok()) return w.status();
    if (Status st = lock->unlock(t, kLockTimeout); !st.ok()) return st;
    ops++;
  }
  const double secs = SecondsSince(t0);
  if (Status st = p.Sync(); !st.ok()) return st;
  out["ops"] = ops;
  out["seconds"] = secs;
  out["acquisitions"] = ops;
  if (p.self == 1) {
    uint64_t v = 0;
    if (Status st = t.read_sync(1, *off, &v, 8); !st.ok()) return st;
    out["counter"] = v;
  }
  return Status::OK();
}

// `episodes` timed barrier episodes after 100 untimed ones; every sample goes to the benchmark.
Status BarrierLatency(Participant& p, nlohmann::json& out) {
  ChannelThread& t = *p.thr;
  auto bar = channels::Barrier::Open(t, "timed/bar", p.members);
  if (!bar.ok()) return bar.status();
  auto probe = channels::Channel::Open(t, "timed/probe", p.members, 64);
  if (!probe.ok()) return probe.status();
  if (Status st = bar->wait_ready(kReadyTimeout); !st.ok()) return st;
  if (Status st = probe->wait_ready(kReadyTimeout); !st.ok()) return st;
  for (int i = 0; i < 100; i++)
    if (Status st = bar->arrive_and_wait(t, kBarrierTimeout); !st.ok()) return st;
  // The barrier's parts, timed alone (not judged; bench/README.md explains the barrier with them):
  // a read of the own table through the transport (each poll of the wait), a read from a peer,
  // and one 8-byte write to every member, waited for (the arrival).
  {
    const NodeId peer = static_cast<NodeId>(p.self % p.members.size() + 1);
    std::vector<int64_t> self_ns, peer_ns, write_ns;
    uint64_t buf[3] = {};
    for (int i = 0; i < 300; i++) {
      auto a = Clock::now();
      if (Status st = t.read_sync(p.self, *probe->slice_offset(p.self), buf, 24); !st.ok())
        return st;
      self_ns.push_back((Clock::now() - a).count());
      a = Clock::now();
      if (Status st = t.read_sync(peer, *probe->slice_offset(peer), buf, 24); !st.ok()) return st;
      peer_ns.push_back((Clock::now() - a).count());
      a = Clock::now();
      AckKey all;
      for (NodeId m : p.members) {
        auto w = t.write(m, *probe->slice_offset(m) + 8 * p.self, &buf[0], 8);
        if (!w.ok()) return w.status();
        all |= *w;
      }
      if (Status st = t.wait(all, kOpTimeout); !st.ok()) return st;
      write_ns.push_back((Clock::now() - a).count());
    }
    out["probe_p50_us"] = {{"read_own_table", bench::Percentile(self_ns, 50) / 1e3},
                           {"read_peer", bench::Percentile(peer_ns, 50) / 1e3},
                           {"write_all_members", bench::Percentile(write_ns, 50) / 1e3}};
  }
  if (Status st = bar->arrive_and_wait(t, kBarrierTimeout); !st.ok()) return st;
  std::vector<int64_t> ns;
  ns.reserve(static_cast<size_t>(p.o.episodes));
  const auto t0 = Clock::now();
  for (long i = 0; i < p.o.episodes; i++) {
    const auto a = Clock::now();
    if (Status st = bar->arrive_and_wait(t, kBarrierTimeout); !st.ok()) return st;
    ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - a).count());
  }
  out["ops"] = p.o.episodes;
  out["seconds"] = SecondsSince(t0);
  out["samples_ns"] = ns;
  return Status::OK();
}

// Updates of an owned variable: store a 32-byte value, push it to the other members' caches, then
// bump a version word (an atomic_var at the next node) — the release pattern of a kvstore update
// (value, fence, release). Fenced: a thread fence between the push and the bump, so a reader that
// sees the version sees the value. Unfenced: push and bump in flight together. Each update is
// complete before the next; blocks of each kind alternate (order flipped every round).
Status Fence(Participant& p, nlohmann::json& out) {
  ChannelThread& t = *p.thr;
  using Value = std::array<uint64_t, 4>;
  std::vector<channels::OwnedVar<Value>> vars;
  for (NodeId owner : p.members) {
    auto v = channels::OwnedVar<Value>::Open(t, fmt::format("upd/val/{}", owner), owner, p.members);
    if (!v.ok()) return v.status();
    vars.push_back(std::move(*v));
  }
  std::vector<channels::AtomicVar> versions;
  for (NodeId owner : p.members) {
    const NodeId home = static_cast<NodeId>(owner % p.members.size() + 1);
    auto v = channels::AtomicVar::Open(t, fmt::format("upd/ver/{}", owner), home, p.members);
    if (!v.ok()) return v.status();
    versions.push_back(std::move(*v));
  }
  for (auto& v : vars)
    if (Status st = v.wait_ready(kReadyTimeout); !st.ok()) return st;
  for (auto& v : versions)
    if (Status st = v.wait_ready(kReadyTimeout); !st.ok()) return st;
  auto& var = vars[p.self - 1];
  auto& version = versions[p.self - 1];
  if (Status st = p.Sync(); !st.ok()) return st;
  uint64_t seq = 0;
  auto block = [&](bool fenced, double seconds, double* rate) -> Status {
    long n = 0;
    const auto t0 = Clock::now();
    const auto end = t0 + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      seq++;
      if (Status st = var.store(Value{seq, seq, seq, seq}); !st.ok()) return st;
      auto pushed = var.push(t);
      if (!pushed.ok()) return pushed.status();
      uint64_t old = 0;
      if (fenced) {
        if (Status st = t.fence_thread(kOpTimeout); !st.ok()) return st;
        auto r = version.fetch_add(t, 1);
        if (!r.ok()) return r.status();
      } else {
        auto bump = version.fetch_add_async(t, 1, &old);
        if (!bump.ok()) return bump.status();
        if (Status st = t.wait(*pushed | *bump, kOpTimeout); !st.ok()) return st;
      }
      n++;
    }
    *rate = static_cast<double>(n) / SecondsSince(t0);
    return Status::OK();
  };
  std::vector<double> fenced, unfenced;
  for (int r = 0; r < p.o.rounds; r++) {
    double f = 0, u = 0;
    const bool fenced_first = r % 2 == 0;
    if (Status st = block(fenced_first, p.o.seconds, fenced_first ? &f : &u); !st.ok()) return st;
    if (Status st = block(!fenced_first, p.o.seconds, fenced_first ? &u : &f); !st.ok()) return st;
    fenced.push_back(f);
    unfenced.push_back(u);
  }
  if (Status st = p.Sync(); !st.ok()) return st;
  out["fenced_rates"] = fenced;
  out["unfenced_rates"] = unfenced;
  return Status::OK();
}

// The kvstore workloads: kKvKeys keys of kKvValueBytes, key k inserted by node k % n + 1 (its
// value lives there, in slot k / n); word i of key k's value is k * 4 + i (checked on every get).
constexpr uint64_t kKvKeys = 1200;
constexpr size_t kKvValueWords = 4;
constexpr size_t kKvValueBytes = 8 * kKvValueWords;
using KvValue = std::array<uint64_t, kKvValueWords>;

KvValue KvValueOf(uint64_t key, uint64_t version) {
  KvValue v;
  for (size_t i = 0; i < kKvValueWords; i++) v[i] = key * 4 + i + (version << 32);
  return v;
}

// The store, and a plain channel of the same slot size and placement (the raw-read and the
// test-and-set baselines): key k's slot there is at raw_base[home - 1] + slot_bytes * (k / n).
struct KvBench {
  std::unique_ptr<channels::KvStore> kv;
  channels::Channel raw;
  std::vector<uint64_t> raw_base;  // per member
  size_t slot_bytes = channels::wire::KvSlotBytes(kKvValueWords);
  NodeId Home(uint64_t k) const { return static_cast<NodeId>(k % raw_base.size() + 1); }
  uint64_t RawOffset(uint64_t k) const {
    return raw_base[k % raw_base.size()] + slot_bytes * (k / raw_base.size());
  }
};

// Opens both and inserts this node's keys.
Status KvSetup(Participant& p, KvBench* b) {
  std::unique_ptr<channels::KvStore>* kv = &b->kv;
  channels::Channel* raw = &b->raw;
  ChannelThread& t = *p.thr;
  const uint64_t n = p.members.size();
  channels::KvConfig c;
  c.value_bytes = kKvValueBytes;
  c.slots_per_node = kKvKeys / n + 16;
  c.timeout = kOpTimeout;
  auto store = channels::KvStore::Open(t, "kv/bench", p.members, c);
  if (!store.ok()) return store.status();
  *kv = std::move(*store);
  auto ch = channels::Channel::Open(t, "kv/raw", p.members,
                                    channels::wire::KvSlotBytes(kKvValueWords) * c.slots_per_node);
  if (!ch.ok()) return ch.status();
  *raw = std::move(*ch);
  if (Status st = (*kv)->wait_ready(kReadyTimeout); !st.ok()) return st;
  if (Status st = raw->wait_ready(kReadyTimeout); !st.ok()) return st;
  for (NodeId m : p.members) {
    auto off = raw->slice_offset(m);
    if (!off.ok()) return off.status();
    b->raw_base.push_back(*off);
  }
  for (uint64_t k = p.self - 1; k < kKvKeys; k += n) {
    const KvValue v = KvValueOf(k, 0);
    if (Status st = (*kv)->insert(t, k, std::as_bytes(std::span<const uint64_t>(v))); !st.ok())
      return st;
  }
  return p.Sync();  // every key is in every index
}

// Blocks of `a` and `b` (each returns its op count) alternate for `rounds`, order flipped every
// round; per-block rates in ops/s.
Status Alternate(const ChannelsNodeOptions& o, const std::function<Result<long>(double)>& a,
                 const std::function<Result<long>(double)>& b, std::vector<double>* ra,
                 std::vector<double>* rb) {
  for (int r = 0; r < o.rounds; r++) {
    for (int side = 0; side < 2; side++) {
      const bool first_a = r % 2 == 0;
      const bool is_a = (side == 0) == first_a;
      const auto t0 = Clock::now();
      auto ops = is_a ? a(o.seconds) : b(o.seconds);
      if (!ops.ok()) return ops.status();
      (is_a ? ra : rb)->push_back(static_cast<double>(*ops) / SecondsSince(t0));
    }
  }
  return Status::OK();
}

// Keeps `n` operations in flight for `seconds` on one thread, completed oldest first: start(j)
// posts slot j's next operation, poll(j) returns its outcome once complete (nullopt while in
// flight), block(j) waits until it completes. Only the oldest slot is polled (every poll is a
// pass over the transport's sockets) and, while it is in flight, the thread sleeps in the
// transport instead of spinning (which would take the CPU from the NIC threads serving the
// reads). Stops starting at the end or at the first error, and returns only when no slot is in
// flight (their buffers are reused or freed next): the number completed, or the first error.
Result<long> KeepInFlight(size_t n, double seconds, const std::function<Status(size_t)>& start,
                          const std::function<std::optional<Status>(size_t)>& poll,
                          const std::function<void(size_t)>& block) {
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  std::deque<size_t> order;  // busy slots, oldest first
  Status first;
  long ops = 0;
  for (size_t j = 0; j < n && first.ok(); j++) {
    first = start(j);
    if (first.ok()) order.push_back(j);
  }
  while (!order.empty()) {
    const size_t j = order.front();
    std::optional<Status> st = poll(j);
    if (!st) {
      block(j);
      continue;
    }
    order.pop_front();
    if (!st->ok()) {
      if (first.ok()) first = *st;
      continue;
    }
    ops++;
    if (first.ok() && Clock::now() < end) {
      first = start(j);
      if (first.ok()) order.push_back(j);
    }
  }
  if (!first.ok()) return first;
  return ops;
}

// Uniform gets, kKvGetInFlight in flight on the one thread: the kvstore's asynchronous gets
// (index lookup, one one-sided read of the slot, checksum, valid and counter checks) against raw
// one-sided reads of the same number of bytes at the same place, as many in flight.
Status KvGet(Participant& p, nlohmann::json& out) {
  ChannelThread& t = *p.thr;
  KvBench b;
  if (Status st = KvSetup(p, &b); !st.ok()) return st;
  bench::SplitMix64 rng(p.self * 7919);
  long bad = 0;
  constexpr size_t kN = kKvGetInFlight;
  std::vector<uint64_t> keys(kN);
  std::vector<KvValue> values(kN);
  std::vector<channels::KvGet> gets(kN);
  auto kv_block = [&](double seconds) -> Result<long> {
    return KeepInFlight(
        kN, seconds,
        [&](size_t j) {
          keys[j] = rng.Below(kKvKeys);
          return b.kv->get_async(t, keys[j], std::as_writable_bytes(std::span<uint64_t>(values[j])),
                                 &gets[j]);
        },
        [&](size_t j) -> std::optional<Status> {
          if (!b.kv->get_poll(t, gets[j])) return std::nullopt;
          if (gets[j].status().ok()) bad += values[j] != KvValueOf(keys[j], 0);
          return gets[j].status();
        },
        [&](size_t j) { (void)b.kv->get_wait(t, gets[j]); });  // its outcome: the next poll
  };
  std::vector<std::array<uint64_t, channels::wire::KvSlotBytes(kKvValueWords) / 8>> bufs(kN);
  std::vector<AckKey> acks(kN);
  std::vector<std::optional<Status>> waited(kN);  // outcomes taken by block, not yet polled
  auto raw_block = [&](double seconds) -> Result<long> {
    return KeepInFlight(
        kN, seconds,
        [&](size_t j) {
          const uint64_t k = rng.Below(kKvKeys);
          auto key = t.read(b.Home(k), b.RawOffset(k), bufs[j].data(), b.slot_bytes);
          if (!key.ok()) return key.status();
          acks[j] = std::move(*key);
          return Status::OK();
        },
        [&](size_t j) -> std::optional<Status> {
          if (waited[j]) return std::exchange(waited[j], std::nullopt);
          if (!t.query(acks[j])) return std::nullopt;
          return t.wait(acks[j], 0ms);  // complete: its own outcome, at once
        },
        [&](size_t j) { waited[j] = t.wait(acks[j], kOpTimeout); });  // for the next poll
  };
  std::vector<double> kv_rates, raw_rates;
  if (Status st = Alternate(p.o, kv_block, raw_block, &kv_rates, &raw_rates); !st.ok()) return st;
  if (Status st = p.Sync(); !st.ok()) return st;
  out["kv_rates"] = kv_rates;
  out["raw_rates"] = raw_rates;
  out["in_flight"] = kN;
  out["bad_values"] = bad;
  return Status::OK();
}

// Zipf 0.99 updates of the same keys: the kvstore's update (its per-key ticket lock, value write,
// update fence, release) against a test-and-set lock word next to the data (CAS 0 -> 1 until it
// succeeds, write the value, fence, CAS 1 -> 0) in the raw channel's slot of the key.
Status KvWrite(Participant& p, nlohmann::json& out) {
  ChannelThread& t = *p.thr;
  KvBench b;
  if (Status st = KvSetup(p, &b); !st.ok()) return st;
  const bench::ZipfGenerator zipf(kKvKeys, 0.99);
  bench::SplitMix64 rng(p.self * 104729);
  uint64_t version = 0;
  long tas_retries = 0;
  auto ticket_block = [&](double seconds) -> Result<long> {
    long ops = 0;
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      const uint64_t k = zipf.Next(rng);
      const KvValue v = KvValueOf(k, ++version);
      Status st = b.kv->update(t, k, std::as_bytes(std::span<const uint64_t>(v)));
      if (!st.ok()) return st;
      ops++;
    }
    return ops;
  };
  auto tas_block = [&](double seconds) -> Result<long> {
    long ops = 0;
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      const uint64_t k = zipf.Next(rng);
      const NodeId home = b.Home(k);
      const uint64_t off = b.RawOffset(k);
      const auto give_up = Clock::now() + kLockTimeout;
      for (;;) {
        uint64_t old = 1;
        auto cas = t.compare_swap(home, off, 0, 1, &old);
        if (!cas.ok()) return cas.status();
        if (Status st = t.wait(*cas, kOpTimeout); !st.ok()) return st;
        if (old == 0) break;
        tas_retries++;
        if (Clock::now() > give_up) return Status::TimedOut("test-and-set lock: not acquired");
      }
      const KvValue v = KvValueOf(k, ++version);
      auto w = t.write(home, off + 8, v.data(), sizeof(v));
      if (!w.ok()) return w.status();
      if (Status st = t.fence_pair(home, kOpTimeout); !st.ok()) return st;
      uint64_t old = 0;
      auto rel = t.compare_swap(home, off, 1, 0, &old);
      if (!rel.ok()) return rel.status();
      if (Status st = t.wait(*rel, kOpTimeout); !st.ok()) return st;
      ops++;
    }
    return ops;
  };
  std::vector<double> ticket_rates, tas_rates;
  if (Status st = Alternate(p.o, ticket_block, tas_block, &ticket_rates, &tas_rates); !st.ok())
    return st;
  if (Status st = p.Sync(); !st.ok()) return st;
  out["ticket_rates"] = ticket_rates;
  out["tas_rates"] = tas_rates;
  out["tas_retries"] = tas_retries;  // failed CASes of the test-and-set lock
  return Status::OK();
}

// A kvstore history for the linearizability checker (tests/channels_netns_test.sh, one process
// per network namespace): kKvLinThreads client threads on this node, each with its own
// ChannelThread, run --ops operations of kv_history.h's mix (the one kvstore_test.cc checks in
// one process) and write them to --history; the times are CLOCK_MONOTONIC, one clock for every
// process on the machine, so the three files merge into one history.
constexpr int kKvLinThreads = 2;

Status KvHistory(Participant& p, nlohmann::json& out) {
  if (p.o.history.empty()) return Status::InvalidArgument("kvlin needs --history FILE");
  channels::KvConfig c;
  c.locks = 64;
  c.slots_per_node = 256;
  c.timeout = kOpTimeout;
  auto kv = channels::KvStore::Open(*p.thr, "kv/lin", p.members, c);
  const Status ready = kv.ok() ? (*kv)->wait_ready(kReadyTimeout) : kv.status();
  // Every node's store is open: start together (also after a failure here, so that every node
  // passes the same barrier episodes).
  Status st = p.Sync();
  if (!ready.ok()) st = ready;
  std::vector<std::vector<channels::KvHistoryOp>> hist(kKvLinThreads);
  std::vector<Status> errors(kKvLinThreads);
  if (st.ok()) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kKvLinThreads; t++) {
      threads.emplace_back([&, t] {
        const int client = static_cast<int>(p.self - 1) * kKvLinThreads + t;
        auto thr = p.mgr->make_thread();
        if (!thr.ok()) {
          errors[t] = thr.status();
          return;
        }
        std::mt19937_64 rng(static_cast<uint64_t>(client) + 1);
        // Exactly --ops operations per client (bursts of asynchronous gets included).
        const size_t want = static_cast<size_t>(p.o.ops);
        for (long i = 0; hist[t].size() < want; i++) {
          Status e;
          channels::KvHistoryNext(**kv, **thr, client, i, rng, want - hist[t].size(), &hist[t], &e);
          if (!e.ok()) {
            // An operation with an unknown outcome cannot be checked: this client stops.
            errors[t] = e.WithContext(fmt::format("client {} step {}", client, i));
            return;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    for (const Status& e : errors) {
      if (st.ok() && !e.ok()) st = e;
    }
  }
  // Everyone finished before any store closes: a peer's insert/erase waits for our tracker.
  if (Status s = p.Sync(); st.ok() && !s.ok()) st = s;
  if (!channels::WriteKvHistory(p.o.history, hist) && st.ok())
    st = Status::InvalidArgument("cannot write --history " + p.o.history);
  long ops = 0;
  for (const auto& h : hist) ops += static_cast<long>(h.size());
  out["ops"] = ops;
  return st;
}

// The kill scenario across network namespaces (tests/channels_kill_netns_test.sh; the same
// channels and checks as src/channels/kill_test.cc, channels/kill_scenario.h): node 3 is the
// victim, busy with every channel until the test SIGKILLs it (it prints "kill victim: busy, pid
// N" first); nodes 1 and 2 prepare (node 1 inserts the survivors' key and fills the ringbuffer,
// node 2 consumes it), print "kill survivor: ready", wait for --kill-marker to exist (the test
// creates it once the victim is dead), run the checks and report each in the JSON line.
Status KillScenario(Participant& p, nlohmann::json& out) {
  if (p.o.kill_marker.empty()) return Status::InvalidArgument("kill needs --kill-marker FILE");
  ChannelThread& t = *p.thr;
  channels::KillChannels ch;
  if (Status st = channels::OpenKillChannels(t, &ch, kReadyTimeout); !st.ok()) return st;
  auto wait_for = [](const std::function<bool()>& done, const char* what) -> Status {
    const auto deadline = Clock::now() + kReadyTimeout;
    while (!done()) {
      if (Clock::now() >= deadline) return Status::TimedOut(std::string("kill: ") + what);
      std::this_thread::sleep_for(1ms);
    }
    return Status::OK();
  };
  if (p.self == 3) {
    if (Status st = channels::KillVictimStart(t, ch); !st.ok()) return st;
    std::fprintf(stderr, "kill victim: busy, pid %d\n", static_cast<int>(getpid()));
    std::fflush(stderr);
    const auto end = Clock::now() + 2 * kReadyTimeout;
    for (uint64_t i = 1; Clock::now() < end; i++) channels::KillVictimStep(t, ch, i);
    return Status::TimedOut("kill victim: not killed in time");
  }
  if (p.self == 1) {
    Status st = wait_for([&] { return ch.kv->get(t, channels::kKillVictimKey).ok(); },
                         "the victim's key never appeared");
    if (!st.ok()) return st;
    if (st = ch.kv->insert(t, channels::kKillSurvivorKey, 11); !st.ok()) return st;
    const uint64_t one = 1;
    for (size_t i = 0; i < channels::kKillRingCapacity; i++) {
      auto seq = ch.ring[0].push(t, &one, 8, kReadyTimeout);
      if (!seq.ok()) return seq.status();
    }
  } else {
    uint8_t buf[8];
    for (size_t i = 0; i < channels::kKillRingCapacity; i++) {
      auto got = ch.ring[0].pop(t, buf, sizeof(buf), kReadyTimeout);
      if (!got.ok()) return got.status();
    }
    Status st = wait_for([&] { return ch.kv->get(t, channels::kKillSurvivorKey).ok(); },
                         "the survivors' key never appeared");
    if (!st.ok()) return st;
    if (st = t.fence_thread(kOpTimeout); !st.ok()) return st;
  }
  // The survivors meet again after their checks: neither stops its node while the other still
  // reads a value from it.
  auto survivors = channels::Barrier::Open(t, "kill/survivors", {1, 2});
  if (!survivors.ok()) return survivors.status();
  if (Status st = survivors->wait_ready(kReadyTimeout); !st.ok()) return st;
  std::fprintf(stderr, "kill survivor: ready\n");
  std::fflush(stderr);
  if (Status st = wait_for([&] { return access(p.o.kill_marker.c_str(), F_OK) == 0; },
                           "the marker never appeared");
      !st.ok()) {
    return st;
  }
  const auto checks =
      channels::KillSurvivorChecks(*p.mgr, ch, p.self, 2000 + 100 * p.self, kKillCheckLimit);
  nlohmann::json list = nlohmann::json::array();
  size_t failed = 0;
  for (const auto& c : checks) {
    list.push_back({{"what", c.what},
                    {"status", c.status.ToString()},
                    {"ms", c.ms},
                    {"want_error", c.want_error},
                    {"passed", c.passed}});
    if (!c.passed) failed++;
  }
  out["checks"] = list;
  out["failed"] = failed;
  if (Status st = survivors->arrive_and_wait(t, kBarrierTimeout); !st.ok()) return st;
  ch.kv.reset();  // its tracker thread stops before the node
  if (failed != 0) {
    return Status::Internal(
        fmt::format("kill: {} of {} survivor checks failed", failed, checks.size()));
  }
  return Status::OK();
}

}  // namespace

int RunChannelsNode(const ChannelsNodeOptions& o) {
  if (o.id < 1 || o.id > o.peers.size()) {
    std::fprintf(stderr, "channels-node: --id %u not in 1..%zu\n", o.id, o.peers.size());
    return 2;
  }
  // The benchmark's fail-without-protection check (docs/channels.md): ticket locks that do not
  // wait for their turn must show up as violations; the kvstore history (kvlin) must fail the
  // linearizability check without the acknowledgements or the update fence.
  if (const char* f = std::getenv("FARMEM_CHANNELS_FAULT"); f != nullptr) {
    const std::string fault = f;
    if (fault == "lock_wait") channels::testing::SetLockWaitDisabled(true);
    if (fault == "kv_acks") channels::testing::SetKvAcksDisabled(true);
    if (fault == "kv_update_fence") channels::testing::SetKvUpdateFenceDisabled(true);
    if (fault == "kv_rollback") channels::testing::SetKvRollbackDisabled(true);
  }
  Participant p{o, static_cast<NodeId>(o.id), {}, nullptr, nullptr, nullptr, nullptr};
  nlohmann::json out = {{"node", o.id}, {"workload", o.workload}};
  Status st = Start(p);
  if (st.ok()) {
    if (o.workload == "transfer") st = Transfer(p, out);
    if (o.workload == "lock") st = Lock(p, out);
    if (o.workload == "barrier") st = BarrierLatency(p, out);
    if (o.workload == "fence") st = Fence(p, out);
    if (o.workload == "kvget") st = KvGet(p, out);
    if (o.workload == "kvwrite") st = KvWrite(p, out);
    if (o.workload == "kvlin") st = KvHistory(p, out);
    if (o.workload == "kill") st = KillScenario(p, out);
  }
  // A last barrier: nobody stops its node while a peer still reads from it (not after a kill:
  // one participant is gone).
  if (st.ok() && o.workload != "kill") st = p.Sync();
  if (!st.ok()) out["error"] = st.ToString();
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  p.thr.reset();
  p.sync.reset();
  if (p.node) p.node->stop();
  p.mgr.reset();
  p.node.reset();
  return st.ok() ? 0 : 1;
}

}  // namespace farmem
