// Initiator side of the libfabric backend: FabricContext, one per thread and used by that thread
// only. Posts reads, writes, atomics and RPCs on its own endpoint, keeps the (peer, key) lookup
// cache, retries -FI_EAGAIN per peer and turns CQ entries and replies into Completions in poll().
#include <netinet/in.h>
#include <poll.h>
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/log.h"
#include "transport/fabric/fabric_internal.h"
#include "transport/fabric/fabric_util.h"

namespace farmem::fabric::internal {

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

namespace {
bool ShmCmaDisabledByEnv();
// On unless FARMEM_FABRIC_DIRECT_COPY=0 (see TryDirectCopy): the provider's own read path is kept
// as the fallback and for comparison.
bool DirectCopyEnabledByEnv() {
  const char* v = getenv("FARMEM_FABRIC_DIRECT_COPY");
  return v == nullptr || std::string_view(v) != "0";
}
}  // namespace

Status FabricContext::Open() {
  local_desc_ = core_->need_local_desc();
  // FI_MR_VIRT_ADDR: op->raddr is the peer's virtual address, which process_vm_readv takes.
  direct_copy_ = core_->config().provider == "shm" && core_->plan().virt_addr &&
                 !ShmCmaDisabledByEnv() && DirectCopyEnabledByEnv();
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

namespace {
// libfabric reads its boolean variables as 1/yes/true/on (any case).
bool ShmCmaDisabledByEnv() {
  static const bool disabled = [] {
    const char* v = getenv("FI_SHM_DISABLE_CMA");
    if (v == nullptr) return false;
    std::string s(v);
    for (char& ch : s) ch = static_cast<char>(tolower(static_cast<unsigned char>(ch)));
    return s == "1" || s == "yes" || s == "true" || s == "on";
  }();
  return disabled;
}

// Only shm peers have a doorbell. shm takes its CMA fast path (process_vm_readv/writev in this
// thread, nothing for the target to do) only for reads and writes without FI_DELIVERY_COMPLETE
// (and without remote CQ data, which we never use), and only while CMA is usable. Everything else
// (delivery-complete writes, atomics, messages, any RMA with CMA off) is a command in the
// target's queue that only its progress thread completes. shm offers no wait object the target
// could block on instead (libfabric 1.17: fi_cq_open with FI_WAIT_FD / FI_WAIT_POLLFD fails with
// FI_ENOSYS, FI_WAIT_UNSPEC becomes FI_WAIT_YIELD, a sched_yield loop; a peer's post only sets a
// flag in shared memory), so we ring the doorbell the target sleeps on.
bool NeedsTargetProgress(const Op& op) {
  switch (op.type) {
    case OpType::kRead:
      return ShmCmaDisabledByEnv();
    case OpType::kWrite:
      return op.delivery_complete || ShmCmaDisabledByEnv();
    default:
      return true;
  }
}
}  // namespace

bool FabricContext::needs_progress() const {
  // Ops the provider has not taken yet: refused for now, or waiting for a key lookup's reply.
  if (!retry_peers_.empty() || !delayed_lookups_.empty()) return true;
  for (const auto& [pk, e] : cache_) {
    if (e.waiters != nullptr) return true;
  }
  if (outstanding_ == 0) return false;
  // Taken by shm with CMA on, an op needs nothing more from this thread: CMA reads and writes
  // ran inside the post, everything else is a command the target's progress thread completes.
  // Other providers (and shm without CMA, which segments large transfers through bounce buffers
  // this side fills) move bytes inside our progress calls until the op completes.
  return core_->config().provider != "shm" || ShmCmaDisabledByEnv();
}

void FabricContext::AfterPost(const Op* op) {
  if (!NeedsTargetProgress(*op)) return;
  if (op->peer < peers_.size() && peers_[op->peer].doorbell != nullptr) {
    RingDoorbell(peers_[op->peer].doorbell);
  }
}

// On shm, -FI_EAGAIN means the target has to progress before we can post: the first post to a
// peer only queues a connection request (our name) in its command queue, and a full command queue
// or a pending segmented transfer drains only in its progress thread. Ring, so a sleeping target
// does that now rather than at its next timeout (or never, with idle_wait_forever).
void FabricContext::AfterRefusal(PeerId peer) {
  if (peer < peers_.size() && peers_[peer].doorbell != nullptr) {
    RingDoorbell(peers_[peer].doorbell);
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
  op->valid = op->type == OpType::kRead ? e->valid : nullptr;
  if ((op->type == OpType::kCompareSwap || op->type == OpType::kFetchAdd) && op->raddr % 8 != 0) {
    Finish(op, Status::InvalidArgument("atomic target address is not 8-byte aligned"));
    return;
  }
  if (len == 0) {
    Finish(op, Status::OK());
    return;
  }
  if (TryDirectCopy(op, *e)) return;
  Submit(op);
}

// The default shm read path (FARMEM_FABRIC_DIRECT_COPY=0 turns it off). shm reads copied here with
// the process_vm_readv that libfabric 1.17's shm "fast RMA" path makes, but without its two costs.
// The provider holds the target's command-queue spinlock (in shared memory, also taken by every
// other sender and by the target's progress thread) across the system call, so concurrent readers
// spin; and it posts a completion command into the target's queue per op, a credit only the
// target's progress thread returns, so a target that sleeps makes readers fail with -FI_EAGAIN
// until it wakes. Measured on the tx KV benchmark (bench/README.md, "shm reads bypass the
// provider's queue"). Bounds, key validity and read-only regions were checked by Issue() from the
// peer's key table, as for the provider path (whose CMA copy checks no key either). Reads finishing
// inside the post must not starve the CQ (progress_due_). Writes and atomics stay with the
// provider.
bool FabricContext::TryDirectCopy(Op* op, const KeyEntry& e) {
  if (!direct_copy_ || e.owner_pid <= 0 || e.valid == nullptr) return false;
  if (op->type != OpType::kRead) return false;
  PeerSlot& slot = peers_[op->peer];
  // Behind refused ops to this peer (they keep post order through the provider), and off for
  // good once the kernel refused us (ptrace policy): the provider then uses its own fallback.
  if (slot.cma_refused || !slot.retry.empty()) return false;
  // A dead peer's pid may be reused by another process: the pidfd check (as on the provider path,
  // at most every kPeerLivenessInterval) catches the death before that can matter in practice.
  if (PeerExited(op->peer, false)) {
    FailUnposted(op, PeerExitedStatus(op->type));
    return true;
  }
  size_t done = 0;
  while (done < op->len) {
    iovec local{static_cast<char*>(op->local) + done, op->len - done};
    iovec remote{reinterpret_cast<void*>(op->raddr + done), op->len - done};
    const ssize_t n = process_vm_readv(e.owner_pid, &local, 1, &remote, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    const int err = n == 0 ? EFAULT : errno;
    if (err == EINTR) continue;
    if (done == 0 && (err == EPERM || err == ENOSYS)) {
      slot.cma_refused = true;
      FARMEM_LOG_DEBUG("fabric: process_vm_readv on peer {} refused ({}); using the provider",
                       op->peer, strerror(err));
      return false;
    }
    if (err == ESRCH) {
      slot.exited = true;
      FailUnposted(op, PeerExitedStatus(op->type));
      return true;
    }
    // EFAULT: the range is no longer mapped at the peer, which a live key never allows.
    const bool deregistered =
        e.valid != nullptr && e.valid->load(std::memory_order_acquire) != op->key;
    if (deregistered) EraseEntry(PeerKey{op->peer, op->key});
    Finish(op, deregistered
                   ? Status::NotFound("region key was deregistered at the peer")
                   : Status(CodeForFiError(err), std::string(OpTypeName(op->type)) +
                                                     " at the peer failed: " + strerror(err)));
    return true;
  }
  stats_.direct_copies++;
  progress_due_ = true;
  Finish(op, ReadStillValid(op));
  return true;
}

// An ordered read done with one process_vm_readv over every segment. The kernel copies the remote
// iovecs one after another (mm/process_vm_access.c: process_vm_rw_core loops over them, and each
// one's pages are pinned under mmap_read_lock, copied, then unpinned), so between the last load of
// segment i and the first of segment i + 1 there are lock-prefixed read-modify-writes (the page
// refcounts, the mmap lock). x86 never reorders loads, fast-string ones included, across a locked
// instruction (Intel SDM vol. 3 §8.2.2), so every byte of segment i is read before any byte of
// segment i + 1: a seqlock reader's version / data / version in one system call instead of three
// (bench/README.md, "tx"). Inside one segment there is no order (docs/transport.md). The same
// checks as Issue() and TryDirectCopy(), on a key already in the cache; anything else (key unknown
// yet, CMA refused, ops queued behind a refusal, a short copy) answers nullopt and the caller reads
// one segment after another through post_read.
std::optional<Status> FabricContext::read_ordered_now(PeerId peer, RegionKey key,
                                                      std::span<const ReadSegment> segments) {
  constexpr size_t kMaxSegments = 8;
#if !defined(__x86_64__)
  return std::nullopt;  // the order argument above is x86's; elsewhere, one read after another
#endif
  if (!direct_copy_ || aborted_ || segments.empty() || segments.size() > kMaxSegments) {
    return std::nullopt;
  }
  if (peer >= peers_.size()) return std::nullopt;
  auto it = cache_.find(PeerKey{peer, key});
  if (it == cache_.end() || !it->second.ready) return std::nullopt;
  const KeyEntry& e = it->second;
  if (e.owner_pid <= 0 || e.valid == nullptr) return std::nullopt;
  PeerSlot& slot = peers_[peer];
  if (slot.cma_refused || !slot.retry.empty()) return std::nullopt;
  if (e.valid->load(std::memory_order_acquire) != key) return std::nullopt;  // post_read says why
  iovec local[kMaxSegments], remote[kMaxSegments];
  size_t total = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const ReadSegment& seg = segments[i];
    if (seg.dst == nullptr || seg.len == 0) {
      return Status::InvalidArgument("ordered read: an empty segment or a null buffer");
    }
    if (!InBounds(seg.offset, seg.len, e.length)) {
      return Status::OutOfRange("access [" + std::to_string(seg.offset) + ", +" +
                                std::to_string(seg.len) + ") outside region of " +
                                std::to_string(e.length) + " bytes");
    }
    local[i] = iovec{seg.dst, seg.len};
    remote[i] = iovec{reinterpret_cast<void*>(e.base + seg.offset), seg.len};
    total += seg.len;
  }
  if (PeerExited(peer, false)) return PeerExitedStatus(OpType::kRead);
  const ssize_t n =
      process_vm_readv(e.owner_pid, local, segments.size(), remote, segments.size(), 0);
  if (n < 0 && errno == ESRCH) {
    slot.exited = true;
    return PeerExitedStatus(OpType::kRead);
  }
  if (n < 0 && (errno == EPERM || errno == ENOSYS)) slot.cma_refused = true;
  // Short, interrupted or failed: the ordinary path retries or reports it (EFAULT: deregistered).
  if (n != static_cast<ssize_t>(total)) return std::nullopt;
  stats_.ordered_copies++;
  // As ReadStillValid: the copy ended in a system call, which orders it before this load.
  if (e.valid->load(std::memory_order_acquire) != key) {
    EraseEntry(PeerKey{peer, key});
    return Status::NotFound("region key was deregistered at the peer during the read");
  }
  return Status::OK();
}

// shm reads are copies out of the peer's memory by a system call (process_vm_readv, the
// provider's or ours) that no deregistration waits for, and a deregistered region's memory stays
// mapped once it is freed and reused, so no EFAULT says so: a read that overlapped a
// deregistration may hold someone else's data. Deregistration clears the key's slot before it
// returns (Core::Deregister), i.e. before the memory can be reused, so a slot still holding the
// key after the copy means the copy read the region. (RDMA needs no such check: after
// deregistration returns the NIC no longer reads the memory.)
Status FabricContext::ReadStillValid(Op* op) {
  // No fence before the load: the copy ended in a system call (ours) or was observed through the
  // CQ (the provider's), either of which orders it before this load.
  if (op->valid == nullptr) return Status::OK();
  if (op->valid->load(std::memory_order_acquire) == op->key) return Status::OK();
  const PeerKey pk{op->peer, op->key};
  auto it = cache_.find(pk);
  if (it != cache_.end() && it->second.ready) EraseEntry(pk);
  return Status::NotFound("region key was deregistered at the peer during the read");
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
    AfterRefusal(op->peer);
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
      AfterRefusal(peer);
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
      e.owner_pid = r.table_pid;
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
      Finish(op, ReadStillValid(op));
      break;
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
  if (ready_head_ == ready_.size() || progress_due_) {
    progress_due_ = false;
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

}  // namespace farmem::fabric::internal
