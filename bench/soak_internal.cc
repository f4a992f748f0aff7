// Pure pieces of `farmem bench soak` (see soak_internal.h): content pattern, malformed frames,
// STAT parsing and target judging. Called from any thread; no shared state.
#include "soak_internal.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "node/bootstrap.h"
#include "node/bootstrap_wire.h"
#include "transport/tcp/frame_codec.h"
#include "transport/tcp/wire.h"

namespace farmem::bench::soak {

namespace {

uint8_t PatternByte(uint64_t id, uint64_t seq, size_t i) {
  uint64_t x = id * 0x9e3779b97f4a7c15ull + seq * 0xbf58476d1ce4e5b9ull + i;
  x ^= x >> 29;
  x *= 0x94d049bb133111ebull;
  return static_cast<uint8_t>(x >> 56);
}

constexpr size_t kHeaderBytes = 2 * sizeof(uint64_t);

void PutU64(std::span<std::byte> out, size_t at, uint64_t v) {
  for (size_t k = 0; k < sizeof(v) && at + k < out.size(); ++k)
    out[at + k] = static_cast<std::byte>((v >> (8 * k)) & 0xff);
}

uint64_t GetU64(std::span<const std::byte> in, size_t at) {
  uint64_t v = 0;
  for (size_t k = 0; k < sizeof(v) && at + k < in.size(); ++k)
    v |= static_cast<uint64_t>(in[at + k]) << (8 * k);
  return v;
}

std::vector<uint8_t> Bytes(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

std::vector<uint8_t> BootstrapFrame(uint32_t magic, uint16_t version, uint16_t type,
                                    uint32_t body_length, const std::string& body) {
  node::FrameHeader h;
  h.magic = magic;
  h.version = version;
  h.type = type;
  h.body_length = body_length;
  auto hdr = node::EncodeHeader(h);
  // Sized once and filled with memcpy: gcc 12 warns (-Warray-bounds) on vector::insert here.
  std::vector<uint8_t> out(hdr.size() + body.size());
  std::memcpy(out.data(), hdr.data(), hdr.size());
  if (!body.empty()) std::memcpy(out.data() + hdr.size(), body.data(), body.size());
  return out;
}

std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t min, size_t max) {
  std::uniform_int_distribution<size_t> len(min, max);
  std::vector<uint8_t> out(len(rng));
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

std::string WrongToken(const std::string& token, std::mt19937_64& rng) {
  std::string t = fmt::format("not-the-token-{:x}", rng());
  if (t == token) t += "x";
  return t;
}

}  // namespace

void FillPattern(uint64_t id, uint64_t seq, std::span<std::byte> out) {
  PutU64(out, 0, id);
  PutU64(out, sizeof(uint64_t), seq);
  for (size_t i = kHeaderBytes; i < out.size(); ++i)
    out[i] = static_cast<std::byte>(PatternByte(id, seq, i));
}

bool PatternMatches(uint64_t id, uint64_t seq, std::span<const std::byte> got) {
  if (got.size() >= sizeof(uint64_t) && GetU64(got, 0) != id) return false;
  if (got.size() >= kHeaderBytes && GetU64(got, sizeof(uint64_t)) != seq) return false;
  // A prefix shorter than the header: compare it byte by byte with the encoded header.
  for (size_t i = 0; i < std::min(got.size(), kHeaderBytes); ++i) {
    const uint64_t v = i < sizeof(uint64_t) ? id : seq;
    const size_t shift = 8 * (i % sizeof(uint64_t));
    if (static_cast<uint8_t>(got[i]) != static_cast<uint8_t>((v >> shift) & 0xff)) return false;
  }
  for (size_t i = kHeaderBytes; i < got.size(); ++i)
    if (static_cast<uint8_t>(got[i]) != PatternByte(id, seq, i)) return false;
  return true;
}

std::string DescribeContent(std::span<const std::byte> got, uint64_t expect_id,
                            uint64_t expect_seq) {
  if (got.size() < kHeaderBytes) return fmt::format("{} bytes only", got.size());
  const uint64_t id = GetU64(got, 0), seq = GetU64(got, sizeof(uint64_t));
  std::string s =
      fmt::format("holds id {} seq {} (expected id {} seq {})", id, seq, expect_id, expect_seq);
  for (size_t i = kHeaderBytes; i < got.size(); ++i) {
    if (static_cast<uint8_t>(got[i]) != PatternByte(id, seq, i)) {
      s += fmt::format(", corrupt from byte {} of {}", i, got.size());
      break;
    }
  }
  return s;
}

std::vector<uint8_t> GarbageFrame(Port port, int variant, uint64_t seed, const std::string& token) {
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(variant) + 1);
  if (port == Port::kBootstrap) {
    switch (variant) {
      case 0: {  // random bytes: the magic never matches
        auto out = RandomBytes(rng, 16, 2048);
        if (out[0] == static_cast<uint8_t>(node::kBootstrapMagic & 0xff)) out[0] ^= 0xff;
        return out;
      }
      case 1:  // a WELCOME sent to the server (wrong direction)
        return BootstrapFrame(node::kBootstrapMagic, node::kBootstrapVersion,
                              static_cast<uint16_t>(node::FrameType::kWelcome), 2, "{}");
      case 2:  // a HELLO announcing a body far above what the listener buffers
        return BootstrapFrame(node::kBootstrapMagic, node::kBootstrapVersion,
                              static_cast<uint16_t>(node::FrameType::kHello),
                              node::kMaxBootstrapBody, "{\"token\":");
      case 3: {  // a HELLO whose body is not JSON
        std::string body = "{\"token\": \"";
        for (auto b : RandomBytes(rng, 8, 256)) body.push_back(static_cast<char>(b | 0x80));
        return BootstrapFrame(node::kBootstrapMagic, node::kBootstrapVersion,
                              static_cast<uint16_t>(node::FrameType::kHello),
                              static_cast<uint32_t>(body.size()), body);
      }
      case 4: {  // a well-formed HELLO of a protocol version nobody speaks
        const std::string body = node::EncodeHello({token, "soak-garbage", "127.0.0.1:1", "tcp"});
        return BootstrapFrame(node::kBootstrapMagic, 999,
                              static_cast<uint16_t>(node::FrameType::kHello),
                              static_cast<uint32_t>(body.size()), body);
      }
      default: {  // a well-formed HELLO with a wrong cluster token
        const std::string body =
            node::EncodeHello({WrongToken(token, rng), "soak-garbage", "127.0.0.1:1", "tcp"});
        return BootstrapFrame(node::kBootstrapMagic, node::kBootstrapVersion,
                              static_cast<uint16_t>(node::FrameType::kHello),
                              static_cast<uint32_t>(body.size()), body);
      }
    }
  }
  namespace w = tcpwire;
  tcpwire::ByteQueue q;
  switch (variant) {
    case 0: {  // random bytes whose first header is never a hello
      auto out = RandomBytes(rng, 16, 2048);
      if (out[4] == static_cast<uint8_t>(w::Opcode::kHello)) out[4] = 0xee;
      return out;
    }
    case 1: {  // an unknown opcode
      w::FrameHeader h{8, 0x77, 0, 0, rng()};
      std::vector<uint8_t> out = Bytes(&h, sizeof(h));
      out.resize(out.size() + 8, 0xab);
      return out;
    }
    case 2: {  // a hello announcing 16 MiB: refused from its header alone
      w::FrameHeader h{w::kMaxFrameBody, static_cast<uint8_t>(w::Opcode::kHello), 0, 0, 0};
      std::vector<uint8_t> out = Bytes(&h, sizeof(h));
      w::HelloBody b{w::kMagic, w::kVersion, 4};
      auto body = Bytes(&b, sizeof(b));
      out.insert(out.end(), body.begin(), body.end());
      return out;
    }
    case 3:  // a hello with a wrong cluster token
      w::EncodeHello(q, WrongToken(token, rng));
      break;
    case 4:  // a READ before any hello
      w::EncodeRead(q, 1, rng(), 0, 4096);
      break;
    default: {  // a hello whose token length exceeds the wire limit
      w::FrameHeader h{static_cast<uint32_t>(sizeof(w::HelloBody) + 300),
                       static_cast<uint8_t>(w::Opcode::kHello), 0, 0, 0};
      std::vector<uint8_t> out = Bytes(&h, sizeof(h));
      w::HelloBody b{w::kMagic, w::kVersion, 300};
      auto body = Bytes(&b, sizeof(b));
      out.insert(out.end(), body.begin(), body.end());
      out.resize(out.size() + 300, 'A');
      return out;
    }
  }
  return Bytes(q.data(), q.size());
}

const char* GarbageName(Port port, int variant) {
  static const char* const kBoot[kGarbageVariants] = {
      "random bytes",        "WELCOME to the server", "1 MiB HELLO body",
      "HELLO body not JSON", "HELLO of version 999",  "HELLO with a wrong token"};
  static const char* const kData[kGarbageVariants] = {
      "random bytes",       "unknown opcode",    "16 MiB hello",
      "hello, wrong token", "READ before hello", "hello token over the wire limit"};
  variant = std::clamp(variant, 0, kGarbageVariants - 1);
  return port == Port::kBootstrap ? kBoot[variant] : kData[variant];
}

namespace {
// A "ttl" key of `j` (an object) converted to seconds by its suffix.
std::optional<double> FindTtl(const nlohmann::json& j, int depth) {
  if (!j.is_object() || depth > 2) return std::nullopt;
  for (const auto& [key, v] : j.items()) {
    if (key.find("ttl") == std::string::npos || !v.is_number()) continue;
    const double x = v.get<double>();
    auto ends = [&](const char* s) {
      const std::string suf(s);
      return key.size() >= suf.size() && key.compare(key.size() - suf.size(), suf.size(), suf) == 0;
    };
    if (ends("_ms")) return x / 1000.0;
    if (ends("_us")) return x / 1e6;
    return x;  // *_seconds, *_s or a bare "ttl": seconds
  }
  for (const auto& [key, v] : j.items())
    if (auto t = FindTtl(v, depth + 1)) return t;
  return std::nullopt;
}
}  // namespace

StatCounts ParseStatCounts(const nlohmann::json& stat) {
  StatCounts c;
  if (!stat.is_object()) return c;
  if (auto o = stat.find("objects"); o != stat.end() && o->is_object()) {
    if (auto l = o->find("live_objects"); l != o->end() && l->is_number())
      c.live_objects = l->get<int64_t>();
  }
  if (auto m = stat.find("memory"); m != stat.end() && m->is_object()) {
    if (auto a = m->find("allocations"); a != m->end() && a->is_number())
      c.raw_allocations = a->get<int64_t>();
    if (auto b = m->find("budget_bytes"); b != m->end() && b->is_number())
      c.budget_bytes = b->get<int64_t>();
  }
  if (auto s = stat.find("sessions"); s != stat.end() && s->is_object()) {
    c.has_sessions = true;
    c.sessions = *s;
    c.session_ttl_seconds = FindTtl(*s, 0);
    if (c.session_ttl_seconds && !(*c.session_ttl_seconds > 0)) c.session_ttl_seconds.reset();
  }
  return c;
}

double LeakWaitSeconds(const StatCounts& c) {
  return c.session_ttl_seconds.value_or(kAssumedSessionTtlSeconds) + kLeakWaitMarginSeconds;
}

TargetRecord JudgeThroughput(std::span<const double> subject_ops, std::span<const double> base_ops,
                             double min_ratio) {
  TargetRecord t;
  t.name = "legitimate throughput with hostile clients vs without (ops/s)";
  t.value = MedianOf({subject_ops.begin(), subject_ops.end()});
  t.baseline = MedianOf({base_ops.begin(), base_ops.end()});
  t.limit = fmt::format(">= {}x baseline", min_ratio);
  const RoundRatios r = PerRoundRatios(subject_ops, base_ops);
  t.SetRounds(r);
  if (!r.ratios.empty())
    t.result = r.median >= min_ratio ? TargetResult::kPass : TargetResult::kMiss;
  t.detail = "median of per-round ratios (hostile round i / baseline round i)";
  return t;
}

TargetRecord JudgeRss(std::span<const double> subject_peaks, std::span<const double> base_peaks,
                      double budget_bytes, double max_ratio) {
  TargetRecord t;
  t.name = "farmemd peak RSS with hostile clients vs its memory budget (MiB)";
  auto peak = [](std::span<const double> v) {
    double m = std::nan("");
    for (double x : v)
      if (std::isfinite(x) && !(x <= m)) m = x;
    return m;
  };
  constexpr double kMib = 1024.0 * 1024.0;
  t.value = peak(subject_peaks) / kMib;
  t.baseline = budget_bytes > 0 ? budget_bytes / kMib : std::nan("");
  t.limit = fmt::format("<= {}x budget", max_ratio);
  std::vector<double> budgets(subject_peaks.size(), budget_bytes > 0 ? budget_bytes : std::nan(""));
  const RoundRatios r = PerRoundRatios(subject_peaks, budgets);
  t.SetRounds(r);
  t.ratio = Ratio(t.value, t.baseline);
  if (t.ratio) t.result = *t.ratio <= max_ratio ? TargetResult::kPass : TargetResult::kMiss;
  const double base_peak = peak(base_peaks) / kMib;
  t.extra["baseline_rounds_peak_mib"] =
      std::isfinite(base_peak) ? nlohmann::json(base_peak) : nlohmann::json(nullptr);
  t.extra["growth_over_baseline_rounds_mib"] = std::isfinite(base_peak) && std::isfinite(t.value)
                                                   ? nlohmann::json(t.value - base_peak)
                                                   : nlohmann::json(nullptr);
  t.detail =
      "budget = farmemd's memory budget (STAT memory.budget_bytes, --memory-mib, default); "
      "value = whole-run peak RSS with hostile clients; ratio_min/max = per-round peak / budget; "
      "baseline_rounds_peak_mib / growth_over_baseline_rounds_mib: the same daemon under "
      "legitimate load only, for the hostile clients' own cost (not judged)";
  return t;
}

TargetRecord JudgeZero(std::string name, double value, std::string detail) {
  TargetRecord t;
  t.name = std::move(name);
  t.value = value;
  t.baseline = 0;
  t.limit = "== 0";
  t.detail = std::move(detail);
  if (std::isfinite(value)) t.result = value == 0 ? TargetResult::kPass : TargetResult::kMiss;
  return t;
}

}  // namespace farmem::bench::soak
