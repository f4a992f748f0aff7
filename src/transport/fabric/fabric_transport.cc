// PLACEHOLDER (being written now): fabric backend.
#include "transport/fabric/fabric_transport.h"

namespace farmem {

Result<std::unique_ptr<Transport>> CreateFabricTransport(const TransportConfig&) {
  return Status::Unavailable("fabric backend is being written");
}

}  // namespace farmem
