// Flag definitions and config resolution for farmemd / `farmem serve` (kept apart from the run
// loop so they can be unit-tested without starting a node). Precedence: flags, then the
// FARMEM_TOKEN environment variable, then the --config JSON file, then defaults.
#include <algorithm>
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include <CLI/CLI.hpp>

#include "common/net/host_port.h"
#include "farmem/tx.h"
#include "server/built_services.h"
#include "server/limit_flags.h"
#include "server/serve.h"

namespace farmem {

void AddServeFlags(CLI::App& app, ServeFlags& flags) {
  ServeOptions& o = flags.options;
  flags.flags = std::make_unique<FlagSet>(app);
  FlagSet& f = *flags.flags;
  app.add_option("--config", o.config_file,
                 "JSON file with the same keys as the flags (flags win)");
  f.add("listen", &o.listen, "bootstrap HOST:PORT");
  f.add("backend", &o.backend, "transport: tcp | fabric");
  f.add("provider", &o.provider, "libfabric provider: shm | \"tcp;ofi_rxm\" | \"verbs;ofi_rxm\"");
  f.add("data-host", &o.data_host, "transport listen IP (default: the --listen host)");
  f.add("data-port", &o.data_port, "transport port (0 = ephemeral)");
  f.add("token", &o.token, "cluster token (env FARMEM_TOKEN)");
  f.add("name", &o.name, "node name shown in stat");
  f.add("workers", &o.workers, "RPC worker threads");
  f.add("metrics-port", &o.metrics_port,
        "serve Prometheus text on HTTP GET /metrics (0 = ephemeral, -1 = off)");
  f.add("cluster", &o.cluster_url,
        "join this control plane once listening: etcd://HOST:PORT[,HOST:PORT...] (etcds:// for "
        "TLS) or memory://NAME (default: none)");
  f.add("cluster-name", &o.cluster_name, "cluster within the control plane ([A-Za-z0-9_.-]{1,64})");
  f.add("cluster-ttl", &o.cluster_ttl_seconds,
        "membership lease in seconds: a daemon that stops renewing vanishes after this long");
  f.add("cluster-advertise", &o.cluster_advertise,
        "bootstrap address other nodes reach this daemon at, HOST or HOST:PORT (default: the "
        "--listen address; required when that is 0.0.0.0 or ::)");
  f.add("cluster-user", &o.cluster_user, "etcd user (with --cluster-password)");
  f.add("cluster-password", &o.cluster_password, "etcd password (env FARMEM_CLUSTER_PASSWORD)");
  f.add("cluster-ca", &o.cluster_ca, "etcd TLS: CA certificate file");
  f.add("cluster-cert", &o.cluster_cert, "etcd TLS: client certificate file");
  f.add("cluster-key", &o.cluster_key, "etcd TLS: client key file");
  f.add_list("limit", &o.limits,
             "listener limits KEY=VALUE, comma-separated (docs/server.md \"Limits\"); keys "
             "(default): " +
                 LimitKeysHelp());
  f.add("max-sessions", &flags.config.sessions.max_sessions,
        "client sessions open at once (1..65535; docs/sessions.md)");
  f.add("session-ttl-max", &flags.config.sessions.ttl_max_seconds,
        "longest session lease granted, in seconds (1..3600): a dead client's allocations are "
        "freed at most this long after its last keepalive");
  std::string names;
  for (const ServiceDescriptor* d : BuiltServices()) {
    // Services that run only when configured (ServiceDescriptor::configured) are added to the
    // default list by ResolveServeConfig once flags and config file are read.
    if (!d->configured) flags.config.services.push_back(d->name);
    names += (names.empty() ? "" : ",") + d->name;
  }
  f.add_list("services", &flags.config.services,
             "services to run, comma-separated (built: " + names + ")");
  for (const ServiceDescriptor* d : BuiltServices()) d->add_flags(f, flags.config);
}

Result<ServerConfig> ResolveServeConfig(ServeFlags& flags) {
  ServeOptions& o = flags.options;
  FlagSet& f = *flags.flags;
  if (!o.config_file.empty()) {
    std::ifstream in(o.config_file);
    if (!in) return Status::InvalidArgument("cannot open config file '" + o.config_file + "'");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return Status::InvalidArgument("config file '" + o.config_file + "' is not a JSON object");
    }
    FARMEM_RETURN_IF_ERROR(f.apply_config(j).WithContext(o.config_file));
  }
  // Precedence: flag, then environment, then config file.
  if (!f.given("token")) {
    if (const char* env = std::getenv("FARMEM_TOKEN")) o.token = env;
  }
  // Same precedence for the etcd password, so it need not show in `ps`.
  if (!f.given("cluster-password")) {
    if (const char* env = std::getenv("FARMEM_CLUSTER_PASSWORD")) o.cluster_password = env;
  }
  FARMEM_RETURN_IF_ERROR(f.finish());
  if (!f.given("services")) {
    // The default list (or one from the config file) gets each service that runs only when
    // configured and is: the tiered region with --tier-file, tx with --tx-table.
    std::vector<std::string>& list = flags.config.services;
    for (const ServiceDescriptor* d : BuiltServices()) {
      if (d->configured && d->configured(flags.config) &&
          std::find(list.begin(), list.end(), d->name) == list.end()) {
        list.push_back(d->name);
      }
    }
  }

  FARMEM_ASSIGN_OR_RETURN(auto listen, net::ParseHostPort(o.listen));
  if (o.backend != "tcp" && o.backend != "fabric") {
    return Status::InvalidArgument("--backend must be 'tcp' or 'fabric', got '" + o.backend + "'");
  }
  if (o.data_port < 0 || o.data_port > 65535) {
    return Status::InvalidArgument("--data-port must be 0..65535");
  }
  if (o.metrics_port < -1 || o.metrics_port > 65535) {
    return Status::InvalidArgument("--metrics-port must be 0..65535");
  }
  if (o.workers < 1 || o.workers > 256) return Status::InvalidArgument("--workers must be 1..256");
  if (o.token.empty()) return Status::InvalidArgument("the cluster token must not be empty");
  if (o.name.empty()) return Status::InvalidArgument("--name must not be empty");
  // The cluster flags are checked here, before anything starts, so a typo is exit 2 at once;
  // the URL itself is parsed by Cluster::Open (after the server listens).
  if (o.cluster_ttl_seconds < 1 || o.cluster_ttl_seconds > 3600) {
    return Status::InvalidArgument("--cluster-ttl must be 1..3600 seconds, got " +
                                   std::to_string(o.cluster_ttl_seconds));
  }
  if (o.cluster_name.empty() || o.cluster_name.size() > 64 ||
      o.cluster_name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                       "0123456789_.-") != std::string::npos) {
    return Status::InvalidArgument("--cluster-name must match [A-Za-z0-9_.-]{1,64}, got '" +
                                   o.cluster_name + "'");
  }
  if (!o.cluster_advertise.empty()) {
    // HOST alone takes the bound port; a port given must be a real one.
    std::string a = o.cluster_advertise;
    if (a.find(':') == std::string::npos || (a.front() == '[' && a.back() == ']')) a += ":1";
    auto parsed = net::ParseHostPort(a, net::PortZero::kRefused);
    if (!parsed.ok() || parsed->first.empty()) {
      return Status::InvalidArgument("--cluster-advertise must be HOST or HOST:PORT, got '" +
                                     o.cluster_advertise + "'");
    }
  } else if (!o.cluster_url.empty() &&
             (listen.first.empty() || listen.first == "0.0.0.0" || listen.first == "::")) {
    return Status::InvalidArgument("--listen " + o.listen +
                                   " is a wildcard address, which other nodes cannot reach: give "
                                   "--cluster-advertise HOST[:PORT] with --cluster");
  }
  if (o.cluster_url.empty()) {
    for (const char* key : {"cluster-user", "cluster-password", "cluster-ca", "cluster-cert",
                            "cluster-key", "cluster-name", "cluster-ttl", "cluster-advertise"}) {
      if (f.given(key)) {
        return Status::InvalidArgument(std::string("--") + key + " needs --cluster URL");
      }
    }
  }

  ServerConfig c = flags.config;
  c.node.name = o.name;
  c.node.bootstrap_host = listen.first;
  c.node.bootstrap_port = listen.second;
  c.node.rpc_workers = o.workers;
  {
    ListenerLimits limits{c.node.transport.tcp_limits, c.node.bootstrap_limits, o.metrics_limits};
    FARMEM_RETURN_IF_ERROR(ApplyLimitItems(o.limits, limits));
    c.node.transport.tcp_limits = limits.tcp;
    c.node.bootstrap_limits = limits.bootstrap;
    o.metrics_limits = limits.metrics;
  }
  c.node.transport.backend = o.backend;
  c.node.transport.provider = o.provider;
  c.node.transport.listen_host = o.data_host.empty() ? listen.first : o.data_host;
  c.node.transport.listen_port = static_cast<uint16_t>(o.data_port);
  c.node.transport.cluster_token = o.token;
  FARMEM_RETURN_IF_ERROR(ValidateServerConfig(c));
  return c;
}

std::string ClusterAdvertiseAddress(const ServeOptions& options, const std::string& bound) {
  const std::string& a = options.cluster_advertise;
  if (a.empty()) return bound;
  const bool bracketed_host_only = a.front() == '[' && a.back() == ']';
  const bool has_port = !bracketed_host_only && a.find(':') != std::string::npos;
  if (has_port) return a;
  const size_t colon = bound.rfind(':');
  return colon == std::string::npos ? a : a + bound.substr(colon);
}

ClusterOptions ServeClusterOptions(const ServeOptions& o) {
  ClusterOptions c;
  c.url = o.cluster_url;
  c.cluster_name = o.cluster_name;
  c.create_if_missing = true;
  c.lease_ttl = std::chrono::seconds(o.cluster_ttl_seconds);
  c.tls_ca_file = o.cluster_ca;
  c.tls_cert_file = o.cluster_cert;
  c.tls_key_file = o.cluster_key;
  c.user = o.cluster_user;
  c.password = o.cluster_password;
  return c;
}

std::vector<std::string> ClusterMemberRoles(const std::vector<std::string>& services) {
  std::vector<std::string> roles = {"memory"};
  if (std::find(services.begin(), services.end(), "tx") != services.end()) {
    roles.emplace_back(kTxMemberRole);
  }
  return roles;
}

}  // namespace farmem
