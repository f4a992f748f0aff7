// Flag definitions and config resolution for farmemd / `farmem serve` (kept apart from the run
// loop so they can be unit-tested without starting a node). Precedence: flags, then the
// FARMEM_TOKEN environment variable, then the --config JSON file, then defaults.
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "server/serve.h"

namespace farmem {

void AddServeFlags(CLI::App& app, ServeFlags& flags) {
  ServeOptions& o = flags.options;
  auto add = [&](const char* key, CLI::Option* opt) { flags.given.emplace_back(key, opt); };
  app.add_option("--config", o.config_file,
                 "JSON file with the same keys as the flags (flags win)");
  add("listen", app.add_option("--listen", o.listen, "bootstrap HOST:PORT")->capture_default_str());
  add("backend",
      app.add_option("--backend", o.backend, "transport: tcp | fabric")->capture_default_str());
  add("provider", app.add_option("--provider", o.provider,
                                 "libfabric provider: shm | \"tcp;ofi_rxm\" | \"verbs;ofi_rxm\"")
                      ->capture_default_str());
  add("data-host", app.add_option("--data-host", o.data_host,
                                  "transport listen IP (default: the --listen host)"));
  add("data-port", app.add_option("--data-port", o.data_port, "transport port (0 = ephemeral)")
                       ->capture_default_str());
  add("memory-mib",
      app.add_option("--memory-mib", o.memory_mib, "memory budget in MiB")->capture_default_str());
  add("pool-mib",
      app.add_option("--pool-mib", o.pool_mib, "pool size in MiB")->capture_default_str());
  add("token", app.add_option("--token", o.token, "cluster token (env FARMEM_TOKEN)"));
  add("name", app.add_option("--name", o.name, "node name shown in stat")->capture_default_str());
  add("workers",
      app.add_option("--workers", o.workers, "RPC worker threads")->capture_default_str());
  add("metrics-port", app.add_option("--metrics-port", o.metrics_port,
                                     "serve Prometheus text on HTTP GET /metrics (0 = ephemeral)"));
}

Result<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == address.size()) {
    return Status::InvalidArgument("address '" + std::string(address) + "' is not HOST:PORT");
  }
  std::string host(address.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port_text(address.substr(colon + 1));
  if (port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos) {
    return Status::InvalidArgument("bad port in '" + std::string(address) + "'");
  }
  const unsigned long port = std::stoul(port_text);
  if (port > 65535)
    return Status::InvalidArgument("port out of range in '" + std::string(address) + "'");
  return std::make_pair(host, static_cast<uint16_t>(port));
}

namespace {

bool Given(const ServeFlags& flags, const std::string& key) {
  for (const auto& [k, opt] : flags.given) {
    if (k == key) return opt->count() > 0;
  }
  return false;
}

// Applies one config-file key unless the same flag was given. Unknown keys and wrong types are
// errors (a typo in a config file must not be silently ignored).
Status ApplyConfigKey(ServeFlags& flags, std::string key, const nlohmann::json& v) {
  for (char& c : key) {
    if (c == '_') c = '-';
  }
  ServeOptions& o = flags.options;
  auto str = [&](std::string& dst) -> Status {
    if (!v.is_string()) return Status::InvalidArgument("config key '" + key + "' must be a string");
    dst = v.get<std::string>();
    return Status::OK();
  };
  auto num = [&](auto& dst) -> Status {
    if (!v.is_number_integer()) {
      return Status::InvalidArgument("config key '" + key + "' must be an integer");
    }
    if (v.is_number_unsigned() || v.get<int64_t>() >= 0 ||
        std::is_signed_v<std::remove_reference_t<decltype(dst)>>) {
      dst = v.get<std::remove_reference_t<decltype(dst)>>();
      return Status::OK();
    }
    return Status::InvalidArgument("config key '" + key + "' must not be negative");
  };
  const std::map<std::string, std::function<Status()>> setters = {
      {"listen", [&] { return str(o.listen); }},
      {"backend", [&] { return str(o.backend); }},
      {"provider", [&] { return str(o.provider); }},
      {"data-host", [&] { return str(o.data_host); }},
      {"data-port", [&] { return num(o.data_port); }},
      {"memory-mib", [&] { return num(o.memory_mib); }},
      {"pool-mib", [&] { return num(o.pool_mib); }},
      {"token", [&] { return str(o.token); }},
      {"name", [&] { return str(o.name); }},
      {"workers", [&] { return num(o.workers); }},
      {"metrics-port", [&] { return num(o.metrics_port); }},
  };
  auto it = setters.find(key);
  if (it == setters.end()) return Status::InvalidArgument("unknown config key '" + key + "'");
  if (Given(flags, key)) return Status::OK();
  if (key == "token" && std::getenv("FARMEM_TOKEN")) return Status::OK();
  return it->second();
}

}  // namespace

Result<ServerConfig> ResolveServeConfig(ServeFlags& flags) {
  ServeOptions& o = flags.options;
  if (!Given(flags, "token")) {
    if (const char* env = std::getenv("FARMEM_TOKEN")) o.token = env;
  }
  if (!o.config_file.empty()) {
    std::ifstream in(o.config_file);
    if (!in) return Status::InvalidArgument("cannot open config file '" + o.config_file + "'");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return Status::InvalidArgument("config file '" + o.config_file + "' is not a JSON object");
    }
    for (const auto& [k, v] : j.items()) {
      FARMEM_RETURN_IF_ERROR(ApplyConfigKey(flags, k, v).WithContext(o.config_file));
    }
  }

  FARMEM_ASSIGN_OR_RETURN(auto listen, ParseHostPort(o.listen));
  if (listen.first.empty()) return Status::InvalidArgument("--listen needs a host");
  if (o.backend != "tcp" && o.backend != "fabric") {
    return Status::InvalidArgument("--backend must be 'tcp' or 'fabric', got '" + o.backend + "'");
  }
  if (o.data_port < 0 || o.data_port > 65535) {
    return Status::InvalidArgument("--data-port must be 0..65535");
  }
  if (o.metrics_port < -1 || o.metrics_port > 65535) {
    return Status::InvalidArgument("--metrics-port must be 0..65535");
  }
  if (o.pool_mib == 0 || o.pool_mib > (1u << 20)) {
    return Status::InvalidArgument("--pool-mib must be 1..1048576");
  }
  if (o.memory_mib < o.pool_mib || o.memory_mib > (64ull << 20)) {
    return Status::InvalidArgument("--memory-mib must be at least --pool-mib (" +
                                   std::to_string(o.pool_mib) + ") and at most 64 TiB");
  }
  if (o.workers < 1 || o.workers > 256) return Status::InvalidArgument("--workers must be 1..256");
  if (o.token.empty()) return Status::InvalidArgument("the cluster token must not be empty");
  if (o.name.empty()) return Status::InvalidArgument("--name must not be empty");

  ServerConfig c;
  c.memory_bytes = o.memory_mib << 20;
  c.pool_bytes = o.pool_mib << 20;
  c.node.name = o.name;
  c.node.bootstrap_host = listen.first;
  c.node.bootstrap_port = listen.second;
  c.node.rpc_workers = o.workers;
  c.node.transport.backend = o.backend;
  c.node.transport.provider = o.provider;
  c.node.transport.listen_host = o.data_host.empty() ? listen.first : o.data_host;
  c.node.transport.listen_port = static_cast<uint16_t>(o.data_port);
  c.node.transport.cluster_token = o.token;
  return c;
}

}  // namespace farmem
