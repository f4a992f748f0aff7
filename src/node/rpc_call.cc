// CallRpc: post, await, bound-check and contextualize one request/reply RPC.
#include "node/rpc_call.h"

namespace farmem {

Task<Result<std::span<const std::byte>>> CallRpc(Scheduler& sched, PeerId peer, uint16_t opcode,
                                                 std::span<const std::byte> request,
                                                 std::span<std::byte> reply, std::string what) {
  Result<RpcReply> r = co_await sched.rpc(peer, RpcImm(opcode), request, reply);
  if (!r.ok()) co_return r.status().WithContext(what);
  // A transport reports the reply's true length; one longer than the buffer was truncated.
  if (r->length > reply.size()) {
    co_return Status::Protocol(what + ": reply of " + std::to_string(r->length) +
                               " bytes does not fit its " + std::to_string(reply.size()) +
                               "-byte buffer");
  }
  co_return std::span<const std::byte>(reply.data(), r->length);
}

}  // namespace farmem
