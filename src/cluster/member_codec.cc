// JSON encoding of member and cluster records (see member_codec.h). No state; any thread.
#include "cluster/member_codec.h"

#include <nlohmann/json.hpp>

namespace farmem::cluster {

using json = nlohmann::json;

std::string EncodeMember(const ClusterMember& member, MemberState state) {
  json j = {{"name", member.name},
            {"address", member.address},
            {"roles", member.roles},
            {"capacity_bytes", member.capacity_bytes},
            {"state", state == MemberState::kUp ? "up" : "leaving"}};
  // replace: a name or role with bytes that are not UTF-8 must not throw.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<MemberRecord> DecodeMember(std::string_view text) {
  // No exceptions: a corrupt value written by someone else must not take the watcher down.
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Status::Protocol("member value is not a JSON object");
  MemberRecord r;
  auto name = j.find("name");
  auto state = j.find("state");
  if (name == j.end() || !name->is_string() || state == j.end() || !state->is_string()) {
    return Status::Protocol("member value lacks name/state");
  }
  r.member.name = name->get<std::string>();
  std::string s = state->get<std::string>();
  if (s == "up") {
    r.state = MemberState::kUp;
  } else if (s == "leaving") {
    r.state = MemberState::kLeaving;
  } else {
    return Status::Protocol("member state '" + s + "' is neither up nor leaving");
  }
  if (auto a = j.find("address"); a != j.end() && a->is_string()) {
    r.member.address = a->get<std::string>();
  }
  if (auto roles = j.find("roles"); roles != j.end() && roles->is_array()) {
    for (const auto& role : *roles) {
      if (role.is_string()) r.member.roles.push_back(role.get<std::string>());
    }
  }
  if (auto c = j.find("capacity_bytes"); c != j.end() && c->is_number_unsigned()) {
    r.member.capacity_bytes = c->get<uint64_t>();
  }
  return r;
}

std::string EncodeClusterRecord(int64_t created_unix_ms) {
  return json{{"created_unix_ms", created_unix_ms}}.dump();
}

}  // namespace farmem::cluster
