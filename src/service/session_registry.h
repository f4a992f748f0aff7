// SessionRegistry: farmemd's client sessions (docs/sessions.md). A session is a lease renewed by
// keepalives; allocations made in it are owned by its 16-bit index and freed by the services'
// end listeners when it ends (closed, or lease expired and reaped). Owned by ServiceHost.
// Threads: RPC workers (open/keepalive/close/acquire), the reaper thread, STAT; all thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/node.h"
#include "farmem/status.h"

namespace farmem {

// Owner of an allocation as the services record it: a live session's index, or 0 = persistent.
using SessionIndex = uint16_t;
inline constexpr SessionIndex kPersistentIndex = 0;
inline constexpr uint32_t kMaxSessionsLimit = 65535;  // indices 1..65535

struct SessionOptions {
  uint32_t max_sessions = 4096;  // 1..kMaxSessionsLimit; OPEN beyond: ResourceExhausted
  // The lease granted is the client's request clamped to [ttl_min, ttl_max]; 0 asks ttl_default.
  std::chrono::milliseconds ttl_min{1000};
  std::chrono::milliseconds ttl_max{60000};
  std::chrono::milliseconds ttl_default{10000};
  // How often the reaper looks for expired leases: a dead client's memory is freed within
  // ttl + reap_interval (+ the time its listeners take).
  std::chrono::milliseconds reap_interval{100};
};

// What ending one session freed, summed over the end listeners.
struct SessionFreed {
  uint64_t objects = 0;
  uint64_t raw_bytes = 0;
};

struct SessionGrant {
  uint64_t id = 0;
  SessionIndex index = 0;
  std::chrono::milliseconds ttl{0};
};

struct SessionRegistryStats {
  uint64_t open = 0;  // sessions live now (ending ones included until their listeners ran)
  uint64_t opened_total = 0;
  uint64_t closed_total = 0;          // ended by SESSION_CLOSE
  uint64_t expired_total = 0;         // ended by the reaper
  uint64_t member_expired_total = 0;  // ended because their client's cluster membership expired
  uint64_t refused_total = 0;         // OPEN refused at max_sessions
  uint64_t unknown_total = 0;         // KEEPALIVE/CLOSE/alloc with an unknown or expired session id
  uint64_t objects_freed_total = 0;   // by session end
  uint64_t raw_bytes_freed_total = 0;  // by session end
};

class SessionRegistry;

// Held by an allocation handler while it allocates for a session: the session cannot finish
// ending (its end listeners do not run) while a guard exists, so an allocation either completes
// before the listeners free the session's allocations (and is freed with them) or is refused.
// Move-only. index() is kPersistentIndex for persistent allocations (no session involved).
class SessionGuard {
 public:
  SessionGuard() = default;
  SessionGuard(SessionGuard&& o) noexcept;
  SessionGuard& operator=(SessionGuard&& o) noexcept;
  SessionGuard(const SessionGuard&) = delete;
  SessionGuard& operator=(const SessionGuard&) = delete;
  ~SessionGuard() { Release(); }
  SessionIndex index() const { return index_; }

 private:
  friend class SessionRegistry;
  SessionGuard(SessionRegistry* r, SessionIndex i) : registry_(r), index_(i) {}
  void Release();
  SessionRegistry* registry_ = nullptr;
  SessionIndex index_ = kPersistentIndex;
};

class SessionRegistry {
 public:
  // Frees every allocation owned by `index` and says what it freed. Runs on the thread that ends
  // the session (an RPC worker or the reaper), never with the registry's lock held, never while
  // an allocation for `index` is in flight, and before `index` is given to a new session.
  using EndListener = std::function<SessionFreed(SessionIndex index)>;

  explicit SessionRegistry(SessionOptions options = {});
  ~SessionRegistry();
  SessionRegistry(const SessionRegistry&) = delete;
  SessionRegistry& operator=(const SessionRegistry&) = delete;

  // Before start() (services register at creation).
  void add_end_listener(EndListener listener);
  // Starts / stops the reaper thread (both idempotent). Sessions stay as they are on stop: a
  // stopping server does not free memory it is about to unmap anyway.
  void start();
  void stop();

  const SessionOptions& options() const { return options_; }

  // OPEN: a new session. ResourceExhausted at max_sessions. `cluster_member`: `label` is the
  // client's cluster member name, and end_member(label) ends the session.
  Result<SessionGrant> open(std::chrono::milliseconds requested_ttl, std::string_view label,
                            bool cluster_member = false);
  // KEEPALIVE: renews the lease. NotFound when unknown, ending or expired.
  Status keepalive(uint64_t session_id);
  // CLOSE: ends the session now (runs the end listeners). NotFound like keepalive.
  Result<SessionFreed> close(uint64_t session_id);
  // For an allocation: id 0 gives a persistent guard; otherwise the session must be live and
  // its lease not run out (NotFound "session ... expired or unknown").
  Result<SessionGuard> acquire(uint64_t session_id);
  // Ends every session opened as cluster member `member` (its membership lease expired: the
  // client is dead even if its session lease has time left); returns how many.
  size_t end_member(std::string_view member);
  // Ends every session whose lease ran out by `now`; returns how many. The reaper calls it.
  size_t reap(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

  SessionRegistryStats stats() const;
  // The STAT "sessions" section (docs/server.md).
  nlohmann::json stats_json() const;

  // The SESSION_* RPC handlers (session_wire.h): decode and check, act, encode the reply.
  Status ServeOpen(const RpcCall& call, std::vector<std::byte>& reply);
  Status ServeKeepalive(const RpcCall& call, std::vector<std::byte>& reply);
  Status ServeClose(const RpcCall& call, std::vector<std::byte>& reply);

 private:
  friend class SessionGuard;
  enum class State : uint8_t { kFree, kOpen, kEnding };
  struct Slot {
    State state = State::kFree;
    uint64_t id = 0;
    uint32_t guards = 0;  // allocations in flight
    std::chrono::milliseconds ttl{0};
    std::chrono::steady_clock::time_point deadline;
    std::string label;
    bool cluster_member = false;  // label is a cluster member name (end_member)
  };
  enum class EndReason { kClosed, kExpired, kMemberExpired };

  // Ends the session in `index` if it still has id `id`: marks it ending (no acquire, keepalive
  // or close succeeds from here on), waits for its guards, runs the listeners, frees the index.
  Result<SessionFreed> End(SessionIndex index, uint64_t id, EndReason reason);
  void ReleaseGuard(SessionIndex index);
  uint64_t NewId();  // caller holds mu_
  void ReaperLoop();

  const SessionOptions options_;
  std::vector<EndListener> listeners_;  // fixed once start() ran

  mutable std::mutex mu_;
  std::condition_variable guards_cv_;  // a guard was released
  std::vector<Slot> slots_;            // [0] unused (persistent)
  // Free indices, reused oldest first so an index is idle as long as possible between sessions.
  std::deque<SessionIndex> free_;
  std::unordered_map<uint64_t, SessionIndex> by_id_;  // live (kOpen) sessions only
  uint64_t rng_state_;
  SessionRegistryStats stats_;

  std::mutex reaper_mu_;
  std::condition_variable reaper_cv_;
  bool reaper_stop_ = false;
  std::thread reaper_;
};

}  // namespace farmem
