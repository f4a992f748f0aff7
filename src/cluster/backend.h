// ClusterBackend: the store behind Cluster — a revisioned key-value store with leases and
// prefix watches, the subset of etcd's v3 API farmem uses. Keys here are absolute
// ("/farmem/<cluster>/..."); Cluster (cluster.cc) adds the namespace, validation and membership.
// Implementations: memory_backend.cc (in-process) and etcd_backend.cc (etcd v3 JSON gateway).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "farmem/cluster.h"
#include "farmem/status.h"

namespace farmem::cluster {

using Clock = std::chrono::steady_clock;

struct BackendKv {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t lease = 0;  // 0: not bound to a lease
};

struct BackendEvent {
  bool is_delete = false;
  BackendKv kv;  // for a delete: key and mod_revision (the revision of the delete)
};

struct BackendRange {
  std::vector<BackendKv> kvs;  // sorted by key
  int64_t revision = 0;        // the store's revision the range was read at
};

// A condition of ClusterBackend::txn: the key holds `value`, or is absent (nullopt).
struct BackendCompare {
  std::string key;
  std::optional<std::string> value;
};
// A write of ClusterBackend::txn (keys unbound from any lease). remove: absent is fine.
struct BackendOp {
  bool remove = false;
  std::string key;
  std::string value;
};

// Called with the events of one revision (or several consecutive ones), in revision order, one
// call at a time per watch, on a thread of the backend's.
using BackendWatchCallback = std::function<void(const std::vector<BackendEvent>&)>;

// Every call takes a deadline: past it the call returns TimedOut/Unavailable, never blocks.
// Unreachable store: Unavailable. Thread-safe.
class ClusterBackend {
 public:
  virtual ~ClusterBackend() = default;

  // "memory" or "etcd" (for messages and STAT).
  virtual std::string_view kind() const = 0;

  // NotFound if absent.
  virtual Result<BackendKv> get(std::string_view key, Clock::time_point deadline) = 0;
  // Every key starting with `prefix`.
  virtual Result<BackendRange> range(std::string_view prefix, Clock::time_point deadline) = 0;
  // expected_mod_revision: nullopt = unconditional; 0 = only if absent; else only if the key's
  // mod_revision equals it (FailedPrecondition otherwise, nothing written). lease 0 = unbound;
  // an unknown/expired lease is NotFound. Returns the revision of the write.
  virtual Result<int64_t> put(std::string_view key, std::string_view value, int64_t lease,
                              std::optional<int64_t> expected_mod_revision,
                              Clock::time_point deadline) = 0;
  // NotFound if absent. Returns the revision of the delete.
  virtual Result<int64_t> remove(std::string_view key, Clock::time_point deadline) = 0;
  // If every compare holds, applies every op in one revision (returned); else FailedPrecondition
  // and nothing is written. Keys in `ops` are distinct (the caller checks).
  virtual Result<int64_t> txn(const std::vector<BackendCompare>& compares,
                              const std::vector<BackendOp>& ops, Clock::time_point deadline) = 0;
  // The store's current revision.
  virtual Result<int64_t> revision(Clock::time_point deadline) = 0;

  // Leases. ttl is rounded up to what the store supports (etcd: whole seconds, at least 1 s).
  virtual Result<int64_t> lease_grant(std::chrono::milliseconds ttl,
                                      Clock::time_point deadline) = 0;
  // Renews; returns the TTL granted again. NotFound if the lease is gone (expired/revoked).
  virtual Result<std::chrono::milliseconds> lease_keepalive(int64_t lease,
                                                            Clock::time_point deadline) = 0;
  // Remaining time; NotFound if the lease is gone.
  virtual Result<std::chrono::milliseconds> lease_time_left(int64_t lease,
                                                            Clock::time_point deadline) = 0;
  // Deletes every key bound to it. NotFound if already gone.
  virtual Status lease_revoke(int64_t lease, Clock::time_point deadline) = 0;

  // Events for keys under `prefix` with revision >= from_revision (0: after the current one).
  // A backend that loses its store resumes after the last revision it delivered (never missing or
  // repeating an event); if that revision was compacted away it calls on_error once
  // (FailedPrecondition "... compacted ...") and stops.
  // The returned handle's cancel()/destructor waits for a running callback unless called from
  // that callback itself.
  virtual Result<std::unique_ptr<ClusterWatch>> watch(std::string_view prefix,
                                                      int64_t from_revision,
                                                      BackendWatchCallback on_events,
                                                      ClusterWatchErrorCallback on_error) = 0;
};

// memory://NAME: every Open of the same NAME in one process shares one store (so an embedded
// farmemd and the client in `farmem demo` see each other); it lives while any backend holds it.
Result<std::unique_ptr<ClusterBackend>> OpenMemoryBackend(std::string_view name,
                                                          const ClusterOptions& options);

// etcd://host:port[,host:port...] (etcds:// for TLS): the endpoints are tried in order; a call
// moves to the next endpoint when one is unreachable.
Result<std::unique_ptr<ClusterBackend>> OpenEtcdBackend(const std::vector<std::string>& endpoints,
                                                        bool tls, const ClusterOptions& options);

}  // namespace farmem::cluster
