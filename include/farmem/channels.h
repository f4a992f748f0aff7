// Channels (LOCO, docs/channels.md): named objects whose state spans nodes, built on a Node. One
// Manager serves all threads of a process; each OS thread owns one ChannelThread (Context, ack
// keys, fences); a channel handle is used by one thread at a time, with its ChannelThread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "farmem/node.h"
#include "farmem/status.h"

namespace farmem::channels {

// A participant's number in the static participant list (not a transport PeerId).
using NodeId = uint32_t;

struct Participant {
  NodeId id = 0;
  std::string bootstrap_address;  // "host:port" of that node's bootstrap listener
};

struct ManagerConfig {
  NodeId self = 0;
  // Every participant, this node included.
  std::vector<Participant> participants;
  // The one registered region suballocated for the channel state of this node.
  size_t region_bytes = size_t{1} << 20;
  // A join that arrives before this node has an endpoint of that name is kept this long.
  std::chrono::milliseconds early_join_ttl{30000};
};

class Manager;
class ChannelThread;
namespace detail {
struct Endpoint;
struct ThreadShared;
}  // namespace detail

// The completion handle of asynchronous operations of one ChannelThread: a set of operation ids.
// Keys combine by union; a key is done when all its operations completed.
class AckKey {
 public:
  AckKey() = default;
  AckKey& operator|=(const AckKey& other);
  friend AckKey operator|(AckKey a, const AckKey& b) { return a |= b; }
  bool empty() const { return ids_.empty(); }
  size_t size() const { return ids_.size(); }

 private:
  friend class ChannelThread;
  std::vector<uint64_t> ids_;
};

// One OS thread's view of the channels: its transport context, its outstanding operations and its
// fences. Not thread-safe; make one per thread with Manager::make_thread().
class ChannelThread {
 public:
  ~ChannelThread();
  ChannelThread(const ChannelThread&) = delete;
  ChannelThread& operator=(const ChannelThread&) = delete;

  Manager& manager() { return *mgr_; }

  // True when every operation of `key` has completed (successfully or not). Polls once.
  bool query(const AckKey& key);
  // Waits until `key` is done; returns the first error among its operations, or kTimedOut.
  Status wait(const AckKey& key, std::chrono::milliseconds timeout);

  // Fences (docs/channels.md, "Fences"): every operation this thread issued before the fence, to
  // `peer` (pair) or to any node (thread), is placed in the target's memory when the fence
  // returns OK. fence_global does the same for the operations issued before the call by every
  // ChannelThread of this Manager (those threads must keep polling, or it times out).
  Status fence_pair(NodeId peer, std::chrono::milliseconds timeout);
  Status fence_thread(std::chrono::milliseconds timeout);
  // fence_thread for every operation but those of `skip` (ones whose placement the caller orders
  // by other means, e.g. the barrier's own arrival writes on an ordered transport).
  Status fence_thread_except(const AckKey& skip, std::chrono::milliseconds timeout);
  Status fence_global(std::chrono::milliseconds timeout);

  // Drive this thread's completions (every waiting call does it too).
  void poll();
  // Hands every operation this thread posted to the network without waiting for completions:
  // after OK each takes effect even if this thread never polls again (docs/channels.md,
  // "Progress"). kTimedOut if the transport still holds some at the end of `timeout`. Writes held
  // by testing_hold_next_write() stay held.
  Status flush(std::chrono::milliseconds timeout);

  // Raw one-sided operations on the channel region of node `node`, at `offset` inside it. Writes
  // copy `src` and are delivery-complete: their completion means placed.
  Result<AckKey> write(NodeId node, uint64_t offset, const void* src, size_t len);
  Result<AckKey> fetch_add(NodeId node, uint64_t offset, uint64_t add, uint64_t* old_value);
  Result<AckKey> compare_swap(NodeId node, uint64_t offset, uint64_t expected, uint64_t desired,
                              uint64_t* old_value);
  Result<AckKey> read(NodeId node, uint64_t offset, void* dst, size_t len);
  // Blocking read (waits, with the transport's op_timeout).
  Status read_sync(NodeId node, uint64_t offset, void* dst, size_t len);

  // TEST ONLY: hold the next write instead of posting it; it is posted when a wait or fence needs
  // its completion, or by testing_release_held(). Models a transport that reorders two writes to
  // one peer (neither native TCP nor fabric shm does; docs/channels.md).
  void testing_hold_next_write() { hold_next_write_ = true; }
  void testing_release_held();
  // TEST ONLY: place every later write longer than 8 bytes in two parts, its first word, then
  // (after `gap`) the rest: models a transport that places a large write piecewise (RDMA gives
  // no order between the cache lines of one write). Zero turns it off.
  void testing_tear_writes(std::chrono::microseconds gap) { tear_gap_ = gap; }

 private:
  friend class Manager;
  friend class Channel;
  struct Op;
  ChannelThread(Manager* mgr, std::unique_ptr<Context> ctx, std::shared_ptr<detail::ThreadShared>);
  Result<AckKey> post(NodeId node, std::unique_ptr<Op> op);
  Status post_now(uint64_t id, Op& op);
  Status wait_ids(const std::vector<uint64_t>& ids, std::chrono::steady_clock::time_point deadline);
  void publish_low_water();

  Manager* mgr_;
  std::unique_ptr<Context> ctx_;
  std::shared_ptr<detail::ThreadShared> shared_;
  uint64_t next_id_ = 1;
  std::vector<std::pair<uint64_t, std::unique_ptr<Op>>> outstanding_;  // sorted by id
  std::vector<std::pair<uint64_t, Status>> failed_;                    // failed, not yet waited on
  std::vector<uint64_t> held_;                                         // test hook: not posted
  bool hold_next_write_ = false;
  std::chrono::microseconds tear_gap_{0};  // test hook: writes placed in two parts
};

// Per-process channel manager over a started Node and a static participant list.
class Manager {
 public:
  // Registers the channel RPCs and exports the channel region: call before node.start(). The
  // node's JOIN handler points at the manager: stop the node before destroying the manager, and
  // destroy the manager (it unexports its region) before the node. ChannelThreads and channel
  // handles must not outlive it.
  static Result<std::unique_ptr<Manager>> Create(Node& node, ManagerConfig config);
  ~Manager();

  // After node.start(): bootstrap to every participant (itself included), retrying a peer that is
  // not up yet until `timeout`. kTimedOut names the participants still missing; those connected
  // are usable anyway, and calling connect again retries the rest.
  Status connect(std::chrono::milliseconds timeout);
  // A ChannelThread for the calling thread.
  Result<std::unique_ptr<ChannelThread>> make_thread();

  NodeId self() const;
  const ManagerConfig& config() const;
  Node& node();

  // Internals shared with the channel classes (not for applications).
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  explicit Manager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The part every channel shares: a named endpoint with a slice of this node's channel region and
// the slice offsets of the other members, learned by asynchronous joins.
class Channel {
 public:
  // Opens this node's endpoint of channel `name` (a path, "bar/sst/row0") spanning `members` (this
  // node must be one), with `slice_bytes` of state on every member, and sends a join to every
  // connected member. Returns at once; wait_ready() waits for the other members' endpoints.
  static Result<Channel> Open(ChannelThread& thread, std::string name, std::vector<NodeId> members,
                              size_t slice_bytes);
  // A sub-channel "<this name>/<child>" on the same members.
  Result<Channel> Sub(ChannelThread& thread, const std::string& child, size_t slice_bytes) const;

  // OK when every member's endpoint has joined; kTimedOut naming the missing members otherwise.
  Status wait_ready(std::chrono::milliseconds timeout) const;

  const std::string& name() const;
  const std::vector<NodeId>& members() const;
  // Offset of this channel's slice inside `node`'s channel region (kFailedPrecondition before that
  // member joined).
  Result<uint64_t> slice_offset(NodeId node) const;
  // This node's slice, in local memory.
  std::byte* local_slice() const;

 private:
  std::shared_ptr<detail::Endpoint> ep_;
};

// LOCO's shared_region: `bytes` of memory on every member (symmetric: every member opens the same
// name with the same size and gets its copy from its channel region), read and written one-sided
// by any member in any member's copy, its own too (docs/channels.md, "Channels built"). It gives no
// consistency of its own: writes to overlapping bytes interleave in no given order and a read
// overlapping a write may see part of it. Order comes from the fences (data write, fence, flag
// write: a reader that sees the flag sees the data), locks (TicketLock's unlock fences) or
// barriers. One thread at a time per handle; copy the handle for other threads.
class SharedRegion {
 public:
  // kInvalidArgument for size 0 or a size larger than the manager's region; the errors of
  // Channel::Open otherwise. Members that open the name with another size never join.
  static Result<SharedRegion> Open(ChannelThread& thread, std::string name,
                                   std::vector<NodeId> members, size_t bytes);
  Status wait_ready(std::chrono::milliseconds timeout) const { return ch_.wait_ready(timeout); }
  // Copies `src` (copied at the call) into `node`'s copy at `offset`. Delivery-complete: when
  // its key is done the bytes are placed. Errors, before anything is posted: kOutOfRange when
  // [offset, offset + src.size()) is not inside the region, kInvalidArgument for an empty span or a
  // node that is not a member, kFailedPrecondition before that member joined; transport errors
  // (a member gone) come through the key.
  Result<AckKey> write(ChannelThread& thread, NodeId node, uint64_t offset,
                       std::span<const std::byte> src);
  // Reads `node`'s copy at `offset` into `dst`, valid once the key is done (keep `dst` alive
  // until then). The same errors as write.
  Result<AckKey> read(ChannelThread& thread, NodeId node, uint64_t offset,
                      std::span<std::byte> dst);
  // This node's copy in local memory, for plain loads and stores by this node's threads. Remote
  // writes are placed into it by the transport (byte copies, not atomic): read what a peer wrote
  // only after learning that its fence returned (a flag read with read(), a barrier, a lock).
  std::span<std::byte> local() const;
  size_t size() const { return size_; }
  const std::string& name() const { return ch_.name(); }
  const std::vector<NodeId>& members() const { return ch_.members(); }

 private:
  SharedRegion() = default;  // only Open makes one, so every handle has its endpoint
  Result<uint64_t> target(NodeId node, uint64_t offset, size_t len, const char* op) const;
  Channel ch_;
  size_t size_ = 0;
};

// Single-writer register of `size` bytes (OwnedVar<T> below is the typed form). The owner stores
// into its copy and pushes to the readers' caches; readers load their cache or pull the owner's
// copy. Every copy is {seq, value words, checksum}: a copy torn by a concurrent store or push
// fails the checksum and is read again, so a value larger than a word is never seen torn.
class OwnedBytes {
 public:
  static Result<OwnedBytes> Open(ChannelThread& thread, std::string name, NodeId owner,
                                 std::vector<NodeId> members, size_t size);
  Status wait_ready(std::chrono::milliseconds timeout) const { return ch_.wait_ready(timeout); }
  // Owner only: the new value of the owner's copy (not yet pushed).
  Status store(const void* value);
  // Owner only: write the owner's current copy to every reader's cache.
  Result<AckKey> push(ChannelThread& thread);
  // This node's copy (owner: its own; reader: its cache, as last pushed). Zeros before any push.
  Status load(ChannelThread& thread, void* out);
  // Reader: a one-sided read of the owner's copy.
  Status pull(ChannelThread& thread, void* out);
  NodeId owner() const { return owner_; }
  size_t size() const { return size_; }

 private:
  Status decode(const uint64_t* copy, void* out, bool* ok) const;
  Channel ch_;
  NodeId owner_ = 0;
  size_t size_ = 0;
  size_t words_ = 0;
  uint64_t seq_ = 0;
};

template <class T>
class OwnedVar {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  static Result<OwnedVar> Open(ChannelThread& thread, std::string name, NodeId owner,
                               std::vector<NodeId> members) {
    auto b = OwnedBytes::Open(thread, std::move(name), owner, std::move(members), sizeof(T));
    if (!b.ok()) return b.status();
    OwnedVar v;
    v.b_ = std::move(*b);
    return v;
  }
  Status wait_ready(std::chrono::milliseconds timeout) const { return b_.wait_ready(timeout); }
  Status store(const T& value) { return b_.store(&value); }
  Result<AckKey> push(ChannelThread& thread) { return b_.push(thread); }
  Result<T> load(ChannelThread& thread) {
    T out{};
    Status st = b_.load(thread, &out);
    if (!st.ok()) return st;
    return out;
  }
  Result<T> pull(ChannelThread& thread) {
    T out{};
    Status st = b_.pull(thread, &out);
    if (!st.ok()) return st;
    return out;
  }

 private:
  OwnedBytes b_;
};

// Shared state table (LOCO's sst): one row of `row_bytes` per member, each row a single-writer
// register owned by its member (an OwnedBytes "<name>/row<id>"). A member stores its own row and
// broadcasts it to every other member; rows are read from the local copies, never torn. One
// thread at a time per handle.
class SharedStateTable {
 public:
  static Result<SharedStateTable> Open(ChannelThread& thread, std::string name,
                                       std::vector<NodeId> members, size_t row_bytes);
  Status wait_ready(std::chrono::milliseconds timeout) const;
  // The new value of this node's row (not yet broadcast).
  Status store_mine(const void* row);
  // Writes this node's row to every other member (the union of the per-member writes).
  Result<AckKey> push_broadcast(ChannelThread& thread);
  // Row `node` as this node last received it (its own row: as stored). Zeros before any push.
  Status load(ChannelThread& thread, NodeId node, void* out);
  const std::vector<NodeId>& members() const { return members_; }

 private:
  Result<size_t> index(NodeId node) const;
  std::vector<NodeId> members_;
  std::vector<OwnedBytes> rows_;  // rows_[i]: owned by members_[i]
  size_t mine_ = 0;
};

// A 64-bit word at its home node; every member (the home too) reaches it through the transport,
// so remote atomics never mix with host CPU stores.
class AtomicVar {
 public:
  static Result<AtomicVar> Open(ChannelThread& thread, std::string name, NodeId home,
                                std::vector<NodeId> members);
  Status wait_ready(std::chrono::milliseconds timeout) const { return ch_.wait_ready(timeout); }
  Result<uint64_t> fetch_add(ChannelThread& thread, uint64_t add);
  Result<uint64_t> compare_swap(ChannelThread& thread, uint64_t expected, uint64_t desired);
  Result<uint64_t> load(ChannelThread& thread);
  // Asynchronous form: *old_value is valid once the key is done.
  Result<AckKey> fetch_add_async(ChannelThread& thread, uint64_t add, uint64_t* old_value);
  NodeId home() const { return home_; }

 private:
  Channel ch_;
  NodeId home_ = 0;
};

// A barrier among the members (one thread per member node enters each episode). Entering does a
// thread fence (so the caller's earlier channel writes are placed), publishes the episode number
// in this node's row of every member's table (sub-channel "<name>/sst") and waits until every
// row reached it. kTimedOut names the members that did not arrive.
class Barrier {
 public:
  static Result<Barrier> Open(ChannelThread& thread, std::string name, std::vector<NodeId> members);
  Status wait_ready(std::chrono::milliseconds timeout) const { return sst_.wait_ready(timeout); }
  Status arrive_and_wait(ChannelThread& thread, std::chrono::milliseconds timeout);
  uint64_t episode() const { return episode_; }

 private:
  Channel ch_;
  Channel sst_;
  uint64_t episode_ = 0;
  bool local_rows_ = false;  // poll the own table with local loads (the transport allows it)
  bool ordered_ = false;     // the transport places one thread's writes to a peer in order
  AckKey arrivals_;          // this episode's arrival writes, until checked
};

// FIFO lock across nodes and local threads: words {next_ticket, now_serving} at the home node.
// lock(): t = FAA(next_ticket, 1), then poll now_serving until it equals t (backoff proportional
// to the distance). unlock(): a thread fence (the caller's channel writes are placed), then
// FAA(now_serving, 1). Every thread takes its own ticket, so local threads queue like remote
// ones (no local handover). A lock() that times out keeps its ticket: later tickets are never
// served after it (no leases; docs/channels.md). Copy the handle for each thread.
class TicketLock {
 public:
  static Result<TicketLock> Open(ChannelThread& thread, std::string name, NodeId home,
                                 std::vector<NodeId> members);
  Status wait_ready(std::chrono::milliseconds timeout) const { return ch_.wait_ready(timeout); }
  // On OK, *ticket (if given) is the ticket granted (grants are in ticket order).
  Status lock(ChannelThread& thread, std::chrono::milliseconds timeout, uint64_t* ticket = nullptr);
  Status unlock(ChannelThread& thread, std::chrono::milliseconds timeout);

 private:
  Channel ch_;
  NodeId home_ = 0;
};

// One producer broadcasting records of 1..max_record_bytes bytes to every other member (the
// consumers), in order, exactly once, never torn. Every consumer's slice holds `capacity` record
// slots written by the producer; each consumer releases what it consumed by writing its count
// into the producer's slice (its row of the acknowledgement table), and the producer waits
// before it would overwrite a slot some consumer has not released (back-pressure). Records are
// {seq, checksum, length, payload}: a slot being overwritten while read fails the checksum and
// is read again. Layout: docs/channels.md, "Ringbuffer". One thread at a time per handle.
class RingBuffer {
 public:
  static Result<RingBuffer> Open(ChannelThread& thread, std::string name, NodeId producer,
                                 std::vector<NodeId> members, size_t capacity,
                                 size_t max_record_bytes);
  Status wait_ready(std::chrono::milliseconds timeout) const { return ch_.wait_ready(timeout); }
  // Producer: appends one record for every consumer; returns its sequence number (1, 2, ...).
  // Waits while some consumer has `capacity` records unreleased; kTimedOut names it (the record
  // is then not appended, and the ring stays usable). If the write to some consumers fails, the
  // error names them (and `*unreached` lists them): the record is appended for the consumers it
  // reached (its seq is used, last_pushed() is it), and a consumer it did not reach never
  // receives a later record either (its pops time out at that seq; later pushes do not write to
  // it and name it at once).
  Result<uint64_t> push(ChannelThread& thread, const void* data, size_t len,
                        std::chrono::milliseconds timeout,
                        std::vector<NodeId>* unreached = nullptr);
  // Producer: waits until `records` (<= capacity) more pushes fit without back-pressure;
  // kTimedOut names the consumers that have not released enough.
  Status wait_room(ChannelThread& thread, size_t records, std::chrono::milliseconds timeout);
  // Producer: the seq of the last record appended (0 before the first).
  uint64_t last_pushed() const { return next_ - 1; }
  // Producer: waits until every consumer released every record up to `seq` (kTimedOut names the
  // late ones). Safe to call from several threads at once (reads only).
  Status wait_released(ChannelThread& thread, uint64_t seq,
                       std::chrono::milliseconds timeout) const;
  // Consumer: copies the next record into `out` (at most `cap` bytes) and returns its length;
  // kTimedOut when none arrives within `timeout` (0: look once). With `release`, its slot is
  // released at once; otherwise call release() later (e.g. after applying it).
  Result<size_t> pop(ChannelThread& thread, void* out, size_t cap,
                     std::chrono::milliseconds timeout, bool release = true);
  // Consumer: releases every record popped so far (one write to the producer's slice).
  Result<AckKey> release(ChannelThread& thread);
  NodeId producer() const { return producer_; }
  size_t capacity() const { return capacity_; }
  size_t max_record_bytes() const { return max_bytes_; }

 private:
  uint64_t slot_offset(uint64_t seq) const;
  Status read_acks(ChannelThread& thread, std::vector<uint64_t>* acks) const;
  Status wait_min_released(ChannelThread& thread, uint64_t need,
                           std::chrono::steady_clock::time_point deadline,
                           std::chrono::milliseconds timeout);
  Channel ch_;
  NodeId producer_ = 0;
  size_t capacity_ = 0;
  size_t max_bytes_ = 0;
  size_t record_words_ = 0;
  uint64_t next_ = 1;           // producer: next seq to push; consumer: next seq to pop
  uint64_t min_released_ = 0;   // producer: cached minimum of the consumers' released counts
  uint64_t released_sent_ = 0;  // consumer: the count last written to the producer
  std::vector<NodeId>
      missed_;  // producer: consumers a used seq did not reach (never written again)
};

// Multi-producer multi-consumer FIFO of 64-bit values (LOCO's shared_queue, with Vyukov-style
// slots instead of the CRQ's CAS2): `head`/`tail` words at the home, `capacity` slots
// {state, value} striped over the members (slot i on members[i % n]). push: t = FAA(tail), wait
// until slot t is free for lap t / capacity, write the value, pair fence, mark it full. pop: read
// head and tail, empty if head >= tail, else CAS(head, h, h + 1), wait until slot h is full, read
// the value, mark it free for the next lap. Every pushed value is popped exactly once, each
// producer's values in its push order. Several threads may share a handle's copies.
class SharedQueue {
 public:
  static Result<SharedQueue> Open(ChannelThread& thread, std::string name, NodeId home,
                                  std::vector<NodeId> members, size_t capacity);
  Status wait_ready(std::chrono::milliseconds timeout) const { return ch_.wait_ready(timeout); }
  // kResourceExhausted when the queue is full (checked before a ticket is taken).
  Status push(ChannelThread& thread, uint64_t value, std::chrono::milliseconds timeout);
  // kNotFound when the queue is empty.
  Result<uint64_t> pop(ChannelThread& thread, std::chrono::milliseconds timeout);

 private:
  struct SlotRef {
    NodeId node;
    uint64_t offset;
    uint64_t lap;
  };
  Result<SlotRef> slot(uint64_t ticket) const;
  Status wait_state(ChannelThread& thread, const SlotRef& s, uint64_t want,
                    std::chrono::steady_clock::time_point deadline, const char* what) const;
  Channel ch_;
  NodeId home_ = 0;
  size_t capacity_ = 0;
};

struct KvConfig {
  // Value slots on every member (values live on the node that inserted them).
  size_t slots_per_node = 1024;
  // Ticket locks (lock = hash(key) % locks, homed round-robin over the members).
  size_t locks = 256;
  // Records of each node's tracker ringbuffer.
  size_t tracker_capacity = 64;
  // Deadline of each blocking step (lock, acknowledgements, torn-read retries).
  std::chrono::milliseconds timeout{5000};
  // Bytes of every value (the same on every member; 1..4096). Values longer than a word are read
  // whole or not at all: a get that overlaps an update fails the slot's checksum and reads again.
  size_t value_bytes = 8;
};

// One asynchronous kvstore get (KvStore::get_async): the key, where the value goes, the slot read
// in flight and, once done, the outcome. Used by one thread with its ChannelThread. Movable even
// while a read is in flight (the read lands in a heap buffer owned here), but it must be done
// (get_poll true, or get_wait returned) before it is destroyed or started again.
class KvGet {
 public:
  // True when no read of this get is in flight (never started, or finished).
  bool done() const { return !active_; }
  uint64_t key() const { return key_; }
  // The outcome once done: OK (value copied into `out`), kNotFound, or the error.
  const Status& status() const { return status_; }

 private:
  friend class KvStore;
  uint64_t key_ = 0;
  std::span<std::byte> out_;
  std::vector<uint64_t> rec_;  // the slot as read (KvSlotBytes)
  AckKey ack_;
  uint64_t counter_ = 0;                            // the index entry's counter the read must find
  std::chrono::steady_clock::time_point deadline_;  // for torn-read retries
  bool active_ = false;
  Status status_;
};

// LOCO's key-value store (not replicated): 64-bit keys, values of KvConfig::value_bytes. A value
// lives in a slot {key, counter, valid, value words, checksum} on the node that inserted it; every
// node keeps a full local index key -> (node, slot, counter), updated by a tracker thread that
// applies the inserts/deletes every node broadcasts on its tracker ringbuffer. Modifications take
// the key's ticket lock; get takes none: one one-sided read, checked by checksum (torn: retry),
// valid and counter (stale: not found). Linearizable (docs/channels.md, "Kvstore"). Any number of
// local threads may call it, each with its own ChannelThread.
//
// Failed modifications (docs/channels.md, "Failed modifications"): insert, update and erase
// either return OK and have taken effect for every node, or return an error and have taken
// effect for none. An insert that fails after its record may have reached other nodes is rolled
// back (an abort record follows it on the same ring) before its key lock is released; an erase
// past its linearization point is completed (OK). A node that has not yet applied such a
// record applies it before its next modification under that key lock, and its gets already
// answer as if it had.
class KvStore {
 public:
  static Result<std::unique_ptr<KvStore>> Open(ChannelThread& thread, std::string name,
                                               std::vector<NodeId> members, KvConfig config = {});
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;
  Status wait_ready(std::chrono::milliseconds timeout) const;

  // kFailedPrecondition when the key is present; kResourceExhausted when this node has no free
  // slot. `value` must be exactly value_bytes long (kInvalidArgument otherwise).
  Status insert(ChannelThread& thread, uint64_t key, std::span<const std::byte> value);
  // kNotFound when the key is absent.
  Status update(ChannelThread& thread, uint64_t key, std::span<const std::byte> value);
  Status erase(ChannelThread& thread, uint64_t key);
  // Copies the value into `out` (exactly value_bytes long); kNotFound when the key is absent.
  Status get(ChannelThread& thread, uint64_t key, std::span<std::byte> out);
  // The same for one-word values (value_bytes == 8; kInvalidArgument otherwise).
  Status insert(ChannelThread& thread, uint64_t key, uint64_t value);
  Status update(ChannelThread& thread, uint64_t key, uint64_t value);
  Result<uint64_t> get(ChannelThread& thread, uint64_t key);

  // Asynchronous gets: many may be in flight on one ChannelThread (each one one-sided read), with
  // the checks of get(). get_async starts `key`'s read into `*g` and returns at once; `out`
  // (exactly value_bytes) must stay valid until g is done. A get that needs no read (index miss,
  // bad size, unknown member) is done at once with that outcome. kFailedPrecondition (and g
  // untouched) when g is still in flight. A get linearizes at its slot read, between get_async
  // and the get_poll that reports it done.
  Status get_async(ChannelThread& thread, uint64_t key, std::span<std::byte> out, KvGet* g);
  // Polls the thread's completions once: true when g is done (outcome in g.status()). A torn
  // slot is read again (from the index on) until KvConfig::timeout; a read whose home is gone
  // completes with the transport's error within its op_timeout.
  bool get_poll(ChannelThread& thread, KvGet& g);
  // Waits until g is done and returns its outcome.
  Status get_wait(ChannelThread& thread, KvGet& g);

  // TEST ONLY: where the next modification on this store fails, as if the transport had failed
  // there (docs/channels.md, "Failed modifications"): the slot write of an insert, the tracker
  // ring being full (before an insert's record; before an erase's linearization point, or after
  // it with SetKvRollbackDisabled), the wait for every node's acknowledgement of an insert, or
  // the write that makes an inserted slot valid.
  enum class FailPoint : int { kNone, kSlotWrite, kRingFull, kAcks, kValidWrite };
  void testing_fail_next(FailPoint point) { fail_next_.store(static_cast<int>(point)); }
  // TEST ONLY: this node's tracker stops taking records of `producer`'s ring: before applying
  // the next one (kHold), or after applying it but before acknowledging it (kHoldAfterApply);
  // kRun resumes. Returns once the tracker began a new pass over the rings.
  enum class TrackerHold : int { kRun, kHold, kHoldAfterApply };
  void testing_hold_tracker(NodeId producer, TrackerHold hold);

 private:
  struct IndexEntry {
    NodeId node;
    uint64_t slot;
    uint64_t counter;
    uint64_t ticket;  // the key lock's ticket of the insert that made it
  };
  // What a modification holding a key lock tells the release: mark the lock's roll-back count
  // (set after it wrote its catch-up row word).
  struct Held {
    uint64_t ticket = 0;
    uint64_t lock = 0;
    bool mark = false;
  };
  KvStore() = default;
  void tracker_main(std::unique_ptr<ChannelThread> thread);
  void apply(const uint64_t* msg);
  bool lookup(uint64_t key, IndexEntry* e) const;
  Result<uint64_t> slot_offset(NodeId node, uint64_t slot) const;
  Result<uint64_t> lock_offset(uint64_t lock) const;
  Result<uint64_t> catch_up_offset(uint64_t lock, size_t member) const;
  Status check_value_bytes(size_t n) const;
  Status locked(ChannelThread& thread, uint64_t key, bool fence,
                const std::function<Status(Held&)>& body);
  Status catch_up(ChannelThread& thread, uint64_t lock, uint64_t serving_word);
  Status mark_lock(ChannelThread& thread, Held& held, uint64_t seq);
  Status reserve(ChannelThread& thread, size_t records);
  void unreserve(size_t records);
  Result<uint64_t> push_reserved(ChannelThread& thread, const uint64_t* msg,
                                 std::vector<NodeId>* unreached, uint64_t* appended);
  Status wait_acks(ChannelThread& thread, uint64_t seq);
  Status rollback_insert(ChannelThread& thread, Held& held, uint64_t key, uint64_t slot,
                         uint64_t counter, bool valid_unknown, const Status& cause);
  bool take_fail(FailPoint point);
  Status injected(const char* where) const;
  void start_read(ChannelThread& thread, KvGet& g);
  void finish(KvGet& g, Status st);
  Status not_found(uint64_t key) const;

  std::string name_;
  KvConfig config_;
  NodeId self_ = 0;
  Channel ch_;
  std::vector<NodeId> members_;
  size_t lock_bytes_ = 0;             // lock words at the start of every member's slice
  size_t catch_up_bytes_ = 0;         // then the locks' catch-up rows
  size_t value_words_ = 1;            // value_bytes rounded up to words
  size_t slot_bytes_ = 0;             // wire::KvSlotBytes(value_words_)
  std::vector<RingBuffer> trackers_;  // index i: producer members_[i]
  size_t self_index_ = 0;
  mutable std::shared_mutex index_mu_;
  std::unordered_map<uint64_t, IndexEntry> index_;
  std::mutex slots_mu_;
  std::vector<uint64_t> free_slots_;
  std::vector<uint64_t> counters_;
  std::mutex ring_mu_;   // this node's tracker ring: one producer at a time
  size_t reserved_ = 0;  // ring records promised to modifications in flight (under ring_mu_)
  // Per member: the last record of its tracker ring this node applied (and released).
  std::unique_ptr<std::atomic<uint64_t>[]> applied_;
  // Per lock: the roll-back count (top bits of now_serving) this node last caught up with.
  std::unique_ptr<std::atomic<uint32_t>[]> caught_up_;
  std::unique_ptr<std::atomic<int>[]> hold_;  // per member: TrackerHold (test hook)
  std::atomic<int> fail_next_{0};             // FailPoint (test hook)
  std::atomic<uint64_t> scans_{0};            // the tracker's passes over the rings
  std::atomic<bool> stop_{false};
  std::thread tracker_;
};

}  // namespace farmem::channels
