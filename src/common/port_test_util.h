// Test helper: a free loopback TCP port for a test's daemons and nodes, drawn at random *below*
// the kernel's ephemeral range. Header-only; any thread may call it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <random>

namespace farmem::testing {

// A loopback TCP port nothing listens on (it binds, then is released), drawn at random from
// 10000 up to the start of /proc/sys/net/ipv4/ip_local_port_range (32768 by default). A port
// bind(0) hands out comes from that ephemeral range, where every outgoing connection of the tests
// running beside this one takes its local port too; one of them took such a port between its
// release and its use ("Address already in use" in CI). 0 if 200 draws were all taken.
inline uint16_t FreePortBelowEphemeralRange() {
  static std::mutex mu;
  static std::mt19937 rng{std::random_device{}()};
  unsigned low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    unsigned lo = 0, hi = 0;
    if (std::fscanf(f, "%u %u", &lo, &hi) == 2 && lo > 12000) low = lo;
    std::fclose(f);
  }
  for (int attempt = 0; attempt < 200; ++attempt) {
    uint16_t port;
    {
      std::lock_guard lock(mu);
      port = static_cast<uint16_t>(10000 + rng() % (low - 10000));
    }
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    const bool available = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(fd);
    if (available) return port;
  }
  return 0;
}

}  // namespace farmem::testing
