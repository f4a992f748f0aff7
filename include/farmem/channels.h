// Channels (LOCO, docs/channels.md): named objects whose state spans nodes, built on a Node. One
// Manager serves all threads of a process; each OS thread owns one ChannelThread (Context, ack
// keys, fences); a channel handle is used by one thread at a time, with its ChannelThread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
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
  Status fence_global(std::chrono::milliseconds timeout);

  // Drive this thread's completions (every waiting call does it too).
  void poll();

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

}  // namespace farmem::channels
