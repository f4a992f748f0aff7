// SessionKeeper: the client half of farmemd's sessions (docs/sessions.md), written once for every
// client (RawClient, ObjectClient): opens one session per server, renews the leases from a
// background thread with its own scheduler (every ttl/3), re-opens a session the server no longer
// knows (lease lost: its allocations are gone), and closes everything on destruction.
// Threads: any caller thread (open/session_id/renew/stats) and the keeper's own thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "farmem/coro.h"
#include "farmem/node.h"
#include "farmem/session.h"
#include "farmem/status.h"
#include "node/rpc_call.h"

namespace farmem {

struct SessionKeeperOptions {
  // Lease asked for; the server grants it clamped to [1 s, its --session-ttl-max]. A client that
  // stops (killed, paused, partitioned) loses its session allocations this long after its last
  // keepalive.
  std::chrono::milliseconds ttl{10000};
  std::string label;  // shown in the server's logs; default: the node's name
  std::string owner;  // for this side's logs ("RawClient")
  // The client's cluster member name (label), so that the server ends the sessions as soon as
  // that membership expires (session_wire::kOpenFlagClusterMember); empty = not a member.
  std::string cluster_member;
};

class SessionKeeper {
 public:
  SessionKeeper(Node& node, SessionKeeperOptions options);
  ~SessionKeeper();  // close()
  SessionKeeper(const SessionKeeper&) = delete;
  SessionKeeper& operator=(const SessionKeeper&) = delete;

  // Opens a session with `peer` (a connected farmemd) and keeps it alive from then on. Blocking.
  Status open(PeerId peer);
  // The id to put in allocation requests for `peer`: its current session (0 if none, i.e. open
  // failed or the keeper is closed — such allocations would be persistent, so callers refuse).
  uint64_t session_id(PeerId peer) const;
  // After the server refused an allocation naming session `stale` (NotFound: the lease ran out
  // before the keeper noticed): opens a fresh session unless another thread already did, and
  // returns the id to retry with. Runs on the caller's scheduler.
  Task<Result<uint64_t>> renew(Scheduler& sched, PeerId peer, uint64_t stale);
  // Stops the keepalive thread and closes every session (each CLOSE bounded by the transport's
  // operation timeout, so a dead server delays this but never hangs it). Idempotent.
  void close();

  SessionClientStats stats() const;
  // The lease the server granted for `peer` (0 if no session).
  std::chrono::milliseconds granted_ttl(PeerId peer) const;

 private:
  struct Session {
    uint64_t id = 0;
    std::chrono::milliseconds ttl{0};
  };
  // SESSION_OPEN on `sched`; does not touch sessions_.
  Task<Result<Session>> OpenRpc(Scheduler& sched, PeerId peer);
  // One round: a keepalive for each session that has none in flight, all at once, then drives
  // them for at most one interval. A server that does not answer keeps only its own keepalive
  // pending (until the transport's operation timeout); the others' renewals go on meanwhile.
  // Keeper thread only.
  void KeepaliveRound(Scheduler& sched);
  // One keepalive; NotFound re-opens. Removes `peer` from in_flight_ when done.
  Task<void> KeepaliveOne(Scheduler& sched, PeerId peer, uint64_t id);
  void Run();
  std::chrono::milliseconds Interval() const;  // caller holds mu_

  Node& node_;
  const SessionKeeperOptions options_;
  BlockingRunner blocking_;  // open() and close()

  mutable std::mutex mu_;
  std::condition_variable cv_;  // wakes the thread on close()
  bool closing_ = false;
  std::map<PeerId, Session> sessions_;
  SessionClientStats stats_;
  std::thread thread_;          // started by the first open()
  std::set<PeerId> in_flight_;  // keeper thread only: peers with a keepalive pending
};

}  // namespace farmem
