// Pure helpers of the libfabric backend: address hex encoding, the mr_mode plan, and the wire
// format of the backend's messages (RPCs and the internal key-lookup protocol). No libfabric
// objects here, so all of it is unit-testable without a provider.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "farmem/status.h"

namespace farmem::fabric {

// Endpoint names (fi_getname bytes) travel as lowercase hex strings: local_address() / add_peer().
std::string HexEncode(std::span<const std::byte> bytes);
// Rejects empty input, odd length, non-hex characters and names longer than kMaxEndpointName.
Result<std::vector<std::byte>> HexDecode(std::string_view hex);

// Largest endpoint name we accept from the network or from add_peer (verbs/IPv6 names are < 64).
inline constexpr size_t kMaxEndpointName = 256;

// What the backend must do for a provider's mr_mode bits (fi_domain_attr::mr_mode).
struct MrPlan {
  bool virt_addr = false;      // FI_MR_VIRT_ADDR: remote address = region base VA + offset
  bool prov_key = false;       // FI_MR_PROV_KEY: provider picks keys; never request one
  bool local = false;          // FI_MR_LOCAL: every local buffer needs a descriptor
  bool endpoint_bind = false;  // FI_MR_ENDPOINT: bind each MR to an endpoint, then fi_mr_enable
  bool allocated = false;      // FI_MR_ALLOCATED: only allocated memory (always true for us)
  size_t key_size = 8;         // fi_domain_attr::mr_key_size (bytes of a requested key)
};

// libfabric's shm provider names each endpoint's /dev/shm file "<source name>:<uid>:<index>",
// and its default source name is the pid. A SIGKILLed process never removes its files, so a
// later process given the same pid failed fi_enable with EBUSY (docs/fabric.md). We pass our own
// source name, "<pid>_<64 random bits in hex>": a reused pid gets another one. Computed afresh per
// call, never cached: a fork()ed child must not reuse its parent's name (libfabric's endpoint
// index is inherited too, so both would open the same file).
std::string ShmSourceName();
// The start of every /dev/shm file name of process `pid`'s shm endpoints ("<pid>_"): a test that
// SIGKILLs a child removes the child's files by it.
std::string ShmFilePrefix(int pid);

// The mr_mode bits we can honour (what we pass in the hints).
uint64_t SupportedMrModeBits();
// Translate a provider's mr_mode; bits we cannot honour (FI_MR_RAW, FI_MR_HMEM, ...) are an error.
Result<MrPlan> PlanForMrMode(uint64_t mr_mode, size_t key_size);
// Remote address of `offset` in a region registered at `base` under `plan`.
inline uint64_t RemoteAddress(const MrPlan& plan, uint64_t base, uint64_t offset) {
  return plan.virt_addr ? base + offset : offset;
}
// The key to request for a new region: our RegionKey truncated to the provider's key size (0 when
// the provider picks). `attempt` perturbs the value after an -FI_ENOKEY collision.
uint64_t RequestedKey(const MrPlan& plan, uint64_t region_key, unsigned attempt);
// Human-readable summary, e.g. "VIRT_ADDR|PROV_KEY" (for logs and docs).
std::string MrPlanString(const MrPlan& plan);

// Bounds check of an access [offset, offset+len) in a region of `length` bytes, overflow-safe.
inline bool InBounds(uint64_t offset, uint64_t len, uint64_t length) {
  return offset <= length && len <= length - offset;
}

// ---- wire format (all little-endian host order: peers run the same build on the same arch) ----

inline constexpr uint32_t kWireMagic = 0x46424d46;  // "FMBF"
inline constexpr uint8_t kWireVersion = 1;

enum class MsgType : uint8_t {
  kRpcRequest = 1,     // context -> main endpoint: user RPC (never reaches the handler otherwise)
  kRpcReply = 2,       // main endpoint -> context: reply or error (status_code != 0)
  kLookupRequest = 3,  // context -> main endpoint: internal key lookup (payload: LookupRequest)
  kLookupReply = 4,    // main endpoint -> context: LookupReply or error (status_code != 0)
};

// Every message starts with this header. Requests carry the sender's endpoint name (name_len bytes)
// right after it so the target can reply to that endpoint; then payload_len payload bytes.
struct WireHeader {
  uint32_t magic;
  uint8_t version;
  uint8_t type;
  uint16_t name_len;
  uint32_t imm;
  uint32_t payload_len;
  uint64_t seq;          // request id chosen by the sender, echoed in the reply
  uint32_t status_code;  // farmem::Code of a reply (0 = OK); the payload is then the message text
  uint32_t reserved;
};
static_assert(sizeof(WireHeader) == 32, "wire header layout");

struct LookupRequest {
  uint64_t key;
};
static_assert(sizeof(LookupRequest) == 8, "lookup request layout");

// LookupReply::flags bits.
inline constexpr uint32_t kLookupReadOnly = 1u << 0;  // region registered Access::kReadOnly

// Answer to a key lookup. table_* describe the same-host key-validity table (shm only; pid == 0
// when absent): slot `table_slot` holds the key while it is registered.
struct LookupReply {
  uint64_t key;
  uint64_t remote_base;  // base VA when FI_MR_VIRT_ADDR, else 0
  uint64_t length;
  uint64_t prov_key;
  uint64_t table_id;
  int32_t table_pid;
  int32_t table_fd;
  uint32_t table_slot;
  uint32_t flags;  // kLookup* bits; unknown bits are ignored
};
static_assert(sizeof(LookupReply) == 56, "lookup reply layout");

// A validated view of a received message.
struct ParsedMsg {
  WireHeader header;
  std::span<const std::byte> name;
  std::span<const std::byte> payload;
};
// Checks magic, version, type and that name/payload lengths fit exactly in `bytes` and below the
// limits; everything here came from the network.
Result<ParsedMsg> ParseMessage(std::span<const std::byte> bytes, uint32_t max_payload);
// Appends header + name + payload into `out` (cleared first).
void BuildMessage(std::vector<std::byte>& out, MsgType type, uint32_t imm, uint64_t seq,
                  uint32_t status_code, std::span<const std::byte> name,
                  std::span<const std::byte> payload);

}  // namespace farmem::fabric
