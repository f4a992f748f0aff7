// Two Nodes in one process over a real transport (each backend under test): export/connect,
// one-sided access through a Scheduler, RPC dispatch and error propagation, and the bootstrap
// handshake's failure modes. Backends that cannot be created here are skipped, not failed.
#include "farmem/node.h"

#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "node/bootstrap.h"
#include "node/node_test_util.h"
#include "transport/testing/watchdog.h"

namespace farmem {
namespace {

using farmem::node::testing::MakeConfig;
using farmem::node::testing::StartNode;
using farmem::testing::ScopedWatchdog;
using namespace std::chrono_literals;

constexpr uint16_t kOpEcho = kFirstUserOpcode;
constexpr uint16_t kOpFail = kFirstUserOpcode + 1;
constexpr uint16_t kOpThrow = kFirstUserOpcode + 2;
constexpr uint16_t kOpInlineEcho = kFirstUserOpcode + 3;  // RpcExecution::kInline

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

class NodePair : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    watchdog_ = std::make_unique<ScopedWatchdog>(
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), 60s);
    auto server = Node::Create(MakeConfig(GetParam(), "server"));
    if (!server.ok()) {
      if (server.status().code() == Code::kUnavailable) {
        GTEST_SKIP() << "backend " << GetParam() << " unavailable: " << server.status().ToString();
      }
      FAIL() << server.status().ToString();
    }
    server_ = std::move(*server);
    ASSERT_TRUE(server_
                    ->register_rpc(kOpEcho,
                                   [](const RpcCall& call, std::vector<std::byte>& reply) {
                                     reply.assign(call.request.begin(), call.request.end());
                                     return Status::OK();
                                   })
                    .ok());
    ASSERT_TRUE(server_
                    ->register_rpc(kOpFail,
                                   [](const RpcCall&, std::vector<std::byte>&) {
                                     return Status::OutOfRange("slot 12 is past the end");
                                   })
                    .ok());
    ASSERT_TRUE(server_
                    ->register_rpc(kOpThrow,
                                   [](const RpcCall&, std::vector<std::byte>&) -> Status {
                                     throw std::logic_error("handler bug");
                                   })
                    .ok());
    ASSERT_TRUE(server_
                    ->register_rpc(
                        kOpInlineEcho,
                        [this](const RpcCall& call, std::vector<std::byte>& reply) -> Status {
                          inline_thread_ = std::this_thread::get_id();
                          if (call.request.empty()) return Status::InvalidArgument("empty");
                          reply.assign(call.request.begin(), call.request.end());
                          return Status::OK();
                        },
                        RpcExecution::kInline)
                    .ok());
    memory_.assign(1 << 16, std::byte{0});
    auto info = server_->export_region("mem", memory_.data(), memory_.size());
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    mem_info_ = *info;
    ASSERT_TRUE(server_->start().ok());

    std::string skip;
    client_ = StartNode(MakeConfig(GetParam(), "client"), &skip);
    ASSERT_NE(client_, nullptr) << skip;
  }

  void TearDown() override {
    if (client_) client_->stop();
    if (server_) server_->stop();
  }

  PeerInfo Connect() {
    auto peer = client_->connect(server_->bootstrap_address());
    EXPECT_TRUE(peer.ok()) << peer.status().ToString();
    return peer.ok() ? *peer : PeerInfo{};
  }

  std::unique_ptr<Scheduler> Sched() {
    auto s = client_->make_scheduler();
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::unique_ptr<ScopedWatchdog> watchdog_;
  std::unique_ptr<Node> server_;
  std::unique_ptr<Node> client_;
  std::vector<std::byte> memory_;
  RegionInfo mem_info_;
  std::atomic<std::thread::id> inline_thread_{};  // where the inline handler last ran
};

TEST_P(NodePair, ConnectLearnsPeerAndRegions) {
  PeerInfo peer = Connect();
  EXPECT_NE(peer.id, kInvalidPeer);
  EXPECT_EQ(peer.name, "server");
  EXPECT_EQ(peer.bootstrap_address, server_->bootstrap_address());
  EXPECT_EQ(peer.transport_address, server_->transport().local_address());
  ASSERT_EQ(peer.regions.size(), 1u);
  EXPECT_EQ(peer.regions[0].name, "mem");
  EXPECT_EQ(peer.regions[0].key, mem_info_.key);
  EXPECT_EQ(peer.regions[0].length, memory_.size());
  // Connecting twice yields the same transport peer.
  PeerInfo again = Connect();
  EXPECT_EQ(again.id, peer.id);
}

TEST_P(NodePair, OneSidedReadWriteThroughScheduler) {
  PeerInfo peer = Connect();
  auto sched = Sched();
  ASSERT_NE(sched, nullptr);
  RemoteRef ref{peer.id, peer.regions.at(0).key, 256};
  std::string msg = "one-sided hello over " + GetParam();
  Status w = sched->block_on(sched->write(ref, msg.data(), msg.size(), true));
  ASSERT_TRUE(w.ok()) << w.ToString();
  EXPECT_EQ(std::memcmp(memory_.data() + 256, msg.data(), msg.size()), 0);

  std::memcpy(memory_.data() + 1024, "server-side", 11);
  char buf[11] = {0};
  Status r = sched->block_on(sched->read(RemoteRef{peer.id, ref.key, 1024}, buf, sizeof(buf)));
  ASSERT_TRUE(r.ok()) << r.ToString();
  EXPECT_EQ(std::string(buf, sizeof(buf)), "server-side");

  // Out of bounds and unknown keys are errors, not crashes.
  Status oob = sched->block_on(
      sched->read(RemoteRef{peer.id, ref.key, memory_.size() - 4}, buf, sizeof(buf)));
  EXPECT_FALSE(oob.ok());
  Status bad_key = sched->block_on(sched->read(RemoteRef{peer.id, ref.key ^ 0x5555}, buf, 8));
  EXPECT_FALSE(bad_key.ok());
}

TEST_P(NodePair, ReadOnlyExportServesReadsAndRefusesWrites) {
  std::vector<uint64_t> words(512, 0x77);
  auto info = server_->export_region("ro", words.data(), words.size() * 8, Access::kReadOnly);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  PeerInfo peer = Connect();
  auto sched = Sched();
  ASSERT_NE(sched, nullptr);
  const RemoteRef ref{peer.id, info->key, 64};
  uint64_t got = 0;
  Status r = sched->block_on(sched->read(ref, &got, 8));
  ASSERT_TRUE(r.ok()) << r.ToString();
  EXPECT_EQ(got, 0x77u);
  const uint64_t v = 5;
  EXPECT_EQ(sched->block_on(sched->write(ref, &v, 8, true)).code(), Code::kPermissionDenied);
  EXPECT_EQ(sched->block_on(sched->fetch_add(ref, 1)).status().code(), Code::kPermissionDenied);
  EXPECT_EQ(sched->block_on(sched->compare_swap(ref, 0x77, 1)).status().code(),
            Code::kPermissionDenied);
  EXPECT_EQ(words[8], 0x77u);
  // The default export stays writable.
  Status w = sched->block_on(sched->write(RemoteRef{peer.id, mem_info_.key, 0}, &v, 8, true));
  EXPECT_TRUE(w.ok()) << w.ToString();
}

TEST_P(NodePair, RpcEchoAndErrors) {
  PeerInfo peer = Connect();
  auto sched = Sched();
  ASSERT_NE(sched, nullptr);
  std::vector<std::byte> reply(4096);

  auto echo = sched->block_on(sched->rpc(peer.id, RpcImm(kOpEcho), Bytes("ping 123"), reply));
  ASSERT_TRUE(echo.ok()) << echo.status().ToString();
  EXPECT_EQ(echo->imm & 0xffff, kOpEcho);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(reply.data()), echo->length), "ping 123");

  auto unknown = sched->block_on(sched->rpc(peer.id, RpcImm(999), Bytes("x"), reply));
  EXPECT_EQ(unknown.status().code(), Code::kNotFound);
  EXPECT_NE(unknown.status().message().find("no handler for opcode 999"), std::string_view::npos)
      << unknown.status().ToString();

  auto fail = sched->block_on(sched->rpc(peer.id, RpcImm(kOpFail), Bytes(""), reply));
  EXPECT_EQ(fail.status().code(), Code::kOutOfRange);
  EXPECT_EQ(fail.status().message(), "slot 12 is past the end");

  auto thrown = sched->block_on(sched->rpc(peer.id, RpcImm(kOpThrow), Bytes(""), reply));
  EXPECT_EQ(thrown.status().code(), Code::kInternal);
  EXPECT_NE(thrown.status().message().find("handler bug"), std::string_view::npos);

  // The server keeps serving after a handler threw.
  auto again = sched->block_on(sched->rpc(peer.id, RpcImm(kOpEcho), Bytes("still here"), reply));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->length, 10u);
}

// An inline handler answers from the transport's progress thread, errors included; worker
// handlers keep working next to it.
TEST_P(NodePair, InlineRpcAnswersFromTheProgressThread) {
  PeerInfo peer = Connect();
  auto sched = Sched();
  ASSERT_NE(sched, nullptr);
  std::vector<std::byte> reply(4096);
  for (int i = 0; i < 100; ++i) {
    const std::string msg = "inline " + std::to_string(i);
    auto r = sched->block_on(sched->rpc(peer.id, RpcImm(kOpInlineEcho), Bytes(msg), reply));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(reply.data()), r->length), msg);
  }
  auto fail = sched->block_on(sched->rpc(peer.id, RpcImm(kOpInlineEcho), Bytes(""), reply));
  EXPECT_EQ(fail.status().code(), Code::kInvalidArgument);
  const std::thread::id progress = inline_thread_.load();
  EXPECT_NE(progress, std::thread::id{});
  EXPECT_NE(progress, std::this_thread::get_id());
  auto echo = sched->block_on(sched->rpc(peer.id, RpcImm(kOpEcho), Bytes("worker"), reply));
  ASSERT_TRUE(echo.ok()) << echo.status().ToString();
}

TEST_P(NodePair, ListRegionsSeesRegionsExportedAfterHandshake) {
  PeerInfo peer = Connect();
  ASSERT_EQ(peer.regions.size(), 1u);
  std::vector<std::byte> late(4096);
  auto info = server_->export_region("late", late.data(), late.size());
  ASSERT_TRUE(info.ok()) << info.status().ToString();

  auto sched = Sched();
  ASSERT_NE(sched, nullptr);
  std::vector<std::byte> reply(64 * 1024);
  auto r = sched->block_on(sched->rpc(peer.id, RpcImm(kOpListRegions), {}, reply));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto regions = farmem::DecodeRegionList(std::span<const std::byte>(reply.data(), r->length));
  ASSERT_TRUE(regions.ok()) << regions.status().ToString();
  ASSERT_EQ(regions->size(), 2u);
  bool found = false;
  for (const auto& reg : *regions) {
    if (reg.name == "late") {
      found = true;
      EXPECT_EQ(reg.key, info->key);
      EXPECT_EQ(reg.length, 4096u);
    }
  }
  EXPECT_TRUE(found);

  // The learned key works for one-sided access right away.
  std::memcpy(late.data() + 8, "late!", 5);
  char buf[5];
  Status rd = sched->block_on(sched->read(RemoteRef{peer.id, info->key, 8}, buf, 5));
  ASSERT_TRUE(rd.ok()) << rd.ToString();
  EXPECT_EQ(std::string(buf, 5), "late!");

  // After unexport, the key no longer reaches the memory and the list shrinks.
  ASSERT_TRUE(server_->unexport_region("late").ok());
  Status gone = sched->block_on(sched->read(RemoteRef{peer.id, info->key, 8}, buf, 5));
  EXPECT_FALSE(gone.ok());
  EXPECT_EQ(server_->exported_regions().size(), 1u);
}

TEST_P(NodePair, WrongTokenIsPermissionDeniedAndGoodPeerStillAccepted) {
  std::string skip;
  auto intruder = StartNode(MakeConfig(GetParam(), "intruder", "not-the-token"), &skip);
  ASSERT_NE(intruder, nullptr) << skip;
  auto bad = intruder->connect(server_->bootstrap_address());
  EXPECT_EQ(bad.status().code(), Code::kPermissionDenied) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("wrong cluster token"), std::string_view::npos);
  PeerInfo peer = Connect();
  EXPECT_EQ(peer.name, "server");
}

TEST_P(NodePair, ConnectToNobodyIsUnavailable) {
  uint16_t port = node::testing::UnusedPort();
  ASSERT_NE(port, 0);
  auto r = client_->connect("127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().ToString();
  EXPECT_EQ(client_->connect("no-port-here").status().code(), Code::kInvalidArgument);
}

TEST_P(NodePair, ConnectToSilentListenerIsTimedOut) {
  auto cfg = MakeConfig(GetParam(), "impatient");
  cfg.transport.connect_timeout = 200ms;
  std::string skip;
  auto impatient = StartNode(cfg, &skip);
  ASSERT_NE(impatient, nullptr) << skip;
  node::testing::SilentListener silent;
  ASSERT_NE(silent.port(), 0);
  auto r = impatient->connect("127.0.0.1:" + std::to_string(silent.port()));
  EXPECT_EQ(r.status().code(), Code::kTimedOut) << r.status().ToString();
}

TEST_P(NodePair, GarbageOnBootstrapPortDoesNotHurtServer) {
  const uint16_t port = node::testing::PortOf(server_->bootstrap_address());
  const std::string junk[] = {std::string("\x00\x01\x02", 3), "HELLO?", std::string(5000, 'A'),
                              std::string("SBMF\x01\x00\x01\x00\xff\xff\xff\xff", 12)};
  for (const auto& j : junk) {
    int fd = node::testing::RawConnect(port);
    ASSERT_GE(fd, 0);
    ssize_t n = ::send(fd, j.data(), j.size(), MSG_NOSIGNAL);
    (void)n;
    ::close(fd);
  }
  PeerInfo peer = Connect();
  EXPECT_EQ(peer.name, "server");
}

TEST_P(NodePair, RegionAndRpcRegistrationRules) {
  EXPECT_EQ(server_->register_rpc(kOpListRegions, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(server_
                ->register_rpc(kFirstUserOpcode - 1,
                               [](const RpcCall&, std::vector<std::byte>&) { return Status::OK(); })
                .code(),
            Code::kInvalidArgument);
  // Already started: too late to add handlers.
  EXPECT_EQ(
      server_
          ->register_rpc(200, [](const RpcCall&, std::vector<std::byte>&) { return Status::OK(); })
          .code(),
      Code::kInvalidArgument);
  std::vector<std::byte> other(128);
  EXPECT_EQ(server_->export_region("mem", other.data(), other.size()).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(server_->export_region("", other.data(), other.size()).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(server_->export_region("z", nullptr, 10).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(server_->unexport_region("nope").code(), Code::kNotFound);
}

TEST_P(NodePair, StopIsIdempotentAndFinal) {
  // A short op_timeout: on shm a read of a stopped target only ends at its deadline.
  auto cfg = MakeConfig(GetParam(), "quick");
  cfg.transport.op_timeout = 300ms;
  std::string skip;
  auto quick = StartNode(cfg, &skip);
  ASSERT_NE(quick, nullptr) << skip;
  auto peer = quick->connect(server_->bootstrap_address());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  const std::string addr = server_->bootstrap_address();
  server_->stop();
  server_->stop();
  EXPECT_EQ(server_->start().code(), Code::kUnavailable);
  EXPECT_EQ(server_->connect(client_->bootstrap_address()).status().code(), Code::kUnavailable);
  // The bootstrap listener is gone.
  EXPECT_EQ(client_->connect(addr).status().code(), Code::kUnavailable);
  // Operations against the stopped peer fail (within op_timeout) rather than hang.
  auto sched = quick->make_scheduler();
  ASSERT_TRUE(sched.ok()) << sched.status().ToString();
  char buf[8];
  Status r =
      (*sched)->block_on((*sched)->read(RemoteRef{peer->id, peer->regions.at(0).key, 0}, buf, 8));
  EXPECT_FALSE(r.ok());
}

// stop() waits for running handlers; a handler that uses the node meanwhile must neither deadlock
// nor be cut off: it sees the node as stopped and its reply still reaches the caller.
TEST_P(NodePair, HandlerUsingNodeWhileItStops) {
  auto created = Node::Create(MakeConfig(GetParam(), "busy"));
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  std::unique_ptr<Node> busy = std::move(*created);
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool entered = false;
    bool open = false;
    Status seen;
  };
  auto shared = std::make_shared<Shared>();
  Node* raw = busy.get();
  ASSERT_TRUE(raw->register_rpc(kOpEcho,
                                [raw, shared](const RpcCall&, std::vector<std::byte>& reply) {
                                  std::unique_lock lock(shared->mu);
                                  shared->entered = true;
                                  shared->cv.notify_all();
                                  shared->cv.wait_for(lock, 10s, [&] { return shared->open; });
                                  lock.unlock();
                                  // Until stop() has flipped the state, connecting succeeds.
                                  auto deadline = std::chrono::steady_clock::now() + 10s;
                                  Status st;
                                  while (std::chrono::steady_clock::now() < deadline) {
                                    st = raw->connect(raw->bootstrap_address()).status();
                                    if (!st.ok()) break;
                                  }
                                  (void)raw->exported_regions();
                                  lock.lock();
                                  shared->seen = st;
                                  reply.push_back(std::byte{7});
                                  return Status::OK();
                                })
                  .ok());
  ASSERT_TRUE(busy->start().ok());
  auto peer = client_->connect(busy->bootstrap_address());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();

  Result<RpcReply> answer = Status::Internal("not run");
  std::byte reply_buf[16];
  std::thread caller([&] {
    auto sched = client_->make_scheduler();
    if (!sched.ok()) {
      answer = sched.status();
      return;
    }
    answer = (*sched)->block_on((*sched)->rpc(peer->id, RpcImm(kOpEcho), {}, reply_buf));
  });
  {
    std::unique_lock lock(shared->mu);
    ASSERT_TRUE(shared->cv.wait_for(lock, 10s, [&] { return shared->entered; }));
  }
  std::thread stopper([&] { busy->stop(); });
  {
    std::lock_guard lock(shared->mu);
    shared->open = true;
    shared->cv.notify_all();
  }
  stopper.join();
  caller.join();
  EXPECT_EQ(shared->seen.code(), Code::kUnavailable) << shared->seen.ToString();
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  EXPECT_EQ(answer->length, 1u);
  EXPECT_EQ(reply_buf[0], std::byte{7});
}

INSTANTIATE_TEST_SUITE_P(Backends, NodePair, ::testing::Values("tcp", "fabric:shm"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n) {
                             if (c == ':') c = '_';
                           }
                           return n;
                         });

TEST(NodeCreate, RejectsBadConfig) {
  auto cfg = MakeConfig("fabric:shm", "x");
  cfg.rpc_workers = 0;
  EXPECT_EQ(Node::Create(cfg).status().code(), Code::kInvalidArgument);
  cfg = MakeConfig("fabric:shm", "");
  EXPECT_EQ(Node::Create(cfg).status().code(), Code::kInvalidArgument);
  cfg = MakeConfig("fabric:shm", "x", std::string("tok\n", 4));
  EXPECT_EQ(Node::Create(cfg).status().code(), Code::kInvalidArgument);
  cfg = MakeConfig("nonsense", "x");
  EXPECT_EQ(Node::Create(cfg).status().code(), Code::kInvalidArgument);
}

TEST(NodeCreate, StopWithoutStartAndBadBootstrapHost) {
  auto node = Node::Create(MakeConfig("fabric:shm", "idle"));
  if (!node.ok()) GTEST_SKIP() << node.status().ToString();
  (*node)->stop();  // never started: must be harmless
  auto cfg = MakeConfig("fabric:shm", "badhost");
  cfg.bootstrap_host = "203.0.113.1";  // TEST-NET-3: not a local address, bind fails
  auto bad = Node::Create(cfg);
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  Status st = (*bad)->start();
  EXPECT_FALSE(st.ok());
}

TEST(NodeCreate, BackendMismatchIsInvalidArgument) {
  ScopedWatchdog wd("BackendMismatchIsInvalidArgument", 60s);
  std::string skip;
  auto tcp = StartNode(MakeConfig("tcp", "tcp-node"), &skip);
  if (!tcp) GTEST_SKIP() << skip;
  auto fab = StartNode(MakeConfig("fabric:shm", "fabric-node"), &skip);
  if (!fab) GTEST_SKIP() << skip;
  auto r = fab->connect(tcp->bootstrap_address());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
  EXPECT_NE(r.status().message().find("tcp"), std::string_view::npos);
  auto r2 = tcp->connect(fab->bootstrap_address());
  EXPECT_EQ(r2.status().code(), Code::kInvalidArgument) << r2.status().ToString();
}

}  // namespace
}  // namespace farmem
