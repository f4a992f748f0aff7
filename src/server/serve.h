// The one implementation behind `farmemd` and `farmem serve`: flag definitions (CLI11), JSON config
// merging (flags win over the environment, which wins over the config file), and the run loop that
// prints the ready line and shuts down gracefully on SIGTERM/SIGINT.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "farmem/server.h"
#include "farmem/status.h"

namespace farmem {

// Process exit codes shared by farmemd and the farmem CLI.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // a runtime check or remote call failed
inline constexpr int kExitUsage = 2;    // bad flags/config or an unusable address

struct ServeOptions {
  std::string config_file;
  std::string listen = "127.0.0.1:7700";
  std::string backend = "tcp";
  std::string provider = "shm";
  std::string data_host;  // "" = host part of `listen`
  int data_port = 0;
  uint64_t memory_mib = 256;
  uint64_t pool_mib = 16;
  std::string token = "farmem";
  std::string name = "farmemd";
  int workers = 1;
  int metrics_port = -1;  // -1 = no metrics endpoint; 0 = ephemeral
  // Object store (ObjectsConfig in farmem/server.h; docs/server.md "Object store").
  bool objects_enabled = true;
  uint64_t objects_block_size = 4096;
  int objects_id_bits = 16;
  bool objects_hybrid = true;
  uint32_t objects_workers = 0;  // 0 = --workers
  std::string objects_worker_selection = "connection";
  std::string objects_correction = "owner";
  uint64_t objects_reserve_mib = 0;       // 0 = --memory-mib
  uint64_t objects_max_physical_mib = 0;  // 0 = --memory-mib
  double objects_compaction_threshold = 0.3;
  uint32_t objects_compaction_interval_ms = 100;  // 0 = no leader thread
  uint32_t objects_compaction_max_merges_per_round = 64;
  uint32_t objects_compaction_max_merges_per_second = 500;  // 0 = unpaced
};

// Flags registered on a CLI11 app (or subcommand); keeps the Option handles so the config file
// can tell which values were given on the command line.
struct ServeFlags {
  ServeOptions options;
  std::vector<std::pair<std::string, CLI::Option*>> given;  // config key -> option
};

void AddServeFlags(CLI::App& app, ServeFlags& flags);

// Applies FARMEM_TOKEN and --config (for keys not given as flags), then validates everything and
// builds the server configuration.
Result<ServerConfig> ResolveServeConfig(ServeFlags& flags);

// Splits "host:port" ("[v6]:port" too); the port must be 0..65535.
Result<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view address);

// Runs a memory server until SIGTERM/SIGINT; returns the process exit code. `prog` prefixes error
// lines. Must be called before the process starts other threads (it blocks the signals so that
// every thread it creates inherits the mask and only this thread receives them).
int RunServe(ServeFlags& flags, std::string_view prog);

}  // namespace farmem
