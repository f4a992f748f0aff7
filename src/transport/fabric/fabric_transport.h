// libfabric FI_EP_RDM backend (providers shm, tcp;ofi_rxm, verbs;ofi_rxm): see fabric_transport.cc.
#pragma once

#include <memory>

#include "farmem/transport.h"

namespace farmem {

Result<std::unique_ptr<Transport>> CreateFabricTransport(const TransportConfig& config);

}  // namespace farmem
