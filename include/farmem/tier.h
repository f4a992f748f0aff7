// farmem tiered memory (TeRM): a remote region larger than the server's DRAM, backed by a file on
// SSD, read one-sidedly where it is resident. TieredClient reads and writes any range; see
// docs/tier.md ("Client"). Thread-safe: any thread may call it, each with its own Scheduler.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "farmem/coro.h"
#include "farmem/node.h"
#include "farmem/status.h"

namespace farmem {

// What TIER_INFO told about the region.
struct TierRegionInfo {
  uint64_t capacity = 0;   // bytes
  uint64_t unit_size = 0;  // promotion granule
  uint64_t unit_count = 0;
  uint64_t page_size = 4096;
  uint32_t period_ms = 0;
  std::string mode;        // rpc | rpc-direct | tiering | hotspot | full
  bool one_sided = false;  // this client reads resident pages one-sidedly
  bool bitmap = false;     // ... and skips cold pages with the pulled bitmap
};

struct TieredClientOptions {
  // Read only by RPC even where the mode and the transport allow one-sided reads.
  bool rpc_only = false;
  // Bitmap pulls and counter pushes; 0 = the server's period / kRefreshesPerPeriod.
  std::chrono::milliseconds period{0};
  static constexpr uint32_t kRefreshesPerPeriod = 4;
};

// Relaxed counters of one client.
struct TieredClientStats {
  uint64_t reads = 0;  // read calls (a batch counts each op)
  uint64_t writes = 0;
  uint64_t one_sided_reads = 0;  // one-sided copies issued
  uint64_t one_sided_hits = 0;   // pages taken from a one-sided copy
  uint64_t bitmap_skips = 0;     // pages the bitmap marked cold, fetched without a copy
  uint64_t pattern_misses = 0;   // pages whose copy held a pattern word, fetched by RPC
  uint64_t false_positives = 0;  // ... whose fetched bytes equalled the copy (real pattern data)
  uint64_t rpc_reads = 0;        // TIER_READ calls
  uint64_t rpc_read_bytes = 0;   // bytes they returned
  uint64_t rpc_write_bytes = 0;  // bytes TIER_WRITE sent
  uint64_t bitmap_pulls = 0;
  uint64_t counter_pushes = 0;
};

// One operation of a batch: [offset, offset + buffer size) read into / written from `data`.
struct TierReadOp {
  uint64_t offset = 0;
  std::span<std::byte> out;
  Status status;  // set by read_batch
};
struct TierWriteOp {
  uint64_t offset = 0;
  std::span<const std::byte> data;
  Status status;  // set by write_batch
};

class TieredClient {
 public:
  // Largest read or write (any offset, unaligned, across pages and units).
  static constexpr size_t kMaxIoBytes = size_t{1} << 20;

  // Bootstrap handshake with farmemd at "host:port", TIER_INFO, first bitmap pull; starts a
  // background thread that pulls the bitmap and pushes access counters (by default four times a
  // server period). `node` must
  // be started and outlive the client.
  static Result<std::unique_ptr<TieredClient>> Connect(Node& node, const std::string& server,
                                                       TieredClientOptions options = {});
  ~TieredClient();
  TieredClient(const TieredClient&) = delete;
  TieredClient& operator=(const TieredClient&) = delete;

  const TierRegionInfo& info() const;
  TieredClientStats stats() const;

  // ---- Coroutine API: many calls may be in flight on one scheduler --------------------------
  // InvalidArgument for 0 or more than kMaxIoBytes bytes, OutOfRange outside the region.
  Task<Status> read(Scheduler& sched, uint64_t offset, std::span<std::byte> out);
  Task<Status> write(Scheduler& sched, uint64_t offset, std::span<const std::byte> data);
  // Every op in flight at once; each op's status is set; returns the first error.
  Task<Status> read_batch(Scheduler& sched, std::span<TierReadOp> ops);
  Task<Status> write_batch(Scheduler& sched, std::span<TierWriteOp> ops);

  // ---- Blocking versions (same semantics; one call at a time per client) ---------------------
  Status read(uint64_t offset, std::span<std::byte> out);
  Status write(uint64_t offset, std::span<const std::byte> data);
  Status read_batch(std::span<TierReadOp> ops);
  Status write_batch(std::span<TierWriteOp> ops);

  // Pulls the bitmap and pushes the counters now (what the background thread does each period).
  Status refresh();

  struct Impl;

 private:
  explicit TieredClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace farmem
