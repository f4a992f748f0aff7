// RawClient: the client side of farmemd's raw allocation RPCs (ALLOC_RAW / FREE_RAW / STAT).
// It only manages ranges; data access uses the Scheduler's one-sided read/write/CAS/FAA on the
// returned RemoteRef, which is the whole point of disaggregated memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "farmem/coro.h"
#include "farmem/node.h"
#include "farmem/status.h"

namespace farmem {

class BlockingRunner;

// A range granted by ALLOC_RAW: `ref` addresses its first byte (usable with any Scheduler of the
// node the client was connected through); `length` is the usable size (requested, rounded up to
// 64 bytes).
struct RawAllocation {
  RemoteRef ref;
  uint64_t length = 0;
};

class RawClient {
 public:
  // Bootstrap handshake (token check) with the farmemd at "host:port" through `node`, which must
  // be started and must outlive the client.
  static Result<std::unique_ptr<RawClient>> Connect(Node& node, std::string_view bootstrap_address);
  ~RawClient();
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  // The server as learned at the handshake (name, addresses, peer id).
  const PeerInfo& server() const { return server_; }

  // Coroutine versions: run on the caller's scheduler, many may be in flight at once.
  Task<Result<RawAllocation>> alloc_raw(Scheduler& sched, uint64_t length);
  Task<Status> free_raw(Scheduler& sched, RemoteRef ref);
  // The server's STAT document as JSON text (an object; keys in docs/server.md).
  Task<Result<std::string>> stats_json(Scheduler& sched);

  // Blocking versions: thread-safe; they share one internal scheduler, one call at a time.
  Result<RawAllocation> alloc_raw(uint64_t length);
  Status free_raw(const RemoteRef& ref);
  Result<std::string> stats_json();

 private:
  RawClient(Node& node, PeerInfo server);

  Node& node_;
  PeerInfo server_;
  std::unique_ptr<BlockingRunner> blocking_;  // the blocking calls' scheduler
};

}  // namespace farmem
