// libfabric FI_EP_RDM implementation of Transport/Context (providers shm, tcp;ofi_rxm,
// verbs;ofi_rxm). One "main" endpoint per transport serves RPCs and key lookups on a progress
// thread; every Context owns its own endpoint/CQ/AV. Design notes, mr_mode handling and caveats:
// docs/fabric.md.
#include "transport/fabric/fabric_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/log.h"
#include "transport/fabric/fabric_util.h"

namespace farmem {
namespace fabric {
namespace {

using Clock = std::chrono::steady_clock;

// Receive buffers pre-posted on the main endpoint and on each context (replies). Messages beyond
// these wait in the provider's unexpected-message queue until a buffer is reposted.
constexpr size_t kMainRecvBuffers = 16;
constexpr size_t kContextRecvBuffers = 8;
constexpr size_t kCqBatch = 16;
constexpr size_t kOpChunk = 256;
// Same-host key-validity table (shm): slot 0 holds the table id, slot 1 the doorbell (two 32-bit
// words: wake counter, "progress thread asleep" flag), slots 2.. hold live keys.
constexpr size_t kKeyTableSlots = 1u << 16;
constexpr uint32_t kFirstKeySlot = 2;
// Longest idle sleep when a doorbell or CQ wait object wakes us earlier anyway.
constexpr int kIdleWaitMs = 1;
// Idle progress thread sleeps this long between polls (bounds stop() latency and cold-target
// delay).
constexpr auto kIdleSleep = std::chrono::microseconds(50);
constexpr auto kLookupRetryDelay = std::chrono::milliseconds(2);
// Sends that keep failing with -FI_EAGAIN are retried less and less often: a live peer's
// connection or the endpoint's tx credits come back within microseconds, but ofi_rxm 1.17 answers
// every send to a dead peer with -FI_EAGAIN forever (each call starts another connect that is
// refused). Retries are per destination, so such a peer never holds up sends to other peers.
constexpr auto kMaxRetryBackoff = std::chrono::milliseconds(2);
// The main progress thread keeps spinning while a queued send is due within this.
constexpr auto kSendRetrySpin = std::chrono::microseconds(100);
// libfabric 1.17's shm provider guards each endpoint's queues with a spinlock in shared memory. A
// peer process killed while holding its lock leaves it held forever, and the next call that posts
// to that peer spins in the provider for good. So before calling the provider for a same-host
// peer we check (through a pidfd) that its process still runs: on every retry of a refused op
// and, on the fast path, at most this often (a poll() per op would cost a syscall per read).
constexpr auto kPeerLivenessInterval = std::chrono::milliseconds(1);

// When to retry a destination blocked since `blocked_since`: after an eighth of the time it has
// been blocked, at most kMaxRetryBackoff.
Clock::time_point NextRetry(Clock::time_point blocked_since, Clock::time_point now) {
  return now + std::min<Clock::duration>((now - blocked_since) / 8, kMaxRetryBackoff);
}

Code CodeForFiError(int err) {
  switch (err) {
    case FI_ETIMEDOUT:
      return Code::kTimedOut;
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ENOTCONN:
    case FI_ESHUTDOWN:
    case EPIPE:
    case ESRCH:
      return Code::kUnavailable;
    case FI_ECANCELED:
      return Code::kAborted;
    case FI_EACCES:
    case FI_EPERM:
      return Code::kPermissionDenied;
    case FI_ENOMEM:
    case FI_ENOSPC:
    case FI_ETOOSMALL:
      return Code::kResourceExhausted;
    case FI_ENODATA:
    case FI_ENOSYS:
    case FI_EOPNOTSUPP:
      return Code::kUnavailable;
    default:
      return Code::kIoError;
  }
}

// `ret` is a negative libfabric return value.
Status FiStatus(std::string_view what, long ret) {
  const int err = static_cast<int>(ret < 0 ? -ret : ret);
  return Status(CodeForFiError(err), std::string(what) + ": " + fi_strerror(err));
}

// Errors a provider reports when the target rejected the key or address: the region may have been
// deregistered after we cached its lookup, so the op revalidates the key before failing.
// Errors after which ofi_rxm never uses the connection again: the peer's AV entry is replaced so
// the next operation opens a fresh connection.
bool IsConnectionError(int err) {
  return err == FI_ECANCELED || err == FI_ENOTCONN || err == FI_ECONNRESET || err == EPIPE ||
         err == FI_ECONNABORTED;
}

// tcp;ofi_rxm answers an unknown key by closing the connection, so the op itself sees
// FI_ECANCELED / FI_ENOTCONN / broken pipe rather than an access error.
bool LooksLikeKeyError(int err) {
  return err == FI_EACCES || err == FI_EINVAL || err == FI_EKEYREJECTED || err == FI_EPERM ||
         err == FI_ENOKEY || err == FI_EFAULT || err == FI_EREMOTEIO || err == FI_EIO ||
         err == FI_ECANCELED || err == FI_ENOTCONN || err == FI_ECONNRESET || err == EPIPE ||
         err == FI_ECONNABORTED;
}

// The doorbell of a key table: peers ring it after posting an operation that needs the target's
// progress thread (atomics, messages), so a sleeping target wakes at once instead of on a timer.
std::atomic<uint32_t>* DoorbellOf(void* table) {
  return reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(table) + 8);
}
void RingDoorbell(std::atomic<uint32_t>* db) {
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

void CloseFid(fid_t fid) {
  if (fid != nullptr) {
    const int ret = fi_close(fid);
    if (ret != 0) FARMEM_LOG_WARN("fabric: fi_close failed: {}", fi_strerror(-ret));
  }
}

// Endpoints are not closed at once but retired for kGrace: libfabric 1.17 shm crashes (SIGSEGV in
// fi_cq_read) when an endpoint of the SAME process is closed while a peer endpoint still has
// traffic in flight with it (large-message protocol state, late replies). Retired endpoints are
// closed by a later Retire() once the grace period passed, or as soon as no transport or context
// of this process is alive any more (nothing can then still talk to them; this releases every
// fd and shm file when the last transport is destroyed); at exit they are simply left open.
constexpr auto kGrace = std::chrono::milliseconds(250);
struct Grave {
  Clock::time_point when;
  std::vector<fid_t> fids;                  // closed in this order (endpoint first)
  std::vector<std::shared_ptr<void>> keep;  // buffers the provider may touch until then
  std::shared_ptr<void> owner;              // keeps the domain open until the fids are closed
};
struct Graveyard {
  std::mutex mu;
  std::deque<Grave> graves;
  size_t live = 0;  // FabricTransport + FabricContext objects alive in this process
};
Graveyard& Yard() {
  static auto* yard = new Graveyard;  // leaked on purpose: nothing to run at exit
  return *yard;
}
void Bury(std::vector<Grave>& due) {
  for (Grave& g : due) {
    for (fid_t f : g.fids) CloseFid(f);
    g.keep.clear();
    g.owner.reset();  // may destroy a Core, which may Retire() again (lock not held)
  }
}
void Retire(Grave grave) {
  Graveyard& y = Yard();
  std::vector<Grave> due;
  {
    std::lock_guard lock(y.mu);
    const auto now = Clock::now();
    while (!y.graves.empty() && now - y.graves.front().when > kGrace) {
      due.push_back(std::move(y.graves.front()));
      y.graves.pop_front();
    }
    grave.when = now;
    y.graves.push_back(std::move(grave));
  }
  Bury(due);
}
// Called by every FabricTransport/FabricContext constructor and, after its own Retire(), by its
// destructor. When the last one goes, all graves are closed at once.
void AddLiveUser() {
  Graveyard& y = Yard();
  std::lock_guard lock(y.mu);
  y.live++;
}
void DropLiveUser() {
  Graveyard& y = Yard();
  std::vector<Grave> due;
  {
    std::lock_guard lock(y.mu);
    if (y.live > 0) y.live--;
    if (y.live != 0) return;
    due.assign(std::make_move_iterator(y.graves.begin()), std::make_move_iterator(y.graves.end()));
    y.graves.clear();
  }
  Bury(due);
}
template <typename T>
std::shared_ptr<void> Keep(T&& value) {
  return std::make_shared<std::decay_t<T>>(std::forward<T>(value));
}

std::string NameToSource(const fi_info* info, std::span<const std::byte> name) {
  if (info->addr_format == FI_SOCKADDR_IN && name.size() >= sizeof(sockaddr_in)) {
    sockaddr_in sin;
    std::memcpy(&sin, name.data(), sizeof(sin));
    char ip[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &sin.sin_addr, ip, sizeof(ip));
    return std::string(ip) + ":" + std::to_string(ntohs(sin.sin_port));
  }
  if (info->addr_format == FI_ADDR_STR) {
    std::string s(reinterpret_cast<const char*>(name.data()), name.size());
    while (!s.empty() && s.back() == '\0') s.pop_back();
    return s;
  }
  return HexEncode(name);
}

// FI_ADDR_STR names must be NUL-terminated C strings for fi_av_insert.
std::vector<std::byte> AvName(const fi_info* info, std::span<const std::byte> name) {
  std::vector<std::byte> out(name.begin(), name.end());
  if (info->addr_format == FI_ADDR_STR && (out.empty() || out.back() != std::byte{0})) {
    out.push_back(std::byte{0});
  }
  return out;
}

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
class FabricIncomingRpc : public IncomingRpc {
 public:
  FabricIncomingRpc(std::shared_ptr<Core> core, fi_addr_t dest, uint64_t seq, uint32_t imm,
                    std::vector<std::byte> payload, std::string source)
      : core_(std::move(core)),
        dest_(dest),
        seq_(seq),
        imm_(imm),
        payload_(std::move(payload)),
        source_(std::move(source)) {}
  ~FabricIncomingRpc() override {
    if (!replied_) {
      (void)reply_error(Status::Aborted("RPC dropped by the handler without a reply"));
    }
  }
  uint32_t imm() const override { return imm_; }
  std::span<const std::byte> payload() const override { return payload_; }
  std::string_view source() const override { return source_; }
  Status reply(uint32_t imm, std::span<const std::byte> payload) override {
    if (replied_) return Status::InvalidArgument("RPC already answered");
    if (payload.size() > core_->config().max_rpc_bytes) {
      return Status::InvalidArgument("RPC reply of " + std::to_string(payload.size()) +
                                     " bytes exceeds max_rpc_bytes");
    }
    replied_ = true;
    return core_->SendMain(dest_, MsgType::kRpcReply, imm, seq_, 0, payload);
  }
  Status reply_error(const Status& status) override {
    if (replied_) return Status::InvalidArgument("RPC already answered");
    replied_ = true;
    const Code code = status.ok() ? Code::kInternal : status.code();
    std::string_view msg = status.ok() ? "reply_error called with OK" : status.message();
    if (msg.size() > 4096) msg = msg.substr(0, 4096);
    return core_->SendMain(dest_, MsgType::kRpcReply, 0, seq_, static_cast<uint32_t>(code),
                           std::as_bytes(std::span(msg.data(), msg.size())));
  }

 private:
  std::shared_ptr<Core> core_;
  fi_addr_t dest_;
  uint64_t seq_;
  uint32_t imm_;
  std::vector<std::byte> payload_;
  std::string source_;
  bool replied_ = false;
};

// ---------------------------------------------------------------------------------------------
Core::~Core() {
  Shutdown();
  CloseFid(domain_ ? &domain_->fid : nullptr);
  CloseFid(fabric_ ? &fabric_->fid : nullptr);
  if (info_ != nullptr) fi_freeinfo(info_);
  if (table_ != nullptr) munmap(table_, kKeyTableSlots * sizeof(uint64_t));
  if (table_fd_ >= 0) close(table_fd_);
  for (auto& [k, m] : remote_tables_) {
    munmap(m.base, m.size);
    if (m.pidfd >= 0) close(m.pidfd);
  }
}

Status Core::Open() {
  fi_info* hints = fi_allocinfo();
  if (hints == nullptr) return Status::ResourceExhausted("fi_allocinfo failed");
  hints->caps = FI_MSG | FI_RMA | FI_ATOMIC | FI_READ | FI_WRITE | FI_SEND | FI_RECV |
                FI_REMOTE_READ | FI_REMOTE_WRITE;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode = static_cast<int>(SupportedMrModeBits());
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->fabric_attr->prov_name = strdup(config_.provider.c_str());
  const bool is_shm = config_.provider == "shm";
  // Non-shm providers are pinned to listen_host so they never pick eth0 by accident.
  const char* node = is_shm || config_.listen_host.empty() ? nullptr : config_.listen_host.c_str();
  std::string service;
  if (!is_shm && config_.listen_port != 0) service = std::to_string(config_.listen_port);
  const int ret = fi_getinfo(FI_VERSION(1, 17), node, service.empty() ? nullptr : service.c_str(),
                             node ? FI_SOURCE : 0, hints, &info_);
  fi_freeinfo(hints);
  if (ret != 0 || info_ == nullptr) {
    info_ = nullptr;
    return FiStatus("libfabric provider '" + config_.provider + "' with FI_EP_RDM, RMA, atomics" +
                        (node ? " on " + config_.listen_host : std::string()) + " is not available",
                    ret != 0 ? ret : -FI_ENODATA)
        .WithContext("fabric");
  }
  FARMEM_ASSIGN_OR_RETURN(plan_, PlanForMrMode(static_cast<uint64_t>(info_->domain_attr->mr_mode),
                                               info_->domain_attr->mr_key_size));
  int r = fi_fabric(info_->fabric_attr, &fabric_, nullptr);
  if (r != 0) return FiStatus("fi_fabric", r);
  r = fi_domain(fabric_, info_, &domain_, nullptr);
  if (r != 0) return FiStatus("fi_domain", r);
  fi_atomic_attr aattr{};
  r = fi_query_atomic(domain_, FI_UINT64, FI_CSWAP, &aattr, FI_COMPARE_ATOMIC);
  if (r != 0) return FiStatus("provider lacks 64-bit compare-and-swap", r);
  r = fi_query_atomic(domain_, FI_UINT64, FI_SUM, &aattr, FI_FETCH_ATOMIC);
  if (r != 0) return FiStatus("provider lacks 64-bit fetch-and-add", r);

  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_MSG;
  // shm targets are woken by our doorbell. Blocking in fi_cq_sread (tcp: epoll over its sockets)
  // also wakes non-shm targets on one-sided requests; it is opt-in (FARMEM_FABRIC_CQ_WAIT=1)
  // until its latency is measured. (Its old failure after a peer died was the reply queue's
  // head-of-line blocking, fixed by per-destination queues; see docs/fabric.md.)
  const char* cq_wait = getenv("FARMEM_FABRIC_CQ_WAIT");
  if (!is_shm && cq_wait != nullptr && std::string_view(cq_wait) == "1") {
    cq_attr.wait_obj = FI_WAIT_UNSPEC;
    wait_cq_ = fi_cq_open(domain_, &cq_attr, &cq_, nullptr) == 0;
  }
  if (!wait_cq_) {
    cq_attr.wait_obj = FI_WAIT_NONE;
    r = fi_cq_open(domain_, &cq_attr, &cq_, nullptr);
    if (r != 0) return FiStatus("fi_cq_open", r);
  }
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_UNSPEC;
  r = fi_av_open(domain_, &av_attr, &av_, nullptr);
  if (r != 0) return FiStatus("fi_av_open", r);
  r = fi_endpoint(domain_, info_, &ep_, nullptr);
  if (r != 0) return FiStatus("fi_endpoint", r);
  r = fi_ep_bind(ep_, &av_->fid, 0);
  if (r != 0) return FiStatus("fi_ep_bind(av)", r);
  r = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
  if (r != 0) return FiStatus("fi_ep_bind(cq)", r);
  r = fi_enable(ep_);
  if (r != 0) return FiStatus("fi_enable", r);
  size_t len = 0;
  r = fi_getname(&ep_->fid, nullptr, &len);
  if (r != -FI_ETOOSMALL && r != 0) return FiStatus("fi_getname", r);
  if (len == 0 || len > kMaxEndpointName) {
    return Status::Unavailable("endpoint name of " + std::to_string(len) + " bytes not supported");
  }
  name_.resize(len);
  r = fi_getname(&ep_->fid, name_.data(), &len);
  if (r != 0) return FiStatus("fi_getname", r);
  name_.resize(len);
  address_ = HexEncode(name_);
  if (is_shm) {
    FARMEM_RETURN_IF_ERROR(OpenKeyTable());
    address_ += "." + std::to_string(getpid()) + "." + std::to_string(table_fd_) + "." +
                std::to_string(table_id_);
  }
  FARMEM_LOG_DEBUG("fabric: provider {} domain {} mr_mode {} address {}",
                   info_->fabric_attr->prov_name, info_->domain_attr->name, MrPlanString(plan_),
                   NameToSource(info_, name_));
  return Status::OK();
}

Status Core::OpenKeyTable() {
  table_fd_ = memfd_create("farmem-fabric-keys", MFD_CLOEXEC);
  if (table_fd_ < 0) return Status::FromErrno("memfd_create(key table)", errno);
  const size_t bytes = kKeyTableSlots * sizeof(uint64_t);
  if (ftruncate(table_fd_, static_cast<off_t>(bytes)) != 0) {
    return Status::FromErrno("ftruncate(key table)", errno);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, table_fd_, 0);
  if (p == MAP_FAILED) return Status::FromErrno("mmap(key table)", errno);
  table_ = static_cast<std::atomic<uint64_t>*>(p);
  static_assert(sizeof(std::atomic<uint64_t>) == sizeof(uint64_t));
  static_assert(std::atomic<uint64_t>::is_always_lock_free);
  do {
    table_id_ = rng_();
  } while (table_id_ == 0);
  table_[0].store(table_id_, std::memory_order_release);
  table_free_.reserve(kKeyTableSlots - 1);
  for (size_t i = kKeyTableSlots - 1; i >= kFirstKeySlot; --i) {
    table_free_.push_back(static_cast<uint32_t>(i));
  }
  return Status::OK();
}

Status Core::PostMainRecv(RecvBuf* rb) {
  void* desc = rb->mr ? fi_mr_desc(rb->mr) : nullptr;
  const ssize_t r =
      fi_recv(ep_, rb->data.get(), rb->capacity, desc, FI_ADDR_UNSPEC, static_cast<FiCtx*>(rb));
  if (r == -FI_EAGAIN) {
    repost_.push_back(rb);
    return Status::OK();
  }
  if (r != 0) return FiStatus("fi_recv(main)", r);
  return Status::OK();
}

Status Core::StartServing() {
  for (size_t i = 0; i < kMainRecvBuffers; ++i) {
    auto rb = std::make_unique<RecvBuf>();
    rb->kind = Kind::kRecv;
    rb->capacity = recv_capacity();
    rb->data.reset(new std::byte[rb->capacity]);
    if (need_local_desc()) {
      FARMEM_ASSIGN_OR_RETURN(rb->mr, RegisterLocal(rb->data.get(), rb->capacity, ep_));
    }
    FARMEM_RETURN_IF_ERROR(PostMainRecv(rb.get()));
    recv_bufs_.push_back(std::move(rb));
  }
  return Status::OK();
}

Result<fid_mr*> Core::RegisterLocal(const void* addr, size_t len, fid_ep* ep) {
  fid_mr* mr = nullptr;
  int r =
      fi_mr_reg(domain_, addr, len, FI_SEND | FI_RECV | FI_READ | FI_WRITE, 0, 0, 0, &mr, nullptr);
  if (r == -FI_ENOKEY || (r != 0 && !plan_.prov_key)) {
    // Providers that want requested keys need them unique even for local-only MRs.
    for (unsigned attempt = 0; attempt < 8 && r != 0; ++attempt) {
      uint64_t k;
      {
        std::lock_guard lock(reg_mu_);
        k = RequestedKey(plan_, rng_(), attempt);
      }
      r = fi_mr_reg(domain_, addr, len, FI_SEND | FI_RECV | FI_READ | FI_WRITE, 0, k, 0, &mr,
                    nullptr);
    }
  }
  if (r != 0) return FiStatus("fi_mr_reg(local buffer)", r);
  if (plan_.endpoint_bind) {
    r = fi_mr_bind(mr, &ep->fid, 0);
    if (r == 0) r = fi_mr_enable(mr);
    if (r != 0) {
      CloseFid(&mr->fid);
      return FiStatus("fi_mr_bind/enable(local buffer)", r);
    }
  }
  return mr;
}

Result<MemoryRegion> Core::Register(void* addr, size_t len, Access access) {
  if (addr == nullptr || len == 0) {
    return Status::InvalidArgument("register_memory needs a non-null address and length > 0");
  }
  if (access != Access::kReadWrite && access != Access::kReadOnly) {
    return Status::InvalidArgument("register_memory: unknown access mode " +
                                   std::to_string(static_cast<int>(access)));
  }
  if (stopped()) return Status::Unavailable("fabric transport stopped");
  std::lock_guard lock(reg_mu_);
  RegionKey key;
  do {
    key = rng_();
  } while (key == 0 || regions_.count(key) != 0);
  Region region;
  region.addr = addr;
  region.length = len;
  region.access = access;
  if (table_ != nullptr) {
    if (table_free_.empty()) {
      return Status::ResourceExhausted("too many registered regions (key table full)");
    }
    region.slot = table_free_.back();
  }
  // Read-only regions: remote read access only, so providers that check MR access at the target
  // (tcp, and shm for atomics) refuse writes too; the initiator check in Issue() is what callers
  // normally hit (docs/fabric.md "Read-only regions").
  const uint64_t mr_access = access == Access::kReadOnly
                                 ? uint64_t{FI_REMOTE_READ}
                                 : uint64_t{FI_REMOTE_READ | FI_REMOTE_WRITE | FI_READ | FI_WRITE};
  int r = -FI_ENOKEY;
  for (unsigned attempt = 0; attempt < 8 && r == -FI_ENOKEY; ++attempt) {
    r = fi_mr_reg(domain_, addr, len, mr_access, 0, RequestedKey(plan_, key, attempt), 0,
                  &region.mr, nullptr);
  }
  if (r != 0) return FiStatus("fi_mr_reg", r);
  if (plan_.endpoint_bind) {
    r = fi_mr_bind(region.mr, &ep_->fid, 0);
    if (r == 0) r = fi_mr_enable(region.mr);
    if (r != 0) {
      CloseFid(&region.mr->fid);
      return FiStatus("fi_mr_bind/enable", r);
    }
  }
  region.prov_key = fi_mr_key(region.mr);
  if (region.prov_key == FI_KEY_NOTAVAIL) {
    CloseFid(&region.mr->fid);
    return Status::Unavailable("provider returned FI_KEY_NOTAVAIL (FI_MR_RAW keys unsupported)");
  }
  if (table_ != nullptr) {
    table_free_.pop_back();
    table_[region.slot].store(key, std::memory_order_release);
  }
  regions_.emplace(key, region);
  return MemoryRegion{key, addr, len, access};
}

Status Core::Deregister(RegionKey key) {
  std::lock_guard lock(reg_mu_);
  auto it = regions_.find(key);
  if (it == regions_.end()) return Status::NotFound("region key not registered");
  if (table_ != nullptr) {
    // Peers check the slot before every op on a cached key; clearing it first makes any later
    // access fail with kNotFound even though shm reads never reach this process.
    table_[it->second.slot].store(0, std::memory_order_release);
    table_free_.push_back(it->second.slot);
  }
  CloseFid(&it->second.mr->fid);
  regions_.erase(it);
  return Status::OK();
}

// Address format: hex(endpoint name), optionally followed by ".<pid>.<fd>.<table id>" naming the
// peer's key table (shm), whose doorbell we ring for operations that need its progress thread.
Result<PeerId> Core::AddPeer(std::string_view address) {
  std::string_view hex = address;
  std::string_view suffix;
  if (const size_t dot = address.find('.'); dot != std::string_view::npos) {
    hex = address.substr(0, dot);
    suffix = address.substr(dot + 1);
  }
  FARMEM_ASSIGN_OR_RETURN(auto bytes, HexDecode(hex));
  uint64_t nums[3] = {0, 0, 0};  // pid, fd, table id
  if (!suffix.empty()) {
    const char* p = suffix.data();
    const char* end = suffix.data() + suffix.size();
    for (int i = 0; i < 3; ++i) {
      if (i > 0) {
        if (p == end || *p != '.') return Status::InvalidArgument("malformed fabric address");
        ++p;
      }
      auto [next, ec] = std::from_chars(p, end, nums[i]);
      if (ec != std::errc() || next == p) {
        return Status::InvalidArgument("malformed fabric address");
      }
      p = next;
    }
    if (p != end || nums[0] == 0 || nums[0] > INT32_MAX || nums[1] > INT32_MAX) {
      return Status::InvalidArgument("malformed fabric address");
    }
  }
  std::string norm = HexEncode(bytes);
  if (!suffix.empty()) norm += "." + std::string(suffix);
  std::lock_guard lock(peer_mu_);
  auto it = peer_ids_.find(norm);
  if (it != peer_ids_.end()) return it->second;
  PeerRec rec;
  rec.name = AvName(info_, bytes);
  if (!suffix.empty()) {
    const Mapping* table =
        RemoteTable(static_cast<int32_t>(nums[0]), static_cast<int32_t>(nums[1]), nums[2]);
    // Without the table the peer is still reachable; it just wakes on its own timer (and its
    // death is noticed only by timeouts).
    if (table != nullptr) {
      rec.doorbell = DoorbellOf(table->base);
      rec.pidfd = table->pidfd;
    }
  }
  const PeerId id = static_cast<PeerId>(peers_.size());
  peers_.push_back(std::move(rec));
  peer_ids_.emplace(std::move(norm), id);
  return id;
}

Core::PeerRec Core::GetPeer(PeerId peer) {
  std::lock_guard lock(peer_mu_);
  if (peer >= peers_.size()) return {};
  return peers_[peer];
}

const Core::Mapping* Core::RemoteTable(int32_t pid, int32_t fd, uint64_t id) {
  std::lock_guard lock(remote_mu_);
  auto key = std::make_tuple(pid, fd, id);
  auto it = remote_tables_.find(key);
  if (it != remote_tables_.end()) return &it->second;
  // The pidfd is opened before the table: if the table then carries the peer's id, both name
  // the same process (a reused pid would not hold a memfd with that id).
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  // Read-write: peers ring the doorbell word; key slots are only ever read by them.
  const int f = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f < 0) {
    FARMEM_LOG_WARN("fabric: cannot open peer key table {}: {}", path, strerror(errno));
    if (pidfd >= 0) close(pidfd);
    return nullptr;
  }
  const size_t bytes = kKeyTableSlots * sizeof(uint64_t);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  close(f);
  if (p == MAP_FAILED) {
    FARMEM_LOG_WARN("fabric: cannot map peer key table {}: {}", path, strerror(errno));
    if (pidfd >= 0) close(pidfd);
    return nullptr;
  }
  auto* table = static_cast<std::atomic<uint64_t>*>(p);
  if (table[0].load(std::memory_order_acquire) != id) {
    // The fd number was reused by something else (peer restarted): not its table.
    munmap(p, bytes);
    if (pidfd >= 0) close(pidfd);
    return nullptr;
  }
  return &remote_tables_.emplace(key, Mapping{p, bytes, pidfd}).first->second;
}

SendBuf* Core::TakeSendBuf() {
  if (!send_free_.empty()) {
    SendBuf* sb = send_free_.back();
    send_free_.pop_back();
    return sb;
  }
  auto sb = std::make_unique<SendBuf>();
  sb->kind = Kind::kSend;
  send_all_.push_back(std::move(sb));
  return send_all_.back().get();
}

void Core::ReleaseSendBuf(SendBuf* sb) {
  if (sb->mr != nullptr) {
    CloseFid(&sb->mr->fid);
    sb->mr = nullptr;
  }
  // Keep small buffers for reuse; give large ones back so one big reply does not pin memory.
  if (sb->data.capacity() > (64u << 10)) std::vector<std::byte>().swap(sb->data);
  send_free_.push_back(sb);
}

Status Core::SendMain(fi_addr_t dest, MsgType type, uint32_t imm, uint64_t seq,
                      uint32_t status_code, std::span<const std::byte> payload) {
  std::lock_guard lock(send_mu_);
  if (main_closed_ || stopped()) return Status::Unavailable("fabric transport stopped");
  SendBuf* sb = TakeSendBuf();
  BuildMessage(sb->data, type, imm, seq, status_code, {}, payload);
  sb->dest = dest;
  if (need_local_desc()) {
    auto mr = RegisterLocal(sb->data.data(), sb->data.size(), ep_);
    if (!mr.ok()) {
      ReleaseSendBuf(sb);
      return mr.status();
    }
    sb->mr = *mr;
  }
  auto it = send_queues_.find(dest);
  if (it == send_queues_.end()) {
    const ssize_t r = fi_send(ep_, sb->data.data(), sb->data.size(),
                              sb->mr ? fi_mr_desc(sb->mr) : nullptr, dest, static_cast<FiCtx*>(sb));
    if (r == 0) return Status::OK();
    if (r != -FI_EAGAIN) {
      ReleaseSendBuf(sb);
      return FiStatus("fi_send(reply)", r);
    }
    const auto now = Clock::now();
    it = send_queues_.try_emplace(dest).first;
    it->second.blocked_since = now;
    it->second.next_try = now;
  }
  // The requester gives up after its op_timeout; a reply the provider has not taken by then
  // (peer gone) is useless, and dropping it stops ofi_rxm's reconnect attempts.
  sb->expires = Clock::now() + config_.op_timeout;
  it->second.bufs.push_back(sb);
  Wake();
  return Status::OK();
}

Clock::time_point Core::DrainSendQueues() {
  std::lock_guard lock(send_mu_);
  auto next = Clock::time_point::max();
  if (main_closed_) return next;
  const auto now = Clock::now();
  for (auto it = send_queues_.begin(); it != send_queues_.end();) {
    DestQueue& q = it->second;
    size_t expired = 0;
    while (!q.bufs.empty() && q.bufs.front()->expires <= now) {
      ReleaseSendBuf(q.bufs.front());
      q.bufs.pop_front();
      ++expired;
    }
    if (expired != 0) {
      FARMEM_LOG_WARN(
          "fabric: dropped {} message(s) to a requester the provider could not reach for {} ms",
          expired, config_.op_timeout.count());
    }
    if (!q.bufs.empty() && q.next_try <= now) {
      while (!q.bufs.empty()) {
        SendBuf* sb = q.bufs.front();
        const ssize_t r =
            fi_send(ep_, sb->data.data(), sb->data.size(), sb->mr ? fi_mr_desc(sb->mr) : nullptr,
                    sb->dest, static_cast<FiCtx*>(sb));
        if (r == -FI_EAGAIN) break;
        q.bufs.pop_front();
        q.blocked_since = now;
        if (r != 0) {
          FARMEM_LOG_WARN("fabric: dropping reply: {}", fi_strerror(static_cast<int>(-r)));
          ReleaseSendBuf(sb);
        }
      }
      if (!q.bufs.empty()) q.next_try = NextRetry(q.blocked_since, now);
    }
    if (q.bufs.empty()) {
      it = send_queues_.erase(it);
      continue;
    }
    next = std::min(next, q.next_try);
    ++it;
  }
  return next;
}

Result<fi_addr_t> Core::ResolveMainAddr(std::span<const std::byte> name) {
  std::string key(reinterpret_cast<const char*>(name.data()), name.size());
  auto it = main_addrs_.find(key);
  if (it != main_addrs_.end()) return it->second;
  const std::vector<std::byte> av_name = AvName(info_, name);
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  const int n = fi_av_insert(av_, av_name.data(), 1, &addr, 0, nullptr);
  if (n != 1) return FiStatus("fi_av_insert(requester)", n < 0 ? n : -FI_EINVAL);
  main_addrs_.emplace(std::move(key), addr);
  return addr;
}

void Core::HandleMainMessage(std::span<const std::byte> bytes) {
  auto parsed = ParseMessage(bytes, std::max<uint32_t>(config_.max_rpc_bytes, 4096));
  if (!parsed.ok()) {
    FARMEM_LOG_WARN("fabric: dropping malformed message: {}", parsed.status().ToString());
    return;
  }
  const ParsedMsg& m = *parsed;
  const auto type = static_cast<MsgType>(m.header.type);
  if (type != MsgType::kRpcRequest && type != MsgType::kLookupRequest) {
    FARMEM_LOG_WARN("fabric: unexpected message type {} on the main endpoint", m.header.type);
    return;
  }
  if (m.name.empty()) {
    FARMEM_LOG_WARN("fabric: request without a reply address dropped");
    return;
  }
  auto dest = ResolveMainAddr(m.name);
  if (!dest.ok()) {
    FARMEM_LOG_WARN("fabric: cannot reach requester: {}", dest.status().ToString());
    return;
  }
  if (type == MsgType::kLookupRequest) {
    LookupReply reply{};
    Status st;
    if (m.payload.size() != sizeof(LookupRequest)) {
      st = Status::Protocol("malformed key lookup");
    } else {
      LookupRequest req;
      std::memcpy(&req, m.payload.data(), sizeof(req));
      std::lock_guard lock(reg_mu_);
      auto it = regions_.find(req.key);
      if (it == regions_.end()) {
        st = Status::NotFound("region key not registered at the peer");
      } else {
        reply.key = req.key;
        reply.remote_base = plan_.virt_addr ? reinterpret_cast<uint64_t>(it->second.addr) : 0;
        reply.length = it->second.length;
        reply.prov_key = it->second.prov_key;
        reply.flags = it->second.access == Access::kReadOnly ? kLookupReadOnly : 0;
        if (table_ != nullptr) {
          reply.table_id = table_id_;
          reply.table_pid = getpid();
          reply.table_fd = table_fd_;
          reply.table_slot = it->second.slot;
        }
      }
    }
    Status sent;
    if (st.ok()) {
      sent = SendMain(*dest, MsgType::kLookupReply, 0, m.header.seq, 0,
                      std::as_bytes(std::span(&reply, 1)));
    } else {
      const std::string_view msg = st.message();
      sent =
          SendMain(*dest, MsgType::kLookupReply, 0, m.header.seq, static_cast<uint32_t>(st.code()),
                   std::as_bytes(std::span(msg.data(), msg.size())));
    }
    if (!sent.ok()) FARMEM_LOG_WARN("fabric: lookup reply failed: {}", sent.ToString());
    return;
  }
  auto rpc = std::make_unique<FabricIncomingRpc>(
      shared_from_this(), *dest, m.header.seq, m.header.imm,
      std::vector<std::byte>(m.payload.begin(), m.payload.end()), NameToSource(info_, m.name));
  if (!handler_) {
    (void)rpc->reply_error(Status::Unavailable("no RPC handler installed"));
    return;
  }
  if (m.payload.size() > config_.max_rpc_bytes) {
    (void)rpc->reply_error(Status::InvalidArgument("RPC request exceeds max_rpc_bytes"));
    return;
  }
  handler_(std::move(rpc));
}

void Core::HandleMainCompletion(FiCtx* ctx, size_t len, const Status& error) {
  if (ctx == nullptr) return;
  if (ctx->kind == Kind::kSend) {
    auto* sb = static_cast<SendBuf*>(ctx);
    if (!error.ok()) FARMEM_LOG_DEBUG("fabric: reply send failed: {}", error.ToString());
    std::lock_guard lock(send_mu_);
    ReleaseSendBuf(sb);
    return;
  }
  if (ctx->kind == Kind::kRecv) {
    auto* rb = static_cast<RecvBuf*>(ctx);
    if (error.ok()) {
      HandleMainMessage(std::span<const std::byte>(rb->data.get(), std::min(len, rb->capacity)));
    } else if (error.code() != Code::kAborted) {
      FARMEM_LOG_DEBUG("fabric: receive failed: {}", error.ToString());
    }
    if (!stopped()) {
      Status st = PostMainRecv(rb);
      if (!st.ok()) FARMEM_LOG_WARN("fabric: {}", st.ToString());
    }
  }
}

void Core::Wake() {
  if (table_ != nullptr) {
    RingDoorbell(DoorbellOf(table_));
  } else if (wait_cq_) {
    fi_cq_signal(cq_);
  } else {
    wake_cv_.notify_one();
  }
}

void Core::ProgressLoop(std::atomic<bool>& stop) {
  // Short sleeps must not be rounded up by the default 50 us timer slack.
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  std::atomic<uint32_t>* db = table_ ? DoorbellOf(table_) : nullptr;
  uint32_t seen = db ? db[0].load(std::memory_order_acquire) : 0;
  fi_cq_msg_entry entries[kCqBatch];
  auto last_busy = Clock::now();
  const auto spin = config_.spin_before_sleep;
  bool armed = false;  // doorbell "asleep" flag published; one more pass before sleeping
  bool block = false;  // next CQ read may block (CQ with a wait object)
  while (!stop.load(std::memory_order_acquire)) {
    const ssize_t n = block ? fi_cq_sread(cq_, entries, kCqBatch, nullptr, kIdleWaitMs)
                            : fi_cq_read(cq_, entries, kCqBatch);
    block = false;
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        HandleMainCompletion(static_cast<FiCtx*>(entries[i].op_context), entries[i].len,
                             Status::OK());
      }
      last_busy = Clock::now();
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) > 0) {
        char buf[256] = {};
        const char* text = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof(buf));
        HandleMainCompletion(static_cast<FiCtx*>(err.op_context), 0,
                             Status(CodeForFiError(err.err), std::string(fi_strerror(err.err)) +
                                                                 " (" + (text ? text : "") + ")"));
      }
      last_busy = Clock::now();
      continue;
    }
    if (n != -FI_EAGAIN && n != -FI_ETIMEDOUT) {
      FARMEM_LOG_WARN("fabric: fi_cq_read: {}", fi_strerror(int(-n)));
    }
    bool queued;
    {
      std::lock_guard lock(send_mu_);
      queued = !send_queues_.empty();
    }
    // Stay awake only while a queued send is due soon; a backed-off destination (peer gone)
    // is retried after the usual idle wait, which is shorter than kMaxRetryBackoff anyway.
    if (queued) queued = DrainSendQueues() <= Clock::now() + kSendRetrySpin;
    if (!repost_.empty()) {
      std::vector<RecvBuf*> again;
      again.swap(repost_);
      for (RecvBuf* rb : again) (void)PostMainRecv(rb);
    }
    if (db != nullptr) {
      const uint32_t now_seen = db[0].load(std::memory_order_seq_cst);
      if (now_seen != seen) {  // a peer posted work for us: stay awake
        seen = now_seen;
        last_busy = Clock::now();
      }
    }
    if (queued || Clock::now() - last_busy < spin) {
      if (armed) {
        db[1].store(0, std::memory_order_relaxed);
        armed = false;
      }
      // On an oversubscribed machine the initiator may share our core: let it run.
      sched_yield();
      continue;
    }
    if (db != nullptr) {
      if (!armed) {
        db[1].store(1, std::memory_order_seq_cst);
        armed = true;
        continue;  // progress once more, then re-read the counter, then sleep
      }
      timespec ts{0, kIdleWaitMs * 1000000L};
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&db[0]), FUTEX_WAIT, seen, &ts, nullptr, 0);
      db[1].store(0, std::memory_order_relaxed);
      armed = false;
    } else if (wait_cq_) {
      block = true;  // fi_cq_sread waits on the provider's fds and progresses on wake-up
    } else {
      std::unique_lock lock(wake_mu_);
      wake_cv_.wait_for(lock, kIdleSleep);
    }
  }
  if (armed) db[1].store(0, std::memory_order_relaxed);
}

void Core::Shutdown() {
  stopped_.store(true, std::memory_order_release);
  // Peers' cached keys now fail with kUnavailable (table id gone) rather than kNotFound.
  if (table_ != nullptr) table_[0].store(0, std::memory_order_release);
  {
    std::lock_guard lock(reg_mu_);
    for (auto& [key, region] : regions_) {
      if (table_ != nullptr) table_[region.slot].store(0, std::memory_order_release);
      CloseFid(&region.mr->fid);
    }
    regions_.clear();
  }
  std::lock_guard lock(send_mu_);
  if (main_closed_) return;
  main_closed_ = true;
  // Closing the endpoint cancels posted receives/sends; their buffers are freed after it.
  Grave grave;
  if (ep_) grave.fids.push_back(&ep_->fid);
  for (auto& rb : recv_bufs_) {
    if (rb->mr != nullptr) grave.fids.push_back(&rb->mr->fid);
  }
  for (auto& sb : send_all_) {
    if (sb->mr != nullptr) grave.fids.push_back(&sb->mr->fid);
  }
  if (cq_) grave.fids.push_back(&cq_->fid);
  if (av_) grave.fids.push_back(&av_->fid);
  ep_ = nullptr;
  cq_ = nullptr;
  av_ = nullptr;
  grave.keep.push_back(Keep(std::move(recv_bufs_)));
  grave.keep.push_back(Keep(std::move(send_all_)));
  recv_bufs_.clear();
  send_all_.clear();
  send_queues_.clear();
  send_free_.clear();
  grave.owner = weak_from_this().lock();
  if (grave.owner) {
    Retire(std::move(grave));
  } else {  // from ~Core: nothing can reach this endpoint any more
    for (fid_t f : grave.fids) CloseFid(f);
  }
}

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
  size_t poll(std::span<Completion> out) override;
  size_t outstanding() const override { return outstanding_; }

  ContextStats stats() const { return stats_; }

 private:
  Result<fi_addr_t> PeerAddr(PeerId peer);
  void ResetPeer(PeerId peer, fi_addr_t addr);
  void AfterPost(const Op* op);
  Result<Op*> NewOp(OpType type, PeerId peer, uint64_t wr_id);
  Status PostOneSided(Op* op);
  void EnqueueForKey(Op* op);
  void Issue(Op* op, KeyEntry* e);
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

  struct PeerSlot {
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    std::atomic<uint32_t>* doorbell = nullptr;
    int pidfd = -1;       // same-host peers: the peer process (owned by Core)
    bool exited = false;  // its process has exited (sticky: a new process is a new peer)
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
  std::vector<std::unique_ptr<RecvBuf>> recv_bufs_;
  std::vector<RecvBuf*> repost_;
  std::vector<std::pair<PeerKey, Clock::time_point>> delayed_lookups_;
  ContextStats stats_;
};

FabricContext::~FabricContext() {
  // The endpoint is closed first (after the grace period) so the provider stops touching op
  // slots and buffers, which stay alive until then.
  Grave grave;
  if (ep_) grave.fids.push_back(&ep_->fid);
  for (auto& chunk : chunks_) {
    for (size_t i = 0; i < kOpChunk; ++i) {
      if (chunk[i].local_mr != nullptr) grave.fids.push_back(&chunk[i].local_mr->fid);
    }
  }
  for (fid_mr* mr : chunk_mrs_) grave.fids.push_back(&mr->fid);
  for (auto& rb : recv_bufs_) {
    if (rb->mr != nullptr) grave.fids.push_back(&rb->mr->fid);
  }
  if (cq_) grave.fids.push_back(&cq_->fid);
  if (av_) grave.fids.push_back(&av_->fid);
  grave.keep.push_back(Keep(std::move(chunks_)));
  grave.keep.push_back(Keep(std::move(recv_bufs_)));
  grave.owner = core_;
  if (info_ != nullptr) fi_freeinfo(info_);
  Retire(std::move(grave));
  DropLiveUser();
}

Status FabricContext::Open() {
  local_desc_ = core_->need_local_desc();
  info_ = fi_dupinfo(core_->info());
  if (info_ == nullptr) return Status::ResourceExhausted("fi_dupinfo failed");
  // Contexts get their own ephemeral address; only the main endpoint uses listen_port.
  if (info_->src_addr != nullptr) {
    if (info_->addr_format == FI_SOCKADDR_IN && info_->src_addrlen >= sizeof(sockaddr_in)) {
      static_cast<sockaddr_in*>(info_->src_addr)->sin_port = 0;
    } else if (info_->addr_format == FI_SOCKADDR_IN6 &&
               info_->src_addrlen >= sizeof(sockaddr_in6)) {
      static_cast<sockaddr_in6*>(info_->src_addr)->sin6_port = 0;
    }
    // Other formats (shm's FI_ADDR_STR) keep the provider's name: shm appends a per-endpoint
    // index itself and rejects endpoints without a source name.
  }
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_MSG;
  cq_attr.wait_obj = FI_WAIT_NONE;
  int r = fi_cq_open(core_->domain(), &cq_attr, &cq_, nullptr);
  if (r != 0) return FiStatus("fi_cq_open(context)", r);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_UNSPEC;
  r = fi_av_open(core_->domain(), &av_attr, &av_, nullptr);
  if (r != 0) return FiStatus("fi_av_open(context)", r);
  r = fi_endpoint(core_->domain(), info_, &ep_, nullptr);
  if (r != 0) return FiStatus("fi_endpoint(context)", r);
  r = fi_ep_bind(ep_, &av_->fid, 0);
  if (r != 0) return FiStatus("fi_ep_bind(context av)", r);
  r = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
  if (r != 0) return FiStatus("fi_ep_bind(context cq)", r);
  r = fi_enable(ep_);
  if (r != 0) return FiStatus("fi_enable(context)", r);
  size_t len = kMaxEndpointName;
  name_.resize(len);
  r = fi_getname(&ep_->fid, name_.data(), &len);
  if (r != 0) return FiStatus("fi_getname(context)", r);
  name_.resize(len);
  for (size_t i = 0; i < kContextRecvBuffers; ++i) {
    auto rb = std::make_unique<RecvBuf>();
    rb->kind = Kind::kRecv;
    rb->capacity = sizeof(WireHeader) + std::max<size_t>(core_->config().max_rpc_bytes, 4096);
    rb->data.reset(new std::byte[rb->capacity]);
    if (local_desc_) {
      FARMEM_ASSIGN_OR_RETURN(rb->mr, core_->RegisterLocal(rb->data.get(), rb->capacity, ep_));
    }
    FARMEM_RETURN_IF_ERROR(PostRecv(rb.get()));
    recv_bufs_.push_back(std::move(rb));
  }
  ready_.reserve(64);
  return Status::OK();
}

Status FabricContext::PostRecv(RecvBuf* rb) {
  const ssize_t r =
      fi_recv(ep_, rb->data.get(), rb->capacity, rb->mr ? fi_mr_desc(rb->mr) : nullptr,
              FI_ADDR_UNSPEC, static_cast<FiCtx*>(rb));
  if (r == -FI_EAGAIN) {
    repost_.push_back(rb);
    return Status::OK();
  }
  if (r != 0) return FiStatus("fi_recv(context)", r);
  return Status::OK();
}

Result<fi_addr_t> FabricContext::PeerAddr(PeerId peer) {
  if (peer < peers_.size() && peers_[peer].addr != FI_ADDR_NOTAVAIL) return peers_[peer].addr;
  Core::PeerRec rec = core_->GetPeer(peer);
  const std::vector<std::byte>& name = rec.name;
  if (name.empty()) {
    return Status::NotFound("unknown peer id " + std::to_string(peer) + " (add_peer it first)");
  }
  fi_addr_t addr = FI_ADDR_NOTAVAIL;
  const int n = fi_av_insert(av_, name.data(), 1, &addr, 0, nullptr);
  if (n != 1) return FiStatus("fi_av_insert(peer)", n < 0 ? n : -FI_EINVAL);
  if (peers_.size() <= peer) peers_.resize(peer + 1);
  peers_[peer].addr = addr;
  peers_[peer].doorbell = rec.doorbell;
  peers_[peer].pidfd = rec.pidfd;
  return addr;
}

bool FabricContext::PeerExited(PeerId peer, bool now_or_never) {
  if (peer >= peers_.size()) return false;
  PeerSlot& slot = peers_[peer];
  if (slot.pidfd < 0 || slot.exited) return slot.exited;
  const auto now = Clock::now();
  if (!now_or_never && now - slot.liveness_checked < kPeerLivenessInterval) return false;
  slot.liveness_checked = now;
  // A pidfd polls readable once the process has exited (a zombie counts: it runs no more code
  // and will never release a lock it held).
  pollfd pfd{slot.pidfd, POLLIN, 0};
  if (::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
    slot.exited = true;
    FARMEM_LOG_DEBUG("fabric: peer {} process exited; its operations fail from now on", peer);
  }
  return slot.exited;
}

void FabricContext::ResetPeer(PeerId peer, fi_addr_t addr) {
  if (peer >= peers_.size() || peers_[peer].addr != addr || addr == FI_ADDR_NOTAVAIL) return;
  fi_addr_t a = addr;
  const int r = fi_av_remove(av_, &a, 1, 0);
  if (r != 0) FARMEM_LOG_DEBUG("fabric: fi_av_remove: {}", fi_strerror(-r));
  peers_[peer].addr = FI_ADDR_NOTAVAIL;
}

void FabricContext::AfterPost(const Op* op) {
  // Reads and writes are one-sided on shm (CMA); atomics and messages wait for the target.
  if (op->type == OpType::kRead || op->type == OpType::kWrite) return;
  if (op->peer < peers_.size() && peers_[op->peer].doorbell != nullptr) {
    RingDoorbell(peers_[op->peer].doorbell);
  }
}

Result<Op*> FabricContext::NewOp(OpType type, PeerId peer, uint64_t wr_id) {
  if (core_->stopped()) return Status::Unavailable("fabric transport stopped");
  FARMEM_ASSIGN_OR_RETURN(fi_addr_t dest, PeerAddr(peer));
  if (free_ops_.empty()) {
    auto chunk = std::make_unique<Op[]>(kOpChunk);
    const uint32_t base = static_cast<uint32_t>(chunks_.size() * kOpChunk);
    if (local_desc_) {
      // Atomic operand/compare/result words live in the op slots: one MR per chunk covers them.
      FARMEM_ASSIGN_OR_RETURN(fid_mr * mr,
                              core_->RegisterLocal(chunk.get(), sizeof(Op) * kOpChunk, ep_));
      chunk_mrs_.push_back(mr);
    }
    for (size_t i = kOpChunk; i-- > 0;) {
      chunk[i].index = base + static_cast<uint32_t>(i);
      free_ops_.push_back(&chunk[i]);
    }
    chunks_.push_back(std::move(chunk));
  }
  Op* op = free_ops_.back();
  free_ops_.pop_back();
  op->gen++;
  op->free = false;
  op->user_done = false;
  op->internal = false;
  op->refs = 0;
  op->type = type;
  op->peer = peer;
  op->dest = dest;
  op->wr_id = wr_id;
  op->deadline = Clock::now() + core_->config().op_timeout;
  op->prior_error = Status::OK();
  op->local_mr = nullptr;
  op->wait_next = nullptr;
  // Append to the in-flight list: deadlines are non-decreasing along it.
  op->next = nullptr;
  op->prev = tail_;
  if (tail_) {
    tail_->next = op;
  } else {
    head_ = op;
  }
  tail_ = op;
  return op;
}

void FabricContext::Release(Op* op) {
  if (op->local_mr != nullptr) {
    CloseFid(&op->local_mr->fid);
    op->local_mr = nullptr;
  }
  if (op->msg.capacity() > (64u << 10)) std::vector<std::byte>().swap(op->msg);
  op->prior_error = Status::OK();
  op->free = true;
  free_ops_.push_back(op);
}

void FabricContext::Unref(Op* op) {
  if (op->refs > 0) op->refs--;
  if (op->user_done && op->refs == 0 && !op->free) Release(op);
}

void FabricContext::Finish(Op* op, Status status) {
  if (op->user_done) return;
  op->user_done = true;
  if (op->prev) {
    op->prev->next = op->next;
  } else {
    head_ = op->next;
  }
  if (op->next) {
    op->next->prev = op->prev;
  } else {
    tail_ = op->prev;
  }
  op->prev = op->next = nullptr;
  if (!op->internal) {
    Completion c;
    c.wr_id = op->wr_id;
    c.op = op->type;
    c.status = std::move(status);
    if (op->type == OpType::kRpc && c.status.ok()) {
      c.reply_imm = op->reply_imm;
      c.reply_length = op->reply_length;
    }
    ready_.push_back(std::move(c));
  }
  if (op->refs == 0) Release(op);
}

Status FabricContext::PostOneSided(Op* op) {
  outstanding_++;
  EnqueueForKey(op);
  return Status::OK();
}

void FabricContext::EnqueueForKey(Op* op) {
  const PeerKey pk{op->peer, op->key};
  KeyEntry* e;
  if (last_entry_ != nullptr && last_pk_ == pk) {
    e = last_entry_;
  } else {
    auto [it, inserted] = cache_.try_emplace(pk);
    e = &it->second;
    last_pk_ = pk;
    last_entry_ = e;
  }
  if (e->ready) {
    stats_.cache_hits++;
    Issue(op, e);
    return;
  }
  op->wait_next = nullptr;
  op->refs++;
  if (e->waiters_tail) {
    e->waiters_tail->wait_next = op;
  } else {
    e->waiters = op;
  }
  e->waiters_tail = op;
  if (e->lookup == nullptr) SendLookup(pk, e);
}

void FabricContext::EraseEntry(const PeerKey& pk) {
  if (last_pk_ == pk) last_entry_ = nullptr;
  cache_.erase(pk);
}

void FabricContext::Issue(Op* op, KeyEntry* e) {
  if (e->valid != nullptr && e->valid->load(std::memory_order_acquire) != op->key) {
    const bool stopped = e->table_head->load(std::memory_order_acquire) != e->table_id;
    EraseEntry(PeerKey{op->peer, op->key});
    Finish(op, stopped ? Status::Unavailable("peer transport stopped")
                       : Status::NotFound("region key was deregistered at the peer"));
    return;
  }
  if (e->read_only && op->type != OpType::kRead && !core_->skip_access_check()) {
    // Refused here rather than left to the provider: shm's CMA fast path writes into the target
    // with no MR check at all, and tcp;ofi_rxm answers a refused write by closing the connection.
    Finish(op, Status::PermissionDenied(std::string(OpTypeName(op->type)) +
                                        " refused: the peer registered this region read-only"));
    return;
  }
  const uint64_t len = (op->type == OpType::kRead || op->type == OpType::kWrite) ? op->len : 8;
  if (!InBounds(op->offset, len, e->length)) {
    Finish(op, Status::OutOfRange("access [" + std::to_string(op->offset) + ", +" +
                                  std::to_string(len) + ") outside region of " +
                                  std::to_string(e->length) + " bytes"));
    return;
  }
  // The peer's address may have been replaced after a connection error since the op was posted.
  auto dest = PeerAddr(op->peer);
  if (!dest.ok()) {
    Finish(op, dest.status());
    return;
  }
  op->dest = *dest;
  op->raddr = e->base + op->offset;
  op->rkey = e->prov_key;
  if ((op->type == OpType::kCompareSwap || op->type == OpType::kFetchAdd) && op->raddr % 8 != 0) {
    Finish(op, Status::InvalidArgument("atomic target address is not 8-byte aligned"));
    return;
  }
  if (len == 0) {
    Finish(op, Status::OK());
    return;
  }
  Submit(op);
}

ssize_t FabricContext::CallProvider(Op* op) {
  void* desc = nullptr;
  if (local_desc_) {
    if (op->type == OpType::kRead || op->type == OpType::kWrite) {
      if (op->local_mr == nullptr) {
        // FI_MR_LOCAL: user buffers are registered per operation (see docs/fabric.md).
        auto mr = core_->RegisterLocal(op->local, op->len, ep_);
        if (!mr.ok()) return -FI_ENOMEM;
        op->local_mr = *mr;
      }
      desc = fi_mr_desc(op->local_mr);
    } else if (op->type == OpType::kRpc) {
      if (op->local_mr == nullptr) {
        auto mr = core_->RegisterLocal(op->msg.data(), op->msg.size(), ep_);
        if (!mr.ok()) return -FI_ENOMEM;
        op->local_mr = *mr;
      }
      desc = fi_mr_desc(op->local_mr);
    } else {
      desc = fi_mr_desc(chunk_mrs_[op->index / kOpChunk]);
    }
  }
  FiCtx* ctx = op;
  switch (op->type) {
    case OpType::kRead:
      return fi_read(ep_, op->local, op->len, desc, op->dest, op->raddr, op->rkey, ctx);
    case OpType::kWrite:
      if (op->delivery_complete) {
        iovec iov{op->local, op->len};
        fi_rma_iov rma{op->raddr, op->len, op->rkey};
        fi_msg_rma msg{};
        msg.msg_iov = &iov;
        msg.desc = &desc;
        msg.iov_count = 1;
        msg.addr = op->dest;
        msg.rma_iov = &rma;
        msg.rma_iov_count = 1;
        msg.context = ctx;
        return fi_writemsg(ep_, &msg, FI_DELIVERY_COMPLETE | FI_COMPLETION);
      }
      return fi_write(ep_, op->local, op->len, desc, op->dest, op->raddr, op->rkey, ctx);
    case OpType::kCompareSwap:
      return fi_compare_atomic(ep_, &op->operand, 1, desc, &op->compare, desc, &op->result, desc,
                               op->dest, op->raddr, op->rkey, FI_UINT64, FI_CSWAP, ctx);
    case OpType::kFetchAdd:
      return fi_fetch_atomic(ep_, &op->operand, 1, desc, &op->result, desc, op->dest, op->raddr,
                             op->rkey, FI_UINT64, FI_SUM, ctx);
    case OpType::kRpc:
      return fi_send(ep_, op->msg.data(), op->msg.size(), desc, op->dest, ctx);
  }
  return -FI_EINVAL;
}

void FabricContext::Submit(Op* op) {
  if (op->peer >= peers_.size()) {  // NewOp resolved the peer, so this cannot happen
    Finish(op, Status::Internal("fabric: op for an unresolved peer"));
    return;
  }
  if (!peers_[op->peer].retry.empty()) {
    // Keep post order behind ops to the same peer already waiting for provider resources.
    op->refs++;
    peers_[op->peer].retry.push_back(op);
    return;
  }
  if (PeerExited(op->peer, false)) {
    FailUnposted(op, PeerExitedStatus(op->type));
    return;
  }
  const ssize_t r = CallProvider(op);
  if (r == 0) {
    op->refs++;
    AfterPost(op);
    return;
  }
  if (r == -FI_EAGAIN) {
    stats_.eagain_retries++;
    op->refs++;
    PeerSlot& slot = peers_[op->peer];
    slot.blocked_since = slot.next_try = Clock::now();
    slot.retry.push_back(op);
    retry_peers_.push_back(op->peer);
    return;
  }
  FailUnposted(op, FiStatus("posting " + std::string(OpTypeName(op->type)), r));
}

Status FabricContext::PeerExitedStatus(OpType type) {
  return Status::Unavailable(std::string(OpTypeName(type)) + ": the peer process has exited");
}

void FabricContext::FailUnposted(Op* op, Status status) {
  if (op->internal) {
    const PeerKey pk{op->peer, op->key};
    auto it = cache_.find(pk);
    if (it != cache_.end() && it->second.lookup == op) {
      it->second.lookup = nullptr;
      FailEntry(pk, status.WithContext("key lookup"));
    }
    Finish(op, Status::OK());
    return;
  }
  Finish(op, std::move(status));
}

void FabricContext::RetryQueued() {
  const auto now = Clock::now();
  for (size_t i = 0; i < retry_peers_.size();) {
    const PeerId peer = retry_peers_[i];
    RetryPeer(peer, now);
    if (peers_[peer].retry.empty()) {
      retry_peers_[i] = retry_peers_.back();
      retry_peers_.pop_back();
    } else {
      ++i;
    }
  }
}

void FabricContext::RetryPeer(PeerId peer, Clock::time_point now) {
  // Nothing below adds peers, so peers_ is not resized while `q` is in use.
  std::deque<Op*>& q = peers_[peer].retry;
  while (!q.empty() && q.front()->user_done) {  // timed out or aborted while queued
    Op* op = q.front();
    q.pop_front();
    Unref(op);
  }
  if (q.empty() || now < peers_[peer].next_try) return;
  if (PeerExited(peer, true)) {
    while (!q.empty()) {
      Op* op = q.front();
      q.pop_front();
      if (op->user_done) {
        Unref(op);
        continue;
      }
      op->refs--;
      FailUnposted(op, PeerExitedStatus(op->type));
    }
    return;
  }
  while (!q.empty()) {
    Op* op = q.front();
    if (op->user_done) {
      q.pop_front();
      Unref(op);
      continue;
    }
    if (op->dest != peers_[peer].addr) {
      // A connection error replaced the peer's AV entry while the op was queued.
      auto dest = PeerAddr(peer);
      if (!dest.ok()) {
        q.pop_front();
        op->refs--;
        Finish(op, dest.status());
        continue;
      }
      op->dest = *dest;
    }
    const ssize_t r = CallProvider(op);
    if (r == -FI_EAGAIN) {
      stats_.eagain_retries++;
      peers_[peer].next_try = NextRetry(peers_[peer].blocked_since, now);
      return;
    }
    q.pop_front();
    peers_[peer].blocked_since = now;
    if (r == 0) {  // the queue's reference becomes the provider's
      AfterPost(op);
      continue;
    }
    op->refs--;
    FailUnposted(op, FiStatus("posting " + std::string(OpTypeName(op->type)), r));
  }
}

void FabricContext::SendLookup(const PeerKey& pk, KeyEntry* e) {
  auto res = NewOp(OpType::kRpc, pk.peer, 0);
  if (!res.ok()) {
    FailEntry(pk, res.status());
    return;
  }
  Op* op = *res;
  op->internal = true;
  op->key = pk.key;
  LookupRequest req{pk.key};
  BuildMessage(op->msg, MsgType::kLookupRequest, 0, SeqOf(op), 0, name_,
               std::as_bytes(std::span(&req, 1)));
  e->lookup = op;
  stats_.lookups_sent++;
  Submit(op);
}

void FabricContext::FailEntry(const PeerKey& pk, const Status& status) {
  auto it = cache_.find(pk);
  if (it == cache_.end()) return;
  Op* w = it->second.waiters;
  EraseEntry(pk);
  while (w != nullptr) {
    Op* next = w->wait_next;
    w->wait_next = nullptr;
    if (!w->prior_error.ok() && status.code() != Code::kNotFound) {
      // Revalidation could not show the key is gone: report the provider's own error.
      Finish(w, w->prior_error);
    } else {
      Finish(w, status);
    }
    Unref(w);
    w = next;
  }
}

Op* FabricContext::FindOp(uint64_t seq) {
  const uint32_t index = static_cast<uint32_t>(seq);
  const uint32_t gen = static_cast<uint32_t>(seq >> 32);
  if (index >= chunks_.size() * kOpChunk) return nullptr;
  Op* op = &chunks_[index / kOpChunk][index % kOpChunk];
  if (op->gen != gen || op->free) return nullptr;
  return op;
}

void FabricContext::HandleMessage(std::span<const std::byte> bytes) {
  auto parsed = ParseMessage(bytes, std::max<uint32_t>(core_->config().max_rpc_bytes, 4096));
  if (!parsed.ok()) {
    FARMEM_LOG_WARN("fabric: dropping malformed reply: {}", parsed.status().ToString());
    return;
  }
  const ParsedMsg& m = *parsed;
  Op* op = FindOp(m.header.seq);
  if (op == nullptr || op->user_done) return;  // late reply to a timed-out op
  Status error;
  if (m.header.status_code != 0) {
    const uint32_t c = m.header.status_code;
    const Code code =
        c <= static_cast<uint32_t>(Code::kMoved) ? static_cast<Code>(c) : Code::kProtocol;
    error = Status(
        code, std::string_view(reinterpret_cast<const char*>(m.payload.data()), m.payload.size()));
  }
  if (static_cast<MsgType>(m.header.type) == MsgType::kLookupReply && op->internal) {
    const PeerKey pk{op->peer, op->key};
    auto it = cache_.find(pk);
    if (it == cache_.end() || it->second.lookup != op) {
      Finish(op, Status::OK());
      return;
    }
    KeyEntry& e = it->second;
    e.lookup = nullptr;
    if (error.ok() && m.payload.size() != sizeof(LookupReply)) {
      error = Status::Protocol("malformed key lookup reply");
    }
    LookupReply r{};
    if (error.ok()) {
      std::memcpy(&r, m.payload.data(), sizeof(r));
      if (r.key != op->key) error = Status::Protocol("key lookup reply for another key");
    }
    Finish(op, Status::OK());
    if (!error.ok()) {
      FailEntry(pk, error);
      return;
    }
    e.ready = true;
    e.base = r.remote_base;
    e.length = r.length;
    e.prov_key = r.prov_key;
    e.read_only = (r.flags & kLookupReadOnly) != 0;
    if (r.table_pid != 0) {
      const Core::Mapping* table = core_->RemoteTable(r.table_pid, r.table_fd, r.table_id);
      e.valid = table ? static_cast<std::atomic<uint64_t>*>(table->base) : nullptr;
      e.table_head = e.valid;
      e.table_id = r.table_id;
      if (e.valid != nullptr) {
        if (r.table_slot < kFirstKeySlot || r.table_slot >= kKeyTableSlots) {
          e.valid = nullptr;
        } else {
          e.valid += r.table_slot;
        }
      }
    }
    Op* w = e.waiters;
    e.waiters = e.waiters_tail = nullptr;
    // Issue may erase the entry (deregistered key); iterate over the detached list only.
    while (w != nullptr) {
      Op* next = w->wait_next;
      w->wait_next = nullptr;
      w->refs--;
      if (w->user_done) {
        if (w->refs == 0 && !w->free) Release(w);
      } else if (!w->prior_error.ok()) {
        // The key is still registered, so the provider's failure was not a stale key.
        Finish(w, w->prior_error);
      } else {
        auto cur = cache_.find(pk);
        if (cur == cache_.end() || !cur->second.ready) {  // an earlier waiter dropped the entry
          EnqueueForKey(w);
        } else {
          Issue(w, &cur->second);
        }
      }
      w = next;
    }
    return;
  }
  if (static_cast<MsgType>(m.header.type) == MsgType::kRpcReply && !op->internal &&
      op->type == OpType::kRpc) {
    if (!error.ok()) {
      Finish(op, error);
      return;
    }
    if (m.payload.size() > op->reply.size()) {
      Finish(op, Status::ResourceExhausted("RPC reply of " + std::to_string(m.payload.size()) +
                                           " bytes does not fit the " +
                                           std::to_string(op->reply.size()) + "-byte buffer"));
      return;
    }
    if (!m.payload.empty()) std::memcpy(op->reply.data(), m.payload.data(), m.payload.size());
    op->reply_imm = m.header.imm;
    op->reply_length = static_cast<uint32_t>(m.payload.size());
    Finish(op, Status::OK());
  }
}

void FabricContext::HandleCompletion(FiCtx* ctx, size_t len, int err, const Status& error) {
  if (ctx == nullptr) return;
  if (ctx->kind == Kind::kRecv) {
    auto* rb = static_cast<RecvBuf*>(ctx);
    if (error.ok()) {
      HandleMessage(std::span<const std::byte>(rb->data.get(), std::min(len, rb->capacity)));
    }
    Status st = PostRecv(rb);
    if (!st.ok()) FARMEM_LOG_WARN("fabric: {}", st.ToString());
    return;
  }
  if (ctx->kind != Kind::kOp) return;
  Op* op = static_cast<Op*>(ctx);
  if (op->refs > 0) op->refs--;
  if (op->user_done) {
    if (op->refs == 0 && !op->free) Release(op);
    return;
  }
  if (op->local_mr != nullptr && op->type != OpType::kRpc) {
    CloseFid(&op->local_mr->fid);
    op->local_mr = nullptr;
  }
  if (!error.ok()) {
    if (IsConnectionError(err)) ResetPeer(op->peer, op->dest);
    if (op->internal) {
      const PeerKey pk{op->peer, op->key};
      auto it = cache_.find(pk);
      if (IsConnectionError(err) && it != cache_.end() && it->second.lookup == op) {
        // ofi_rxm notices the dead connection only on its next CM poll; retry the lookup shortly
        // (waiters still expire at their own deadlines).
        it->second.lookup = nullptr;
        delayed_lookups_.push_back({pk, Clock::now() + kLookupRetryDelay});
        Finish(op, Status::OK());
        return;
      }
      FailEntry(pk, error.WithContext("key lookup"));
      Finish(op, Status::OK());
      return;
    }
    if (op->type != OpType::kRpc && op->prior_error.ok() && LooksLikeKeyError(err)) {
      // The cached key may be stale (region deregistered): look it up again before failing.
      op->prior_error = error;
      const PeerKey pk{op->peer, op->key};
      auto it = cache_.find(pk);
      if (it != cache_.end() && it->second.ready) EraseEntry(pk);
      EnqueueForKey(op);
      return;
    }
    Finish(op, error);
    return;
  }
  switch (op->type) {
    case OpType::kRead:
    case OpType::kWrite:
      Finish(op, Status::OK());
      break;
    case OpType::kCompareSwap:
    case OpType::kFetchAdd:
      *op->old_value = op->result;
      Finish(op, Status::OK());
      break;
    case OpType::kRpc:
      break;  // the send is done; the op finishes when the reply arrives
  }
}

void FabricContext::ProgressCq() {
  fi_cq_msg_entry entries[kCqBatch];
  for (int round = 0; round < 4; ++round) {
    const ssize_t n = fi_cq_read(cq_, entries, kCqBatch);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        HandleCompletion(static_cast<FiCtx*>(entries[i].op_context), entries[i].len, 0,
                         Status::OK());
      }
      if (static_cast<size_t>(n) < kCqBatch) return;
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) > 0) {
        char buf[256] = {};
        const char* text = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof(buf));
        Status st(CodeForFiError(err.err),
                  std::string(fi_strerror(err.err)) +
                      (text && *text ? std::string(" (") + text + ")" : std::string()));
        HandleCompletion(static_cast<FiCtx*>(err.op_context), 0, err.err, st);
      }
      continue;
    }
    return;  // -FI_EAGAIN or a CQ error (reported via ops' deadlines)
  }
}

void FabricContext::RunDelayedLookups() {
  const auto now = Clock::now();
  for (size_t i = 0; i < delayed_lookups_.size();) {
    if (delayed_lookups_[i].second > now) {
      ++i;
      continue;
    }
    const PeerKey pk = delayed_lookups_[i].first;
    delayed_lookups_[i] = delayed_lookups_.back();
    delayed_lookups_.pop_back();
    auto it = cache_.find(pk);
    if (it == cache_.end() || it->second.ready || it->second.lookup != nullptr) continue;
    bool live = false;
    for (Op* w = it->second.waiters; w != nullptr; w = w->wait_next) live |= !w->user_done;
    if (live) {
      SendLookup(pk, &it->second);
    } else {
      FailEntry(pk, Status::TimedOut("key lookup abandoned"));  // all waiters already expired
    }
  }
}

void FabricContext::ExpireDeadlines() {
  if (head_ == nullptr) return;
  const auto now = Clock::now();
  while (head_ != nullptr && head_->deadline <= now) {
    Op* op = head_;
    if (op->internal) {
      const PeerKey pk{op->peer, op->key};
      auto it = cache_.find(pk);
      Finish(op, Status::OK());
      if (it != cache_.end() && it->second.lookup == op) {
        it->second.lookup = nullptr;
        FailEntry(pk, Status::TimedOut("key lookup timed out (peer unreachable?)"));
      }
      continue;
    }
    Finish(op, Status::TimedOut(std::string(OpTypeName(op->type)) + " timed out after " +
                                std::to_string(core_->config().op_timeout.count()) + " ms"));
  }
}

void FabricContext::AbortAll() {
  aborted_ = true;
  while (head_ != nullptr) Finish(head_, Status::Aborted("fabric transport stopped"));
  cache_.clear();
  last_entry_ = nullptr;
}

size_t FabricContext::poll(std::span<Completion> out) {
  if (ready_head_ == ready_.size()) {
    if (!aborted_ && core_->stopped()) AbortAll();
    if (!aborted_) {
      ProgressCq();
      if (!repost_.empty()) {
        std::vector<RecvBuf*> again;
        again.swap(repost_);
        for (RecvBuf* rb : again) (void)PostRecv(rb);
      }
      if (!retry_peers_.empty()) RetryQueued();
      if (!delayed_lookups_.empty()) RunDelayedLookups();
      ExpireDeadlines();
    }
  }
  size_t n = 0;
  while (n < out.size() && ready_head_ < ready_.size()) {
    out[n++] = std::move(ready_[ready_head_++]);
  }
  if (ready_head_ == ready_.size()) {
    ready_.clear();
    ready_head_ = 0;
  }
  outstanding_ -= n;
  return n;
}

Status FabricContext::post_read(const RemoteRef& src, void* dst, size_t len, uint64_t wr_id) {
  if (dst == nullptr && len != 0) return Status::InvalidArgument("read into a null buffer");
  FARMEM_ASSIGN_OR_RETURN(Op * op, NewOp(OpType::kRead, src.peer, wr_id));
  op->key = src.key;
  op->offset = src.offset;
  op->local = dst;
  op->len = len;
  return PostOneSided(op);
}

Status FabricContext::post_write(const RemoteRef& dst, const void* src, size_t len, uint64_t wr_id,
                                 bool delivery_complete) {
  if (src == nullptr && len != 0) return Status::InvalidArgument("write from a null buffer");
  FARMEM_ASSIGN_OR_RETURN(Op * op, NewOp(OpType::kWrite, dst.peer, wr_id));
  op->key = dst.key;
  op->offset = dst.offset;
  op->local = const_cast<void*>(src);
  op->len = len;
  op->delivery_complete = delivery_complete;
  return PostOneSided(op);
}

Status FabricContext::post_compare_swap(const RemoteRef& dst, uint64_t expected, uint64_t desired,
                                        uint64_t* old_value, uint64_t wr_id) {
  if (old_value == nullptr) return Status::InvalidArgument("compare_swap needs old_value");
  if (dst.offset % 8 != 0) {
    return Status::InvalidArgument("compare_swap offset " + std::to_string(dst.offset) +
                                   " is not 8-byte aligned");
  }
  FARMEM_ASSIGN_OR_RETURN(Op * op, NewOp(OpType::kCompareSwap, dst.peer, wr_id));
  op->key = dst.key;
  op->offset = dst.offset;
  op->compare = expected;
  op->operand = desired;
  op->old_value = old_value;
  return PostOneSided(op);
}

Status FabricContext::post_fetch_add(const RemoteRef& dst, uint64_t add, uint64_t* old_value,
                                     uint64_t wr_id) {
  if (old_value == nullptr) return Status::InvalidArgument("fetch_add needs old_value");
  if (dst.offset % 8 != 0) {
    return Status::InvalidArgument("fetch_add offset " + std::to_string(dst.offset) +
                                   " is not 8-byte aligned");
  }
  FARMEM_ASSIGN_OR_RETURN(Op * op, NewOp(OpType::kFetchAdd, dst.peer, wr_id));
  op->key = dst.key;
  op->offset = dst.offset;
  op->operand = add;
  op->old_value = old_value;
  return PostOneSided(op);
}

Status FabricContext::post_rpc(PeerId peer, uint32_t imm, std::span<const std::byte> request,
                               std::span<std::byte> reply, uint64_t wr_id) {
  if (request.size() > core_->config().max_rpc_bytes) {
    return Status::InvalidArgument("RPC request of " + std::to_string(request.size()) +
                                   " bytes exceeds max_rpc_bytes");
  }
  FARMEM_ASSIGN_OR_RETURN(Op * op, NewOp(OpType::kRpc, peer, wr_id));
  op->reply = reply;
  op->reply_imm = 0;
  op->reply_length = 0;
  BuildMessage(op->msg, MsgType::kRpcRequest, imm, SeqOf(op), 0, name_, request);
  outstanding_++;
  Submit(op);
  return Status::OK();
}

// ---------------------------------------------------------------------------------------------
class FabricTransport : public Transport {
 public:
  explicit FabricTransport(std::shared_ptr<Core> core) : core_(std::move(core)) { AddLiveUser(); }
  ~FabricTransport() override {
    stop();
    DropLiveUser();
  }

  std::string name() const override { return "fabric:" + core_->config().provider; }
  std::string local_address() const override { return core_->address(); }
  void set_rpc_handler(RpcHandler handler) override {
    if (!started_) core_->set_handler(std::move(handler));
  }
  Status start() override {
    if (started_) return Status::OK();
    if (core_->stopped()) return Status::Unavailable("fabric transport stopped");
    FARMEM_RETURN_IF_ERROR(core_->StartServing());
    started_ = true;
    thread_ = std::thread([this] { core_->ProgressLoop(stop_thread_); });
    return Status::OK();
  }
  void stop() override {
    stop_thread_.store(true, std::memory_order_release);
    if (thread_.joinable()) core_->Wake();
    if (thread_.joinable()) thread_.join();
    core_->Shutdown();
  }
  Result<MemoryRegion> register_memory(void* addr, size_t len, Access access) override {
    return core_->Register(addr, len, access);
  }
  Status deregister_memory(RegionKey key) override { return core_->Deregister(key); }
  // Copies of one-sided reads are made by the initiator (CMA), by the provider across several
  // progress calls (tcp) or by a NIC: none can be waited for here. Clients over fabric validate
  // every copy with a seqlock (docs/transport.md, "Copy order of one-sided reads").
  Status wait_for_read_copies(std::chrono::steady_clock::time_point) override {
    return Status::OK();
  }
  Result<PeerId> add_peer(std::string_view address) override { return core_->AddPeer(address); }
  Result<std::unique_ptr<Context>> create_context() override {
    if (core_->stopped()) return Status::Unavailable("fabric transport stopped");
    auto ctx = std::make_unique<FabricContext>(core_);
    FARMEM_RETURN_IF_ERROR(ctx->Open());
    return std::unique_ptr<Context>(std::move(ctx));
  }

  const MrPlan& plan() const { return core_->plan(); }

 private:
  std::shared_ptr<Core> core_;
  std::atomic<bool> stop_thread_{false};
  std::thread thread_;
  bool started_ = false;
};

}  // namespace

Result<std::unique_ptr<Transport>> CreateFabricTransportWithOptions(const TransportConfig& config,
                                                                    const FabricOptions& options) {
  InitLogging();
  if (config.max_rpc_bytes == 0 || config.max_rpc_bytes > (64u << 20)) {
    return Status::InvalidArgument("max_rpc_bytes must be in 1..64 MiB");
  }
  if (config.op_timeout.count() <= 0) return Status::InvalidArgument("op_timeout must be > 0");
  auto core = std::make_shared<Core>(config, options);
  FARMEM_RETURN_IF_ERROR(core->Open());
  return std::unique_ptr<Transport>(std::make_unique<FabricTransport>(std::move(core)));
}

ContextStats GetContextStats(const Context& context) {
  const auto* fc = dynamic_cast<const FabricContext*>(&context);
  return fc ? fc->stats() : ContextStats{};
}

std::string MrPlanOf(const Transport& transport) {
  const auto* ft = dynamic_cast<const FabricTransport*>(&transport);
  return ft ? MrPlanString(ft->plan()) : std::string();
}

}  // namespace fabric

Result<std::unique_ptr<Transport>> CreateFabricTransport(const TransportConfig& config) {
  return fabric::CreateFabricTransportWithOptions(config, fabric::FabricOptions{});
}

}  // namespace farmem
