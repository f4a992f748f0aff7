// A data structure of the user's own in Storm transactions (docs/tx.md "Data structures", "User
// data structures"): the client callbacks Tx drives (TxDsClient, registered with
// TxClient::add_data_structure), the owner's RPC handler (TxDsOwner), the decoders and encoder
// of the transaction RPCs an owner serves, and the owner's part in multi-participant commits
// (TxDsPreparedWrites, TxDsParticipant). TxDsClient's callbacks run on the threads
// of the transactions using it (so an object shared by threads is thread-safe); TxDsOwner on the
// owner node's RPC threads. The decoders are pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "farmem/status.h"

namespace farmem {

// An item as a one-sided copy or an RPC reply shows it.
struct TxItemView {
  uint64_t seq = 0;        // the copy-consistency word, where the layout has one
  uint64_t version = 0;    // OCC version: changes with every committed change of the item
  uint64_t lock_txid = 0;  // the transaction holding its lock, 0 = unlocked
  std::span<const std::byte> key;
  std::span<const std::byte> value;
};

// The 8-byte word at a read's offset, read alone before and after the copy (TxDsRead::seqlock).
struct TxSeqlockRecheck {
  uint64_t before;
  uint64_t after;
};

// One one-sided copy in the owner's registered region of the data structure.
struct TxDsRead {
  uint64_t offset = 0;
  uint32_t length = 0;   // bytes, 8..kTxMaxDsRead, a multiple of 8
  bool seqlock = false;  // also read the 8-byte word at `offset` before and after the copy
};
inline constexpr uint32_t kTxMaxDsRead = 1 << 20;

// What lookup_start / lookup_end / validate_start say to do next.
struct TxDsStep {
  enum Kind : uint8_t {
    kRead,   // copy `read` one-sidedly, then call lookup_end (a guess, or "continue at")
    kRetry,  // the copy was busy or torn: the same read again
    kFound,  // `address` and `view` (pointing into the copy or the RPC reply) are the item
    kRpc,    // no one-sided answer: ask the owner (rpc_request / rpc_lookup_end)
  } kind = kRpc;
  TxDsRead read;
  uint64_t address = 0;  // kFound: what the client's cache keeps (the item's offset)
  TxItemView view;       // kFound: version, lock holder, value
};

class TxDsClient {
 public:
  virtual ~TxDsClient() = default;
  // No IO: the first one-sided read for `key` (a cached or guessed address), or kRpc.
  virtual TxDsStep lookup_start(std::span<const std::byte> key) = 0;
  // After every one-sided copy of `read` (`recheck` set iff read.seqlock): validate, remember
  // the address; kFound, kRead (continue at another address), kRetry or kRpc.
  virtual TxDsStep lookup_end(std::span<const std::byte> copy, const TxDsRead& read,
                              const TxSeqlockRecheck* recheck, std::span<const std::byte> key) = 0;
  // The owner's lookup RPC for `key` (opcode and format of the data structure's choosing).
  virtual uint16_t rpc_opcode() const = 0;
  virtual std::vector<std::byte> rpc_request(std::span<const std::byte> key) = 0;
  // lookup_end of an RPC lookup: kFound with the view into `reply` (its address remembered), or
  // an error (kNotFound: no such key; kProtocol: a malformed reply).
  virtual Result<TxDsStep> rpc_lookup_end(std::span<const std::byte> reply,
                                          std::span<const std::byte> key) = 0;

  // ---- In transactions (TxClient::add_data_structure) ----
  // 0: read-only for Tx (lookups only). Otherwise the owner serves the transaction RPCs on
  // opcodes tx_opcode_base() + kTxDsLock .. kTxDsUnlock (below), and kFound views carry the
  // item's version and lock holder.
  virtual uint16_t tx_opcode_base() const { return 0; }
  // Bytes of every item's value (what a lock reply carries and a commit installs).
  virtual uint32_t value_size() const { return 0; }
  // Validation's one-sided copy of the item lookup_end found at `address` (kRead; lookup_end
  // then checks it like any copy, and validation wants kFound at the same address), or kRpc:
  // validate at the owner (kTxDsValidate).
  virtual TxDsStep validate_start(uint64_t address, std::span<const std::byte> key) {
    (void)address;
    (void)key;
    return {};
  }
  // True when the owner also serves kTxDsPrepare / kTxDsDecide (with a TxDsParticipant): then
  // writes to this data structure may commit atomically with writes to tables and to other data
  // structures. False: its writes must be the transaction's only ones (Tx refuses others).
  virtual bool two_phase() const { return false; }
};

class TxDsOwner {
 public:
  virtual ~TxDsOwner() = default;
  // Serves one of the data structure's RPCs (lookup, lock, commit, insert, remove, unlock, ...).
  virtual Status rpc_handler(uint16_t opcode, std::span<const std::byte> request,
                             std::vector<std::byte>& reply) = 0;
};

// ---- The owner's transaction RPCs (docs/tx.md "RPC wire format") ------------------------------
// Opcode tx_opcode_base() + one of these. Keys are 8..64 bytes, a multiple of 8; `id` is the id
// TxClient::add_data_structure gave the data structure on that client (an owner may ignore it).
// Errors are replies of their own: kAborted with a message starting "locked: ", "exists: ",
// "validation: " or "stale commit: " (Tx reads the reason from it), kNotFound "not found: ...".
inline constexpr uint16_t kTxDsLock = 0;  // lock `key` for txid -> EncodeTxDsItemReply(value)
inline constexpr uint16_t kTxDsLockInsert =
    1;                                        // reserve a new key -> EncodeTxDsItemReply(no value)
inline constexpr uint16_t kTxDsValidate = 2;  // versions unchanged, no other lock -> empty
inline constexpr uint16_t kTxDsCommit = 3;    // install all and unlock, or nothing -> empty
inline constexpr uint16_t kTxDsUnlock = 4;    // release txid's locks (abort) -> empty
inline constexpr uint16_t kTxDsOpcodes = 5;
// With two_phase(): the owner is a prepared participant of multi-participant commits
// (TxDsParticipant::prepare / decide serve these; docs/tx.md "Multi-participant commit").
inline constexpr uint16_t kTxDsPrepare = 5;  // pin txid's locks, record the prepare -> empty
inline constexpr uint16_t kTxDsDecide = 6;   // the outcome: install or release -> empty
inline constexpr uint16_t kTxDsTwoPhaseOpcodes = 7;

struct TxDsKeyRequest {  // kTxDsLock, kTxDsLockInsert
  uint16_t id = 0;
  uint64_t txid = 0;      // != 0
  uint64_t lease_ns = 0;  // >= 1: how long the lock may be held
  std::span<const std::byte> key;
};
Result<TxDsKeyRequest> DecodeTxDsKeyRequest(std::span<const std::byte> request);
// The reply of kTxDsLock (with the item's value, value_size() bytes) and kTxDsLockInsert (none).
std::vector<std::byte> EncodeTxDsItemReply(uint64_t address, uint64_t version, uint64_t lock_txid,
                                           std::span<const std::byte> value);

struct TxDsVersionedKey {
  uint64_t version = 0;
  std::span<const std::byte> key;
};
struct TxDsValidateRequest {  // kTxDsValidate
  uint16_t id = 0;
  uint64_t txid = 0;  // the validating transaction: its own locks do not fail validation
  std::vector<TxDsVersionedKey> items;
};
Result<TxDsValidateRequest> DecodeTxDsValidateRequest(std::span<const std::byte> request);

enum class TxDsOp : uint8_t { kWrite = 1, kRemove = 2, kUnlockOnly = 3 };
struct TxDsBatchItem {
  TxDsOp op = TxDsOp::kWrite;
  std::span<const std::byte> key;
  std::span<const std::byte> value;  // kWrite only
};
struct TxDsBatchRequest {  // kTxDsCommit (kWrite, kRemove), kTxDsUnlock (any op means "release")
  uint16_t id = 0;
  uint64_t txid = 0;
  std::vector<TxDsBatchItem> items;
};
Result<TxDsBatchRequest> DecodeTxDsBatchRequest(std::span<const std::byte> request, bool commit);

// ---- The owner as a prepared participant (kTxDsPrepare, kTxDsDecide) -------------------------
class Node;

// The owner's records as a prepared participant needs them (the owner implements it; called on
// its RPC threads and on TxDsParticipant's recovery thread).
class TxDsPreparedWrites {
 public:
  virtual ~TxDsPreparedWrites() = default;
  // Checks that txid holds every item's lock with a live lease and pins those locks: they no
  // longer expire nor can be taken over, until apply(). All or none: on a refusal (kAborted
  // "stale commit: ...") txid's locks on every item are released.
  virtual Status pin(uint64_t txid, std::span<const TxDsBatchItem> items) = 0;
  // commit: installs the items (kWrite, kRemove) and releases their locks (they are pinned: this
  // cannot be refused); abort: releases txid's locks on the items.
  virtual void apply(uint64_t txid, std::span<const TxDsBatchItem> items, bool commit) = 0;
};

struct TxDsParticipantOptions {
  // The longest lock lease the owner grants: a prepare waits at most this long for its decision
  // before asking the transaction's first participant (and, blocked, asks again every half).
  uint64_t max_lease_ns = 10'000'000'000ull;
  std::function<uint64_t()> now_ns;  // the owner's lease clock, ns; empty = steady clock
  bool recovery_thread = true;       // recover() every max_lease_ns / 2 on a thread of its own
};

struct TxDsParticipantStats {
  uint64_t prepares = 0, decides = 0, prepared = 0, recovered_commits = 0, recovered_aborts = 0,
           recovery_unreachable = 0;
};

// The bookkeeping of a prepared participant, the same code farmemd's tx service runs: prepare
// records, learned outcomes, and the recovery that asks the first participant (a farmemd tx
// server: `node` connects to it by TX_STATUS) when a coordinator died between prepare and
// decide. The owner's rpc_handler passes kTxDsPrepare / kTxDsDecide requests here. Thread-safe.
class TxDsParticipant {
 public:
  // `node` serves the owner's RPCs; both it and `writes` outlive the participant.
  static Result<std::unique_ptr<TxDsParticipant>> Create(Node& node, TxDsPreparedWrites& writes,
                                                         TxDsParticipantOptions options = {});
  ~TxDsParticipant();
  TxDsParticipant(const TxDsParticipant&) = delete;
  TxDsParticipant& operator=(const TxDsParticipant&) = delete;

  // kTxDsPrepare: the request body (TX_PREPARE's format); OK, or the refusal pin() gave.
  Status prepare(std::span<const std::byte> request);
  // kTxDsDecide: the request body (TX_DECIDE's prepared-participant format, no items).
  Status decide(std::span<const std::byte> request);
  // Resolves every prepare past its deadline (the recovery thread's step; callable by hand).
  void recover();
  TxDsParticipantStats stats() const;

  struct Impl;

 private:
  TxDsParticipant() = default;
  std::unique_ptr<Impl> impl_;
};

}  // namespace farmem
