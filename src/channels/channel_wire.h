// Wire format of the channel control messages (RPCs in kChannelOpcodes; docs/channels.md, "Wire"):
// built by a ChannelThread opening an endpoint, parsed by the Manager's JOIN handler, which runs
// inline on the transport's progress thread. Fixed little-endian header, then the name bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "farmem/opcodes.h"

namespace farmem::channels::wire {

// JOIN: "node `from` has an endpoint of channel <name>, its slice is [offset, offset+length) of
// its channel region". Reply: JoinReply.
inline constexpr uint16_t kOpJoin = kChannelOpcodes.first + 0;
static_assert(kChannelOpcodes.contains(kOpJoin));

inline constexpr uint32_t kJoinMagic = 0x4a4e4843;  // "CHNJ"
inline constexpr uint16_t kMaxNameBytes = 256;

struct JoinRequest {
  uint32_t magic;
  uint32_t from;        // NodeId of the sender
  uint64_t offset;      // sender's slice offset in its channel region
  uint64_t length;      // slice bytes (must equal the receiver's)
  uint16_t name_bytes;  // followed by the name
  uint16_t reserved[3];
};
static_assert(sizeof(JoinRequest) == 32);
static_assert(offsetof(JoinRequest, name_bytes) == 24);

enum class JoinState : uint32_t {
  kJoined = 1,  // receiver has the endpoint: its slice follows
  kKept = 2,    // receiver has no endpoint yet: the join is kept until early_join_ttl
};

struct JoinReply {
  uint32_t state;  // JoinState
  uint32_t from;   // NodeId of the replier
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(JoinReply) == 24);

}  // namespace farmem::channels::wire
