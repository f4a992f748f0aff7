// farmem_alloc_replay: the child process of `farmem bench objects-memory`. Replays one trace
// (objects_memory_trace.h) through malloc/free (glibc, or jemalloc via LD_PRELOAD) or through the
// CoRM Store + Compactor, and prints one JSON document with the memory held (allocator accounting
// and VmRSS growth) after every phase and, for CoRM, after compacting until nothing merges; the
// final figures also after giving free memory back (glibc malloc_trim(0), jemalloc purge).
// Each run is its own process so RSS figures are not polluted by earlier runs; the baseline is
// taken after the same trim/purge, so heap freed while building the trace is not reused unseen.
#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "objects/engine/compaction.h"
#include "objects/engine/store.h"
#include "objects_memory_trace.h"

namespace {

using farmem::Result;
using farmem::Status;
using farmem::bench::Trace;
using farmem::bench::TraceOp;
using farmem::bench::TracePhase;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// A phase that takes longer than this is reported as an error (the parent also has a deadline).
constexpr std::chrono::seconds kPhaseTimeout{600};

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Resident memory of this process from /proc/self/status (bytes).
struct ProcMem {
  uint64_t rss = 0, anon = 0, shmem = 0;
};

ProcMem ReadProcMem() {
  ProcMem m;
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    auto field = [&](const char* name, uint64_t& out) {
      const size_t n = std::strlen(name);
      if (line.compare(0, n, name) == 0) out = std::strtoull(line.c_str() + n, nullptr, 10) * 1024;
    };
    field("VmRSS:", m.rss);
    field("RssAnon:", m.anon);
    field("RssShmem:", m.shmem);
  }
  return m;
}

// The allocator under test. Alloc/Free are called from the phase's threads (thread index t);
// one object is only ever touched by one thread.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Status Alloc(uint32_t obj, uint32_t size, uint32_t thread) = 0;
  virtual Status Free(uint32_t obj) = 0;
  // Bytes the allocator says it holds (its own accounting; CoRM: blocks + metadata).
  virtual uint64_t Accounted() = 0;
  // CoRM: the store's metadata outside its blocks (part of Accounted); 0 for malloc.
  virtual uint64_t Metadata() { return 0; }
  // Gives free memory back to the system as a long-running server would: glibc malloc_trim(0)
  // (CoRM's metadata lives in the glibc heap too), jemalloc arena.<all>.purge.
  virtual void Release() { malloc_trim(0); }
  virtual json Describe() = 0;
};

// ---- malloc (glibc, or whatever LD_PRELOAD put in front of it) -------------------------------

using MallctlFn = int (*)(const char*, void*, size_t*, void*, size_t);

class MallocAllocator final : public Allocator {
 public:
  explicit MallocAllocator(uint32_t objects) : ptrs_(objects, nullptr) {
    // jemalloc exports mallctl; glibc does not. This is how we know LD_PRELOAD took effect.
    mallctl_ = reinterpret_cast<MallctlFn>(dlsym(RTLD_DEFAULT, "mallctl"));
  }
  Status Alloc(uint32_t obj, uint32_t size, uint32_t) override {
    void* p = std::malloc(size);
    if (p == nullptr) return Status::ResourceExhausted(fmt::format("malloc({}) failed", size));
    // An application writes its value: touch every byte, as CoRM's slot publish does.
    std::memset(p, static_cast<int>(obj & 0xff) | 1, size);
    ptrs_[obj] = p;
    return Status::OK();
  }
  Status Free(uint32_t obj) override {
    std::free(ptrs_[obj]);
    ptrs_[obj] = nullptr;
    return Status::OK();
  }
  uint64_t Accounted() override {
    if (mallctl_ != nullptr) return JeStat("stats.resident");
    // glibc: memory obtained from the system by all arenas (sbrk heap + per-thread heaps) plus
    // mmapped chunks; free chunks inside the heaps still count.
    const struct mallinfo2 mi = mallinfo2();
    return mi.arena + mi.hblkhd;
  }
  void Release() override {
    if (mallctl_ == nullptr) {
      malloc_trim(0);
      return;
    }
    // MALLCTL_ARENAS_ALL (4096): purge the unused dirty pages of every arena. Cached objects in
    // the threads' tcaches are flushed first (only the calling thread's can be; the others are
    // idle pool threads whose caches are small).
    mallctl_("thread.tcache.flush", nullptr, nullptr, nullptr, 0);
    if (mallctl_("arena.4096.purge", nullptr, nullptr, nullptr, 0) != 0) purge_failed_ = true;
  }
  json Describe() override {
    json d = {{"allocator", mallctl_ != nullptr ? "jemalloc" : "glibc"}};
    if (purge_failed_) d["purge_failed"] = true;
    if (mallctl_ != nullptr) {
      d["accounting"] = "jemalloc stats.resident";
      d["jemalloc_active"] = JeStat("stats.active");
      d["jemalloc_allocated"] = JeStat("stats.allocated");
    } else {
      const struct mallinfo2 mi = mallinfo2();
      d["accounting"] = "glibc mallinfo2 arena + hblkhd";
      d["glibc_in_use"] = mi.uordblks + mi.hblkhd;
    }
    return d;
  }

 private:
  uint64_t JeStat(const char* name) {
    // Statistics are snapshots refreshed by writing the epoch.
    uint64_t epoch = 1;
    size_t len = sizeof(epoch);
    mallctl_("epoch", &epoch, &len, &epoch, len);
    size_t v = 0;
    len = sizeof(v);
    if (mallctl_(name, &v, &len, nullptr, 0) != 0) return 0;
    return v;
  }

  std::vector<void*> ptrs_;
  MallctlFn mallctl_ = nullptr;
  bool purge_failed_ = false;
};

// ---- CoRM ------------------------------------------------------------------------------------

class CormAllocator final : public Allocator {
 public:
  static Result<std::unique_ptr<CormAllocator>> Create(const farmem::corm::StoreOptions& o,
                                                       uint32_t objects) {
    FARMEM_ASSIGN_OR_RETURN(auto store, farmem::corm::Store::Create(o));
    return std::unique_ptr<CormAllocator>(new CormAllocator(std::move(store), objects));
  }
  Status Alloc(uint32_t obj, uint32_t size, uint32_t thread) override {
    auto p = store_->Alloc(size, thread);
    if (!p.ok()) return p.status();
    ptrs_[obj] = *p;
    return Status::OK();
  }
  Status Free(uint32_t obj) override { return store_->Free(ptrs_[obj]); }
  uint64_t Accounted() override {
    return store_->blocks().Stats().physical_bytes_held + Metadata();
  }
  uint64_t Metadata() override { return store_->Metadata().total(); }
  json Describe() override {
    const auto& o = store_->options();
    return {{"allocator", "corm"},
            {"accounting", "CoRM physical_bytes_held + Store metadata (heap outside the blocks)"},
            {"block_size", o.block_size},
            {"max_block_size", o.max_block_size},
            {"min_slots_per_block", o.min_slots_per_block},
            {"id_bits", o.id_bits},
            {"hybrid", o.hybrid},
            {"workers", o.workers}};
  }
  farmem::corm::Store& store() { return *store_; }

 private:
  CormAllocator(std::unique_ptr<farmem::corm::Store> s, uint32_t objects)
      : store_(std::move(s)), ptrs_(objects) {}
  std::unique_ptr<farmem::corm::Store> store_;
  std::vector<farmem::corm::ObjectPtr> ptrs_;
};

// ---- phase runner ----------------------------------------------------------------------------

Status RunOps(Allocator& a, const std::vector<TraceOp>& ops, uint32_t thread) {
  for (const TraceOp& op : ops) {
    Status st = op.is_free() ? a.Free(op.obj) : a.Alloc(op.obj, op.size, thread);
    if (!st.ok()) {
      return st.WithContext(fmt::format("{} object {} on thread {}",
                                        op.is_free() ? "free" : "alloc", op.obj, thread));
    }
  }
  return Status::OK();
}

// T persistent threads (created before the baseline measurement so their stacks are part of
// it) that run one phase at a time. With one thread the phases run on the main thread, like a
// single-threaded application (glibc would otherwise put a lone worker in a secondary arena).
class Pool {
 public:
  Pool(Allocator& a, uint32_t threads) : a_(a), n_(threads) {
    if (n_ == 1) return;
    for (uint32_t t = 0; t < n_; ++t) workers_.emplace_back([this, t] { Loop(t); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& w : workers_) w.join();
  }

  Status Run(const TracePhase& phase) {
    if (n_ == 1) return RunOps(a_, phase.per_thread[0], 0);
    std::unique_lock<std::mutex> lock(mu_);
    phase_ = &phase;
    pending_ = n_;
    error_ = Status::OK();
    ++generation_;
    cv_.notify_all();
    if (!done_cv_.wait_for(lock, kPhaseTimeout, [this] { return pending_ == 0; })) {
      return Status::TimedOut(
          fmt::format("phase '{}' did not finish in {} s", phase.name, kPhaseTimeout.count()));
    }
    return error_;
  }

 private:
  void Loop(uint32_t t) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const TracePhase* phase = phase_;
      lock.unlock();
      Status st = RunOps(a_, phase->per_thread[t], t);
      lock.lock();
      if (!st.ok() && error_.ok()) error_ = st;
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  Allocator& a_;
  const uint32_t n_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const TracePhase* phase_ = nullptr;
  uint32_t pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  Status error_;
};

struct Snapshot {
  uint64_t accounted = 0;
  uint64_t metadata = 0;
  ProcMem mem;
};

json Delta(const Snapshot& base, Allocator& a) {
  const uint64_t acc = a.Accounted();
  const uint64_t meta = a.Metadata();
  const ProcMem m = ReadProcMem();
  auto diff = [](uint64_t x, uint64_t y) { return x > y ? x - y : 0; };
  return {{"accounted_bytes", diff(acc, base.accounted)},
          {"metadata_bytes", diff(meta, base.metadata)},
          {"rss_bytes", diff(m.rss, base.mem.rss)},
          {"rss_anon_bytes", diff(m.anon, base.mem.anon)},
          {"rss_shmem_bytes", diff(m.shmem, base.mem.shmem)}};
}

int Fail(const Status& st) {
  std::printf("%s\n", json({{"error", st.ToString()}}).dump().c_str());
  std::fflush(stdout);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"farmem_alloc_replay: replay one objects-memory trace (child of farmem bench)"};
  std::string trace_text, allocator = "malloc";
  farmem::corm::StoreOptions so;
  so.seed = 1;
  so.hybrid = false;  // pure CoRM-k unless --hybrid
  uint32_t max_rounds = 10000;
  app.add_option("--trace", trace_text, "trace spec, e.g. synthetic:size=64:free=0.5")->required();
  app.add_option("--allocator", allocator, "malloc | corm")
      ->check(CLI::IsMember({"malloc", "corm"}));
  app.add_option("--block-size", so.block_size, "CoRM base block size")->capture_default_str();
  app.add_option("--max-block-size", so.max_block_size, "CoRM largest multi-slot block")
      ->capture_default_str();
  app.add_option("--min-slots-per-block", so.min_slots_per_block,
                 "slots a CoRM class's block should hold")
      ->capture_default_str();
  app.add_option("--id-bits", so.id_bits, "CoRM ID bits: 0, 8, 12, 16")->capture_default_str();
  app.add_flag("--hybrid", so.hybrid, "CoRM hybrid mode (offset-only classes beyond 2^id_bits)");
  app.add_option("--store-seed", so.seed, "CoRM ID RNG seed")->capture_default_str();
  app.add_option("--max-rounds", max_rounds, "bound on compaction rounds")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto spec = farmem::bench::TraceSpec::Parse(trace_text);
  if (!spec.ok()) return Fail(spec.status());
  auto trace = farmem::bench::GenerateTrace(*spec);
  if (!trace.ok()) return Fail(trace.status());
  const uint32_t threads = spec->threads;

  std::unique_ptr<Allocator> alloc;
  CormAllocator* corm = nullptr;
  if (allocator == "corm") {
    so.workers = threads;
    // Enough virtual blocks for every trace without compaction (the reservation and its lazily
    // zeroed per-block tables cost memory only where used, and that use is counted).
    so.reserve_bytes = std::max<size_t>(size_t{4} << 30, 4096 * so.block_size);
    auto c = CormAllocator::Create(so, trace->num_objects);
    if (!c.ok()) return Fail(c.status());
    corm = c->get();
    alloc = std::move(c).value();
  } else {
    alloc = std::make_unique<MallocAllocator>(trace->num_objects);
  }

  Pool pool(*alloc, threads);
  // A clean baseline: the trace generator's freed temporaries go back to the system first, or
  // the run would reuse them without growing its RSS (and read up to ~2 MiB low).
  alloc->Release();
  const Snapshot base{alloc->Accounted(), alloc->Metadata(), ReadProcMem()};
  json out;
  out["trace"] = spec->ToString();
  out["config"] = alloc->Describe();
  out["baseline_rss_bytes"] = base.mem.rss;
  json phases = json::array();
  const auto t_all = Clock::now();
  for (const TracePhase& p : trace->phases) {
    const auto t0 = Clock::now();
    if (Status st = pool.Run(p); !st.ok()) {
      const int rc = Fail(st.WithContext("phase " + p.name));
      // A timed-out phase leaves threads running: do not join them in ~Pool.
      if (st.code() == farmem::Code::kTimedOut) std::_Exit(rc);
      return rc;
    }
    json m = Delta(base, *alloc);
    m["name"] = p.name;
    m["ops"] = p.ops();
    m["seconds"] = Since(t0);
    phases.push_back(std::move(m));
  }
  out["phases"] = phases;
  out["after_trace"] = Delta(base, *alloc);
  out["trace_seconds"] = Since(t_all);
  alloc->Release();
  out["after_trace_released"] = Delta(base, *alloc);

  if (corm != nullptr) {
    farmem::corm::CompactionOptions co;
    co.compact_on_alloc_failure = false;
    farmem::corm::Compactor compactor(corm->store(), co);
    const auto t0 = Clock::now();
    uint32_t rounds = 0;
    uint64_t merges = 0;
    bool converged = false;
    // Compact until a whole round over every class merges nothing (bounded).
    while (rounds < max_rounds) {
      auto r = compactor.CompactAll();
      ++rounds;
      if (!r.ok()) return Fail(r.status().WithContext("compaction"));
      merges += *r;
      if (*r == 0) {
        converged = true;
        break;
      }
    }
    const auto cs = compactor.stats();
    uint64_t attempts = 0;  // source/partner pairs tried, over every class
    for (const auto& c : cs.classes) attempts += c.attempts;
    out["compaction"] = {{"rounds", rounds},
                         {"merges", merges},
                         {"converged", converged},
                         {"seconds", Since(t0)},
                         {"objects_copied", cs.objects_copied},
                         {"objects_relocated", cs.objects_relocated},
                         {"collisions", cs.collisions},
                         {"merge_attempts", attempts},
                         {"ids_redrawn", cs.ids_redrawn},
                         {"skipped_busy", cs.skipped_busy}};
    out["after_compaction"] = Delta(base, *alloc);
    alloc->Release();
    out["after_compaction_released"] = Delta(base, *alloc);
    const auto ss = corm->store().Stats();
    out["live_objects"] = ss.live_objects;
    out["live_blocks"] = ss.live_blocks;
    const farmem::corm::MetadataStats& md = ss.metadata;
    out["metadata"] = {{"block_structs", md.block_structs},
                       {"per_slot", md.per_slot},
                       {"id_tables", md.id_tables},
                       {"owner_lists", md.owner_lists},
                       {"per_vblock", md.per_vblock},
                       {"per_owner", md.per_owner},
                       {"block_struct_size", sizeof(farmem::corm::detail::Block)}};
  }
  out["config"] = alloc->Describe();  // again, after the purges: records a failed one
  std::printf("%s\n", out.dump().c_str());
  std::fflush(stdout);
  return 0;
}
