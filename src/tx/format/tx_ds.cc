// The owner-side decoders and the item reply of a user data structure's transaction RPCs
// (farmem/tx_ds.h): the tx wire formats (tx_wire.h) under public names. Pure functions.
#include "farmem/tx_ds.h"

#include <cstring>

#include "tx/format/tx_wire.h"

namespace farmem {

namespace wire = tx_wire;

Result<TxDsKeyRequest> DecodeTxDsKeyRequest(std::span<const std::byte> request) {
  FARMEM_ASSIGN_OR_RETURN(wire::KeyOp op, wire::DecodeKeyRequest(request, /*needs_txid=*/true));
  return TxDsKeyRequest{op.table, op.txid, op.lease_ns, op.key};
}

std::vector<std::byte> EncodeTxDsItemReply(uint64_t address, uint64_t version, uint64_t lock_txid,
                                           std::span<const std::byte> value) {
  const wire::ItemReply ir{address, version, lock_txid};
  std::vector<std::byte> out(sizeof(ir) + value.size());
  std::memcpy(out.data(), &ir, sizeof(ir));
  if (!value.empty()) std::memcpy(out.data() + sizeof(ir), value.data(), value.size());
  return out;
}

Result<TxDsValidateRequest> DecodeTxDsValidateRequest(std::span<const std::byte> request) {
  FARMEM_ASSIGN_OR_RETURN(wire::ValidateOp op, wire::DecodeValidateRequest(request));
  TxDsValidateRequest out{op.table, op.txid, {}};
  for (const wire::ValidateItem& item : op.items) out.items.push_back({item.version, item.key});
  return out;
}

Result<TxDsBatchRequest> DecodeTxDsBatchRequest(std::span<const std::byte> request, bool commit) {
  FARMEM_ASSIGN_OR_RETURN(wire::BatchOpRequest op, wire::DecodeBatchRequest(request, commit));
  TxDsBatchRequest out{op.table, op.txid, {}};
  for (const wire::BatchEntry& e : op.items) {
    out.items.push_back({static_cast<TxDsOp>(e.op), e.key, e.value});
  }
  return out;
}

}  // namespace farmem
