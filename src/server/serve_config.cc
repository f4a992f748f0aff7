// Flag definitions and config resolution for farmemd / `farmem serve` (kept apart from the run
// loop so they can be unit-tested without starting a node). Precedence: flags, then the
// FARMEM_TOKEN environment variable, then the --config JSON file, then defaults.
#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/net/host_port.h"
#include "server/built_services.h"
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
  std::string names;
  for (const ServiceDescriptor* d : BuiltServices()) {
    flags.config.services.push_back(d->name);
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
  FARMEM_RETURN_IF_ERROR(f.finish());

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

  ServerConfig c = flags.config;
  c.node.name = o.name;
  c.node.bootstrap_host = listen.first;
  c.node.bootstrap_port = listen.second;
  c.node.rpc_workers = o.workers;
  c.node.transport.backend = o.backend;
  c.node.transport.provider = o.provider;
  c.node.transport.listen_host = o.data_host.empty() ? listen.first : o.data_host;
  c.node.transport.listen_port = static_cast<uint16_t>(o.data_port);
  c.node.transport.cluster_token = o.token;
  FARMEM_RETURN_IF_ERROR(ValidateServerConfig(c));
  return c;
}

}  // namespace farmem
