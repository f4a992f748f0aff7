// Tests specific to the native TCP backend: the NIC thread's handling of raw (malformed, wrongly
// authenticated) connections, discarding of late responses, and doorbell batching of posts.
// Backend-independent semantics are covered by src/transport/transport_conformance_test.cc.
#include "transport/tcp/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "transport/tcp/frame_codec.h"
#include "transport/testing/completion_util.h"

namespace farmem {
namespace {

namespace w = tcpwire;
using namespace std::chrono_literals;

// Generous bound that only turns a hang into a failure.
constexpr auto kWait = 10s;

#define ASSERT_OK(expr)                                              \
  do {                                                               \
    ::farmem::Status _st = (expr);                                   \
    ASSERT_TRUE(_st.ok()) << #expr << " failed: " << _st.ToString(); \
  } while (0)

uint16_t PortOf(const std::string& address) {
  return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
}

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

  static RawSocket Connect(uint16_t port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd);
      return RawSocket();
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return RawSocket(fd);
  }

  bool Send(const w::ByteQueue& q) { return Send(q.data(), q.size()); }
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

  // Reads until one frame is complete. False on EOF, error or kWait without data.
  bool ReadFrame(w::FrameView* f) {
    for (;;) {
      if (consumed_ > 0) {
        buf_.erase(buf_.begin(), buf_.begin() + static_cast<ptrdiff_t>(consumed_));
        consumed_ = 0;
      }
      w::DecodeResult r = w::DecodeFrame(buf_, {}, f);
      if (r.state == w::DecodeState::kFrame) {
        consumed_ = f->frame_size;  // the view stays valid until the next call
        return true;
      }
      if (r.state == w::DecodeState::kError) {
        ADD_FAILURE() << "peer sent a malformed frame: " << r.error;
        return false;
      }
      if (!ReadSome()) return false;
    }
  }

  // True when the peer closed the connection (EOF or reset) before kWait, ignoring data.
  bool WaitClosed() {
    for (;;) {
      if (!ReadSome()) return !timed_out_;
      buf_.clear();
      consumed_ = 0;
    }
  }

 private:
  bool ReadSome() {
    pollfd p{fd_, POLLIN, 0};
    const int ms = static_cast<int>(std::chrono::milliseconds(kWait).count());
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

class TcpTransportTest : public ::testing::Test {
 protected:
  TransportConfig Config() const {
    TransportConfig c;
    c.backend = "tcp";
    c.listen_host = "127.0.0.1";
    c.cluster_token = "test-token";
    c.op_timeout = 5s;
    c.connect_timeout = 3s;
    return c;
  }

  // A target exporting mem_ and an initiator context connected to it.
  void StartPair() {
    mem_ = testing::AlignedBuffer(1 << 16);
    auto t = CreateTcpTransport(Config());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    target_ = std::move(*t);
    target_->set_rpc_handler(
        [](std::unique_ptr<IncomingRpc> rpc) { (void)rpc->reply(rpc->imm(), rpc->payload()); });
    ASSERT_OK(target_->start());
    auto r = target_->register_memory(mem_.data(), mem_.size());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    region_ = *r;
    auto i = CreateTcpTransport(Config());
    ASSERT_TRUE(i.ok());
    initiator_ = std::move(*i);
    ASSERT_OK(initiator_->start());
    auto p = initiator_->add_peer(target_->local_address());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    peer_ = *p;
    auto c = initiator_->create_context();
    ASSERT_TRUE(c.ok());
    ctx_ = std::move(*c);
  }

  void TearDown() override {
    ctx_.reset();
    if (initiator_) initiator_->stop();
    if (target_) target_->stop();
  }

  Status ReadWord(uint64_t offset, uint64_t* out) {
    FARMEM_RETURN_IF_ERROR(ctx_->post_read(RemoteRef{peer_, region_.key, offset}, out, 8, 1));
    FARMEM_ASSIGN_OR_RETURN(auto got, testing::PollN(*ctx_, 1, kWait));
    return got[0].status;
  }

  RawSocket Raw() { return RawSocket::Connect(PortOf(target_->local_address())); }

  TcpTransportStats TargetStats() { return *GetTcpTransportStats(*target_); }

  testing::AlignedBuffer mem_;
  std::unique_ptr<Transport> target_, initiator_;
  std::unique_ptr<Context> ctx_;
  MemoryRegion region_;
  PeerId peer_ = kInvalidPeer;
};

TEST_F(TcpTransportTest, MalformedFrameClosesOnlyThatConnection) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  mem_.store_word(0, 77);
  uint64_t v = 0;
  ASSERT_OK(ReadWord(0, &v));  // the good peer is connected before the bad one misbehaves

  RawSocket bad = Raw();
  ASSERT_GE(bad.fd(), 0);
  w::ByteQueue q;
  w::EncodeHello(q, "test-token");
  w::FrameHeader h{0, 0x7f, 0, 0, 5};  // unknown opcode
  q.append(&h, sizeof(h));
  ASSERT_TRUE(bad.Send(q));
  w::FrameView f;
  ASSERT_TRUE(bad.ReadFrame(&f));
  EXPECT_EQ(f.opcode, w::Opcode::kError);
  EXPECT_EQ(f.header.seq, 0u);
  EXPECT_EQ(f.header.code, static_cast<uint16_t>(Code::kProtocol));
  EXPECT_TRUE(bad.WaitClosed()) << "the target kept a connection that sent garbage";
  EXPECT_EQ(TargetStats().protocol_errors, 1u);

  mem_.store_word(0, 78);
  ASSERT_OK(ReadWord(0, &v));
  EXPECT_EQ(v, 78u);
}

TEST_F(TcpTransportTest, OversizeAndTruncatedFramesAreRefused) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  {
    // A 4 GiB body length is refused from the header alone (nothing gets buffered).
    RawSocket s = Raw();
    w::ByteQueue q;
    w::EncodeHello(q, "test-token");
    w::FrameHeader h{0xffffffffu, static_cast<uint8_t>(w::Opcode::kWrite), 0, 0, 9};
    q.append(&h, sizeof(h));
    ASSERT_TRUE(s.Send(q));
    w::FrameView f;
    ASSERT_TRUE(s.ReadFrame(&f));
    EXPECT_EQ(f.header.code, static_cast<uint16_t>(Code::kProtocol));
    EXPECT_TRUE(s.WaitClosed());
  }
  {
    // A truncated frame followed by EOF: the target just closes; nothing is served.
    RawSocket s = Raw();
    w::ByteQueue q;
    w::EncodeHello(q, "test-token");
    w::EncodeRead(q, 3, region_.key, 0, 8);
    ASSERT_TRUE(s.Send(q.data(), q.size() - 5));
    ::shutdown(s.fd(), SHUT_WR);
    EXPECT_TRUE(s.WaitClosed());
  }
  uint64_t v = 0;
  EXPECT_TRUE(ReadWord(0, &v).ok());
}

TEST_F(TcpTransportTest, WrongTokenOrMissingHelloOnRawConnection) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  mem_.store_word(0, 1234);
  {
    RawSocket s = Raw();
    w::ByteQueue q;
    w::EncodeHello(q, "test-tokex");
    w::EncodeRead(q, 3, region_.key, 0, 8);  // pipelined behind the bad hello: never served
    ASSERT_TRUE(s.Send(q));
    w::FrameView f;
    ASSERT_TRUE(s.ReadFrame(&f));
    EXPECT_EQ(f.opcode, w::Opcode::kError);
    EXPECT_EQ(f.header.code, static_cast<uint16_t>(Code::kPermissionDenied));
    EXPECT_TRUE(s.WaitClosed()) << "read data or no close after a wrong token";
  }
  {
    RawSocket s = Raw();
    w::ByteQueue q;
    w::EncodeRead(q, 3, region_.key, 0, 8);  // no hello at all
    ASSERT_TRUE(s.Send(q));
    w::FrameView f;
    ASSERT_TRUE(s.ReadFrame(&f));
    EXPECT_EQ(f.opcode, w::Opcode::kError);
    EXPECT_EQ(f.header.code, static_cast<uint16_t>(Code::kPermissionDenied));
    EXPECT_TRUE(s.WaitClosed());
  }
  EXPECT_EQ(TargetStats().protocol_errors, 2u);
}

TEST_F(TcpTransportTest, RawConnectionWithTokenIsServed) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  mem_.store_word(8, 4321);
  RawSocket s = Raw();
  w::ByteQueue q;
  w::EncodeHello(q, "test-token");
  w::EncodeRead(q, 42, region_.key, 8, 8);
  w::EncodeAtomic(q, w::Opcode::kFetchAdd, 43, region_.key, 8, 5, 0);
  w::EncodeRead(q, 44, region_.key + 1, 0, 8);
  ASSERT_TRUE(s.Send(q));
  w::FrameView f;
  ASSERT_TRUE(s.ReadFrame(&f));
  EXPECT_EQ(f.opcode, w::Opcode::kReadResp);
  EXPECT_EQ(f.header.seq, 42u);
  ASSERT_EQ(f.data.size(), 8u);
  uint64_t v;
  std::memcpy(&v, f.data.data(), 8);
  EXPECT_EQ(v, 4321u);
  ASSERT_TRUE(s.ReadFrame(&f));
  EXPECT_EQ(f.opcode, w::Opcode::kAtomicResp);
  EXPECT_EQ(f.atomic_resp.old_value, 4321u);
  ASSERT_TRUE(s.ReadFrame(&f));
  EXPECT_EQ(f.opcode, w::Opcode::kError);
  EXPECT_EQ(f.header.seq, 44u);
  EXPECT_EQ(f.header.code, static_cast<uint16_t>(Code::kNotFound));
  EXPECT_EQ(mem_.load_word(8), 4326u);
}

// A fake target that answers only when told to: the initiator's op times out first, then the
// late response arrives and must be dropped without touching the (reusable) buffer.
TEST_F(TcpTransportTest, LateResponseForTimedOutOpIsDiscarded) {
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(lfd, 4), 0);
  socklen_t alen = sizeof(a);
  ASSERT_EQ(::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &alen), 0);
  RawSocket listener(lfd);

  TransportConfig cfg = Config();
  cfg.op_timeout = 100ms;
  auto t = CreateTcpTransport(cfg);
  ASSERT_TRUE(t.ok());
  initiator_ = std::move(*t);
  ASSERT_OK(initiator_->start());
  auto p = initiator_->add_peer("127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto c = initiator_->create_context();
  ASSERT_TRUE(c.ok());
  ctx_ = std::move(*c);

  std::vector<uint8_t> first(64, 0xAA), second(64, 0);
  ASSERT_OK(ctx_->post_read(RemoteRef{*p, 5, 0}, first.data(), first.size(), 1));
  auto got = testing::PollN(*ctx_, 1, kWait);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)[0].status.code(), Code::kTimedOut) << (*got)[0].status.ToString();

  RawSocket server(::accept(lfd, nullptr, nullptr));
  ASSERT_GE(server.fd(), 0);
  w::FrameView f;
  ASSERT_TRUE(server.ReadFrame(&f));
  ASSERT_EQ(f.opcode, w::Opcode::kHello);
  ASSERT_TRUE(server.ReadFrame(&f));
  ASSERT_EQ(f.opcode, w::Opcode::kRead);
  const uint64_t late_seq = f.header.seq;

  // The late answer, then a second read whose answer must still be delivered.
  w::ByteQueue out;
  std::memset(w::EncodeReadResp(out, late_seq, 64), 0x55, 64);
  ASSERT_TRUE(server.Send(out));
  ASSERT_OK(ctx_->post_read(RemoteRef{*p, 5, 0}, second.data(), second.size(), 2));
  Completion none[4];
  EXPECT_EQ(ctx_->poll(none), 0u);  // flushes the second request; nothing may complete yet
  ASSERT_TRUE(server.ReadFrame(&f));
  ASSERT_EQ(f.opcode, w::Opcode::kRead);
  EXPECT_NE(f.header.seq, late_seq);
  out.clear();
  std::memset(w::EncodeReadResp(out, f.header.seq, 64), 0x66, 64);
  ASSERT_TRUE(server.Send(out));

  got = testing::PollN(*ctx_, 1, kWait);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ((*got)[0].wr_id, 2u);
  EXPECT_TRUE((*got)[0].status.ok()) << (*got)[0].status.ToString();
  EXPECT_EQ(second, std::vector<uint8_t>(64, 0x66));
  EXPECT_EQ(first, std::vector<uint8_t>(64, 0xAA)) << "late response written into a dead op";
  EXPECT_EQ(ctx_->outstanding(), 0u);
  EXPECT_EQ(GetTcpContextStats(*ctx_)->stale_responses, 1u);
}

TEST_F(TcpTransportTest, PostsBeforeOnePollGoOutInOneFlush) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  for (int i = 0; i < 16; ++i) mem_.store_word(i * 8, 1000 + i);
  uint64_t v = 0;
  ASSERT_OK(ReadWord(0, &v));  // connected, hello sent
  const TcpContextStats before = *GetTcpContextStats(*ctx_);

  uint64_t words[16] = {};
  for (int i = 0; i < 16; ++i) {
    ASSERT_OK(
        ctx_->post_read(RemoteRef{peer_, region_.key, uint64_t(i) * 8}, &words[i], 8, 100 + i));
  }
  const TcpContextStats posted = *GetTcpContextStats(*ctx_);
  EXPECT_EQ(posted.send_calls, before.send_calls) << "a post went to the network on its own";
  EXPECT_EQ(posted.frames_posted - before.frames_posted, 16u);

  Completion batch[16];
  size_t n = ctx_->poll(batch);
  const TcpContextStats flushed = *GetTcpContextStats(*ctx_);
  EXPECT_EQ(flushed.send_calls - before.send_calls, 1u) << "16 requests needed several sends";

  auto rest = testing::PollN(*ctx_, 16 - n, kWait);
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(words[i], uint64_t(1000 + i));
}

// wait_for_read_copies is the grace period CoRM merges rely on: a change the owner makes after it
// never shows up in a READ that began before. The NIC thread copies a 64 KiB read word by word,
// loading the first word (the owner's marker) microseconds before the last one (the change), so
// without the wait rounds of the owner fit inside one copy. Invariant: last word <= first word.
TEST_F(TcpTransportTest, WaitForReadCopiesOrdersAChangeAfterTheReadsInProgress) {
  ASSERT_NO_FATAL_FAILURE(StartPair());
  const size_t len = mem_.size();
  const size_t last = len - 8;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> rounds{0}, timeouts{0};
  std::thread owner([&] {
    for (uint64_t i = 1; !stop.load(std::memory_order_relaxed); ++i) {
      mem_.store_word(0, i);  // the marker (seq_cst)
      if (!target_->wait_for_read_copies(std::chrono::steady_clock::now() + kWait).ok()) {
        timeouts.fetch_add(1);
      }
      mem_.store_word(last, i);  // the change
      rounds.fetch_add(1, std::memory_order_relaxed);
      if (i % 16 == 0) std::this_thread::yield();
    }
  });
  std::vector<uint64_t> buf(len / 8);
  uint64_t reads = 0, violations = 0, mid_round = 0;
  // At least 1 s, then on until a read has overlapped a round (the event the test needs; on a
  // loaded machine the two threads may not run at once for a while), for at most 20 s.
  const auto start = std::chrono::steady_clock::now();
  const auto end = start + 1s, limit = start + 20s;
  for (auto now = start; now < end || (mid_round == 0 && now < limit);
       now = std::chrono::steady_clock::now()) {
    ASSERT_OK(ctx_->post_read(RemoteRef{peer_, region_.key, 0}, buf.data(), len, 7));
    auto got = testing::PollN(*ctx_, 1, kWait);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_OK((*got)[0].status);
    const uint64_t first = buf.front(), tail = buf.back();
    if (tail > first) ++violations;
    if (tail < first) ++mid_round;  // the owner was inside a round during this copy
    ++reads;
  }
  stop.store(true);
  owner.join();
  EXPECT_EQ(violations, 0u) << "a read saw a change made after a marker it missed";
  EXPECT_EQ(timeouts.load(), 0u);
  EXPECT_GT(reads, 0u);
  EXPECT_GT(rounds.load(), 0u);
  // Copies that overlapped a round: what the test exists for (none would make it vacuous).
  EXPECT_GT(mid_round, 0u) << "no read overlapped the owner's rounds: the test proved nothing";
  std::printf("reads %llu rounds %llu mid-round reads %llu\n", (unsigned long long)reads,
              (unsigned long long)rounds.load(), (unsigned long long)mid_round);
}

TEST_F(TcpTransportTest, RpcReplyAfterTransportStopIsDroppedWithStatus) {
  mem_ = testing::AlignedBuffer(4096);
  std::unique_ptr<IncomingRpc> held;
  std::mutex mu;
  auto t = CreateTcpTransport(Config());
  ASSERT_TRUE(t.ok());
  target_ = std::move(*t);
  target_->set_rpc_handler([&](std::unique_ptr<IncomingRpc> rpc) {
    std::lock_guard lock(mu);
    held = std::move(rpc);
  });
  ASSERT_OK(target_->start());
  RawSocket s = Raw();
  w::ByteQueue q;
  w::EncodeHello(q, "test-token");
  w::EncodeRpc(q, w::Opcode::kRpc, 8, 77, "ping", 4);
  ASSERT_TRUE(s.Send(q));
  const auto deadline = std::chrono::steady_clock::now() + kWait;
  for (;;) {
    {
      std::lock_guard lock(mu);
      if (held) break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "RPC never reached the handler";
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(held->imm(), 77u);
  EXPECT_EQ(held->payload().size(), 4u);
  EXPECT_FALSE(held->source().empty());
  target_->stop();
  Status st = held->reply(1, {});
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
  held.reset();  // destroying an answered RPC sends nothing more
}

TEST_F(TcpTransportTest, AddPeerValidatesAddresses) {
  auto t = CreateTcpTransport(Config());
  ASSERT_TRUE(t.ok());
  for (const char* bad : {"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:0", "127.0.0.1:65536",
                          "127.0.0.1:12x", ":80", "::1:80", "[::1]80"}) {
    EXPECT_EQ((*t)->add_peer(bad).status().code(), Code::kInvalidArgument) << bad;
  }
  auto a = (*t)->add_peer("127.0.0.1:5000");
  auto b = (*t)->add_peer("127.0.0.1:5001");
  auto a2 = (*t)->add_peer("127.0.0.1:5000");
  ASSERT_TRUE(a.ok() && b.ok() && a2.ok());
  EXPECT_EQ(*a, *a2);
  EXPECT_NE(*a, *b);
}

TEST_F(TcpTransportTest, ConfigIsValidated) {
  TransportConfig c = Config();
  c.cluster_token = std::string(w::kMaxTokenBytes + 1, 't');
  EXPECT_EQ(CreateTcpTransport(c).status().code(), Code::kInvalidArgument);
  c = Config();
  c.max_rpc_bytes = w::kMaxRpcBytes + 1;
  EXPECT_EQ(CreateTcpTransport(c).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace farmem
