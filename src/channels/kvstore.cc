// KvStore (LOCO's key-value store, docs/channels.md "Kvstore"): application threads call
// insert/update/erase/get with their own ChannelThread; one tracker thread per store applies the
// other nodes' tracker records to the local index. The index is under index_mu_ (shared for
// gets), the free slots under slots_mu_, this node's tracker ring producer under ring_mu_.
//
// Every member's slice: [lock area: ceil(locks / n) wire::TicketWords, lock i at member i % n,
// index i / n][slots_per_node slots of wire::KvSlotBytes(value words): wire::KvSlotHeader, value
// words, checksum]. Tracker records: wire::KvTrackerRecord.
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "channels/channel_wire.h"
#include "channels/channels_faults.h"
#include "channels/manager_impl.h"

namespace farmem::channels {

using Clock = std::chrono::steady_clock;
using detail::Checksum;

namespace {
constexpr size_t kHeaderWords = sizeof(wire::KvSlotHeader) / 8;
constexpr size_t kMaxValueBytes = 4096;
constexpr uint64_t kOpInsert = static_cast<uint64_t>(wire::KvTrackerOp::kInsert);
constexpr uint64_t kOpDelete = static_cast<uint64_t>(wire::KvTrackerOp::kDelete);
constexpr size_t kMsgWords = sizeof(wire::KvTrackerRecord) / 8;

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// Checksum of a slot's counter, value words and key (chained: the value words are not adjacent
// to the key in the slot).
uint64_t SlotChecksum(uint64_t key, uint64_t counter, const uint64_t* value, size_t words) {
  const uint64_t inner = Checksum(counter, value, words);
  return Checksum(key, &inner, 1);
}

}  // namespace

Result<std::unique_ptr<KvStore>> KvStore::Open(ChannelThread& thread, std::string name,
                                               std::vector<NodeId> members, KvConfig config) {
  if (config.slots_per_node == 0 || config.locks == 0 || config.tracker_capacity == 0) {
    return Status::InvalidArgument("kvstore: slots, locks and tracker capacity must be > 0");
  }
  if (config.value_bytes == 0 || config.value_bytes > kMaxValueBytes) {
    return Status::InvalidArgument("kvstore: value_bytes must be 1.." +
                                   std::to_string(kMaxValueBytes));
  }
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  std::unique_ptr<KvStore> kv(new KvStore());
  kv->name_ = name;
  kv->config_ = config;
  kv->self_ = thread.manager().self();
  kv->members_ = members;
  auto me = std::find(members.begin(), members.end(), kv->self_);
  if (me == members.end()) return Status::InvalidArgument("kvstore '" + name + "': not a member");
  kv->self_index_ = static_cast<size_t>(me - members.begin());
  kv->lock_bytes_ =
      sizeof(wire::TicketWords) * ((config.locks + members.size() - 1) / members.size());
  kv->value_words_ = (config.value_bytes + 7) / 8;
  kv->slot_bytes_ = wire::KvSlotBytes(kv->value_words_);
  auto ch = Channel::Open(thread, name, members,
                          kv->lock_bytes_ + kv->slot_bytes_ * config.slots_per_node);
  if (!ch.ok()) return ch.status();
  kv->ch_ = std::move(*ch);
  for (NodeId producer : members) {
    auto ring = RingBuffer::Open(thread, name + "/tracker/" + std::to_string(producer), producer,
                                 members, config.tracker_capacity, 8 * kMsgWords);
    if (!ring.ok()) return ring.status();
    kv->trackers_.push_back(std::move(*ring));
  }
  kv->counters_.assign(config.slots_per_node, 0);
  for (uint64_t s = config.slots_per_node; s > 0; s--) kv->free_slots_.push_back(s - 1);
  auto tracker_thread = thread.manager().make_thread();
  if (!tracker_thread.ok()) return tracker_thread.status();
  KvStore* raw = kv.get();
  kv->tracker_ = std::thread(
      [raw, t = std::move(*tracker_thread)]() mutable { raw->tracker_main(std::move(t)); });
  return kv;
}

KvStore::~KvStore() {
  stop_ = true;
  if (tracker_.joinable()) tracker_.join();
}

Status KvStore::wait_ready(std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  Status st = ch_.wait_ready(timeout);
  if (!st.ok()) return st;
  for (const auto& r : trackers_) {
    st = r.wait_ready(
        std::max(std::chrono::milliseconds(1),
                 std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now())));
    if (!st.ok()) return st;
  }
  return Status::OK();
}

// The tracker: applies every other node's inserts and deletes, in each producer's order, and
// releases a record only once it is in the index (the producer's "all acks").
void KvStore::tracker_main(std::unique_ptr<ChannelThread> thread) {
  uint64_t msg[kMsgWords];
  while (!stop_.load(std::memory_order_relaxed)) {
    bool any = false;
    for (size_t i = 0; i < trackers_.size(); i++) {
      if (i == self_index_) continue;
      auto& ring = trackers_[i];
      for (int n = 0; n < 16; n++) {
        auto len = ring.pop(*thread, msg, sizeof(msg), std::chrono::milliseconds(0),
                            /*release=*/false);
        if (!len.ok()) break;  // nothing yet (or the producer is gone: its waiters time out)
        if (*len == sizeof(msg)) apply(msg);
        any = true;
        (void)ring.release(*thread);
      }
    }
    if (!any) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  (void)thread->fence_thread(config_.timeout);
}

void KvStore::apply(const uint64_t* msg) {
  const uint64_t key = msg[1];
  const NodeId node = static_cast<NodeId>(msg[2]);
  const uint64_t slot = msg[3], counter = msg[4];
  if (msg[0] == kOpInsert) {
    std::unique_lock lock(index_mu_);
    index_[key] = IndexEntry{node, slot, counter};
  } else if (msg[0] == kOpDelete) {
    {
      std::unique_lock lock(index_mu_);
      auto it = index_.find(key);
      if (it != index_.end() && it->second.node == node && it->second.slot == slot &&
          it->second.counter == counter) {
        index_.erase(it);
      }
    }
    if (node == self_) {
      std::lock_guard lock(slots_mu_);
      free_slots_.push_back(slot);
    }
  }
}

bool KvStore::lookup(uint64_t key, IndexEntry* e) const {
  std::shared_lock lock(index_mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  *e = it->second;
  return true;
}

Result<uint64_t> KvStore::slot_offset(NodeId node, uint64_t slot) const {
  auto off = ch_.slice_offset(node);
  if (!off.ok()) return off.status();
  return *off + lock_bytes_ + slot_bytes_ * slot;
}

Status KvStore::check_value_bytes(size_t n) const {
  if (n == config_.value_bytes) return Status::OK();
  return Status::InvalidArgument("kvstore '" + name_ + "': values are " +
                                 std::to_string(config_.value_bytes) + " bytes, not " +
                                 std::to_string(n));
}

// Runs `body` holding the key's ticket lock; the release fences first when `fence` (the caller's
// writes are placed before the next holder is served). body's error wins over the release's.
Status KvStore::locked(ChannelThread& thread, uint64_t key, bool fence,
                       const std::function<Status()>& body) {
  const uint64_t li = Mix(key) % config_.locks;
  const NodeId home = members_[li % members_.size()];
  auto off = ch_.slice_offset(home);
  if (!off.ok()) return off.status();
  const uint64_t offset = *off + sizeof(wire::TicketWords) * (li / members_.size());
  const std::string what = "kvstore '" + name_ + "' lock " + std::to_string(li);
  Status st = detail::TicketAcquire(thread, home, offset, config_.timeout, what, nullptr);
  if (!st.ok()) return st;
  st = body();
  Status un = detail::TicketRelease(thread, home, offset, config_.timeout, what, fence);
  return st.ok() ? un : st;
}

// Appends `msg` to this node's tracker ring and waits until every other node applied it.
Status KvStore::broadcast(ChannelThread& thread, const uint64_t* msg) {
  if (members_.size() == 1) return Status::OK();
  uint64_t seq = 0;
  {
    std::lock_guard lock(ring_mu_);
    auto s = trackers_[self_index_].push(thread, msg, 8 * kMsgWords, config_.timeout);
    if (!s.ok()) return s.status();
    seq = *s;
  }
  if (g_kv_acks_disabled.load(std::memory_order_relaxed)) return Status::OK();
  return trackers_[self_index_].wait_released(thread, seq, config_.timeout);
}

Status KvStore::insert(ChannelThread& thread, uint64_t key, std::span<const std::byte> value) {
  Status bad = check_value_bytes(value.size());
  if (!bad.ok()) return bad;
  return locked(thread, key, /*fence=*/true, [&]() -> Status {
    IndexEntry e;
    if (lookup(key, &e)) {
      return Status::FailedPrecondition("kvstore '" + name_ + "': key " + std::to_string(key) +
                                        " exists");
    }
    uint64_t slot = 0, counter = 0;
    {
      std::lock_guard lock(slots_mu_);
      if (free_slots_.empty()) {
        return Status::ResourceExhausted("kvstore '" + name_ + "': node " + std::to_string(self_) +
                                         " has no free slot");
      }
      slot = free_slots_.back();
      free_slots_.pop_back();
      counter = ++counters_[slot];
    }
    auto off = slot_offset(self_, slot);
    if (!off.ok()) return off.status();
    // The slot, not yet valid: a get that finds the new index entry early reads "absent".
    std::vector<uint64_t> rec(slot_bytes_ / 8, 0);
    rec[0] = key;
    rec[1] = counter;
    std::memcpy(&rec[kHeaderWords], value.data(), value.size());
    rec[kHeaderWords + value_words_] = SlotChecksum(key, counter, &rec[kHeaderWords], value_words_);
    auto k = thread.write(self_, *off, rec.data(), slot_bytes_);
    if (!k.ok()) return k.status();
    Status s = thread.wait(*k, config_.timeout);
    if (!s.ok()) return s;
    {
      std::unique_lock lock(index_mu_);
      index_[key] = IndexEntry{self_, slot, counter};
    }
    const uint64_t msg[kMsgWords] = {kOpInsert, key, self_, slot, counter};
    s = broadcast(thread, msg);
    if (!s.ok()) return s.WithContext("kvstore '" + name_ + "' insert");
    // Linearization point: every index has the entry, so no get that starts after this can miss.
    const uint64_t valid = 1;
    k = thread.write(self_, *off + offsetof(wire::KvSlotHeader, valid), &valid, 8);
    if (!k.ok()) return k.status();
    return thread.wait(*k, config_.timeout);
  });
}

Status KvStore::update(ChannelThread& thread, uint64_t key, std::span<const std::byte> value) {
  Status bad = check_value_bytes(value.size());
  if (!bad.ok()) return bad;
  // The update fence: the value write is placed before the lock is released (and before update
  // returns), so a get that starts later reads it.
  const bool fence = !g_kv_update_fence_disabled.load(std::memory_order_relaxed);
  return locked(thread, key, fence, [&]() -> Status {
    IndexEntry e;
    if (!lookup(key, &e)) {
      return not_found(key);
    }
    auto off = slot_offset(e.node, e.slot);
    if (!off.ok()) return off.status();
    // Value words and checksum in one write (placed at the value's home: the linearization
    // point).
    std::vector<uint64_t> words(value_words_ + 1, 0);
    std::memcpy(words.data(), value.data(), value.size());
    words[value_words_] = SlotChecksum(key, e.counter, words.data(), value_words_);
    auto k =
        thread.write(e.node, *off + sizeof(wire::KvSlotHeader), words.data(), 8 * words.size());
    return k.status();
  });
}

Status KvStore::erase(ChannelThread& thread, uint64_t key) {
  return locked(thread, key, /*fence=*/true, [&]() -> Status {
    IndexEntry e;
    if (!lookup(key, &e)) {
      return not_found(key);
    }
    auto off = slot_offset(e.node, e.slot);
    if (!off.ok()) return off.status();
    // Linearization point: the slot is invalid at its home.
    const uint64_t invalid = 0;
    auto k = thread.write(e.node, *off + offsetof(wire::KvSlotHeader, valid), &invalid, 8);
    if (!k.ok()) return k.status();
    Status s = thread.wait(*k, config_.timeout);
    if (!s.ok()) return s;
    const uint64_t msg[kMsgWords] = {kOpDelete, key, e.node, e.slot, e.counter};
    apply(msg);                  // this node's index (and its free list when the slot is ours)
    s = broadcast(thread, msg);  // the home frees the slot when it applies the record
    if (!s.ok()) return s.WithContext("kvstore '" + name_ + "' erase");
    return Status::OK();
  });
}

Status KvStore::not_found(uint64_t key) const {
  return Status::NotFound("kvstore '" + name_ + "': key " + std::to_string(key) + " not found");
}

void KvStore::finish(KvGet& g, Status st) {
  g.active_ = false;
  g.status_ = std::move(st);
}

// Looks the key up and posts the slot read (again after a torn read: the key may have moved).
void KvStore::start_read(ChannelThread& thread, KvGet& g) {
  IndexEntry e;
  if (!lookup(g.key_, &e)) return finish(g, not_found(g.key_));
  auto off = slot_offset(e.node, e.slot);
  if (!off.ok()) return finish(g, off.status());
  g.counter_ = e.counter;
  auto k = thread.read(e.node, *off, g.rec_.data(), slot_bytes_);
  if (!k.ok()) return finish(g, k.status().WithContext("kvstore '" + name_ + "' get"));
  g.ack_ = std::move(*k);
}

Status KvStore::get_async(ChannelThread& thread, uint64_t key, std::span<std::byte> out, KvGet* g) {
  if (g->active_) {
    return Status::FailedPrecondition("kvstore '" + name_ + "': get of key " +
                                      std::to_string(g->key_) + " still in flight on this handle");
  }
  g->key_ = key;
  g->out_ = out;
  g->active_ = true;
  g->status_ = Status::OK();
  Status bad = check_value_bytes(out.size());
  if (!bad.ok()) {
    finish(*g, std::move(bad));
    return Status::OK();
  }
  g->rec_.resize(slot_bytes_ / 8);
  g->deadline_ = Clock::now() + config_.timeout;
  start_read(thread, *g);
  return Status::OK();
}

bool KvStore::get_poll(ChannelThread& thread, KvGet& g) {
  if (!g.active_) return true;
  if (!thread.query(g.ack_)) return false;
  // Done: wait returns the read's own outcome at once (it is no longer outstanding).
  Status st = thread.wait(g.ack_, std::chrono::milliseconds(0));
  if (!st.ok()) {
    finish(g, st.WithContext("kvstore '" + name_ + "' get"));
    return true;
  }
  const uint64_t* rec = g.rec_.data();
  const uint64_t* value = rec + kHeaderWords;
  if (g_kv_checksum_disabled.load(std::memory_order_relaxed) ||
      value[value_words_] == SlotChecksum(rec[0], rec[1], value, value_words_)) {
    // Invalid: inserted but not yet linearized, or deleted (the read is the linearization
    // point). Another counter or key: deleted (and perhaps reused) after the lookup.
    if (rec[2] == 0 || rec[1] != g.counter_ || rec[0] != g.key_) {
      finish(g, not_found(g.key_));
    } else {
      std::memcpy(g.out_.data(), value, g.out_.size());
      finish(g, Status::OK());
    }
    return true;
  }
  // Torn by a concurrent update or insert: read again, from the index on.
  if (Clock::now() >= g.deadline_) {
    finish(g, Status::TimedOut("kvstore '" + name_ + "': key " + std::to_string(g.key_) +
                               " kept failing its checksum"));
    return true;
  }
  start_read(thread, g);
  return !g.active_;
}

Status KvStore::get_wait(ChannelThread& thread, KvGet& g) {
  // Each read completes within the transport's op_timeout (an error when its home is gone).
  const auto op_wait = thread.manager().impl().op_timeout() + std::chrono::seconds(1);
  while (!get_poll(thread, g)) {
    // wait consumes the read's error: it becomes g's outcome here, not in get_poll. The
    // transport ends a read at its op_timeout, so a kTimedOut of this wait (a second later) is
    // a transport that failed to; g's buffer is then still the read's destination.
    Status st = thread.wait(g.ack_, op_wait);
    if (!st.ok()) finish(g, st.WithContext("kvstore '" + name_ + "' get"));
  }
  return g.status();
}

Status KvStore::get(ChannelThread& thread, uint64_t key, std::span<std::byte> out) {
  KvGet g;
  Status st = get_async(thread, key, out, &g);
  if (!st.ok()) return st;
  return get_wait(thread, g);
}

Status KvStore::insert(ChannelThread& thread, uint64_t key, uint64_t value) {
  return insert(thread, key, std::as_bytes(std::span<const uint64_t>(&value, 1)));
}

Status KvStore::update(ChannelThread& thread, uint64_t key, uint64_t value) {
  return update(thread, key, std::as_bytes(std::span<const uint64_t>(&value, 1)));
}

Result<uint64_t> KvStore::get(ChannelThread& thread, uint64_t key) {
  uint64_t value = 0;
  Status st = get(thread, key, std::as_writable_bytes(std::span<uint64_t>(&value, 1)));
  if (!st.ok()) return st;
  return value;
}

}  // namespace farmem::channels
