// The JSON value of a membership key (/farmem/<cluster>/members/<name>) and of the cluster key,
// shared by Cluster and the tests that write member keys directly. Pure functions, any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "farmem/cluster.h"
#include "farmem/status.h"

namespace farmem::cluster {

enum class MemberState { kUp, kLeaving };

struct MemberRecord {
  ClusterMember member;  // lease_left and revision are not part of the value
  MemberState state = MemberState::kUp;
};

// {"name","address","roles":[...],"capacity_bytes","state":"up"|"leaving"}
std::string EncodeMember(const ClusterMember& member, MemberState state);
// Protocol for anything that is not such an object (a foreign or corrupt key).
Result<MemberRecord> DecodeMember(std::string_view json);

// {"created_unix_ms": N}
std::string EncodeClusterRecord(int64_t created_unix_ms);

}  // namespace farmem::cluster
