// Names of transport operation types for messages and logs (shared by every backend, so it lives
// below them in farmem_common).
#include "farmem/transport.h"

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

}  // namespace farmem
