// Transport factory: picks the backend named in TransportConfig.
#include "farmem/transport.h"

#include "transport/fabric/fabric_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace farmem {

std::string_view OpTypeName(OpType op) {
  switch (op) {
    case OpType::kRead:
      return "read";
    case OpType::kWrite:
      return "write";
    case OpType::kCompareSwap:
      return "cas";
    case OpType::kFetchAdd:
      return "faa";
    case OpType::kRpc:
      return "rpc";
  }
  return "unknown";
}

Result<std::unique_ptr<Transport>> Transport::Create(const TransportConfig& config) {
  if (config.backend == "tcp") return CreateTcpTransport(config);
  if (config.backend == "fabric") return CreateFabricTransport(config);
  return Status::InvalidArgument("unknown transport backend '" + config.backend +
                                 "' (expected 'tcp' or 'fabric')");
}

}  // namespace farmem
