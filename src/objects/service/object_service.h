// ObjectService: farmemd's CoRM object store behind the object RPCs of src/objects/object_wire.h.
// Owns corm::Store + corm::Compactor, exports the Store's whole virtual reservation as the region
// "objects" (clients read slots one-sidedly there) and validates every wire pointer before use.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/node.h"
#include "farmem/server.h"
#include "farmem/status.h"
#include "objects/engine/compaction.h"
#include "objects/engine/store.h"
#include "service/service.h"

namespace farmem {

// The objects service as farmemd knows it: the --objects-* flags and the factory.
const ServiceDescriptor& ObjectsServiceDescriptor();

class ObjectService final : public Service {
 public:
  // Name of the exported region holding every object slot.
  static constexpr const char* kRegionName = "objects";

  // Validates config.objects, creates the store and exports its reservation through `node`
  // (which must outlive the service and be stopped before it is destroyed: peers must not reach
  // the range once it is unmapped). The compaction leader starts with Start(). Objects allocated
  // in a client session are owned by its index in `sessions` (which must outlive the service)
  // and freed by the end listener registered here (Store::FreeOwned).
  static Result<std::unique_ptr<ObjectService>> Create(const ServerConfig& config, Node& node,
                                                       SessionRegistry& sessions);
  ~ObjectService() override;
  ObjectService(const ObjectService&) = delete;
  ObjectService& operator=(const ObjectService&) = delete;

  // STAT name of an object opcode ("obj_alloc", ...), nullptr for opcodes the service lacks.
  static const char* OpName(uint16_t opcode);
  // Where the node runs an opcode's handler: OBJ_LOCATE inline on the progress thread (a lookup
  // under a shared block lock, the ask-owner pointer correction clients wait on during
  // compaction), everything else on RPC workers.
  static RpcExecution Execution(uint16_t opcode);
  // Serves one object RPC (call.opcode must have an OpName). Thread-safe.
  Status Handle(const RpcCall& call, std::vector<std::byte>& reply);

  // Service: name "objects", opcodes kObjectsOpcodes, one method per OpName.
  std::string_view name() const override { return "objects"; }
  OpcodeRange opcodes() const override { return kObjectsOpcodes; }
  std::vector<ServiceMethod> methods() override;
  // Starts the compaction leader thread (unless compaction.interval_ms is 0). Idempotent.
  Status start() override;
  // Joins the leader thread. Idempotent.
  void stop() override;
  // STAT key "objects" (docs/server.md) and the farmem_objects_* metrics.
  void stats(nlohmann::json& doc) const override;
  void metrics(MetricsWriter& out) const override;

  // The "objects" section of STAT (docs/server.md).
  nlohmann::json Stats() const;

  const RegionInfo& region() const { return region_; }
  // Effective configuration (defaults resolved: workers, reserve, physical budget).
  const ObjectsConfig& config() const { return config_; }
  corm::Store& store() { return *store_; }

 private:
  ObjectService() = default;

  Status Info(const RpcCall& call, std::vector<std::byte>& reply);
  Status Alloc(const RpcCall& call, std::vector<std::byte>& reply);
  Status Free(const RpcCall& call, std::vector<std::byte>& reply);
  Status Read(const RpcCall& call, std::vector<std::byte>& reply);
  Status Write(const RpcCall& call, std::vector<std::byte>& reply);
  Status Locate(const RpcCall& call, std::vector<std::byte>& reply);
  Status Release(const RpcCall& call, std::vector<std::byte>& reply);
  Status Compact(const RpcCall& call, std::vector<std::byte>& reply);

  // Wire pointer -> store pointer; rejects what the Store cannot check itself (reserved bytes,
  // class range, offset outside the region) before the Store is touched.
  Result<corm::ObjectPtr> FromWire(const void* wire_ptr) const;
  // Store pointer -> reply bytes (PtrReply), with the slot's current version as the hint.
  void AppendPtrReply(const corm::ObjectPtr& p, std::vector<std::byte>& reply) const;
  uint32_t PickWorker(std::string_view source);

  // A session ended: free what it owned (a SessionRegistry end listener).
  SessionFreed FreeSession(SessionIndex index);

  ObjectsConfig config_;
  SessionRegistry* sessions_ = nullptr;
  uint32_t max_rpc_bytes_ = 0;
  uint64_t base_ = 0;  // address of the reservation (offset 0 of the region)
  // Destroyed in reverse order: the compactor (which hooks into the store) goes first.
  std::unique_ptr<corm::Store> store_;
  std::unique_ptr<corm::Compactor> compactor_;
  RegionInfo region_;
};

}  // namespace farmem
