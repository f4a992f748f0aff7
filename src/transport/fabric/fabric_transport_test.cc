// Tests specific to the libfabric backend: mr_mode plan, hex addresses, wire parsing, key-lookup
// caching and invalidation, forced FI_MR_LOCAL path, missing provider. Generic transport semantics
// are covered by src/transport/transport_conformance_test.cc.
#include <fcntl.h>
#include <rdma/fabric.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "farmem/coro.h"
#include "transport/fabric/fabric_transport.h"
#include "transport/fabric/fabric_util.h"

namespace farmem::fabric {
namespace {

using namespace std::chrono_literals;

// ---- pure helpers -------------------------------------------------------------------------

TEST(FabricHex, RoundTrip) {
  std::vector<std::byte> bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<std::byte>(i));
  const std::string hex = HexEncode(bytes);
  EXPECT_EQ(hex.size(), 512u);
  EXPECT_EQ(hex.substr(0, 6), "000102");
  auto back = HexDecode(hex);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, bytes);
  auto upper = HexDecode("ABcd");
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ((*upper)[0], std::byte{0xab});
  EXPECT_EQ((*upper)[1], std::byte{0xcd});
}

TEST(FabricHex, RejectsMalformed) {
  EXPECT_EQ(HexDecode("").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(HexDecode("abc").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(HexDecode("zz").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(HexDecode("12 4").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(HexDecode(std::string(2 * kMaxEndpointName + 2, 'a')).status().code(),
            Code::kInvalidArgument);
}

TEST(FabricMrPlan, EachBit) {
  auto none = PlanForMrMode(0, 8);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->virt_addr || none->prov_key || none->local || none->endpoint_bind);
  EXPECT_EQ(MrPlanString(*none), "none");

  auto virt = PlanForMrMode(FI_MR_VIRT_ADDR, 8);
  ASSERT_TRUE(virt.ok());
  EXPECT_TRUE(virt->virt_addr);
  EXPECT_EQ(RemoteAddress(*virt, 0x1000, 24), 0x1018u);
  EXPECT_EQ(RemoteAddress(*none, 0x1000, 24), 24u);

  auto all = PlanForMrMode(
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT, 4);
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->local && all->virt_addr && all->allocated && all->prov_key &&
              all->endpoint_bind);
  EXPECT_EQ(all->key_size, 4u);
  EXPECT_EQ(MrPlanString(*all), "LOCAL|VIRT_ADDR|ALLOCATED|PROV_KEY|ENDPOINT");
}

TEST(FabricMrPlan, LegacyBasicAndUnsupported) {
  auto basic = PlanForMrMode(FI_MR_BASIC, 8);
  ASSERT_TRUE(basic.ok());
  EXPECT_TRUE(basic->virt_addr && basic->prov_key && basic->allocated);
  auto scalable = PlanForMrMode(FI_MR_SCALABLE, 8);
  ASSERT_TRUE(scalable.ok());
  EXPECT_FALSE(scalable->virt_addr || scalable->prov_key);
  EXPECT_EQ(PlanForMrMode(FI_MR_RAW, 8).status().code(), Code::kUnavailable);
  EXPECT_EQ(PlanForMrMode(FI_MR_MMU_NOTIFY, 8).status().code(), Code::kUnavailable);
  EXPECT_EQ(PlanForMrMode(0, 16).status().code(), Code::kUnavailable);
  EXPECT_EQ(PlanForMrMode(0, 0).status().code(), Code::kUnavailable);
  EXPECT_EQ(SupportedMrModeBits() & FI_MR_RAW, 0u);
}

TEST(FabricMrPlan, RequestedKey) {
  MrPlan plan;
  EXPECT_EQ(RequestedKey(plan, 0x1122334455667788ull, 0), 0x1122334455667788ull);
  EXPECT_NE(RequestedKey(plan, 0x1122334455667788ull, 1), 0x1122334455667788ull);
  plan.key_size = 4;
  EXPECT_EQ(RequestedKey(plan, 0x1122334455667788ull, 0), 0x55667788ull);
  EXPECT_LE(RequestedKey(plan, 0x1122334455667788ull, 3), 0xffffffffull);
  plan.prov_key = true;
  EXPECT_EQ(RequestedKey(plan, 0x1122334455667788ull, 0), 0u);
}

TEST(FabricMrPlan, InBounds) {
  EXPECT_TRUE(InBounds(0, 64, 64));
  EXPECT_TRUE(InBounds(64, 0, 64));
  EXPECT_FALSE(InBounds(1, 64, 64));
  EXPECT_FALSE(InBounds(65, 0, 64));
  EXPECT_FALSE(InBounds(8, UINT64_MAX, 64));  // no overflow wrap
  EXPECT_FALSE(InBounds(UINT64_MAX, 8, 64));
}

TEST(FabricWire, BuildParseRoundTrip) {
  std::vector<std::byte> buf;
  const std::string name = "fi_shm://1234";
  const std::string payload = "hello";
  BuildMessage(buf, MsgType::kRpcRequest, 77, 0xabcdef, 0,
               std::as_bytes(std::span(name.data(), name.size())),
               std::as_bytes(std::span(payload.data(), payload.size())));
  auto m = ParseMessage(buf, 1024);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->header.imm, 77u);
  EXPECT_EQ(m->header.seq, 0xabcdefu);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->name.data()), m->name.size()), name);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->payload.data()), m->payload.size()),
            payload);
}

TEST(FabricWire, RejectsMalformed) {
  std::vector<std::byte> buf;
  BuildMessage(buf, MsgType::kRpcReply, 0, 1, 0, {}, std::vector<std::byte>(100));
  EXPECT_TRUE(ParseMessage(buf, 100).ok());
  EXPECT_EQ(ParseMessage(buf, 99).status().code(), Code::kProtocol);  // payload over limit
  auto truncated = std::span<const std::byte>(buf).first(buf.size() - 1);
  EXPECT_EQ(ParseMessage(truncated, 1000).status().code(), Code::kProtocol);
  EXPECT_EQ(ParseMessage(std::span<const std::byte>(buf).first(10), 1000).status().code(),
            Code::kProtocol);
  auto bad = buf;
  bad[0] = std::byte{0};
  EXPECT_EQ(ParseMessage(bad, 1000).status().code(), Code::kProtocol);
  bad = buf;
  bad[5] = std::byte{99};  // type
  EXPECT_EQ(ParseMessage(bad, 1000).status().code(), Code::kProtocol);
  bad = buf;
  uint16_t huge_name = 60000;
  std::memcpy(bad.data() + 6, &huge_name, 2);
  EXPECT_EQ(ParseMessage(bad, 1000).status().code(), Code::kProtocol);
}

TEST(FabricCreate, MissingProviderIsCleanError) {
  TransportConfig cfg;
  cfg.backend = "fabric";
  cfg.provider = "no_such_provider";
  auto t = CreateFabricTransport(cfg);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kUnavailable);
  EXPECT_NE(t.status().message().find("no_such_provider"), std::string_view::npos)
      << t.status().ToString();
}

TEST(FabricCreate, RejectsBadConfig) {
  TransportConfig cfg;
  cfg.backend = "fabric";
  cfg.max_rpc_bytes = 0;
  EXPECT_EQ(CreateFabricTransport(cfg).status().code(), Code::kInvalidArgument);
}

// A process SIGKILLed earlier with our pid left its shm files behind. Under libfabric's default
// name ("<pid>:<uid>:<endpoint index>") our next endpoint would open one of them and fail with
// EBUSY (seen in CI after pid reuse); under ShmSourceName ("<pid>_<random>") nothing collides.
TEST(FabricShm, ADeadProcessesFilesUnderOurPidDoNotBlockANewEndpoint) {
  std::vector<std::string> planted;  // only files this test created, removed at the end
  const std::string old_prefix = std::to_string(getpid()) + ":" + std::to_string(getuid()) + ":";
  for (int i = 0; i < 4096; ++i) {
    const std::string path = "/dev/shm/" + old_prefix + std::to_string(i);
    const int fd = ::open(path.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) continue;
    if (::ftruncate(fd, 1 << 20) != 0) ADD_FAILURE() << "ftruncate " << path;
    ::close(fd);
    planted.push_back(path);
  }
  ASSERT_FALSE(planted.empty()) << "/dev/shm is not writable here";
  TransportConfig cfg;
  cfg.backend = "fabric";
  cfg.provider = "shm";
  Status started;
  {
    auto t = CreateFabricTransport(cfg);
    started = t.ok() ? (*t)->start() : t.status();
    if (t.ok()) (*t)->stop();
  }  // destroyed before the planted files go
  for (const std::string& p : planted) std::filesystem::remove(p);
  if (started.code() == Code::kUnavailable) GTEST_SKIP() << started.ToString();
  EXPECT_TRUE(started.ok()) << started.ToString();
}

TEST(FabricShm, SourceNamesDifferPerCallAndStartWithThePid) {
  const std::string a = ShmSourceName(), b = ShmSourceName();
  EXPECT_NE(a, b);
  EXPECT_TRUE(a.starts_with(ShmFilePrefix(getpid()))) << a;
  EXPECT_EQ(a.size(), ShmFilePrefix(getpid()).size() + 16) << a;
}

// ---- against real providers ---------------------------------------------------------------

struct Param {
  const char* name;
  const char* provider;
  bool force_mr_local;
};

class FabricLive : public ::testing::TestWithParam<Param> {
 protected:
  TransportConfig Config(std::chrono::milliseconds timeout = 5000ms) {
    TransportConfig cfg;
    cfg.backend = "fabric";
    cfg.provider = GetParam().provider;
    cfg.listen_host = "127.0.0.1";
    cfg.op_timeout = timeout;
    cfg.max_rpc_bytes = 64 << 10;
    return cfg;
  }
  std::unique_ptr<Transport> Make(const TransportConfig& cfg) {
    FabricOptions opts;
    opts.force_mr_local = GetParam().force_mr_local;
    auto t = CreateFabricTransportWithOptions(cfg, opts);
    if (!t.ok()) {
      skip_reason_ = t.status().ToString();
      return nullptr;
    }
    return std::move(t).value();
  }

  void SetUp() override {
    target_ = Make(Config());
    if (!target_) GTEST_SKIP() << "provider unavailable: " << skip_reason_;
    initiator_ = Make(Config());
    ASSERT_NE(initiator_, nullptr) << skip_reason_;
    target_->set_rpc_handler([this](std::unique_ptr<IncomingRpc> rpc) {
      if (rpc->imm() == 999) {  // held, never answered until the test ends
        std::lock_guard lock(held_mu_);
        held_.push_back(std::move(rpc));
        return;
      }
      std::vector<std::byte> out(rpc->payload().begin(), rpc->payload().end());
      for (auto& b : out) b = static_cast<std::byte>(static_cast<unsigned>(b) + 1);
      (void)rpc->reply(rpc->imm() + 1, out);
    });
    ASSERT_TRUE(target_->start().ok());
    ASSERT_TRUE(initiator_->start().ok());
    buf_.assign(4096, 0);
    auto mr = target_->register_memory(buf_.data(), buf_.size() * sizeof(uint64_t));
    ASSERT_TRUE(mr.ok()) << mr.status().ToString();
    region_ = *mr;
    auto peer = initiator_->add_peer(target_->local_address());
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    peer_ = *peer;
    auto ctx = initiator_->create_context();
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    ctx_ = std::move(ctx).value();
  }
  void TearDown() override {
    {
      std::lock_guard lock(held_mu_);
      held_.clear();
    }
    ctx_.reset();
    if (initiator_) initiator_->stop();
    if (target_) target_->stop();
  }

  // Waits for exactly one completion (the test's safety net is far beyond op_timeout).
  Completion WaitOne() {
    Completion c;
    const auto give_up = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < give_up) {
      if (ctx_->poll(std::span(&c, 1)) == 1) return c;
    }
    ADD_FAILURE() << "no completion within 30 s";
    c.status = Status::Internal("test gave up");
    return c;
  }
  Status Read(uint64_t offset, void* dst, size_t len, RegionKey key = 0) {
    Status st = ctx_->post_read(RemoteRef{peer_, key ? key : region_.key, offset}, dst, len, 1);
    if (!st.ok()) return st;
    return WaitOne().status;
  }

  std::string skip_reason_;
  std::unique_ptr<Transport> target_, initiator_;
  std::unique_ptr<Context> ctx_;
  std::vector<uint64_t> buf_;
  MemoryRegion region_;
  PeerId peer_ = kInvalidPeer;
  std::mutex held_mu_;
  std::vector<std::unique_ptr<IncomingRpc>> held_;
};

TEST_P(FabricLive, ReadWriteAtomicsRpc) {
  buf_[3] = 0x1234;
  uint64_t got = 0;
  ASSERT_TRUE(Read(24, &got, 8).ok());
  EXPECT_EQ(got, 0x1234u);

  uint64_t val = 0xfeed;
  ASSERT_TRUE(ctx_->post_write(RemoteRef{peer_, region_.key, 40}, &val, 8, 2, true).ok());
  Completion c = WaitOne();
  ASSERT_TRUE(c.status.ok()) << c.status.ToString();
  EXPECT_EQ(c.wr_id, 2u);
  EXPECT_EQ(c.op, OpType::kWrite);
  EXPECT_EQ(buf_[5], 0xfeedu);

  uint64_t old = 0;
  ASSERT_TRUE(ctx_->post_compare_swap(RemoteRef{peer_, region_.key, 40}, 0xfeed, 7, &old, 3).ok());
  c = WaitOne();
  ASSERT_TRUE(c.status.ok()) << c.status.ToString();
  EXPECT_EQ(old, 0xfeedu);
  EXPECT_EQ(buf_[5], 7u);

  ASSERT_TRUE(ctx_->post_fetch_add(RemoteRef{peer_, region_.key, 40}, 5, &old, 4).ok());
  c = WaitOne();
  ASSERT_TRUE(c.status.ok()) << c.status.ToString();
  EXPECT_EQ(old, 7u);
  EXPECT_EQ(buf_[5], 12u);

  const std::vector<std::byte> req = {std::byte{1}, std::byte{2}, std::byte{3}};
  std::vector<std::byte> reply(16);
  ASSERT_TRUE(ctx_->post_rpc(peer_, 41, req, reply, 5).ok());
  c = WaitOne();
  ASSERT_TRUE(c.status.ok()) << c.status.ToString();
  EXPECT_EQ(c.op, OpType::kRpc);
  EXPECT_EQ(c.reply_imm, 42u);
  ASSERT_EQ(c.reply_length, 3u);
  EXPECT_EQ(reply[0], std::byte{2});
  EXPECT_EQ(reply[2], std::byte{4});
  EXPECT_EQ(ctx_->outstanding(), 0u);
}

TEST_P(FabricLive, KeyLookupIsCachedPerContext) {
  uint64_t got = 0;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(Read(8 * i, &got, 8).ok());
  ContextStats s = GetContextStats(*ctx_);
  EXPECT_EQ(s.lookups_sent, 1u);
  EXPECT_GE(s.cache_hits, 4u);
  // A second region means a second lookup, the first stays cached.
  std::vector<uint64_t> other(16, 9);
  auto mr2 = target_->register_memory(other.data(), other.size() * 8);
  ASSERT_TRUE(mr2.ok());
  ASSERT_TRUE(Read(0, &got, 8, mr2->key).ok());
  EXPECT_EQ(got, 9u);
  ASSERT_TRUE(Read(0, &got, 8).ok());
  EXPECT_EQ(GetContextStats(*ctx_).lookups_sent, 2u);
  // Another context has its own cache.
  auto ctx2 = initiator_->create_context();
  ASSERT_TRUE(ctx2.ok());
  EXPECT_EQ(GetContextStats(**ctx2).lookups_sent, 0u);
}

TEST_P(FabricLive, ManyInFlightShareOneLookup) {
  for (size_t i = 0; i < buf_.size(); ++i) buf_[i] = i * 3;
  std::vector<uint64_t> dst(256, 0);
  for (uint64_t i = 0; i < dst.size(); ++i) {
    ASSERT_TRUE(ctx_->post_read(RemoteRef{peer_, region_.key, i * 8}, &dst[i], 8, i).ok());
  }
  size_t done = 0;
  std::vector<Completion> cs(32);
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (done < dst.size() && std::chrono::steady_clock::now() < give_up) {
    const size_t n = ctx_->poll(cs);
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(cs[i].status.ok()) << cs[i].status.ToString();
    done += n;
  }
  ASSERT_EQ(done, dst.size());
  for (uint64_t i = 0; i < dst.size(); ++i) EXPECT_EQ(dst[i], i * 3);
  EXPECT_EQ(GetContextStats(*ctx_).lookups_sent, 1u);
}

TEST_P(FabricLive, DeregisteredKeyAfterCachedLookupIsNotFound) {
  uint64_t got = 0;
  ASSERT_TRUE(Read(0, &got, 8).ok());
  ASSERT_TRUE(target_->deregister_memory(region_.key).ok());
  Status st = Read(0, &got, 8);
  EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
  uint64_t old = 0;
  ASSERT_TRUE(ctx_->post_fetch_add(RemoteRef{peer_, region_.key, 0}, 1, &old, 9).ok());
  st = WaitOne().status;
  EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
  EXPECT_EQ(target_->deregister_memory(region_.key).code(), Code::kNotFound);
}

TEST_P(FabricLive, WrongKeyBoundsAndAlignment) {
  uint64_t got = 0;
  EXPECT_EQ(Read(0, &got, 8, region_.key ^ 0x5555).code(), Code::kNotFound);
  const uint64_t len = buf_.size() * 8;
  EXPECT_EQ(Read(len - 4, &got, 8).code(), Code::kOutOfRange);
  EXPECT_EQ(Read(len, &got, 1).code(), Code::kOutOfRange);
  EXPECT_TRUE(Read(len - 8, &got, 8).ok());
  uint64_t old = 0;
  Status st = ctx_->post_fetch_add(RemoteRef{peer_, region_.key, 4}, 1, &old, 1);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  st = ctx_->post_compare_swap(RemoteRef{peer_, region_.key, len}, 0, 1, &old, 1);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(WaitOne().status.code(), Code::kOutOfRange);
  EXPECT_EQ(ctx_->post_read(RemoteRef{peer_ + 7, region_.key, 0}, &got, 8, 1).code(),
            Code::kNotFound);
}

TEST_P(FabricLive, RpcErrorsAndTimeout) {
  // A reply larger than the caller's buffer.
  std::vector<std::byte> req(100, std::byte{1});
  std::vector<std::byte> small(10);
  ASSERT_TRUE(ctx_->post_rpc(peer_, 1, req, small, 1).ok());
  EXPECT_EQ(WaitOne().status.code(), Code::kResourceExhausted);
  // A request over max_rpc_bytes is refused at post time.
  std::vector<std::byte> huge((64 << 10) + 1);
  EXPECT_EQ(ctx_->post_rpc(peer_, 1, huge, small, 1).code(), Code::kInvalidArgument);

  // Never-answering handler: a separate initiator with a short timeout.
  auto quick = Make(Config(300ms));
  ASSERT_NE(quick, nullptr);
  ASSERT_TRUE(quick->start().ok());
  auto p = quick->add_peer(target_->local_address());
  ASSERT_TRUE(p.ok());
  auto qctx = quick->create_context();
  ASSERT_TRUE(qctx.ok());
  ASSERT_TRUE((*qctx)->post_rpc(*p, 999, req, small, 77).ok());
  Completion c;
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  size_t n = 0;
  while (n == 0 && std::chrono::steady_clock::now() < give_up) n = (*qctx)->poll(std::span(&c, 1));
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(c.wr_id, 77u);
  EXPECT_EQ(c.status.code(), Code::kTimedOut) << c.status.ToString();
  // Dropping the held handle answers with an error that nobody waits for any more: no crash.
  std::lock_guard lock(held_mu_);
  held_.clear();
}

TEST_P(FabricLive, DroppedIncomingRpcRepliesWithError) {
  auto t2 = Make(Config());
  ASSERT_NE(t2, nullptr);
  t2->set_rpc_handler([](std::unique_ptr<IncomingRpc>) {});  // drops the handle
  ASSERT_TRUE(t2->start().ok());
  auto p = initiator_->add_peer(t2->local_address());
  ASSERT_TRUE(p.ok());
  std::vector<std::byte> reply(8);
  ASSERT_TRUE(ctx_->post_rpc(*p, 1, {}, reply, 5).ok());
  Completion c = WaitOne();
  EXPECT_EQ(c.status.code(), Code::kAborted) << c.status.ToString();
  t2->stop();
}

TEST_P(FabricLive, StopAbortsPendingAndRefusesNewOps) {
  std::vector<std::byte> req(4), reply(8);
  ASSERT_TRUE(ctx_->post_rpc(peer_, 999, req, reply, 5).ok());  // held by the target
  initiator_->stop();
  Completion c = WaitOne();
  EXPECT_EQ(c.status.code(), Code::kAborted);
  uint64_t got;
  EXPECT_EQ(ctx_->post_read(RemoteRef{peer_, region_.key, 0}, &got, 8, 1).code(),
            Code::kUnavailable);
  EXPECT_EQ(initiator_->register_memory(&got, 8).status().code(), Code::kUnavailable);
}

TEST_P(FabricLive, ConcurrentFetchAddFromThreads) {
  constexpr int kThreads = 3, kPerThread = 200;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto ctx = initiator_->create_context();
      if (!ctx.ok()) {
        failures++;
        return;
      }
      for (int i = 0; i < kPerThread; ++i) {
        uint64_t old = 0;
        if (!(*ctx)->post_fetch_add(RemoteRef{peer_, region_.key, 64}, 1, &old, i).ok()) {
          failures++;
          continue;
        }
        Completion c;
        const auto give_up = std::chrono::steady_clock::now() + 30s;
        size_t n = 0;
        while (n == 0 && std::chrono::steady_clock::now() < give_up) {
          n = (*ctx)->poll(std::span(&c, 1));
        }
        if (n != 1 || !c.status.ok()) failures++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(buf_[8], uint64_t{kThreads * kPerThread});
}

TEST_P(FabricLive, AddressesAndPeerIds) {
  const std::string addr = target_->local_address();
  EXPECT_FALSE(addr.empty());
  // hex(endpoint name), plus ".<pid>.<fd>.<table id>" of the key table on shm.
  EXPECT_TRUE(HexDecode(addr.substr(0, addr.find('.'))).ok());
  EXPECT_EQ(addr.find('.') != std::string::npos, std::string(GetParam().provider) == "shm");
  auto again = initiator_->add_peer(addr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, peer_);
  auto self = initiator_->add_peer(initiator_->local_address());
  ASSERT_TRUE(self.ok());
  EXPECT_NE(*self, peer_);
  EXPECT_EQ(initiator_->add_peer("xyz").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(initiator_->add_peer("abcd.12").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(initiator_->add_peer("abcd.1.2.x").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(initiator_->add_peer("abcd.0.2.3").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(target_->name(), std::string("fabric:") + GetParam().provider);
  EXPECT_FALSE(MrPlanOf(*target_).empty());
}

INSTANTIATE_TEST_SUITE_P(Providers, FabricLive,
                         ::testing::Values(Param{"shm", "shm", false},
                                           Param{"shm_mr_local", "shm", true},
                                           Param{"tcp_rxm", "tcp;ofi_rxm", false},
                                           Param{"tcp_rxm_mr_local", "tcp;ofi_rxm", true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace farmem::fabric

namespace farmem::fabric {
namespace {

TEST_P(FabricLive, LargeRpcPayloads) {
  // Above shm's 4 KiB inject size the provider switches protocols; with both endpoints in this
  // process that used to crash libfabric 1.17 at endpoint close (see the grace period in
  // fabric_transport.cc).
  const std::vector<size_t> sizes = {1000, 4000, 4096, 60 << 10};
  for (size_t size : sizes) {
    SCOPED_TRACE(size);
    std::vector<std::byte> req(size, std::byte{5});
    std::vector<std::byte> reply(size + 16);
    ASSERT_TRUE(ctx_->post_rpc(peer_, 10, req, reply, 1).ok());
    Completion c = WaitOne();
    ASSERT_TRUE(c.status.ok()) << c.status.ToString();
    ASSERT_EQ(c.reply_length, size);
    EXPECT_EQ(reply[size - 1], std::byte{6});
  }
}

// Wake-up stress for the shm doorbell. The target's progress thread never spins
// (spin_before_sleep = 0) and sleeps on its doorbell with no timeout (idle_wait_forever), so an
// operation that needs the target's progress completes only if its initiator rang the doorbell
// after posting it; a missing ring, or a ring lost between the target's "asleep" flag and its
// futex wait, ends as kTimedOut. Delivery-complete writes (shm sends them to the target as
// commands, unlike plain writes and reads, which are CMA), CAS, FAA, small and 8 KiB RPCs from
// two threads, with random short pauses, so posts land before, while and after the target goes to
// sleep; now and then a burst of reads (CMA, but each queues a small command, so a target that
// never progresses fills its queue and the provider refuses further posts with -FI_EAGAIN).
TEST_P(FabricLive, ShmDoorbellWakesASleepingTargetForEveryOp) {
  if (std::string(GetParam().provider) != "shm") {
    GTEST_SKIP() << "only same-host (shm) targets have a doorbell";
  }
  FabricOptions opts;
  opts.force_mr_local = GetParam().force_mr_local;
  opts.idle_wait_forever = true;
  TransportConfig cfg = Config(2000ms);
  cfg.spin_before_sleep = 0us;
  auto made = CreateFabricTransportWithOptions(cfg, opts);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  std::unique_ptr<Transport> sleepy = std::move(made).value();
  sleepy->set_rpc_handler([](std::unique_ptr<IncomingRpc> rpc) {
    std::vector<std::byte> out(rpc->payload().begin(), rpc->payload().end());
    (void)rpc->reply(rpc->imm() + 1, out);
  });
  ASSERT_TRUE(sleepy->start().ok());
  std::vector<uint64_t> words(1024, 0);
  auto mr = sleepy->register_memory(words.data(), words.size() * 8);
  ASSERT_TRUE(mr.ok()) << mr.status().ToString();
  auto peer = initiator_->add_peer(sleepy->local_address());
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();

  constexpr int kThreads = 2;
  constexpr int kOpsPerThread = 1000;
  std::atomic<int> failures{0};
  auto run = [&](int thread) {
    auto made_ctx = initiator_->create_context();
    if (!made_ctx.ok()) {
      failures++;
      ADD_FAILURE() << made_ctx.status().ToString();
      return;
    }
    Context& ctx = **made_ctx;
    std::mt19937 rng(thread + 1);
    auto wait = [&]() -> Completion {
      Completion c;
      const auto give_up = std::chrono::steady_clock::now() + 30s;
      while (std::chrono::steady_clock::now() < give_up) {
        if (ctx.poll(std::span(&c, 1)) == 1) return c;
      }
      c.status = Status::Internal("no completion within 30 s");
      return c;
    };
    // Each thread owns words [thread * 512, thread * 512 + 512).
    const uint64_t base = uint64_t(thread) * 512 * 8;
    uint64_t faa_expected = 0;
    for (int i = 0; i < kOpsPerThread && failures.load() == 0; ++i) {
      const int pause = int(rng() % 4);
      if (pause == 1) std::this_thread::yield();
      if (pause >= 2) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
      const uint64_t v = uint64_t(thread) << 32 | uint64_t(i + 1);
      uint64_t old = 0;
      if (i % 500 == 250) {  // read burst: more reads than shm's command queue holds
        uint64_t got = 0;
        for (int k = 0; k < 2000; ++k) {
          Status st = ctx.post_read(RemoteRef{*peer, mr->key, base + 8}, &got, 8, k);
          Completion rc = st.ok() ? wait() : Completion{};
          if (!st.ok()) rc.status = st;
          if (!rc.status.ok()) {
            failures++;
            ADD_FAILURE() << "thread " << thread << " read " << k << ": " << rc.status.ToString();
            return;
          }
        }
      }
      const int kind = i % 5;
      std::vector<std::byte> req(kind == 4 ? 8192 : 8, std::byte{uint8_t(i)});
      std::vector<std::byte> reply(req.size());
      Status posted;
      switch (kind) {
        case 0:
          posted = ctx.post_write(RemoteRef{*peer, mr->key, base + 8}, &v, 8, i, true);
          break;
        case 1:
          posted = ctx.post_compare_swap(RemoteRef{*peer, mr->key, base + 8}, v - 1, v, &old, i);
          break;
        case 2:
          posted = ctx.post_fetch_add(RemoteRef{*peer, mr->key, base + 16}, 1, &old, i);
          break;
        default:
          posted = ctx.post_rpc(*peer, uint32_t(i), req, reply, i);
          break;
      }
      Completion c = posted.ok() ? wait() : Completion{};
      if (!posted.ok()) c.status = posted;
      if (!c.status.ok()) {
        failures++;
        ADD_FAILURE() << "thread " << thread << " op " << i << " (kind " << kind
                      << "): " << c.status.ToString();
        return;
      }
      if (kind == 0) {
        EXPECT_EQ(words[base / 8 + 1], v);  // delivery-complete: landed
      }
      if (kind == 1) {
        EXPECT_EQ(old, v - 1);  // the write just before (op i - 1) stored v - 1
      }
      if (kind >= 3) {
        EXPECT_EQ(c.reply_length, req.size());
      }
      if (kind == 2) {
        EXPECT_EQ(old, faa_expected++);
      }
      if (kind >= 3) {
        EXPECT_EQ(c.reply_imm, uint32_t(i) + 1);
      }
    }
    std::printf("thread %d: %llu posts refused with -FI_EAGAIN (and retried)\n", thread,
                (unsigned long long)GetContextStats(ctx).eagain_retries);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(run, t);
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  sleepy->stop();
}

}  // namespace
}  // namespace farmem::fabric

namespace farmem::fabric {
namespace {

// What the provider itself does with a WRITE/CAS/FAA to a region registered FI_REMOTE_READ only,
// with the initiator-side check switched off (skip_access_check). Pins down the table in
// docs/fabric.md "Read-only regions" (libfabric 1.17); callers never take this path (the
// conformance suite covers theirs). A failure here means the provider's behaviour changed: update
// that table.
TEST_P(FabricLive, ReadOnlyRegionProviderEnforcement) {
  if (GetParam().force_mr_local) {
    GTEST_SKIP() << "FI_MR_LOCAL changes only local descriptors: same target path as without it";
  }
  const bool shm = std::string(GetParam().provider) == "shm";
  std::vector<uint64_t> ro(512, 0x1111);
  auto mr = target_->register_memory(ro.data(), ro.size() * 8, Access::kReadOnly);
  ASSERT_TRUE(mr.ok()) << mr.status().ToString();
  FabricOptions opts;
  opts.skip_access_check = true;
  // shm answers some refused operations never: keep its timeouts short. tcp;ofi_rxm answers all
  // of them; a short timeout there only turns a slow answer (sanitizers, loaded CI) into a flake.
  auto raw = CreateFabricTransportWithOptions(Config(shm ? 300ms : 5000ms), opts);
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  ASSERT_TRUE((*raw)->start().ok());
  auto p = (*raw)->add_peer(target_->local_address());
  ASSERT_TRUE(p.ok());
  auto wait = [&](Context& c) {
    Completion out;
    const auto give_up = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < give_up) {
      if (c.poll(std::span(&out, 1)) == 1) return out.status;
    }
    ADD_FAILURE() << "no completion within 30 s";
    return Status::Internal("test gave up");
  };
  // Each operation on a fresh context (its own endpoint), then a read on the same context to see
  // whether that endpoint still works.
  struct Outcome {
    Status op, read_after;
    uint64_t memory = 0;
  };
  auto probe = [&](OpType type, bool delivery_complete, uint64_t offset) -> Outcome {
    Outcome o;
    auto ctx = (*raw)->create_context();
    if (!ctx.ok()) {
      ADD_FAILURE() << ctx.status().ToString();
      return o;
    }
    Context& c = **ctx;
    const RemoteRef ref{*p, mr->key, offset};
    uint64_t v = 0x2222, old = 0, rd = 0;
    Status posted;
    if (type == OpType::kWrite) {
      posted = c.post_write(ref, &v, 8, 1, delivery_complete);
    } else if (type == OpType::kCompareSwap) {
      posted = c.post_compare_swap(ref, 0x1111, 0x3333, &old, 1);
    } else {
      posted = c.post_fetch_add(ref, 1, &old, 1);
    }
    o.op = posted.ok() ? wait(c) : posted;
    posted = c.post_read(RemoteRef{*p, mr->key, 256}, &rd, 8, 2);
    o.read_after = posted.ok() ? wait(c) : posted;
    o.memory = ro[offset / 8];
    std::cout << "  " << GetParam().provider << " " << OpTypeName(type)
              << (type == OpType::kWrite ? (delivery_complete ? "(dc)" : "(no dc)") : "") << ": "
              << o.op.ToString() << "; memory " << std::hex << o.memory << std::dec
              << "; next read on that context: " << o.read_after.ToString() << "\n";
    return o;
  };

  // Delivery-complete write: refused, nothing lands. tcp: the target closes the connection
  // (FI_ECANCELED -> kAborted); shm: never answered (kTimedOut), and that endpoint's later
  // operations hang behind it.
  Outcome dc = probe(OpType::kWrite, true, 0);
  EXPECT_FALSE(dc.op.ok());
  EXPECT_EQ(dc.memory, 0x1111u);
  if (shm) {
    EXPECT_EQ(dc.op.code(), Code::kTimedOut) << dc.op.ToString();
  } else {
    EXPECT_EQ(dc.op.code(), Code::kAborted) << dc.op.ToString();
    EXPECT_TRUE(dc.read_after.ok()) << dc.read_after.ToString();  // rxm reconnects
  }
  // Atomics: tcp;ofi_rxm refuses with FI_EACCES (kPermissionDenied); shm never answers.
  for (OpType t : {OpType::kCompareSwap, OpType::kFetchAdd}) {
    Outcome a = probe(t, false, t == OpType::kCompareSwap ? 16 : 24);
    EXPECT_EQ(a.memory, 0x1111u);
    EXPECT_EQ(a.op.code(), shm ? Code::kTimedOut : Code::kPermissionDenied) << a.op.ToString();
    EXPECT_TRUE(a.read_after.ok()) << a.read_after.ToString();
  }
  // Write without delivery-complete: completes OK. tcp refuses it at the target (memory unchanged)
  // by closing the connection, which usually fails the next op on it (printed, not asserted: it
  // depends on when rxm notices); shm's CMA fast path writes with no MR check at all, so the
  // bytes land (when CMA is usable here; otherwise shm uses its command path, which checks the
  // MR): printed, not asserted.
  Outcome nodc = probe(OpType::kWrite, false, 8);
  EXPECT_TRUE(nodc.op.ok()) << nodc.op.ToString();
  if (!shm) {
    EXPECT_EQ(nodc.memory, 0x1111u);
  }
  (*raw)->stop();

  // The target itself keeps serving other initiators.
  uint64_t got = 0;
  EXPECT_TRUE(Read(0, &got, 8).ok());
  std::vector<std::byte> reply(16);
  ASSERT_TRUE(ctx_->post_rpc(peer_, 1, {}, reply, 9).ok());
  EXPECT_TRUE(WaitOne().status.ok());
  EXPECT_TRUE(target_->deregister_memory(mr->key).ok());
}

// The direct shm read path (the default; FARMEM_FABRIC_DIRECT_COPY=0 turns it off: the context
// copies reads with process_vm_readv itself instead of going through the provider's queue;
// fabric_initiator.cc, TryDirectCopy). The variable is read when a context opens, so each test
// opens its own with the value it needs, whatever the suite runs with.
// `value` null: the variable unset (the default).
Result<std::unique_ptr<Context>> ContextWithDirectCopyEnv(Transport& t, const char* value) {
  const char* env = getenv("FARMEM_FABRIC_DIRECT_COPY");
  const std::optional<std::string> saved = env ? std::optional<std::string>(env) : std::nullopt;
  if (value) {
    setenv("FARMEM_FABRIC_DIRECT_COPY", value, 1);
  } else {
    unsetenv("FARMEM_FABRIC_DIRECT_COPY");
  }
  auto ctx = t.create_context();
  if (saved) {
    setenv("FARMEM_FABRIC_DIRECT_COPY", saved->c_str(), 1);
  } else {
    unsetenv("FARMEM_FABRIC_DIRECT_COPY");
  }
  return ctx;
}
Result<std::unique_ptr<Context>> ContextWithDirectCopy(Transport& t, bool on) {
  return ContextWithDirectCopyEnv(t, on ? "1" : "0");
}

class FabricShmReads : public FabricLive {
 protected:
  // A context with direct copies on, or null with the reason in skip_reason_.
  std::unique_ptr<Context> DirectContext() {
    if (std::string_view(GetParam().provider) != "shm") {
      skip_reason_ = "direct copies are an shm path";
      return nullptr;
    }
    if (MrPlanOf(*initiator_).find("VIRT_ADDR") == std::string::npos) {
      skip_reason_ = "shm without FI_MR_VIRT_ADDR here (" + MrPlanOf(*initiator_) + ")";
      return nullptr;
    }
    auto ctx = ContextWithDirectCopy(*initiator_, true);
    EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
    return ctx.ok() ? std::move(ctx).value() : nullptr;
  }
};

TEST_P(FabricShmReads, ReadsAreCopiedHereAndKeepEveryCheck) {
  auto direct = DirectContext();
  if (!direct) GTEST_SKIP() << skip_reason_;
  ctx_ = std::move(direct);  // Read() and WaitOne() use ctx_
  for (size_t i = 0; i < buf_.size(); ++i) buf_[i] = i * 7 + 1;
  const uint64_t len = buf_.size() * 8;
  std::vector<uint64_t> all(buf_.size(), 0);
  ASSERT_TRUE(Read(0, all.data(), len).ok());
  EXPECT_EQ(all, buf_);
  uint32_t odd = 0;
  ASSERT_TRUE(Read(8 * 5 + 3, &odd, 3).ok());
  uint32_t want = 0;
  std::memcpy(&want, reinterpret_cast<const char*>(buf_.data()) + 43, 3);
  EXPECT_EQ(odd, want);
  EXPECT_EQ(GetContextStats(*ctx_).direct_copies, 2u);  // 0: the provider copied them

  // The same refusals as on the provider path, before any copy.
  uint64_t got = 0;
  EXPECT_EQ(Read(len - 4, &got, 8).code(), Code::kOutOfRange);
  EXPECT_EQ(Read(0, &got, 8, region_.key ^ 0x5555).code(), Code::kNotFound);
  // Writes still go through the provider, and the next direct read sees them.
  uint64_t val = 0xfeed;
  ASSERT_TRUE(ctx_->post_write(RemoteRef{peer_, region_.key, 16}, &val, 8, 2, true).ok());
  ASSERT_TRUE(WaitOne().status.ok());
  ASSERT_TRUE(Read(16, &got, 8).ok());
  EXPECT_EQ(got, 0xfeedu);
  EXPECT_EQ(GetContextStats(*ctx_).direct_copies, 3u);
  // A deregistered key: NotFound, from the key table, not a read of whatever is there now.
  ASSERT_TRUE(target_->deregister_memory(region_.key).ok());
  EXPECT_EQ(Read(0, &got, 8).code(), Code::kNotFound);
  EXPECT_EQ(GetContextStats(*ctx_).direct_copies, 3u);
}

// A region deregistered while a read of it runs, its memory then reused (as freed memory is, still
// mapped): the read must fail, never return the new contents as the old region's. shm reads are
// process_vm_readv copies that no deregistration waits for, so the context checks the key's slot
// again when a read completes (ReadStillValid); without that check this fails within a few of the
// 200 rounds, on the provider's path and on the direct one (a 1 MiB copy is long enough for the
// deregistering thread to land inside it).
void ExpectRacingReadsNeverReturnReusedMemory(Transport& target, Context& ctx, PeerId peer) {
  constexpr size_t kWords = (1 << 20) / 8;
  std::vector<uint64_t> mem(kWords), dst(kWords);
  std::mt19937 rng(7);
  int ok_reads = 0, refused = 0;
  auto read = [&](RegionKey key, void* to, size_t len) {
    Status st = ctx.post_read(RemoteRef{peer, key, 0}, to, len, 1);
    if (!st.ok()) return st;
    Completion c;
    const auto give_up = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < give_up) {
      if (ctx.poll(std::span(&c, 1)) == 1) return c.status;
    }
    return Status::Internal("no completion within 30 s");
  };
  for (int round = 0; round < 200; ++round) {
    const uint64_t old_pattern = 2 * round + 1, new_pattern = 2 * round + 2;
    std::fill(mem.begin(), mem.end(), old_pattern);
    auto mr = target.register_memory(mem.data(), mem.size() * 8);
    ASSERT_TRUE(mr.ok()) << mr.status().ToString();
    uint64_t probe = 0;  // the key lookup first, so the racing read is a copy only
    ASSERT_TRUE(read(mr->key, &probe, 8).ok());
    std::atomic<bool> go{false};
    const auto delay = std::chrono::microseconds(rng() % 200);
    std::thread reuser([&] {
      while (!go.load(std::memory_order_acquire)) {
      }
      const auto until = std::chrono::steady_clock::now() + delay;
      while (std::chrono::steady_clock::now() < until) {
      }
      EXPECT_TRUE(target.deregister_memory(mr->key).ok());
      std::fill(mem.begin(), mem.end(), new_pattern);
    });
    go.store(true, std::memory_order_release);
    Status st = read(mr->key, dst.data(), dst.size() * 8);
    reuser.join();
    if (st.ok()) {
      ++ok_reads;
      const auto bad =
          std::find_if(dst.begin(), dst.end(), [&](uint64_t w) { return w != old_pattern; });
      ASSERT_EQ(bad, dst.end()) << "round " << round << ": an accepted read holds word "
                                << (bad - dst.begin()) << " = " << *bad << ", not " << old_pattern;
    } else {
      ++refused;
      EXPECT_EQ(st.code(), Code::kNotFound) << st.ToString();
    }
  }
  std::cout << "accepted " << ok_reads << ", refused " << refused << " of 200 racing reads\n";
}

// Direct copies are the default: a context opened with the variable unset copies reads itself;
// FARMEM_FABRIC_DIRECT_COPY=0 gives the provider's path back.
TEST_P(FabricShmReads, DirectCopyIsTheDefaultAndZeroTurnsItOff) {
  if (!DirectContext()) GTEST_SKIP() << skip_reason_;
  auto by_default = ContextWithDirectCopyEnv(*initiator_, nullptr);
  ASSERT_TRUE(by_default.ok()) << by_default.status().ToString();
  auto off = ContextWithDirectCopy(*initiator_, false);
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  for (size_t i = 0; i < buf_.size(); ++i) buf_[i] = i + 11;
  for (auto* ctx : {&by_default.value(), &off.value()}) {
    ctx_ = std::move(*ctx);  // Read() uses ctx_
    std::vector<uint64_t> got(buf_.size(), 0);
    ASSERT_TRUE(Read(0, got.data(), got.size() * 8).ok());
    EXPECT_EQ(got, buf_);
    EXPECT_EQ(GetContextStats(*ctx_).direct_copies, ctx == &by_default.value() ? 1u : 0u);
    *ctx = std::move(ctx_);
  }
}

TEST_P(FabricShmReads, ProviderReadRacingADeregistrationNeverReturnsReusedMemory) {
  if (std::string_view(GetParam().provider) != "shm") GTEST_SKIP() << "an shm question";
  // The provider's path, which FARMEM_FABRIC_DIRECT_COPY=0 selects.
  auto ctx = ContextWithDirectCopy(*initiator_, false);
  ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
  ExpectRacingReadsNeverReturnReusedMemory(*target_, **ctx, peer_);
  EXPECT_EQ(GetContextStats(**ctx).direct_copies, 0u);
}

TEST_P(FabricShmReads, DirectReadRacingADeregistrationNeverReturnsReusedMemory) {
  auto direct = DirectContext();
  if (!direct) GTEST_SKIP() << skip_reason_;
  ExpectRacingReadsNeverReturnReusedMemory(*target_, *direct, peer_);
  EXPECT_GT(GetContextStats(*direct).direct_copies, 0u);
}

// Ordered reads (Context::read_ordered_now): one process_vm_readv over every segment, on a key the
// context already knows, with the checks of an ordinary read; nullopt (read one by one) otherwise.
TEST_P(FabricShmReads, OrderedReadsAreOneCopyWithEveryCheck) {
  auto direct = DirectContext();
  if (!direct) GTEST_SKIP() << skip_reason_;
  ctx_ = std::move(direct);
  for (size_t i = 0; i < buf_.size(); ++i) buf_[i] = i * 3 + 5;
  uint64_t a = 0, c = 0;
  std::vector<uint64_t> b(16, 0);
  const ReadSegment segs[] = {{8, &a, 8}, {64, b.data(), 128}, {4000 * 8, &c, 8}};
  // The key is not known yet: nothing done in place.
  EXPECT_FALSE(ctx_->read_ordered_now(peer_, region_.key, segs).has_value());
  uint64_t probe = 0;
  ASSERT_TRUE(Read(0, &probe, 8).ok());  // the key lookup
  std::optional<Status> done = ctx_->read_ordered_now(peer_, region_.key, segs);
  ASSERT_TRUE(done.has_value());
  ASSERT_TRUE(done->ok()) << done->ToString();
  EXPECT_EQ(a, buf_[1]);
  EXPECT_EQ(b, std::vector<uint64_t>(buf_.begin() + 8, buf_.begin() + 24));
  EXPECT_EQ(c, buf_[4000]);
  EXPECT_EQ(GetContextStats(*ctx_).ordered_copies, 1u);
  // Out of bounds: refused before any copy, as a read is.
  const ReadSegment outside[] = {{0, &a, 8}, {buf_.size() * 8 - 4, &c, 8}};
  done = ctx_->read_ordered_now(peer_, region_.key, outside);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->code(), Code::kOutOfRange);
  // Scheduler::read_ordered takes the same path, and falls back to one read after another where
  // the context cannot (direct copies off).
  Scheduler sched(std::move(ctx_));
  a = c = 0;
  ASSERT_TRUE(sched.block_on(sched.read_ordered(peer_, region_.key, segs)).ok());
  EXPECT_EQ(a, buf_[1]);
  EXPECT_EQ(c, buf_[4000]);
  EXPECT_EQ(GetContextStats(sched.context()).ordered_copies, 2u);
  auto off = ContextWithDirectCopy(*initiator_, false);
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  Scheduler by_provider(std::move(off).value());
  a = c = 0;
  ASSERT_TRUE(by_provider.block_on(by_provider.read_ordered(peer_, region_.key, segs)).ok());
  EXPECT_EQ(a, buf_[1]);
  EXPECT_EQ(c, buf_[4000]);
  EXPECT_EQ(GetContextStats(by_provider.context()).ordered_copies, 0u);
  // A deregistered key: not read in place; the ordinary read then says NotFound.
  ASSERT_TRUE(target_->deregister_memory(region_.key).ok());
  EXPECT_EQ(sched.block_on(sched.read_ordered(peer_, region_.key, segs)).code(), Code::kNotFound);
}

// Seqlock readers over ordered reads, against a writer in the target (version odd, every data word
// set to version / 2 + 1, version even): a copy accepted (versions equal and even) is never torn.
// Counted in two segment orders: version, data, version (the real one) must accept no torn copy;
// both versions before the data (wrong: the copy is outside the window the versions check) shows
// that the check can fail.
struct SeqlockCounts {
  uint64_t accepted = 0;
  uint64_t torn_accepted = 0;
};
SeqlockCounts RunSeqlockReaders(Context& ctx, PeerId peer, RegionKey key, uint64_t* words,
                                bool right_order) {
  constexpr size_t kData = 31;  // words after the version
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    std::atomic_ref<uint64_t> version(words[0]);
    for (uint64_t v = 0; !stop.load(std::memory_order_relaxed); v += 2) {
      version.store(v + 1);
      for (size_t i = 1; i <= kData; ++i) std::atomic_ref<uint64_t>(words[i]).store(v / 2 + 1);
      version.store(v + 2);
      // Every 4th version stays a few microseconds, so that readers also see stable windows where
      // the writer outruns them (under TSan the right order accepted nothing in 300 ms without it).
      if ((v / 2) % 4 == 3) {
        const auto hold = std::chrono::steady_clock::now() + 3us;
        while (std::chrono::steady_clock::now() < hold) {
        }
      }
    }
  });
  SeqlockCounts n;
  uint64_t before = 0, after = 0, data[kData];
  // The right order runs 300 ms and then until it accepted a copy; the wrong order until it
  // accepted a torn copy (a few per 500 copies here); both at most 10 s.
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const auto elapsed = std::chrono::steady_clock::now() - start;
    if (elapsed > 10s) break;
    if (right_order && elapsed > 300ms && n.accepted > 0) break;
    if (!right_order && n.torn_accepted > 0) break;
    const ReadSegment right[] = {{0, &before, 8}, {8, data, kData * 8}, {0, &after, 8}};
    const ReadSegment wrong[] = {{0, &before, 8}, {0, &after, 8}, {8, data, kData * 8}};
    std::optional<Status> done = ctx.read_ordered_now(peer, key, right_order ? right : wrong);
    if (!done || !done->ok()) continue;
    if (before != after || before % 2 != 0) continue;
    ++n.accepted;
    for (uint64_t w : data) {
      if (w != before / 2) {
        ++n.torn_accepted;
        break;
      }
    }
  }
  stop = true;
  writer.join();
  return n;
}

TEST_P(FabricShmReads, SeqlockOverOrderedReadsNeverAcceptsATornCopy) {
  auto direct = DirectContext();
  if (!direct) GTEST_SKIP() << skip_reason_;
  ctx_ = std::move(direct);
  std::fill(buf_.begin(), buf_.end(), 0);
  uint64_t probe = 0;
  ASSERT_TRUE(Read(0, &probe, 8).ok());  // the key lookup
  const SeqlockCounts right = RunSeqlockReaders(*ctx_, peer_, region_.key, buf_.data(), true);
  const SeqlockCounts wrong = RunSeqlockReaders(*ctx_, peer_, region_.key, buf_.data(), false);
  std::cout << "version, data, version: " << right.accepted << " accepted, " << right.torn_accepted
            << " torn; versions before the data: " << wrong.accepted << " accepted, "
            << wrong.torn_accepted << " torn\n";
  EXPECT_GT(right.accepted, 0u);
  EXPECT_EQ(right.torn_accepted, 0u) << "an ordered seqlock read accepted a torn copy";
  EXPECT_GT(wrong.torn_accepted, 0u) << "reading the versions in the wrong order was not caught";
}

INSTANTIATE_TEST_SUITE_P(Providers, FabricShmReads,
                         ::testing::Values(Param{"shm", "shm", false},
                                           Param{"shm_mr_local", "shm", true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace farmem::fabric
