// Storm hash-table partition layout (MICA-like, zero-copy), shared by the owner-side engine
// (src/tx/engine) and, later, clients doing one-sided reads: geometry, key hashing, the item and
// bucket layout, and the check a reader runs on a copy. Pure functions, any thread; the writer
// protocol is described here and implemented by TxTable (owner threads). Documented in docs/tx.md
// ("Layout"); keep in step.
//
// Data structures (all fields are little-endian 64-bit words at 8-aligned offsets, so every word
// can be loaded and stored as one aligned 64-bit atomic):
//   region   one table partition in one contiguous, page-aligned region:
//              [0, 64)            table header (TableHeader: magic, geometry, hash seed)
//              [64, ...)          num_buckets main buckets, then overflow_buckets overflow
//                                 buckets, each BucketBytes(g) long; the size is rounded up to
//                                 a page.
//   bucket   word 0: link = index of the next bucket of the chain + 1 (0 = end of chain). Set
//            once when the chain grows, never changed afterwards (chains never shrink).
//            then `width` item slots, each ItemBytes(g) long.
//   item     word 0        seq      copy-consistency counter: odd while the owner changes any
//                                   word of the item, +2 per change (lock, unlock, commit,
//                                   insert, remove). Never reset.
//            word 1        vword    bit 0: live (holds a committed key); bits 1..63: the OCC
//                                   version, +1 per commit / insert / remove, never reset, so a
//                                   delete + reinsert in the same slot has a new version.
//            word 2        lock     id of the transaction holding the lock; 0 = free
//            word 3        lease    lock lease expiry, ns of the owner's CLOCK_MONOTONIC (only
//                                   meaningful when lock != 0; the owner's own bookkeeping)
//            words 4..     key      key_size bytes (fixed per table, a multiple of 8)
//            then          value    value_size bytes (fixed per table, a multiple of 8)
//            last word     tail     copy of seq
//   A slot is free when !live and lock == 0; !live with lock != 0 is an insert reservation
//   (the key is written, the slot invisible to lookups until the insert commits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "farmem/status.h"
#include "farmem/tx_ds.h"

namespace farmem::tx {

inline constexpr uint64_t kWord = 8;
inline constexpr uint64_t kPageSize = 4096;
inline constexpr uint64_t kTableHeaderBytes = 64;
inline constexpr uint32_t kMinKeySize = 8;
inline constexpr uint32_t kMaxKeySize = 64;
inline constexpr uint32_t kMinValueSize = 8;
inline constexpr uint32_t kMaxValueSize = 4096;
inline constexpr uint32_t kMaxWidth = 64;
// A region larger than this is refused (overflow-safe size arithmetic below it).
inline constexpr uint64_t kMaxRegionBytes = uint64_t{1} << 40;

// Word indices inside an item.
namespace item {
inline constexpr uint32_t kSeq = 0;
inline constexpr uint32_t kVword = 1;
inline constexpr uint32_t kLock = 2;
inline constexpr uint32_t kLease = 3;
inline constexpr uint32_t kKey = 4;
// Words besides key and value: seq, vword, lock, lease, tail.
inline constexpr uint32_t kFixedWords = 5;
inline constexpr uint64_t kLiveBit = 1;
}  // namespace item

inline constexpr uint64_t PackVword(uint64_t version, bool live) {
  return (version << 1) | (live ? item::kLiveBit : 0);
}
inline constexpr uint64_t VersionOf(uint64_t vword) {
  return vword >> 1;
}
inline constexpr bool LiveOf(uint64_t vword) {
  return (vword & item::kLiveBit) != 0;
}
static_assert(VersionOf(PackVword(12345, true)) == 12345 && LiveOf(PackVword(7, true)));
static_assert(!LiveOf(PackVword(7, false)));

// Shape of one table partition. All partitions of a table share it except `partition`.
struct TxGeometry {
  uint32_t key_size = 8;            // bytes, multiple of 8, 8..64; keys are compared bytewise
  uint32_t value_size = 32;         // bytes, multiple of 8, 8..4096; shorter values are zero-padded
  uint32_t width = 4;               // item slots per bucket, 1..64
  uint32_t num_buckets = 1024;      // main buckets (hash targets), >= 1
  uint32_t overflow_buckets = 256;  // buckets for chains, taken on demand, never given back
  uint16_t partition = 0;           // this partition's number, < num_partitions
  uint16_t num_partitions = 1;      // partitions of the table (one per server)
  uint64_t hash_seed = 0;

  uint32_t key_words() const { return key_size / 8; }
  uint32_t value_words() const { return value_size / 8; }
};

// Checks every field's range and that the region fits kMaxRegionBytes.
Status ValidateGeometry(const TxGeometry& g);

inline constexpr uint64_t ItemWords(const TxGeometry& g) {
  return item::kFixedWords + g.key_size / 8 + g.value_size / 8;
}
inline constexpr uint64_t ItemBytes(const TxGeometry& g) {
  return ItemWords(g) * kWord;
}
inline constexpr uint64_t BucketBytes(const TxGeometry& g) {
  return kWord + g.width * ItemBytes(g);
}
inline constexpr uint64_t TotalBuckets(const TxGeometry& g) {
  return uint64_t{g.num_buckets} + g.overflow_buckets;
}
// Region length, rounded up to a page (valid geometry only).
inline constexpr uint64_t RegionBytes(const TxGeometry& g) {
  const uint64_t raw = kTableHeaderBytes + TotalBuckets(g) * BucketBytes(g);
  return (raw + kPageSize - 1) / kPageSize * kPageSize;
}
// Offsets inside the region. Bucket indices: main buckets 0..num_buckets-1, then overflow.
inline constexpr uint64_t BucketOffset(const TxGeometry& g, uint64_t bucket) {
  return kTableHeaderBytes + bucket * BucketBytes(g);
}
inline constexpr uint64_t ItemOffset(const TxGeometry& g, uint64_t bucket, uint32_t slot) {
  return BucketOffset(g, bucket) + kWord + slot * ItemBytes(g);
}
inline constexpr uint64_t ValueByteInItem(const TxGeometry& g) {
  return (item::kKey + g.key_size / 8) * kWord;
}
inline constexpr uint64_t TailByteInItem(const TxGeometry& g) {
  return ItemBytes(g) - kWord;
}
// True when `offset` is the start of an item slot inside the region: what a client checks before
// trusting a cached address (lookup_start), so a corrupted cache entry never reads elsewhere.
bool IsItemOffset(const TxGeometry& g, uint64_t offset);

// The table header at offset 0 (readable one-sidedly, so a client can check it talks to a table
// of the geometry it expects).
struct TableHeader {
  uint64_t magic;
  uint32_t format_version;
  uint32_t key_size;
  uint32_t value_size;
  uint32_t width;
  uint32_t num_buckets;
  uint32_t overflow_buckets;
  uint16_t partition;
  uint16_t num_partitions;
  uint32_t reserved0;
  uint64_t hash_seed;
  uint64_t reserved[2];
};
static_assert(sizeof(TableHeader) == kTableHeaderBytes);
static_assert(kTableHeaderBytes % 64 == 0, "buckets start on a cache line");
inline constexpr uint64_t kTableMagic = 0x31454c4241545846ull;  // "FXTABLE1"
inline constexpr uint32_t kFormatVersion = 1;

TableHeader EncodeTableHeader(const TxGeometry& g);
// Checks magic, format version and the geometry; kProtocol on a bad header.
Result<TxGeometry> DecodeTableHeader(std::span<const std::byte> bytes);

// ---- Keys ------------------------------------------------------------------------------------
// HashKey mixes the key's words (a 64-bit multiply-xorshift per word, murmur3's finalizer at the
// end); the high 32 bits pick the partition, the low 32 bits the main bucket (so the two are
// independent). Every client and owner computes the same placement.
uint64_t HashKey(std::span<const std::byte> key, uint64_t seed);
struct KeyPlace {
  uint32_t partition;
  uint32_t bucket;
};
inline KeyPlace PlaceKey(const TxGeometry& g, uint64_t hash) {
  return {static_cast<uint32_t>((hash >> 32) % g.num_partitions),
          static_cast<uint32_t>((hash & 0xffffffffu) % g.num_buckets)};
}

// ---- One-sided copies and their check ----------------------------------------------------------
// Writer protocol (owner only, holding the bucket's mutex), for every change of an item:
//   1. tail := seq + 1 (odd)          the word an ascending reader loads last
//   2. seq  := seq + 1 (odd)          the word every reader loads first
//   3. store the changed words (vword, lock, lease, key, value), each a release store
//   4. tail := seq + 2 (release)
//   5. seq  := seq + 2 (release)
// Readers never write. What a reader accepts, per transport (docs/transport.md, "Copy order"):
//   ordered copy (native TCP: the NIC thread loads aligned words ascending, seq_cst): the copy is
//     consistent iff its seq is even and equals its tail. If any word came from a change C that
//     the seq word does not show, C's odd tail (step 1, ordered before C's release stores) is
//     visible to the later tail load, so tail != seq. With steps 1-2 left out, a copy can hold
//     the old seq, some new words and the old tail, and pass (TxTableFaults.no_odd_marking).
//   unordered copy (fabric shm CMA, tcp;ofi_rxm, verbs): no order or word atomicity inside one
//     read, so a single copy proves nothing. Seqlock: read the item's seq word (an 8-byte read or
//     FAA 0), then the item, then the seq word again, each after the previous one completed;
//     accept iff both seq reads are equal, even, and equal the copy's seq and tail
//     (SeqlockRecheck). A bucket copy there only locates the slot; its value is taken from the
//     seqlock read of the item.
// Lock and unlock are changes too (the seq moves), so an accepted copy is a snapshot of version,
// lock and value at one instant: what OCC validation ("version unchanged and not locked by
// another transaction") needs. Residual risk: none from wrap (64-bit counters).

// Loads `len` bytes (multiple of 8) from 8-aligned live memory in ascending order, one aligned
// seq_cst atomic load per word: what the native TCP NIC thread does for a one-sided read
// (src/transport/tcp/ordered_copy.h), and what tests use to play a one-sided reader.
void OrderedCopy(const void* src, void* dst, size_t len);
// One aligned acquire load of a live word (the seqlock's before/after reads).
uint64_t LoadWord(const void* word);

enum class ItemCheck : uint8_t {
  kOk = 0,
  kBusy,      // seq odd: the owner is changing the item; retry
  kTorn,      // seq != tail, or the seqlock words moved or disagree with the copy; retry
  kEmpty,     // consistent, but no live item (free slot, insert reservation, removed)
  kOtherKey,  // consistent and live, but another key (stale cached address or collision)
};
const char* ItemCheckName(ItemCheck c);

// A consistent item, pointing into the copy (the public type a user data structure fills too).
using ItemView = ::farmem::TxItemView;

// The seq word read alone before and after the copy (unordered transports).
using SeqlockRecheck = ::farmem::TxSeqlockRecheck;

// Checks a copy of one item (ItemBytes(g) bytes). `key` empty: any live key is accepted (scans);
// else it must be key_size bytes and equal the item's key. `recheck` null: the copy was ordered.
// Order of checks: busy, torn, empty, other key. On kOk fills *out (if not null); whether the
// item's lock is acceptable is the caller's decision (a read may see it locked; validation
// requires lock_txid == 0, or == its own id for an item it locked itself).
ItemCheck CheckItemCopy(const TxGeometry& g, std::span<const std::byte> copy,
                        std::span<const std::byte> key, const SeqlockRecheck* recheck,
                        ItemView* out);

// OCC validation of a read-set item from a consistent view: the version recorded at read time
// is unchanged and nobody but `own_txid` (0: the reader holds no lock on it) holds the lock.
inline bool ValidatesAgainst(const ItemView& v, uint64_t read_version, uint64_t own_txid) {
  return v.version == read_version && (v.lock_txid == 0 || v.lock_txid == own_txid);
}

// Result of looking for a key in a copy of one bucket (BucketBytes(g) bytes, ordered copy).
struct BucketMatch {
  enum Kind : uint8_t {
    kFound,         // slot `slot` holds the key, consistent: `view` filled
    kInconsistent,  // not found, but some slot was busy or torn (it may hold the key): retry/RPC
    kMiss,          // no consistent slot holds the key; `next_bucket` is the chain's next (hint)
  } kind = kMiss;
  int slot = -1;
  uint64_t next_bucket = 0;  // index of the chain's next bucket + 1; 0 = none
  ItemView view;
};
// A one-sided reader never concludes "absent" from kMiss: the key may sit further down the
// chain, or have been inserted since; it asks the owner by RPC (Storm's one-two-sided read).
BucketMatch ParseBucketCopy(const TxGeometry& g, std::span<const std::byte> copy,
                            std::span<const std::byte> key);

}  // namespace farmem::tx
