// TierService: decodes and checks the TIER_* RPCs (tier_wire.h), calls the TierStore, runs the
// hotspot period thread and renders the STAT "tier" section. Nothing here trusts a client: every
// range, page mask and unit index is checked by the wire decoders before the store sees it.
#include "tier/service/tier_service.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "common/log.h"
#include "service/flags.h"

namespace farmem {

namespace tw = tier;

namespace {

std::string N(uint64_t v) {
  return std::to_string(v);
}

tw::TierWireMode WireMode(TierMode m) {
  switch (m) {
    case TierMode::kRpc:
      return tw::TierWireMode::kRpc;
    case TierMode::kRpcDirect:
      return tw::TierWireMode::kRpcDirect;
    case TierMode::kTiering:
      return tw::TierWireMode::kTiering;
    case TierMode::kHotspot:
      return tw::TierWireMode::kHotspot;
    case TierMode::kFull:
      break;
  }
  return tw::TierWireMode::kFull;
}

bool OneSided(TierMode m) {
  return m == TierMode::kTiering || m == TierMode::kHotspot || m == TierMode::kFull;
}
bool Promotes(TierMode m) {
  return m == TierMode::kHotspot || m == TierMode::kFull;
}

}  // namespace

const char* TierModeName(TierMode mode) {
  switch (mode) {
    case TierMode::kRpc:
      return "rpc";
    case TierMode::kRpcDirect:
      return "rpc-direct";
    case TierMode::kTiering:
      return "tiering";
    case TierMode::kHotspot:
      return "hotspot";
    case TierMode::kFull:
      break;
  }
  return "full";
}

Status ValidateTierConfig(const ServerConfig& config) {
  const TierConfig& t = config.tier;
  if (t.file.empty()) return Status::OK();
  const uint64_t unit = uint64_t{t.unit_kib} << 10;
  if (unit < tw::kMinUnitSize || unit > tw::kMaxUnitSize || (unit & (unit - 1)) != 0) {
    return Status::InvalidArgument("--tier-unit-kib must be a power of two in 4..16384, got " +
                                   N(t.unit_kib));
  }
  if (t.capacity_bytes == 0 || t.capacity_bytes % unit != 0) {
    return Status::InvalidArgument("--tier-capacity-mib must be a non-zero multiple of the unit (" +
                                   N(t.unit_kib) + " KiB), got " + N(t.capacity_bytes >> 20) +
                                   " MiB");
  }
  if (t.dram_bytes == 0 || t.dram_bytes % unit != 0) {
    return Status::InvalidArgument("--tier-dram-mib must be a non-zero multiple of the unit (" +
                                   N(t.unit_kib) + " KiB), got " + N(t.dram_bytes >> 20) + " MiB");
  }
  if (t.period_ms < 1 || t.period_ms > 3600 * 1000) {
    return Status::InvalidArgument("--tier-period-ms must be 1..3600000, got " + N(t.period_ms));
  }
  if (t.fill_percent < 1 || t.fill_percent > 100) {
    return Status::InvalidArgument("--tier-fill-pct must be 1..100, got " + N(t.fill_percent));
  }
  if (t.heat_keep_percent > tw::TierHeat::kMaxKeepPercent) {
    return Status::InvalidArgument("--tier-heat-keep-pct must be 0..99, got " +
                                   N(t.heat_keep_percent));
  }
  if (t.hysteresis_percent > tw::TierPolicy::kMaxHysteresisPercent) {
    return Status::InvalidArgument("--tier-hysteresis-pct must be 0..1000, got " +
                                   N(t.hysteresis_percent));
  }
  if (t.cached_reads &&
      (t.mode == TierMode::kRpc || (!t.direct_io && t.mode != TierMode::kRpcDirect))) {
    return Status::InvalidArgument(
        "--tier-cached-reads on needs O_DIRECT file IO (not with --tier-direct-io off or "
        "--tier-mode rpc, whose reads go through the page cache anyway)");
  }
  if (config.node.transport.max_rpc_bytes < 2 * tw::kPageSize) {
    return Status::InvalidArgument("the tier service needs --max-rpc-bytes of at least 8192");
  }
  return Status::OK();
}

Result<std::unique_ptr<TierService>> TierService::Create(const ServerConfig& config, Node& node,
                                                         tw::TierStoreFaults faults) {
  if (config.tier.file.empty()) {
    return Status::InvalidArgument("the tier service needs --tier-file PATH");
  }
  FARMEM_RETURN_IF_ERROR(ValidateTierConfig(config));
  std::unique_ptr<TierService> s(new TierService());
  s->config_ = config.tier;
  TierConfig& c = s->config_;
  if (c.mode == TierMode::kRpc) c.direct_io = false;
  if (c.mode == TierMode::kRpcDirect) c.direct_io = true;
  // A TIER_READ reply carries at most the range; a TIER_WRITE request its head and the range.
  s->max_io_ = std::min<uint64_t>(tw::kMaxTierIoBytes, (config.node.transport.max_rpc_bytes - 64) /
                                                           tw::kPageSize * tw::kPageSize);

  tw::TierOptions o;
  o.path = c.file;
  o.capacity = c.capacity_bytes;
  o.dram_budget = c.dram_bytes;
  o.unit_size = uint64_t{c.unit_kib} << 10;
  o.direct_io = c.direct_io;
  o.cached_reads = c.cached_reads;
  o.fill_percent = c.fill_percent;
  o.heat_keep_percent = c.heat_keep_percent;
  o.hysteresis_percent = c.hysteresis_percent;
  o.fill_free_frames = c.fill_free_frames;
  o.faults = faults;
  o.io_rings = kMissIoThreads + 2;
  s->sync_miss_io_ = faults.sync_miss_io;
  s->sync_write_io_ = faults.sync_write_io;
  // The grace period of a demotion: every one-sided copy the transport's threads were making
  // when the unit was remapped has finished before its frame is punched and reused.
  const auto timeout = config.node.transport.op_timeout;
  o.grace = [&transport = node.transport(), timeout]() {
    return transport.wait_for_read_copies(std::chrono::steady_clock::now() + timeout);
  };
  auto store = tw::TierStore::Open(o);
  if (!store.ok()) return store.status().WithContext("tier store " + c.file);
  s->store_ = std::move(*store);
  const tw::TierGeometry& geo = s->store_->geometry();
  s->counts_ = std::make_unique<std::atomic<uint64_t>[]>(geo.unit_count);

  if (OneSided(c.mode)) {
    // Read-only: a one-sided write into the range could hit the sealed magic memfd or bypass
    // the store's dirty tracking; every change goes through TIER_WRITE.
    auto region = node.export_region(kDataRegionName, const_cast<uint8_t*>(s->store_->base()),
                                     geo.capacity, Access::kReadOnly);
    if (!region.ok()) return region.status().WithContext("exporting the tier region");
    s->data_region_ = *region;
  }
  if (c.mode == TierMode::kFull) {
    auto region = node.export_region(kBitmapRegionName, const_cast<uint64_t*>(s->store_->bitmap()),
                                     s->store_->bitmap_alloc_bytes(), Access::kReadOnly);
    if (!region.ok()) return region.status().WithContext("exporting the tier bitmap");
    s->bitmap_region_ = *region;
  }
  if (c.mode == TierMode::kTiering) {
    // The one fill of this mode: the first units, in index order, up to the fill target.
    // (Every unit when the budget holds them all, as the policy's target.)
    const uint64_t target =
        tw::TierPolicy::TargetFor(s->store_->budget_units(), geo.unit_count, c.fill_percent);
    for (uint64_t u = 0; u < std::min(target, geo.unit_count); ++u) {
      FARMEM_RETURN_IF_ERROR(
          s->store_->Promote(static_cast<uint32_t>(u)).WithContext("first fill"));
    }
  }
  return s;
}

TierService::~TierService() {
  stop();
}

Status TierService::start() {
  {
    std::lock_guard lock(miss_mu_);
    if (miss_threads_.empty() && !sync_miss_io_) {
      for (unsigned i = 0; i < kMissIoThreads; ++i) {
        try {
          miss_threads_.emplace_back([this] { MissLoop(); });
        } catch (const std::system_error& e) {
          // The threads already running serve; stop() joins them.
          FARMEM_LOG_WARN("tier: cannot start miss-IO thread {}: {}", i, e.what());
          break;
        }
      }
      miss_running_ = !miss_threads_.empty();
    }
  }
  if (!Promotes(config_.mode)) return Status::OK();
  std::lock_guard lock(thread_mu_);
  if (thread_.joinable()) return Status::OK();
  stopping_ = false;
  thread_ = std::thread([this] { PeriodLoop(); });
  return Status::OK();
}

void TierService::stop() {
  {
    std::lock_guard lock(thread_mu_);
    stopping_ = true;
  }
  thread_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::deque<MissJob> left;
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(miss_mu_);
    miss_running_ = false;
    left.swap(miss_queue_);
    threads.swap(miss_threads_);
  }
  miss_cv_.notify_all();
  for (auto& t : threads) t.join();
  for (MissJob& job : left) {
    rpc_in_flight_.fetch_sub(1, std::memory_order_relaxed);
    (void)job.reply.send(Status::Unavailable("tier service stopping"));
  }
}

void TierService::MissLoop() {
  std::vector<std::byte> reply;
  for (;;) {
    MissJob job;
    {
      std::unique_lock lock(miss_mu_);
      miss_cv_.wait(lock, [this] { return !miss_running_ || !miss_queue_.empty(); });
      if (!miss_running_) return;  // stop() answers what is still queued
      job = std::move(miss_queue_.front());
      miss_queue_.pop_front();
    }
    reply.clear();
    // The handle owns the request bytes, so a write's data span is still valid here.
    Status st = job.is_write ? ServeWrite(job.write) : ServeRead(job.read, reply);
    if (!st.ok()) {
      FARMEM_LOG_DEBUG("{} (deferred): {}", job.is_write ? "tier_write" : "tier_read",
                       st.ToString());
      reply.clear();
    }
    // Before the answer: a client that has it sees the call no longer in flight.
    rpc_in_flight_.fetch_sub(1, std::memory_order_relaxed);
    Status sent = job.reply.send(st, reply);
    if (!sent.ok()) FARMEM_LOG_DEBUG("deferred tier answer not sent: {}", sent.ToString());
  }
}

bool TierService::DeferMiss(const RpcCall& call, MissJob& job) {
  std::unique_lock lock(miss_mu_);
  if (!miss_running_ || miss_queue_.size() >= kMissQueueCapacity) return false;
  job.reply = call.defer();
  if (!job.reply.valid()) return false;
  miss_queue_.push_back(std::move(job));
  lock.unlock();
  miss_cv_.notify_one();
  return true;
}

void TierService::PeriodLoop() {
  std::unique_lock lock(thread_mu_);
  const auto period = std::chrono::milliseconds(config_.period_ms);
  auto next = std::chrono::steady_clock::now() + period;
  while (!stopping_) {
    if (thread_cv_.wait_until(lock, next, [this] { return stopping_; })) break;
    lock.unlock();
    // The fill gets half a period: the other half (and the disk) stays for misses and writes.
    if (Status st = RunPeriodNow(std::chrono::steady_clock::now() + period / 2); !st.ok()) {
      FARMEM_LOG_WARN("tier period: {}", st.ToString());
    }
    lock.lock();
    next = std::max(next + period, std::chrono::steady_clock::now());
  }
}

Status TierService::RunPeriodNow(std::chrono::steady_clock::time_point fill_until) {
  std::lock_guard lock(period_mu_);
  const uint64_t units = store_->geometry().unit_count;
  std::vector<uint64_t> counts(units);
  for (uint64_t u = 0; u < units; ++u) {
    counts[u] = counts_[u].exchange(0, std::memory_order_relaxed);
  }
  periods_.fetch_add(1, std::memory_order_relaxed);
  if (!Promotes(config_.mode)) return Status::OK();
  auto report = store_->RunPeriod(counts, fill_until);
  if (!report.ok()) {
    period_errors_.fetch_add(1, std::memory_order_relaxed);
    return report.status();
  }
  if (!report->error.ok()) {
    period_errors_.fetch_add(1, std::memory_order_relaxed);
    return report->error;
  }
  return Status::OK();
}

const char* TierService::OpName(uint16_t opcode) {
  switch (opcode) {
    case tw::kOpTierInfo:
      return "tier_info";
    case tw::kOpTierRead:
      return "tier_read";
    case tw::kOpTierWrite:
      return "tier_write";
    case tw::kOpTierCounters:
      return "tier_counters";
  }
  return nullptr;
}

std::vector<ServiceMethod> TierService::methods() {
  std::vector<ServiceMethod> out;
  for (uint16_t op = kTierOpcodes.first; op <= kTierOpcodes.last; ++op) {
    const char* name = OpName(op);
    if (name == nullptr) continue;
    // INFO and COUNTERS are a copy and a few relaxed adds: inline on the progress thread.
    // READ and WRITE may do file IO: workers.
    const RpcExecution ex = op == tw::kOpTierInfo || op == tw::kOpTierCounters
                                ? RpcExecution::kInline
                                : RpcExecution::kWorker;
    out.push_back({op, name, ex, [this](const RpcCall& call, std::vector<std::byte>& reply) {
                     return Handle(call, reply);
                   }});
  }
  return out;
}

Status TierService::Handle(const RpcCall& call, std::vector<std::byte>& reply) {
  Status st;
  switch (call.opcode) {
    case tw::kOpTierInfo:
      st = call.request.empty() ? Info(reply)
                                : Status::Protocol("TIER_INFO request must be empty, got " +
                                                   N(call.request.size()) + " bytes");
      break;
    case tw::kOpTierRead:
    case tw::kOpTierWrite: {
      rpc_in_flight_.fetch_add(1, std::memory_order_relaxed);
      bool deferred = false;
      st = call.opcode == tw::kOpTierRead ? Read(call, reply, &deferred) : Write(call, &deferred);
      if (deferred) return Status::OK();  // a miss-IO thread answers (and counts it out)
      rpc_in_flight_.fetch_sub(1, std::memory_order_relaxed);
      break;
    }
    case tw::kOpTierCounters:
      st = Counters(call);
      break;
    default:
      return Status::NotFound("no tier handler for opcode " + N(call.opcode));
  }
  if (!st.ok()) {
    reply.clear();
    FARMEM_LOG_DEBUG("{} from {}: {}", OpName(call.opcode), call.source, st.ToString());
  }
  return st;
}

Status TierService::Info(std::vector<std::byte>& reply) {
  tw::TierInfoReply r{};
  r.geometry = store_->geometry();
  r.magic_word = store_->magic_word();
  r.data_key = data_region_.key;
  r.bitmap_key = bitmap_region_.key;
  r.bitmap_bytes = config_.mode == TierMode::kFull ? r.geometry.bitmap_bytes() : 0;
  r.period_ms = config_.period_ms;
  r.mode = static_cast<uint8_t>(WireMode(config_.mode));
  reply = tw::EncodeTierInfoReply(r);
  return Status::OK();
}

bool TierService::AllResident(uint64_t offset, uint64_t length,
                              std::span<const uint64_t> mask) const {
  // Racy by design: it only picks the thread that does the IO. A unit demoted right after this
  // check is read or written through the file on the worker (correct, just synchronous); one
  // promoted after it is served from DRAM on a miss-IO thread.
  const uint64_t unit = store_->geometry().unit_size;
  const uint64_t first = offset / tw::kPageSize;
  const uint64_t pages = tw::PagesSpanned(offset, length);
  int64_t last_unit = -1;
  for (uint64_t i = 0; i < pages; ++i) {
    if (!mask.empty() && (mask[i / 64] >> (i % 64) & 1) == 0) continue;
    const auto u = static_cast<int64_t>((first + i) * tw::kPageSize / unit);
    if (u == last_unit) continue;
    if (!store_->IsResident(static_cast<uint32_t>(u))) return false;
    last_unit = u;
  }
  return true;
}

Status TierService::Read(const RpcCall& call, std::vector<std::byte>& reply, bool* deferred) {
  FARMEM_ASSIGN_OR_RETURN(tw::TierReadRequest req,
                          tw::DecodeTierReadRequest(call.request, store_->geometry(), max_io_));
  const bool hit = AllResident(req.offset, req.length, req.mask);
  if (!sync_miss_io_ && !hit) {
    // A miss: its file IO would hold this worker (and every RPC queued behind it) for a device
    // round trip. Hand it to a miss-IO thread, which answers through the deferred handle.
    MissJob job;
    job.read = std::move(req);
    if (DeferMiss(call, job)) {
      misses_deferred_.fetch_add(1, std::memory_order_relaxed);
      *deferred = true;
      return Status::OK();
    }
    req = std::move(job.read);  // not queued: DeferMiss left the job as it was
  }
  if (!hit) misses_sync_.fetch_add(1, std::memory_order_relaxed);
  return ServeRead(req, reply);
}

Status TierService::ServeRead(const tw::TierReadRequest& req, std::vector<std::byte>& reply) {
  reply.resize(req.length);
  auto* out = reinterpret_cast<uint8_t*>(reply.data());
  FARMEM_RETURN_IF_ERROR(store_->ReadPages(req.offset, {out, req.length}, req.mask));
  // Pack the requested pages' parts to the front, in order (dst <= src: memmove is safe).
  const uint64_t first = req.offset / tw::kPageSize;
  const uint64_t end = req.offset + req.length;
  const uint64_t pages = tw::PagesSpanned(req.offset, req.length);
  uint64_t at = 0;
  for (uint64_t i = 0; i < pages; ++i) {
    if ((req.mask[i / 64] >> (i % 64) & 1) == 0) continue;
    const uint64_t lo = std::max(req.offset, (first + i) * tw::kPageSize);
    const uint64_t hi = std::min(end, (first + i + 1) * tw::kPageSize);
    if (at != lo - req.offset) std::memmove(out + at, out + (lo - req.offset), hi - lo);
    at += hi - lo;
  }
  reply.resize(at);
  rpc_reads_.fetch_add(1, std::memory_order_relaxed);
  rpc_read_bytes_.fetch_add(at, std::memory_order_relaxed);
  return Status::OK();
}

Status TierService::Write(const RpcCall& call, bool* deferred) {
  // Decoded (and refused when malformed or out of range) here on the worker, deferred or not.
  FARMEM_ASSIGN_OR_RETURN(tw::TierWriteRequest req,
                          tw::DecodeTierWriteRequest(call.request, store_->geometry(), max_io_));
  const bool hit = AllResident(req.offset, req.data.size(), {});
  if (!sync_write_io_ && !hit) {
    // A cold part: a file write (and, when unaligned, a read first) would hold this worker for
    // one or two device round trips. The deferred handle keeps the request bytes req.data
    // points into alive until the miss-IO thread has answered.
    MissJob job;
    job.is_write = true;
    job.write = req;
    if (DeferMiss(call, job)) {
      write_misses_deferred_.fetch_add(1, std::memory_order_relaxed);
      *deferred = true;
      return Status::OK();
    }
  }
  if (!hit) write_misses_sync_.fetch_add(1, std::memory_order_relaxed);
  return ServeWrite(req);
}

Status TierService::ServeWrite(const tw::TierWriteRequest& req) {
  FARMEM_RETURN_IF_ERROR(store_->Write(
      req.offset, {reinterpret_cast<const uint8_t*>(req.data.data()), req.data.size()}));
  rpc_writes_.fetch_add(1, std::memory_order_relaxed);
  rpc_write_bytes_.fetch_add(req.data.size(), std::memory_order_relaxed);
  return Status::OK();
}

Status TierService::Counters(const RpcCall& call) {
  FARMEM_ASSIGN_OR_RETURN(std::vector<tw::TierCounterEntry> entries,
                          tw::DecodeTierCounters(call.request, store_->geometry().unit_count));
  for (const tw::TierCounterEntry& e : entries) {
    counts_[e.unit].fetch_add(e.count, std::memory_order_relaxed);
  }
  counter_pushes_.fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

nlohmann::json TierService::Stats() const {
  const tw::TierStats s = store_->Stats();
  const auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  nlohmann::json j;
  j["config"] = {{"file", config_.file},
                 {"capacity_bytes", config_.capacity_bytes},
                 {"dram_bytes", config_.dram_bytes},
                 {"unit_bytes", s.unit_size},
                 {"period_ms", config_.period_ms},
                 {"fill_percent", config_.fill_percent},
                 {"fill_free_frames", config_.fill_free_frames},
                 {"heat_keep_percent", config_.heat_keep_percent},
                 {"hysteresis_percent", config_.hysteresis_percent},
                 {"direct_io", config_.direct_io},
                 {"cached_reads", config_.cached_reads},
                 {"mode", TierModeName(config_.mode)}};
  j["capacity_bytes"] = s.capacity;
  j["unit_bytes"] = s.unit_size;
  j["units"] = s.unit_count;
  j["resident_units"] = s.resident_units;
  j["budget_units"] = s.budget_units;
  j["resident_bytes"] = s.resident_units * s.unit_size;
  j["budget_bytes"] = s.budget_units * s.unit_size;
  j["residency"] = s.unit_count == 0 ? 0.0 : double(s.resident_units) / double(s.unit_count);
  j["quarantined_frames"] = s.quarantined_frames;
  j["free_frames"] = s.free_frames;
  j["promotions"] = s.promotions;
  j["fills"] = s.fills;
  j["demotions"] = s.demotions;
  j["writebacks"] = s.writebacks;
  j["grace_failures"] = s.grace_failures;
  j["io_read_bytes"] = s.io_read_bytes;
  j["io_write_bytes"] = s.io_write_bytes;
  j["reads_dram"] = s.reads_dram;
  j["reads_file"] = s.reads_file;
  j["read_bytes_dram"] = s.read_bytes_dram;
  j["read_bytes_file"] = s.read_bytes_file;
  j["writes_dram"] = s.writes_dram;
  j["writes_file"] = s.writes_file;
  j["cached_read_hits"] = s.cached_read_hits;
  j["cached_read_misses"] = s.cached_read_misses;
  j["io_short_completions"] = s.io_short_completions;
  j["io_errors"] = s.io_errors;
  j["periods"] = ld(periods_);
  j["period_errors"] = ld(period_errors_);
  j["counter_pushes"] = ld(counter_pushes_);
  j["rpc_reads"] = ld(rpc_reads_);
  j["rpc_read_bytes"] = ld(rpc_read_bytes_);
  j["rpc_writes"] = ld(rpc_writes_);
  j["rpc_write_bytes"] = ld(rpc_write_bytes_);
  j["rpc_in_flight"] = rpc_in_flight_.load(std::memory_order_relaxed);
  j["misses_deferred"] = ld(misses_deferred_);
  j["misses_sync"] = ld(misses_sync_);
  j["write_misses_deferred"] = ld(write_misses_deferred_);
  j["write_misses_sync"] = ld(write_misses_sync_);
  return j;
}

void TierService::stats(nlohmann::json& doc) const {
  doc["tier"] = Stats();
}

void TierService::metrics(MetricsWriter& w) const {
  const nlohmann::json t = Stats();
  const auto num = [&t](const char* key) { return t[key].get<double>(); };
  w.gauge("farmem_tier_resident_units", "Units of the tiered region resident in DRAM.",
          num("resident_units"));
  w.gauge("farmem_tier_budget_units", "DRAM frames of the tiered region (the exact budget).",
          num("budget_units"));
  w.gauge("farmem_tier_quarantined_frames", "Frames of demoted units waiting for a grace period.",
          num("quarantined_frames"));
  w.counter("farmem_tier_promotions_total", "Units promoted.", num("promotions"));
  w.counter("farmem_tier_fills_total",
            "Units promoted into free frames before anyone counted them.", num("fills"));
  w.counter("farmem_tier_demotions_total", "Units demoted.", num("demotions"));
  w.counter("farmem_tier_writebacks_total", "Dirty units written back.", num("writebacks"));
  w.counter("farmem_tier_io_read_bytes_total", "Backing file bytes read.", num("io_read_bytes"));
  w.counter("farmem_tier_io_write_bytes_total", "Backing file bytes written.",
            num("io_write_bytes"));
  w.counter("farmem_tier_io_errors_total",
            "Backing file reads and writes that failed (EIO, ENOSPC, a cut file).",
            num("io_errors"));
  w.counter("farmem_tier_reads_dram_total", "Server-side read parts served from DRAM.",
            num("reads_dram"));
  w.counter("farmem_tier_reads_file_total", "Server-side read parts served from the file.",
            num("reads_file"));
  w.counter("farmem_tier_rpc_read_bytes_total", "Bytes returned by TIER_READ.",
            num("rpc_read_bytes"));
  w.counter("farmem_tier_rpc_write_bytes_total", "Bytes written by TIER_WRITE.",
            num("rpc_write_bytes"));
  w.counter("farmem_tier_periods_total", "Hotspot periods run.", num("periods"));
}

const ServiceDescriptor& TierServiceDescriptor() {
  static const ServiceDescriptor d{
      "tier",
      "TeRM tiered region backed by a file (runs with --tier-file): TIER_* RPCs, read-only "
      "regions 'tier' and 'tier-bitmap'",
      [](FlagSet& flags, ServerConfig& c) {
        TierConfig& t = c.tier;
        flags.add("tier-file", &t.file,
                  "backing file of the tiered region (not tmpfs); enables it");
        flags.add_mib("tier-capacity-mib", &t.capacity_bytes, "tiered region size in MiB");
        flags.add_mib("tier-dram-mib", &t.dram_bytes, "DRAM budget of the tiered region in MiB");
        flags.add("tier-unit-kib", &t.unit_kib, "promotion unit in KiB: power of two, 4..16384");
        flags.add("tier-period-ms", &t.period_ms,
                  "hotspot period: counter sums, promotions, clients' bitmap pulls");
        flags.add("tier-fill-pct", &t.fill_percent, "share of the DRAM budget a period fills");
        flags.add_choice("tier-fill-free", &t.fill_free_frames, {{"on", true}, {"off", false}},
                         "hotspot and full modes also fill that share with units not counted yet "
                         "(docs/tier.md \"Filling free frames\")");
        flags.add("tier-heat-keep-pct", &t.heat_keep_percent,
                  "share of a unit's access heat kept into the next period, 0..99 (0: the last "
                  "period's counts only)");
        flags.add("tier-hysteresis-pct", &t.hysteresis_percent,
                  "a cold unit displaces a resident one only when this much hotter, 0..1000");
        flags.add_choice("tier-direct-io", &t.direct_io, {{"on", true}, {"off", false}},
                         "O_DIRECT file IO (rpc and rpc-direct modes override it)");
        flags.add_choice("tier-cached-reads", &t.cached_reads, {{"on", true}, {"off", false}},
                         "cold reads first try a buffered RWF_NOWAIT read (page cache hits only; "
                         "docs/tier.md \"Cached reads\": off, it does not pay here)");
        flags.add_choice("tier-mode", &t.mode,
                         {{"rpc", TierMode::kRpc},
                          {"rpc-direct", TierMode::kRpcDirect},
                          {"tiering", TierMode::kTiering},
                          {"hotspot", TierMode::kHotspot},
                          {"full", TierMode::kFull}},
                         "ablation ladder (docs/tier.md)");
      },
      [](ServerConfig& c) { return ValidateTierConfig(c); },
      [](const ServerConfig& c, ServiceEnv& env) -> Result<std::unique_ptr<Service>> {
        FARMEM_ASSIGN_OR_RETURN(std::unique_ptr<TierService> s, TierService::Create(c, env.node));
        return std::unique_ptr<Service>(std::move(s));
      },
      [](const ServerConfig& c) { return !c.tier.file.empty(); },
  };
  return d;
}

}  // namespace farmem
