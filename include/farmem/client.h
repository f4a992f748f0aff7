// RawClient: the client side of farmemd's raw allocation RPCs (ALLOC_RAW / FREE_RAW / STAT).
// It only manages ranges; data access uses the Scheduler's one-sided read/write/CAS/FAA on the
// returned RemoteRef, which is the whole point of disaggregated memory. It holds a session with
// the server (docs/sessions.md): ranges it allocates are freed when the client goes away unless
// allocated Lifetime::kPersistent.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "farmem/coro.h"
#include "farmem/node.h"
#include "farmem/session.h"
#include "farmem/status.h"

namespace farmem {

class BlockingRunner;
class SessionKeeper;

// A range granted by ALLOC_RAW: `ref` addresses its first byte (usable with any Scheduler of the
// node the client was connected through); `length` is the usable size (requested, rounded up to
// 64 bytes).
struct RawAllocation {
  RemoteRef ref;
  uint64_t length = 0;
  // Lifetime::kPersistent: survives the client. Otherwise the server frees it when the client's
  // session ends (the client is destroyed, or stops renewing its lease).
  bool persistent = false;
};

struct RawClientOptions {
  // Session lease asked for (docs/sessions.md): the server frees this client's session ranges
  // this long after its last keepalive (granted within [1 s, the server's --session-ttl-max]).
  std::chrono::milliseconds session_ttl{10000};
  // false: no session (tools that only read STAT); Lifetime::kSession allocations then fail
  // with FailedPrecondition, persistent ones work.
  bool open_session = true;
  // This process's cluster member name (Cluster::join), if any: a farmemd running with --cluster
  // then ends the session as soon as the membership expires (docs/sessions.md).
  std::string cluster_member;
};

class RawClient {
 public:
  // Bootstrap handshake (token check) with the farmemd at "host:port" through `node`, which must
  // be started and must outlive the client, then SESSION_OPEN; a background thread keeps the
  // session alive until the client is destroyed.
  static Result<std::unique_ptr<RawClient>> Connect(Node& node, std::string_view bootstrap_address,
                                                    RawClientOptions options = {});
  // Closes the session: the server frees every range this client allocated with
  // Lifetime::kSession and did not free (bounded by the transport's operation timeout).
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  // The server as learned at the handshake (name, addresses, peer id).
  const PeerInfo& server() const { return server_; }

  // Coroutine versions: run on the caller's scheduler, many may be in flight at once.
  // kSession ranges are freed when this client's session ends; if the lease was lost meanwhile
  // (the client was stalled longer than its TTL) a new session is opened and the call retried.
  Task<Result<RawAllocation>> alloc_raw(Scheduler& sched, uint64_t length,
                                        Lifetime lifetime = Lifetime::kSession);
  Task<Status> free_raw(Scheduler& sched, RemoteRef ref);
  // The server's STAT document as JSON text (an object; keys in docs/server.md).
  Task<Result<std::string>> stats_json(Scheduler& sched);

  // Blocking versions: thread-safe; they share one internal scheduler, one call at a time.
  Result<RawAllocation> alloc_raw(uint64_t length, Lifetime lifetime = Lifetime::kSession);
  Status free_raw(const RemoteRef& ref);
  Result<std::string> stats_json();

  // The session's counters (keepalives, leases lost) and the lease the server granted.
  SessionClientStats session_stats() const;
  std::chrono::milliseconds session_ttl() const;
  // The current session's id (changes when a lost session is replaced); for logs and tests.
  uint64_t session_id() const;

 private:
  RawClient(Node& node, PeerInfo server, RawClientOptions options);

  Node& node_;
  PeerInfo server_;
  std::unique_ptr<BlockingRunner> blocking_;  // the blocking calls' scheduler
  std::unique_ptr<SessionKeeper> sessions_;
};

}  // namespace farmem
