// Transport factory: picks the backend named in TransportConfig.
#include "farmem/transport.h"

#include "transport/fabric/fabric_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace farmem {

Result<std::unique_ptr<Transport>> Transport::Create(const TransportConfig& config) {
  if (config.backend == "tcp") return CreateTcpTransport(config);
  if (config.backend == "fabric") return CreateFabricTransport(config);
  return Status::InvalidArgument("unknown transport backend '" + config.backend +
                                 "' (expected 'tcp' or 'fabric')");
}

}  // namespace farmem
