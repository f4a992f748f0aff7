// libFuzzer target for the tx RPCs (tx/format/tx_wire.h): each input is a list of request bodies
// of any size and content, decoded by the wire decoders and served by TxService::Handle against
// real tables (one long-lived service over an unstarted node), as RPC workers run them.
// Beyond "no crash": a decoder either refuses a body with kProtocol or accepts one that its
// encoder reproduces byte for byte; an OK reply has its opcode's exact size; an error reply is
// empty. Built with -DFARMEM_FUZZ=ON (scripts/test --fuzz). Single-threaded.
//
// Input: a list of operations, each an opcode byte (op % 10 picks TX_TABLE_INFO .. TX_STATUS), a
// length byte and that many request bytes. Keys of table 0 are 8 bytes, values 16.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/fuzz_support.h"
#include "farmem/node.h"
#include "farmem/server.h"
#include "tx/format/tx_wire.h"
#include "tx/service/tx_service.h"

namespace {

using namespace farmem;
namespace wire = farmem::tx_wire;

TxService& TheService() {
  static std::unique_ptr<Node> node;
  static std::unique_ptr<TxService> service = [] {
    NodeConfig nc;
    nc.name = "tx-rpc-fuzz";
    nc.transport.backend = "tcp";
    nc.transport.cluster_token = "fuzz";
    auto n = Node::Create(nc);
    FUZZ_CHECK(n.ok());
    node = std::move(*n);
    ServerConfig sc;
    sc.tx.tables = {"t:8:16:16:2", "u:16:8:4:1"};
    auto s = TxService::Create(sc, *node);
    FUZZ_CHECK(s.ok());
    return std::move(*s);
  }();
  return *service;
}

void CheckDecoders(uint16_t opcode, std::span<const std::byte> body) {
  switch (opcode) {
    case wire::kOpLookup:
    case wire::kOpLock:
    case wire::kOpLockInsert: {
      auto op = wire::DecodeKeyRequest(body, opcode != wire::kOpLookup);
      if (!op.ok()) {
        FUZZ_CHECK(op.status().code() == Code::kProtocol);
        return;
      }
      const auto again = wire::EncodeKeyRequest(op->table, op->key, op->txid, op->lease_ns);
      FUZZ_CHECK(again.size() == body.size() &&
                 std::memcmp(again.data(), body.data(), body.size()) == 0);
      return;
    }
    case wire::kOpValidate: {
      auto op = wire::DecodeValidateRequest(body);
      if (!op.ok()) {
        FUZZ_CHECK(op.status().code() == Code::kProtocol);
        return;
      }
      const auto again = wire::EncodeValidateRequest(op->table, op->txid, op->items);
      FUZZ_CHECK(again.size() == body.size() &&
                 std::memcmp(again.data(), body.data(), body.size()) == 0);
      return;
    }
    case wire::kOpCommit:
    case wire::kOpUnlock: {
      auto op = wire::DecodeBatchRequest(body, opcode == wire::kOpCommit);
      if (!op.ok()) {
        FUZZ_CHECK(op.status().code() == Code::kProtocol);
        return;
      }
      const auto again = wire::EncodeBatchRequest(op->table, op->txid, op->items);
      FUZZ_CHECK(again.size() == body.size() &&
                 std::memcmp(again.data(), body.data(), body.size()) == 0);
      return;
    }
    case wire::kOpPrepare:
    case wire::kOpDecide: {
      auto op = wire::DecodeTwoPhaseRequest(body, opcode == wire::kOpPrepare);
      if (!op.ok()) {
        FUZZ_CHECK(op.status().code() == Code::kProtocol);
        return;
      }
      const std::vector<std::string> parts(op->participants.begin(), op->participants.end());
      const auto again = wire::EncodeTwoPhaseRequest(op->txid, op->lease_ns, op->decision,
                                                     op->num_participants, parts, op->items);
      FUZZ_CHECK(again.size() == body.size() &&
                 std::memcmp(again.data(), body.data(), body.size()) == 0);
      return;
    }
    case wire::kOpStatus: {
      auto op = wire::DecodeStatusRequest(body);
      FUZZ_CHECK(op.ok() || op.status().code() == Code::kProtocol);
      return;
    }
    default:
      return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  farmem::fuzz::RestoreCrashSignals();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  TxService& service = TheService();
  size_t at = 0;
  while (at + 2 <= size) {
    const uint16_t opcode = static_cast<uint16_t>(wire::kOpTableInfo + data[at] % 10);
    const size_t len = std::min<size_t>(data[at + 1], size - at - 2);
    const auto body = std::as_bytes(std::span(data + at + 2, len));
    at += 2 + len;
    CheckDecoders(opcode, body);
    RpcCall call{opcode, body, "fuzz"};
    std::vector<std::byte> reply;
    const Status st = service.Handle(call, reply);
    if (!st.ok()) continue;  // the node discards the reply of a failed call
    switch (opcode) {
      case wire::kOpLookup:
      case wire::kOpLock: {
        const auto op = wire::DecodeKeyRequest(body, opcode == wire::kOpLock);
        FUZZ_CHECK(op.ok());
        const uint32_t vsize = op->table == 0 ? 16 : 8;
        FUZZ_CHECK(reply.size() == sizeof(wire::ItemReply) + vsize);
        break;
      }
      case wire::kOpLockInsert:
        FUZZ_CHECK(reply.size() == sizeof(wire::ItemReply));
        break;
      case wire::kOpTableInfo:
        FUZZ_CHECK(wire::DecodeTableInfoReply(reply).ok());
        break;
      case wire::kOpStatus:
        FUZZ_CHECK(wire::DecodeStatusReply(reply).ok());
        break;
      default:
        FUZZ_CHECK(reply.empty());
        break;
    }
  }
  return 0;
}
