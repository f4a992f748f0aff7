// Socket helpers: getaddrinfo, listen/connect over every resolved address, poll-based waits with
// deadlines, and whole-buffer send/recv on non-blocking sockets.
#include "common/net/socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace farmem::net {

int MsLeft(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left, INT_MAX));
}

std::string FormatHostPort(const std::string& host, uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string AddressKey(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(ss).sin_addr;
    return std::string(reinterpret_cast<const char*>(&a), sizeof(a));
  }
  if (ss.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr;
    return std::string(reinterpret_cast<const char*>(&a), sizeof(a));
  }
  return {};
}

std::string FormatSockaddr(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    return FormatHostPort(buf, ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    return FormatHostPort(buf, ntohs(in6->sin6_port));
  }
  return "?";
}

Result<AddrInfoPtr> Resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status::Unavailable("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  return AddrInfoPtr(res);
}

Result<Fd> Listen(const std::string& host, uint16_t port, int backlog, std::string_view what,
                  uint16_t* bound_port) {
  const std::string prefix(what);
  auto ai = Resolve(host, port, true);
  if (!ai.ok()) return ai.status().WithContext(prefix);
  Status last = Status::Unavailable(prefix + ": no usable address for " + host);
  for (addrinfo* a = ai->get(); a != nullptr; a = a->ai_next) {
    Fd s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) {
      last = Status::FromErrno(prefix + ": socket", errno);
      continue;
    }
    int one = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.get(), a->ai_addr, a->ai_addrlen) != 0) {
      last = Status::FromErrno(prefix + ": bind " + FormatHostPort(host, port), errno);
      continue;
    }
    if (::listen(s.get(), backlog) != 0) {
      last = Status::FromErrno(prefix + ": listen", errno);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (::getsockname(s.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
      return Status::FromErrno(prefix + ": getsockname", errno);
    }
    if (bound_port != nullptr) {
      *bound_port = ss.ss_family == AF_INET6
                        ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                        : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    }
    return s;
  }
  return last;
}

Result<Fd> ConnectWithDeadline(const std::string& host, uint16_t port, Clock::time_point deadline,
                               std::string_view what) {
  const std::string prefix(what);
  const std::string target = FormatHostPort(host, port);
  auto ai = Resolve(host, port, false);
  if (!ai.ok()) return ai.status().WithContext(prefix);
  Status last = Status::Unavailable(prefix + ": no usable address for " + target);
  for (addrinfo* a = ai->get(); a != nullptr; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd.valid()) {
      last = Status::FromErrno(prefix + ": socket", errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS || err == EINTR) {
      FARMEM_RETURN_IF_ERROR(
          WaitFd(fd.get(), POLLOUT, deadline, prefix + ": connect to " + target + " timed out"));
      socklen_t len = sizeof(err);
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    }
    if (err == 0) return fd;
    last =
        Status::Unavailable(prefix + ": connect to " + target + " failed: " + std::strerror(err));
  }
  return last;
}

Result<Fd> StartConnect(const sockaddr* addr, socklen_t len, bool* connected) {
  Fd fd(::socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::Unavailable(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int rc;
  do {
    rc = ::connect(fd.get(), addr, len);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0 && errno != EINPROGRESS) {
    return Status::Unavailable(std::string("connect: ") + std::strerror(errno));
  }
  *connected = rc == 0;
  return fd;
}

Status WaitFd(int fd, short events, Clock::time_point deadline, std::string_view timeout_message) {
  for (;;) {
    int ms = MsLeft(deadline);
    if (ms == 0) return Status::TimedOut(timeout_message);
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno("poll", errno);
    }
    if (r > 0) return Status::OK();  // ready, or an error the next socket call reports
  }
}

Status SendAll(int fd, std::string_view data, Clock::time_point deadline, std::string_view what) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      FARMEM_RETURN_IF_ERROR(
          WaitFd(fd, POLLOUT, deadline, std::string(what) + ": sending timed out"));
      continue;
    }
    return Status::Unavailable(std::string(what) + ": sending failed: " + std::strerror(errno));
  }
  return Status::OK();
}

Status RecvAll(int fd, void* buf, size_t len, Clock::time_point deadline, std::string_view what) {
  auto* p = static_cast<char*>(buf);
  size_t off = 0;
  while (off < len) {
    ssize_t n = ::recv(fd, p + off, len - off, MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return Status::Unavailable(std::string(what) + ": the peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      FARMEM_RETURN_IF_ERROR(
          WaitFd(fd, POLLIN, deadline, std::string(what) + ": no answer before the deadline"));
      continue;
    }
    return Status::Unavailable(std::string(what) + ": receiving failed: " + std::strerror(errno));
  }
  return Status::OK();
}

}  // namespace farmem::net
