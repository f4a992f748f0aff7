// SessionRegistry: session table, lease bookkeeping, the guard/end handshake with allocation
// handlers, the reaper thread, and the SESSION_* RPC handlers (wire: node/session_wire.h).
#include "service/session_registry.h"

#include <algorithm>
#include <random>

#include "common/log.h"
#include "common/wire_struct.h"
#include "node/session_wire.h"

namespace farmem {

namespace wire = session_wire;
using Clock = std::chrono::steady_clock;

SessionGuard::SessionGuard(SessionGuard&& o) noexcept
    : registry_(std::exchange(o.registry_, nullptr)), index_(std::exchange(o.index_, 0)) {}

SessionGuard& SessionGuard::operator=(SessionGuard&& o) noexcept {
  if (this != &o) {
    Release();
    registry_ = std::exchange(o.registry_, nullptr);
    index_ = std::exchange(o.index_, 0);
  }
  return *this;
}

void SessionGuard::Release() {
  if (registry_ != nullptr && index_ != kPersistentIndex) registry_->ReleaseGuard(index_);
  registry_ = nullptr;
  index_ = kPersistentIndex;
}

SessionRegistry::SessionRegistry(SessionOptions options)
    : options_(std::move(options)),
      slots_(std::clamp<uint32_t>(options_.max_sessions, 1, kMaxSessionsLimit) + 1) {
  for (size_t i = 1; i < slots_.size(); ++i) free_.push_back(static_cast<SessionIndex>(i));
  // Session ids are capabilities of sorts (knowing one lets a peer keep or end that session), so
  // they are unpredictable: seeded from the OS, then a SplitMix64 sequence.
  std::random_device rd;
  rng_state_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

SessionRegistry::~SessionRegistry() {
  stop();
}

void SessionRegistry::add_end_listener(EndListener listener) {
  listeners_.push_back(std::move(listener));
}

void SessionRegistry::start() {
  std::lock_guard lock(reaper_mu_);
  if (reaper_.joinable()) return;
  reaper_stop_ = false;
  reaper_ = std::thread([this] { ReaperLoop(); });
}

void SessionRegistry::stop() {
  {
    std::lock_guard lock(reaper_mu_);
    reaper_stop_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
}

void SessionRegistry::ReaperLoop() {
  std::unique_lock lock(reaper_mu_);
  while (!reaper_stop_) {
    reaper_cv_.wait_for(lock, options_.reap_interval, [this] { return reaper_stop_; });
    if (reaper_stop_) break;
    lock.unlock();
    reap();
    lock.lock();
  }
}

uint64_t SessionRegistry::NewId() {
  for (;;) {
    uint64_t z = (rng_state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    if (z != wire::kPersistentSession && !by_id_.contains(z)) return z;
  }
}

Result<SessionGrant> SessionRegistry::open(std::chrono::milliseconds requested_ttl,
                                           std::string_view label, bool cluster_member) {
  std::chrono::milliseconds ttl = requested_ttl.count() <= 0 ? options_.ttl_default : requested_ttl;
  ttl = std::clamp(ttl, options_.ttl_min, std::max(options_.ttl_min, options_.ttl_max));
  std::lock_guard lock(mu_);
  if (free_.empty()) {
    ++stats_.refused_total;
    return Status::ResourceExhausted("too many sessions open (--max-sessions " +
                                     std::to_string(slots_.size() - 1) + ")");
  }
  const SessionIndex index = free_.front();
  free_.pop_front();
  Slot& s = slots_[index];
  s.state = State::kOpen;
  s.id = NewId();
  s.guards = 0;
  s.ttl = ttl;
  s.deadline = Clock::now() + ttl;
  s.label.assign(label.substr(0, wire::kLabelBytes));
  s.cluster_member = cluster_member;
  by_id_.emplace(s.id, index);
  ++stats_.open;
  ++stats_.opened_total;
  return SessionGrant{s.id, index, ttl};
}

Status SessionRegistry::keepalive(uint64_t session_id) {
  std::lock_guard lock(mu_);
  auto it = by_id_.find(session_id);
  const Clock::time_point now = Clock::now();
  if (it == by_id_.end() || slots_[it->second].deadline <= now) {
    ++stats_.unknown_total;
    return Status::NotFound("session expired or unknown (its allocations are freed)");
  }
  Slot& s = slots_[it->second];
  s.deadline = now + s.ttl;
  return Status::OK();
}

Result<SessionFreed> SessionRegistry::close(uint64_t session_id) {
  SessionIndex index = 0;
  {
    std::lock_guard lock(mu_);
    auto it = by_id_.find(session_id);
    if (it == by_id_.end()) {
      ++stats_.unknown_total;
      return Status::NotFound("session expired or unknown (its allocations are freed)");
    }
    index = it->second;
  }
  return End(index, session_id, EndReason::kClosed);
}

Result<SessionGuard> SessionRegistry::acquire(uint64_t session_id) {
  if (session_id == wire::kPersistentSession) return SessionGuard();
  std::lock_guard lock(mu_);
  auto it = by_id_.find(session_id);
  if (it == by_id_.end() || slots_[it->second].deadline <= Clock::now()) {
    ++stats_.unknown_total;
    return Status::NotFound("session expired or unknown: allocate in a new session");
  }
  ++slots_[it->second].guards;
  return SessionGuard(this, it->second);
}

void SessionRegistry::ReleaseGuard(SessionIndex index) {
  bool wake = false;
  {
    std::lock_guard lock(mu_);
    Slot& s = slots_[index];
    --s.guards;
    wake = s.guards == 0 && s.state == State::kEnding;
  }
  if (wake) guards_cv_.notify_all();
}

size_t SessionRegistry::reap(Clock::time_point now) {
  std::vector<std::pair<SessionIndex, uint64_t>> expired;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, index] : by_id_) {
      if (slots_[index].deadline <= now) expired.emplace_back(index, id);
    }
  }
  size_t n = 0;
  for (const auto& [index, id] : expired) {
    if (End(index, id, EndReason::kExpired).ok()) ++n;
  }
  return n;
}

size_t SessionRegistry::end_member(std::string_view member) {
  std::vector<std::pair<SessionIndex, uint64_t>> doomed;
  {
    std::lock_guard lock(mu_);
    for (const auto& [id, index] : by_id_) {
      const Slot& s = slots_[index];
      if (s.cluster_member && s.label == member) doomed.emplace_back(index, id);
    }
  }
  size_t n = 0;
  for (const auto& [index, id] : doomed) {
    if (End(index, id, EndReason::kMemberExpired).ok()) ++n;
  }
  return n;
}

Result<SessionFreed> SessionRegistry::End(SessionIndex index, uint64_t id, EndReason reason) {
  std::string label;
  {
    std::unique_lock lock(mu_);
    Slot& s = slots_[index];
    // Whoever flips kOpen -> kEnding ends the session; a concurrent close/reap finds it gone.
    if (s.state != State::kOpen || s.id != id) {
      return Status::NotFound("session expired or unknown (its allocations are freed)");
    }
    s.state = State::kEnding;
    by_id_.erase(id);
    // No new guard can be taken (acquire looks in by_id_); wait for the allocations in flight.
    guards_cv_.wait(lock, [&s] { return s.guards == 0; });
    label = s.label;
  }
  SessionFreed freed;
  for (const EndListener& l : listeners_) {
    const SessionFreed f = l(index);
    freed.objects += f.objects;
    freed.raw_bytes += f.raw_bytes;
  }
  {
    std::lock_guard lock(mu_);
    Slot& s = slots_[index];
    s = Slot{};
    free_.push_back(index);
    --stats_.open;
    ++(reason == EndReason::kClosed    ? stats_.closed_total
       : reason == EndReason::kExpired ? stats_.expired_total
                                       : stats_.member_expired_total);
    stats_.objects_freed_total += freed.objects;
    stats_.raw_bytes_freed_total += freed.raw_bytes;
  }
  // An expiry means a client vanished without closing: worth a line. A close is routine.
  if (reason != EndReason::kClosed) {
    FARMEM_LOG_INFO("session {} ('{}') {}: freed {} objects, {} raw bytes", index, label,
                    reason == EndReason::kExpired ? "expired" : "ended (cluster member expired)",
                    freed.objects, freed.raw_bytes);
  } else {
    FARMEM_LOG_DEBUG("session {} ('{}') closed: freed {} objects, {} raw bytes", index, label,
                     freed.objects, freed.raw_bytes);
  }
  return freed;
}

SessionRegistryStats SessionRegistry::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

nlohmann::json SessionRegistry::stats_json() const {
  const SessionRegistryStats s = stats();
  return {{"open", s.open},
          {"max", slots_.size() - 1},
          {"ttl_min_ms", options_.ttl_min.count()},
          {"ttl_max_ms", options_.ttl_max.count()},
          {"ttl_default_ms", options_.ttl_default.count()},
          {"opened_total", s.opened_total},
          {"closed_total", s.closed_total},
          {"expired_total", s.expired_total},
          {"member_expired_total", s.member_expired_total},
          {"refused_total", s.refused_total},
          {"unknown_total", s.unknown_total},
          {"objects_freed_total", s.objects_freed_total},
          {"raw_bytes_freed_total", s.raw_bytes_freed_total}};
}

namespace {
Status WrongSize(const char* what, size_t want, size_t got) {
  return Status::Protocol(std::string(what) + " request must be " + std::to_string(want) +
                          " bytes, got " + std::to_string(got));
}
}  // namespace

Status SessionRegistry::ServeOpen(const RpcCall& call, std::vector<std::byte>& reply) {
  auto req = DecodeStruct<wire::OpenRequest>(call.request);
  if (!req) return WrongSize("SESSION_OPEN", sizeof(wire::OpenRequest), call.request.size());
  if ((req->flags & ~wire::kOpenKnownFlags) != 0) {
    return Status::InvalidArgument("SESSION_OPEN: unknown flags " + std::to_string(req->flags));
  }
  FARMEM_ASSIGN_OR_RETURN(SessionGrant g,
                          open(std::chrono::milliseconds(req->ttl_ms), wire::LabelOf(*req),
                               (req->flags & wire::kOpenFlagClusterMember) != 0));
  FARMEM_LOG_DEBUG("session {} opened by {} ('{}'), ttl {} ms", g.index, call.source,
                   wire::LabelOf(*req), g.ttl.count());
  reply = EncodeStruct(wire::OpenReply{g.id, static_cast<uint32_t>(g.ttl.count()), 0});
  return Status::OK();
}

Status SessionRegistry::ServeKeepalive(const RpcCall& call, std::vector<std::byte>& reply) {
  auto req = DecodeStruct<wire::KeepaliveRequest>(call.request);
  if (!req) {
    return WrongSize("SESSION_KEEPALIVE", sizeof(wire::KeepaliveRequest), call.request.size());
  }
  reply.clear();
  return keepalive(req->session_id);
}

Status SessionRegistry::ServeClose(const RpcCall& call, std::vector<std::byte>& reply) {
  auto req = DecodeStruct<wire::CloseRequest>(call.request);
  if (!req) return WrongSize("SESSION_CLOSE", sizeof(wire::CloseRequest), call.request.size());
  FARMEM_ASSIGN_OR_RETURN(SessionFreed f, close(req->session_id));
  reply = EncodeStruct(wire::CloseReply{f.objects, f.raw_bytes});
  return Status::OK();
}

}  // namespace farmem
