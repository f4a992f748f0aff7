// libfabric FI_EP_RDM backend (providers shm, tcp;ofi_rxm, verbs;ofi_rxm): see fabric_transport.cc
// and docs/fabric.md. Besides the factory, this header exposes a few hooks the backend's own tests
// use to reach code paths the local providers would not take by themselves.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "farmem/transport.h"

namespace farmem {

Result<std::unique_ptr<Transport>> CreateFabricTransport(const TransportConfig& config);

namespace fabric {

// Knobs for tests only; production code uses CreateFabricTransport.
struct FabricOptions {
  // Behave as if the provider required FI_MR_LOCAL (register every local buffer and pass its
  // descriptor). Always legal, so it exercises the verbs-style path on shm / tcp.
  bool force_mr_local = false;
  // Post WRITE/CAS/FAA to read-only regions instead of failing them at the initiator, so tests
  // can observe what the provider itself does with an FI_REMOTE_READ-only region.
  bool skip_access_check = false;
  // shm only: the idle progress thread sleeps on its doorbell with no timeout, so an operation
  // whose initiator fails to ring it never completes (instead of completing after the usual
  // idle timeout). For wake-up tests; nothing else may rely on the doorbell alone.
  bool idle_wait_forever = false;
};
Result<std::unique_ptr<Transport>> CreateFabricTransportWithOptions(const TransportConfig& config,
                                                                    const FabricOptions& options);

// Counters of one fabric Context (zeros for contexts of other backends).
struct ContextStats {
  uint64_t lookups_sent = 0;  // internal key-lookup RPCs sent
  uint64_t cache_hits = 0;    // operations that found their (peer, key) in the lookup cache
  uint64_t eagain_retries = 0;
  uint64_t direct_copies = 0;   // shm reads copied with process_vm_readv here (TryDirectCopy)
  uint64_t ordered_copies = 0;  // read_ordered_now calls done in place (one process_vm_readv)
};
ContextStats GetContextStats(const Context& context);

// The mr_mode handling chosen for a fabric transport, e.g. "VIRT_ADDR" ("" for other backends).
std::string MrPlanOf(const Transport& transport);

}  // namespace fabric
}  // namespace farmem
