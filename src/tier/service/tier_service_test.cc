// End-to-end tests of the tier service and TieredClient on native TCP and libfabric shm: unaligned
// round trips across pages and units, data equal to the pattern / zeros / 0xff, cold pages by RPC,
// every mode of the ladder, bad ranges and malformed RPCs, one-sided writes refused, and farmemd's
// composition (flags, STAT). Test threads only; the server runs in-process
// (tier_service_test_util.h).
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/server.h"
#include "farmem/tier.h"
#include "tier/format/tier_wire.h"
#include "tier/service/tier_service_test_util.h"

namespace farmem::tier {
namespace {

using testing::Random;
using testing::TierEnv;

constexpr uint64_t kUnit = 16 << 10;

// Writes `image` over the whole region in 256 KiB pieces.
void Fill(TieredClient& c, const std::vector<std::byte>& image) {
  for (size_t at = 0; at < image.size(); at += 256 << 10) {
    const size_t n = std::min<size_t>(256 << 10, image.size() - at);
    ASSERT_TRUE(c.write(at, std::span(image).subspan(at, n)).ok());
  }
}

class TierServiceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TierServiceTest, UnalignedReadsAndWritesRoundTripAcrossPagesAndUnits) {
  auto env = TierEnv::Start(GetParam(), 32, 4);
  ASSERT_TRUE(env->service);
  auto client = env->Connect();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  TieredClient& c = **client;
  EXPECT_EQ(c.info().capacity, 32 * kUnit);
  EXPECT_TRUE(c.info().one_sided);
  EXPECT_TRUE(c.info().bitmap);
  std::mt19937_64 rng(42);
  std::vector<std::byte> image = Random(rng, 32 * kUnit);
  Fill(c, image);
  // Units 0, 1, 5 and 6 resident (two resident runs), the rest cold; pull the bitmap.
  for (uint32_t u : {0u, 1u, 5u, 6u}) ASSERT_TRUE(env->service->store().Promote(u).ok());
  ASSERT_TRUE(c.refresh().ok());
  for (int i = 0; i < 300; ++i) {
    const size_t len = i % 10 == 0 ? 1 + rng() % (3 * kUnit) : 1 + rng() % 9000;
    const uint64_t off = rng() % (image.size() - len + 1);
    if (i % 3 == 0) {
      std::vector<std::byte> data = Random(rng, len);
      ASSERT_TRUE(c.write(off, data).ok());
      std::memcpy(image.data() + off, data.data(), len);
    }
    std::vector<std::byte> out(len);
    Status st = c.read(off, out);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(0, std::memcmp(out.data(), image.data() + off, len)) << "read " << off << " +" << len;
  }
  // The whole 512 KiB region in one call, then a batch of 64 reads in flight at once.
  std::vector<std::byte> all(image.size());
  ASSERT_TRUE(c.read(0, all).ok());
  EXPECT_EQ(all, image);
  std::vector<std::vector<std::byte>> bufs(64);
  std::vector<TierReadOp> ops(64);
  for (size_t i = 0; i < ops.size(); ++i) {
    const size_t len = 1 + rng() % 20000;
    bufs[i].resize(len);
    ops[i].offset = rng() % (image.size() - len + 1);
    ops[i].out = bufs[i];
  }
  ASSERT_TRUE(c.read_batch(ops).ok());
  for (size_t i = 0; i < ops.size(); ++i) {
    ASSERT_TRUE(ops[i].status.ok());
    ASSERT_EQ(0, std::memcmp(bufs[i].data(), image.data() + ops[i].offset, bufs[i].size()));
  }
  const TieredClientStats s = c.stats();
  EXPECT_GT(s.one_sided_hits, 0u);
  EXPECT_GT(s.bitmap_skips, 0u);
  EXPECT_GT(s.rpc_reads, 0u);
  EXPECT_EQ(s.pattern_misses, 0u);  // the bitmap was current: no cold page was copied
}

TEST_P(TierServiceTest, OneMiBCallsAtUnalignedOffsetsRoundTripWithWriteBatches) {
  auto env = TierEnv::Start(GetParam(), 48, 3, TierMode::kFull, 60000, 64);  // 3 MiB, 192 KiB DRAM
  ASSERT_TRUE(env->service);
  auto client = env->Connect();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  TieredClient& c = **client;
  std::mt19937_64 rng(7);
  std::vector<std::byte> image = Random(rng, 3 << 20);
  std::vector<TierWriteOp> ops;
  for (size_t at = 0; at < image.size(); at += 1 << 20) {
    ops.push_back({at, std::span(image).subspan(at, 1 << 20), {}});
  }
  ASSERT_TRUE(c.write_batch(ops).ok());
  for (uint32_t u : {3u, 17u, 18u}) ASSERT_TRUE(env->service->store().Promote(u).ok());
  ASSERT_TRUE(c.refresh().ok());
  for (uint64_t off : {uint64_t{1}, uint64_t{4095}, uint64_t{200000}, uint64_t{(2 << 20) - 3}}) {
    std::vector<std::byte> out(TieredClient::kMaxIoBytes);
    ASSERT_TRUE(c.read(off, out).ok());
    ASSERT_EQ(0, std::memcmp(out.data(), image.data() + off, out.size())) << off;
  }
  std::vector<std::byte> big(TieredClient::kMaxIoBytes + 1);
  EXPECT_EQ(c.read(0, big).code(), Code::kInvalidArgument);
}

TEST_P(TierServiceTest, PatternZerosAndOnesReadBackExactly) {
  auto env = TierEnv::Start(GetParam(), 16, 4);
  ASSERT_TRUE(env->service);
  auto client = env->Connect();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  TieredClient& c = **client;
  const uint64_t magic = env->service->store().magic_word();
  // Unit 0 resident: page 0 all pattern words, page 1 zeros, page 2 0xff, page 3 one pattern
  // word among other data and the pattern's bytes at an unaligned offset (not a word).
  std::vector<std::byte> image(kUnit, std::byte{0x5a});
  for (size_t i = 0; i < 4096; i += 8) std::memcpy(image.data() + i, &magic, 8);
  std::memset(image.data() + 4096, 0, 4096);
  std::memset(image.data() + 8192, 0xff, 4096);
  std::memcpy(image.data() + 12288 + 256, &magic, 8);
  std::memcpy(image.data() + 12288 + 1003, &magic, 8);
  ASSERT_TRUE(c.write(0, image).ok());
  ASSERT_TRUE(env->service->store().Promote(0).ok());
  ASSERT_TRUE(c.refresh().ok());
  std::vector<std::byte> out(kUnit);
  ASSERT_TRUE(c.read(0, out).ok());
  EXPECT_EQ(out, image);
  for (uint64_t off :
       {uint64_t{5}, uint64_t{4000}, uint64_t{12288 + 255}, uint64_t{12288 + 1000}}) {
    std::vector<std::byte> part(300);
    ASSERT_TRUE(c.read(off, part).ok());
    EXPECT_EQ(0, std::memcmp(part.data(), image.data() + off, part.size())) << off;
  }
  const TieredClientStats s = c.stats();
  // Pages 0 and 3 hold pattern words: false positives, one RPC each read, right bytes.
  EXPECT_GE(s.false_positives, 2u);
  EXPECT_EQ(s.false_positives, s.pattern_misses);
  // The same data cold (unit demoted) comes back from the file.
  ASSERT_TRUE(env->service->store().Demote(0).ok());
  ASSERT_TRUE(c.read(0, out).ok());
  EXPECT_EQ(out, image);
}

TEST_P(TierServiceTest, ColdPagesAreFetchedByRpcInEveryMode) {
  for (TierMode mode : {TierMode::kRpc, TierMode::kRpcDirect, TierMode::kTiering,
                        TierMode::kHotspot, TierMode::kFull}) {
    SCOPED_TRACE(TierModeName(mode));
    auto env = TierEnv::Start(GetParam(), 16, 2, mode);
    ASSERT_TRUE(env->service);
    auto client = env->Connect();
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    TieredClient& c = **client;
    EXPECT_EQ(c.info().mode, TierModeName(mode));
    const bool one_sided = mode >= TierMode::kTiering;
    EXPECT_EQ(c.info().one_sided, one_sided);
    EXPECT_EQ(c.info().bitmap, mode == TierMode::kFull);
    std::mt19937_64 rng(static_cast<int>(mode));
    std::vector<std::byte> image = Random(rng, 16 * kUnit);
    Fill(c, image);
    // tiering filled units 0 and 1 at start; elsewhere everything is cold.
    ASSERT_TRUE(c.refresh().ok());
    const TieredClientStats before = c.stats();
    std::vector<std::byte> out(5 * kUnit + 77);
    ASSERT_TRUE(c.read(kUnit - 33, out).ok());
    EXPECT_EQ(0, std::memcmp(out.data(), image.data() + kUnit - 33, out.size()));
    const TieredClientStats s = c.stats();
    EXPECT_EQ(s.rpc_reads - before.rpc_reads, 1u);  // ONE sparse fetch for all missing pages
    if (mode == TierMode::kTiering || mode == TierMode::kHotspot) {
      EXPECT_GT(s.pattern_misses, before.pattern_misses);  // cold pages detected by the pattern
    }
    if (mode == TierMode::kFull) {
      EXPECT_GT(s.bitmap_skips, before.bitmap_skips);
    }
    if (!one_sided) {
      EXPECT_EQ(s.one_sided_reads, 0u);
    }
    if (mode == TierMode::kTiering) {
      EXPECT_GT(s.one_sided_hits, before.one_sided_hits);
    }
    if (mode == TierMode::kHotspot || mode == TierMode::kFull) {
      // Counters pushed, one period: the units read become resident.
      ASSERT_TRUE(c.refresh().ok());
      ASSERT_TRUE(env->service->RunPeriodNow().ok());
      EXPECT_GT(env->service->store().Stats().promotions, 0u);
    }
  }
}

// --tier-fill-free reaches the store: an idle period of a server whose budget holds the region
// brings every unit in (and the client then reads all of it one-sidedly); off, nothing moves
// until somebody counts a unit.
TEST_P(TierServiceTest, IdlePeriodFillsFreeFramesUnlessTurnedOff) {
  for (bool fill : {true, false}) {
    SCOPED_TRACE(fill ? "fill on" : "fill off");
    auto env = TierEnv::Start(GetParam(), 8, 8, TierMode::kFull, 60000, 16,
                              [fill](ServerConfig& c) { c.tier.fill_free_frames = fill; });
    ASSERT_TRUE(env->service);
    ASSERT_TRUE(env->service->RunPeriodNow().ok());
    const nlohmann::json st = env->service->Stats();
    EXPECT_EQ(st["config"]["fill_free_frames"].get<bool>(), fill);
    EXPECT_EQ(st["resident_units"].get<uint64_t>(), fill ? 8u : 0u) << st.dump();
    EXPECT_EQ(st["fills"].get<uint64_t>(), fill ? 8u : 0u);
    auto client = env->Connect();
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    ASSERT_TRUE((*client)->refresh().ok());
    std::vector<std::byte> out(8 * kUnit);
    ASSERT_TRUE((*client)->read(0, out).ok());
    EXPECT_EQ((*client)->stats().rpc_reads, fill ? 0u : 1u) << "filled units were fetched by RPC";
  }
}

TEST_P(TierServiceTest, BadRangesAndMalformedRequestsAreClearErrors) {
  auto env = TierEnv::Start(GetParam(), 16, 2);
  ASSERT_TRUE(env->service);
  auto client = env->Connect();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  TieredClient& c = **client;
  const uint64_t cap = c.info().capacity;
  std::vector<std::byte> buf(100);
  EXPECT_EQ(c.read(0, std::span(buf).first(0)).code(), Code::kInvalidArgument);
  EXPECT_EQ(c.read(cap - 50, buf).code(), Code::kOutOfRange);
  EXPECT_EQ(c.read(std::numeric_limits<uint64_t>::max() - 10, buf).code(), Code::kOutOfRange);
  EXPECT_EQ(c.write(cap, buf).code(), Code::kOutOfRange);
  EXPECT_EQ(c.write(0, std::span<const std::byte>()).code(), Code::kInvalidArgument);
  Status st = c.read(cap - 50, buf);
  EXPECT_NE(st.message().find("outside the region"), std::string_view::npos) << st.ToString();

  // Raw requests the client would never send: the server refuses them with a clear code.
  auto raw = env->Raw();
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  auto call = [&](uint16_t op, const std::vector<std::byte>& req) { return raw->Call(op, req); };
  EXPECT_EQ(call(kOpTierRead, EncodeTierReadRequest(0, 10, std::vector<uint64_t>{1, 0})).code(),
            Code::kProtocol);
  EXPECT_EQ(call(kOpTierRead, EncodeTierReadRequest(0, 10, std::vector<uint64_t>{2})).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(call(kOpTierRead, EncodeTierReadRequest(cap, 10, std::vector<uint64_t>{1})).code(),
            Code::kOutOfRange);
  auto w = EncodeTierWriteRequest(0, buf);
  w.pop_back();
  EXPECT_EQ(call(kOpTierWrite, w).code(), Code::kProtocol);
  EXPECT_EQ(
      call(kOpTierCounters, EncodeTierCounters(std::vector<TierCounterEntry>{{16, 1}})).code(),
      Code::kOutOfRange);
  EXPECT_EQ(call(kOpTierInfo, std::vector<std::byte>(3)).code(), Code::kProtocol);
  // One-sided writes to the read-only regions are refused.
  ASSERT_NE(raw->data_key, 0u);
  ASSERT_NE(raw->bitmap_key, 0u);
  Scheduler& s = *raw->sched;
  uint64_t word = 1;
  for (RegionKey key : {raw->data_key, raw->bitmap_key}) {
    Status ws = s.block_on(s.write(RemoteRef{raw->peer.id, key, 0}, &word, 8, true));
    EXPECT_EQ(ws.code(), Code::kPermissionDenied) << ws.ToString();
  }
  // The server still serves.
  EXPECT_TRUE(c.read(0, buf).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, TierServiceTest, ::testing::Values("tcp", "fabric:shm"),
                         testing::BackendName);

// ---- farmemd composition: flags, validation, STAT ---------------------------------------------

TEST(TierServer, RefusesBadFlagsWithAMessage) {
  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto bad = [&](auto change) {
    ServerConfig sc = testing::TierServerConfig("tcp", dir.File("t.data"), 16, 2);
    change(sc);
    return ValidateServerConfig(sc);
  };
  Status st = bad([](ServerConfig& c) { c.tier.unit_kib = 48; });
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--tier-unit-kib"), std::string_view::npos) << st.ToString();
  st = bad([](ServerConfig& c) { c.tier.capacity_bytes = 0; });
  EXPECT_NE(st.message().find("--tier-capacity-mib"), std::string_view::npos) << st.ToString();
  st = bad([](ServerConfig& c) { c.tier.dram_bytes = 1000; });
  EXPECT_NE(st.message().find("--tier-dram-mib"), std::string_view::npos) << st.ToString();
  st = bad([](ServerConfig& c) { c.tier.fill_percent = 0; });
  EXPECT_NE(st.message().find("--tier-fill-pct"), std::string_view::npos) << st.ToString();
  st = bad([](ServerConfig& c) { c.tier.period_ms = 0; });
  EXPECT_NE(st.message().find("--tier-period-ms"), std::string_view::npos) << st.ToString();
  st = bad([](ServerConfig& c) { c.tier.heat_keep_percent = 100; });
  EXPECT_NE(st.message().find("--tier-heat-keep-pct"), std::string_view::npos) << st.ToString();
  st = bad([](ServerConfig& c) { c.tier.hysteresis_percent = 1001; });
  EXPECT_NE(st.message().find("--tier-hysteresis-pct"), std::string_view::npos) << st.ToString();
  // Listed by name without a file.
  ServerConfig sc = testing::TierServerConfig("tcp", "", 16, 2);
  sc.services = {"tier"};
  auto s = MemoryServer::Create(sc);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("--tier-file"), std::string_view::npos)
      << s.status().ToString();
  // A tmpfs backing file (the SSD tier would be DRAM).
  sc = testing::TierServerConfig("tcp", "/dev/shm/farmem-tier-test.data", 16, 2);
  s = MemoryServer::Create(sc);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().ToString().find("tmpfs"), std::string::npos) << s.status().ToString();
}

TEST(TierServer, RunsOnlyWithATierFileAndReportsStat) {
  ServerConfig plain;
  plain.node.transport.cluster_token = "t";
  auto s0 = MemoryServer::Create(plain);
  ASSERT_TRUE(s0.ok()) << s0.status().ToString();
  for (const std::string& n : (*s0)->services()) EXPECT_NE(n, "tier");
  s0->reset();

  testing::TempDir dir;
  ASSERT_TRUE(dir.ok());
  ServerConfig sc = testing::TierServerConfig("tcp", dir.File("t.data"), 16, 2);
  auto s = MemoryServer::Create(sc);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE((*s)->start().ok());
  bool has = false;
  for (const std::string& n : (*s)->services()) has |= n == "tier";
  EXPECT_TRUE(has);
  auto doc = nlohmann::json::parse((*s)->stats_json());
  ASSERT_TRUE(doc.contains("tier")) << doc.dump();
  const auto& t = doc["tier"];
  for (const char* key :
       {"resident_units", "budget_units", "residency", "promotions", "fills", "demotions",
        "writebacks", "io_read_bytes", "io_write_bytes", "reads_dram", "reads_file"}) {
    EXPECT_TRUE(t.contains(key)) << key;
  }
  EXPECT_EQ(t["budget_units"].get<uint64_t>(), 2u);
  EXPECT_EQ(t["config"]["mode"].get<std::string>(), "full");
  const std::string metrics = (*s)->metrics_text();
  EXPECT_NE(metrics.find("farmem_tier_promotions_total"), std::string::npos);
  EXPECT_NE(metrics.find("farmem_tier_fills_total"), std::string::npos);
  (*s)->stop();
}

}  // namespace
}  // namespace farmem::tier
