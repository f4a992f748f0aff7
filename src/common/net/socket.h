// Socket helpers every TCP user in farmem shares (bootstrap, metrics endpoint, native TCP
// transport): name resolution, listening, connecting and whole-buffer I/O with deadlines, and
// address formatting. Stateless; safe from any thread. Every wait has a deadline.
#pragma once

#include <netdb.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/net/fd.h"
#include "farmem/status.h"

namespace farmem::net {

using Clock = std::chrono::steady_clock;

// Milliseconds until `deadline`, rounded up so a sub-millisecond remainder still polls once.
int MsLeft(Clock::time_point deadline);

// "host:port", or "[v6]:port" for an IPv6 literal.
std::string FormatHostPort(const std::string& host, uint16_t port);
// The address of an AF_INET / AF_INET6 socket address as FormatHostPort text; "?" otherwise.
std::string FormatSockaddr(const sockaddr_storage& ss);
// The peer's IP address as raw bytes, the port left out ("" for other families): the key of the
// listeners' per-address limits.
std::string AddressKey(const sockaddr_storage& ss);

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;
// getaddrinfo for a stream socket (numeric port; `passive` for a listener). Unavailable on failure.
Result<AddrInfoPtr> Resolve(const std::string& host, uint16_t port, bool passive);

// A non-blocking, close-on-exec listening TCP socket on host:port (port 0 = any free port) with
// SO_REUSEADDR. `what` prefixes errors ("bootstrap"). `bound_port` gets the port bound.
Result<Fd> Listen(const std::string& host, uint16_t port, int backlog, std::string_view what,
                  uint16_t* bound_port);

// A non-blocking TCP connection (TCP_NODELAY) to host:port, or an error once `deadline` passes.
Result<Fd> ConnectWithDeadline(const std::string& host, uint16_t port, Clock::time_point deadline,
                               std::string_view what);

// Starts a non-blocking TCP connection (TCP_NODELAY, close-on-exec) to one resolved address
// without waiting: `*connected` is true if it completed at once, false while it is in progress
// (poll for POLLOUT, then read SO_ERROR). Unavailable with the errno text if it cannot start.
Result<Fd> StartConnect(const sockaddr* addr, socklen_t len, bool* connected);

// Waits until `fd` is ready for `events` (POLLIN/POLLOUT) or the deadline passes (TimedOut with
// `timeout_message`).
Status WaitFd(int fd, short events, Clock::time_point deadline, std::string_view timeout_message);

// Sends / receives exactly the buffer on a non-blocking socket by the deadline. `what` names the
// exchange in errors ("bootstrap: handshake with 10.0.0.1:7700"); a closed peer is Unavailable.
Status SendAll(int fd, std::string_view data, Clock::time_point deadline, std::string_view what);
Status RecvAll(int fd, void* buf, size_t len, Clock::time_point deadline, std::string_view what);

}  // namespace farmem::net
