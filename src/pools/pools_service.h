// PoolsService: farmemd's raw memory — the PoolSet of memfd pools, each exported as one region,
// behind ALLOC_RAW / FREE_RAW (pools_wire.h). Owns the STAT keys "memory", "pools" and
// "pools_truncated" and the farmem_memory_* / farmem_pool_* metrics.
#pragma once

#include "service/service.h"

namespace farmem {

// Flags --memory-mib (shared budget, read by other services too) and --pool-mib; the factory.
const ServiceDescriptor& PoolsServiceDescriptor();

}  // namespace farmem
