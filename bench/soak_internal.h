// Pure pieces of `farmem bench soak`, unit-tested in src/cli/soak_bench_test.cc (cli_tests): the
// legitimate clients' content pattern, the hostile clients' malformed frames, leak counts and the
// session TTL read from a STAT document, and the judging of the four targets. No threads here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_json.h"

namespace farmem::bench::soak {

// ---- Content of the legitimate clients' objects and raw ranges ------------------------------
// [u64 id][u64 seq][f(id, seq, i) ...]: `id` names the allocation (unique within the run), `seq`
// counts the writes to it. A read must return exactly the bytes of the last acknowledged write.
// Shorter buffers hold a prefix of the same bytes.
void FillPattern(uint64_t id, uint64_t seq, std::span<std::byte> out);
bool PatternMatches(uint64_t id, uint64_t seq, std::span<const std::byte> got);
// What `got` holds, for error messages: "id 12 seq 3", "id 12 seq 3 (corrupt at byte 17)", ...
std::string DescribeContent(std::span<const std::byte> got, uint64_t expect_id,
                            uint64_t expect_seq);

// ---- Malformed frames of the garbage clients --------------------------------------------------
enum class Port : uint8_t { kBootstrap, kData };
inline constexpr int kGarbageVariants = 6;
// Variant v (0..kGarbageVariants-1) for `port`, randomised by `seed`. Every one of them must be
// refused by the server: bootstrap ones are not a well-formed HELLO of this version with the right
// token; data ones are not a hello frame with the cluster token (`token` is the real one: the
// frames use anything but it).
std::vector<uint8_t> GarbageFrame(Port port, int variant, uint64_t seed, const std::string& token);
const char* GarbageName(Port port, int variant);

// ---- STAT -------------------------------------------------------------------------------------
struct StatCounts {
  int64_t live_objects = -1;     // objects.live_objects (-1: no objects section)
  int64_t raw_allocations = -1;  // memory.allocations (-1: no memory section)
  int64_t budget_bytes = -1;     // memory.budget_bytes: the daemon's memory budget (--memory-mib)
  bool has_sessions = false;     // a "sessions" section exists (client sessions, once merged)
  // The client session TTL the sessions section states (a key holding "ttl": *_ms, *_seconds or
  // *_s), if any.
  std::optional<double> session_ttl_seconds;
  nlohmann::json sessions;  // the section itself (null when absent)
};
StatCounts ParseStatCounts(const nlohmann::json& stat);

// How long the leak check waits for counts to fall: the session TTL (STAT's, else the assumed
// default) plus a margin.
inline constexpr double kAssumedSessionTtlSeconds = 10.0;
inline constexpr double kLeakWaitMarginSeconds = 3.0;
double LeakWaitSeconds(const StatCounts& c);

// ---- Targets ----------------------------------------------------------------------------------
// Legitimate throughput with hostile clients >= min_ratio x without, judged on the median of the
// per-round ratios (subject round i / baseline round i).
TargetRecord JudgeThroughput(std::span<const double> subject_ops, std::span<const double> base_ops,
                             double min_ratio);
// Peak RSS with hostile clients <= max_ratio x the budget. Budget = farmemd's memory budget
// (STAT memory.budget_bytes, --memory-mib: what the operator gave the daemon; the "budget"
// and the number `farmem stat` shows). Judged on the whole-run peak (a memory limit is about the
// worst moment); the per-round ratios (round peak / budget) are the spread. The growth over the
// baseline rounds' peak (legitimate load only) is reported beside it, not judged.
TargetRecord JudgeRss(std::span<const double> subject_peaks, std::span<const double> base_peaks,
                      double budget_bytes, double max_ratio);
// A count that must be 0 (leaked allocations, wrong results).
TargetRecord JudgeZero(std::string name, double value, std::string detail);

}  // namespace farmem::bench::soak
