// Declarations shared by tcp_transport.cc, tcp_target.cc and tcp_initiator.cc (internal to this
// folder): Shared and TcpTransport, used by every thread of a transport (locks named beside their
// members), ServerConn (NIC thread; its write side from any thread) and TcpContext (one thread).
#pragma once

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/copy_epoch.h"
#include "common/net/accept_backoff.h"
#include "common/net/fd.h"
#include "farmem/transport.h"
#include "transport/tcp/frame_codec.h"
#include "transport/tcp/tcp_transport.h"

namespace farmem::tcp::internal {

namespace w = tcpwire;
using Clock = std::chrono::steady_clock;

// epoll user data of the two non-connection fds; connection ids start above them.
inline constexpr uint64_t kListenId = 0;
inline constexpr uint64_t kWakeId = 1;
// How long a connection closed for a protocol error keeps draining input, so the error frame is
// not destroyed by a TCP reset before the peer reads it.
inline constexpr auto kCloseLinger = std::chrono::seconds(1);
// Upper bound for one blocking epoll_wait, so stop() stays prompt even if a wakeup were lost.
inline constexpr int kEpollSleepMs = 50;
// Initiator send buffers flush inside post once they hold this much, bounding their memory.
inline constexpr size_t kEagerFlushBytes = 256 * 1024;
inline constexpr size_t kRecvChunk = 64 * 1024;
// Above TcpLimits::max_total_send_queue_bytes a connection with no reply queued still gets
// replies up to this size (small operations keep working), larger ones wait for the total.
inline constexpr size_t kSmallReplyBytes = 64 * 1024;
// A connection's receive or send buffer larger than this is freed once it empties, so memory a
// single large frame needed is not held for the connection's lifetime.
inline constexpr size_t kKeepBufferBytes = 4u << 20;
// Connections accepted per AcceptAll call: a flood of connections (refused or not) cannot keep
// the NIC thread from serving the open ones; epoll reports the listener again next round.
inline constexpr int kMaxAcceptsPerRound = 64;

inline std::string ErrnoText(int err) {
  return std::strerror(err);
}

inline void SetNoDelay(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

// State shared by a transport and every context it created, so contexts may outlive it safely.
struct Shared {
  explicit Shared(TransportConfig c)
      : config(std::move(c)), stop_fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}
  const TransportConfig config;
  std::atomic<bool> stopped{false};
  // Becomes readable (and stays so) when the transport stops, so a context blocked in wait()
  // returns at once and its poll() aborts what is pending. -1 if eventfd failed (wait() then
  // also wakes at the earliest op deadline, which it always does).
  const net::Fd stop_fd;
  void SignalStop() {
    stopped.store(true, std::memory_order_release);
    if (stop_fd.get() >= 0) {
      const uint64_t one = 1;
      (void)!::write(stop_fd.get(), &one, sizeof(one));
    }
  }

  struct Peer {
    std::string address;
    SockAddr addr;
  };
  std::mutex peers_mu;
  std::vector<Peer> peers;  // index = PeerId
  std::unordered_map<std::string, PeerId> peer_ids;
};

// ---------------------------------------------------------------------------------------------
// Target side (tcp_target.cc).

struct ServerStats {
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> frames{0};
  std::atomic<uint64_t> sends{0};
  std::atomic<uint64_t> protocol_errors{0};
  std::atomic<uint64_t> read_copy_waits{0};
  // Connection limits (TcpLimits); see TcpTransportStats for each one's meaning.
  std::atomic<uint64_t> refused_unauthenticated_oversize{0};
  std::atomic<uint64_t> auth_timeouts{0};
  std::atomic<uint64_t> refused_per_address{0};
  std::atomic<uint64_t> refused_total{0};
  std::atomic<uint64_t> backpressure_events{0};
  std::atomic<uint64_t> throttled{0};  // gauge
  std::atomic<uint64_t> peak_send_queue{0};
  std::atomic<uint64_t> accept_backoffs{0};
  std::atomic<uint64_t> open{0};  // gauge
  // Reply bytes queued for all connections (each connection adds its wbuf size changes through
  // ServerConn::AccountLocked), and the largest total seen.
  std::atomic<uint64_t> queued_total{0};
  std::atomic<uint64_t> peak_queued_total{0};

  void NoteTotal(uint64_t bytes) {
    uint64_t peak = peak_queued_total.load(std::memory_order_relaxed);
    while (bytes > peak &&
           !peak_queued_total.compare_exchange_weak(peak, bytes, std::memory_order_relaxed)) {
    }
  }
  void NoteSendQueue(size_t bytes) {
    uint64_t peak = peak_send_queue.load(std::memory_order_relaxed);
    while (bytes > peak &&
           !peak_send_queue.compare_exchange_weak(peak, bytes, std::memory_order_relaxed)) {
    }
  }
};

class ServerConn;

// NIC-thread bookkeeping that connections reach from IncomingRpc::reply.
struct NicShared {
  ServerStats stats;
  std::atomic<std::thread::id> nic_thread{};
  // Connections with responses appended during the current batch; flushed at its end (NIC only).
  std::vector<std::shared_ptr<ServerConn>> dirty;
  // The NIC thread's eventfd (set before the thread starts): an RPC answered on another thread
  // wakes it when its connection is paused, so reading resumes now, not at the next epoll timeout.
  int wake_fd = -1;
};

class ServerConn : public std::enable_shared_from_this<ServerConn> {
 public:
  ServerConn(uint64_t id, int fd, int epoll_fd, std::string peer, std::shared_ptr<NicShared> nic)
      : id(id), fd(fd), epoll_fd(epoll_fd), peer_name(std::move(peer)), nic(std::move(nic)) {}

  const uint64_t id;
  const int fd;  // closed (and never used again) once `closed` is set, under wmu
  const int epoll_fd;
  const std::string peer_name;
  const std::shared_ptr<NicShared> nic;

  // NIC thread only.
  bool authenticated = false;
  bool closing = false;
  bool in_dirty = false;
  Clock::time_point close_deadline{};
  w::ByteQueue rbuf;
  size_t rneed = 0;
  std::string addr_key;  // the peer's IP address bytes (per-address connection count)

  // The write side may be used from any thread (RPC replies).
  std::mutex wmu;
  w::ByteQueue wbuf;        // guarded by wmu
  bool closed = false;      // guarded by wmu: fd closed
  bool write_shut = false;  // guarded by wmu: no more output (error sent or send failed)
  bool want_out = false;    // guarded by wmu: EPOLLOUT armed
  // Guarded by wmu, written by the NIC thread only: reading requests is paused because too many
  // reply bytes are queued (EPOLLIN off). Under wmu because FlushLocked rebuilds the event mask.
  bool paused = false;
  // RPCs handed to the handler and not answered yet (TcpLimits::max_rpcs_in_flight). Incremented
  // by the NIC thread, decremented by whichever thread answers.
  std::atomic<uint32_t> rpcs_in_flight{0};
  size_t accounted = 0;  // guarded by wmu: wbuf's size as last added to queued_total

  // Requires wmu. Sends what the socket takes; arms EPOLLOUT for the rest.
  Status FlushLocked();
  // Requires wmu. Adds the change of wbuf's size since the last call to the process-wide total
  // (NicShared::stats.queued_total). Called wherever wbuf grows, drains or is cleared.
  void AccountLocked();
  // Requires wmu. Sets the epoll mask from `paused` and `out` (EPOLLOUT wanted).
  void ArmLocked(bool out);
  // Requires wmu. On the NIC thread defers the send to the end of the batch (one syscall for all
  // responses of a batch); on other threads sends at once.
  Status SubmitLocked();
};

// ---------------------------------------------------------------------------------------------
// Initiator side (tcp_initiator.cc).

class TcpContext final : public Context {
 public:
  explicit TcpContext(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {
    timeout_ms_ = shared_->config.op_timeout.count();
  }

  ~TcpContext() override;

  Status post_read(const RemoteRef& src, void* dst, size_t len, uint64_t wr_id) override;
  Status post_write(const RemoteRef& dst, const void* src, size_t len, uint64_t wr_id,
                    bool delivery_complete) override;
  Status post_compare_swap(const RemoteRef& dst, uint64_t expected, uint64_t desired,
                           uint64_t* old_value, uint64_t wr_id) override;
  Status post_fetch_add(const RemoteRef& dst, uint64_t add, uint64_t* old_value,
                        uint64_t wr_id) override;
  Status post_rpc(PeerId peer, uint32_t imm, std::span<const std::byte> request,
                  std::span<std::byte> reply, uint64_t wr_id) override;
  size_t poll(std::span<Completion> out) override;

  size_t outstanding() const override { return active_count_ + (ready_.size() - ready_head_); }
  // Some connection still holds frames for the kernel (or is being connected).
  bool needs_progress() const override;

  // Sends what is queued, then blocks in ppoll() on the connections that owe this context a
  // response (POLLIN), still have bytes to send or are connecting (POLLOUT), and on the
  // transport's stop eventfd, until one is ready, `deadline` or the earliest op deadline.
  void wait(Clock::time_point deadline) override;

  const TcpContextStats& stats() const { return stats_; }

 private:
  struct Op {
    uint32_t gen = 1;  // part of the wire seq; bumped on completion so late responses miss
    bool active = false;
    bool awaits_response = false;
    OpType type = OpType::kRead;
    PeerId peer = kInvalidPeer;
    uint64_t wr_id = 0;
    Clock::time_point deadline{};
    void* dst = nullptr;  // read destination or RPC reply buffer
    size_t len = 0;       // read length or RPC reply capacity
    uint64_t* old_value = nullptr;
  };

  struct FlushWaiter {
    uint64_t end;  // stream offset just past the frame: the op completes once this much is sent
    uint64_t seq;
  };

  enum class ConnState : uint8_t { kClosed, kConnecting, kConnected };

  struct Conn {
    PeerId peer = kInvalidPeer;
    std::string address;
    SockAddr addr;
    int fd = -1;
    ConnState state = ConnState::kClosed;
    Clock::time_point connect_deadline{};
    Status last_error;  // why the last connection failed (for ops posted while it cannot open)
    w::ByteQueue sbuf;
    w::ByteQueue rbuf;
    size_t rneed = 0;
    uint64_t bytes_sent = 0;  // stream bytes handed to the kernel since connect
    uint32_t awaiting = 0;    // active ops waiting for a response frame on this connection
    bool dirty = false;       // sbuf has bytes and the conn is in dirty_
    std::vector<FlushWaiter> flush_waiters;
    size_t flush_head = 0;
  };

  Status PostAtomic(w::Opcode wop, OpType type, const RemoteRef& dst, uint64_t a, uint64_t b,
                    uint64_t* old_value, uint64_t wr_id);
  std::string PeerText(const Conn* c) const;
  Result<Conn*> ConnFor(PeerId peer);
  // Starts a non-blocking connect; the hello is queued first so requests can follow at once.
  void Connect(Conn* c);
  uint64_t NewOp(OpType type, Conn* c, uint64_t wr_id, void* dst, size_t len, uint64_t* old_value,
                 bool awaits_response);
  // An op posted while its connection could not be opened completes with the connect error.
  Status FailNew(uint64_t seq, Conn* c);
  void Queued(Conn* c);
  void MarkDirty(Conn* c);
  Op* Find(uint64_t seq, PeerId peer);
  void Complete(uint32_t slot, Status status, uint32_t imm = 0, uint32_t reply_len = 0);
  void Progress();
  void CheckConnect(Conn* c, Clock::time_point now);
  void Flush(Conn* c);
  void Receive(Conn* c);
  // Returns false once the connection failed (its buffers are gone).
  bool DecodeResponses(Conn* c);
  bool HandleResponse(Conn* c, const w::FrameView& f);
  void ExpireOps(Clock::time_point now);
  // Closes the connection and fails every op that was sent over it; the next post reconnects.
  void FailConn(Conn* c, const Status& status);
  void AbortAll();

  std::shared_ptr<Shared> shared_;
  int64_t timeout_ms_ = 0;
  std::vector<std::unique_ptr<Conn>> conns_;  // index = PeerId; created on first use
  std::vector<Conn*> dirty_;                  // conns with unsent bytes (or still connecting)
  std::vector<Op> ops_;
  std::vector<uint32_t> free_;
  size_t active_count_ = 0;
  Clock::time_point next_deadline_ = Clock::time_point::max();  // no active op expires earlier
  std::vector<Completion> ready_;
  size_t ready_head_ = 0;
  bool aborted_ = false;
  std::vector<pollfd> pollfds_;  // wait()'s set, reused
  TcpContextStats stats_;
};

// ---------------------------------------------------------------------------------------------
// The Transport object: lifecycle, memory and peers in tcp_transport.cc, the NIC thread's loop
// and frame serving in tcp_target.cc.

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TransportConfig& config)
      : shared_(std::make_shared<Shared>(config)),
        nic_(std::make_shared<NicShared>()),
        rng_(std::random_device{}()),
        accept_backoff_("tcp NIC thread", config.tcp_limits.accept_backoff_min,
                        config.tcp_limits.accept_backoff_max) {
    limits_.max_io_bytes = w::kMaxIoBytes;
    limits_.max_rpc_bytes = config.max_rpc_bytes;
    // Nothing larger than one legitimate frame is ever buffered, plus one recv of the next.
    max_rbuf_ = sizeof(w::FrameHeader) +
                std::max<size_t>(sizeof(w::WriteReq) + limits_.max_io_bytes,
                                 sizeof(w::RpcHeader) + limits_.max_rpc_bytes) +
                kRecvChunk;
  }

  ~TcpTransport() override { stop(); }

  std::string name() const override { return "tcp"; }
  std::string local_address() const override {
    std::lock_guard lock(lifecycle_mu_);
    return local_address_;
  }

  void set_rpc_handler(RpcHandler handler) override { handler_ = std::move(handler); }

  Status start() override;
  void stop() override;
  Result<MemoryRegion> register_memory(void* addr, size_t len, Access access) override;
  Status deregister_memory(RegionKey key) override;
  Status wait_for_read_copies(std::chrono::steady_clock::time_point deadline) override;
  Result<PeerId> add_peer(std::string_view address) override;
  Result<std::unique_ptr<Context>> create_context() override;

  TcpTransportStats stats() const;

 private:
  // Locks held while serving a run of one-sided frames (tcp_target.cc).
  class BatchLocks;

  void NicLoop();
  void FlushDirty();
  void AcceptAll();
  void HandleReadable(const std::shared_ptr<ServerConn>& conn);
  // Serves every complete frame in the connection's buffer. False once the connection is closing.
  bool ProcessFrames(const std::shared_ptr<ServerConn>& conn);
  static bool TokenEquals(std::string_view a, std::string_view b);
  // Checks [offset, offset+len) of region `key` and, for WRITE/CAS/FAA (`modify`), that the
  // region is writable; returns the address or sets an error. Checked in this order: key, access,
  // bounds (alignment is the caller's), so a read-only region never reaches the memory code.
  uint8_t* Locate(uint64_t key, uint64_t offset, uint64_t len, bool modify, Code* code,
                  std::string* msg);
  bool Serve(const std::shared_ptr<ServerConn>& conn_ptr, const w::FrameView& f, BatchLocks& locks);
  // Sends a connection-level error frame, stops writing and drains input until the peer closes.
  // `protocol_error`: counted in protocol_errors and logged as a warning (else at debug level).
  void Fatal(const std::shared_ptr<ServerConn>& conn, Code code, const std::string& msg,
             bool protocol_error = true);
  void SweepClosing();
  static void CloseConn(ServerConn& conn);
  // Closes the connection and forgets it (per-address count, gauges). NIC thread.
  void Drop(const std::shared_ptr<ServerConn>& conn);
  // Closes connections that did not authenticate within auth_timeout.
  void SweepAuth(Clock::time_point now);
  // True (and the connection paused) if serving `f` could queue more reply bytes than
  // max_send_queue_bytes. Requires the connection's wmu.
  bool ThrottleLocked(ServerConn& conn, const w::FrameView& f);
  // Resumes paused connections whose queued replies drained below send_queue_resume_bytes and
  // serves the requests already buffered.
  void ResumePaused();
  // Re-polls the listener once an accept back-off ends.
  void MaybeRearmListener(Clock::time_point now);

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<NicShared> nic_;
  RpcHandler handler_;
  w::DecodeLimits limits_;

  mutable std::mutex lifecycle_mu_;  // start/stop/local_address
  bool started_ = false;
  std::string local_address_;
  net::Fd listen_fd_, epoll_fd_, wake_fd_;
  std::thread thread_;
  std::atomic<bool> stop_requested_{false};

  // Registered regions; the NIC thread holds it shared while touching region memory.
  std::shared_mutex regions_mu_;
  std::unordered_map<RegionKey, MemoryRegion> regions_;
  std::mt19937_64 rng_;    // guarded by regions_mu_
  CopyEpoch read_copies_;  // odd while the NIC thread copies region memory into a READ response

  // NIC thread only (and stop() after the thread joined).
  std::unordered_map<uint64_t, std::shared_ptr<ServerConn>> conns_;
  std::vector<uint64_t> closing_;
  uint64_t next_conn_id_ = 2;
  // Connection limits (TransportConfig::tcp_limits). NIC thread only.
  struct AuthWait {
    Clock::time_point deadline;
    uint64_t id;
  };
  std::deque<AuthWait> auth_waits_;  // accept order, hence deadline order
  std::unordered_map<std::string, uint32_t> per_address_;
  std::vector<uint64_t> paused_;  // connections whose reads are paused (may hold closed ids)
  size_t max_rbuf_ = 0;           // largest frame + kRecvChunk
  net::AcceptBackoff accept_backoff_;
  bool listen_armed_ = true;
};

}  // namespace farmem::tcp::internal
