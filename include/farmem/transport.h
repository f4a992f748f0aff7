// The one transport interface every farmem layer talks to (verbs-like semantics).
// Backends: native batched TCP (src/transport/tcp) and libfabric FI_EP_RDM (src/transport/fabric).
// See docs/transport.md for the semantics each call guarantees.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "farmem/status.h"

namespace farmem {

// A peer as seen by one Transport: a small dense number handed out by add_peer().
using PeerId = uint32_t;
inline constexpr PeerId kInvalidPeer = 0xffffffffu;

// A registered region's key. Random 64-bit values: a region is reachable only by whoever knows its
// key (the bootstrap handshake hands keys to authenticated peers only).
using RegionKey = uint64_t;

// What peers may do to a registered region. Reads are always allowed. kReadOnly regions reject
// one-sided WRITE, CAS and FAA with kPermissionDenied at the caller and the target's memory is
// never touched by them: used for memory the owner rewrites or remaps itself (the CoRM object
// range), where a peer's write would corrupt it. How each backend enforces it: docs/transport.md.
enum class Access : uint8_t { kReadWrite, kReadOnly };
inline std::string_view AccessName(Access access) {
  return access == Access::kReadOnly ? "read-only" : "read-write";
}

// A locally registered memory region.
struct MemoryRegion {
  RegionKey key = 0;
  void* addr = nullptr;
  size_t length = 0;
  Access access = Access::kReadWrite;
};

// A byte inside a peer's registered region. The offset is relative to the region start on every
// backend; providers that need virtual addresses (FI_MR_VIRT_ADDR) translate internally.
struct RemoteRef {
  PeerId peer = kInvalidPeer;
  RegionKey key = 0;
  uint64_t offset = 0;
};

// One piece of an ordered read (Context::read_ordered_now, Scheduler::read_ordered): `len` bytes at
// `offset` of the read's region into `dst`.
struct ReadSegment {
  uint64_t offset = 0;
  void* dst = nullptr;
  size_t len = 0;
};

enum class OpType : uint8_t { kRead = 1, kWrite, kCompareSwap, kFetchAdd, kRpc };
std::string_view OpTypeName(OpType op);

// One finished operation, as returned by Context::poll(). For CAS/FAA the previous value has been
// stored into the `old_value` pointer given at post time; for RPC the reply bytes are in the reply
// buffer given at post time, `reply_imm` holds the reply's immediate data and `reply_length` its
// length (a reply longer than the buffer completes with kResourceExhausted and is dropped).
struct Completion {
  uint64_t wr_id = 0;
  OpType op = OpType::kRead;
  Status status;
  uint32_t reply_imm = 0;
  uint32_t reply_length = 0;
};

// Target side of an RPC: a message that arrived from a peer, to be answered exactly once (from any
// thread, immediately or later). Dropping it unanswered replies with an error frame so the caller
// never waits for its timeout because of a lost handle.
class IncomingRpc {
 public:
  virtual ~IncomingRpc() = default;
  virtual uint32_t imm() const = 0;
  virtual std::span<const std::byte> payload() const = 0;
  // A printable name of the sender (for logs), e.g. "127.0.0.1:40312".
  virtual std::string_view source() const = 0;
  virtual Status reply(uint32_t imm, std::span<const std::byte> payload) = 0;
  // Reply with an error; the caller's completion carries `status` (code and message).
  virtual Status reply_error(const Status& status) = 0;
};

// Called on the transport's progress/NIC thread for each arriving RPC. It must not block: hand the
// message to a worker (the Node does) or answer it at once.
using RpcHandler = std::function<void(std::unique_ptr<IncomingRpc>)>;

// Limits of the native TCP data listener (backend "tcp") against broken or hostile peers, so no
// peer can make the target allocate, spin or starve others (docs/transport.md, "Connection
// limits"). Each refusal, timeout and throttle is counted in TcpTransportStats.
struct TcpLimits {
  // Bytes buffered from a connection before it presents the cluster token. A first frame that
  // announces more is refused from its header alone, so nothing is allocated for it (a real hello
  // is at most 280 bytes). Must hold a hello with the cluster token.
  uint32_t max_unauthenticated_bytes = 4096;
  // A connection that has not authenticated within this time is closed.
  std::chrono::milliseconds auth_timeout{5000};
  // Reply bytes queued for one connection above which the target stops reading that peer's
  // requests (back-pressure: no reply is dropped or reordered) until they drain below
  // send_queue_resume_bytes. One reply larger than the cap is still sent, alone.
  size_t max_send_queue_bytes = size_t{16} << 20;
  size_t send_queue_resume_bytes = size_t{4} << 20;
  // Reply bytes queued for all connections together. Above it, a connection with replies queued
  // is paused like one over its own cap, and one with none gets only replies of at most
  // kSmallReplyBytes (64 KiB) until the total drains below total_send_queue_resume_bytes: many slow
  // readers cannot add their per-connection caps up past the daemon's memory, while peers that
  // read their replies keep being served.
  size_t max_total_send_queue_bytes = size_t{64} << 20;
  size_t total_send_queue_resume_bytes = size_t{48} << 20;
  // RPCs of one connection handed to the handler and not answered yet, above which the target
  // stops reading that peer's requests until one is answered. An RPC's reply size is known only
  // when its handler answers, so without this cap a peer could pipeline thousands of requests
  // with large replies past max_send_queue_bytes; with it, the queue stays below
  // max_send_queue_bytes + max_rpcs_in_flight * max_rpc_bytes.
  uint32_t max_rpcs_in_flight = 64;
  // Open connections (authenticated or not) per peer IP address and in total; further ones are
  // closed at accept.
  uint32_t max_connections_per_address = 256;
  uint32_t max_connections = 4096;
  // When accept fails for lack of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) the
  // listener is not polled for accept_backoff_min, doubling up to accept_backoff_max while it
  // persists; the error is logged at most once per second with the count of repeats.
  std::chrono::milliseconds accept_backoff_min{100};
  std::chrono::milliseconds accept_backoff_max{1000};
};

struct TransportConfig {
  // "tcp": native batched TCP. "fabric": libfabric (see `provider`).
  std::string backend = "tcp";
  // libfabric provider: "shm" (same host), "tcp;ofi_rxm" (across hosts), "verbs;ofi_rxm" (RDMA
  // NICs; untested here, no hardware).
  std::string provider = "shm";
  // Address the data path listens on. Native TCP: IP to bind, port 0 = ephemeral.
  // libfabric tcp: IP/interface to use (pinned so tests stay on loopback).
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;
  // Shared secret every peer must present (native TCP data connections check it; libfabric peers
  // are checked at the Node's bootstrap handshake).
  std::string cluster_token = "farmem";
  // Every operation completes within this time: with its result, or with kTimedOut.
  std::chrono::milliseconds op_timeout{5000};
  // Time allowed to connect to a peer.
  std::chrono::milliseconds connect_timeout{3000};
  // Largest RPC request or reply payload.
  uint32_t max_rpc_bytes = 1u << 20;
  // Spin this long without work before the progress thread blocks (0 = always block, which costs
  // latency; large = burn a core). Benchmarks raise it.
  std::chrono::microseconds spin_before_sleep{200};
  // Native TCP only: connection limits of the data listener (see TcpLimits).
  TcpLimits tcp_limits;
};

// A per-thread initiator context (a queue pair plus its completion queue). Not thread-safe: each
// thread that issues operations owns one. Any number of operations may be in flight at once.
// Posting never blocks for the network; poll() never blocks at all.
class Context {
 public:
  virtual ~Context() = default;

  // One-sided read of `len` bytes at `src` into `dst` (which must stay valid until completion).
  virtual Status post_read(const RemoteRef& src, void* dst, size_t len, uint64_t wr_id) = 0;
  // One-sided write. With `delivery_complete` the completion means the bytes are in the target's
  // memory; without it, only that the source buffer may be reused.
  virtual Status post_write(const RemoteRef& dst, const void* src, size_t len, uint64_t wr_id,
                            bool delivery_complete = false) = 0;
  // 8-byte atomic compare-and-swap on an 8-byte aligned word; the previous value goes to
  // *old_value.
  virtual Status post_compare_swap(const RemoteRef& dst, uint64_t expected, uint64_t desired,
                                   uint64_t* old_value, uint64_t wr_id) = 0;
  // 8-byte atomic fetch-and-add on an 8-byte aligned word; the previous value goes to *old_value.
  virtual Status post_fetch_add(const RemoteRef& dst, uint64_t add, uint64_t* old_value,
                                uint64_t wr_id) = 0;
  // Send an RPC request to `peer`, carrying `imm` as immediate data; the reply lands in `reply`.
  virtual Status post_rpc(PeerId peer, uint32_t imm, std::span<const std::byte> request,
                          std::span<std::byte> reply, uint64_t wr_id) = 0;

  // Reads `segments` of the region `key` at `peer` in order, here and now, inside the call: every
  // byte of segment i is read before any byte of segment i + 1 (what a seqlock reader needs:
  // version, data, version again). Only where the context can do that with one copy: libfabric
  // shm's direct copy with the key already known (one process_vm_readv over all segments). Else
  // nullopt: nothing may be relied on in the buffers, and the caller posts ordinary reads one
  // after another (Scheduler::read_ordered does). Errors as a read's (kOutOfRange, kNotFound, a
  // peer that exited).
  virtual std::optional<Status> read_ordered_now(PeerId peer, RegionKey key,
                                                 std::span<const ReadSegment> segments) {
    (void)peer;
    (void)key;
    (void)segments;
    return std::nullopt;
  }

  // Move finished operations into `out`; returns how many. Also fails operations whose deadline
  // passed (kTimedOut) or whose peer went away (kUnavailable).
  virtual size_t poll(std::span<Completion> out) = 0;
  // Operations posted and not yet returned by poll().
  virtual size_t outstanding() const = 0;
  // True while an operation posted here may still need this context's poll() (or wait()) to
  // reach its target at all. Native TCP: frames not yet handed to the kernel (a connection still
  // being made, a full socket buffer). libfabric: posts the provider refused for now
  // (-FI_EAGAIN) or that wait for a key lookup, and, over providers where the initiator moves
  // the bytes itself (tcp;ofi_rxm, shm with CMA off), every operation until it completes. A
  // caller that returns without waiting for an operation others depend on (the channels
  // barrier's arrivals) polls until this is false, so the operation lands even if its thread
  // never polls again.
  virtual bool needs_progress() const = 0;

  // Blocks the calling thread until poll() may have something new for it, or until `deadline`
  // (whichever is first), instead of sleeping a fixed interval. It sends what posts queued first.
  // May return early (spuriously); never returns later than `deadline` plus scheduling delay, nor
  // later than the earliest op deadline (so timeouts still fire). Callers poll() after it.
  // Native TCP blocks on the readiness of its connections (and on an eventfd that stop()
  // signals); the default, used by libfabric (whose initiator makes progress only inside poll()),
  // sleeps at most kDefaultWaitSlice.
  static constexpr std::chrono::microseconds kDefaultWaitSlice{50};
  virtual void wait(std::chrono::steady_clock::time_point deadline) {
    const auto cap = std::chrono::steady_clock::now() + kDefaultWaitSlice;
    std::this_thread::sleep_until(deadline < cap ? deadline : cap);
  }
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Build a backend from config. Nothing runs until start().
  static Result<std::unique_ptr<Transport>> Create(const TransportConfig& config);

  // "tcp" or "fabric:<provider>".
  virtual std::string name() const = 0;
  // Opaque address peers pass to add_peer() (valid after start()).
  virtual std::string local_address() const = 0;

  // Called for every arriving RPC; set before start().
  virtual void set_rpc_handler(RpcHandler handler) = 0;
  // Start the progress/NIC thread and begin accepting peers.
  virtual Status start() = 0;
  // Stop serving; pending operations of this transport's contexts fail with kAborted. Idempotent.
  virtual void stop() = 0;

  // Make [addr, addr+len) reachable by peers that know the returned key, with `access`.
  virtual Result<MemoryRegion> register_memory(void* addr, size_t len,
                                               Access access = Access::kReadWrite) = 0;
  // Peers using the key afterwards get kNotFound. The memory itself is not touched.
  virtual Status deregister_memory(RegionKey key) = 0;

  // Grace period for owners that change what registered memory shows (CoRM remaps a merged
  // block's pages, docs/objects.md): OK once every one-sided read this transport's own threads
  // were copying out of registered memory when called has finished; kTimedOut at `deadline`.
  // Before calling, publish with a seq_cst store or RMW a marker the copies check (the copier side
  // of src/common/copy_epoch.h); then no copy mixes bytes from before and after the change. Where
  // copies are not made in one step by this process's threads (fabric: CMA by the initiator, tcp
  // provider sends spread over progress calls, NIC DMA) there is nothing to wait for: OK at once.
  // Readers over those validate every copy with a seqlock, which a remap cannot fool either
  // (docs/transport.md, "Copy order of one-sided reads").
  virtual Status wait_for_read_copies(std::chrono::steady_clock::time_point deadline) = 0;

  // Learn a peer by its local_address(); returns a PeerId valid for every Context of this
  // transport. Adding the same address twice returns the same id. Connections are made lazily.
  virtual Result<PeerId> add_peer(std::string_view address) = 0;

  // A new initiator context for the calling thread.
  virtual Result<std::unique_ptr<Context>> create_context() = 0;
};

}  // namespace farmem
