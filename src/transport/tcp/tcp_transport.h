// Native batched TCP backend: a NIC thread per transport serves one-sided frames from registered
// memory; contexts batch requests per connection. Source files: docs/wire-format.md (end).
#pragma once

#include <cstdint>
#include <memory>

#include "farmem/transport.h"

namespace farmem {

Result<std::unique_ptr<Transport>> CreateTcpTransport(const TransportConfig& config);

// Counters of one initiator Context (for tests and benchmarks; read from the owning thread).
struct TcpContextStats {
  uint64_t frames_posted = 0;    // request frames appended to send buffers
  uint64_t send_calls = 0;       // send() syscalls that flushed send buffers
  uint64_t recv_calls = 0;       // recv() syscalls that returned bytes
  uint64_t frames_received = 0;  // response frames decoded
  uint64_t stale_responses = 0;  // responses for ops that had already completed (discarded)
  uint64_t connects = 0;         // connections opened
  uint64_t waits = 0;            // wait() calls that blocked in ppoll()
};

// Counters of a transport's NIC thread (relaxed snapshots; safe from any thread).
struct TcpTransportStats {
  uint64_t connections_accepted = 0;
  uint64_t frames_served = 0;    // request frames handled (hello included)
  uint64_t send_calls = 0;       // send() syscalls on target connections
  uint64_t protocol_errors = 0;  // connections closed for malformed frames or a wrong token
  uint64_t read_copy_waits = 0;  // wait_for_read_copies calls (CoRM merges' grace periods)
  // Connection limits (TransportConfig::tcp_limits, docs/transport.md "Connection limits").
  uint64_t refused_unauthenticated_oversize = 0;  // first frame announced > max_unauth. bytes
  uint64_t auth_timeouts = 0;          // closed without authenticating within auth_timeout
  uint64_t refused_per_address = 0;    // closed at accept: max_connections_per_address reached
  uint64_t refused_total = 0;          // closed at accept: max_connections reached
  uint64_t backpressure_events = 0;    // times a connection's reads were paused (replies queued)
  uint64_t throttled_connections = 0;  // connections paused right now (gauge)
  uint64_t peak_send_queue_bytes = 0;  // most reply bytes ever queued for one connection
  uint64_t queued_reply_bytes = 0;     // reply bytes queued for all connections now (gauge)
  uint64_t peak_total_send_queue_bytes = 0;  // most reply bytes ever queued for all together
  uint64_t accept_backoffs = 0;              // accept failures (EMFILE...) that paused the listener
  uint64_t open_connections = 0;             // accepted connections not yet closed (gauge)
};

// Both return InvalidArgument when the object is not from the TCP backend.
Result<TcpContextStats> GetTcpContextStats(const Context& context);
Result<TcpTransportStats> GetTcpTransportStats(const Transport& transport);

}  // namespace farmem
