// SessionKeeper: SESSION_OPEN / KEEPALIVE / CLOSE from the client side (wire: session_wire.h).
#include "node/session_keeper.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/log.h"
#include "node/session_wire.h"

namespace farmem {

namespace wire = session_wire;

SessionKeeper::SessionKeeper(Node& node, SessionKeeperOptions options)
    : node_(node),
      options_(std::move(options)),
      blocking_(node, options_.owner.empty() ? "SessionKeeper" : options_.owner) {}

SessionKeeper::~SessionKeeper() {
  close();
}

Task<Result<SessionKeeper::Session>> SessionKeeper::OpenRpc(Scheduler& sched, PeerId peer) {
  wire::OpenRequest req{};
  req.ttl_ms = static_cast<uint32_t>(std::clamp<int64_t>(options_.ttl.count(), 0, UINT32_MAX));
  const std::string& label = !options_.cluster_member.empty() ? options_.cluster_member
                             : options_.label.empty()         ? node_.config().name
                                                              : options_.label;
  if (!options_.cluster_member.empty()) req.flags = wire::kOpenFlagClusterMember;
  std::memcpy(req.label, label.data(), std::min(label.size(), wire::kLabelBytes));
  Result<wire::OpenReply> r =
      co_await CallStruct<wire::OpenReply>(sched, peer, wire::kOpOpen, req, "SESSION_OPEN");
  if (!r.ok()) co_return r.status();
  if (r->session_id == wire::kPersistentSession || r->ttl_ms == 0) {
    co_return Status::Protocol("SESSION_OPEN: server granted session 0 or a zero lease");
  }
  co_return Session{r->session_id, std::chrono::milliseconds(r->ttl_ms)};
}

Status SessionKeeper::open(PeerId peer) {
  Result<Session> s = blocking_.run([&](Scheduler& sched) { return OpenRpc(sched, peer); });
  if (!s.ok()) return s.status();
  std::lock_guard lock(mu_);
  if (closing_) return Status::FailedPrecondition("session keeper is closed");
  sessions_[peer] = *s;
  ++stats_.opened;
  if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
  cv_.notify_all();  // the interval may have become shorter
  return Status::OK();
}

uint64_t SessionKeeper::session_id(PeerId peer) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(peer);
  return it == sessions_.end() ? wire::kPersistentSession : it->second.id;
}

std::chrono::milliseconds SessionKeeper::granted_ttl(PeerId peer) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(peer);
  return it == sessions_.end() ? std::chrono::milliseconds(0) : it->second.ttl;
}

SessionClientStats SessionKeeper::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

Task<Result<uint64_t>> SessionKeeper::renew(Scheduler& sched, PeerId peer, uint64_t stale) {
  {
    std::lock_guard lock(mu_);
    if (closing_) co_return Status::FailedPrecondition("session keeper is closed");
    auto it = sessions_.find(peer);
    if (it != sessions_.end() && it->second.id != stale) co_return it->second.id;
  }
  Result<Session> s = co_await OpenRpc(sched, peer);
  if (!s.ok()) co_return s.status();
  std::lock_guard lock(mu_);
  Session& cur = sessions_[peer];
  // Two renewals at once open two sessions; the first one stored wins and the other, which owns
  // nothing, simply expires on the server.
  if (cur.id == stale || cur.id == wire::kPersistentSession) {
    FARMEM_LOG_WARN(
        "{}: session with peer {} was lost (lease expired); its allocations are "
        "freed; opened a new one",
        options_.owner, peer);
    cur = *s;
    ++stats_.lost;
    ++stats_.opened;
  }
  co_return cur.id;
}

std::chrono::milliseconds SessionKeeper::Interval() const {
  // A third of the shortest lease: two keepalives may be lost (or late) before it runs out.
  std::chrono::milliseconds ttl = std::chrono::milliseconds::max();
  for (const auto& [peer, s] : sessions_) ttl = std::min(ttl, s.ttl);
  if (sessions_.empty()) return std::chrono::milliseconds(1000);
  return std::max(std::chrono::milliseconds(10), ttl / 3);
}

void SessionKeeper::KeepaliveRound(Scheduler& sched) {
  std::vector<std::pair<PeerId, uint64_t>> todo;
  std::chrono::milliseconds interval;
  {
    std::lock_guard lock(mu_);
    for (const auto& [peer, s] : sessions_) {
      if (!in_flight_.contains(peer)) todo.emplace_back(peer, s.id);
    }
    interval = Interval();
  }
  // All at once, and driven for one interval at most: sent one after another and awaited, a
  // server that hangs (each keepalive waits for the transport's operation timeout) held back every
  // other session's renewal past its lease. A call still pending after the interval stays in
  // flight and is driven again next round.
  for (const auto& [peer, id] : todo) {
    in_flight_.insert(peer);
    sched.spawn(KeepaliveOne(sched, peer, id));
  }
  (void)sched.run(interval);  // TimedOut = some keepalive still pending: fine
}

Task<void> SessionKeeper::KeepaliveOne(Scheduler& sched, PeerId peer, uint64_t id) {
  std::byte none[1];
  const std::vector<std::byte> req = EncodeStruct(wire::KeepaliveRequest{id});
  Result<std::span<const std::byte>> r =
      co_await CallRpc(sched, peer, wire::kOpKeepalive, req, none, "SESSION_KEEPALIVE");
  struct Done {
    std::set<PeerId>& in_flight;
    PeerId peer;
    ~Done() { in_flight.erase(peer); }
  } done{in_flight_, peer};
  if (r.ok()) {
    std::lock_guard lock(mu_);
    ++stats_.keepalives;
    co_return;
  }
  if (r.status().code() != Code::kNotFound) {
    // Timeout or peer gone: keep the session and try again next round; if the lease runs out
    // meanwhile the next keepalive is NotFound and we re-open.
    FARMEM_LOG_DEBUG("{}: {}", options_.owner, r.status().ToString());
    std::lock_guard lock(mu_);
    ++stats_.keepalive_errors;
    co_return;
  }
  Result<uint64_t> fresh = co_await renew(sched, peer, id);
  if (!fresh.ok()) {
    FARMEM_LOG_WARN("{}: re-opening the lost session with peer {}: {}", options_.owner, peer,
                    fresh.status().ToString());
  }
}

void SessionKeeper::Run() {
  Result<std::unique_ptr<Scheduler>> sched = node_.make_scheduler();
  if (!sched.ok()) {
    FARMEM_LOG_ERROR("{}: no scheduler for keepalives: {}", options_.owner,
                     sched.status().ToString());
    return;
  }
  std::unique_lock lock(mu_);
  auto next = std::chrono::steady_clock::now() + Interval();
  while (!closing_) {
    cv_.wait_until(lock, next);
    if (closing_) break;
    if (std::chrono::steady_clock::now() < next) {
      // Woken by open(): a new session may have a shorter lease.
      next = std::min(next, std::chrono::steady_clock::now() + Interval());
      continue;
    }
    const auto round_start = std::chrono::steady_clock::now();
    lock.unlock();
    KeepaliveRound(**sched);
    lock.lock();
    // A round that ran a whole interval (a keepalive still pending) starts the next one at once.
    next = round_start + Interval();
  }
  lock.unlock();
  // Keepalives still pending end by the transport's operation timeout; the scheduler must not
  // go away under them.
  (void)(*sched)->run(std::chrono::minutes(5));
}

void SessionKeeper::close() {
  std::map<PeerId, Session> sessions;
  {
    std::lock_guard lock(mu_);
    if (closing_) return;
    closing_ = true;
    sessions.swap(sessions_);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (const auto& entry : sessions) {
    const PeerId peer = entry.first;
    const uint64_t id = entry.second.id;
    Result<wire::CloseReply> r = blocking_.run([&](Scheduler& sched) {
      return CallStruct<wire::CloseReply>(sched, peer, wire::kOpClose, wire::CloseRequest{id},
                                          "SESSION_CLOSE");
    });
    if (!r.ok()) {
      // The server is gone or already ended the session: either way nothing is left to free
      // here (a live server frees it when the lease runs out).
      FARMEM_LOG_DEBUG("{}: {}", options_.owner, r.status().ToString());
    }
  }
}

}  // namespace farmem
