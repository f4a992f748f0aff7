// Wire format of farmemd's client sessions (SESSION_OPEN / _KEEPALIVE / _CLOSE, opcodes in
// farmem/opcodes.h; documented in docs/sessions.md and docs/wire-format.md). In the node layer so
// that clients (RawClient, ObjectClient via SessionKeeper) and farmemd's SessionRegistry share it.
// All integers little-endian; structs travel as raw bytes (common/wire_struct.h), sizes pinned.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "farmem/opcodes.h"

namespace farmem::session_wire {

inline constexpr uint16_t kOpOpen = kOpSessionOpen;
inline constexpr uint16_t kOpKeepalive = kOpSessionKeepalive;
inline constexpr uint16_t kOpClose = kOpSessionClose;

// The session id that means "no session": an allocation with it is persistent.
inline constexpr uint64_t kPersistentSession = 0;

// Bytes of the client's label (node name or cluster member name), NUL-padded; longer names are
// cut. For logs, and, with kOpenFlagClusterMember, the cluster member whose lease the session
// follows.
inline constexpr size_t kLabelBytes = 48;
// The label is the client's cluster member name: a farmemd running with --cluster ends the
// session as soon as that member's lease expires (not only when the session's own lease does).
inline constexpr uint32_t kOpenFlagClusterMember = 1u << 0;
// A request with unknown flag bits is refused (InvalidArgument) so that a future flag is never
// silently ignored by an old server.
inline constexpr uint32_t kOpenKnownFlags = kOpenFlagClusterMember;

// SESSION_OPEN: ask for a lease of `ttl_ms` (0 = the server's default of 10 s); the server grants
// it clamped to [1 s, --session-ttl-max].
struct OpenRequest {
  uint32_t ttl_ms;
  uint32_t flags;  // 0
  char label[kLabelBytes];
};
struct OpenReply {
  uint64_t session_id;  // random, never 0
  uint32_t ttl_ms;      // granted lease: renew (KEEPALIVE) well within it
  uint32_t reserved;    // 0
};
// SESSION_KEEPALIVE: renews the lease for another ttl_ms. Reply: empty; NotFound when the
// session is unknown or already ended (its allocations are gone).
struct KeepaliveRequest {
  uint64_t session_id;
};
// SESSION_CLOSE: ends the session now, freeing what it owned. NotFound like KEEPALIVE.
struct CloseRequest {
  uint64_t session_id;
};
struct CloseReply {
  uint64_t objects_freed;    // objects the session owned, freed by the objects service
  uint64_t raw_bytes_freed;  // raw bytes it owned, freed by the pools service
};

static_assert(sizeof(OpenRequest) == 56 && std::is_trivially_copyable_v<OpenRequest>);
static_assert(sizeof(OpenReply) == 16 && std::is_trivially_copyable_v<OpenReply>);
static_assert(sizeof(KeepaliveRequest) == 8 && std::is_trivially_copyable_v<KeepaliveRequest>);
static_assert(sizeof(CloseRequest) == 8 && std::is_trivially_copyable_v<CloseRequest>);
static_assert(sizeof(CloseReply) == 16 && std::is_trivially_copyable_v<CloseReply>);

// The label as text: up to the first NUL (or all kLabelBytes).
inline std::string_view LabelOf(const OpenRequest& r) {
  size_t n = 0;
  while (n < kLabelBytes && r.label[n] != '\0') ++n;
  return {r.label, n};
}

}  // namespace farmem::session_wire
