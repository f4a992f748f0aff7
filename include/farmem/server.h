// MemoryServer: the farmemd memory service as a library. A Node running a set of services —
// "pools" (memfd-backed raw pools: ALLOC_RAW / FREE_RAW), "objects" (the CoRM object store) — and
// STAT; used by the farmemd binary, `farmem serve` and the in-process `farmem demo`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "farmem/node.h"
#include "farmem/objects.h"
#include "farmem/status.h"

namespace farmem {

// The CoRM object store of a memory server (docs/objects.md, docs/server.md "Objects").
struct ObjectsConfig {
  bool enabled = true;
  // Block geometry (docs/objects.md, "Block geometry"): the base block (power of two, 4 KiB ..
  // 1 MiB: the unit of the region's addresses and remaps), the largest block a class of many
  // slots may get (power of two, base .. 1 MiB; 0 = max(64 KiB, block_size)), and the slots a
  // class's block should hold at least (1..65536).
  uint32_t block_size = 4096;
  uint32_t max_block_size = 0;
  uint32_t min_slots_per_block = 16;
  int id_bits = 16;  // 0, 8, 12 or 16
  // Classes with more slots per block than 2^id_bits become offset-only (true) or use only
  // 2^id_bits slots per block (false).
  bool hybrid = true;
  uint32_t workers = 0;  // thread allocators; 0 = node.rpc_workers
  WorkerSelection worker_selection = WorkerSelection::kByConnection;
  // How READ/WRITE/LOCATE find an object that compaction moved inside its block.
  Correction correction = Correction::kAskOwner;
  // Virtual range exported as "objects"; 0 = 2 x memory_bytes (aliases left by compaction and
  // released blocks in quarantine hold virtual blocks without memory; untouched range is free).
  uint64_t reserve_bytes = 0;
  uint64_t max_physical_bytes = 0;  // memfd pages the store may hold; 0 = memory_bytes
  struct Compaction {
    double threshold = 0.3;      // a class is compacted when 1 - live/capacity exceeds this
    uint32_t interval_ms = 100;  // leader thread period; 0 = no leader (only COMPACT RPCs and
                                 // allocation failures compact)
    uint32_t max_merges_per_round = 64;
    // Pace of threshold and COMPACT rounds (allocation failures are never paced); 0 = unpaced.
    uint32_t max_merges_per_second = 500;
  } compaction;
};

// Client sessions (docs/sessions.md): allocations a client makes are freed when its session
// ends, unless allocated persistent.
struct SessionsConfig {
  uint32_t max_sessions = 4096;   // 1..65535 (--max-sessions)
  uint32_t ttl_max_seconds = 60;  // 1..3600: longest lease granted (--session-ttl-max)
};

// The ablation ladder of the tiered region (docs/tier.md "Modes"): what the service and its
// clients do, from every read by RPC to one-sided reads with counters and the page bitmap.
enum class TierMode : uint8_t { kRpc, kRpcDirect, kTiering, kHotspot, kFull };

// A TeRM tiered region (docs/tier.md): `capacity_bytes` of memory backed by `file`, at most
// `dram_bytes` of it resident. The service runs only when `file` is set (--tier-file).
struct TierConfig {
  std::string file;             // backing file (not on tmpfs); empty = no tier service
  uint64_t capacity_bytes = 0;  // --tier-capacity-mib
  uint64_t dram_bytes = 0;      // --tier-dram-mib (the exact DRAM budget)
  uint32_t unit_kib = 64;       // --tier-unit-kib: promotion granule, power of two
  uint32_t period_ms = 1000;    // --tier-period-ms: hotspot period, bitmap pulls, counters
  uint32_t fill_percent = 95;   // --tier-fill-pct: share of the budget a period fills
  // --tier-fill-free on|off: modes hotspot and full also fill that share with units nobody has
  // counted yet (docs/tier.md "Filling free frames"), in at most half of each period.
  bool fill_free_frames = true;
  // Hotspot policy (docs/tier.md "Hotspot policy"; the engine's TierOptions defaults):
  uint32_t heat_keep_percent = 88;    // --tier-heat-keep-pct: heat kept per period, 0..99
  uint32_t hysteresis_percent = 100;  // --tier-hysteresis-pct: resident bonus at the cut
  bool direct_io = true;              // --tier-direct-io on|off (rpc / rpc-direct override it)
  bool cached_reads = false;          // --tier-cached-reads on|off: RWF_NOWAIT buffered try first
  TierMode mode = TierMode::kFull;
};

// Storm transaction tables served by this farmemd (docs/tx.md "Service"): each entry of `tables`
// is NAME:KEY_BYTES:VALUE_BYTES:BUCKETS[:WIDTH]; this server holds partition `partition` of
// `partitions` of every table.
struct TxConfig {
  std::vector<std::string> tables;
  uint32_t partition = 0;
  uint32_t partitions = 1;
  uint32_t lease_ms = 50;          // longest lock lease granted; the reaper runs every lease/2
  uint32_t overflow_percent = 25;  // overflow buckets per table, % of BUCKETS (at least 1)
};

struct ServerConfig {
  NodeConfig node;
  // Services to run, by name, in start order; empty = every service this build contains
  // (farmemd --services; "pools", "objects").
  std::vector<std::string> services;
  // Memory budget: one virtual reservation of this size; pools are carved from it on demand.
  uint64_t memory_bytes = 256ull << 20;
  // Size of each pool (one memfd file, one registered region). A multiple of the page size.
  uint64_t pool_bytes = 16ull << 20;
  // The object store. Its physical memory is a budget of its own (objects.max_physical_bytes),
  // separate from the raw pools' memory_bytes.
  ObjectsConfig objects;
  SessionsConfig sessions;
  TierConfig tier;
  TxConfig tx;
};

// Checks `config.objects` against the rest of `config`; InvalidArgument names the bad key.
Status ValidateObjectsConfig(const ServerConfig& config);
// Checks the service list (known names, no repeats) and every chosen service's settings.
Status ValidateServerConfig(const ServerConfig& config);

class MemoryServer {
 public:
  // Validates the configuration, reserves the address space and creates the Node (not started).
  static Result<std::unique_ptr<MemoryServer>> Create(const ServerConfig& config);
  ~MemoryServer();
  MemoryServer(const MemoryServer&) = delete;
  MemoryServer& operator=(const MemoryServer&) = delete;

  // Registers the RPC handlers and starts the node (transport, workers, bootstrap listener).
  Status start();
  // Stops accepting, lets running handlers finish, stops the node. Idempotent; run by the
  // destructor too. Pools are unmapped when the server is destroyed.
  void stop();

  // The STAT document as JSON text (also what the STAT RPC returns); keys in docs/server.md.
  std::string stats_json() const;
  // The same figures as Prometheus text exposition (what GET /metrics serves).
  std::string metrics_text() const;
  // Adds (or replaces; an empty function removes) a top-level key of the STAT document for a part
  // of the process that is not a service (farmemd adds "cluster"): `json_text` runs on every STAT,
  // on any thread, and returns a JSON value as text (text that is not JSON shows as a string). It
  // must stay callable until it is removed or the server is destroyed.
  void set_stats_section(std::string key, std::function<std::string()> json_text);
  // Ends the client sessions opened as cluster member `member` (its membership lease expired;
  // farmemd --cluster calls it from its member watch): their session allocations are freed.
  // Returns how many ended. Any thread.
  size_t end_member_sessions(std::string_view member);
  // Names of the services running, in start order.
  std::vector<std::string> services() const;

  Node& node();
  const ServerConfig& config() const;

  struct Impl;

 private:
  explicit MemoryServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace farmem
