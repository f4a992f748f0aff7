// Tests of the bootstrap handshake without a transport: wire header and JSON body codecs, and the
// listener against well-formed, hostile, silent and absent peers.
// The Node-level handshake (tokens, backends, regions) is covered in node_test.cc.
#include "node/bootstrap.h"

#include "common/net/host_port.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "node/bootstrap_wire.h"
#include "node/node_test_util.h"
#include "transport/testing/limits_util.h"
#include "transport/testing/watchdog.h"

namespace farmem::node {
namespace {

using farmem::testing::ScopedWatchdog;
using namespace std::chrono_literals;

TEST(BootstrapWire, HeaderRoundTripIsLittleEndian) {
  FrameHeader h;
  h.type = static_cast<uint16_t>(FrameType::kWelcome);
  h.body_length = 0x01020304;
  auto bytes = EncodeHeader(h);
  EXPECT_EQ(bytes[0], std::byte{0x53});  // magic low byte first
  EXPECT_EQ(bytes[8], std::byte{0x04});
  EXPECT_EQ(bytes[11], std::byte{0x01});
  FrameHeader d = DecodeHeader(bytes.data());
  EXPECT_EQ(d.magic, kBootstrapMagic);
  EXPECT_EQ(d.version, kBootstrapVersion);
  EXPECT_EQ(d.type, h.type);
  EXPECT_EQ(d.body_length, h.body_length);
}

TEST(BootstrapBodies, HelloAndWelcomeRoundTrip) {
  HelloMsg hello{"tok", "alice", "127.0.0.1:1234", "tcp"};
  auto h = DecodeHello(EncodeHello(hello));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->token, "tok");
  EXPECT_EQ(h->name, "alice");
  EXPECT_EQ(h->transport_address, "127.0.0.1:1234");
  EXPECT_EQ(h->backend, "tcp");

  WelcomeMsg w{"bob", "addr", "fabric:shm", {{"a", 0xffffffffffffffffull, 4096}, {"b", 7, 1}}};
  auto d = DecodeWelcome(EncodeWelcome(w));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->name, "bob");
  EXPECT_EQ(d->backend, "fabric:shm");
  ASSERT_EQ(d->regions.size(), 2u);
  EXPECT_EQ(d->regions[0].key, 0xffffffffffffffffull);  // full 64-bit keys survive JSON
  EXPECT_EQ(d->regions[0].length, 4096u);
  EXPECT_EQ(d->regions[1].name, "b");
}

TEST(BootstrapBodies, RejectsMalformed) {
  EXPECT_EQ(DecodeHello("").status().code(), Code::kProtocol);
  EXPECT_EQ(DecodeHello("[1,2]").status().code(), Code::kProtocol);
  EXPECT_EQ(DecodeHello("{\"token\":1}").status().code(), Code::kProtocol);
  EXPECT_EQ(DecodeHello("{\"token\":\"t\",\"name\":\"n\"}").status().code(), Code::kProtocol);
  EXPECT_EQ(DecodeHello(std::string(kMaxFieldBytes + 20, '{')).status().code(), Code::kProtocol);
  std::string long_name =
      EncodeHello(HelloMsg{"t", std::string(kMaxFieldBytes + 1, 'x'), "a", "tcp"});
  EXPECT_EQ(DecodeHello(long_name).status().code(), Code::kProtocol);
  EXPECT_EQ(DecodeWelcome("{\"name\":\"n\",\"transport_address\":\"a\",\"backend\":\"tcp\","
                          "\"regions\":[{\"name\":\"r\",\"key\":-1,\"length\":1}]}")
                .status()
                .code(),
            Code::kProtocol);
  EXPECT_EQ(DecodeWelcome("{\"name\":\"n\",\"transport_address\":\"a\",\"backend\":\"tcp\","
                          "\"regions\":[3]}")
                .status()
                .code(),
            Code::kProtocol);
  // Deep nesting must fail cleanly, not overflow the stack.
  EXPECT_EQ(DecodeHello(std::string(200000, '[')).status().code(), Code::kProtocol);
}

TEST(BootstrapBodies, ErrorFrames) {
  Status s = DecodeError(EncodeError(Status::PermissionDenied("wrong cluster token")));
  EXPECT_EQ(s.code(), Code::kPermissionDenied);
  EXPECT_EQ(s.message(), "wrong cluster token");
  EXPECT_EQ(DecodeError("{\"code\":0,\"message\":\"ok?\"}").code(), Code::kProtocol);
  EXPECT_EQ(DecodeError("{\"code\":200,\"message\":\"x\"}").code(), Code::kProtocol);
  EXPECT_EQ(DecodeError("{\"code\":3}").code(), Code::kProtocol);
  EXPECT_EQ(DecodeError("garbage").code(), Code::kProtocol);
}

// bootstrap_fuzz's error-frame round trip: DecodeError refused the codes after kInternal.
TEST(BootstrapBodies, ErrorFramesCarryEveryCode) {
  for (int c = 1; c <= static_cast<int>(Code::kFailedPrecondition); ++c) {
    const Status in(static_cast<Code>(c), "m");
    const Status out = DecodeError(EncodeError(in));
    EXPECT_EQ(out.code(), in.code()) << c;
    EXPECT_EQ(out.message(), "m") << c;
  }
  EXPECT_EQ(DecodeError("{\"code\":14,\"message\":\"x\"}").code(), Code::kProtocol);
}

std::vector<std::byte> HelloFrameBytes(uint32_t magic, uint16_t version, uint16_t type,
                                       const std::string& body, int64_t length = -1) {
  FrameHeader h;
  h.magic = magic;
  h.version = version;
  h.type = type;
  h.body_length = length < 0 ? static_cast<uint32_t>(body.size()) : static_cast<uint32_t>(length);
  auto hdr = EncodeHeader(h);
  std::vector<std::byte> out(hdr.begin(), hdr.end());
  for (char c : body) out.push_back(static_cast<std::byte>(c));
  return out;
}

// The listener's framing (ParseHelloFrame): header, then exactly the announced body.
TEST(BootstrapListenerFrame, AsksForTheHeaderThenTheBodyThenDecodes) {
  const std::string body = EncodeHello({"t", "n", "127.0.0.1:1", "tcp"});
  const auto frame = HelloFrameBytes(kBootstrapMagic, kBootstrapVersion, 1, body);
  HelloFrame f = ParseHelloFrame(std::span(frame).first(5));
  EXPECT_EQ(f.kind, HelloFrame::Kind::kNeedMore);
  EXPECT_EQ(f.frame_bytes, kFrameHeaderSize);
  f = ParseHelloFrame(std::span(frame).first(kFrameHeaderSize + 1));
  EXPECT_EQ(f.kind, HelloFrame::Kind::kNeedMore);
  EXPECT_EQ(f.frame_bytes, frame.size());
  std::vector<std::byte> longer = frame;
  longer.push_back(std::byte{'x'});  // bytes past the frame are not part of it
  for (const auto& in : {frame, longer}) {
    f = ParseHelloFrame(in);
    ASSERT_EQ(f.kind, HelloFrame::Kind::kHello) << f.error.ToString();
    EXPECT_EQ(f.frame_bytes, frame.size());
    EXPECT_EQ(f.hello.name, "n");
    EXPECT_EQ(f.hello.transport_address, "127.0.0.1:1");
  }
}

TEST(BootstrapListenerFrame, RefusesBadHeadersBeforeTheBody) {
  const auto bad_magic = HelloFrameBytes(0x12345678, kBootstrapVersion, 1, "");
  EXPECT_EQ(ParseHelloFrame(bad_magic).kind, HelloFrame::Kind::kMalformed);
  const auto version = HelloFrameBytes(kBootstrapMagic, 9, 1, "");
  HelloFrame f = ParseHelloFrame(version);
  EXPECT_EQ(f.kind, HelloFrame::Kind::kRejected);
  EXPECT_EQ(f.error.code(), Code::kInvalidArgument);
  const auto welcome = HelloFrameBytes(kBootstrapMagic, kBootstrapVersion, 2, "{}");
  EXPECT_EQ(ParseHelloFrame(welcome).kind, HelloFrame::Kind::kMalformed);
  const auto huge = HelloFrameBytes(kBootstrapMagic, kBootstrapVersion, 1, "", kMaxHelloBody + 1);
  f = ParseHelloFrame(huge);
  EXPECT_EQ(f.kind, HelloFrame::Kind::kMalformed);
  EXPECT_EQ(f.error.code(), Code::kProtocol);
  const auto junk = HelloFrameBytes(kBootstrapMagic, kBootstrapVersion, 1, "{\"token\":1}");
  EXPECT_EQ(ParseHelloFrame(junk).kind, HelloFrame::Kind::kMalformed);
}

TEST(BootstrapClientFrame, ChecksTheReplyHeaderAndType) {
  FrameHeader h;
  h.type = static_cast<uint16_t>(FrameType::kWelcome);
  EXPECT_TRUE(CheckReplyHeader(h, "x:1").ok());
  h.body_length = kMaxBootstrapBody + 1;
  EXPECT_EQ(CheckReplyHeader(h, "x:1").code(), Code::kProtocol);
  h.body_length = 0;
  h.version = 2;
  EXPECT_EQ(CheckReplyHeader(h, "x:1").code(), Code::kProtocol);
  EXPECT_EQ(DecodeReply(static_cast<uint16_t>(FrameType::kHello), "{}", "x:1").status().code(),
            Code::kProtocol);
  EXPECT_EQ(DecodeReply(static_cast<uint16_t>(FrameType::kError),
                        EncodeError(Status::PermissionDenied("no")), "x:1")
                .status()
                .code(),
            Code::kPermissionDenied);
}

TEST(BootstrapBodies, RegionListRoundTrip) {
  std::vector<RegionInfo> in{{"x", 1, 2}, {"y", 3, 4}};
  auto out = DecodeRegionList(EncodeRegionList(in));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[1].name, "y");
  EXPECT_EQ((*out)[1].key, 3u);
  std::vector<std::byte> junk(10, std::byte{0xff});
  EXPECT_EQ(DecodeRegionList(junk).status().code(), Code::kProtocol);
}

// Node::connect parses peers' addresses with net::ParseHostPort (port 0 refused).
TEST(BootstrapAddress, ParseHostPortRefusesPortZero) {
  auto a = net::ParseHostPort("127.0.0.1:7000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->first, "127.0.0.1");
  EXPECT_EQ(a->second, 7000);
  auto b = net::ParseHostPort("[::1]:80");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->first, "::1");
  for (const char* bad :
       {"", "host", "host:", ":80", "h:0", "h:65536", "h:8x", "[::1]80", "h:-1"}) {
    EXPECT_EQ(net::ParseHostPort(bad, net::PortZero::kRefused).status().code(),
              Code::kInvalidArgument)
        << bad;
  }
}

// A listener answering every HELLO with a fixed WELCOME, or PermissionDenied for token "bad".
class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<BootstrapServer>(
        [](const HelloMsg& h, std::string_view) -> Result<WelcomeMsg> {
          if (h.token == "bad") return Status::PermissionDenied("wrong cluster token");
          if (h.token == "throw") throw std::runtime_error("boom");
          return WelcomeMsg{"srv", "srv-addr", h.backend, {{"r", 42, 64}}};
        },
        300ms);
    ASSERT_TRUE(server_->Start("127.0.0.1", 0).ok());
    port_ = testing::PortOf(server_->address());
  }

  Result<WelcomeMsg> Hello(const std::string& token) {
    return Handshake("127.0.0.1", port_, HelloMsg{token, "cli", "cli-addr", "tcp"}, 2000ms);
  }

  // Sends raw bytes, then reads whatever comes back until EOF/timeout.
  std::string SendRaw(const std::string& bytes) {
    int fd = testing::RawConnect(port_);
    if (fd < 0) return "<connect failed>";
    ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    (void)n;
    std::string got;
    char buf[4096];
    for (;;) {
      ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
      if (r <= 0) break;
      got.append(buf, static_cast<size_t>(r));
    }
    ::close(fd);
    return got;
  }

  std::unique_ptr<BootstrapServer> server_;
  uint16_t port_ = 0;
};

TEST_F(ServerTest, WelcomesGoodPeerAndRejectsBadToken) {
  ScopedWatchdog wd("WelcomesGoodPeerAndRejectsBadToken", 30s);
  auto w = Hello("good");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->name, "srv");
  ASSERT_EQ(w->regions.size(), 1u);
  EXPECT_EQ(w->regions[0].key, 42u);

  auto bad = Hello("bad");
  EXPECT_EQ(bad.status().code(), Code::kPermissionDenied);
  EXPECT_NE(bad.status().message().find("wrong cluster token"), std::string_view::npos);

  auto thrown = Hello("throw");
  EXPECT_EQ(thrown.status().code(), Code::kInternal);
  EXPECT_TRUE(Hello("good").ok());
  EXPECT_EQ(server_->stats().welcomed, 2u);
  EXPECT_EQ(server_->stats().rejected, 2u);
}

TEST_F(ServerTest, HostileInputGetsErrorFrameAndServerSurvives) {
  ScopedWatchdog wd("HostileInputGetsErrorFrameAndServerSurvives", 60s);
  // Bad magic: answered with an error frame.
  std::string reply = SendRaw("GET / HTTP/1.1\r\n\r\n");
  ASSERT_GE(reply.size(), kFrameHeaderSize);
  FrameHeader h = DecodeHeader(reinterpret_cast<const std::byte*>(reply.data()));
  EXPECT_EQ(h.type, static_cast<uint16_t>(FrameType::kError));
  Status carried = DecodeError(reply.substr(kFrameHeaderSize));
  EXPECT_EQ(carried.code(), Code::kProtocol);

  // Oversized body length: rejected from the header alone.
  FrameHeader big;
  big.type = static_cast<uint16_t>(FrameType::kHello);
  big.body_length = kMaxBootstrapBody + 1;
  auto hb = EncodeHeader(big);
  reply = SendRaw(std::string(reinterpret_cast<const char*>(hb.data()), hb.size()));
  ASSERT_GE(reply.size(), kFrameHeaderSize);
  EXPECT_EQ(DecodeError(reply.substr(kFrameHeaderSize)).code(), Code::kProtocol);

  // Valid header, JSON garbage body.
  FrameHeader jh;
  jh.type = static_cast<uint16_t>(FrameType::kHello);
  jh.body_length = 5;
  auto jb = EncodeHeader(jh);
  reply = SendRaw(std::string(reinterpret_cast<const char*>(jb.data()), jb.size()) + "{{{{{");
  ASSERT_GE(reply.size(), kFrameHeaderSize);
  EXPECT_EQ(DecodeError(reply.substr(kFrameHeaderSize)).code(), Code::kProtocol);

  // Wrong version: a clear InvalidArgument.
  FrameHeader vh;
  vh.version = 99;
  vh.type = static_cast<uint16_t>(FrameType::kHello);
  auto vb = EncodeHeader(vh);
  reply = SendRaw(std::string(reinterpret_cast<const char*>(vb.data()), vb.size()));
  ASSERT_GE(reply.size(), kFrameHeaderSize);
  EXPECT_EQ(DecodeError(reply.substr(kFrameHeaderSize)).code(), Code::kInvalidArgument);

  // Random garbage of random lengths, some starting with a valid header.
  std::mt19937 rng(12345);
  for (int i = 0; i < 100; ++i) {
    std::string junk(rng() % 64, '\0');
    for (auto& c : junk) c = static_cast<char>(rng());
    if (i % 3 == 0) {
      FrameHeader rh;
      rh.type = static_cast<uint16_t>(FrameType::kHello);
      rh.body_length = static_cast<uint32_t>(junk.size());
      auto rb = EncodeHeader(rh);
      junk.insert(0, reinterpret_cast<const char*>(rb.data()), rb.size());
    }
    int fd = testing::RawConnect(port_);
    ASSERT_GE(fd, 0);
    ssize_t n = ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    (void)n;
    ::close(fd);  // without reading: the server must cope with a peer that vanished
  }
  auto w = Hello("good");
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_GT(server_->stats().malformed, 3u);
}

TEST_F(ServerTest, SilentPeerIsDroppedAndOthersAreServedMeanwhile) {
  ScopedWatchdog wd("SilentPeerIsDroppedAndOthersAreServedMeanwhile", 30s);
  int silent = testing::RawConnect(port_);
  ASSERT_GE(silent, 0);
  // Half a header, then silence: must not block the next peer.
  ::send(silent, "\x53\x42", 2, MSG_NOSIGNAL);
  auto w = Hello("good");
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  // The server closes the silent connection after its handshake timeout (recv sees EOF, not the
  // 2 s SO_RCVTIMEO of RawConnect).
  char c;
  ssize_t r = ::recv(silent, &c, 1, 0);
  EXPECT_EQ(r, 0);
  ::close(silent);
  EXPECT_EQ(server_->stats().timed_out, 1u);
}

TEST_F(ServerTest, StopIsIdempotentAndRefusesAfterwards) {
  ScopedWatchdog wd("StopIsIdempotentAndRefusesAfterwards", 30s);
  server_->Stop();
  server_->Stop();
  EXPECT_EQ(Hello("good").status().code(), Code::kUnavailable);
}

TEST(BootstrapClient, RefusedPortIsUnavailable) {
  ScopedWatchdog wd("RefusedPortIsUnavailable", 30s);
  uint16_t port = testing::UnusedPort();
  ASSERT_NE(port, 0);
  auto r = Handshake("127.0.0.1", port, HelloMsg{"t", "n", "a", "tcp"}, 2000ms);
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
}

TEST(BootstrapClient, SilentListenerIsTimedOut) {
  ScopedWatchdog wd("SilentListenerIsTimedOut", 30s);
  testing::SilentListener silent;
  ASSERT_NE(silent.port(), 0);
  auto r = Handshake("127.0.0.1", silent.port(), HelloMsg{"t", "n", "a", "tcp"}, 200ms);
  EXPECT_EQ(r.status().code(), Code::kTimedOut) << r.status().ToString();
}

// ---------------------------------------------------------------------------------------------
// Connection limits (BootstrapLimits, docs/node.md "Listener").

// Starts a non-blocking connect from `source` (host order, e.g. 127.0.0.2) to 127.0.0.1:port and
// returns the socket (or -1): idle peers that never send a byte.
int IdleConnectFrom(uint32_t source, uint16_t port,
                    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) {
  if (fd < 0) return -1;
  sockaddr_in b{};
  b.sin_family = AF_INET;
  b.sin_addr.s_addr = htonl(source);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&b), sizeof(b)) != 0 ||
      (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

class BootstrapLimitsTest : public ::testing::Test {
 protected:
  void Start(BootstrapLimits limits) {
    server_ = std::make_unique<BootstrapServer>(
        [](const HelloMsg& h, std::string_view) -> Result<WelcomeMsg> {
          return WelcomeMsg{"srv", "srv-addr", h.backend, {}};
        },
        limits.handshake_timeout, limits);
    ASSERT_TRUE(server_->Start("127.0.0.1", 0).ok());
    port_ = testing::PortOf(server_->address());
  }
  void TearDown() override {
    if (server_) server_->Stop();
    for (int fd : idle_) ::close(fd);
  }
  // A legitimate handshake from 127.0.0.1; returns how long it took (or fails the test).
  std::chrono::milliseconds TimedHello() {
    const auto start = std::chrono::steady_clock::now();
    auto w = Handshake("127.0.0.1", port_, HelloMsg{"t", "cli", "cli-addr", "tcp"}, 5000ms);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                 start);
  }

  std::unique_ptr<BootstrapServer> server_;
  uint16_t port_ = 0;
  std::vector<int> idle_;
};

// Issue 16, finding 4: one peer holding 300 idle bootstrap connections made every other peer's
// handshake time out. With the default limits the legitimate handshake completes at once.
TEST_F(BootstrapLimitsTest, IdleConnectionsFromOneAddressDoNotDelayOthers) {
  ScopedWatchdog wd("IdleConnectionsFromOneAddressDoNotDelayOthers", 60s);
  ASSERT_NO_FATAL_FAILURE(Start(BootstrapLimits{}));
  for (int i = 0; i < 300; ++i) {
    const int fd = IdleConnectFrom(0x7f000002, port_);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    idle_.push_back(fd);
  }
  std::this_thread::sleep_for(100ms);  // let the connections land in the listener's backlog
  const auto took = TimedHello();
  EXPECT_LT(took, 1000ms) << "a legitimate handshake waited behind 300 idle connections";
  const BootstrapStats st = server_->stats();
  EXPECT_GE(st.refused_per_address, 1u);
  EXPECT_EQ(st.welcomed, 1u);
}

// Fairness at the total limit: idle connections from many addresses fill every slot; a new
// address still gets one (the busiest address's oldest handshake makes room).
TEST_F(BootstrapLimitsTest, NewAddressIsServedWhenIdlePeersFillEverySlot) {
  ScopedWatchdog wd("NewAddressIsServedWhenIdlePeersFillEverySlot", 60s);
  BootstrapLimits limits;
  limits.max_open_handshakes = 32;
  limits.max_open_handshakes_per_address = 8;
  ASSERT_NO_FATAL_FAILURE(Start(limits));
  for (uint32_t a = 10; a < 40; ++a) {
    for (int i = 0; i < 10; ++i) {
      const int fd = IdleConnectFrom(0x7f000000 + a, port_);
      ASSERT_GE(fd, 0) << std::strerror(errno);
      idle_.push_back(fd);
    }
  }
  std::this_thread::sleep_for(100ms);
  const auto took = TimedHello();
  EXPECT_LT(took, 1000ms) << "a legitimate handshake waited behind idle peers";
  const BootstrapStats st = server_->stats();
  EXPECT_GE(st.refused_total, 1u);
  EXPECT_GE(st.refused_per_address, 1u);
}

// Issue 16, finding 3 on the bootstrap port: at the descriptor limit the listener backs off
// instead of spinning on accept, logs at most once per second, and serves again afterwards.
TEST_F(BootstrapLimitsTest, AcceptAtDescriptorLimitBacksOffStress) {
  ScopedWatchdog wd("AcceptAtDescriptorLimitBacksOffStress", 60s);
  farmem::testing::LogCounter emfile_logs(
      "Too many open files");  // attached before the thread starts
  farmem::testing::ScopeExit stop_first{[this] { TearDown(); }};
  ASSERT_NO_FATAL_FAILURE(Start(BootstrapLimits{}));
  {
    // The clients' descriptors are made first: once the table is full the listener could take
    // any descriptor freed for them.
    std::vector<int> client_fds;
    for (int i = 0; i < 4; ++i)
      client_fds.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    farmem::testing::FdExhauster fds;
    ASSERT_TRUE(fds.ok()) << "could not lower RLIMIT_NOFILE";
    for (int fd : client_fds) {
      ASSERT_GE(IdleConnectFrom(0x7f000002, port_, fd), 0);
      idle_.push_back(fd);
    }
    const double cpu0 = farmem::testing::ProcessCpuSeconds();
    std::this_thread::sleep_for(1s);  // the interval being measured
    const double cpu = farmem::testing::ProcessCpuSeconds() - cpu0;
    EXPECT_LT(cpu, 0.3) << "the process used " << cpu << " s of CPU in 1 s at the fd limit";
    EXPECT_LE(emfile_logs.count(), 3u) << "the accept error was not rate-limited";
    EXPECT_GE(server_->stats().accept_backoffs, 1u);
  }
  const auto took = TimedHello();
  EXPECT_LT(took, 2000ms);
}

}  // namespace
}  // namespace farmem::node
