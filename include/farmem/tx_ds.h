// A data structure of the user's own in Storm transactions (docs/tx.md "Data structures", "User
// data structures"): the client callbacks Tx drives (TxDsClient, registered with
// TxClient::add_data_structure), the owner's RPC handler (TxDsOwner), and the decoders and
// encoder of the five transaction RPCs an owner serves. TxDsClient's callbacks run on the threads
// of the transactions using it (so an object shared by threads is thread-safe); TxDsOwner on the
// owner node's RPC threads. The decoders are pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
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

}  // namespace farmem
