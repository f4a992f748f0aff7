// Bad input a TieredClient and the tier service must turn into clear statuses, never a crash, a
// hang or a change: bad ranges inside batches, raw requests at the edges of the region, and
// one-sided writes, atomics and accesses past the end of the read-only regions. Test threads only;
// the server runs in-process (tier_service_test_util.h).
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "farmem/tier.h"
#include "tier/format/tier_wire.h"
#include "tier/service/tier_service_test_util.h"

namespace farmem::tier {
namespace {

using testing::Random;
using testing::TierEnv;

class TierBadInput : public ::testing::TestWithParam<std::string> {};

TEST_P(TierBadInput, BadOpsOfABatchFailAloneAndTheOthersComplete) {
  auto env = TierEnv::Start(GetParam(), 16, 2);
  ASSERT_TRUE(env->service);
  auto client = env->Connect();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  TieredClient& c = **client;
  const uint64_t cap = c.info().capacity;
  std::mt19937_64 rng(3);
  const auto good = Random(rng, 3000);
  ASSERT_TRUE(c.write(777, good).ok());

  std::vector<std::byte> a(3000), b(100), big(TieredClient::kMaxIoBytes + 1), d(3000);
  std::vector<TierReadOp> ops{{777, a, {}},
                              {cap - 50, b, {}},
                              {std::numeric_limits<uint64_t>::max() - 10, b, {}},
                              {0, std::span(b).first(0), {}},
                              {0, big, {}},
                              {777, d, {}}};
  const Status st = c.read_batch(ops);
  EXPECT_FALSE(st.ok());
  EXPECT_TRUE(ops[0].status.ok()) << ops[0].status.ToString();
  EXPECT_EQ(ops[1].status.code(), Code::kOutOfRange) << ops[1].status.ToString();
  EXPECT_EQ(ops[2].status.code(), Code::kOutOfRange) << ops[2].status.ToString();
  EXPECT_EQ(ops[3].status.code(), Code::kInvalidArgument) << ops[3].status.ToString();
  EXPECT_EQ(ops[4].status.code(), Code::kInvalidArgument) << ops[4].status.ToString();
  EXPECT_TRUE(ops[5].status.ok()) << ops[5].status.ToString();
  EXPECT_EQ(a, good);
  EXPECT_EQ(d, good);

  std::vector<TierWriteOp> wops{{cap - 10, good, {}},
                                {std::numeric_limits<uint64_t>::max() - 100, good, {}},
                                {5000, good, {}}};
  EXPECT_FALSE(c.write_batch(wops).ok());
  EXPECT_EQ(wops[0].status.code(), Code::kOutOfRange) << wops[0].status.ToString();
  EXPECT_EQ(wops[1].status.code(), Code::kOutOfRange) << wops[1].status.ToString();
  EXPECT_TRUE(wops[2].status.ok()) << wops[2].status.ToString();
  std::vector<std::byte> back(good.size());
  ASSERT_TRUE(c.read(5000, back).ok());
  EXPECT_EQ(back, good);
}

TEST_P(TierBadInput, RawRequestsAtTheEdgesOfTheRegionAreRefusedByTheServer) {
  auto env = TierEnv::Start(GetParam(), 16, 2);
  ASSERT_TRUE(env->service);
  const uint64_t cap = env->service->store().geometry().capacity;
  auto raw = env->Raw();
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  auto call = [&](uint16_t op, const std::vector<std::byte>& req) { return raw->Call(op, req); };
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  std::vector<std::byte> data(100);
  const std::vector<uint64_t> one{1}, two{3};
  struct Case {
    const char* what;
    uint16_t op;
    std::vector<std::byte> req;
    Code code;
  };
  const std::vector<Case> cases = {
      {"read ending past the region", kOpTierRead, EncodeTierReadRequest(cap - 4, 8, two),
       Code::kOutOfRange},
      {"read whose end overflows", kOpTierRead, EncodeTierReadRequest(max - 4, 8, two),
       Code::kOutOfRange},
      {"read of 0 bytes", kOpTierRead, EncodeTierReadRequest(0, 0, {}), Code::kInvalidArgument},
      {"read above the limit", kOpTierRead,
       EncodeTierReadRequest(0, (2 << 20), std::vector<uint64_t>(8, ~0ull)),
       Code::kInvalidArgument},
      {"mask bit past the range", kOpTierRead, EncodeTierReadRequest(0, 10, two),
       Code::kInvalidArgument},
      {"mask with a word too many", kOpTierRead,
       EncodeTierReadRequest(0, 10, std::vector<uint64_t>{1, 0}), Code::kProtocol},
      {"mask with no word", kOpTierRead, EncodeTierReadRequest(0, 10, {}), Code::kProtocol},
      {"write ending past the region", kOpTierWrite, EncodeTierWriteRequest(cap - 50, data),
       Code::kOutOfRange},
      {"write whose end overflows", kOpTierWrite, EncodeTierWriteRequest(max - 50, data),
       Code::kOutOfRange},
      {"write of 0 bytes", kOpTierWrite, EncodeTierWriteRequest(0, {}), Code::kInvalidArgument},
  };
  for (const Case& k : cases) {
    const Status st = call(k.op, k.req);
    EXPECT_EQ(st.code(), k.code) << k.what << ": " << st.ToString();
    EXPECT_FALSE(st.message().empty()) << k.what;
  }
  // A mask head claiming 2^32 - 1 words with none in the body.
  auto huge = EncodeTierReadRequest(0, 10, one);
  huge.resize(sizeof(TierReadHead));
  const uint32_t words = std::numeric_limits<uint32_t>::max();
  std::memcpy(huge.data() + offsetof(TierReadHead, mask_words), &words, 4);
  EXPECT_EQ(call(kOpTierRead, huge).code(), Code::kProtocol);
  // The server still serves, and nothing was written.
  std::vector<std::byte> zeros(100), got(100);
  auto ok = env->Connect();
  ASSERT_TRUE(ok.ok());
  ASSERT_TRUE((*ok)->read(cap - 100, got).ok());
  EXPECT_EQ(got, zeros);
}

TEST_P(TierBadInput, OneSidedWritesAtomicsAndAccessPastTheEndAreRefused) {
  auto env = TierEnv::Start(GetParam(), 16, 2);
  ASSERT_TRUE(env->service);
  auto client = env->Connect();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  TieredClient& c = **client;
  const uint64_t cap = c.info().capacity;
  ASSERT_TRUE(env->service->store().Promote(0).ok());
  std::vector<std::byte> before(64, std::byte{0x5a});
  ASSERT_TRUE(c.write(0, before).ok());

  auto raw = env->Raw();
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  Scheduler& s = *raw->sched;
  const RegionKey data_key = raw->data_key, bitmap_key = raw->bitmap_key;
  ASSERT_NE(data_key, 0u);
  ASSERT_NE(bitmap_key, 0u);
  const uint64_t bitmap_bytes = env->service->store().bitmap_alloc_bytes();
  uint64_t word = 0x1111111111111111ull;
  for (RegionKey key : {data_key, bitmap_key}) {
    const RemoteRef at{raw->peer.id, key, 0};
    const Status w = s.block_on(s.write(at, &word, 8, true));
    EXPECT_EQ(w.code(), Code::kPermissionDenied) << w.ToString();
    const auto faa = s.block_on(s.fetch_add(at, 1));
    EXPECT_EQ(faa.status().code(), Code::kPermissionDenied) << faa.status().ToString();
    const auto cas = s.block_on(s.compare_swap(at, 0, 1));
    EXPECT_EQ(cas.status().code(), Code::kPermissionDenied) << cas.status().ToString();
  }
  // Reads past the end of either region are refused, not served from whatever follows it.
  std::vector<std::byte> buf(16);
  for (const auto& [key, size] : {std::pair{data_key, cap}, std::pair{bitmap_key, bitmap_bytes}}) {
    const Status r = s.block_on(s.read(RemoteRef{raw->peer.id, key, size - 8}, buf.data(), 16));
    EXPECT_FALSE(r.ok()) << "a one-sided read past the end of region " << key << " succeeded";
    EXPECT_FALSE(r.message().empty());
  }
  // Nothing changed: the unit's bytes and its residency bits.
  std::vector<std::byte> after(64);
  ASSERT_TRUE(c.read(0, after).ok());
  EXPECT_EQ(after, before);
  EXPECT_EQ(env->service->store().bitmap()[0] & 0xf, 0xfu) << "bitmap changed";
}

INSTANTIATE_TEST_SUITE_P(Backends, TierBadInput, ::testing::Values("tcp", "fabric:shm"),
                         testing::BackendName);

}  // namespace
}  // namespace farmem::tier
