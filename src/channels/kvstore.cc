// KvStore (LOCO's key-value store, docs/channels.md "Kvstore"): application threads call
// insert/update/erase/get with their own ChannelThread; one tracker thread per store applies the
// other nodes' tracker records to the local index. The index is under index_mu_ (shared for
// gets), the free slots under slots_mu_, this node's tracker ring producer and its reserved room
// under ring_mu_; applied_ (per member) and caught_up_ (per lock) are atomics.
//
// Every member's slice: [lock words: ceil(locks / n) wire::TicketWords, lock i at member i % n,
// index i / n][catch-up rows: ceil(locks / n) rows of wire::KvCatchUpRowBytes(n), same
// indexing][slots_per_node slots of wire::KvSlotBytes(value words): wire::KvSlotHeader, value
// words, checksum]. Tracker records: wire::KvTrackerRecord. Failed modifications are undone or
// completed as docs/channels.md "Failed modifications" says.
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
#include "common/log.h"

namespace farmem::channels {

using Clock = std::chrono::steady_clock;
using detail::Checksum;

namespace {
constexpr size_t kHeaderWords = sizeof(wire::KvSlotHeader) / 8;
constexpr size_t kMaxValueBytes = 4096;
constexpr uint64_t kOpInsert = static_cast<uint64_t>(wire::KvTrackerOp::kInsert);
constexpr uint64_t kOpDelete = static_cast<uint64_t>(wire::KvTrackerOp::kDelete);
constexpr uint64_t kOpAbort = static_cast<uint64_t>(wire::KvTrackerOp::kAbort);
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
  if (config.slots_per_node == 0 || config.locks == 0) {
    return Status::InvalidArgument("kvstore: slots and locks must be > 0");
  }
  // An insert reserves room for its record and for the abort that may have to follow it.
  if (config.tracker_capacity < 2) {
    return Status::InvalidArgument("kvstore: tracker capacity must be >= 2");
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
  const size_t rows = (config.locks + members.size() - 1) / members.size();
  kv->lock_bytes_ = sizeof(wire::TicketWords) * rows;
  kv->catch_up_bytes_ = wire::KvCatchUpRowBytes(members.size()) * rows;
  kv->value_words_ = (config.value_bytes + 7) / 8;
  kv->slot_bytes_ = wire::KvSlotBytes(kv->value_words_);
  auto ch = Channel::Open(
      thread, name, members,
      kv->lock_bytes_ + kv->catch_up_bytes_ + kv->slot_bytes_ * config.slots_per_node);
  if (!ch.ok()) return ch.status();
  kv->ch_ = std::move(*ch);
  for (NodeId producer : members) {
    auto ring = RingBuffer::Open(thread, name + "/tracker/" + std::to_string(producer), producer,
                                 members, config.tracker_capacity, 8 * kMsgWords);
    if (!ring.ok()) return ring.status();
    kv->trackers_.push_back(std::move(*ring));
  }
  kv->applied_ = std::make_unique<std::atomic<uint64_t>[]>(members.size());
  kv->hold_ = std::make_unique<std::atomic<int>[]>(members.size());
  kv->caught_up_ = std::make_unique<std::atomic<uint32_t>[]>(config.locks);
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

void KvStore::testing_hold_tracker(NodeId producer, TrackerHold hold) {
  for (size_t i = 0; i < members_.size(); i++) {
    if (members_[i] == producer) hold_[i].store(static_cast<int>(hold));
  }
  // In force once the tracker began a new pass over the rings after the store.
  const uint64_t seen = scans_.load();
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (scans_.load() < seen + 2 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// The tracker: applies every other node's inserts, deletes and aborts, in each producer's order,
// and releases a record only once it is in the index (the producer's "all acks").
void KvStore::tracker_main(std::unique_ptr<ChannelThread> thread) {
  uint64_t msg[kMsgWords];
  // Test hook kHoldAfterApply: a ring whose last record is applied and not yet released.
  std::vector<bool> unreleased(trackers_.size(), false);
  while (!stop_.load(std::memory_order_relaxed)) {
    bool any = false;
    for (size_t i = 0; i < trackers_.size(); i++) {
      if (i == self_index_) continue;
      const auto hold = static_cast<TrackerHold>(hold_[i].load(std::memory_order_relaxed));
      auto& ring = trackers_[i];
      if (unreleased[i]) {
        if (hold != TrackerHold::kRun) continue;
        unreleased[i] = false;
        (void)ring.release(*thread);
      }
      if (hold == TrackerHold::kHold) continue;
      for (int n = 0; n < 16; n++) {
        auto len = ring.pop(*thread, msg, sizeof(msg), std::chrono::milliseconds(0),
                            /*release=*/false);
        if (!len.ok()) break;  // nothing yet (or the producer is gone: its waiters time out)
        if (*len == sizeof(msg)) apply(msg);
        applied_[i].fetch_add(1, std::memory_order_release);
        any = true;
        if (hold == TrackerHold::kHoldAfterApply) {
          unreleased[i] = true;
          break;
        }
        (void)ring.release(*thread);
      }
    }
    scans_.fetch_add(1);
    if (!any) std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  (void)thread->fence_thread(config_.timeout);
}

void KvStore::apply(const uint64_t* msg) {
  const uint64_t key = msg[1];
  const NodeId node = static_cast<NodeId>(msg[2]);
  const uint64_t slot = msg[3], counter = msg[4], ticket = msg[5];
  if (msg[0] == kOpInsert) {
    std::unique_lock lock(index_mu_);
    auto it = index_.find(key);
    // A record of an older modification of the key (a failed insert applied late, after the key
    // was inserted again elsewhere) never replaces a newer entry: tickets of one lock are in the
    // lock's real-time order.
    if (it != index_.end() && it->second.ticket > ticket &&
        !g_kv_ticket_order_disabled.load(std::memory_order_relaxed)) {
      return;
    }
    index_[key] = IndexEntry{node, slot, counter, ticket};
  } else if (msg[0] == kOpDelete || msg[0] == kOpAbort) {
    {
      std::unique_lock lock(index_mu_);
      auto it = index_.find(key);
      if (it != index_.end() && it->second.node == node && it->second.slot == slot &&
          it->second.counter == counter) {
        index_.erase(it);
      }
    }
    // The home frees an erased slot; an aborted one is its producer's (which applies no record
    // of its own ring) and is freed or kept by rollback_insert.
    if (msg[0] == kOpDelete && node == self_) {
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
  return *off + lock_bytes_ + catch_up_bytes_ + slot_bytes_ * slot;
}

Result<uint64_t> KvStore::lock_offset(uint64_t lock) const {
  auto off = ch_.slice_offset(members_[lock % members_.size()]);
  if (!off.ok()) return off.status();
  return *off + sizeof(wire::TicketWords) * (lock / members_.size());
}

Result<uint64_t> KvStore::catch_up_offset(uint64_t lock, size_t member) const {
  auto off = ch_.slice_offset(members_[lock % members_.size()]);
  if (!off.ok()) return off.status();
  return *off + lock_bytes_ + wire::KvCatchUpRowBytes(members_.size()) * (lock / members_.size()) +
         8 * member;
}

Status KvStore::check_value_bytes(size_t n) const {
  if (n == config_.value_bytes) return Status::OK();
  return Status::InvalidArgument("kvstore '" + name_ + "': values are " +
                                 std::to_string(config_.value_bytes) + " bytes, not " +
                                 std::to_string(n));
}

bool KvStore::take_fail(FailPoint point) {
  int want = static_cast<int>(point);
  return fail_next_.compare_exchange_strong(want, static_cast<int>(FailPoint::kNone));
}

Status KvStore::injected(const char* where) const {
  return Status::TimedOut(std::string("kvstore '") + name_ + "': injected failure (" + where + ")");
}

// Runs `body` holding the key's ticket lock, after catching up with the lock's roll-backs. The
// lock is always released, also when the body or the release fence fails (the body's writes then
// took effect or did not, and the body undid them), and the release fences first when `fence`
// (the caller's writes are placed before the next holder is served). The body's error, else the
// fence's, is the result; a failed release after a modification took effect is logged (the lock
// is then stuck: its home is unreachable) and the modification's OK stands.
Status KvStore::locked(ChannelThread& thread, uint64_t key, bool fence,
                       const std::function<Status(Held&)>& body) {
  const uint64_t li = Mix(key) % config_.locks;
  const NodeId home = members_[li % members_.size()];
  auto off = lock_offset(li);
  if (!off.ok()) return off.status();
  const std::string what = "kvstore '" + name_ + "' lock " + std::to_string(li);
  Held held;
  held.lock = li;
  uint64_t serving_word = 0;
  Status st =
      detail::TicketAcquire(thread, home, *off, config_.timeout, what, &held.ticket, &serving_word);
  if (!st.ok()) return st;
  st = catch_up(thread, li, serving_word);
  if (st.ok()) st = body(held);
  if (fence) {
    Status f = thread.fence_thread(config_.timeout);
    if (!f.ok() && st.ok()) st = f.WithContext(what + " release fence");
  }
  const uint64_t add = held.mark ? 1 + wire::kServingRollbackUnit : 1;
  Status un = detail::TicketRelease(thread, home, *off, config_.timeout, what, false, add);
  if (!un.ok()) {
    if (!st.ok()) return st;
    FARMEM_LOG_WARN("{} (the modification took effect; the lock is not released)", un.ToString());
  }
  return st;
}

// Before a modification looks its key up: when the lock's roll-back count moved since this node
// last looked, apply every record its catch-up row names (a roll-back or a completed erase some
// node did not acknowledge) before going on; kTimedOut if this node's tracker cannot get there.
Status KvStore::catch_up(ChannelThread& thread, uint64_t lock, uint64_t serving_word) {
  if (g_kv_catch_up_disabled.load(std::memory_order_relaxed)) return Status::OK();
  const auto count = static_cast<uint32_t>(serving_word >> 48);
  if (caught_up_[lock].load(std::memory_order_relaxed) == count) return Status::OK();
  // Written before the release that moved the count: this read, after the acquire, sees it.
  std::vector<uint64_t> row(members_.size(), 0);
  auto off = catch_up_offset(lock, 0);
  if (!off.ok()) return off.status();
  Status st = thread.read_sync(members_[lock % members_.size()], *off, row.data(), 8 * row.size());
  if (!st.ok()) return st.WithContext("kvstore '" + name_ + "' lock " + std::to_string(lock));
  const auto deadline = Clock::now() + config_.timeout;
  for (size_t m = 0; m < members_.size(); m++) {
    if (m == self_index_) continue;
    while (applied_[m].load(std::memory_order_acquire) < row[m]) {
      if (Clock::now() >= deadline) {
        return Status::TimedOut(
            "kvstore '" + name_ + "' lock " + std::to_string(lock) + ": record " +
            std::to_string(row[m]) + " of node " + std::to_string(members_[m]) +
            "'s tracker ring (a failed modification's roll-back) is not applied here within " +
            std::to_string(config_.timeout.count()) + " ms (applied " +
            std::to_string(applied_[m].load()) + "): not modifying");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  caught_up_[lock].store(count, std::memory_order_relaxed);
  return Status::OK();
}

// Names record `seq` of this node's tracker ring in the lock's catch-up row and has the release
// move the lock's roll-back count, so that every node applies it before modifying under the lock.
Status KvStore::mark_lock(ChannelThread& thread, Held& held, uint64_t seq) {
  auto off = catch_up_offset(held.lock, self_index_);
  if (!off.ok()) return off.status();
  auto k = thread.write(members_[held.lock % members_.size()], *off, &seq, 8);
  if (!k.ok()) return k.status();
  Status st = thread.wait(*k, config_.timeout);
  if (st.ok()) held.mark = true;
  return st;
}

Status KvStore::reserve(ChannelThread& thread, size_t records) {
  if (members_.size() == 1) return Status::OK();
  if (take_fail(FailPoint::kRingFull)) return injected("tracker ring full");
  std::lock_guard lock(ring_mu_);
  Status st = trackers_[self_index_].wait_room(thread, reserved_ + records, config_.timeout);
  if (st.ok()) reserved_ += records;
  return st;
}

void KvStore::unreserve(size_t records) {
  if (members_.size() == 1) return;
  std::lock_guard lock(ring_mu_);
  reserved_ -= std::min(reserved_, records);
}

// Appends `msg` to this node's tracker ring, in room reserve() promised (without a reservation:
// waits for room). `*appended` is the record's seq when it reached some node (also when the push
// failed at others), else 0.
Result<uint64_t> KvStore::push_reserved(ChannelThread& thread, const uint64_t* msg,
                                        std::vector<NodeId>* unreached, uint64_t* appended) {
  std::lock_guard lock(ring_mu_);
  if (reserved_ > 0) reserved_--;
  RingBuffer& ring = trackers_[self_index_];
  const uint64_t before = ring.last_pushed();
  auto seq = ring.push(thread, msg, 8 * kMsgWords, config_.timeout, unreached);
  *appended = ring.last_pushed() != before ? ring.last_pushed() : 0;
  return seq;
}

// Waits until every other node applied record `seq` of this node's tracker ring.
Status KvStore::wait_acks(ChannelThread& thread, uint64_t seq) {
  if (g_kv_acks_disabled.load(std::memory_order_relaxed)) return Status::OK();
  return trackers_[self_index_].wait_released(thread, seq, config_.timeout);
}

// An insert that failed after its record may have reached other nodes: this node's entry goes,
// an abort record follows the insert on the ring (every node that applied the insert applies it
// next), and unless every node acknowledged the abort the lock is marked, so that a node that did
// not catch up first. The slot is reused only once every node dropped its entry.
Status KvStore::rollback_insert(ChannelThread& thread, Held& held, uint64_t key, uint64_t slot,
                                uint64_t counter, bool valid_unknown, const Status& cause) {
  {
    std::unique_lock lock(index_mu_);
    auto it = index_.find(key);
    if (it != index_.end() && it->second.node == self_ && it->second.slot == slot &&
        it->second.counter == counter) {
      index_.erase(it);
    }
  }
  bool clean = true;  // no node can still hold an entry for the slot
  std::string note;
  if (valid_unknown) {
    // The valid write failed: whether it landed is unknown, so the slot is made invalid again
    // (on native TCP placed after it: one connection, in order).
    const uint64_t invalid = 0;
    auto off = slot_offset(self_, slot);
    Status st = off.status();
    if (off.ok()) {
      auto k = thread.write(self_, *off + offsetof(wire::KvSlotHeader, valid), &invalid, 8);
      st = k.ok() ? thread.wait(*k, config_.timeout) : k.status();
    }
    if (!st.ok()) {
      clean = false;
      note += "; the slot could not be made invalid again (" + st.ToString() + ")";
    }
  }
  if (members_.size() > 1) {
    const uint64_t msg[kMsgWords] = {kOpAbort, key, self_, slot, counter, held.ticket};
    std::vector<NodeId> unreached;
    uint64_t appended = 0;
    auto seq = push_reserved(thread, msg, &unreached, &appended);
    uint64_t mark = 0;
    if (seq.ok()) {
      Status acks = wait_acks(thread, *seq);
      if (!acks.ok()) {
        clean = false;
        mark = *seq;
        note += "; not every node has applied the roll-back yet (" + acks.ToString() +
                "): they do before modifying under this key's lock";
      }
    } else {
      clean = false;
      mark = appended;
      note += "; the roll-back did not reach every node (" + seq.status().ToString() + ")";
    }
    if (mark != 0) {
      Status m = mark_lock(thread, held, mark);
      if (!m.ok()) note += "; the lock could not be marked (" + m.ToString() + ")";
    }
  }
  if (clean) {
    std::lock_guard lock(slots_mu_);
    free_slots_.push_back(slot);
  }  // else the slot is kept out of use for good: a node may still point at it
  return Status(cause.code(), "kvstore '" + name_ + "': insert of key " + std::to_string(key) +
                                  " rolled back: " + std::string(cause.message()) + note);
}

Status KvStore::insert(ChannelThread& thread, uint64_t key, std::span<const std::byte> value) {
  Status bad = check_value_bytes(value.size());
  if (!bad.ok()) return bad;
  const bool undo = !g_kv_rollback_disabled.load(std::memory_order_relaxed);
  const bool broadcast = members_.size() > 1;
  return locked(thread, key, /*fence=*/true, [&](Held& held) -> Status {
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
    const std::string not_applied =
        "kvstore '" + name_ + "': insert of key " + std::to_string(key) + " not applied";
    // Nothing left this node yet: the slot goes back, the error is the outcome.
    auto give_back = [&](const Status& st) {
      if (undo) {
        std::lock_guard lock(slots_mu_);
        free_slots_.push_back(slot);
      }
      return st.WithContext(not_applied);
    };
    auto off = slot_offset(self_, slot);
    if (!off.ok()) return give_back(off.status());
    // The slot, not yet valid: a get that finds the new index entry early reads "absent".
    std::vector<uint64_t> rec(slot_bytes_ / 8, 0);
    rec[0] = key;
    rec[1] = counter;
    std::memcpy(&rec[kHeaderWords], value.data(), value.size());
    rec[kHeaderWords + value_words_] = SlotChecksum(key, counter, &rec[kHeaderWords], value_words_);
    Status s;
    if (take_fail(FailPoint::kSlotWrite)) {
      s = injected("slot write");
    } else {
      auto k = thread.write(self_, *off, rec.data(), slot_bytes_);
      s = k.ok() ? thread.wait(*k, config_.timeout) : k.status();
    }
    if (!s.ok()) return give_back(s);
    // Room for the record and for the abort that may have to follow it.
    if (broadcast && undo) {
      s = reserve(thread, 2);
      if (!s.ok()) return give_back(s);
    }
    {
      std::unique_lock lock(index_mu_);
      index_[key] = IndexEntry{self_, slot, counter, held.ticket};
    }
    if (broadcast) {
      const uint64_t msg[kMsgWords] = {kOpInsert, key, self_, slot, counter, held.ticket};
      std::vector<NodeId> unreached;
      uint64_t appended = 0;
      // With roll-back off the test hook's full ring fails here (no room was reserved first).
      Result<uint64_t> seq = !undo && take_fail(FailPoint::kRingFull)
                                 ? Result<uint64_t>(injected("tracker ring full"))
                                 : push_reserved(thread, msg, &unreached, &appended);
      if (!seq.ok()) {
        if (!undo) return seq.status().WithContext("kvstore '" + name_ + "' insert");
        if (appended == 0) {
          {
            std::unique_lock lock(index_mu_);
            index_.erase(key);
          }
          unreserve(1);
          return give_back(seq.status());
        }
        return rollback_insert(thread, held, key, slot, counter, false, seq.status());
      }
      s = take_fail(FailPoint::kAcks) ? injected("acknowledgements") : wait_acks(thread, *seq);
      if (!s.ok()) {
        if (!undo) return s.WithContext("kvstore '" + name_ + "' insert");
        return rollback_insert(thread, held, key, slot, counter, false, s);
      }
    }
    // Linearization point: every index has the entry, so no get that starts after this can miss.
    const uint64_t valid = 1;
    if (take_fail(FailPoint::kValidWrite)) {
      s = injected("valid write");
    } else {
      auto k = thread.write(self_, *off + offsetof(wire::KvSlotHeader, valid), &valid, 8);
      s = k.ok() ? thread.wait(*k, config_.timeout) : k.status();
    }
    if (!s.ok()) {
      if (!undo) return s;
      return rollback_insert(thread, held, key, slot, counter, true, s);
    }
    if (broadcast && undo) unreserve(1);  // the abort is not needed
    return Status::OK();
  });
}

Status KvStore::update(ChannelThread& thread, uint64_t key, std::span<const std::byte> value) {
  Status bad = check_value_bytes(value.size());
  if (!bad.ok()) return bad;
  // The update fence: the value write is placed before the lock is released (and before update
  // returns), so a get that starts later reads it.
  const bool fence = !g_kv_update_fence_disabled.load(std::memory_order_relaxed);
  Status st = locked(thread, key, fence, [&](Held&) -> Status {
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
  // A value write that failed (at the release fence) did not land, or its home is gone.
  if (!st.ok() && st.code() != Code::kNotFound) {
    return st.WithContext("kvstore '" + name_ + "': update of key " + std::to_string(key) +
                          " not applied");
  }
  return st;
}

Status KvStore::erase(ChannelThread& thread, uint64_t key) {
  const bool undo = !g_kv_rollback_disabled.load(std::memory_order_relaxed);
  const bool broadcast = members_.size() > 1;
  return locked(thread, key, /*fence=*/true, [&](Held& held) -> Status {
    IndexEntry e;
    if (!lookup(key, &e)) {
      return not_found(key);
    }
    const std::string not_applied =
        "kvstore '" + name_ + "': erase of key " + std::to_string(key) + " not applied";
    auto off = slot_offset(e.node, e.slot);
    if (!off.ok()) return off.status();
    // Room for the delete record before the linearization point: past it the erase completes.
    if (broadcast && undo) {
      Status s = reserve(thread, 1);
      if (!s.ok()) return s.WithContext(not_applied);
    }
    // Linearization point: the slot is invalid at its home.
    const uint64_t invalid = 0;
    auto k = thread.write(e.node, *off + offsetof(wire::KvSlotHeader, valid), &invalid, 8);
    Status s = k.ok() ? thread.wait(*k, config_.timeout) : k.status();
    if (!s.ok()) {
      if (broadcast && undo) unreserve(1);
      return s.WithContext(not_applied);
    }
    const uint64_t msg[kMsgWords] = {kOpDelete, key, e.node, e.slot, e.counter, held.ticket};
    apply(msg);  // this node's index (and its free list when the slot is ours)
    if (!broadcast) return Status::OK();
    // The home frees the slot when it applies the record.
    std::vector<NodeId> unreached;
    uint64_t appended = 0;
    // With roll-back off the test hook's full ring fails here (no room was reserved first).
    Result<uint64_t> seq = !undo && take_fail(FailPoint::kRingFull)
                               ? Result<uint64_t>(injected("tracker ring full"))
                               : push_reserved(thread, msg, &unreached, &appended);
    s = seq.status();
    if (s.ok())
      s = take_fail(FailPoint::kAcks) ? injected("acknowledgements") : wait_acks(thread, *seq);
    if (s.ok()) return Status::OK();
    if (!undo) return s.WithContext("kvstore '" + name_ + "' erase");
    // Past the linearization point the erase completes: every get already answers "absent"
    // (the slot is invalid, or reused with another counter), and a node that has not applied
    // the record applies it before it modifies under this lock (the mark).
    if (!seq.ok() && appended == 0) {
      // The one case left half done: this node's transport refused every post of the record
      // (it is stopping), so the other nodes still list the key (and find its slot invalid).
      return Status(s.code(), "kvstore '" + name_ + "': erase of key " + std::to_string(key) +
                                  " took effect at its home, but no other node was told: " +
                                  std::string(s.message()));
    }
    const uint64_t mark = seq.ok() ? *seq : appended;
    Status m = mark_lock(thread, held, mark);
    FARMEM_LOG_WARN(
        "kvstore '{}': erase of key {} took effect; not every node applied it yet "
        "({}){}",
        name_, key, s.ToString(), m.ok() ? "" : "; " + m.ToString());
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
