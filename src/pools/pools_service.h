// PoolsService: farmemd's raw memory — the PoolSet of memfd pools, each exported as one region,
// behind ALLOC_RAW / FREE_RAW (pools_wire.h). Owns the STAT keys "memory", "pools" and
// "pools_truncated" and the farmem_memory_* / farmem_pool_* metrics.
#pragma once

#include <vector>

#include "farmem/node.h"
#include "farmem/status.h"
#include "service/service.h"

namespace farmem {

class PoolSet;

// Flags --memory-mib (shared budget, read by other services too) and --pool-mib; the factory.
const ServiceDescriptor& PoolsServiceDescriptor();

// The service's RPC handlers without a node around them: decode and check the request bytes
// (pools_wire.h), act on `pools`, encode the reply into `reply` (left empty on error). The
// PoolsService methods are exactly these; pools_rpc_fuzz.cc drives them in-process.
Status ServeAllocRaw(PoolSet& pools, const RpcCall& call, std::vector<std::byte>& reply);
Status ServeFreeRaw(PoolSet& pools, const RpcCall& call, std::vector<std::byte>& reply);

}  // namespace farmem
