// MemoryServer: the farmemd memory service as a library. A Node that exports memfd-backed pools
// and serves ALLOC_RAW / FREE_RAW / STAT RPCs; used by the farmemd binary, `farmem serve` and the
// in-process `farmem demo`.
#pragma once

#include <cstdint>
#include <memory>

#include <nlohmann/json.hpp>

#include "farmem/node.h"
#include "farmem/status.h"

namespace farmem {

struct ServerConfig {
  NodeConfig node;
  // Memory budget: one virtual reservation of this size; pools are carved from it on demand.
  uint64_t memory_bytes = 256ull << 20;
  // Size of each pool (one memfd file, one registered region). A multiple of the page size.
  uint64_t pool_bytes = 16ull << 20;
};

class MemoryServer {
 public:
  // Validates the configuration, reserves the address space and creates the Node (not started).
  static Result<std::unique_ptr<MemoryServer>> Create(const ServerConfig& config);
  ~MemoryServer();
  MemoryServer(const MemoryServer&) = delete;
  MemoryServer& operator=(const MemoryServer&) = delete;

  // Registers the RPC handlers and starts the node (transport, workers, bootstrap listener).
  Status start();
  // Stops accepting, lets running handlers finish, stops the node. Idempotent; run by the
  // destructor too. Pools are unmapped when the server is destroyed.
  void stop();

  // The STAT document (also what the STAT RPC returns); keys are described in docs/server.md.
  nlohmann::json stats() const;

  Node& node();
  const ServerConfig& config() const;

  struct Impl;

 private:
  explicit MemoryServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace farmem
