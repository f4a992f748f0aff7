// Wire format of the transaction (Storm) RPCs between the tx client and farmemd's tx service:
// opcodes, fixed-size little-endian structs pinned by static_asserts, and the decoders of the
// variable-length requests (any thread; pure functions). Documented in docs/tx.md ("RPC wire
// format") and docs/wire-format.md; keep in step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "common/wire_struct.h"
#include "farmem/opcodes.h"
#include "farmem/status.h"
#include "farmem/tx_ds.h"
#include "tx/format/tx_layout.h"

namespace farmem::tx_wire {

// The tx service owns kTxOpcodes (farmem/opcodes.h, 128..159), well apart from the tier's
// 112..127: opcodes 138..159 stay free for later tx RPCs.
inline constexpr uint16_t kOpTableInfo = kTxOpcodes.first + 0;  // empty -> TableInfoReply + entries
inline constexpr uint16_t kOpLookup = kTxOpcodes.first + 1;     // KeyRequest -> ItemReply + value
inline constexpr uint16_t kOpLock = kTxOpcodes.first + 2;       // KeyRequest -> ItemReply + value
inline constexpr uint16_t kOpLockInsert = kTxOpcodes.first + 3;  // KeyRequest -> ItemReply
inline constexpr uint16_t kOpValidate = kTxOpcodes.first + 4;    // ValidateRequest + items -> empty
inline constexpr uint16_t kOpCommit = kTxOpcodes.first + 5;      // BatchHeader + writes -> empty
inline constexpr uint16_t kOpUnlock = kTxOpcodes.first + 6;      // BatchHeader + keys -> empty
// Atomic commit across participants (servers), docs/tx.md "Multi-participant commit".
inline constexpr uint16_t kOpPrepare = kTxOpcodes.first + 7;  // TwoPhaseHeader + list + items
inline constexpr uint16_t kOpDecide = kTxOpcodes.first + 8;   // TwoPhaseHeader [+ items] -> empty
inline constexpr uint16_t kOpStatus = kTxOpcodes.first + 9;   // StatusRequest -> StatusReply
inline constexpr uint16_t kLastTxOpcode = kOpStatus;
static_assert(kTxOpcodes.contains(kLastTxOpcode));

// A user data structure's transaction RPCs (tx_data_structure.h, TxDsClient::tx_opcode_base()):
// its owner serves opcode base + kDs*, each in the format of the hash table RPC named, with the
// data structure's id (TxClient::add_data_structure) as the table id and the item's address in
// ItemReply::offset. With TxDsClient::two_phase() the owner also serves base + kTxDsPrepare /
// kTxDsDecide as TX_PREPARE / TX_DECIDE (a prepared participant only, its list entry "ds@..."
// below); without it, commits that span the data structure and any other participant are
// refused by Tx.
// (Public spelling and owner-side decoders: farmem/tx_ds.h, implemented in tx_ds.cc.)
inline constexpr uint16_t kDsLock = kTxDsLock;  // as TX_LOCK: KeyRequest -> ItemReply + value
inline constexpr uint16_t kDsLockInsert =
    kTxDsLockInsert;  // as TX_LOCK_INSERT: KeyRequest -> ItemReply
inline constexpr uint16_t kDsValidate =
    kTxDsValidate;  // as TX_VALIDATE: ValidateRequest + items -> empty
inline constexpr uint16_t kDsCommit = kTxDsCommit;  // as TX_COMMIT: BatchHeader + writes -> empty
inline constexpr uint16_t kDsUnlock = kTxDsUnlock;  // as TX_UNLOCK: BatchHeader + keys -> empty
inline constexpr uint16_t kDsOpcodes = kTxDsOpcodes;

// Limits every decoder enforces (a request beyond them is malformed).
inline constexpr size_t kMaxTables = 64;
inline constexpr size_t kMaxTableName = 31;      // bytes, [A-Za-z0-9_.-]
inline constexpr size_t kMaxBatchItems = 64;     // = TxTable::kMaxCommitItems
inline constexpr size_t kMaxParticipants = 16;   // servers one multi-participant commit spans
inline constexpr size_t kParticipantBytes = 64;  // "host:port", NUL-padded

// TX_TABLE_INFO reply: this header, then `num_tables` TableInfoEntry. A table's id on the wire is
// its index in this list (the same on every server: the order of the --tx-table flags).
struct TableInfoReply {
  uint32_t num_tables;
  uint32_t reserved;  // 0
};
static_assert(sizeof(TableInfoReply) == 8 && std::is_trivially_copyable_v<TableInfoReply>);

struct TableInfoEntry {
  char name[kMaxTableName + 1];  // NUL-terminated, NUL-padded
  uint64_t region_key;           // this server's partition region (read-only for clients)
  uint64_t region_bytes;
  uint32_t key_size;
  uint32_t value_size;
  uint32_t width;
  uint32_t num_buckets;
  uint32_t overflow_buckets;
  uint16_t partition;
  uint16_t num_partitions;
  uint64_t hash_seed;
};
static_assert(sizeof(TableInfoEntry) == 80 && std::is_trivially_copyable_v<TableInfoEntry>);

TableInfoEntry EncodeTableInfo(std::string_view name, uint64_t region_key, uint64_t region_bytes,
                               const tx::TxGeometry& g);
// A table of the reply: name, geometry (checked by tx::ValidateGeometry), region.
struct TableInfo {
  std::string name;
  uint64_t region_key = 0;
  uint64_t region_bytes = 0;
  tx::TxGeometry geometry;
};
// kProtocol on a wrong length, too many tables, a bad name, a bad geometry, or a region_bytes
// that is not RegionBytes(geometry).
Result<std::vector<TableInfo>> DecodeTableInfoReply(std::span<const std::byte> bytes);
std::vector<std::byte> EncodeTableInfoReply(std::span<const TableInfo> tables);

// TX_LOOKUP, TX_LOCK, TX_LOCK_INSERT: this header followed by exactly key_len key bytes. txid and
// lease_ns are 0 for TX_LOOKUP; TX_LOCK / TX_LOCK_INSERT need txid != 0 and lease_ns >= 1.
struct KeyRequest {
  uint16_t table;
  uint16_t key_len;
  uint32_t reserved;  // 0
  uint64_t txid;
  uint64_t lease_ns;
};
static_assert(sizeof(KeyRequest) == 24 && std::is_trivially_copyable_v<KeyRequest>);

// TX_LOOKUP / TX_LOCK reply: this, then the value (value_size bytes of the table). TX_LOCK_INSERT
// reply: exactly this (version 0, lock_txid = the caller's txid).
struct ItemReply {
  uint64_t offset;  // item offset in the partition region: the client's address-cache entry
  uint64_t version;
  uint64_t lock_txid;
};
static_assert(sizeof(ItemReply) == 24 && std::is_trivially_copyable_v<ItemReply>);

// TX_VALIDATE (owner-side validation, for unordered transports): this header, then `count` items,
// each a u64 version followed by key_len key bytes. Reply: empty when every item still has its
// version and no other transaction holds its lock; else kAborted "validation: ...".
struct ValidateRequest {
  uint16_t table;
  uint16_t key_len;
  uint16_t count;     // 1..kMaxBatchItems
  uint16_t reserved;  // 0
  uint64_t txid;      // the validating transaction (its own locks do not fail validation); may be 0
};
static_assert(sizeof(ValidateRequest) == 16 && std::is_trivially_copyable_v<ValidateRequest>);

// TX_COMMIT and TX_UNLOCK: this header, then `count` BatchItem, each followed by key_len key bytes
// and (TX_COMMIT kWrite only) value_len value bytes. All items name the same table.
// TX_COMMIT installs all items at once (TxTable::CommitAll) or nothing (kAborted "stale commit").
// TX_UNLOCK (abort) releases txid's lock on each item (kRemove / kWrite / kUnlock all mean "unlock"
// there); the reply is empty, or the first failure (the others are still attempted).
struct BatchHeader {
  uint16_t table;
  uint16_t count;     // 1..kMaxBatchItems
  uint32_t reserved;  // 0
  uint64_t txid;      // != 0
};
static_assert(sizeof(BatchHeader) == 16 && std::is_trivially_copyable_v<BatchHeader>);

enum BatchOp : uint8_t { kWrite = 1, kRemove = 2, kUnlockOnly = 3 };
static_assert(kWrite == static_cast<uint8_t>(TxDsOp::kWrite) &&
              kRemove == static_cast<uint8_t>(TxDsOp::kRemove) &&
              kUnlockOnly == static_cast<uint8_t>(TxDsOp::kUnlockOnly));
struct BatchItem {
  uint8_t op;        // BatchOp
  uint8_t reserved;  // 0
  uint16_t key_len;
  uint16_t value_len;  // 0 unless op == kWrite
  uint16_t reserved2;  // 0
};
static_assert(sizeof(BatchItem) == 8 && std::is_trivially_copyable_v<BatchItem>);

// ---- Decoded requests (views into the request bytes) ------------------------------------------
// Every decoder returns kProtocol with a message naming the field on: a short or overlong body,
// non-zero reserved fields, a key_len outside [kMinKeySize, kMaxKeySize] or not a multiple of 8,
// a value_len over kMaxValueSize, a count of 0 or over kMaxBatchItems, an unknown op, a txid of 0
// where one is needed. Table ids and sizes against a table's geometry are the service's check.
struct KeyOp {
  uint16_t table = 0;
  uint64_t txid = 0;
  uint64_t lease_ns = 0;
  std::span<const std::byte> key;
};
// `needs_txid`: TX_LOCK / TX_LOCK_INSERT (txid != 0, lease_ns != 0) vs TX_LOOKUP (both 0).
Result<KeyOp> DecodeKeyRequest(std::span<const std::byte> bytes, bool needs_txid);
std::vector<std::byte> EncodeKeyRequest(uint16_t table, std::span<const std::byte> key,
                                        uint64_t txid, uint64_t lease_ns);

struct ValidateItem {
  uint64_t version = 0;
  std::span<const std::byte> key;
};
struct ValidateOp {
  uint16_t table = 0;
  uint64_t txid = 0;
  std::vector<ValidateItem> items;
};
Result<ValidateOp> DecodeValidateRequest(std::span<const std::byte> bytes);
std::vector<std::byte> EncodeValidateRequest(uint16_t table, uint64_t txid,
                                             std::span<const ValidateItem> items);

struct BatchEntry {
  BatchOp op = kWrite;
  std::span<const std::byte> key;
  std::span<const std::byte> value;  // kWrite only
};
struct BatchOpRequest {
  uint16_t table = 0;
  uint64_t txid = 0;
  std::vector<BatchEntry> items;
};
// TX_COMMIT accepts kWrite / kRemove; TX_UNLOCK accepts all three ops.
Result<BatchOpRequest> DecodeBatchRequest(std::span<const std::byte> bytes, bool commit);
std::vector<std::byte> EncodeBatchRequest(uint16_t table, uint64_t txid,
                                          std::span<const BatchEntry> items);

// ---- Multi-participant commit (docs/tx.md "Multi-participant commit") -------------------------
// TX_PREPARE: this header (decision 0, lease_ns >= 1, num_participants 2..16, count 1..64), then
// num_participants ParticipantEntry (entry 0 is the first participant, the keeper of the decision;
// the receiver is one of the others), then `count` items (TwoPhaseItem + key + value). The
// receiver checks that txid holds every item's lock with a live lease and pins the locks (they
// no longer expire) until a decision arrives or, lease_ns after the prepare, it asks entry 0.
// TX_DECIDE: this header (lease_ns 0) with decision kCommit or kAbort:
//   - count 0, num_participants 0: the outcome for a prepared participant (empty reply; commit
//     when this server holds no prepare of txid: kFailedPrecondition);
//   - count 1..64, kCommit, num_participants = the transaction's participants (1..16), no list:
//     the first participant's own writes: installed at once (all tables) or none, and with more
//     than one participant the decision is recorded (the commit point); kAborted "stale commit"
//     when a lease ran out or TX_STATUS already fenced txid (decided abort);
//   - count 0, kCommit, num_participants 2..16: the same commit point at a first participant that
//     holds none of the writes (the keeper a client picks when only user data structures write).
struct TwoPhaseHeader {
  uint64_t txid;              // != 0
  uint64_t lease_ns;          // TX_PREPARE: how long the prepared participant waits before asking
  uint16_t num_participants;  // see above
  uint16_t count;             // items
  uint8_t decision;           // TwoPhaseDecision (TX_DECIDE), 0 (TX_PREPARE)
  uint8_t reserved;           // 0
  uint16_t reserved2;         // 0
};
static_assert(sizeof(TwoPhaseHeader) == 24 && std::is_trivially_copyable_v<TwoPhaseHeader>);
enum TwoPhaseDecision : uint8_t { kDecideCommit = 1, kDecideAbort = 2 };

struct ParticipantEntry {
  char address[kParticipantBytes];  // bootstrap "host:port", NUL-terminated, NUL-padded
};
static_assert(sizeof(ParticipantEntry) == 64 && std::is_trivially_copyable_v<ParticipantEntry>);

// An item of TX_PREPARE / TX_DECIDE: BatchItem's layout with its last field naming the table
// (a participant is a server; its writes may span several tables). op kWrite or kRemove.
struct TwoPhaseItem {
  uint8_t op;  // BatchOp: kWrite, kRemove
  uint8_t reserved;
  uint16_t key_len;
  uint16_t value_len;  // 0 unless op == kWrite
  uint16_t table;
};
static_assert(sizeof(TwoPhaseItem) == 8 && std::is_trivially_copyable_v<TwoPhaseItem>);

// A participant-list entry "ds@host:port" is a user data structure's owner (TxDsParticipant): a
// prepared participant that serves TX_PREPARE / TX_DECIDE at its own opcodes and no TX_STATUS,
// so the recovery never asks it, and it is never entry 0.
inline constexpr std::string_view kDsParticipantPrefix = "ds@";
inline bool IsDsParticipant(std::string_view entry) {
  return entry.starts_with(kDsParticipantPrefix);
}

// TX_STATUS: the outcome of txid as the asked server knows it — recorded as the first participant
// (the commit point) or learned as a prepared participant from a decision or a recovery. A server
// still prepared for txid and undecided answers kOutcomeUndecided (it voted yes: it cannot rule
// out a commit). Otherwise no record means no commit happened through this server, and none can
// any more: the server records kAborted for txid (a fence: a later TX_DECIDE commit or TX_PREPARE
// of txid here is refused) and says so. (A prepared participant asks the first participant, and
// only when it does not answer the other participants: docs/tx.md "Multi-participant commit".)
struct StatusRequest {
  uint64_t txid;  // != 0
};
static_assert(sizeof(StatusRequest) == 8 && std::is_trivially_copyable_v<StatusRequest>);
// StatusReply::outcome besides kDecideCommit / kDecideAbort: prepared here, no outcome known.
inline constexpr uint8_t kOutcomeUndecided = 3;
struct StatusReply {
  uint8_t outcome;  // kDecideCommit = committed, kDecideAbort = aborted, kOutcomeUndecided
  uint8_t reserved[7];
};
static_assert(sizeof(StatusReply) == 8 && std::is_trivially_copyable_v<StatusReply>);

struct TwoPhaseEntry {
  BatchOp op = kWrite;
  uint16_t table = 0;
  std::span<const std::byte> key;
  std::span<const std::byte> value;  // kWrite only
};
struct TwoPhaseRequest {
  uint64_t txid = 0;
  uint64_t lease_ns = 0;
  uint8_t decision = 0;
  uint16_t num_participants = 0;
  std::vector<std::string_view> participants;  // TX_PREPARE only
  std::vector<TwoPhaseEntry> items;
};
// `prepare`: TX_PREPARE, else TX_DECIDE; the field rules above, kProtocol naming the field.
Result<TwoPhaseRequest> DecodeTwoPhaseRequest(std::span<const std::byte> bytes, bool prepare);
// TX_PREPARE: participants non-empty, decision 0. TX_DECIDE: participants empty; `total` is the
// header's num_participants (0 for a prepared participant's decision).
std::vector<std::byte> EncodeTwoPhaseRequest(uint64_t txid, uint64_t lease_ns, uint8_t decision,
                                             uint16_t total,
                                             std::span<const std::string> participants,
                                             std::span<const TwoPhaseEntry> items);
Result<StatusRequest> DecodeStatusRequest(std::span<const std::byte> bytes);
Result<StatusReply> DecodeStatusReply(std::span<const std::byte> bytes);

// Replies of TX_LOOKUP / TX_LOCK: ItemReply then exactly value_size bytes (kProtocol otherwise).
struct ItemResult {
  ItemReply item{};
  std::span<const std::byte> value;
};
Result<ItemResult> DecodeItemReply(std::span<const std::byte> bytes, uint32_t value_size);

}  // namespace farmem::tx_wire
