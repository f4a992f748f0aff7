// RingBuffer (one producer broadcasting to many consumers), SharedQueue (MPMC FIFO) and
// SharedStateTable (one owned row per member) on Channel endpoints. A handle is used by one thread
// at a time; the slices are written by the transport on behalf of remote members and read through
// the transport (never with plain CPU loads).
//
// RingBuffer slice (same size on every member): [ack table: one u64 per member, used at the
// producer: records released by that consumer][capacity record slots, used at the consumers:
// wire::RingRecordHeader, then the payload padded to words].
// SharedQueue slice: [wire::QueueEnds (used at the home)][wire::QueueSlot ...]; slot i lives on
// members[i % n] at index i / n.
#include <algorithm>
#include <cstring>
#include <thread>

#include "channels/channel_wire.h"
#include "channels/channels_faults.h"
#include "channels/manager_impl.h"

namespace farmem::channels {

using Clock = std::chrono::steady_clock;
using detail::Checksum;

namespace {
constexpr size_t kRecordHeaderWords = sizeof(wire::RingRecordHeader) / 8;

size_t IndexOf(const std::vector<NodeId>& members, NodeId n) {
  return static_cast<size_t>(std::find(members.begin(), members.end(), n) - members.begin());
}

std::chrono::milliseconds Left(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}
}  // namespace

// ---- RingBuffer --------------------------------------------------------------------------------

Result<RingBuffer> RingBuffer::Open(ChannelThread& thread, std::string name, NodeId producer,
                                    std::vector<NodeId> members, size_t capacity,
                                    size_t max_record_bytes) {
  if (capacity == 0 || capacity > (size_t{1} << 20)) {
    return Status::InvalidArgument("ringbuffer: capacity must be 1..1048576");
  }
  if (max_record_bytes == 0 || max_record_bytes > (size_t{1} << 16)) {
    return Status::InvalidArgument("ringbuffer: max record size must be 1..65536 bytes");
  }
  if (std::find(members.begin(), members.end(), producer) == members.end()) {
    return Status::InvalidArgument("ringbuffer: the producer is not a member");
  }
  RingBuffer r;
  r.producer_ = producer;
  r.capacity_ = capacity;
  r.max_bytes_ = max_record_bytes;
  r.record_words_ = kRecordHeaderWords + (max_record_bytes + 7) / 8;
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  const size_t slice = 8 * members.size() + 8 * r.record_words_ * capacity;
  auto ch = Channel::Open(thread, std::move(name), std::move(members), slice);
  if (!ch.ok()) return ch.status();
  r.ch_ = std::move(*ch);
  return r;
}

uint64_t RingBuffer::slot_offset(uint64_t seq) const {
  return 8 * ch_.members().size() + 8 * record_words_ * ((seq - 1) % capacity_);
}

Status RingBuffer::read_acks(ChannelThread& thread, std::vector<uint64_t>* acks) const {
  // The table is written by the consumers through the transport: read it through it too.
  acks->assign(ch_.members().size(), 0);
  return thread.read_sync(producer_, *ch_.slice_offset(producer_), acks->data(), 8 * acks->size());
}

// Waits until every consumer released record `need` (cached minimum first, the ack table read
// only when short).
Status RingBuffer::wait_min_released(ChannelThread& thread, uint64_t need,
                                     Clock::time_point deadline,
                                     std::chrono::milliseconds timeout) {
  std::vector<uint64_t> acks;
  while (min_released_ < need) {
    Status st = read_acks(thread, &acks);
    if (!st.ok()) return st.WithContext("ringbuffer '" + ch_.name() + "'");
    uint64_t lowest = UINT64_MAX;
    std::string late;
    for (size_t i = 0; i < acks.size(); i++) {
      const NodeId m = ch_.members()[i];
      // A consumer that missed a record is not written to any more: its slots do not matter.
      if (m == producer_ || std::find(missed_.begin(), missed_.end(), m) != missed_.end()) continue;
      lowest = std::min(lowest, acks[i]);
      if (acks[i] < need) late += (late.empty() ? "" : ",") + std::to_string(ch_.members()[i]);
    }
    min_released_ = lowest;
    if (min_released_ >= need) break;
    if (Clock::now() >= deadline) {
      return Status::TimedOut("ringbuffer '" + ch_.name() + "': full, consumers " + late +
                              " have not released record " + std::to_string(need) + " within " +
                              std::to_string(timeout.count()) + " ms");
    }
    thread.poll();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  return Status::OK();
}

Status RingBuffer::wait_room(ChannelThread& thread, size_t records,
                             std::chrono::milliseconds timeout) {
  if (thread.manager().self() != producer_) {
    return Status::FailedPrecondition("ringbuffer '" + ch_.name() + "': only the producer pushes");
  }
  if (records > capacity_) {
    return Status::InvalidArgument("ringbuffer '" + ch_.name() + "': room for " +
                                   std::to_string(records) + " records asked, capacity " +
                                   std::to_string(capacity_));
  }
  if (records == 0) return Status::OK();
  // The last of the `records` pushes is seq next_ + records - 1; its slot last held record
  // (that seq) - capacity.
  const uint64_t last = next_ + records - 1;
  const uint64_t need = last > capacity_ ? last - capacity_ : 0;
  return wait_min_released(thread, need, Clock::now() + timeout, timeout);
}

Result<uint64_t> RingBuffer::push(ChannelThread& thread, const void* data, size_t len,
                                  std::chrono::milliseconds timeout,
                                  std::vector<NodeId>* unreached) {
  if (unreached != nullptr) unreached->clear();
  if (thread.manager().self() != producer_) {
    return Status::FailedPrecondition("ringbuffer '" + ch_.name() + "': only the producer pushes");
  }
  if (len == 0 || len > max_bytes_) {
    return Status::InvalidArgument("ringbuffer '" + ch_.name() + "': record of " +
                                   std::to_string(len) + " bytes (1.." +
                                   std::to_string(max_bytes_) + ")");
  }
  const auto deadline = Clock::now() + timeout;
  const uint64_t seq = next_;
  // Back-pressure: slot (seq - 1) % capacity last held record seq - capacity, which every
  // consumer must have released before it is overwritten.
  const uint64_t need = seq > capacity_ ? seq - capacity_ : 0;
  if (!g_ring_backpressure_disabled.load(std::memory_order_relaxed)) {
    Status st = wait_min_released(thread, need, deadline, timeout);
    if (!st.ok()) return st;
  }
  const size_t payload_words = (len + 7) / 8;
  std::vector<uint64_t> rec(kRecordHeaderWords + payload_words, 0);
  rec[0] = seq;
  rec[2] = len;
  std::memcpy(rec.data() + kRecordHeaderWords, data, len);
  rec[1] = Checksum(seq, rec.data() + 2, 1 + payload_words);
  // One write per consumer, waited for one by one, so that a consumer the record did not reach
  // is known by name.
  std::vector<std::pair<NodeId, AckKey>> keys;
  std::vector<NodeId> failed;
  Status first;
  for (NodeId m : ch_.members()) {
    if (m == producer_) continue;
    if (std::find(missed_.begin(), missed_.end(), m) != missed_.end()) {
      // It missed an earlier record, so it never pops this one: not written (fails at once).
      failed.push_back(m);
      if (first.ok()) {
        first = Status::Unavailable("consumer " + std::to_string(m) + " missed an earlier record");
      }
      continue;
    }
    auto off = ch_.slice_offset(m);
    Result<AckKey> key = off.ok()
                             ? thread.write(m, *off + slot_offset(seq), rec.data(), 8 * rec.size())
                             : Result<AckKey>(off.status());
    if (key.ok()) {
      keys.emplace_back(m, std::move(*key));
    } else {
      failed.push_back(m);
      if (first.ok()) first = key.status();
    }
  }
  // Placed at every consumer before push returns: a later wait_released or release fence of the
  // caller needs nothing else, and the record buffer is the transport's own copy.
  for (auto& [m, key] : keys) {
    Status st = thread.wait(key, Left(deadline) + thread.manager().impl().op_timeout());
    if (!st.ok()) {
      failed.push_back(m);
      if (first.ok()) first = st;
    }
  }
  if (keys.empty() && !failed.empty()) {
    // Nothing was posted: the seq is not used, the ring is as before.
    return first.WithContext("ringbuffer '" + ch_.name() + "' record " + std::to_string(seq));
  }
  // Once posted anywhere, the seq is used even if some consumer failed: the consumers it reached
  // deliver it, and the next record must not reuse its number (they would skip that one).
  if (!failed.empty() && g_ring_partial_seq_disabled.load(std::memory_order_relaxed)) {
    return first.WithContext("ringbuffer '" + ch_.name() + "' record " + std::to_string(seq));
  }
  next_ = seq + 1;
  if (!failed.empty()) {
    std::sort(failed.begin(), failed.end());
    for (NodeId m : failed) {
      if (std::find(missed_.begin(), missed_.end(), m) == missed_.end()) missed_.push_back(m);
    }
    std::string names;
    for (NodeId m : failed) names += (names.empty() ? "" : ",") + std::to_string(m);
    if (unreached != nullptr) *unreached = failed;
    return first.WithContext("ringbuffer '" + ch_.name() + "' record " + std::to_string(seq) +
                             " not placed at consumers " + names);
  }
  return seq;
}

Status RingBuffer::wait_released(ChannelThread& thread, uint64_t seq,
                                 std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  std::vector<uint64_t> acks;
  for (;;) {
    Status st = read_acks(thread, &acks);
    if (!st.ok()) return st.WithContext("ringbuffer '" + ch_.name() + "'");
    std::string late;
    for (size_t i = 0; i < acks.size(); i++) {
      if (ch_.members()[i] != producer_ && acks[i] < seq) {
        late += (late.empty() ? "" : ",") + std::to_string(ch_.members()[i]);
      }
    }
    if (late.empty()) return Status::OK();
    if (Clock::now() >= deadline) {
      return Status::TimedOut("ringbuffer '" + ch_.name() + "': consumers " + late +
                              " have not released record " + std::to_string(seq) + " within " +
                              std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(10));
  }
}

Result<size_t> RingBuffer::pop(ChannelThread& thread, void* out, size_t cap,
                               std::chrono::milliseconds timeout, bool release) {
  const NodeId self = thread.manager().self();
  if (self == producer_) {
    return Status::FailedPrecondition("ringbuffer '" + ch_.name() + "': the producer does not pop");
  }
  const auto deadline = Clock::now() + timeout;
  const uint64_t seq = next_;
  const uint64_t off = *ch_.slice_offset(self) + slot_offset(seq);
  std::vector<uint64_t> rec(record_words_);
  for (;;) {
    // Written by the producer through the transport: read through it as well.
    Status st = thread.read_sync(self, off, rec.data(), 8 * rec.size());
    if (!st.ok()) return st.WithContext("ringbuffer '" + ch_.name() + "'");
    if (rec[0] > seq) {
      return Status::Internal("ringbuffer '" + ch_.name() + "': record " + std::to_string(seq) +
                              " was overwritten by record " + std::to_string(rec[0]) +
                              " before it was consumed");
    }
    if (rec[0] == seq) {
      const bool check = !g_ring_checksum_disabled.load(std::memory_order_relaxed);
      const uint64_t len = rec[2];
      if (!check && len <= max_bytes_) {
        if (len > cap) return Status::InvalidArgument("ringbuffer: record larger than the buffer");
        std::memcpy(out, rec.data() + kRecordHeaderWords, len);
        break;
      }
      // A slot being overwritten shows a new seq with an old length or payload (or the reverse):
      // the checksum tells, and the record is read again.
      if (len >= 1 && len <= max_bytes_ &&
          rec[1] == Checksum(seq, rec.data() + 2, 1 + (len + 7) / 8)) {
        if (len > cap) {
          return Status::InvalidArgument("ringbuffer '" + ch_.name() + "': record of " +
                                         std::to_string(len) + " bytes, buffer of " +
                                         std::to_string(cap));
        }
        std::memcpy(out, rec.data() + kRecordHeaderWords, len);
        next_ = seq + 1;
        if (release) {
          auto key = this->release(thread);
          if (!key.ok()) return key.status();
        }
        return static_cast<size_t>(len);
      }
    }
    if (Clock::now() >= deadline) {
      return Status::TimedOut("ringbuffer '" + ch_.name() + "': record " + std::to_string(seq) +
                              " not received within " + std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(10));
  }
  // Checksum fault only.
  next_ = seq + 1;
  if (release) {
    auto key = this->release(thread);
    if (!key.ok()) return key.status();
  }
  return static_cast<size_t>(rec[2]);
}

Result<AckKey> RingBuffer::release(ChannelThread& thread) {
  const NodeId self = thread.manager().self();
  if (self == producer_) {
    return Status::FailedPrecondition("ringbuffer '" + ch_.name() +
                                      "': the producer releases nothing");
  }
  auto off = ch_.slice_offset(producer_);
  if (!off.ok()) return off.status();
  released_sent_ = next_ - 1;
  return thread.write(producer_, *off + 8 * IndexOf(ch_.members(), self), &released_sent_, 8);
}

// ---- SharedQueue -------------------------------------------------------------------------------

Result<SharedQueue> SharedQueue::Open(ChannelThread& thread, std::string name, NodeId home,
                                      std::vector<NodeId> members, size_t capacity) {
  if (capacity == 0 || capacity > (size_t{1} << 24)) {
    return Status::InvalidArgument("shared queue: capacity must be 1..16777216");
  }
  if (std::find(members.begin(), members.end(), home) == members.end()) {
    return Status::InvalidArgument("shared queue: the home is not a member");
  }
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  SharedQueue q;
  q.home_ = home;
  q.capacity_ = capacity;
  const size_t per_member = (capacity + members.size() - 1) / members.size();
  auto ch = Channel::Open(thread, std::move(name), std::move(members),
                          sizeof(wire::QueueEnds) + sizeof(wire::QueueSlot) * per_member);
  if (!ch.ok()) return ch.status();
  q.ch_ = std::move(*ch);
  return q;
}

Result<SharedQueue::SlotRef> SharedQueue::slot(uint64_t ticket) const {
  const uint64_t i = ticket % capacity_;
  const auto& members = ch_.members();
  const NodeId node = members[i % members.size()];
  auto off = ch_.slice_offset(node);
  if (!off.ok()) return off.status();
  return SlotRef{node,
                 *off + sizeof(wire::QueueEnds) + sizeof(wire::QueueSlot) * (i / members.size()),
                 ticket / capacity_};
}

Status SharedQueue::wait_state(ChannelThread& thread, const SlotRef& s, uint64_t want,
                               Clock::time_point deadline, const char* what) const {
  for (;;) {
    uint64_t state = 0;
    Status st = thread.read_sync(s.node, s.offset, &state, 8);
    if (!st.ok()) return st.WithContext("shared queue '" + ch_.name() + "'");
    if (state == want) return Status::OK();
    if (Clock::now() >= deadline) {
      return Status::TimedOut("shared queue '" + ch_.name() + "': slot at node " +
                              std::to_string(s.node) + " not " + what + " for lap " +
                              std::to_string(s.lap) + " in time (state " + std::to_string(state) +
                              ")");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(10));
  }
}

Status SharedQueue::push(ChannelThread& thread, uint64_t value, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto home_off = ch_.slice_offset(home_);
  if (!home_off.ok()) return home_off.status();
  // Refuse before taking a ticket when full: a ticket is a promise to fill its slot, which a
  // popper will wait for.
  uint64_t ends[2] = {0, 0};
  Status st = thread.read_sync(home_, *home_off, ends, 16);
  if (!st.ok()) return st.WithContext("shared queue '" + ch_.name() + "'");
  if (ends[1] >= ends[0] + capacity_) {
    return Status::ResourceExhausted("shared queue '" + ch_.name() + "' is full (" +
                                     std::to_string(capacity_) + " values)");
  }
  uint64_t t = 0;
  auto key = thread.fetch_add(home_, *home_off + offsetof(wire::QueueEnds, tail), 1, &t);
  if (!key.ok()) return key.status();
  st = thread.wait(*key, thread.manager().impl().op_timeout() + std::chrono::seconds(1));
  if (!st.ok()) return st.WithContext("shared queue '" + ch_.name() + "'");
  auto s = slot(t);
  if (!s.ok()) return s.status();
  // The popper of the previous lap frees the slot (a race with other pushers past the fullness
  // check ends here, bounded by the deadline).
  st = wait_state(thread, *s, 2 * s->lap, deadline, "free");
  if (!st.ok()) return st;
  key = thread.write(s->node, s->offset + offsetof(wire::QueueSlot, value), &value, 8);
  if (!key.ok()) return key.status();
  // The value is placed before the slot is marked full (a popper reads state, then value).
  st = thread.fence_pair(s->node, Left(deadline));
  if (!st.ok()) return st.WithContext("shared queue '" + ch_.name() + "'");
  const uint64_t full = 2 * s->lap + 1;
  key = thread.write(s->node, s->offset, &full, 8);
  if (!key.ok()) return key.status();
  return thread.wait(*key, Left(deadline) + thread.manager().impl().op_timeout());
}

Result<uint64_t> SharedQueue::pop(ChannelThread& thread, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto home_off = ch_.slice_offset(home_);
  if (!home_off.ok()) return home_off.status();
  uint64_t h = 0;
  for (;;) {
    uint64_t ends[2] = {0, 0};
    Status st = thread.read_sync(home_, *home_off, ends, 16);
    if (!st.ok()) return st.WithContext("shared queue '" + ch_.name() + "'");
    if (ends[0] >= ends[1]) return Status::NotFound("shared queue '" + ch_.name() + "' is empty");
    // Claim ticket head only while head < tail: a popper never runs ahead of the pushers.
    uint64_t old = 0;
    auto key = thread.compare_swap(home_, *home_off, ends[0], ends[0] + 1, &old);
    if (!key.ok()) return key.status();
    st = thread.wait(*key, thread.manager().impl().op_timeout() + std::chrono::seconds(1));
    if (!st.ok()) return st.WithContext("shared queue '" + ch_.name() + "'");
    if (old == ends[0]) {
      h = old;
      break;
    }
    if (Clock::now() >= deadline) {
      return Status::TimedOut("shared queue '" + ch_.name() +
                              "': head contended past the deadline");
    }
  }
  auto s = slot(h);
  if (!s.ok()) return s.status();
  // The pusher of ticket h may not have filled it yet.
  if (!g_queue_wait_disabled.load(std::memory_order_relaxed)) {
    Status st = wait_state(thread, *s, 2 * s->lap + 1, deadline, "full");
    if (!st.ok()) return st;
  }
  uint64_t value = 0;
  Status st = thread.read_sync(s->node, s->offset + offsetof(wire::QueueSlot, value), &value, 8);
  if (!st.ok()) return st.WithContext("shared queue '" + ch_.name() + "'");
  const uint64_t next_free = 2 * s->lap + 2;
  auto key = thread.write(s->node, s->offset, &next_free, 8);
  if (!key.ok()) return key.status();
  st = thread.wait(*key, Left(deadline) + thread.manager().impl().op_timeout());
  if (!st.ok()) return st.WithContext("shared queue '" + ch_.name() + "'");
  return value;
}

// ---- SharedStateTable --------------------------------------------------------------------------

Result<SharedStateTable> SharedStateTable::Open(ChannelThread& thread, std::string name,
                                                std::vector<NodeId> members, size_t row_bytes) {
  if (row_bytes == 0) return Status::InvalidArgument("sst: row size 0");
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  const NodeId self = thread.manager().self();
  if (!std::binary_search(members.begin(), members.end(), self)) {
    return Status::InvalidArgument("sst '" + name + "': this node is not a member");
  }
  SharedStateTable t;
  t.members_ = members;
  t.mine_ = IndexOf(members, self);
  for (NodeId owner : members) {
    auto row =
        OwnedBytes::Open(thread, name + "/row" + std::to_string(owner), owner, members, row_bytes);
    if (!row.ok()) return row.status();
    t.rows_.push_back(std::move(*row));
  }
  return t;
}

Status SharedStateTable::wait_ready(std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  for (const auto& r : rows_) {
    Status st = r.wait_ready(Left(deadline));
    if (!st.ok()) return st;
  }
  return Status::OK();
}

Result<size_t> SharedStateTable::index(NodeId node) const {
  auto it = std::lower_bound(members_.begin(), members_.end(), node);
  if (it == members_.end() || *it != node) {
    return Status::InvalidArgument("sst: node " + std::to_string(node) + " has no row");
  }
  return static_cast<size_t>(it - members_.begin());
}

Status SharedStateTable::store_mine(const void* row) {
  if (rows_.empty()) return Status::FailedPrecondition("sst: not open");
  return rows_[mine_].store(row);
}

Result<AckKey> SharedStateTable::push_broadcast(ChannelThread& thread) {
  if (rows_.empty()) return Status::FailedPrecondition("sst: not open");
  return rows_[mine_].push(thread);
}

Status SharedStateTable::load(ChannelThread& thread, NodeId node, void* out) {
  auto i = index(node);
  if (!i.ok()) return i.status();
  return rows_[*i].load(thread, out);
}

}  // namespace farmem::channels
