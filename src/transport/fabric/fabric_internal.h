// Declarations shared by fabric_transport.cc, fabric_target.cc and fabric_initiator.cc (internal to
// this folder): Core, used by every thread of a transport (locks named beside its members), and
// FabricContext, used by one thread at a time. Design notes: docs/fabric.md.
#pragma once

#include <linux/futex.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "farmem/transport.h"
#include "transport/fabric/fabric_transport.h"
#include "transport/fabric/fabric_util.h"

namespace farmem::fabric::internal {

using Clock = std::chrono::steady_clock;

// Receive buffers pre-posted on the main endpoint and on each context (replies). Messages beyond
// these wait in the provider's unexpected-message queue until a buffer is reposted.
inline constexpr size_t kMainRecvBuffers = 16;
inline constexpr size_t kContextRecvBuffers = 8;
inline constexpr size_t kCqBatch = 16;
inline constexpr size_t kOpChunk = 256;
// Same-host key-validity table (shm): slot 0 holds the table id, slot 1 the doorbell (two 32-bit
// words: wake counter, "progress thread asleep" flag), slots 2.. hold live keys.
inline constexpr size_t kKeyTableSlots = 1u << 16;
inline constexpr uint32_t kFirstKeySlot = 2;
// Longest idle sleep when a doorbell or CQ wait object wakes us earlier anyway.
inline constexpr int kIdleWaitMs = 1;
// Idle sleep of a shm progress thread on its doorbell with nothing of its own to retry: peers ring
// for everything they need, so this only bounds housekeeping (idle cost: ~100 wake-ups a second).
inline constexpr auto kShmIdleWait = std::chrono::milliseconds(10);
// Idle progress thread sleeps this long between polls (bounds stop() latency and cold-target
// delay).
inline constexpr auto kIdleSleep = std::chrono::microseconds(50);
inline constexpr auto kLookupRetryDelay = std::chrono::milliseconds(2);
// Sends that keep failing with -FI_EAGAIN are retried less and less often: a live peer's
// connection or the endpoint's tx credits come back within microseconds, but ofi_rxm 1.17 answers
// every send to a dead peer with -FI_EAGAIN forever (each call starts another connect that is
// refused). Retries are per destination, so such a peer never holds up sends to other peers.
inline constexpr auto kMaxRetryBackoff = std::chrono::milliseconds(2);
// The main progress thread keeps spinning while a queued send is due within this.
inline constexpr auto kSendRetrySpin = std::chrono::microseconds(100);
// libfabric 1.17's shm provider guards each endpoint's queues with a spinlock in shared memory. A
// peer process killed while holding its lock leaves it held forever, and the next call that posts
// to that peer spins in the provider for good. So before calling the provider for a same-host
// peer we check (through a pidfd) that its process still runs: on every retry of a refused op
// and, on the fast path, at most this often (a poll() per op would cost a syscall per read).
inline constexpr auto kPeerLivenessInterval = std::chrono::milliseconds(1);

// When to retry a destination blocked since `blocked_since`: after an eighth of the time it has
// been blocked, at most kMaxRetryBackoff.
inline Clock::time_point NextRetry(Clock::time_point blocked_since, Clock::time_point now) {
  return now + std::min<Clock::duration>((now - blocked_since) / 8, kMaxRetryBackoff);
}

Code CodeForFiError(int err);

// `ret` is a negative libfabric return value.
Status FiStatus(std::string_view what, long ret);

// Errors a provider reports when the target rejected the key or address: the region may have been
// deregistered after we cached its lookup, so the op revalidates the key before failing.
// Errors after which ofi_rxm never uses the connection again: the peer's AV entry is replaced so
// the next operation opens a fresh connection.
inline bool IsConnectionError(int err) {
  return err == FI_ECANCELED || err == FI_ENOTCONN || err == FI_ECONNRESET || err == EPIPE ||
         err == FI_ECONNABORTED;
}

// tcp;ofi_rxm answers an unknown key by closing the connection, so the op itself sees
// FI_ECANCELED / FI_ENOTCONN / broken pipe rather than an access error.
inline bool LooksLikeKeyError(int err) {
  return err == FI_EACCES || err == FI_EINVAL || err == FI_EKEYREJECTED || err == FI_EPERM ||
         err == FI_ENOKEY || err == FI_EFAULT || err == FI_EREMOTEIO || err == FI_EIO ||
         err == FI_ECANCELED || err == FI_ENOTCONN || err == FI_ECONNRESET || err == EPIPE ||
         err == FI_ECONNABORTED;
}

// The doorbell of a key table: peers ring it after posting an operation that needs the target's
// progress thread (atomics, messages), so a sleeping target wakes at once instead of on a timer.
inline std::atomic<uint32_t>* DoorbellOf(void* table) {
  return reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(table) + 8);
}
inline void RingDoorbell(std::atomic<uint32_t>* db) {
  // seq_cst pairs with the sleeper's "set flag, then re-read counter" (Dekker): either we see the
  // flag and wake it, or it sees our increment and does not sleep.
  db[0].fetch_add(1, std::memory_order_seq_cst);
  if (db[1].load(std::memory_order_seq_cst) != 0) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&db[0]), FUTEX_WAKE, 1, nullptr, nullptr, 0);
  }
}

// Every libfabric operation context starts with this (FI_CONTEXT/FI_CONTEXT2 mode space first).
enum class Kind : uint8_t { kOp, kRecv, kSend };
struct FiCtx {
  fi_context2 fctx{};
  Kind kind = Kind::kOp;
};

struct RecvBuf : FiCtx {
  std::unique_ptr<std::byte[]> data;  // not value-initialised: pages stay untouched until used
  size_t capacity = 0;
  fid_mr* mr = nullptr;
};

struct SendBuf : FiCtx {
  std::vector<std::byte> data;
  fid_mr* mr = nullptr;
  fi_addr_t dest = FI_ADDR_UNSPEC;
  Clock::time_point expires;  // a queued send not accepted by the provider by then is dropped
};

void CloseFid(fid_t fid);

// Endpoints are not closed at once but retired for kGrace: libfabric 1.17 shm crashes (SIGSEGV in
// fi_cq_read) when an endpoint of the SAME process is closed while a peer endpoint still has
// traffic in flight with it (large-message protocol state, late replies). Retired endpoints are
// closed by a later Retire() once the grace period passed, or as soon as no transport or context
// of this process is alive any more (nothing can then still talk to them; this releases every
// fd and shm file when the last transport is destroyed); at exit they are simply left open.
inline constexpr auto kGrace = std::chrono::milliseconds(250);
struct Grave {
  Clock::time_point when;
  std::vector<fid_t> fids;                  // closed in this order (endpoint first)
  std::vector<std::shared_ptr<void>> keep;  // buffers the provider may touch until then
  std::shared_ptr<void> owner;              // keeps the domain open until the fids are closed
};
void Retire(Grave grave);
// Called by every FabricTransport/FabricContext constructor and, after its own Retire(), by its
// destructor. When the last one goes, all graves are closed at once.
void AddLiveUser();
void DropLiveUser();
template <typename T>
std::shared_ptr<void> Keep(T&& value) {
  return std::make_shared<std::decay_t<T>>(std::forward<T>(value));
}

std::string NameToSource(const fi_info* info, std::span<const std::byte> name);

// FI_ADDR_STR names must be NUL-terminated C strings for fi_av_insert.
std::vector<std::byte> AvName(const fi_info* info, std::span<const std::byte> name);

// ---------------------------------------------------------------------------------------------
// Core: fabric/domain, registry, peers and the main endpoint, shared by the transport, its
// contexts and outstanding IncomingRpc handles (whichever is destroyed last closes the domain).
class Core : public std::enable_shared_from_this<Core> {
 public:
  Core(TransportConfig config, FabricOptions options)
      : config_(std::move(config)), options_(options), rng_(std::random_device{}()) {}
  ~Core();

  Status Open();
  Status StartServing();
  void ProgressLoop(std::atomic<bool>& stop);
  // Interrupts the progress thread's idle wait.
  void Wake();
  void Shutdown();

  Result<MemoryRegion> Register(void* addr, size_t len, Access access);
  Status Deregister(RegionKey key);
  Result<PeerId> AddPeer(std::string_view address);
  struct PeerRec {
    std::vector<std::byte> name;                // AV-ready endpoint name (empty: unknown peer)
    std::atomic<uint32_t>* doorbell = nullptr;  // same-host peers (shm) only
    int pidfd = -1;  // same-host peers (shm) only: the peer process, for liveness checks
  };
  PeerRec GetPeer(PeerId peer);
  struct Mapping {
    void* base = nullptr;
    size_t size = 0;
    int pidfd = -1;  // the process that owns the table (-1: kernel without pidfd_open)
  };
  // Maps a peer's key-validity table; null when unavailable.
  const Mapping* RemoteTable(int32_t pid, int32_t fd, uint64_t id);

  // Sends a message from the main endpoint (any thread). Queued if the provider is busy.
  Status SendMain(fi_addr_t dest, MsgType type, uint32_t imm, uint64_t seq, uint32_t status_code,
                  std::span<const std::byte> payload);

  // Registers a local buffer for FI_MR_LOCAL use, bound to `ep` when FI_MR_ENDPOINT.
  Result<fid_mr*> RegisterLocal(const void* addr, size_t len, fid_ep* ep);

  const TransportConfig& config() const { return config_; }
  const MrPlan& plan() const { return plan_; }
  bool need_local_desc() const { return plan_.local || options_.force_mr_local; }
  bool skip_access_check() const { return options_.skip_access_check; }
  bool idle_wait_forever() const { return options_.idle_wait_forever; }
  fi_info* info() const { return info_; }
  fid_domain* domain() const { return domain_; }
  const std::string& address() const { return address_; }
  bool stopped() const { return stopped_.load(std::memory_order_acquire); }
  void set_handler(RpcHandler h) { handler_ = std::move(h); }
  size_t recv_capacity() const {
    return sizeof(WireHeader) + kMaxEndpointName + config_.max_rpc_bytes;
  }

 private:
  struct Region {
    fid_mr* mr = nullptr;
    void* addr = nullptr;
    size_t length = 0;
    uint64_t prov_key = 0;
    uint32_t slot = 0;
    Access access = Access::kReadWrite;
  };
  Status OpenKeyTable();
  Status PostMainRecv(RecvBuf* rb);
  void HandleMainCompletion(FiCtx* ctx, size_t len, const Status& error);
  void HandleMainMessage(std::span<const std::byte> bytes);
  Result<fi_addr_t> ResolveMainAddr(std::span<const std::byte> name);
  // Retries queued sends whose destination is due; drops expired ones. Returns when the next
  // retry is due (time_point::max() when nothing is queued).
  Clock::time_point DrainSendQueues();
  SendBuf* TakeSendBuf();
  void ReleaseSendBuf(SendBuf* sb);

  TransportConfig config_;
  FabricOptions options_;
  RpcHandler handler_;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  MrPlan plan_;
  std::atomic<bool> stopped_{false};

  // Main endpoint. Sends are serialised by send_mu_ (reply() runs on any thread); receives and the
  // CQ belong to the progress thread.
  fid_ep* ep_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  std::vector<std::byte> name_;
  std::string address_;
  std::vector<std::unique_ptr<RecvBuf>> recv_bufs_;
  std::vector<RecvBuf*> repost_;                           // progress thread only
  std::unordered_map<std::string, fi_addr_t> main_addrs_;  // progress thread only

  std::mutex send_mu_;
  bool main_closed_ = false;
  // Sends the provider refused with -FI_EAGAIN, per destination (post order kept per
  // destination only, so one unreachable requester cannot block replies to the others).
  struct DestQueue {
    std::deque<SendBuf*> bufs;
    Clock::time_point blocked_since;  // last time a send to this destination was accepted
    Clock::time_point next_try;
  };
  std::unordered_map<fi_addr_t, DestQueue> send_queues_;  // only destinations with queued sends
  std::vector<std::unique_ptr<SendBuf>> send_all_;
  std::vector<SendBuf*> send_free_;
  bool wait_cq_ = false;  // main CQ has a wait object (fi_cq_sread usable)
  std::mutex wake_mu_;
  std::condition_variable wake_cv_;

  std::mutex reg_mu_;
  std::unordered_map<RegionKey, Region> regions_;
  std::mt19937_64 rng_;
  // Key-validity table (shm only): peers map it read-only through /proc/<pid>/fd/<fd>.
  int table_fd_ = -1;
  std::atomic<uint64_t>* table_ = nullptr;
  uint64_t table_id_ = 0;
  std::vector<uint32_t> table_free_;

  std::mutex peer_mu_;
  std::vector<PeerRec> peers_;
  std::unordered_map<std::string, PeerId> peer_ids_;

  std::mutex remote_mu_;
  std::map<std::tuple<int32_t, int32_t, uint64_t>, Mapping> remote_tables_;

  friend class FabricIncomingRpc;
};

// ---------------------------------------------------------------------------------------------
// Initiator side.

struct PeerKey {
  PeerId peer;
  RegionKey key;
  bool operator==(const PeerKey&) const = default;
};
struct PeerKeyHash {
  size_t operator()(const PeerKey& k) const {
    return std::hash<uint64_t>()(k.key ^ (uint64_t{k.peer} * 0x9e3779b97f4a7c15ull));
  }
};

struct Op : FiCtx {
  uint32_t index = 0;
  uint32_t gen = 0;
  OpType type = OpType::kRead;
  bool internal = false;  // a key lookup: no user completion
  bool user_done = true;  // the user completion was produced (or the slot is free)
  bool free = true;
  uint8_t refs = 0;  // provider completions / waiter list / retry queue holding the op
  uint64_t wr_id = 0;
  Clock::time_point deadline;
  Op* prev = nullptr;  // in-flight list, ordered by deadline (all ops share op_timeout)
  Op* next = nullptr;
  Op* wait_next = nullptr;
  PeerId peer = kInvalidPeer;
  RegionKey key = 0;
  uint64_t offset = 0;
  uint64_t raddr = 0;
  uint64_t rkey = 0;
  // Reads on shm: the peer's key-table slot of op->key (set by Issue), checked again when the
  // read completes, so that a region deregistered during the copy fails the read.
  const std::atomic<uint64_t>* valid = nullptr;
  fi_addr_t dest = FI_ADDR_UNSPEC;
  void* local = nullptr;
  size_t len = 0;
  bool delivery_complete = false;
  uint64_t* old_value = nullptr;
  uint64_t operand = 0;
  uint64_t compare = 0;
  uint64_t result = 0;
  std::span<std::byte> reply;
  uint32_t reply_imm = 0;
  uint32_t reply_length = 0;
  std::vector<std::byte> msg;
  fid_mr* local_mr = nullptr;
  Status prior_error;
};

struct KeyEntry {
  bool ready = false;
  uint64_t base = 0;
  uint64_t length = 0;
  uint64_t prov_key = 0;
  const std::atomic<uint64_t>* valid = nullptr;       // peer's key-table slot (shm) or null
  const std::atomic<uint64_t>* table_head = nullptr;  // slot 0: the table id while serving
  uint64_t table_id = 0;
  bool read_only = false;  // registered Access::kReadOnly at the peer
  int32_t owner_pid = 0;   // shm: the process whose memory this is (0: unknown, no direct copy)
  Op* waiters = nullptr;
  Op* waiters_tail = nullptr;
  Op* lookup = nullptr;
};

class FabricContext : public Context {
 public:
  explicit FabricContext(std::shared_ptr<Core> core) : core_(std::move(core)) { AddLiveUser(); }
  ~FabricContext() override;

  Status Open();

  Status post_read(const RemoteRef& src, void* dst, size_t len, uint64_t wr_id) override;
  Status post_write(const RemoteRef& dst, const void* src, size_t len, uint64_t wr_id,
                    bool delivery_complete) override;
  Status post_compare_swap(const RemoteRef& dst, uint64_t expected, uint64_t desired,
                           uint64_t* old_value, uint64_t wr_id) override;
  Status post_fetch_add(const RemoteRef& dst, uint64_t add, uint64_t* old_value,
                        uint64_t wr_id) override;
  Status post_rpc(PeerId peer, uint32_t imm, std::span<const std::byte> request,
                  std::span<std::byte> reply, uint64_t wr_id) override;
  std::optional<Status> read_ordered_now(PeerId peer, RegionKey key,
                                         std::span<const ReadSegment> segments) override;
  size_t poll(std::span<Completion> out) override;
  size_t outstanding() const override { return outstanding_; }
  bool needs_progress() const override;

  ContextStats stats() const { return stats_; }

 private:
  Result<fi_addr_t> PeerAddr(PeerId peer);
  void ResetPeer(PeerId peer, fi_addr_t addr);
  void AfterPost(const Op* op);
  // The provider refused a post with -FI_EAGAIN.
  void AfterRefusal(PeerId peer);
  Result<Op*> NewOp(OpType type, PeerId peer, uint64_t wr_id);
  Status PostOneSided(Op* op);
  void EnqueueForKey(Op* op);
  void Issue(Op* op, KeyEntry* e);
  // Copies a read from a same-host peer in this thread (process_vm_readv)
  // and finishes it; false when the op must go to the provider instead.
  bool TryDirectCopy(Op* op, const KeyEntry& e);
  Status ReadStillValid(Op* op);
  void Submit(Op* op);
  ssize_t CallProvider(Op* op);
  // Whether a same-host peer's process has exited; checks at most every kPeerLivenessInterval
  // unless `now_or_never` (then it always asks the kernel). Always false for remote peers.
  bool PeerExited(PeerId peer, bool now_or_never);
  static Status PeerExitedStatus(OpType type);
  // Fails an op the provider never accepted; a failed key lookup fails the ops waiting for it.
  void FailUnposted(Op* op, Status status);
  void SendLookup(const PeerKey& pk, KeyEntry* e);
  void FailEntry(const PeerKey& pk, const Status& status);
  void Finish(Op* op, Status status);
  void Release(Op* op);
  void Unref(Op* op);
  void ProgressCq();
  void HandleCompletion(FiCtx* ctx, size_t len, int err, const Status& error);
  void HandleMessage(std::span<const std::byte> bytes);
  void RetryQueued();
  void RetryPeer(PeerId peer, Clock::time_point now);
  void RunDelayedLookups();
  void ExpireDeadlines();
  void AbortAll();
  Status PostRecv(RecvBuf* rb);
  void EraseEntry(const PeerKey& pk);
  Op* FindOp(uint64_t seq);
  static uint64_t SeqOf(const Op* op) { return uint64_t{op->gen} << 32 | op->index; }

  std::shared_ptr<Core> core_;
  fid_ep* ep_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fi_info* info_ = nullptr;
  std::vector<std::byte> name_;
  bool local_desc_ = false;
  bool direct_copy_ =
      false;  // shm with CMA, unless FARMEM_FABRIC_DIRECT_COPY=0: reads bypass the provider

  struct PeerSlot {
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    std::atomic<uint32_t>* doorbell = nullptr;
    int pidfd = -1;            // same-host peers: the peer process (owned by Core)
    bool exited = false;       // its process has exited (sticky: a new process is a new peer)
    bool cma_refused = false;  // the kernel refused us process_vm_readv on it (EPERM): use fi_*
    Clock::time_point liveness_checked;
    // Ops the provider refused with -FI_EAGAIN, in post order. Per peer, so ops to a dead peer
    // (rxm: -FI_EAGAIN forever) never hold up ops to other peers.
    std::deque<Op*> retry;
    Clock::time_point blocked_since;  // last time an op to this peer was accepted
    Clock::time_point next_try;
  };
  std::vector<PeerSlot> peers_;
  std::vector<std::unique_ptr<Op[]>> chunks_;
  std::vector<fid_mr*> chunk_mrs_;
  std::vector<Op*> free_ops_;
  Op* head_ = nullptr;  // in-flight list
  Op* tail_ = nullptr;
  std::vector<PeerId> retry_peers_;  // peers with a non-empty retry queue
  std::unordered_map<PeerKey, KeyEntry, PeerKeyHash> cache_;
  PeerKey last_pk_{kInvalidPeer, 0};
  KeyEntry* last_entry_ = nullptr;
  std::vector<Completion> ready_;
  size_t ready_head_ = 0;
  size_t outstanding_ = 0;
  bool aborted_ = false;
  // A direct copy finished inside a post: the next poll() progresses the provider even though
  // ready_ is not empty, or a thread whose reads keep completing at once starves its own CQ.
  bool progress_due_ = false;
  std::vector<std::unique_ptr<RecvBuf>> recv_bufs_;
  std::vector<RecvBuf*> repost_;
  std::vector<std::pair<PeerKey, Clock::time_point>> delayed_lookups_;
  ContextStats stats_;
};

}  // namespace farmem::fabric::internal
