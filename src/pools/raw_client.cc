// RawClient implementation: ALLOC_RAW / FREE_RAW / STAT through the shared typed RPC helper
// (node/rpc_call.h: reply sizes checked, errors with context) and its BlockingRunner; the session
// is a SessionKeeper (node/session_keeper.h).
#include "farmem/client.h"

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "node/rpc_call.h"
#include "node/session_keeper.h"
#include "pools/pools_wire.h"

namespace farmem {

namespace proto = server_proto;

RawClient::RawClient(Node& node, PeerInfo server, RawClientOptions options)
    : node_(node),
      server_(std::move(server)),
      blocking_(std::make_unique<BlockingRunner>(node, "RawClient")),
      sessions_(std::make_unique<SessionKeeper>(
          node,
          SessionKeeperOptions{options.session_ttl, "", "RawClient", options.cluster_member})) {}

RawClient::~RawClient() {
  sessions_->close();  // the server frees this client's session ranges now
}

Result<std::unique_ptr<RawClient>> RawClient::Connect(Node& node,
                                                      std::string_view bootstrap_address,
                                                      RawClientOptions options) {
  Result<PeerInfo> info = node.connect(bootstrap_address);
  if (!info.ok()) {
    return info.status().WithContext("connecting to farmemd at " + std::string(bootstrap_address));
  }
  std::unique_ptr<RawClient> c(new RawClient(node, std::move(*info), options));
  if (!options.open_session) return c;
  if (Status st = c->sessions_->open(c->server_.id); !st.ok()) {
    return st.WithContext("opening a session with farmemd at " + std::string(bootstrap_address));
  }
  return c;
}

SessionClientStats RawClient::session_stats() const {
  return sessions_->stats();
}

uint64_t RawClient::session_id() const {
  return sessions_->session_id(server_.id);
}

std::chrono::milliseconds RawClient::session_ttl() const {
  return sessions_->granted_ttl(server_.id);
}

Task<Result<RawAllocation>> RawClient::alloc_raw(Scheduler& sched, uint64_t length,
                                                 Lifetime lifetime) {
  const bool persistent = lifetime == Lifetime::kPersistent;
  uint64_t session = persistent ? 0 : sessions_->session_id(server_.id);
  if (!persistent && session == 0) {
    co_return Status::FailedPrecondition("ALLOC_RAW: the client has no session");
  }
  Result<proto::AllocRawReply> msg = co_await CallStruct<proto::AllocRawReply>(
      sched, server_.id, proto::kOpAllocRaw, proto::AllocRawRequest{length, session},
      "ALLOC_RAW " + std::to_string(length));
  if (!persistent && msg.status().code() == Code::kNotFound) {
    // The lease ran out before the keeper noticed (the process was stalled): a new session.
    Result<uint64_t> fresh = co_await sessions_->renew(sched, server_.id, session);
    if (!fresh.ok()) co_return fresh.status().WithContext("ALLOC_RAW");
    session = *fresh;
    msg = co_await CallStruct<proto::AllocRawReply>(sched, server_.id, proto::kOpAllocRaw,
                                                    proto::AllocRawRequest{length, session},
                                                    "ALLOC_RAW " + std::to_string(length));
  }
  if (!msg.ok()) co_return msg.status();
  if (msg->length < length) {
    co_return Status::Protocol("ALLOC_RAW granted " + std::to_string(msg->length) +
                               " bytes for a request of " + std::to_string(length));
  }
  co_return RawAllocation{RemoteRef{server_.id, msg->key, msg->offset}, msg->length, persistent};
}

Task<Status> RawClient::free_raw(Scheduler& sched, RemoteRef ref) {
  if (ref.peer != server_.id) {
    co_return Status::InvalidArgument("FREE_RAW: reference belongs to another peer");
  }
  Result<proto::FreeRawReply> msg = co_await CallStruct<proto::FreeRawReply>(
      sched, server_.id, proto::kOpFreeRaw, proto::FreeRawRequest{ref.key, ref.offset},
      "FREE_RAW offset " + std::to_string(ref.offset));
  co_return msg.status();
}

Task<Result<std::string>> RawClient::stats_json(Scheduler& sched) {
  std::vector<std::byte> reply(node_.config().transport.max_rpc_bytes);
  Result<std::span<const std::byte>> r =
      co_await CallRpc(sched, server_.id, kOpStat, {}, reply, "STAT");
  if (!r.ok()) co_return r.status();
  const std::string text(reinterpret_cast<const char*>(r->data()), r->size());
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) co_return Status::Protocol("STAT reply is not JSON");
  co_return text;
}

Result<RawAllocation> RawClient::alloc_raw(uint64_t length, Lifetime lifetime) {
  return blocking_->run([&](Scheduler& s) { return alloc_raw(s, length, lifetime); });
}

Status RawClient::free_raw(const RemoteRef& ref) {
  return blocking_->run([&](Scheduler& s) { return free_raw(s, ref); });
}

Result<std::string> RawClient::stats_json() {
  return blocking_->run([&](Scheduler& s) { return stats_json(s); });
}

}  // namespace farmem
