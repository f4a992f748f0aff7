// PLACEHOLDER (being written now): tcp backend.
#include "transport/tcp/tcp_transport.h"

namespace farmem {

Result<std::unique_ptr<Transport>> CreateTcpTransport(const TransportConfig&) {
  return Status::Unavailable("tcp backend is being written");
}

}  // namespace farmem
