// TxTable: one partition of a Storm hash table in one page-aligned region, and the owner-side
// operations the transaction RPC handlers will call (lookup, lock, validate, commit, insert,
// remove, unlock, reap). Thread-safe: any number of owner threads call it at once while one-sided
// readers copy the region at any moment without a lock. Layout and reader check: tx_layout.h.
//
// Data structures:
//   region_    mmap'd, page-aligned, RegionBytes(g) long: table header, main buckets, overflow
//              buckets (tx_layout.h). Registered with a transport later, as is.
//   stripes_   mutexes; a main bucket and its whole overflow chain are guarded by the stripe
//              `bucket % stripes`. Every change of an item is made under its chain's stripe,
//              following the writer protocol of tx_layout.h (seq odd while changing), with
//              aligned atomic stores; owner threads read items under the stripe, readers of the
//              region (one-sided copies) without any lock.
//   overflow_used_  overflow buckets handed out so far (a CAS counter; buckets are never given
//              back: a chain keeps its buckets, emptied slots are reused).
//   lock_candidates_  (main bucket, item offset) of every item whose lock word may be non-zero:
//              appended when a lock is taken over a zero lock word, dropped by the reaper once it
//              finds the word zero. Invariant: an item with a non-zero lock word is listed (or is
//              in the batch ReapExpired is working through). The reaper visits only these — a
//              scan of every bucket each lease/2 was a third of farmemd's CPU under TATP.
//              Guarded by lock_candidates_mu_, which is taken inside a stripe, never around one.
//
// Locks: an item's lock word holds the id of the transaction that locked it, its lease word the
// expiry (ns of options.now_ns, CLOCK_MONOTONIC by default). A lock whose lease has run out may be
// taken over by another transaction (LockForUpdate / LockForInsert), or freed by ReapExpired;
// a commit after the lease ran out is refused ("stale commit"), so a transaction whose owner
// decided to treat it as dead can never install values later.
//
// Errors: kAborted with a message starting with the reason ("locked", "exists", "validation",
// "stale commit", "not lock holder"; AbortReasonOf), kNotFound ("not found"),
// kResourceExhausted (chain cannot grow: overflow buckets used up), kInvalidArgument (key or
// value size, txid 0).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <vector>

#include "farmem/status.h"
#include "tx/format/tx_layout.h"

namespace farmem::tx {

// Test-only: each field removes one protection, so tests can show that they catch its absence
// (docs/tx.md, "Tests"). Never set outside tests.
struct TxTableFaults {
  bool no_odd_marking = false;  // changes skip writer steps 1-2 (no odd seq / tail while writing)
  // Locks become advisory: LockForUpdate takes a lock another live lease holds, and commits do
  // not check who holds the lock (nor its lease).
  bool no_lock_check = false;
  bool no_lease_check = false;  // commits by the lock holder are accepted after the lease ran out
  bool no_prepare_pin = false;  // PrepareAll checks but leaves the leases running (they expire)
  // Read by TxService, not the table (its tests build the service with these options):
  // a prepared participant forgets the outcome it applied (a peer asking it then gets "aborted"),
  bool no_learned_outcome = false;
  // and TX_PREPARE ignores a TX_STATUS fence (a prepare after "aborted" was answered succeeds).
  bool no_prepare_fence = false;
};

struct TxTableOptions {
  // Clock of the leases, in ns. Default: CLOCK_MONOTONIC (steady_clock).
  std::function<uint64_t()> now_ns;
  TxTableFaults faults;
  // Test-only: called in the middle of storing a value (after half of its words, rounded down),
  // with the item's offset, while the change is in progress and the stripe is held.
  std::function<void(uint64_t item_offset)> mid_value_hook;
};

// What an owner-side read returns (besides the value bytes).
struct ItemRead {
  uint64_t offset = 0;     // item offset in the region: the client's address cache entry
  uint64_t version = 0;    // OCC version at the time of the read
  uint64_t lock_txid = 0;  // lock holder at that time (0 = free)
};

enum class AbortReason : uint8_t {
  kNone,  // not an abort (OK or another error)
  kLocked,
  kExists,
  kValidation,
  kStaleCommit,
  kNotLockHolder,
};
// Reason of a kAborted status made by TxTable (from its message prefix).
AbortReason AbortReasonOf(const Status& st);

struct TxTableStats {
  uint64_t overflow_buckets_used = 0;
  uint64_t live_items = 0;  // counted by a scan under the stripes (owner side)
  uint64_t locked_items = 0;
};

class TxTable {
 public:
  // Maps the region and writes the table header. kInvalidArgument on a bad geometry.
  static Result<std::unique_ptr<TxTable>> Create(const TxGeometry& g, TxTableOptions options = {});
  ~TxTable();
  TxTable(const TxTable&) = delete;
  TxTable& operator=(const TxTable&) = delete;

  const TxGeometry& geometry() const { return g_; }
  // The region (to register with a transport, or for tests to copy like a one-sided reader).
  std::byte* region() const { return region_; }
  uint64_t region_bytes() const { return region_bytes_; }

  // Keys are exactly key_size bytes. `value_out`, when not empty, must hold value_size bytes.
  // Values given are at most value_size bytes (zero-padded).

  // The live item of `key`: offset, version, lock holder, value. kNotFound when absent.
  Result<ItemRead> Lookup(std::span<const std::byte> key, std::span<std::byte> value_out);

  // Read-for-update: locks the live item for `txid` until now + lease_ns and returns it. Already
  // held by txid: renews the lease. Held by another transaction with a live lease: kAborted
  // "locked"; with an expired lease: taken over. kNotFound when absent.
  Result<ItemRead> LockForUpdate(std::span<const std::byte> key, uint64_t txid, uint64_t lease_ns,
                                 std::span<std::byte> value_out);

  // Reserves a slot for inserting `key` (locked by txid, invisible to lookups until
  // CommitWrite). kAborted "exists" when the key is live, "locked" when another live reservation
  // holds it (an expired one is taken over), kResourceExhausted when the chain cannot grow.
  Result<uint64_t> LockForInsert(std::span<const std::byte> key, uint64_t txid, uint64_t lease_ns);

  // Owner-side validation: the live item still has `version` and no other transaction holds its
  // lock. kAborted "validation" otherwise (also when the item is gone).
  Status Validate(std::span<const std::byte> key, uint64_t version, uint64_t txid);

  // Installs `value` into the item txid locked (LockForUpdate or LockForInsert), bumps the
  // version, makes it live and unlocks it. Returns the new version. kAborted "stale commit"
  // when txid does not hold the lock (never took it, or another transaction took it over) or
  // its lease ran out (the lock is then released; an insert reservation is dropped).
  Result<uint64_t> CommitWrite(std::span<const std::byte> key, uint64_t txid,
                               std::span<const std::byte> value);
  // Removes the item txid locked with LockForUpdate: not live, version bumped, unlocked. Same
  // "stale commit" rules as CommitWrite.
  Status CommitRemove(std::span<const std::byte> key, uint64_t txid);

  // The per-participant commit: every item of `writes` (distinct keys) must be locked by txid
  // with a live lease; then all are installed (write: as CommitWrite; remove: as CommitRemove)
  // under all their stripes at once, so no reader or owner thread sees part of it. If any item
  // fails the check, nothing is installed, txid's locks on all of them are released and the
  // result is kAborted "stale commit". kInvalidArgument: duplicate key, bad sizes, txid 0, more
  // than kMaxCommitItems items.
  static constexpr size_t kMaxCommitItems = 64;
  struct TxWrite {
    std::span<const std::byte> key;
    bool remove = false;
    std::span<const std::byte> value;  // write only
  };
  Status CommitAll(uint64_t txid, std::span<const TxWrite> writes);

  // The prepare of a multi-participant commit: the same checks as CommitAll (and the same
  // refusal, releasing txid's locks), then every item's lease becomes kPinnedLease: the locks no
  // longer expire (no takeover, no reaping) until CommitAll or Unlock by txid ends them — a
  // prepared participant keeps its locks until the outcome is known (docs/tx.md).
  static constexpr uint64_t kPinnedLease = ~uint64_t{0};
  Status PrepareAll(uint64_t txid, std::span<const TxWrite> writes);

  // Abort: releases txid's lock on key (an insert reservation frees its slot). Changes no value
  // and no version. kAborted "not lock holder" when txid does not hold it (lock unchanged),
  // kNotFound when the key has no item.
  Status Unlock(std::span<const std::byte> key, uint64_t txid);

  // Non-transactional single-item operations (population, one-shot writes), atomic on their own.
  // Insert: kAborted "exists" / "locked"; Remove: kNotFound, kAborted "locked".
  Result<uint64_t> Insert(std::span<const std::byte> key, std::span<const std::byte> value);
  Status Remove(std::span<const std::byte> key);

  // Frees every lock whose lease ran out (the reaper's step). Returns how many. Visits only the
  // items listed in lock_candidates_ (cost: locks taken since the last call, not table size).
  uint64_t ReapExpired();
  // How many items the reaper would visit now (duplicates included): for tests of its bound.
  size_t LockCandidatesForTesting();

  TxTableStats Stats();

 private:
  TxTable(const TxGeometry& g, TxTableOptions options, std::byte* region, uint64_t bytes);

  struct Slot {
    uint64_t* words = nullptr;  // the item in the region
    uint64_t offset = 0;
  };
  // Search result inside one chain (stripe held).
  struct Found {
    Slot item;  // the key's item (live, or a reservation); words null when none
    Slot free;  // first reusable slot of the chain; words null when none
    uint64_t* last_bucket = nullptr;  // the chain's last bucket (to link a new one)
  };

  uint64_t Now() const;
  // CommitAll's and PrepareAll's common part: checks sizes and distinct keys, takes the items'
  // stripes (ascending, into *held) and checks that txid holds every lock with a live lease
  // (slots into *slots). On refusal releases txid's locks on all of them: "stale commit".
  Status Claim(uint64_t txid, std::span<const TxWrite> writes,
               std::vector<std::unique_lock<std::mutex>>* held, std::vector<Slot>* slots);
  // Whether `txid` may commit to `item` now (stripe held): it holds the lock, and its lease has
  // not run out. StaleCommit is the refusal ("stale commit: ..."; `where` names a batch item).
  enum class CommitRight : uint8_t { kHeld, kNotHeld, kLeaseRanOut };
  CommitRight RightOf(const Slot& item, uint64_t txid, uint64_t now) const;
  static Status StaleCommit(CommitRight right, uint64_t txid, std::string_view where);
  std::mutex& StripeOf(uint32_t bucket) { return stripes_[bucket % stripe_count_]; }
  Status CheckKey(std::span<const std::byte> key) const;
  Status CheckValue(std::span<const std::byte> value) const;
  uint32_t MainBucket(std::span<const std::byte> key) const;
  Found Search(uint32_t main_bucket, std::span<const std::byte> key, uint64_t now);
  // A free slot for a new item: the chain's `f.free`, or the first slot of a new overflow bucket
  // linked at the chain's end.
  Result<Slot> FreeSlot(const Found& f);
  // Writer protocol (tx_layout.h): Begin, then Store* of the changed words, then End.
  void Begin(const Slot& s);
  void Store(const Slot& s, uint32_t word, uint64_t value);
  void StoreValue(const Slot& s, std::span<const std::byte> value);
  void StoreKey(const Slot& s, std::span<const std::byte> key);
  void End(const Slot& s);
  static uint64_t Load(const Slot& s, uint32_t word);
  bool LockLive(const Slot& s, uint64_t now) const;
  ItemRead ReadItem(const Slot& s, std::span<std::byte> value_out) const;
  // Changes of a locked item (stripe held): install a value (live, version + 1, unlocked), remove
  // (not live, version + 1, unlocked), release the lock (nothing else changes).
  uint64_t InstallValue(const Slot& s, std::span<const std::byte> value);
  void RemoveItem(const Slot& s);
  void Release(const Slot& s);
  // Records that `s` (chain `main_bucket`, stripe held) gets a lock over a zero lock word.
  void NoteLocked(uint32_t main_bucket, const Slot& s);

  const TxGeometry g_;
  const TxTableOptions options_;
  std::byte* const region_;
  const uint64_t region_bytes_;
  const uint32_t stripe_count_;
  std::unique_ptr<std::mutex[]> stripes_;
  std::atomic<uint32_t> overflow_used_{0};
  std::mutex lock_candidates_mu_;
  std::vector<std::pair<uint32_t, uint64_t>> lock_candidates_;  // (main bucket, item offset)
};

}  // namespace farmem::tx
