// Manager (participants, region, JOIN), ChannelThread (ops, ack keys, fences), Channel (endpoints,
// joins). Manager state: application threads and the progress thread (JOIN) under Impl::mu; a
// ChannelThread: its own thread only (fence_global of other threads reads its atomics).
#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "channels/channel_wire.h"
#include "channels/manager_impl.h"

namespace farmem::channels {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_owned_checksum_disabled{false};
std::atomic<bool> g_barrier_wait_disabled{false};
std::atomic<bool> g_lock_wait_disabled{false};
std::atomic<bool> g_ring_checksum_disabled{false};
std::atomic<bool> g_ring_backpressure_disabled{false};
std::atomic<bool> g_ring_partial_seq_disabled{false};
std::atomic<bool> g_queue_wait_disabled{false};
std::atomic<bool> g_kv_acks_disabled{false};
std::atomic<bool> g_kv_update_fence_disabled{false};
std::atomic<bool> g_kv_checksum_disabled{false};
std::atomic<bool> g_kv_rollback_disabled{false};
std::atomic<bool> g_kv_catch_up_disabled{false};
std::atomic<bool> g_kv_ticket_order_disabled{false};

namespace testing {
void SetOwnedChecksumDisabled(bool disabled) {
  g_owned_checksum_disabled.store(disabled);
}
void SetLockWaitDisabled(bool disabled) {
  g_lock_wait_disabled.store(disabled);
}
void SetBarrierWaitDisabled(bool disabled) {
  g_barrier_wait_disabled.store(disabled);
}
void SetRingChecksumDisabled(bool disabled) {
  g_ring_checksum_disabled.store(disabled);
}
void SetRingBackpressureDisabled(bool disabled) {
  g_ring_backpressure_disabled.store(disabled);
}
void SetQueueWaitDisabled(bool disabled) {
  g_queue_wait_disabled.store(disabled);
}
void SetKvAcksDisabled(bool disabled) {
  g_kv_acks_disabled.store(disabled);
}
void SetKvUpdateFenceDisabled(bool disabled) {
  g_kv_update_fence_disabled.store(disabled);
}
void SetKvChecksumDisabled(bool disabled) {
  g_kv_checksum_disabled.store(disabled);
}
void SetRingPartialSeqDisabled(bool disabled) {
  g_ring_partial_seq_disabled.store(disabled);
}
void SetKvRollbackDisabled(bool disabled) {
  g_kv_rollback_disabled.store(disabled);
}
void SetKvCatchUpDisabled(bool disabled) {
  g_kv_catch_up_disabled.store(disabled);
}
void SetKvTicketOrderDisabled(bool disabled) {
  g_kv_ticket_order_disabled.store(disabled);
}
}  // namespace testing

namespace {
constexpr char kRegionName[] = "farmem.channels";

std::string NodeList(const std::vector<NodeId>& ids) {
  std::string s;
  for (NodeId id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}
}  // namespace

// ---- AckKey ------------------------------------------------------------------------------------

AckKey& AckKey::operator|=(const AckKey& other) {
  std::vector<uint64_t> merged;
  merged.reserve(ids_.size() + other.ids_.size());
  std::set_union(ids_.begin(), ids_.end(), other.ids_.begin(), other.ids_.end(),
                 std::back_inserter(merged));
  ids_ = std::move(merged);
  return *this;
}

// ---- Endpoint ----------------------------------------------------------------------------------

namespace detail {
bool Endpoint::is_member(NodeId n) const {
  return std::binary_search(members.begin(), members.end(), n);
}
void Endpoint::set_remote(NodeId n, uint64_t off) {
  {
    std::lock_guard lock(mu);
    remote[n] = off;
  }
  cv.notify_all();
}
}  // namespace detail

// ---- Manager -----------------------------------------------------------------------------------

Manager::Manager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Manager::~Manager() {
  // Peers must not reach the region once it is freed.
  (void)impl_->node->unexport_region(kRegionName);
}
NodeId Manager::self() const {
  return impl_->config.self;
}
const ManagerConfig& Manager::config() const {
  return impl_->config;
}
Node& Manager::node() {
  return *impl_->node;
}

Result<std::unique_ptr<Manager>> Manager::Create(Node& node, ManagerConfig config) {
  bool self_listed = false;
  for (const auto& p : config.participants) self_listed |= p.id == config.self;
  if (!self_listed) return Status::InvalidArgument("channels: self is not in the participant list");
  if (config.region_bytes < 4096) return Status::InvalidArgument("channels: region too small");
  auto impl = std::make_unique<Impl>();
  impl->node = &node;
  impl->config = std::move(config);
  impl->region_bytes = (impl->config.region_bytes + 63) / 64 * 64;
  impl->region = std::make_unique<uint64_t[]>(impl->region_bytes / 8);  // zeroed
  auto info = node.export_region(kRegionName, impl->region.get(), impl->region_bytes);
  if (!info.ok()) return info.status();
  Impl* raw = impl.get();
  Status st = node.register_rpc(
      wire::kOpJoin,
      [raw](const RpcCall& call, std::vector<std::byte>& reply) {
        return raw->handle_join(call, reply);
      },
      RpcExecution::kInline);
  if (!st.ok()) return st;
  return std::unique_ptr<Manager>(new Manager(std::move(impl)));
}

Status Manager::connect(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<NodeId> missing;
  for (;;) {
    missing.clear();
    for (const auto& p : impl_->config.participants) {
      {
        std::lock_guard lock(impl_->mu);
        if (impl_->peers.count(p.id)) continue;
      }
      auto info = impl_->node->connect(p.bootstrap_address);
      if (!info.ok()) {
        missing.push_back(p.id);
        continue;
      }
      Impl::PeerSlot slot;
      slot.peer = info->id;
      for (const auto& r : info->regions) {
        if (r.name == kRegionName) slot.key = r.key;
      }
      if (slot.key == 0) {
        missing.push_back(p.id);  // that node has no channel manager (yet)
        continue;
      }
      std::lock_guard lock(impl_->mu);
      impl_->peers[p.id] = slot;
    }
    if (missing.empty()) return Status::OK();
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Status::TimedOut("channels: participants " + NodeList(missing) + " not reachable within " +
                          std::to_string(timeout.count()) + " ms");
}

Result<std::unique_ptr<ChannelThread>> Manager::make_thread() {
  auto ctx = impl_->node->transport().create_context();
  if (!ctx.ok()) return ctx.status();
  auto shared = std::make_shared<detail::ThreadShared>();
  {
    std::lock_guard lock(impl_->mu);
    std::erase_if(impl_->threads, [](const auto& w) { return w.expired(); });
    impl_->threads.push_back(shared);
  }
  return std::unique_ptr<ChannelThread>(new ChannelThread(this, std::move(*ctx), shared));
}

Result<Manager::Impl::PeerSlot> Manager::Impl::peer(NodeId n) {
  std::lock_guard lock(mu);
  auto it = peers.find(n);
  if (it == peers.end()) {
    return Status::Unavailable("channels: node " + std::to_string(n) + " is not connected");
  }
  return it->second;
}

Result<std::shared_ptr<detail::Endpoint>> Manager::Impl::open_endpoint(const std::string& name,
                                                                       std::vector<NodeId> members,
                                                                       size_t slice_bytes) {
  if (name.empty() || name.size() > wire::kMaxNameBytes) {
    return Status::InvalidArgument("channels: bad channel name '" + name + "'");
  }
  std::sort(members.begin(), members.end());
  members.erase(std::unique(members.begin(), members.end()), members.end());
  if (!std::binary_search(members.begin(), members.end(), config.self)) {
    return Status::InvalidArgument("channel '" + name + "': this node is not a member");
  }
  for (NodeId m : members) {
    bool known = false;
    for (const auto& p : config.participants) known |= p.id == m;
    if (!known) {
      return Status::InvalidArgument("channel '" + name + "': node " + std::to_string(m) +
                                     " is not a participant");
    }
  }
  auto ep = std::make_shared<detail::Endpoint>();
  ep->mgr = this;
  ep->name = name;
  ep->members = std::move(members);
  ep->slice_bytes = slice_bytes;
  std::lock_guard lock(mu);
  if (endpoints.count(name)) {
    return Status::FailedPrecondition("channel '" + name + "' is already open on this node");
  }
  const size_t rounded = (std::max<size_t>(slice_bytes, 8) + 63) / 64 * 64;
  if (bump + rounded > region_bytes) {
    return Status::ResourceExhausted("channels: region full opening '" + name + "'");
  }
  ep->offset = bump;
  ep->local = base() + bump;
  bump += rounded;
  ep->remote[config.self] = ep->offset;
  // Joins that came before the endpoint existed.
  const auto now = Clock::now();
  auto pit = pending.find(name);
  if (pit != pending.end()) {
    for (const auto& [from, p] : pit->second) {
      if (p.deadline >= now && p.length == slice_bytes && ep->is_member(from)) {
        ep->remote[from] = p.offset;
      }
    }
    pending.erase(pit);
  }
  endpoints[name] = ep;
  return ep;
}

Status Manager::Impl::handle_join(const RpcCall& call, std::vector<std::byte>& reply) {
  wire::JoinRequest req;
  if (call.request.size() < sizeof(req)) return Status::Protocol("channels: short JOIN");
  std::memcpy(&req, call.request.data(), sizeof(req));
  if (req.magic != wire::kJoinMagic || req.name_bytes > wire::kMaxNameBytes ||
      call.request.size() != sizeof(req) + req.name_bytes) {
    return Status::Protocol("channels: malformed JOIN");
  }
  std::string name(reinterpret_cast<const char*>(call.request.data()) + sizeof(req),
                   req.name_bytes);
  wire::JoinReply out{};
  out.from = config.self;
  std::shared_ptr<detail::Endpoint> ep;
  {
    std::lock_guard lock(mu);
    const auto now = Clock::now();
    for (auto it = pending.begin(); it != pending.end();) {
      std::erase_if(it->second, [&](const auto& kv) { return kv.second.deadline < now; });
      it = it->second.empty() ? pending.erase(it) : std::next(it);
    }
    auto it = endpoints.find(name);
    if (it == endpoints.end()) {
      pending[name][req.from] = Pending{req.offset, req.length, now + config.early_join_ttl};
      out.state = static_cast<uint32_t>(wire::JoinState::kKept);
    } else {
      ep = it->second;
    }
  }
  if (ep) {
    if (!ep->is_member(req.from)) {
      return Status::InvalidArgument("channel '" + name + "': node " + std::to_string(req.from) +
                                     " is not a member here");
    }
    if (req.length != ep->slice_bytes) {
      return Status::InvalidArgument("channel '" + name + "': slice size differs between nodes");
    }
    ep->set_remote(req.from, req.offset);
    out.state = static_cast<uint32_t>(wire::JoinState::kJoined);
    out.offset = ep->offset;
    out.length = ep->slice_bytes;
  }
  reply.resize(sizeof(out));
  std::memcpy(reply.data(), &out, sizeof(out));
  return Status::OK();
}

// ---- ChannelThread -----------------------------------------------------------------------------

struct ChannelThread::Op {
  OpType type = OpType::kRead;
  NodeId node = 0;
  RemoteRef ref;
  std::vector<std::byte> buf;  // write source / RPC request
  void* dst = nullptr;         // read destination / RPC reply
  size_t len = 0;
  uint64_t a = 0, b = 0;  // CAS expected/desired, FAA add
  uint64_t* old_value = nullptr;
  uint32_t imm = 0;
};

ChannelThread::ChannelThread(Manager* mgr, std::unique_ptr<Context> ctx,
                             std::shared_ptr<detail::ThreadShared> shared)
    : mgr_(mgr), ctx_(std::move(ctx)), shared_(std::move(shared)) {}

ChannelThread::~ChannelThread() {
  // Operations still in flight reference buffers owned here: drain them (bounded by op_timeout).
  testing_release_held();
  const auto deadline = Clock::now() + mgr_->impl().op_timeout() + std::chrono::seconds(1);
  while (!outstanding_.empty() && Clock::now() < deadline) {
    poll();
    if (!outstanding_.empty())
      ctx_->wait(std::min(deadline, Clock::now() + std::chrono::milliseconds(1)));
  }
  shared_->low_water.store(UINT64_MAX);
}

void ChannelThread::publish_low_water() {
  shared_->low_water.store(outstanding_.empty() ? next_id_ : outstanding_.front().first,
                           std::memory_order_release);
}

Status ChannelThread::post_now(uint64_t id, Op& op) {
  switch (op.type) {
    case OpType::kRead:
      return ctx_->post_read(op.ref, op.dst, op.len, id);
    case OpType::kWrite:
      return ctx_->post_write(op.ref, op.buf.data(), op.buf.size(), id, /*delivery_complete=*/true);
    case OpType::kCompareSwap:
      return ctx_->post_compare_swap(op.ref, op.a, op.b, op.old_value, id);
    case OpType::kFetchAdd:
      return ctx_->post_fetch_add(op.ref, op.a, op.old_value, id);
    case OpType::kRpc:
      return ctx_->post_rpc(op.ref.peer, op.imm, op.buf,
                            std::span<std::byte>(static_cast<std::byte*>(op.dst), op.len), id);
  }
  return Status::Internal("channels: unknown op");
}

Result<AckKey> ChannelThread::post(NodeId node, std::unique_ptr<Op> op) {
  op->node = node;
  const uint64_t id = next_id_;
  if (op->type == OpType::kWrite && hold_next_write_) {
    hold_next_write_ = false;
    held_.push_back(id);
  } else {
    Status st = post_now(id, *op);
    if (!st.ok()) return st;
  }
  next_id_++;
  shared_->issued.store(next_id_, std::memory_order_release);
  outstanding_.emplace_back(id, std::move(op));
  publish_low_water();
  AckKey key;
  key.ids_.push_back(id);
  return key;
}

void ChannelThread::testing_release_held() {
  for (uint64_t id : held_) {
    auto it = std::lower_bound(outstanding_.begin(), outstanding_.end(), id,
                               [](const auto& e, uint64_t v) { return e.first < v; });
    if (it == outstanding_.end() || it->first != id) continue;
    Status st = post_now(id, *it->second);
    if (!st.ok()) {
      failed_.emplace_back(id, st);
      outstanding_.erase(it);
    }
  }
  held_.clear();
  publish_low_water();
}

void ChannelThread::poll() {
  Completion batch[32];
  for (;;) {
    const size_t n = ctx_->poll(std::span<Completion>(batch, 32));
    for (size_t i = 0; i < n; i++) {
      auto it = std::lower_bound(outstanding_.begin(), outstanding_.end(), batch[i].wr_id,
                                 [](const auto& e, uint64_t v) { return e.first < v; });
      if (it == outstanding_.end() || it->first != batch[i].wr_id) continue;
      if (!batch[i].status.ok()) failed_.emplace_back(batch[i].wr_id, batch[i].status);
      outstanding_.erase(it);
    }
    if (n < 32) break;
  }
  publish_low_water();
}

Status ChannelThread::flush(std::chrono::milliseconds timeout) {
  // Asked before polling: right after a poll (the barrier's case) there is usually nothing left,
  // and a poll costs more than the question.
  if (!ctx_->needs_progress()) return Status::OK();
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    poll();
    if (!ctx_->needs_progress()) return Status::OK();
    const auto now = Clock::now();
    if (now >= deadline) {
      return Status::TimedOut("channels: the transport did not take this thread's posts within " +
                              std::to_string(timeout.count()) + " ms");
    }
    ctx_->wait(std::min(deadline, now + std::chrono::milliseconds(1)));
  }
}

bool ChannelThread::query(const AckKey& key) {
  poll();
  for (uint64_t id : key.ids_) {
    auto it = std::lower_bound(outstanding_.begin(), outstanding_.end(), id,
                               [](const auto& e, uint64_t v) { return e.first < v; });
    if (it != outstanding_.end() && it->first == id) return false;
  }
  return true;
}

Status ChannelThread::wait_ids(const std::vector<uint64_t>& ids, Clock::time_point deadline) {
  // A held (test hook) op that this wait needs is posted now.
  for (uint64_t id : ids) {
    if (std::find(held_.begin(), held_.end(), id) != held_.end()) {
      testing_release_held();
      break;
    }
  }
  for (;;) {
    poll();
    bool done = true;
    for (uint64_t id : ids) {
      auto it = std::lower_bound(outstanding_.begin(), outstanding_.end(), id,
                                 [](const auto& e, uint64_t v) { return e.first < v; });
      if (it != outstanding_.end() && it->first == id) {
        done = false;
        break;
      }
    }
    if (done) break;
    const auto now = Clock::now();
    if (now >= deadline) {
      return Status::TimedOut("channels: " + std::to_string(ids.size()) +
                              " operations not complete by the deadline");
    }
    ctx_->wait(std::min(deadline, now + std::chrono::milliseconds(1)));
  }
  Status first;
  for (auto it = failed_.begin(); it != failed_.end();) {
    if (std::find(ids.begin(), ids.end(), it->first) != ids.end()) {
      if (first.ok()) first = it->second;
      it = failed_.erase(it);
    } else {
      ++it;
    }
  }
  return first;
}

Status ChannelThread::wait(const AckKey& key, std::chrono::milliseconds timeout) {
  return wait_ids(key.ids_, Clock::now() + timeout);
}

Status ChannelThread::fence_pair(NodeId peer, std::chrono::milliseconds timeout) {
  std::vector<uint64_t> ids;
  for (const auto& [id, op] : outstanding_) {
    if (op->node == peer) ids.push_back(id);
  }
  return wait_ids(ids, Clock::now() + timeout);
}

Status ChannelThread::fence_thread(std::chrono::milliseconds timeout) {
  std::vector<uint64_t> ids;
  for (const auto& e : outstanding_) ids.push_back(e.first);
  return wait_ids(ids, Clock::now() + timeout);
}

Status ChannelThread::fence_thread_except(const AckKey& skip, std::chrono::milliseconds timeout) {
  std::vector<uint64_t> ids;
  for (const auto& e : outstanding_) {
    if (std::find(skip.ids_.begin(), skip.ids_.end(), e.first) == skip.ids_.end()) {
      ids.push_back(e.first);
    }
  }
  return wait_ids(ids, Clock::now() + timeout);
}

Status ChannelThread::fence_global(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<std::pair<std::shared_ptr<detail::ThreadShared>, uint64_t>> snap;
  {
    auto& impl = mgr_->impl();
    std::lock_guard lock(impl.mu);
    for (const auto& w : impl.threads) {
      if (auto s = w.lock()) snap.emplace_back(s, s->issued.load(std::memory_order_acquire));
    }
  }
  Status own = fence_thread(timeout);
  if (!own.ok()) return own;
  for (;;) {
    poll();
    size_t behind = 0;
    for (const auto& [s, issued] : snap) {
      if (s->low_water.load(std::memory_order_acquire) < issued) behind++;
    }
    if (behind == 0) return Status::OK();
    if (Clock::now() >= deadline) {
      return Status::TimedOut("channels: global fence: " + std::to_string(behind) +
                              " threads still have earlier operations in flight");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

Result<AckKey> ChannelThread::write(NodeId node, uint64_t offset, const void* src, size_t len) {
  auto p = mgr_->impl().peer(node);
  if (!p.ok()) return p.status();
  if (tear_gap_.count() > 0 && len > 8) {
    // Test hook: the first word is placed, then (after the gap) the rest.
    const auto gap = tear_gap_;
    tear_gap_ = std::chrono::microseconds(0);
    auto first = write(node, offset, src, 8);
    if (first.ok()) {
      Status st = wait(*first, mgr_->impl().op_timeout() + std::chrono::seconds(1));
      if (!st.ok()) first = st;
    }
    std::this_thread::sleep_for(gap);
    auto rest = first.ok()
                    ? write(node, offset + 8, static_cast<const std::byte*>(src) + 8, len - 8)
                    : first;
    tear_gap_ = gap;
    if (!rest.ok()) return rest;
    return *first | *rest;
  }
  auto op = std::make_unique<Op>();
  op->type = OpType::kWrite;
  op->ref = RemoteRef{p->peer, p->key, offset};
  op->buf.resize(len);
  std::memcpy(op->buf.data(), src, len);
  return post(node, std::move(op));
}

Result<AckKey> ChannelThread::read(NodeId node, uint64_t offset, void* dst, size_t len) {
  auto p = mgr_->impl().peer(node);
  if (!p.ok()) return p.status();
  auto op = std::make_unique<Op>();
  op->type = OpType::kRead;
  op->ref = RemoteRef{p->peer, p->key, offset};
  op->dst = dst;
  op->len = len;
  return post(node, std::move(op));
}

Status ChannelThread::read_sync(NodeId node, uint64_t offset, void* dst, size_t len) {
  auto key = read(node, offset, dst, len);
  if (!key.ok()) return key.status();
  return wait(*key, mgr_->impl().op_timeout() + std::chrono::seconds(1));
}

Result<AckKey> ChannelThread::fetch_add(NodeId node, uint64_t offset, uint64_t add,
                                        uint64_t* old_value) {
  auto p = mgr_->impl().peer(node);
  if (!p.ok()) return p.status();
  auto op = std::make_unique<Op>();
  op->type = OpType::kFetchAdd;
  op->ref = RemoteRef{p->peer, p->key, offset};
  op->a = add;
  op->old_value = old_value;
  return post(node, std::move(op));
}

Result<AckKey> ChannelThread::compare_swap(NodeId node, uint64_t offset, uint64_t expected,
                                           uint64_t desired, uint64_t* old_value) {
  auto p = mgr_->impl().peer(node);
  if (!p.ok()) return p.status();
  auto op = std::make_unique<Op>();
  op->type = OpType::kCompareSwap;
  op->ref = RemoteRef{p->peer, p->key, offset};
  op->a = expected;
  op->b = desired;
  op->old_value = old_value;
  return post(node, std::move(op));
}

// ---- Channel -----------------------------------------------------------------------------------

Result<Channel> Channel::Open(ChannelThread& thread, std::string name, std::vector<NodeId> members,
                              size_t slice_bytes) {
  auto& impl = thread.manager().impl();
  auto ep = impl.open_endpoint(name, std::move(members), slice_bytes);
  if (!ep.ok()) return ep.status();
  Channel ch;
  ch.ep_ = *ep;
  // Join every connected member; a member that is not reachable or not open yet joins us later
  // (its own Open sends its JOIN here), and wait_ready() tells when everyone did.
  struct Sent {
    NodeId node;
    AckKey key;
    wire::JoinReply reply;
  };
  std::vector<std::unique_ptr<Sent>> sent;
  wire::JoinRequest req{};
  req.magic = wire::kJoinMagic;
  req.from = impl.config.self;
  req.offset = ch.ep_->offset;
  req.length = slice_bytes;
  req.name_bytes = static_cast<uint16_t>(name.size());
  std::vector<std::byte> bytes(sizeof(req) + name.size());
  std::memcpy(bytes.data(), &req, sizeof(req));
  std::memcpy(bytes.data() + sizeof(req), name.data(), name.size());
  for (NodeId m : ch.ep_->members) {
    if (m == impl.config.self) continue;
    auto p = impl.peer(m);
    if (!p.ok()) continue;
    auto s = std::make_unique<Sent>();
    s->node = m;
    auto op = std::make_unique<ChannelThread::Op>();
    op->type = OpType::kRpc;
    op->ref.peer = p->peer;
    op->imm = RpcImm(wire::kOpJoin);
    op->buf = bytes;
    op->dst = &s->reply;
    op->len = sizeof(s->reply);
    auto key = thread.post(m, std::move(op));
    if (!key.ok()) continue;
    s->key = *key;
    sent.push_back(std::move(s));
  }
  for (auto& s : sent) {
    Status st = thread.wait(s->key, impl.op_timeout() + std::chrono::seconds(1));
    if (!st.ok()) continue;  // wait_ready reports the member if it never joins
    if (s->reply.state == static_cast<uint32_t>(wire::JoinState::kJoined) &&
        s->reply.length == slice_bytes && s->reply.from == s->node) {
      ch.ep_->set_remote(s->node, s->reply.offset);
    }
  }
  return ch;
}

Result<Channel> Channel::Sub(ChannelThread& thread, const std::string& child,
                             size_t slice_bytes) const {
  return Open(thread, ep_->name + "/" + child, ep_->members, slice_bytes);
}

Status Channel::wait_ready(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(ep_->mu);
  const bool ok =
      ep_->cv.wait_for(lock, timeout, [&] { return ep_->remote.size() == ep_->members.size(); });
  if (ok) return Status::OK();
  std::vector<NodeId> missing;
  for (NodeId m : ep_->members) {
    if (!ep_->remote.count(m)) missing.push_back(m);
  }
  return Status::TimedOut("channel '" + ep_->name + "': nodes " + NodeList(missing) +
                          " have not joined within " + std::to_string(timeout.count()) + " ms");
}

const std::string& Channel::name() const {
  return ep_->name;
}
const std::vector<NodeId>& Channel::members() const {
  return ep_->members;
}
std::byte* Channel::local_slice() const {
  return ep_->local;
}
Result<uint64_t> Channel::slice_offset(NodeId node) const {
  std::lock_guard lock(ep_->mu);
  auto it = ep_->remote.find(node);
  if (it == ep_->remote.end()) {
    return Status::FailedPrecondition("channel '" + ep_->name + "': node " + std::to_string(node) +
                                      " has not joined");
  }
  return it->second;
}

}  // namespace farmem::channels
