// Internals of the channel manager shared by manager.cc (Manager, ChannelThread, Channel) and
// channels.cc (OwnedBytes, AtomicVar, Barrier, TicketLock). Touched by application threads (opening
// endpoints, waiting for readiness) and the progress thread (inline JOIN handler), under Impl::mu.
//
// Data structures:
//  - Impl::region: this node's channel region (one registered, exported memory range), handed out
//    by a bump allocator in 64-byte aligned slices, one per endpoint (never freed).
//  - Impl::endpoints: channel name -> Endpoint {members, local slice, member -> slice offset}.
//  - Impl::pending: joins that arrived before the endpoint existed: name -> sender -> slice, with a
//    deadline (early_join_ttl); consumed when the endpoint opens, dropped once expired.
//  - Impl::peers: NodeId -> transport PeerId and the peer's channel region key (after connect()).
//  - Impl::threads: every ChannelThread's published {issued, low_water} op ids (global fences).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "farmem/channels.h"

namespace farmem::channels {
namespace detail {

struct Endpoint {
  Manager::Impl* mgr = nullptr;
  std::string name;
  std::vector<NodeId> members;  // sorted
  size_t slice_bytes = 0;
  uint64_t offset = 0;  // in this node's region
  std::byte* local = nullptr;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  std::map<NodeId, uint64_t> remote;  // member -> slice offset at that member (self included)
  bool is_member(NodeId n) const;
  void set_remote(NodeId n, uint64_t off);
};

// One ChannelThread's published progress, read by fence_global on other threads. Op ids are
// increasing per thread; issued = next id to hand out; low_water = smallest id not complete.
struct ThreadShared {
  std::atomic<uint64_t> issued{1};
  std::atomic<uint64_t> low_water{1};
};

}  // namespace detail

struct Manager::Impl {
  struct PeerSlot {
    PeerId peer = kInvalidPeer;
    RegionKey key = 0;
  };
  struct Pending {
    uint64_t offset = 0;
    uint64_t length = 0;
    std::chrono::steady_clock::time_point deadline;
  };

  Node* node = nullptr;
  ManagerConfig config;
  std::unique_ptr<uint64_t[]> region;
  size_t region_bytes = 0;

  std::mutex mu;
  uint64_t bump = 0;
  std::map<std::string, std::shared_ptr<detail::Endpoint>> endpoints;
  std::map<std::string, std::map<NodeId, Pending>> pending;
  std::map<NodeId, PeerSlot> peers;
  std::vector<std::weak_ptr<detail::ThreadShared>> threads;

  std::byte* base() { return reinterpret_cast<std::byte*>(region.get()); }
  Result<PeerSlot> peer(NodeId n);
  Result<std::shared_ptr<detail::Endpoint>> open_endpoint(const std::string& name,
                                                          std::vector<NodeId> members,
                                                          size_t slice_bytes);
  Status handle_join(const RpcCall& call, std::vector<std::byte>& reply);
  std::chrono::milliseconds op_timeout() const { return node->config().transport.op_timeout; }
};

namespace detail {

// Checksum of a copy's sequence number and value words (owned vars, ringbuffer records, kvstore
// slots); never 0, so a zeroed copy never checks.
inline uint64_t Checksum(uint64_t seq, const uint64_t* words, size_t n) {
  uint64_t h = seq * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
  for (size_t i = 0; i < n; i++) {
    h ^= words[i];
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
  }
  return h | 1;
}
inline uint64_t LoadWord(const std::byte* p) {
  return std::atomic_ref<const uint64_t>(*reinterpret_cast<const uint64_t*>(p))
      .load(std::memory_order_acquire);
}
inline void StoreWord(std::byte* p, uint64_t v) {
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(p)).store(v, std::memory_order_release);
}

// A ticket lock's words {next_ticket, now_serving} at `offset` of `home`'s channel region
// (TicketLock, and the kvstore's lock array). `what` names it in errors. The ticket is the low 48
// bits of now_serving (wire::kServingTicketMask); TicketAcquire returns the whole word it saw
// served in `*serving_word` (the kvstore's roll-back count is in the top bits). TicketRelease
// with `fence` first places the caller's channel writes (the release fence), then adds `add` to
// now_serving (1, plus wire::kServingRollbackUnit when the kvstore marks a roll-back).
Status TicketAcquire(ChannelThread& thread, NodeId home, uint64_t offset,
                     std::chrono::milliseconds timeout, const std::string& what, uint64_t* ticket,
                     uint64_t* serving_word = nullptr);
Status TicketRelease(ChannelThread& thread, NodeId home, uint64_t offset,
                     std::chrono::milliseconds timeout, const std::string& what, bool fence,
                     uint64_t add = 1);

}  // namespace detail

// Test hooks (channels_faults.h).
extern std::atomic<bool> g_owned_checksum_disabled;
extern std::atomic<bool> g_barrier_wait_disabled;
extern std::atomic<bool> g_lock_wait_disabled;
extern std::atomic<bool> g_ring_checksum_disabled;
extern std::atomic<bool> g_ring_backpressure_disabled;
extern std::atomic<bool> g_ring_partial_seq_disabled;
extern std::atomic<bool> g_queue_wait_disabled;
extern std::atomic<bool> g_kv_acks_disabled;
extern std::atomic<bool> g_kv_update_fence_disabled;
extern std::atomic<bool> g_kv_checksum_disabled;
extern std::atomic<bool> g_kv_rollback_disabled;
extern std::atomic<bool> g_kv_catch_up_disabled;
extern std::atomic<bool> g_kv_ticket_order_disabled;

}  // namespace farmem::channels
