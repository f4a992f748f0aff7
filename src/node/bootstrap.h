// Bootstrap handshake of a Node: message bodies (JSON after the header of bootstrap_wire.h), the
// client side (one blocking handshake with a deadline) and the listener that answers peers.
// The Node decides what to answer (token check, region list); this file only moves bytes safely.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "farmem/node.h"
#include "farmem/status.h"
#include "node/bootstrap_wire.h"

namespace farmem::node {

// Limits on decoded fields; anything larger is a protocol error (the peer is broken or hostile).
inline constexpr size_t kMaxFieldBytes = 4096;
inline constexpr size_t kMaxRegionsListed = 16384;

struct HelloMsg {
  std::string token;
  std::string name;
  std::string transport_address;
  std::string backend;  // Transport::name() of the sender, e.g. "tcp" or "fabric:shm"
};

struct WelcomeMsg {
  std::string name;
  std::string transport_address;
  std::string backend;
  std::vector<RegionInfo> regions;
};

std::string EncodeHello(const HelloMsg& msg);
Result<HelloMsg> DecodeHello(std::string_view body);
std::string EncodeWelcome(const WelcomeMsg& msg);
Result<WelcomeMsg> DecodeWelcome(std::string_view body);
// An error frame body carrying `status` (code and message).
std::string EncodeError(const Status& status);
// The status an error frame carries (never OK: a malformed body yields a Protocol error).
Status DecodeError(std::string_view body);

// What the listener makes of the bytes a peer has sent so far (a HELLO frame, header first; the
// listener never reads past the frame). Pure: the fuzz target (bootstrap_fuzz.cc) and the tests
// call it directly.
struct HelloFrame {
  enum class Kind : uint8_t {
    kNeedMore,   // `frame_bytes` bytes in total are needed (the header, or header + body)
    kHello,      // `hello` is a well-formed HELLO of `frame_bytes` bytes
    kMalformed,  // not a HELLO frame, or a malformed body: answer `error` and close
    kRejected,   // a well-formed frame of a protocol version this node does not speak
  };
  Kind kind = Kind::kNeedMore;
  size_t frame_bytes = 0;
  HelloMsg hello;
  Status error;
};
// Largest HELLO body the listener buffers: four strings of at most kMaxFieldBytes, even if every
// byte is JSON-escaped (\u00XX, 6 bytes), plus the keys. Far below kMaxBootstrapBody (which
// bounds WELCOME, the region list), so idle handshakes cannot pin megabytes each.
inline constexpr uint32_t kMaxHelloBody = 128 * 1024;
HelloFrame ParseHelloFrame(std::span<const std::byte> in);

// Client side of the same exchange: checks a reply header (magic, version, body size) read from
// `target`, then decodes the body by the header's frame type (WELCOME, or the status an error
// frame carries; any other type is a Protocol error).
Status CheckReplyHeader(const FrameHeader& h, std::string_view target);
Result<WelcomeMsg> DecodeReply(uint16_t type, std::string_view body, std::string_view target);

// The kOpListRegions reply: {"regions":[{"name","key","length"}...]} (same shape as in WELCOME).
std::vector<std::byte> EncodeRegionList(const std::vector<RegionInfo>& regions);
Result<std::vector<RegionInfo>> DecodeRegionList(std::span<const std::byte> body);

// Client side: connect, send HELLO, read WELCOME. The whole exchange finishes within `timeout`.
// Errors: Unavailable (refused/unreachable), TimedOut, Protocol (malformed answer), or the status
// the server put in its error frame (e.g. PermissionDenied for a wrong cluster token).
Result<WelcomeMsg> Handshake(std::string_view host, uint16_t port, const HelloMsg& hello,
                             std::chrono::milliseconds timeout);

// The listener: one thread multiplexing the listening socket and in-progress handshakes with
// poll(), so a silent or slow peer never blocks others and Stop() returns promptly.
class BootstrapServer {
 public:
  // Decides the answer to a well-formed HELLO (runs on the server thread; must not block long).
  // An error status is sent back as an error frame.
  using HelloFn = std::function<Result<WelcomeMsg>(const HelloMsg& hello, std::string_view peer)>;

  using Stats = BootstrapStats;

  // `handshake_timeout` bounds how long one peer may take to send its HELLO and read the answer;
  // it overrides limits.handshake_timeout.
  BootstrapServer(HelloFn on_hello, std::chrono::milliseconds handshake_timeout,
                  BootstrapLimits limits = {});
  ~BootstrapServer();
  BootstrapServer(const BootstrapServer&) = delete;
  BootstrapServer& operator=(const BootstrapServer&) = delete;

  // Bind host:port (port 0 = ephemeral) and start the thread.
  Status Start(const std::string& host, uint16_t port);
  // Close the listener and every open handshake; idempotent.
  void Stop();
  // "host:port" actually bound (valid after Start()).
  std::string address() const;
  Stats stats() const;

 private:
  struct Conn;
  void Loop();

  HelloFn on_hello_;
  std::chrono::milliseconds handshake_timeout_;
  BootstrapLimits limits_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: Stop() wakes poll() at once
  std::string address_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex stop_mu_;
  std::atomic<uint64_t> accepted_{0}, welcomed_{0}, rejected_{0}, malformed_{0}, timed_out_{0};
  std::atomic<uint64_t> refused_per_address_{0}, refused_total_{0}, accept_backoffs_{0};
};

}  // namespace farmem::node
