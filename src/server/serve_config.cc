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

  // Object store (CoRM). Config file: these keys flat, or nested as {"objects": {"block-size":
  // ..., "compaction": {"threshold": ...}}}.
  add("objects-enabled", app.add_option("--objects-enabled", o.objects_enabled,
                                        "serve the CoRM object store (true | false)")
                             ->capture_default_str());
  add("objects-block-size",
      app.add_option("--objects-block-size", o.objects_block_size,
                     "object block size in bytes: power of two, 4096..1048576")
          ->capture_default_str());
  add("objects-id-bits", app.add_option("--objects-id-bits", o.objects_id_bits,
                                        "object ID bits per block: 0 | 8 | 12 | 16")
                             ->capture_default_str());
  add("objects-hybrid",
      app.add_option("--objects-hybrid", o.objects_hybrid,
                     "classes with more slots than IDs become offset-only (true) or use only "
                     "2^id_bits slots (false)")
          ->capture_default_str());
  add("objects-workers", app.add_option("--objects-workers", o.objects_workers,
                                        "object thread allocators (0 = --workers)")
                             ->capture_default_str());
  add("objects-worker-selection",
      app.add_option("--objects-worker-selection", o.objects_worker_selection,
                     "allocator per allocation: connection | random")
          ->capture_default_str());
  add("objects-correction", app.add_option("--objects-correction", o.objects_correction,
                                           "pointer correction on the RPC path: owner | scan")
                                ->capture_default_str());
  add("objects-reserve-mib",
      app.add_option("--objects-reserve-mib", o.objects_reserve_mib,
                     "virtual range of the object region in MiB (0 = --memory-mib)")
          ->capture_default_str());
  add("objects-max-physical-mib",
      app.add_option("--objects-max-physical-mib", o.objects_max_physical_mib,
                     "physical memory the object store may hold in MiB (0 = --memory-mib)")
          ->capture_default_str());
  add("objects-compaction-threshold",
      app.add_option("--objects-compaction-threshold", o.objects_compaction_threshold,
                     "compact a size class when its fragmentation exceeds this (0..1)")
          ->capture_default_str());
  add("objects-compaction-interval-ms",
      app.add_option("--objects-compaction-interval-ms", o.objects_compaction_interval_ms,
                     "compaction leader period (0 = no leader thread)")
          ->capture_default_str());
  add("objects-compaction-max-merges-per-round",
      app.add_option("--objects-compaction-max-merges-per-round",
                     o.objects_compaction_max_merges_per_round,
                     "bound on block merges per compaction round")
          ->capture_default_str());
  add("objects-compaction-max-merges-per-second",
      app.add_option("--objects-compaction-max-merges-per-second",
                     o.objects_compaction_max_merges_per_second,
                     "pace of compaction rounds, merges per second (0 = unpaced; allocation "
                     "failures are never paced)")
          ->capture_default_str());
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
  // Nested sections ({"objects": {"compaction": {...}}}) are the flat keys with their prefix.
  if (v.is_object() && (key == "objects" || key == "objects-compaction")) {
    for (const auto& [k, sub] : v.items()) {
      FARMEM_RETURN_IF_ERROR(ApplyConfigKey(flags, key + "-" + k, sub));
    }
    return Status::OK();
  }
  ServeOptions& o = flags.options;
  auto str = [&](std::string& dst) -> Status {
    if (!v.is_string()) return Status::InvalidArgument("config key '" + key + "' must be a string");
    dst = v.get<std::string>();
    return Status::OK();
  };
  auto boolean = [&](bool& dst) -> Status {
    if (!v.is_boolean()) {
      return Status::InvalidArgument("config key '" + key + "' must be true or false");
    }
    dst = v.get<bool>();
    return Status::OK();
  };
  auto real = [&](double& dst) -> Status {
    if (!v.is_number()) return Status::InvalidArgument("config key '" + key + "' must be a number");
    dst = v.get<double>();
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
      {"objects-enabled", [&] { return boolean(o.objects_enabled); }},
      {"objects-block-size", [&] { return num(o.objects_block_size); }},
      {"objects-id-bits", [&] { return num(o.objects_id_bits); }},
      {"objects-hybrid", [&] { return boolean(o.objects_hybrid); }},
      {"objects-workers", [&] { return num(o.objects_workers); }},
      {"objects-worker-selection", [&] { return str(o.objects_worker_selection); }},
      {"objects-correction", [&] { return str(o.objects_correction); }},
      {"objects-reserve-mib", [&] { return num(o.objects_reserve_mib); }},
      {"objects-max-physical-mib", [&] { return num(o.objects_max_physical_mib); }},
      {"objects-compaction-threshold", [&] { return real(o.objects_compaction_threshold); }},
      {"objects-compaction-interval-ms", [&] { return num(o.objects_compaction_interval_ms); }},
      {"objects-compaction-max-merges-per-round",
       [&] { return num(o.objects_compaction_max_merges_per_round); }},
      {"objects-compaction-max-merges-per-second",
       [&] { return num(o.objects_compaction_max_merges_per_second); }},
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

  ObjectsConfig& obj = c.objects;
  obj.enabled = o.objects_enabled;
  if (o.objects_block_size > (1u << 30)) {
    return Status::InvalidArgument(
        "--objects-block-size must be a power of two in 4096..1048576, got " +
        std::to_string(o.objects_block_size));
  }
  obj.block_size = static_cast<uint32_t>(o.objects_block_size);
  obj.id_bits = o.objects_id_bits;
  obj.hybrid = o.objects_hybrid;
  obj.workers = o.objects_workers;
  if (o.objects_worker_selection == "connection") {
    obj.worker_selection = WorkerSelection::kByConnection;
  } else if (o.objects_worker_selection == "random") {
    obj.worker_selection = WorkerSelection::kRandom;
  } else {
    return Status::InvalidArgument(
        "--objects-worker-selection must be 'connection' or 'random', "
        "got '" +
        o.objects_worker_selection + "'");
  }
  if (o.objects_correction == "owner") {
    obj.correction = Correction::kAskOwner;
  } else if (o.objects_correction == "scan") {
    obj.correction = Correction::kScan;
  } else {
    return Status::InvalidArgument("--objects-correction must be 'owner' or 'scan', got '" +
                                   o.objects_correction + "'");
  }
  if (o.objects_reserve_mib > (64ull << 20) || o.objects_max_physical_mib > (64ull << 20)) {
    return Status::InvalidArgument(
        "--objects-reserve-mib and --objects-max-physical-mib must be at most 64 TiB");
  }
  obj.reserve_bytes = o.objects_reserve_mib << 20;
  obj.max_physical_bytes = o.objects_max_physical_mib << 20;
  obj.compaction.threshold = o.objects_compaction_threshold;
  obj.compaction.interval_ms = o.objects_compaction_interval_ms;
  obj.compaction.max_merges_per_round = o.objects_compaction_max_merges_per_round;
  obj.compaction.max_merges_per_second = o.objects_compaction_max_merges_per_second;
  FARMEM_RETURN_IF_ERROR(ValidateObjectsConfig(c));
  return c;
}

}  // namespace farmem
