// A blocking loopback socket for tests that speak the native TCP wire protocol by hand (raw,
// hostile or slow peers of a TCP transport target); WaitFor is in common/wait_for_test_util.h.
// Header-only test code, shared by transport_tcp_tests and the adversarial suite against farmemd.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/wait_for_test_util.h"
#include "transport/tcp/frame_codec.h"

namespace farmem::testing {

// Generous bound of a RawSocket wait that only turns a hang into a failure.
inline constexpr std::chrono::milliseconds kRawSocketWait{10000};

// A blocking loopback socket with helpers to write bytes and read whole frames.
class RawSocket {
 public:
  RawSocket() = default;
  explicit RawSocket(int fd) : fd_(fd) {}
  RawSocket(RawSocket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  ~RawSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

  // `source` (host order, e.g. 127.0.0.2) binds the local end, so tests can play several peer
  // addresses on loopback; `rcvbuf` shrinks the receive buffer (a slow reader).
  static RawSocket Connect(uint16_t port, uint32_t source = 0, int rcvbuf = 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return RawSocket();
    return ConnectFd(fd, port, source, rcvbuf);
  }
  // A socket not connected yet (ConnectFd later): tests that run out of descriptors make their
  // clients' descriptors first.
  static int Unconnected() { return ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); }
  // A connection left in flight: a non-blocking socket whose connect() is not waited for, so a
  // server that never accepts cannot block the test. For idle peers (Send may fail with EAGAIN).
  static RawSocket ConnectNoWait(uint16_t port, uint32_t source = 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return RawSocket();
    return ConnectFd(fd, port, source);
  }
  static RawSocket ConnectFd(int fd, uint16_t port, uint32_t source = 0, int rcvbuf = 0) {
    if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    if (source != 0) {
      sockaddr_in b{};
      b.sin_family = AF_INET;
      b.sin_addr.s_addr = htonl(source);
      if (::bind(fd, reinterpret_cast<sockaddr*>(&b), sizeof(b)) != 0) {
        ::close(fd);
        return RawSocket();
      }
    }
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
      ::close(fd);
      return RawSocket();
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return RawSocket(fd);
  }

  bool Send(const tcpwire::ByteQueue& q) { return Send(q.data(), q.size()); }
  bool Send(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    while (n > 0) {
      ssize_t k = ::send(fd_, b, n, MSG_NOSIGNAL);
      if (k <= 0) return false;
      b += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  }

  // Reads until one frame is complete. False on EOF, error or kRawSocketWait without data.
  bool ReadFrame(tcpwire::FrameView* f) {
    for (;;) {
      if (consumed_ > 0) {
        buf_.erase(buf_.begin(), buf_.begin() + static_cast<ptrdiff_t>(consumed_));
        consumed_ = 0;
      }
      tcpwire::DecodeResult r = tcpwire::DecodeFrame(buf_, {}, f);
      if (r.state == tcpwire::DecodeState::kFrame) {
        consumed_ = f->frame_size;  // the view stays valid until the next call
        return true;
      }
      if (r.state == tcpwire::DecodeState::kError) {
        ADD_FAILURE() << "peer sent a malformed frame: " << r.error;
        return false;
      }
      if (!ReadSome()) return false;
    }
  }

  // True when the peer closed the connection (EOF or reset) before `limit`, ignoring data.
  bool WaitClosed(std::chrono::milliseconds limit = kRawSocketWait) {
    for (;;) {
      if (!ReadSome(limit)) return !timed_out_;
      buf_.clear();
      consumed_ = 0;
    }
  }

 private:
  bool ReadSome(std::chrono::milliseconds limit = kRawSocketWait) {
    pollfd p{fd_, POLLIN, 0};
    const int ms = static_cast<int>(limit.count());
    if (::poll(&p, 1, ms) <= 0) {
      timed_out_ = true;
      return false;
    }
    uint8_t tmp[65536];
    ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n <= 0) return false;
    buf_.insert(buf_.end(), tmp, tmp + n);
    return true;
  }

  int fd_ = -1;
  std::vector<uint8_t> buf_;
  size_t consumed_ = 0;
  bool timed_out_ = false;
};

}  // namespace farmem::testing
