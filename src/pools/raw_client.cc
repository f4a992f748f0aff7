// RawClient implementation: encodes requests with server_protocol.h, checks reply sizes before
// trusting them, and turns remote errors into Status values with context.
#include "farmem/client.h"

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pools/pools_wire.h"

namespace farmem {

namespace proto = server_proto;

RawClient::RawClient(Node& node, PeerInfo server) : node_(node), server_(std::move(server)) {}

Result<std::unique_ptr<RawClient>> RawClient::Connect(Node& node,
                                                      std::string_view bootstrap_address) {
  Result<PeerInfo> info = node.connect(bootstrap_address);
  if (!info.ok()) {
    return info.status().WithContext("connecting to farmemd at " + std::string(bootstrap_address));
  }
  return std::unique_ptr<RawClient>(new RawClient(node, std::move(*info)));
}

Task<Result<RawAllocation>> RawClient::alloc_raw(Scheduler& sched, uint64_t length) {
  const auto request = proto::Encode(proto::AllocRawRequest{length});
  std::byte reply[sizeof(proto::AllocRawReply)];
  Result<RpcReply> r =
      co_await sched.rpc(server_.id, RpcImm(proto::kOpAllocRaw), request, std::span(reply));
  if (!r.ok()) co_return r.status().WithContext("ALLOC_RAW " + std::to_string(length));
  auto msg = proto::Decode<proto::AllocRawReply>(std::span<const std::byte>(reply, r->length));
  if (!msg) {
    co_return Status::Protocol("ALLOC_RAW reply has " + std::to_string(r->length) +
                               " bytes, expected " + std::to_string(sizeof(reply)));
  }
  if (msg->length < length) {
    co_return Status::Protocol("ALLOC_RAW granted " + std::to_string(msg->length) +
                               " bytes for a request of " + std::to_string(length));
  }
  co_return RawAllocation{RemoteRef{server_.id, msg->key, msg->offset}, msg->length};
}

Task<Status> RawClient::free_raw(Scheduler& sched, RemoteRef ref) {
  if (ref.peer != server_.id) {
    co_return Status::InvalidArgument("FREE_RAW: reference belongs to another peer");
  }
  const auto request = proto::Encode(proto::FreeRawRequest{ref.key, ref.offset});
  std::byte reply[sizeof(proto::FreeRawReply)];
  Result<RpcReply> r =
      co_await sched.rpc(server_.id, RpcImm(proto::kOpFreeRaw), request, std::span(reply));
  if (!r.ok()) co_return r.status().WithContext("FREE_RAW offset " + std::to_string(ref.offset));
  if (r->length != sizeof(reply)) {
    co_return Status::Protocol("FREE_RAW reply has " + std::to_string(r->length) +
                               " bytes, expected " + std::to_string(sizeof(reply)));
  }
  co_return Status::OK();
}

Task<Result<std::string>> RawClient::stats_json(Scheduler& sched) {
  std::vector<std::byte> reply(node_.config().transport.max_rpc_bytes);
  Result<RpcReply> r = co_await sched.rpc(server_.id, RpcImm(proto::kOpStat), {}, reply);
  if (!r.ok()) co_return r.status().WithContext("STAT");
  if (r->length > reply.size()) co_return Status::Protocol("STAT reply longer than its buffer");
  const char* text = reinterpret_cast<const char*>(reply.data());
  nlohmann::json j = nlohmann::json::parse(text, text + r->length, nullptr, false);
  if (j.is_discarded() || !j.is_object()) co_return Status::Protocol("STAT reply is not JSON");
  co_return std::string(text, r->length);
}

Result<RawAllocation> RawClient::alloc_raw(uint64_t length) {
  std::lock_guard lock(mu_);
  if (!sched_) {
    FARMEM_ASSIGN_OR_RETURN(sched_, node_.make_scheduler());
  }
  return sched_->block_on(alloc_raw(*sched_, length));
}

Status RawClient::free_raw(const RemoteRef& ref) {
  std::lock_guard lock(mu_);
  if (!sched_) {
    FARMEM_ASSIGN_OR_RETURN(sched_, node_.make_scheduler());
  }
  return sched_->block_on(free_raw(*sched_, ref));
}

Result<std::string> RawClient::stats_json() {
  std::lock_guard lock(mu_);
  if (!sched_) {
    FARMEM_ASSIGN_OR_RETURN(sched_, node_.make_scheduler());
  }
  return sched_->block_on(stats_json(*sched_));
}

}  // namespace farmem
