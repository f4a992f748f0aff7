// The `farmem` CLI subcommands (besides `serve`, which is server/serve.h): option structs and
// entry points returning process exit codes (0 ok, 1 a check or remote call failed, 2 usage).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/node.h"
#include "farmem/status.h"

namespace farmem::cli {

// How a client-side node joins the cluster; must match the server's transport.
struct ClientOptions {
  std::string token = "farmem";  // flag, else env FARMEM_TOKEN, else "farmem"
  std::string backend = "tcp";
  std::string provider = "shm";
  std::string data_host = "127.0.0.1";  // where this node's transport and bootstrap listen
};

// A started node for talking to farmemd(s).
Result<std::unique_ptr<Node>> MakeClientNode(const ClientOptions& options, const std::string& name);

struct DemoOptions {
  ClientOptions client;
  std::vector<std::string> connect;  // empty = run an embedded server in this process
};
int RunDemo(const DemoOptions& options);

struct StatOptions {
  ClientOptions client;
  std::string address;
  bool json = false;
};
int RunStat(const StatOptions& options);

struct CompactOptions {
  ClientOptions client;
  std::string address;
  std::optional<uint16_t> size_class;  // unset = every class
};
// One compaction round of a farmemd's object store (COMPACT RPC); prints merges and counters.
int RunCompact(const CompactOptions& options);

// The human-readable `farmem stat` report of a STAT document (tolerates missing keys).
std::string FormatStatTable(const nlohmann::json& stat, const std::string& address);
// "4.0 KiB", "16.0 MiB", "512 B".
std::string FormatBytes(uint64_t bytes);

}  // namespace farmem::cli
