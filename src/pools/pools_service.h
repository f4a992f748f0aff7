// PoolsService: farmemd's raw memory — the PoolSet of memfd pools, each exported as one region,
// behind ALLOC_RAW / FREE_RAW (pools_wire.h); ranges allocated in a client session are freed when
// it ends (RawOwners). Owns the STAT keys "memory", "pools" and "pools_truncated" and the
// farmem_memory_* / farmem_pool_* metrics.
#pragma once

#include <vector>

#include "farmem/node.h"
#include "farmem/status.h"
#include "service/service.h"

namespace farmem {

class RawOwners;
class SessionRegistry;

// Flags --memory-mib (shared budget, read by other services too) and --pool-mib; the factory.
const ServiceDescriptor& PoolsServiceDescriptor();

// The service's RPC handlers without a node around them: decode and check the request bytes
// (pools_wire.h), act on `pools` (ALLOC_RAW: for the session the request names, looked up in
// `sessions`), encode the reply into `reply` (left empty on error). The PoolsService methods are
// exactly these; pools_rpc_fuzz.cc drives them in-process.
Status ServeAllocRaw(RawOwners& pools, SessionRegistry& sessions, const RpcCall& call,
                     std::vector<std::byte>& reply);
Status ServeFreeRaw(RawOwners& pools, const RpcCall& call, std::vector<std::byte>& reply);

}  // namespace farmem
