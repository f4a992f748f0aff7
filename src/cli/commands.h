// The `farmem` CLI subcommands (besides `serve`, which is server/serve.h): option structs and
// entry points returning process exit codes (0 ok, 1 a check or remote call failed, 2 usage).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/cluster.h"
#include "farmem/node.h"
#include "farmem/regionfs.h"
#include "farmem/status.h"

namespace farmem::cli {

// How a client-side node joins the cluster; must match the server's transport.
struct ClientOptions {
  std::string token = "farmem";  // flag, else env FARMEM_TOKEN, else "farmem"
  std::string backend = "tcp";
  std::string provider = "shm";
  std::string data_host = "127.0.0.1";  // where this node's transport and bootstrap listen
  uint32_t op_timeout_ms = 0;           // deadline of each remote operation (0: the transport's)
};

// A loopback port nobody listens on right now (bound to 127.0.0.1:0, then closed; -1 on error):
// a child or embedded node may still lose a race for it.
int FreeLoopbackPort();

// A started node for talking to farmemd(s).
Result<std::unique_ptr<Node>> MakeClientNode(const ClientOptions& options, const std::string& name);

// How a command reaches the control plane (--cluster URL and friends). Read-only tools never
// create a cluster: an unknown --cluster-name is an error that names the existing ones.
struct ClusterClientOptions {
  std::string url;  // --cluster; `farmem cluster ...` falls back to env FARMEM_CLUSTER
  std::string name = "default";
  std::string user;
  std::string password;  // flag, else env FARMEM_CLUSTER_PASSWORD
  std::string ca;
  std::string cert;
  std::string key;
};
ClusterOptions MakeClusterOptions(const ClusterClientOptions& options);
// Cluster::Open for a client; prints `PROG: error: ...` itself and returns the exit code to use
// (2 for a malformed URL or name, 1 for an unreachable store or unknown cluster) on failure.
Result<std::unique_ptr<Cluster>> OpenClusterForCli(const ClusterClientOptions& options,
                                                   std::string_view prog, int* exit_code);
// The members with role "memory" (sorted by name); `only` non-empty picks the one of that name.
// NotFound (with the names there are) when none matches.
Result<std::vector<ClusterMember>> MemoryMembers(Cluster& cluster, const std::string& only);

struct DemoOptions {
  ClientOptions client;
  std::vector<std::string> connect;  // empty = run an embedded server in this process
  ClusterClientOptions cluster;      // url set: run against the cluster's memory members
};
int RunDemo(const DemoOptions& options);

struct StatOptions {
  ClientOptions client;
  std::string address;  // with cluster.url: a member name ("" = every memory member)
  bool json = false;
  ClusterClientOptions cluster;
};
int RunStat(const StatOptions& options);

// `farmem hold ADDR` (hold_cmd.cc): allocate, then keep the allocations until killed.
struct HoldOptions {
  ClientOptions client;
  std::string address;
  uint64_t objects = 0;
  uint64_t object_size = 100;
  uint64_t raw_count = 0;
  uint64_t raw_bytes = 4096;
  bool persistent = false;          // Lifetime::kPersistent instead of the session
  uint32_t session_ttl_ms = 10000;  // lease asked for
  uint32_t seconds = 0;             // 0 = until SIGTERM/SIGINT (or SIGKILL)
};
int RunHold(const HoldOptions& options);

// `farmem mount DIR` (mount_cmd.cc): serves remote regions over FUSE until unmounted.
int RunMount(RegionFsOptions options);
// `farmem regions stat` (regions_stat_cmd.cc): prints the .regions/ reports of `mount` (empty:
// every fuse.regions mount in /proc/self/mounts).
int RunRegionsStat(const std::string& mount);

struct CompactOptions {
  ClientOptions client;
  std::string address;  // with cluster.url: a member name ("" = every memory member)
  ClusterClientOptions cluster;
  std::optional<uint16_t> size_class;  // unset = every class
};
// One compaction round of a farmemd's object store (COMPACT RPC); prints merges and counters.
int RunCompact(const CompactOptions& options);

// `farmem cluster members|watch|get|put|list|remove` (cluster_cmd.cc).
struct ClusterCmdOptions {
  ClusterClientOptions cluster;
  ClientOptions client;  // members: how to reach each member for its STAT
  bool json = false;
  std::string key;             // get, put, remove; list: the prefix
  std::string value;           // put
  std::string value_file;      // put --file
  int count = 0;               // watch: stop after this many changes (0 = no limit)
  double timeout_seconds = 0;  // watch: stop after this long (0 = no limit)
};
int RunClusterMembers(const ClusterCmdOptions& options);
int RunClusterWatch(const ClusterCmdOptions& options);
int RunClusterGet(const ClusterCmdOptions& options);
int RunClusterPut(const ClusterCmdOptions& options);
int RunClusterList(const ClusterCmdOptions& options);
int RunClusterRemove(const ClusterCmdOptions& options);

// `farmem cluster up|down` (cluster_local.cc): a local etcd plus N farmemds under one directory.
struct ClusterUpOptions {
  int nodes = 2;
  std::string dir;
  int base_port = 0;    // 0 = free loopback ports
  std::string etcd;     // "" = $FARMEM_ETCD, else etcd on PATH, else /usr/bin/etcd
  std::string farmemd;  // "" = the farmemd next to this farmem binary, else on PATH
  std::string cluster_name = "default";
  int ttl_seconds = 5;
  int memory_mib = 64;
  std::vector<std::string> farmemd_args;  // passed to every farmemd as they are
  double wait_seconds = 30;               // bound on etcd start + every member joining
};
int RunClusterUp(const ClusterUpOptions& options);
int RunClusterDown(const std::string& dir, double wait_seconds);

// One row of `farmem cluster members`: the member and, for a memory member, what its STAT said.
struct MemberRow {
  ClusterMember member;
  bool stat_ok = false;        // false: the table shows "?" (or "-" for a member without memory)
  uint64_t used_bytes = 0;     // STAT memory.allocated_bytes (raw pools)
  uint64_t total_bytes = 0;    // STAT memory.budget_bytes
  int64_t objects_bytes = -1;  // STAT objects.physical_bytes_held; -1: no object store
  std::string stat_error;
};
std::string FormatMembersTable(const std::vector<MemberRow>& rows);
nlohmann::json MembersJson(const std::vector<MemberRow>& rows);
// Fills used/total from a STAT document; false when it lacks the memory section.
bool MemoryFromStat(const nlohmann::json& stat, MemberRow& row);
// "join", "leave" or "expire".
std::string MemberEventName(ClusterMemberEvent::Type type);
// One line of `farmem cluster watch` (without the time stamp) and its --json form.
std::string FormatMemberEvent(const ClusterMemberEvent& event);
nlohmann::json MemberEventJson(const ClusterMemberEvent& event);

// The human-readable `farmem stat` report of a STAT document (tolerates missing keys).
std::string FormatStatTable(const nlohmann::json& stat, const std::string& address);
// "4.0 KiB", "16.0 MiB", "512 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace farmem::cli
