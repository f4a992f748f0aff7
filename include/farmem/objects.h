// farmem objects (CoRM): a remote object store whose memory farmemd compacts while clients keep
// reading objects one-sidedly. 128-bit pointers, RPC alloc/free/read/write, one-sided
// direct_read with consistency checks, scan_read and pointer correction. See docs/objects.md.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "farmem/coro.h"
#include "farmem/node.h"
#include "farmem/session.h"
#include "farmem/status.h"

namespace farmem {

// A pointer to a remote object (128 bits, trivially copyable, safe to store anywhere).
// `offset` addresses the object's slot inside the server's object region: its home virtual block
// plus the last known offset inside that block. Compaction may move the object inside its block
// (never out of it, as far as the pointer is concerned): the client then corrects `offset` in
// place. The region key is not in the pointer: `server` indexes the client's server table, which
// holds the key learned at connect time.
// `id` and `gen` name the allocation: a copy of a pointer whose object was freed (or re-homed by
// release_ptr) never reaches the object allocated next in the same slot (docs/objects.md,
// "Pointer identity"). `gen` took the bits of the former version hint and of the upper half of
// the size class (classes fit in 7 bits).
struct Ptr {
  uint64_t offset = 0;     // slot offset inside the server's object region
  uint16_t id = 0;         // object ID (0 in offset-only size classes; a merge may re-draw it)
  uint16_t gen = 0;        // generation: which allocation of the slot this pointer names
  uint16_t server = 0;     // index into ObjectClient's server table
  uint8_t size_class = 0;  // server's size class index
  uint8_t flags = 0;       // kPtrValid when the pointer came from alloc(); kPtrPersistent

  static constexpr uint8_t kPtrValid = 1;
  // Allocated Lifetime::kPersistent: the object survives the client (client-side only, never
  // sent; the server keeps the owner itself).
  static constexpr uint8_t kPtrPersistent = 2;
  bool valid() const { return (flags & kPtrValid) != 0; }
  bool persistent() const { return (flags & kPtrPersistent) != 0; }
  bool operator==(const Ptr&) const = default;
};
static_assert(sizeof(Ptr) == 16, "Ptr is a 128-bit pointer");

// How a pointer whose object moved is corrected.
enum class Correction : uint8_t {
  kAskOwner = 0,  // RPC: the server looks the ID up in the block's metadata
  kScan = 1,      // one-sided read of the whole home block, find the slot with the ID
};

// How direct_read and scan_read validate a one-sided copy of a slot (docs/objects.md, "Client
// API"). The version bytes (corm::CheckSlot) prove a copy consistent only if the transport copied
// the slot in ascending address order with aligned 8-byte loads; only the native TCP backend
// guarantees that (docs/transport.md, "Copy order of one-sided reads").
enum class ReadValidation : uint8_t {
  // Per server: kVersions if the node's transport is native TCP ("tcp"), otherwise
  // kVersionsAndHeaderRecheck.
  kAuto = 0,
  // CheckSlot on one copy: one round trip. Sound only for ordered word copies.
  kVersions = 1,
  // Seqlock: read the header word, copy the slot, read the header word again, each after the
  // previous one completed; accept only if both reads equal the copy's header (unlocked, same
  // version, ID and home) and CheckSlot passes. Sound for any copy order; two more (8-byte)
  // round trips per direct_read, one more slot copy plus one header read per scan_read.
  kVersionsAndHeaderRecheck = 2,
};

// How the server picks the worker (thread allocator) that serves an allocation.
enum class WorkerSelection : uint8_t { kByConnection = 0, kRandom = 1 };

struct ObjectClientOptions {
  // Pointer correction used by read_any() (and direct_read() callers that ask for a fix).
  Correction correction = Correction::kScan;
  // direct_read retries a torn or locked copy with exponential backoff for at most this long
  // (counted from the first retry).
  std::chrono::milliseconds retry_budget{2000};
  std::chrono::microseconds max_backoff{256};
  // How one-sided copies are validated (see ReadValidation).
  ReadValidation validation = ReadValidation::kAuto;
  // Session lease asked of each server (docs/sessions.md): objects allocated with
  // Lifetime::kSession are freed this long after the client's last keepalive (it died or
  // stalled), or at once when the client is destroyed. Granted within [1 s, --session-ttl-max].
  std::chrono::milliseconds session_ttl{10000};
  // false: no sessions (tools that only read STAT or compact); Lifetime::kSession allocations
  // then fail with FailedPrecondition, persistent ones work.
  bool open_session = true;
  // This process's cluster member name (Cluster::join), if any: a farmemd running with --cluster
  // then ends the sessions as soon as the membership expires (docs/sessions.md).
  std::string cluster_member;
};

// What the server tells a client at connect time (OBJ_INFO).
struct ObjectServerInfo {
  std::string name;            // node name
  RegionKey region_key = 0;    // key of the object region
  uint64_t region_length = 0;  // bytes
  uint32_t block_size = 0;     // base block, bytes: every class's block is a multiple
  uint32_t id_bits = 0;        // 0, 8, 12 or 16
  bool hybrid = false;
  struct SizeClass {
    uint32_t slot_size = 0;         // bytes, a multiple of 8
    uint32_t payload_capacity = 0;  // largest object of the class
    uint32_t id_mask = 0;           // 0: offset-only class (objects never move)
    // Bytes of each block of the class: block_bytes / slot_size slots; a power of two aligned to
    // itself when it holds several slots, else the slot rounded up to base blocks.
    uint32_t block_bytes = 0;
    uint32_t slots_per_block = 0;  // block_bytes / slot_size (>= 1)
  };
  std::vector<SizeClass> classes;
  uint32_t max_object_size() const { return classes.empty() ? 0 : classes.back().payload_capacity; }
};

// Counters of one client (all servers, all schedulers).
struct ObjectClientStats {
  uint64_t direct_reads = 0;  // direct_read calls
  uint64_t direct_ok = 0;     // ... that returned data from their first location
  uint64_t torn_retries = 0;  // copies rejected as torn (mixed versions)
  uint64_t locked_retries = 0;
  uint64_t moved = 0;        // ID mismatch or freed slot seen at the pointer's address
  uint64_t scans = 0;        // scan_read block reads
  uint64_t corrections = 0;  // pointers corrected in place
  uint64_t rpc_reads = 0;
  uint64_t header_rechecks = 0;   // copies validated by the header recheck (seqlock)
  uint64_t recheck_failures = 0;  // ... rejected because a header read before or after the
                                  // copy differed from the copy's header (retried)
};

struct CompactResult {
  uint32_t merges = 0;  // blocks merged away in this round
  // The server stopped the round at its time budget (1 s of paced merging): ask again.
  bool partial = false;
  // The server's compaction counters after the round (the STAT "compaction" section: rounds,
  // compactions, objects_relocated, ...) as JSON object text; "{}" if the server sent none.
  std::string stats_json = "{}";
};

// Client of one or more farmemd object stores. Thread-safe: any number of threads may call it,
// each with its own Scheduler (coroutine versions) or through the blocking versions, which share
// one internal scheduler (one call at a time).
class ObjectClient {
 public:
  static constexpr uint16_t kAnyServer = 0xffff;

  // Bootstrap handshake with each farmemd at "host:port" (token check), OBJ_INFO and
  // SESSION_OPEN (a background thread keeps the sessions alive). `node` must be started and
  // outlive the client.
  static Result<std::unique_ptr<ObjectClient>> Connect(Node& node,
                                                       std::span<const std::string> servers,
                                                       ObjectClientOptions options = {});
  // Closes the sessions: every server frees the Lifetime::kSession objects this client did not
  // free (each close bounded by the transport's operation timeout).
  ~ObjectClient();
  ObjectClient(const ObjectClient&) = delete;
  ObjectClient& operator=(const ObjectClient&) = delete;

  size_t server_count() const { return servers_.size(); }
  const ObjectServerInfo& server_info(uint16_t server) const;
  const ObjectClientOptions& options() const { return options_; }
  ObjectClientStats stats() const;
  // The sessions' counters (keepalives, leases lost and re-opened).
  SessionClientStats session_stats() const;

  // ---- Coroutine API: many calls may be in flight on one scheduler --------------------------
  // Allocates a zero-filled object of `size` bytes (1..max_object_size) on `server`
  // (kAnyServer: round robin). Lifetime::kSession (default): freed by the server when this
  // client's session ends; kPersistent: lives until freed (Ptr::persistent()).
  Task<Result<Ptr>> alloc(Scheduler& sched, size_t size, uint16_t server = kAnyServer,
                          Lifetime lifetime = Lifetime::kSession);
  // Frees the object; `p` is invalidated. Freeing twice is NotFound.
  Task<Status> free(Scheduler& sched, Ptr& p);
  // RPC read: copies min(out.size(), object capacity) bytes; corrects p. Returns bytes copied.
  Task<Result<size_t>> read(Scheduler& sched, Ptr& p, std::span<std::byte> out);
  // RPC write: replaces the object's bytes (data.size() <= capacity; the rest becomes zero).
  Task<Status> write(Scheduler& sched, Ptr& p, std::span<const std::byte> data);
  // One-sided read of the slot at p; verifies the ID, lock/compaction bits and every version
  // byte, retrying torn or locked copies with backoff. Returns Code::kMoved when the slot holds
  // another object or none (p is left unchanged: correct it with scan_read or read_any).
  Task<Result<size_t>> direct_read(Scheduler& sched, Ptr& p, std::span<std::byte> out);
  // Reads the whole home block one-sidedly, finds the object by ID, corrects p, returns its bytes.
  // A scan that misses the object asks the server (LOCATE) before NotFound is returned: the
  // object may have a new ID that a merge re-drew (p.id is then corrected too).
  Task<Result<size_t>> scan_read(Scheduler& sched, Ptr& p, std::span<std::byte> out);
  // direct_read, then on kMoved correct the pointer (options().correction) and read again. A scan
  // that misses the object is confirmed by asking the server before NotFound is returned. The
  // correction may change p.id (an ID re-drawn by a merge), never p.gen or the home block.
  Task<Result<size_t>> read_any(Scheduler& sched, Ptr& p, std::span<std::byte> out);
  // Declares p's old address dead so the server can reuse its virtual block; p is re-homed.
  Task<Status> release_ptr(Scheduler& sched, Ptr& p);
  // Pointer correction by RPC (ask the owning thread) without reading the object.
  Task<Status> locate(Scheduler& sched, Ptr& p);
  // Admin: one compaction round on `server` (all classes, or only `size_class`).
  Task<Result<CompactResult>> compact(Scheduler& sched, uint16_t server,
                                      std::optional<uint16_t> size_class = std::nullopt);
  // The server's STAT document as JSON text (an object; includes the "objects" section).
  Task<Result<std::string>> stats_json(Scheduler& sched, uint16_t server);

  // ---- Blocking versions (same semantics) ---------------------------------------------------
  Result<Ptr> alloc(size_t size, uint16_t server = kAnyServer,
                    Lifetime lifetime = Lifetime::kSession);
  Status free(Ptr& p);
  Result<size_t> read(Ptr& p, std::span<std::byte> out);
  Status write(Ptr& p, std::span<const std::byte> data);
  Result<size_t> direct_read(Ptr& p, std::span<std::byte> out);
  Result<size_t> scan_read(Ptr& p, std::span<std::byte> out);
  Result<size_t> read_any(Ptr& p, std::span<std::byte> out);
  Status release_ptr(Ptr& p);
  Status locate(Ptr& p);
  Result<CompactResult> compact(uint16_t server, std::optional<uint16_t> size_class = {});
  Result<std::string> stats_json(uint16_t server);

  struct Impl;

 private:
  ObjectClient(Node& node, ObjectClientOptions options);

  Node& node_;
  ObjectClientOptions options_;
  std::vector<ObjectServerInfo> servers_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace farmem
