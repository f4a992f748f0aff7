// Node: one process's presence in a farmem cluster. Owns the transport endpoint, the registry of
// exported regions, the RPC handler table (opcode -> handler) served by worker threads, and the
// bootstrap listener through which peers authenticate and learn endpoint names and region keys.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "farmem/coro.h"
#include "farmem/opcodes.h"
#include "farmem/status.h"
#include "farmem/transport.h"

namespace farmem {

// Limits of the bootstrap listener, so idle, slow or flooding peers cannot delay the handshakes
// of others (docs/node.md, "Listener"). Counted in BootstrapStats.
struct BootstrapLimits {
  // Time one connection gets to send its HELLO and take the answer; then it is closed.
  std::chrono::milliseconds handshake_timeout{2000};
  // Handshakes served at once, and at once from one peer IP address. A connection beyond the
  // per-address limit is closed at accept (after the input already waiting on that address's
  // handshakes was served, so finished ones do not count); when the total is reached, a connection
  // from an address holding fewer handshakes than the busiest one replaces that one's oldest
  // handshake, otherwise it is closed.
  uint32_t max_open_handshakes = 256;
  uint32_t max_open_handshakes_per_address = 64;
  // When accept fails for lack of descriptors or memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) the
  // listener is not polled for accept_backoff_min, doubling up to accept_backoff_max while it
  // persists; the error is logged at most once per second with the count of repeats.
  std::chrono::milliseconds accept_backoff_min{100};
  std::chrono::milliseconds accept_backoff_max{1000};
};

// Counters of the bootstrap listener (relaxed snapshots).
struct BootstrapStats {
  uint64_t accepted = 0;
  uint64_t welcomed = 0;
  uint64_t rejected = 0;             // HELLO answered with an error (token, backend, version)
  uint64_t malformed = 0;            // bad magic/type/length/JSON, or peer closed mid-frame
  uint64_t timed_out = 0;            // peer did not finish its HELLO in time
  uint64_t refused_per_address = 0;  // closed at accept: its address had too many handshakes
  uint64_t refused_total = 0;        // closed (or evicted) because max_open_handshakes was reached
  uint64_t accept_backoffs = 0;      // accept failures (EMFILE...) that paused the listener
};

struct NodeConfig {
  TransportConfig transport;
  // Bootstrap listener ("host:port" peers connect to). Port 0 = ephemeral.
  std::string bootstrap_host = "127.0.0.1";
  uint16_t bootstrap_port = 0;
  // A human name shown in logs and `farmem stat`.
  std::string name = "node";
  // Threads running RPC handlers.
  int rpc_workers = 1;
  // Connection limits of the bootstrap listener.
  BootstrapLimits bootstrap_limits;
};

// A region this node exports under a name, as peers see it.
struct RegionInfo {
  std::string name;
  RegionKey key = 0;
  uint64_t length = 0;
};

// What a bootstrap handshake tells about a peer.
struct PeerInfo {
  PeerId id = kInvalidPeer;  // usable with this node's transport/contexts
  std::string name;          // peer's NodeConfig::name
  std::string bootstrap_address;
  std::string transport_address;
  std::vector<RegionInfo> regions;  // exported at handshake time
};

struct RpcCall;

// The answer of an RPC whose handler returned before the answer was ready (RpcCall::defer()):
// sent later, from any thread, exactly once. Movable, not copyable. It owns the request (its
// bytes stay valid through request()). A handle dropped unsent answers the caller with Aborted,
// so no caller waits for its timeout because of a lost handle; one kept forever is bounded by the
// caller's op_timeout. Sending after the caller timed out or its connection closed is safe: the
// transport drops the answer (Unavailable when it knows the connection is gone). The owner must
// send or drop every handle before its Node is destroyed (a service: in Service::stop()).
class DeferredReply {
 public:
  DeferredReply() = default;
  DeferredReply(DeferredReply&&) noexcept;
  DeferredReply& operator=(DeferredReply&&) noexcept;
  ~DeferredReply();

  bool valid() const { return rpc_ != nullptr; }
  std::span<const std::byte> request() const;
  // OK status: replies with `payload` (ResourceExhausted to the caller when it exceeds
  // max_rpc_bytes); otherwise replies with the error. FailedPrecondition when not valid() (sent
  // already, moved from, or default-made); afterwards the handle is not valid.
  Status send(const Status& status, std::span<const std::byte> payload = {});

 private:
  friend struct RpcCall;  // defer() makes handles
  std::unique_ptr<IncomingRpc> rpc_;
  uint16_t opcode_ = 0;
  uint32_t max_reply_bytes_ = 0;
};

// An RPC as a handler sees it.
struct RpcCall {
  uint16_t opcode = 0;
  std::span<const std::byte> request;
  std::string_view source;

  // Takes the answer out of the handler's hands: the handler then returns (its status and reply
  // are ignored) and the returned handle sends the answer later. `request` stays valid only
  // while the handle lives (use DeferredReply::request() after the handler returned). An invalid
  // handle when the call cannot be deferred (a second defer(), or a call not from a Node).
  DeferredReply defer() const;

  // Set by the node's dispatcher; defer() takes the RPC from here.
  std::unique_ptr<IncomingRpc>* deferrable = nullptr;
  uint32_t max_reply_bytes = 0;
};

// Fill `reply` (cleared before the call) and return OK, or return an error for the caller; or
// call.defer() and answer through the handle later (the handler's return value is then ignored).
using RpcFunction = std::function<Status(const RpcCall& call, std::vector<std::byte>& reply)>;

// Where a handler runs. kWorker: an RPC worker thread (the progress thread enqueues the call and
// wakes a worker). kInline: on the transport's progress thread as the call arrives (eRPC's
// "dispatch" requests), saving the hand-off: a mutex, a condition-variable wake-up and, on a
// loaded machine, a context switch, which cost more than a handler that runs for a microsecond.
// Only for handlers that finish in microseconds and never wait for long (short locks only):
// while one runs, the transport serves nothing else on that progress thread.
enum class RpcExecution : uint8_t { kWorker, kInline };

class Node {
 public:
  static Result<std::unique_ptr<Node>> Create(const NodeConfig& config);
  virtual ~Node() = default;

  // Start transport, progress thread, RPC workers and bootstrap listener.
  virtual Status start() = 0;
  // Stop accepting, finish running handlers, stop the transport. Idempotent; also run by ~Node.
  virtual void stop() = 0;

  virtual const NodeConfig& config() const = 0;
  // "host:port" of the bootstrap listener (valid after start()).
  virtual std::string bootstrap_address() const = 0;
  virtual Transport& transport() = 0;
  // Counters of the bootstrap listener (zeros before start()).
  virtual BootstrapStats bootstrap_stats() const = 0;

  // Register and publish memory under `name` (names are unique per node). With
  // Access::kReadOnly peers may only read it (see Transport::register_memory).
  virtual Result<RegionInfo> export_region(std::string_view name, void* addr, size_t len,
                                           Access access = Access::kReadWrite) = 0;
  virtual Status unexport_region(std::string_view name) = 0;
  virtual std::vector<RegionInfo> exported_regions() const = 0;

  // Handlers must be registered before start(). opcode >= kFirstUserOpcode.
  virtual Status register_rpc(uint16_t opcode, RpcFunction fn,
                              RpcExecution execution = RpcExecution::kWorker) = 0;

  // Bootstrap handshake with the node listening at "host:port": present the cluster token, learn
  // its transport address and regions, add it as a transport peer.
  virtual Result<PeerInfo> connect(std::string_view bootstrap_address) = 0;

  // A fresh initiator context for the calling thread wrapped in a coroutine scheduler.
  virtual Result<std::unique_ptr<Scheduler>> make_scheduler() = 0;
};

// Decode the reply of a kOpListRegions RPC (a peer's current region list).
Result<std::vector<RegionInfo>> DecodeRegionList(std::span<const std::byte> reply);

// Encode an RPC immediate from an opcode (the node's framing: low 16 bits opcode).
inline uint32_t RpcImm(uint16_t opcode) {
  return opcode;
}

}  // namespace farmem
