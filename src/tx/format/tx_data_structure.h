// Storm's data-structure callbacks (docs/tx.md "Data structures"): what a remote data structure
// gives the transaction layer so that its reads are one-two-sided. TxDsClient's callbacks run on
// the reading transaction's thread (an object shared by threads must be thread-safe);
// TxDsOwner::rpc_handler on the owner's RPC threads. The hash table is the first user
// (tx_client.cc's TxHashTableDs, TxService), tx_lookup.h the driver; a user's data structure
// joins transactions through TxClient::add_data_structure (docs/tx.md "User data structures").
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "farmem/status.h"
#include "tx/format/tx_layout.h"

namespace farmem::tx {

// One one-sided copy in the owner's registered region of the data structure.
struct DsRead {
  uint64_t offset = 0;
  uint32_t length = 0;   // bytes, 8..kMaxDsRead
  bool seqlock = false;  // also read the 8-byte word at `offset` before and after the copy
};
inline constexpr uint32_t kMaxDsRead = 1 << 20;

// What lookup_start / lookup_end say to do next.
struct DsStep {
  enum Kind : uint8_t {
    kRead,   // copy `read` one-sidedly, then call lookup_end (a guess, or "continue at")
    kRetry,  // the copy was busy or torn: the same read again
    kFound,  // `address` and `view` (pointing into the copy or the RPC reply) are the item
    kRpc,    // no one-sided answer: ask the owner (rpc_request / rpc_lookup_end)
  } kind = kRpc;
  DsRead read;
  uint64_t address = 0;  // kFound: what the client's cache keeps (the item's offset)
  ItemView view;         // kFound: version, lock holder, value
};

class TxDsClient {
 public:
  virtual ~TxDsClient() = default;
  // No IO: the first one-sided read for `key` (a cached or guessed address), or kRpc.
  virtual DsStep lookup_start(std::span<const std::byte> key) = 0;
  // After every one-sided copy of `read` (`recheck` set iff read.seqlock): validate, remember
  // the address; kFound, kRead (continue at another address), kRetry or kRpc.
  virtual DsStep lookup_end(std::span<const std::byte> copy, const DsRead& read,
                            const SeqlockRecheck* recheck, std::span<const std::byte> key) = 0;
  // The owner's lookup RPC for `key`.
  virtual uint16_t rpc_opcode() const = 0;
  virtual std::vector<std::byte> rpc_request(std::span<const std::byte> key) = 0;
  // lookup_end of an RPC lookup: kFound with the view into `reply` (its address remembered), or
  // an error (kNotFound: no such key; kProtocol: a malformed reply).
  virtual Result<DsStep> rpc_lookup_end(std::span<const std::byte> reply,
                                        std::span<const std::byte> key) = 0;

  // ---- In transactions (TxClient::add_data_structure; docs/tx.md "User data structures") ----
  // A data structure that answers 0 here is read-only for Tx (lookups through tx_lookup.h only).
  // Otherwise its owner serves the transaction RPCs on opcodes tx_opcode_base() + tx_wire::kDs*
  // in the hash table's formats, and kFound views carry the item's version and lock holder.
  virtual uint16_t tx_opcode_base() const { return 0; }
  // Bytes of every item's value (what a lock reply carries and a commit installs).
  virtual uint32_t value_size() const { return 0; }
  // Validation's one-sided copy of the item lookup_end found at `address` (kRead; lookup_end
  // then checks it like any copy, and validation wants kFound at the same address), or kRpc:
  // validate at the owner (tx_wire::kDsValidate).
  virtual DsStep validate_start(uint64_t address, std::span<const std::byte> key) {
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

}  // namespace farmem::tx
