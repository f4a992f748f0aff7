// The one implementation behind `farmemd` and `farmem serve`: flag definitions (CLI11), JSON config
// merging (flags win over the environment, which wins over the config file), and the run loop that
// prints the ready line and shuts down gracefully on SIGTERM/SIGINT.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "farmem/cluster.h"
#include "farmem/server.h"
#include "farmem/status.h"
#include "server/metrics_http.h"
#include "service/flags.h"

namespace CLI {
class App;  // CLI11's header is included by the files that parse (serve_config.cc, mains)
}  // namespace CLI

namespace farmem {

// Process exit codes shared by farmemd and the farmem CLI.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // a runtime check or remote call failed
inline constexpr int kExitUsage = 2;    // bad flags/config or an unusable address

// farmemd's own settings; each service declares its own (ServiceDescriptor::add_flags) straight
// into ServeFlags::config.
struct ServeOptions {
  std::string config_file;
  std::string listen = "127.0.0.1:7700";
  std::string backend = "tcp";
  std::string provider = "shm";
  std::string data_host;  // "" = host part of `listen`
  int data_port = 0;
  std::string token = "farmem";
  std::string name = "farmemd";
  int workers = 1;
  int metrics_port = -1;  // -1 = no metrics endpoint; 0 = ephemeral
  // Control plane (docs/cluster.md): with a URL the daemon joins that cluster as a "memory"
  // member once it listens, and leaves on SIGTERM/SIGINT. Empty = no cluster.
  std::string cluster_url;
  std::string cluster_name = "default";
  int cluster_ttl_seconds = 5;  // membership lease: a killed daemon vanishes after this long
  // The bootstrap address announced to the cluster, HOST or HOST:PORT (port: the bound one).
  // "" = the bound --listen address, which must then not be a wildcard (0.0.0.0, ::).
  std::string cluster_advertise;
  std::string cluster_user;
  std::string cluster_password;  // flag, else env FARMEM_CLUSTER_PASSWORD, else config file
  std::string cluster_ca;
  std::string cluster_cert;
  std::string cluster_key;
  // `--limit KEY=VALUE` items (limit_flags.h); ResolveServeConfig applies them to the node's
  // listener limits and to metrics_limits.
  std::vector<std::string> limits;
  MetricsHttpLimits metrics_limits;
};

// Flags registered on a CLI11 app (or subcommand): farmemd's own and every built service's.
struct ServeFlags {
  ServeOptions options;
  ServerConfig config;  // services write their flags here; the rest is filled by Resolve
  std::unique_ptr<FlagSet> flags;
};

void AddServeFlags(CLI::App& app, ServeFlags& flags);

// Applies FARMEM_TOKEN and --config (for keys not given as flags), then validates everything and
// builds the server configuration.
Result<ServerConfig> ResolveServeConfig(ServeFlags& flags);

// The Cluster::Open options of a resolved ServeOptions (create_if_missing: a daemon may be the
// first member of a new cluster); url is empty when no --cluster was given.
ClusterOptions ServeClusterOptions(const ServeOptions& options);

// The address the daemon announces when it joins: --cluster-advertise (HOST or HOST:PORT; HOST
// alone takes the port of `bound`) or, without it, `bound` (its bound bootstrap address).
std::string ClusterAdvertiseAddress(const ServeOptions& options, const std::string& bound);

// The roles a farmemd running `services` joins the cluster with: "memory", and kTxMemberRole
// when the tx service runs (TxClient finds the table partitions by it).
std::vector<std::string> ClusterMemberRoles(const std::vector<std::string>& services);

// Watches the cluster's members and ends, on each membership expiry, the client sessions opened
// as that member (MemoryServer::end_member_sessions; docs/sessions.md): a client that joined the
// cluster loses its session allocations as soon as the control plane declares it dead. The watch
// must be destroyed before `server`.
Result<std::unique_ptr<ClusterWatch>> EndSessionsOfExpiredMembers(Cluster& cluster,
                                                                  MemoryServer& server);

// Runs a memory server until SIGTERM/SIGINT; returns the process exit code. `prog` prefixes error
// lines. Must be called before the process starts other threads (it blocks the signals so that
// every thread it creates inherits the mask and only this thread receives them).
int RunServe(ServeFlags& flags, std::string_view prog);

}  // namespace farmem
