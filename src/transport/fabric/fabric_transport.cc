// libfabric FI_EP_RDM Transport (shm, tcp;ofi_rxm, verbs;ofi_rxm): the Transport object and Core
// setup (fabric, domain, main endpoint, mr_mode registration, peers, shutdown), called from any
// thread; start() runs the progress thread (fabric_target.cc). Contexts: fabric_initiator.cc.
#include "transport/fabric/fabric_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "common/log.h"
#include "transport/fabric/fabric_internal.h"
#include "transport/fabric/fabric_util.h"

namespace farmem {
namespace fabric {
namespace internal {

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

void CloseFid(fid_t fid) {
  if (fid != nullptr) {
    const int ret = fi_close(fid);
    if (ret != 0) FARMEM_LOG_WARN("fabric: fi_close failed: {}", fi_strerror(-ret));
  }
}

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
  // Non-shm providers are pinned to listen_host so they never pick eth0 by accident. shm gets a
  // source name of its own instead of the pid (ShmSourceName: a reused pid must not meet a dead
  // process's /dev/shm files).
  const std::string shm_name = is_shm ? ShmSourceName() : std::string();
  const char* node = is_shm                        ? shm_name.c_str()
                     : config_.listen_host.empty() ? nullptr
                                                   : config_.listen_host.c_str();
  std::string service;
  if (!is_shm && config_.listen_port != 0) service = std::to_string(config_.listen_port);
  const int ret = fi_getinfo(FI_VERSION(1, 17), node, service.empty() ? nullptr : service.c_str(),
                             node ? FI_SOURCE : 0, hints, &info_);
  fi_freeinfo(hints);
  if (ret != 0 || info_ == nullptr) {
    info_ = nullptr;
    return FiStatus("libfabric provider '" + config_.provider + "' with FI_EP_RDM, RMA, atomics" +
                        (node && !is_shm ? " on " + config_.listen_host : std::string()) +
                        " is not available",
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
    // access fail with kNotFound even though shm reads never reach this process, and reads
    // that overlapped this call fail when they complete (FabricContext::ReadStillValid).
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
namespace {
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
}  // namespace internal

Result<std::unique_ptr<Transport>> CreateFabricTransportWithOptions(const TransportConfig& config,
                                                                    const FabricOptions& options) {
  InitLogging();
  if (config.max_rpc_bytes == 0 || config.max_rpc_bytes > (64u << 20)) {
    return Status::InvalidArgument("max_rpc_bytes must be in 1..64 MiB");
  }
  if (config.op_timeout.count() <= 0) return Status::InvalidArgument("op_timeout must be > 0");
  auto core = std::make_shared<internal::Core>(config, options);
  FARMEM_RETURN_IF_ERROR(core->Open());
  return std::unique_ptr<Transport>(std::make_unique<internal::FabricTransport>(std::move(core)));
}

ContextStats GetContextStats(const Context& context) {
  const auto* fc = dynamic_cast<const internal::FabricContext*>(&context);
  return fc ? fc->stats() : ContextStats{};
}

std::string MrPlanOf(const Transport& transport) {
  const auto* ft = dynamic_cast<const internal::FabricTransport*>(&transport);
  return ft ? MrPlanString(ft->plan()) : std::string();
}

}  // namespace fabric

Result<std::unique_ptr<Transport>> CreateFabricTransport(const TransportConfig& config) {
  return fabric::CreateFabricTransportWithOptions(config, fabric::FabricOptions{});
}

}  // namespace farmem