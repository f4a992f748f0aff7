// Native batched TCP backend: see tcp_transport.cc and docs/wire-format.md.
#pragma once

#include <memory>

#include "farmem/transport.h"

namespace farmem {

Result<std::unique_ptr<Transport>> CreateTcpTransport(const TransportConfig& config);

}  // namespace farmem
