// `farmem demo`: a guided tour of the raw memory service — alloc, one-sided write/read, CAS,
// 16 FAAs in flight on coroutines, STAT, free, double free — each step checked and timed. Runs
// against an embedded in-process farmemd, or against running ones given with --connect.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/log.h"
#include "farmem/client.h"
#include "farmem/server.h"

namespace farmem::cli {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Prints one line per step and counts failures.
class StepLog {
 public:
  bool Report(const std::string& step, bool ok, double micros, const std::string& detail) {
    std::printf("  %-22s %-4s %10.1f µs  %s\n", step.c_str(), ok ? "ok" : "FAIL", micros,
                detail.c_str());
    std::fflush(stdout);
    (ok ? passed_ : failed_)++;
    return ok;
  }
  int passed() const { return passed_; }
  int failed() const { return failed_; }

 private:
  int passed_ = 0;
  int failed_ = 0;
};

RemoteRef At(RemoteRef ref, uint64_t delta) {
  ref.offset += delta;
  return ref;
}

struct FaaResult {
  Status status;
  uint64_t old = 0;
};

Task<void> FetchAddOne(Scheduler* sched, RemoteRef ref, FaaResult* out) {
  Result<uint64_t> r = co_await sched->fetch_add(ref, 1);
  out->status = r.status();
  if (r.ok()) out->old = *r;
}

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%#" PRIx64, v);
  return buf;
}

// Runs every step against the farmemd at `address`; returns false if any check failed.
bool RunSteps(Node& node, const std::string& address) {
  constexpr size_t kLen = 4096;
  constexpr size_t kWords = kLen / sizeof(uint64_t);
  StepLog log;

  auto t0 = Clock::now();
  auto client = RawClient::Connect(node, address);
  if (!log.Report("connect", client.ok(), MicrosSince(t0),
                  client.ok() ? "server '" + (*client)->server().name + "' transport " +
                                    (*client)->server().transport_address
                              : client.status().ToString())) {
    return false;
  }
  RawClient& rc = **client;
  auto made = node.make_scheduler();
  if (!made.ok()) {
    log.Report("scheduler", false, 0, made.status().ToString());
    return false;
  }
  Scheduler& sched = **made;

  t0 = Clock::now();
  Result<RawAllocation> a = sched.block_on(rc.alloc_raw(sched, kLen));
  if (!log.Report("alloc 4 KiB", a.ok(), MicrosSince(t0),
                  a.ok()
                      ? "pool key " + Hex(a->ref.key) + " offset " + std::to_string(a->ref.offset) +
                            " length " + std::to_string(a->length)
                      : a.status().ToString())) {
    return false;
  }
  const RemoteRef ref = a->ref;

  std::vector<uint64_t> pattern(kWords);
  for (size_t i = 0; i < kWords; ++i) pattern[i] = 0x9e3779b97f4a7c15ull * (i + 1) ^ ref.offset;
  t0 = Clock::now();
  Status w = sched.block_on(sched.write(ref, pattern.data(), kLen, /*delivery_complete=*/true));
  log.Report("write 4 KiB pattern", w.ok(), MicrosSince(t0), w.ok() ? "" : w.ToString());

  std::vector<uint64_t> back(kWords, 0);
  t0 = Clock::now();
  Status r = sched.block_on(sched.read(ref, back.data(), kLen));
  const double read_us = MicrosSince(t0);
  std::string detail = r.ok() ? "pattern verified" : r.ToString();
  bool same = r.ok() && back == pattern;
  if (r.ok() && !same) {
    size_t i = std::mismatch(back.begin(), back.end(), pattern.begin()).first - back.begin();
    detail = "mismatch at word " + std::to_string(i);
  }
  log.Report("read 4 KiB + verify", same, read_us, detail);

  t0 = Clock::now();
  Result<uint64_t> cas = sched.block_on(sched.compare_swap(ref, pattern[0], 42));
  log.Report("CAS (expect swap)", cas.ok() && *cas == pattern[0], MicrosSince(t0),
             cas.ok() ? "old " + Hex(*cas) + " -> 42" : cas.status().ToString());
  t0 = Clock::now();
  Result<uint64_t> cas2 = sched.block_on(sched.compare_swap(ref, pattern[0], 7));
  log.Report(
      "CAS (expect no swap)", cas2.ok() && *cas2 == 42, MicrosSince(t0),
      cas2.ok() ? "word is " + std::to_string(*cas2) + ", unchanged" : cas2.status().ToString());

  // 16 fetch-and-adds in flight at once on one word: every old value must be distinct and the
  // final value must be the start + 16 (atomicity across concurrent operations).
  constexpr int kFaa = 16;
  const RemoteRef counter = At(ref, 64);
  const uint64_t start = pattern[64 / sizeof(uint64_t)];
  std::vector<FaaResult> faa(kFaa);
  t0 = Clock::now();
  for (int i = 0; i < kFaa; ++i) sched.spawn(FetchAddOne(&sched, counter, &faa[i]));
  Status ran = sched.run(std::chrono::seconds(30));
  const double faa_us = MicrosSince(t0);
  uint64_t final_value = 0;
  Status fr =
      ran.ok() ? sched.block_on(sched.read(counter, &final_value, sizeof(final_value))) : ran;
  std::vector<uint64_t> olds;
  Status first_error = fr;
  for (const auto& f : faa) {
    if (!f.status.ok() && first_error.ok()) first_error = f.status;
    olds.push_back(f.old);
  }
  std::sort(olds.begin(), olds.end());
  bool faa_ok = first_error.ok() && final_value == start + kFaa;
  for (int i = 0; faa_ok && i < kFaa; ++i) faa_ok = olds[i] == start + i;
  log.Report("FAA x16 in flight", faa_ok, faa_us,
             first_error.ok() ? "counter +" + std::to_string(final_value - start) +
                                    ", olds distinct: " + (faa_ok ? "yes" : "NO")
                              : first_error.ToString());

  t0 = Clock::now();
  Result<nlohmann::json> st = sched.block_on(rc.stat(sched));
  bool stat_ok = false;
  std::string stat_detail = st.ok() ? "" : st.status().ToString();
  if (st.ok()) {
    const auto& mem = (*st)["memory"];
    const uint64_t allocs = mem.value("allocations", uint64_t{0});
    stat_ok = allocs >= 1 && st->contains("node");
    stat_detail = "node '" + st->value("node", std::string("?")) + "', " + std::to_string(allocs) +
                  " allocation(s), " + FormatBytes(mem.value("allocated_bytes", uint64_t{0})) +
                  " allocated in " + std::to_string(mem.value("pools", uint64_t{0})) + " pool(s)";
  }
  log.Report("STAT", stat_ok, MicrosSince(t0), stat_detail);

  t0 = Clock::now();
  Status fs = sched.block_on(rc.free_raw(sched, ref));
  log.Report("free", fs.ok(), MicrosSince(t0), fs.ok() ? "" : fs.ToString());

  t0 = Clock::now();
  Status again = sched.block_on(rc.free_raw(sched, ref));
  log.Report(
      "double free (rejected)", again.code() == Code::kInvalidArgument, MicrosSince(t0),
      again.ok() ? "the server accepted a double free!" : "server said: " + again.ToString());

  std::printf("  %d/%d checks passed\n", log.passed(), log.passed() + log.failed());
  return log.failed() == 0;
}

}  // namespace

int RunDemo(const DemoOptions& options) {
  InitLogging();
  std::unique_ptr<MemoryServer> server;
  std::vector<std::string> targets = options.connect;
  if (targets.empty()) {
    ServerConfig sc;
    sc.memory_bytes = 64ull << 20;
    sc.pool_bytes = 16ull << 20;
    sc.node.name = "farmemd-demo";
    sc.node.bootstrap_host = "127.0.0.1";
    sc.node.transport.backend = options.client.backend;
    sc.node.transport.provider = options.client.provider;
    sc.node.transport.listen_host = "127.0.0.1";
    sc.node.transport.cluster_token = options.client.token;
    auto created = MemoryServer::Create(sc);
    Status st = created.ok() ? (*created)->start() : created.status();
    if (!st.ok()) {
      std::fprintf(stderr, "farmem demo: error: embedded server: %s\n", st.ToString().c_str());
      return 1;
    }
    server = std::move(*created);
    targets.push_back(server->node().bootstrap_address());
    std::printf("embedded farmemd: bootstrap=%s transport=%s address=%s\n", targets[0].c_str(),
                server->node().transport().name().c_str(),
                server->node().transport().local_address().c_str());
  }

  ClientOptions client = options.client;
  auto node = MakeClientNode(client, "farmem-demo-client");
  if (!node.ok()) {
    std::fprintf(stderr, "farmem demo: error: %s\n", node.status().ToString().c_str());
    return 1;
  }
  bool all_ok = true;
  for (const std::string& target : targets) {
    std::printf("demo against %s (backend %s)\n", target.c_str(),
                (*node)->transport().name().c_str());
    all_ok = RunSteps(**node, target) && all_ok;
  }
  (*node)->stop();
  if (server) server->stop();
  std::printf("demo %s\n", all_ok ? "passed" : "FAILED");
  return all_ok ? 0 : 1;
}

}  // namespace farmem::cli
