// Baselines for `farmem bench raw`: a busy-polled TCP request/response echo over loopback and
// process_vm_readv from another process. Every transport figure is reported relative to these.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "raw_bench_internal.h"

namespace farmem::bench {
namespace {

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

Status SetSocketOptions(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
    return Status::FromErrno("setsockopt(TCP_NODELAY)", errno);
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
    return Status::FromErrno("fcntl(O_NONBLOCK)", errno);
  return Status::OK();
}

bool WouldBlock(int err) {
  return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

// Serve one echo connection until the peer closes it, an error occurs or the parent stops us.
void ServeEchoConnection(int fd, int control_fd) {
  if (!SetSocketOptions(fd).ok()) return;
  // Handshake: the message size, read within a deadline.
  uint32_t size = 0;
  size_t got = 0;
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (got < sizeof(size)) {
    ssize_t n = ::recv(fd, reinterpret_cast<char*>(&size) + got, sizeof(size) - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n == 0 || !WouldBlock(errno) || Clock::now() > deadline) {
      return;
    }
  }
  if (size == 0 || size > kMaxOpBytes) return;
  // Room for many messages per recv so that pipelined requests are answered in batches.
  std::vector<char> in(std::max<size_t>(256u << 10, size_t{size} * 64));
  std::vector<char> out;
  out.reserve(in.size());
  size_t in_len = 0, out_off = 0;
  for (uint64_t iter = 0;; ++iter) {
    // Backpressure: stop reading while a large reply backlog is waiting for the socket.
    if (out.size() - out_off < in.size()) {
      ssize_t n = ::recv(fd, in.data() + in_len, in.size() - in_len, 0);
      if (n > 0) {
        in_len += static_cast<size_t>(n);
        size_t whole = in_len / size * size;
        out.insert(out.end(), in.data(), in.data() + whole);
        std::memmove(in.data(), in.data() + whole, in_len - whole);
        in_len -= whole;
      } else if (n == 0 || !WouldBlock(errno)) {
        return;
      }
    }
    if (out_off < out.size()) {
      ssize_t n = ::send(fd, out.data() + out_off, out.size() - out_off, MSG_NOSIGNAL);
      if (n > 0) {
        out_off += static_cast<size_t>(n);
        if (out_off == out.size()) {
          out.clear();
          out_off = 0;
        }
      } else if (n < 0 && !WouldBlock(errno)) {
        return;
      }
    }
    if ((iter & 0xffff) == 0 && StopRequested(control_fd)) return;
  }
}

}  // namespace

TargetRole PvmTargetRole() {
  return [](int report_fd, int control_fd) {
    void* mem =
        ::mmap(nullptr, kRegionBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      (void)WriteMessage(report_fd, false, Status::FromErrno("mmap", errno).ToString());
      return;
    }
    FillPattern(mem, kRegionBytes);
    uint64_t addr = reinterpret_cast<uintptr_t>(mem);
    if (!WriteMessage(report_fd, true,
                      std::string_view(reinterpret_cast<const char*>(&addr), sizeof(addr)))
             .ok())
      return;
    WaitForStop(control_fd, kMaxTargetLifetime);
  };
}

Result<Measurement> RunPvmCase(pid_t pid, uint64_t remote_addr, size_t size, double warmup_s,
                               double seconds) {
  if (size == 0 || size > kRegionBytes) return Status::InvalidArgument("bad read size");
  std::vector<uint8_t> buf(size);
  iovec local{buf.data(), size};
  iovec remote{reinterpret_cast<void*>(remote_addr), size};
  Recorder rec(warmup_s, seconds);
  for (;;) {
    auto t0 = Clock::now();
    if (!rec.Running(t0)) break;
    ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    auto t1 = Clock::now();
    if (n < 0) return Status::FromErrno("process_vm_readv", errno);
    if (static_cast<size_t>(n) != size)
      return Status::IoError("process_vm_readv: short read of " + std::to_string(n) + " bytes");
    if (buf[0] != PatternByte(0) || buf[size - 1] != PatternByte(size - 1))
      return Status::Internal("process_vm_readv returned unexpected data");
    rec.Add(t0, t1);
  }
  return rec.Finish();
}

TargetRole EchoServerRole() {
  return [](int report_fd, int control_fd) {
    auto fail = [&](const Status& st) { (void)WriteMessage(report_fd, false, st.ToString()); };
    Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (listener.get() < 0) return fail(Status::FromErrno("socket", errno));
    int one = 1;
    ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
      return fail(Status::FromErrno("bind 127.0.0.1", errno));
    if (::listen(listener.get(), 16) != 0) return fail(Status::FromErrno("listen", errno));
    socklen_t len = sizeof(addr);
    if (::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      return fail(Status::FromErrno("getsockname", errno));
    uint16_t port = ntohs(addr.sin_port);
    if (!WriteMessage(report_fd, true,
                      std::string_view(reinterpret_cast<const char*>(&port), sizeof(port)))
             .ok())
      return;
    auto deadline = Clock::now() + kMaxTargetLifetime;
    while (Clock::now() < deadline) {
      pollfd pfds[2] = {{listener.get(), POLLIN, 0}, {control_fd, POLLIN, 0}};
      int r = ::poll(pfds, 2, 1000);
      if (r < 0 && errno != EINTR) return;
      if (r <= 0) continue;
      if (pfds[1].revents) return;  // parent closed the control pipe
      if (pfds[0].revents & POLLIN) {
        Fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
        if (conn.get() >= 0) ServeEchoConnection(conn.get(), control_fd);
      }
    }
  };
}

Result<Measurement> RunEchoCase(uint16_t port, size_t size, int inflight, double warmup_s,
                                double seconds, std::chrono::milliseconds stall_timeout) {
  if (size < sizeof(uint64_t) || size > kMaxOpBytes)
    return Status::InvalidArgument("echo message size must be 8 B .. 64 KiB");
  if (inflight < 1 || inflight > kMaxInflight) return Status::InvalidArgument("bad inflight");
  Fd sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (sock.get() < 0) return Status::FromErrno("socket", errno);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) return Status::FromErrno("connect to echo server", errno);
    pollfd pfd{sock.get(), POLLOUT, 0};
    if (::poll(&pfd, 1, static_cast<int>(stall_timeout.count())) != 1)
      return Status::TimedOut("connect to echo server timed out");
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(sock.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return Status::FromErrno("connect to echo server", err);
  }
  FARMEM_RETURN_IF_ERROR(SetSocketOptions(sock.get()));

  // Each message carries its sequence number in its first 8 bytes, so replies are checked to be
  // the echo of the right request (TCP keeps them in order).
  std::vector<char> out;
  size_t out_off = 0;
  uint32_t hdr = static_cast<uint32_t>(size);
  out.insert(out.end(), reinterpret_cast<char*>(&hdr), reinterpret_cast<char*>(&hdr) + 4);
  std::vector<Clock::time_point> sent_at(static_cast<size_t>(inflight));  // ring, by seq
  uint64_t next_seq = 0, next_reply = 0;
  auto enqueue = [&](Clock::time_point now) {
    size_t at = out.size();
    out.resize(at + size, static_cast<char>(0x5a));
    std::memcpy(out.data() + at, &next_seq, sizeof(next_seq));
    sent_at[next_seq % static_cast<uint64_t>(inflight)] = now;
    ++next_seq;
  };
  Recorder rec(warmup_s, seconds);
  auto now = Clock::now();
  for (int i = 0; i < inflight; ++i) enqueue(now);

  std::vector<char> in(std::max<size_t>(256u << 10, size * 64));
  size_t in_len = 0;
  auto last_progress = Clock::now();
  while (next_reply < next_seq) {
    if (out_off < out.size()) {
      ssize_t n = ::send(sock.get(), out.data() + out_off, out.size() - out_off, MSG_NOSIGNAL);
      if (n > 0) {
        out_off += static_cast<size_t>(n);
        if (out_off == out.size()) {
          out.clear();
          out_off = 0;
        }
      } else if (n < 0 && !WouldBlock(errno)) {
        return Status::FromErrno("echo send", errno);
      }
    }
    ssize_t n = ::recv(sock.get(), in.data() + in_len, in.size() - in_len, 0);
    if (n == 0) return Status::Unavailable("echo server closed the connection");
    if (n < 0) {
      if (!WouldBlock(errno)) return Status::FromErrno("echo recv", errno);
      if (Clock::now() - last_progress > stall_timeout)
        return Status::TimedOut("echo server stopped answering");
      continue;
    }
    in_len += static_cast<size_t>(n);
    now = Clock::now();
    last_progress = now;
    size_t off = 0;
    for (; in_len - off >= size; off += size) {
      uint64_t seq;
      std::memcpy(&seq, in.data() + off, sizeof(seq));
      if (seq != next_reply) return Status::Protocol("echo reply out of order or corrupted");
      rec.Add(sent_at[seq % static_cast<uint64_t>(inflight)], now);
      ++next_reply;
      if (rec.Running(now)) enqueue(Clock::now());
    }
    std::memmove(in.data(), in.data() + off, in_len - off);
    in_len -= off;
  }
  return rec.Finish();
}

}  // namespace farmem::bench
