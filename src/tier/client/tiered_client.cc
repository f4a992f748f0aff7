// TieredClient (include/farmem/tier.h): reads of a TeRM tiered region — one-sided copies of the
// pages the pulled bitmap marks resident, pattern detection on every copy (whole 8-byte words),
// ONE sparse TIER_READ for the pages found missing — and writes by TIER_WRITE. Threads: callers
// (each with its own Scheduler; the blocking API shares one under a mutex) and a background
// thread that pulls the bitmap and pushes the per-unit access counters every period.
#include "farmem/tier.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "common/log.h"
#include "node/rpc_call.h"
#include "tier/client/shm_cma.h"
#include "tier/format/tier_layout.h"
#include "tier/format/tier_wire.h"

namespace farmem {

namespace tw = tier;

namespace {

std::string N(uint64_t v) {
  return std::to_string(v);
}

const char* ModeName(uint8_t m) {
  switch (static_cast<tw::TierWireMode>(m)) {
    case tw::TierWireMode::kRpc:
      return "rpc";
    case tw::TierWireMode::kRpcDirect:
      return "rpc-direct";
    case tw::TierWireMode::kTiering:
      return "tiering";
    case tw::TierWireMode::kHotspot:
      return "hotspot";
    case tw::TierWireMode::kFull:
      break;
  }
  return "full";
}

// Transports whose one-sided copies a pattern check can trust (docs/tier.md "Client"): native
// TCP copies aligned words in ascending order with atomic loads, inside a CopyEpoch the grace
// hook waits for; libfabric shm (CMA) pins each page before copying it, so a copy never mixes two
// frames inside a page — but only with CMA: without it shm copies through bounce buffers with
// memcpy (shm_cma.h). The libfabric tcp provider copies bytewise through socket buffers: RPC.
bool TrustsOneSidedCopies(std::string_view transport, const PeerInfo& server) {
  if (transport == "tcp") return true;
  if (transport != "fabric:shm") return false;
  const int pid = tw::ShmServerPid(server.transport_address);
  if (tw::ShmUsesCma(pid, std::getenv("FI_SHM_DISABLE_CMA"))) return true;
  FARMEM_LOG_WARN(
      "TieredClient: fabric shm to {} copies without CMA (FI_SHM_DISABLE_CMA or no ptrace "
      "permission for pid {}): reading by TIER_READ only",
      server.name, pid);
  return false;
}

// Waits for several child tasks of one scheduler: Child() runs a Task<Status>, stores its result
// and resumes the parent when the last one finished.
struct Join {
  size_t remaining = 0;
  std::coroutine_handle<> waiter;
  struct Awaiter {
    Join* j;
    bool await_ready() const noexcept { return j->remaining == 0; }
    void await_suspend(std::coroutine_handle<> h) noexcept { j->waiter = h; }
    void await_resume() const noexcept {}
  };
  Awaiter wait() { return Awaiter{this}; }
};

Task<void> Child(Task<Status> task, Status* out, Join* join) {
  *out = co_await task;
  if (--join->remaining == 0 && join->waiter) {
    auto h = std::exchange(join->waiter, {});
    h.resume();
  }
}

// Runs every task at once on `sched`; the first error (in order), or OK.
Task<Status> RunAll(Scheduler& sched, std::vector<Task<Status>> tasks, std::vector<Status>* each) {
  std::vector<Status> results(tasks.size());
  Join join;
  join.remaining = tasks.size();
  for (size_t i = 0; i < tasks.size(); ++i) {
    sched.spawn(Child(std::move(tasks[i]), &results[i], &join));
  }
  co_await join.wait();
  Status first;
  for (const Status& st : results) {
    if (!st.ok() && first.ok()) first = st;
  }
  if (each != nullptr) *each = std::move(results);
  co_return first;
}

bool MaskBit(const std::vector<uint64_t>& m, uint64_t i) {
  return (m[i / 64] >> (i % 64) & 1) != 0;
}
void SetBit(std::vector<uint64_t>& m, uint64_t i) {
  m[i / 64] |= uint64_t{1} << (i % 64);
}

}  // namespace

struct TieredClient::Impl {
  Node* node = nullptr;
  PeerId peer = kInvalidPeer;
  std::string address;
  tw::TierInfoReply wire{};
  TierRegionInfo info;
  TieredClientOptions options;
  uint64_t max_chunk = 0;  // bytes per TIER_READ / TIER_WRITE
  uint32_t max_rpc = 0;
  bool counting = false;  // the mode promotes: count accesses per unit

  mutable std::shared_mutex bitmap_mu;
  std::vector<uint64_t> bitmap;  // last pull
  std::unique_ptr<std::atomic<uint32_t>[]> counts;

  struct Counters {
    std::atomic<uint64_t> reads{0}, writes{0}, one_sided_reads{0}, one_sided_hits{0},
        bitmap_skips{0}, pattern_misses{0}, false_positives{0}, rpc_reads{0}, rpc_read_bytes{0},
        rpc_write_bytes{0}, bitmap_pulls{0}, counter_pushes{0};
  } c;

  std::unique_ptr<BlockingRunner> blocking;
  std::mutex refresh_mu;  // one refresh at a time (background thread or refresh())
  std::mutex thread_mu;
  std::condition_variable thread_cv;
  bool stopping = false;
  std::thread thread;

  static void Add(std::atomic<uint64_t>& a, uint64_t n = 1) {
    a.fetch_add(n, std::memory_order_relaxed);
  }

  Status CheckIo(uint64_t offset, size_t len, const char* op) const {
    if (len == 0) return Status::InvalidArgument(std::string(op) + ": empty range");
    if (len > kMaxIoBytes) {
      return Status::InvalidArgument(std::string(op) + ": " + N(len) + " bytes, at most " +
                                     N(kMaxIoBytes) + " per call");
    }
    return wire.geometry.CheckRange(offset, len).WithContext(op);
  }

  void Count(uint64_t offset, size_t len) {
    if (!counting) return;
    const uint64_t u0 = offset / info.unit_size, u1 = (offset + len - 1) / info.unit_size;
    for (uint64_t u = u0; u <= u1; ++u) counts[u].fetch_add(1, std::memory_order_relaxed);
  }

  Task<Status> ReadChunk(Scheduler& s, uint64_t off, std::byte* out, size_t len);
  Task<Status> ReadRun(Scheduler& s, uint64_t off, uint8_t* dst, size_t len);
  Task<Status> WriteChunk(Scheduler& s, uint64_t off, std::span<const std::byte> data);
  Task<Status> Read(Scheduler& s, uint64_t off, std::span<std::byte> out);
  Task<Status> Write(Scheduler& s, uint64_t off, std::span<const std::byte> data);
  Task<Status> Refresh(Scheduler& s);
  void Loop();
};

Task<Status> TieredClient::Impl::ReadRun(Scheduler& s, uint64_t off, uint8_t* dst, size_t len) {
  Add(c.one_sided_reads);
  Status st = co_await s.read(RemoteRef{peer, wire.data_key, off}, dst, len);
  co_return st.WithContext("one-sided tier read [" + N(off) + ", +" + N(len) + ")");
}

Task<Status> TieredClient::Impl::ReadChunk(Scheduler& s, uint64_t off, std::byte* out, size_t len) {
  const uint64_t first_page = off / tw::kPageSize;
  const uint64_t pages = tw::PagesSpanned(off, len);
  const uint64_t end = off + len;
  std::vector<uint64_t> missing(tw::MaskWords(pages), 0);
  std::vector<uint64_t> copy;  // the widened range, one-sided (8-byte aligned buffer)
  std::vector<uint64_t> by_pattern(missing.size(), 0);
  const uint64_t woff = off & ~uint64_t{7};
  const uint64_t wend = (end + 7) & ~uint64_t{7};
  auto* cp = static_cast<uint8_t*>(nullptr);

  if (!info.one_sided) {
    for (uint64_t i = 0; i < pages; ++i) SetBit(missing, i);
  } else {
    // Pages worth a one-sided copy: those the last bitmap pull marks resident (all in modes
    // without the bitmap). The widened range has the same pages (pages are 8-byte multiples).
    std::vector<uint64_t> candidates(missing.size(), ~uint64_t{0});
    if (info.bitmap) {
      std::shared_lock lock(bitmap_mu);
      auto r = tw::ResidentPagesOf(bitmap, woff, wend - woff);
      if (!r.ok()) co_return r.status();
      candidates = std::move(*r);
    }
    copy.resize((wend - woff) / 8);
    cp = reinterpret_cast<uint8_t*>(copy.data());
    struct Run {
      uint64_t lo, hi;  // widened bytes
    };
    std::vector<Run> runs;
    for (uint64_t i = 0; i < pages;) {
      if (!MaskBit(candidates, i)) {
        SetBit(missing, i);
        Add(c.bitmap_skips);
        ++i;
        continue;
      }
      uint64_t j = i;
      while (j < pages && MaskBit(candidates, j)) ++j;
      runs.push_back({std::max(woff, (first_page + i) * tw::kPageSize),
                      std::min(wend, (first_page + j) * tw::kPageSize)});
      i = j;
    }
    if (!runs.empty()) {
      std::vector<Task<Status>> tasks;
      for (const Run& r : runs) tasks.push_back(ReadRun(s, r.lo, cp + (r.lo - woff), r.hi - r.lo));
      FARMEM_CO_RETURN_IF_ERROR(co_await RunAll(s, std::move(tasks), nullptr));
      for (const Run& r : runs) {
        // A page part is missing if ANY of its aligned words is the pattern (tier_layout.h).
        auto found = tw::FindMissingPages(r.lo, {cp + (r.lo - woff), r.hi - r.lo}, wire.magic_word);
        if (!found.ok()) co_return found.status();
        const uint64_t base = r.lo / tw::kPageSize - first_page;
        const uint64_t n = tw::PagesSpanned(r.lo, r.hi - r.lo);
        for (uint64_t k = 0; k < n; ++k) {
          if (MaskBit(*found, k)) {
            SetBit(missing, base + k);
            SetBit(by_pattern, base + k);
            Add(c.pattern_misses);
          } else {
            Add(c.one_sided_hits);
          }
        }
      }
    }
  }

  bool any_missing = false;
  for (uint64_t w : missing) any_missing |= w != 0;
  std::vector<std::byte> reply;
  if (any_missing) {
    // ONE sparse fetch of every missing page; the reply is their parts of [off, end), in order.
    const uint64_t want = tw::TierReadReplyBytes(off, len, missing);
    reply.resize(want);
    const std::vector<std::byte> req =
        tw::EncodeTierReadRequest(off, static_cast<uint32_t>(len), missing);
    Add(c.rpc_reads);
    auto r = co_await CallRpc(s, peer, tw::kOpTierRead, req, reply,
                              "TIER_READ [" + N(off) + ", +" + N(len) + ")");
    if (!r.ok()) co_return r.status();
    if (r->size() != want) {
      co_return Status::Protocol("TIER_READ reply has " + N(r->size()) + " bytes, expected " +
                                 N(want));
    }
    Add(c.rpc_read_bytes, want);
  }
  // Assemble: fetched pages from the reply (never checked for the pattern again: the server read
  // them), the others from the copy.
  uint64_t at = 0;
  for (uint64_t i = 0; i < pages; ++i) {
    const uint64_t lo = std::max(off, (first_page + i) * tw::kPageSize);
    const uint64_t hi = std::min(end, (first_page + i + 1) * tw::kPageSize);
    std::byte* dst = out + (lo - off);
    if (MaskBit(missing, i)) {
      const std::byte* src = reply.data() + at;
      if (MaskBit(by_pattern, i) && std::memcmp(src, cp + (lo - woff), hi - lo) == 0) {
        Add(c.false_positives);  // the data really is the pattern: one RPC, right bytes
      }
      std::memcpy(dst, src, hi - lo);
      at += hi - lo;
    } else {
      std::memcpy(dst, cp + (lo - woff), hi - lo);
    }
  }
  co_return Status::OK();
}

Task<Status> TieredClient::Impl::Read(Scheduler& s, uint64_t off, std::span<std::byte> out) {
  FARMEM_CO_RETURN_IF_ERROR(CheckIo(off, out.size(), "TieredClient::read"));
  Add(c.reads);
  Count(off, out.size());
  if (out.size() <= max_chunk) co_return co_await ReadChunk(s, off, out.data(), out.size());
  std::vector<Task<Status>> tasks;
  for (size_t at = 0; at < out.size(); at += max_chunk) {
    const size_t n = std::min<size_t>(max_chunk, out.size() - at);
    tasks.push_back(ReadChunk(s, off + at, out.data() + at, n));
  }
  co_return co_await RunAll(s, std::move(tasks), nullptr);
}

Task<Status> TieredClient::Impl::WriteChunk(Scheduler& s, uint64_t off,
                                            std::span<const std::byte> data) {
  const std::vector<std::byte> req = tw::EncodeTierWriteRequest(off, data);
  std::byte none[8];
  auto r = co_await CallRpc(s, peer, tw::kOpTierWrite, req, none,
                            "TIER_WRITE [" + N(off) + ", +" + N(data.size()) + ")");
  if (!r.ok()) co_return r.status();
  if (!r->empty()) co_return Status::Protocol("TIER_WRITE reply must be empty");
  Add(c.rpc_write_bytes, data.size());
  co_return Status::OK();
}

Task<Status> TieredClient::Impl::Write(Scheduler& s, uint64_t off,
                                       std::span<const std::byte> data) {
  FARMEM_CO_RETURN_IF_ERROR(CheckIo(off, data.size(), "TieredClient::write"));
  Add(c.writes);
  Count(off, data.size());
  if (data.size() <= max_chunk) co_return co_await WriteChunk(s, off, data);
  std::vector<Task<Status>> tasks;
  for (size_t at = 0; at < data.size(); at += max_chunk) {
    tasks.push_back(
        WriteChunk(s, off + at, data.subspan(at, std::min<size_t>(max_chunk, data.size() - at))));
  }
  co_return co_await RunAll(s, std::move(tasks), nullptr);
}

Task<Status> TieredClient::Impl::Refresh(Scheduler& s) {
  if (info.bitmap) {
    std::vector<uint64_t> fresh(wire.geometry.bitmap_words);
    FARMEM_CO_RETURN_IF_ERROR(
        (co_await s.read(RemoteRef{peer, wire.bitmap_key, 0}, fresh.data(), wire.bitmap_bytes))
            .WithContext("pulling the tier bitmap"));
    {
      std::unique_lock lock(bitmap_mu);
      bitmap.swap(fresh);
    }
    Add(c.bitmap_pulls);
  }
  if (counting) {
    std::vector<tw::TierCounterEntry> entries;
    for (uint64_t u = 0; u < info.unit_count; ++u) {
      const uint32_t n = counts[u].exchange(0, std::memory_order_relaxed);
      if (n != 0) entries.push_back({static_cast<uint32_t>(u), n});
    }
    const size_t per_rpc = (max_rpc - sizeof(tw::TierCountersHead)) / sizeof(tw::TierCounterEntry);
    for (size_t at = 0; at < entries.size(); at += per_rpc) {
      const auto part = std::span(entries).subspan(at, std::min(per_rpc, entries.size() - at));
      const std::vector<std::byte> req = tw::EncodeTierCounters(part);
      std::byte none[8];
      auto r = co_await CallRpc(s, peer, tw::kOpTierCounters, req, none, "TIER_COUNTERS");
      if (!r.ok()) co_return r.status();
      Add(c.counter_pushes);
    }
  }
  co_return Status::OK();
}

void TieredClient::Impl::Loop() {
  auto made = node->make_scheduler();
  if (!made.ok()) return;
  std::unique_ptr<Scheduler> sched = std::move(*made);
  // By default several refreshes per server period: a unit the period promoted is read
  // one-sidedly a quarter period later at most, not a whole one, and the counts of the
  // period's last quarter still reach it (docs/tier.md "Client").
  const auto period = options.period.count() > 0
                          ? options.period
                          : std::chrono::milliseconds(std::max<uint32_t>(
                                1, info.period_ms / TieredClientOptions::kRefreshesPerPeriod));
  std::unique_lock lock(thread_mu);
  while (!thread_cv.wait_for(lock, period, [this] { return stopping; })) {
    lock.unlock();
    {
      std::lock_guard r(refresh_mu);
      (void)sched->block_on(Refresh(*sched));  // a failed pull keeps the last bitmap
    }
    lock.lock();
  }
}

// ---- TieredClient ------------------------------------------------------------------------------

TieredClient::TieredClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TieredClient::~TieredClient() {
  {
    std::lock_guard lock(impl_->thread_mu);
    impl_->stopping = true;
  }
  impl_->thread_cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Result<std::unique_ptr<TieredClient>> TieredClient::Connect(Node& node, const std::string& server,
                                                            TieredClientOptions options) {
  if (options.period.count() < 0) {
    return Status::InvalidArgument("TieredClient: period must be >= 0");
  }
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.node = &node;
  m.address = server;
  m.options = options;
  m.max_rpc = node.config().transport.max_rpc_bytes;
  if (m.max_rpc < 2 * tw::kPageSize) {
    return Status::InvalidArgument("TieredClient: max_rpc_bytes must be at least 8192");
  }
  m.max_chunk =
      std::min<uint64_t>(tw::kMaxTierIoBytes, (m.max_rpc - 64) / tw::kPageSize * tw::kPageSize);
  m.blocking = std::make_unique<BlockingRunner>(node, "TieredClient");
  const std::string ctx = "connecting to farmemd tier at " + server;
  Result<PeerInfo> peer = node.connect(server);
  if (!peer.ok()) return peer.status().WithContext(ctx);
  m.peer = peer->id;
  std::vector<std::byte> reply(sizeof(tw::TierInfoReply) + 8);
  Result<std::span<const std::byte>> r = m.blocking->run([&](Scheduler& s) {
    return CallRpc(s, m.peer, tw::kOpTierInfo, {}, reply, ctx + ": TIER_INFO");
  });
  if (!r.ok()) return r.status();
  auto info = tw::DecodeTierInfoReply(*r);
  if (!info.ok()) return info.status().WithContext(ctx);
  m.wire = *info;
  const auto mode = static_cast<tw::TierWireMode>(m.wire.mode);
  m.info.capacity = m.wire.geometry.capacity;
  m.info.unit_size = m.wire.geometry.unit_size;
  m.info.unit_count = m.wire.geometry.unit_count;
  m.info.page_size = tw::kPageSize;
  m.info.period_ms = m.wire.period_ms;
  m.info.mode = ModeName(m.wire.mode);
  m.info.one_sided = mode >= tw::TierWireMode::kTiering && !options.rpc_only &&
                     TrustsOneSidedCopies(node.transport().name(), *peer) && m.wire.data_key != 0;
  m.info.bitmap = m.info.one_sided && mode == tw::TierWireMode::kFull;
  m.counting = mode >= tw::TierWireMode::kHotspot;
  m.counts = std::make_unique<std::atomic<uint32_t>[]>(m.counting ? m.info.unit_count : 0);
  m.bitmap.assign(m.wire.geometry.bitmap_words, 0);
  std::unique_ptr<TieredClient> client(new TieredClient(std::move(impl)));
  FARMEM_RETURN_IF_ERROR(client->refresh().WithContext(ctx));
  if (client->impl_->info.bitmap || client->impl_->counting) {
    client->impl_->thread = std::thread([m = client->impl_.get()] { m->Loop(); });
  }
  return client;
}

const TierRegionInfo& TieredClient::info() const {
  return impl_->info;
}

TieredClientStats TieredClient::stats() const {
  const auto& c = impl_->c;
  auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  TieredClientStats s;
  s.reads = ld(c.reads);
  s.writes = ld(c.writes);
  s.one_sided_reads = ld(c.one_sided_reads);
  s.one_sided_hits = ld(c.one_sided_hits);
  s.bitmap_skips = ld(c.bitmap_skips);
  s.pattern_misses = ld(c.pattern_misses);
  s.false_positives = ld(c.false_positives);
  s.rpc_reads = ld(c.rpc_reads);
  s.rpc_read_bytes = ld(c.rpc_read_bytes);
  s.rpc_write_bytes = ld(c.rpc_write_bytes);
  s.bitmap_pulls = ld(c.bitmap_pulls);
  s.counter_pushes = ld(c.counter_pushes);
  return s;
}

Task<Status> TieredClient::read(Scheduler& sched, uint64_t offset, std::span<std::byte> out) {
  return impl_->Read(sched, offset, out);
}

Task<Status> TieredClient::write(Scheduler& sched, uint64_t offset,
                                 std::span<const std::byte> data) {
  return impl_->Write(sched, offset, data);
}

Task<Status> TieredClient::read_batch(Scheduler& sched, std::span<TierReadOp> ops) {
  std::vector<Task<Status>> tasks;
  for (TierReadOp& op : ops) tasks.push_back(impl_->Read(sched, op.offset, op.out));
  std::vector<Status> each;
  Status first = co_await RunAll(sched, std::move(tasks), &each);
  for (size_t i = 0; i < ops.size(); ++i) ops[i].status = each[i];
  co_return first;
}

Task<Status> TieredClient::write_batch(Scheduler& sched, std::span<TierWriteOp> ops) {
  std::vector<Task<Status>> tasks;
  for (TierWriteOp& op : ops) tasks.push_back(impl_->Write(sched, op.offset, op.data));
  std::vector<Status> each;
  Status first = co_await RunAll(sched, std::move(tasks), &each);
  for (size_t i = 0; i < ops.size(); ++i) ops[i].status = each[i];
  co_return first;
}

Status TieredClient::read(uint64_t offset, std::span<std::byte> out) {
  return impl_->blocking->run([&](Scheduler& s) { return read(s, offset, out); });
}
Status TieredClient::write(uint64_t offset, std::span<const std::byte> data) {
  return impl_->blocking->run([&](Scheduler& s) { return write(s, offset, data); });
}
Status TieredClient::read_batch(std::span<TierReadOp> ops) {
  return impl_->blocking->run([&](Scheduler& s) { return read_batch(s, ops); });
}
Status TieredClient::write_batch(std::span<TierWriteOp> ops) {
  return impl_->blocking->run([&](Scheduler& s) { return write_batch(s, ops); });
}

Status TieredClient::refresh() {
  std::lock_guard lock(impl_->refresh_mu);
  return impl_->blocking->run([&](Scheduler& s) { return impl_->Refresh(s); });
}

}  // namespace farmem
