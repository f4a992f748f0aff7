// Tests for the shared socket helpers of src/common/net: StartConnect (the native TCP transport's
// non-blocking connect), ParseHostPort's refusal of an IPv6 host without brackets, and the
// address formatting the transport uses for its local address and peer names.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "common/net/fd.h"
#include "common/net/host_port.h"
#include "common/net/socket.h"

namespace farmem::net {
namespace {

sockaddr_in Loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// Polls a connect in progress to its end; returns SO_ERROR (0 = connected).
int FinishConnect(int fd) {
  pollfd p{fd, POLLOUT, 0};
  EXPECT_EQ(::poll(&p, 1, 5000), 1);
  int err = 0;
  socklen_t len = sizeof(err);
  EXPECT_EQ(::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len), 0);
  return err;
}

TEST(NetSocket, StartConnectReachesAListenerWithoutWaiting) {
  uint16_t port = 0;
  auto listener = Listen("127.0.0.1", 0, 4, "test", &port);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  ASSERT_NE(port, 0);
  const sockaddr_in addr = Loopback(port);
  bool connected = true;
  auto fd = StartConnect(reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), &connected);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  ASSERT_TRUE(fd->valid());
  if (!connected) {
    EXPECT_EQ(FinishConnect(fd->get()), 0);
  }
  int nodelay = 0;
  socklen_t len = sizeof(nodelay);
  ASSERT_EQ(::getsockopt(fd->get(), IPPROTO_TCP, TCP_NODELAY, &nodelay, &len), 0);
  EXPECT_NE(nodelay, 0);
  pollfd p{listener->get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  Fd accepted(::accept(listener->get(), nullptr, nullptr));
  EXPECT_TRUE(accepted.valid());
}

TEST(NetSocket, StartConnectToAClosedPortFailsOrReportsTheErrorLater) {
  uint16_t port = 0;
  {
    auto listener = Listen("127.0.0.1", 0, 4, "test", &port);
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  }  // closed: nothing listens on `port` now
  const sockaddr_in addr = Loopback(port);
  bool connected = false;
  auto fd = StartConnect(reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), &connected);
  if (!fd.ok()) {
    EXPECT_EQ(fd.status().code(), Code::kUnavailable) << fd.status().ToString();
    return;
  }
  EXPECT_FALSE(connected);
  EXPECT_EQ(FinishConnect(fd->get()), ECONNREFUSED);
}

TEST(NetSocket, ParseHostPortWantsBracketsAroundAnIpv6Host) {
  for (const char* bad : {"::1:80", "fe80::1", "a:b:80"}) {
    EXPECT_EQ(ParseHostPort(bad).status().code(), Code::kInvalidArgument) << bad;
  }
  auto v6 = ParseHostPort("[::1]:80", PortZero::kRefused);
  ASSERT_TRUE(v6.ok()) << v6.status().ToString();
  EXPECT_EQ(v6->first, "::1");
  EXPECT_EQ(v6->second, 80);
  auto v4 = ParseHostPort("10.0.0.1:0");
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->second, 0);
}

// Found by bootstrap_fuzz: "[[a]:1" parsed to host "[a", whose FormatHostPort ("[a:1") did not
// parse again. A bracket is never part of a host.
TEST(NetSocket, ParseHostPortRefusesBracketsInsideTheHost) {
  for (const char* bad : {"[[a]:1", "[a[b]:1", "a]b:1", "[a]]:1", "x[:1"}) {
    EXPECT_EQ(ParseHostPort(bad).status().code(), Code::kInvalidArgument) << bad;
  }
  for (const char* good : {"[::1]:80", "host.example:7", "[fe80::1%eth0]:9"}) {
    auto hp = ParseHostPort(good);
    ASSERT_TRUE(hp.ok()) << good << ": " << hp.status().ToString();
    auto again = ParseHostPort(FormatHostPort(hp->first, hp->second));
    ASSERT_TRUE(again.ok()) << good;
    EXPECT_EQ(again->first, hp->first);
    EXPECT_EQ(again->second, hp->second);
  }
}

TEST(NetSocket, FormatsAddressesAsHostPort) {
  EXPECT_EQ(FormatHostPort("127.0.0.1", 7000), "127.0.0.1:7000");
  EXPECT_EQ(FormatHostPort("::1", 7000), "[::1]:7000");
  sockaddr_storage ss{};
  const sockaddr_in a = Loopback(80);
  std::memcpy(&ss, &a, sizeof(a));
  EXPECT_EQ(FormatSockaddr(ss), "127.0.0.1:80");
}

}  // namespace
}  // namespace farmem::net
