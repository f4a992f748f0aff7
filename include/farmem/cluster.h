// Cluster: the control plane every multi-node design shares — who is in the cluster (members held
// by leases), where a named thing lives (a small metadata store with compare-and-set) and who died
// (watches). Backends by URL: memory://NAME (in-process, one store per NAME per process) and
// etcd://host:port[,host:port...] (etcd's v3 API). Model, key layout and failures: docs/cluster.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "farmem/status.h"

namespace farmem {

class ClusterBackend;  // src/cluster/backend.h

// How to reach the control plane. Everything but `url` has a default that runs on one machine.
struct ClusterOptions {
  // "memory://NAME" or "etcd://host:port[,host:port...]" ("etcds://" for TLS).
  std::string url;
  // Every key lives under "/farmem/<cluster_name>/": two clusters can share one etcd.
  // [A-Za-z0-9_.-]{1,64}.
  std::string cluster_name = "default";
  // A cluster exists once something created it (its "/farmem/<name>/cluster" key). Open fails
  // with NotFound (naming the clusters that do exist) for an unknown name unless this is set;
  // farmemd and `farmem cluster up` set it, read-only tools do not, so a typo is an error.
  bool create_if_missing = false;
  // Membership lease: a member that stops renewing vanishes after this long. etcd rounds it up
  // to whole seconds; at least 1 s.
  std::chrono::milliseconds lease_ttl{5000};
  // Deadline of every control-plane call (get, put, members, ...): past it the call returns
  // Unavailable or TimedOut, never hangs.
  std::chrono::milliseconds call_timeout{2000};
  // etcd only: TLS (used when any is set or the URL is etcds://) and user/password auth.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string user;
  std::string password;
};

// One key of the metadata store, as returned by get / list / watch. Keys given to and returned by
// the API are relative to the cluster's namespace.
struct ClusterKeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // revision that created this key (0 for a delete event)
  int64_t mod_revision = 0;     // revision of its last change: the `expected` of put_if
  bool bound_to_lease = false;  // vanishes when its writer's lease ends
};

struct ClusterWatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  ClusterKeyValue kv;  // for kDelete: key and mod_revision (the deleting revision) only
};

// A member of the cluster as it announced itself at join.
struct ClusterMember {
  std::string name;     // unique in the cluster: [A-Za-z0-9_.-]{1,64}
  std::string address;  // its bootstrap address "host:port" (may be empty for pure clients)
  std::vector<std::string> roles;  // "memory", "client", "manager", ...
  uint64_t capacity_bytes = 0;     // memory it exports (0 for clients)
  // Filled by members(): the lease's remaining time as the store sees it (-1 if unknown).
  std::chrono::milliseconds lease_left{-1};
  int64_t revision = 0;  // revision of its membership key's last change
};

struct ClusterMemberEvent {
  // kJoin: a member appeared (or came back after its key had gone). kLeave: it called leave().
  // kExpire: its lease ran out (killed, partitioned, or stopped renewing).
  enum class Type { kJoin, kLeave, kExpire };
  Type type = Type::kJoin;
  ClusterMember member;
  int64_t revision = 0;
};

struct ClusterPutOptions {
  // Bind the key to this client's lease (requires join()): it vanishes when the member leaves
  // or expires.
  bool bind_to_lease = false;
};

// One condition of Cluster::commit: `key` holds exactly `value`, or (value unset) is absent.
struct ClusterCompare {
  std::string key;
  std::optional<std::string> value;
};

// One write of Cluster::commit: put `key` = `value` (not bound to a lease), or remove it (absent
// is fine).
struct ClusterOp {
  enum class Type { kPut, kRemove };
  Type type = Type::kPut;
  std::string key;
  std::string value;
};

// Watches run until cancelled or destroyed; callbacks arrive on a thread of the Cluster's, one at a
// time, in revision order. After cancel() returns no callback runs or is running.
class ClusterWatch {
 public:
  virtual ~ClusterWatch() = default;
  virtual void cancel() = 0;
};

using ClusterWatchCallback = std::function<void(const ClusterWatchEvent&)>;
using ClusterMemberCallback = std::function<void(const ClusterMemberEvent&)>;
// A watch that cannot go on (its start revision was compacted away, the cluster was closed) calls
// this once, then stops. Losing the store for a while is not an error: the watch resumes after
// the last revision it delivered, without missing or repeating an event.
using ClusterWatchErrorCallback = std::function<void(const Status&)>;

// Limits on keys and values (checked before anything is sent).
inline constexpr size_t kClusterMaxKeyBytes = 1024;
inline constexpr size_t kClusterMaxValueBytes = 1 << 20;

// Thread-safe. One Cluster holds at most one membership (join once; leave, then join again).
class Cluster {
 public:
  // Parses the URL and checks the store is reachable within call_timeout (Unavailable if not;
  // InvalidArgument for a malformed URL or cluster name).
  static Result<std::unique_ptr<Cluster>> Open(const ClusterOptions& options);
  ~Cluster();  // leaves if joined, cancels every watch
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  const ClusterOptions& options() const { return options_; }

  // ---- membership ----
  // Grants a lease, writes the member key bound to it and keeps the lease alive in the
  // background. FailedPrecondition if another live member has the same name. If the store is lost
  // and the lease expires meanwhile, the membership is re-established when the store returns.
  Status join(const ClusterMember& self);
  // Marks the member as leaving (watchers see kLeave, not kExpire), then revokes the lease: keys
  // bound to it vanish. OK if not joined.
  Status leave();
  bool joined() const;
  // The live members, sorted by name.
  Result<std::vector<ClusterMember>> members();
  // Delivers a kJoin for every current member first, then every change once, in order.
  Result<std::unique_ptr<ClusterWatch>> watch_members(ClusterMemberCallback on_event,
                                                      ClusterWatchErrorCallback on_error = {});

  // ---- metadata ----
  // NotFound if absent.
  Result<ClusterKeyValue> get(std::string_view key);
  // Returns the revision of the write.
  Result<int64_t> put(std::string_view key, std::string_view value,
                      const ClusterPutOptions& options = {});
  // Writes only if the key's mod_revision is `expected_revision`; expected_revision == 0 means
  // "only if absent" (create). FailedPrecondition (nothing written) otherwise.
  Result<int64_t> put_if(std::string_view key, std::string_view value, int64_t expected_revision,
                         const ClusterPutOptions& options = {});
  // NotFound if absent.
  Status remove(std::string_view key);
  // Several writes at once (etcd's txn): if every compare holds, every op is applied in one
  // revision, else nothing is written and the result is FailedPrecondition. A store lost during
  // the call applied all of them or none. Each key at most once in `ops` (InvalidArgument);
  // at most 64 ops. Returns the revision of the writes.
  Result<int64_t> commit(const std::vector<ClusterCompare>& compares,
                         const std::vector<ClusterOp>& ops);
  // Keys starting with `prefix` ("" = all of this cluster's metadata), sorted.
  Result<std::vector<ClusterKeyValue>> list(std::string_view prefix);
  // Changes to keys under `prefix` with revision >= from_revision (0: from now on).
  Result<std::unique_ptr<ClusterWatch>> watch(std::string_view prefix, int64_t from_revision,
                                              ClusterWatchCallback on_event,
                                              ClusterWatchErrorCallback on_error = {});
  // The store's current revision.
  Result<int64_t> revision();

  // Counters for STAT: calls, failures, re-joins, keepalives.
  std::string stats_json() const;

 private:
  struct Impl;
  Cluster(ClusterOptions options, std::unique_ptr<Impl> impl);

  ClusterOptions options_;
  std::unique_ptr<Impl> impl_;
};

// Checks a key as put/get/... do: non-empty, at most kClusterMaxKeyBytes, valid UTF-8, no NUL.
Status ValidateClusterKey(std::string_view key);

}  // namespace farmem
