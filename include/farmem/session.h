// Lifetime of a farmemd allocation (docs/sessions.md): owned by the client session that made it
// (freed when the session ends: closed by the client, or its lease ran out) or persistent (lives
// until freed explicitly). Used by RawClient::alloc_raw and ObjectClient::alloc.
#pragma once

#include <cstdint>

namespace farmem {

enum class Lifetime : uint8_t {
  // Freed by the server when the client's session ends: the client was destroyed, or it stopped
  // renewing its lease (crashed, killed, partitioned) for longer than the lease. The default.
  kSession = 0,
  // Survives its client; only an explicit free releases it (shared data, demos, caches).
  kPersistent = 1,
};

// Counters of a client's sessions (SessionKeeper; RawClient/ObjectClient::session_stats()).
struct SessionClientStats {
  uint64_t opened = 0;            // SESSION_OPEN answered (including re-opens)
  uint64_t keepalives = 0;        // SESSION_KEEPALIVE answered OK
  uint64_t lost = 0;              // leases the server no longer knew (its allocations were freed)
  uint64_t keepalive_errors = 0;  // keepalives that failed otherwise (timeout, peer gone)
};

}  // namespace farmem
