// Pure helpers of ObjectClient that need no network: decoding/validating the OBJ_INFO reply and
// checking a pointer's shape against a server's geometry. Separate so unit tests can feed them
// malformed input directly (a lying or buggy server must produce Protocol errors, not UB).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "farmem/objects.h"
#include "farmem/status.h"
#include "objects/format/object_layout.h"
#include "objects/format/size_classes.h"

namespace farmem::objects_internal {

// Decodes an OBJ_INFO reply (InfoReply + WireClass entries) and checks that the geometry is one
// this client can read one-sidedly: block size, id_bits, slot sizes ascending, payload capacity
// equal to this build's slot layout, ID masks. Protocol error (with `server` in the message) if
// not. Sets every field except `name`.
Result<ObjectServerInfo> DecodeInfoReply(std::span<const std::byte> reply, std::string_view server);

// InvalidArgument unless `p` is a valid pointer whose class, offset and ID fit `info`: class
// index in range, slot inside the region, on a slot boundary of its class inside its block, ID
// within the class's mask. `op` prefixes the message. Does not check p.server.
Status CheckPtrShape(const ObjectServerInfo& info, const Ptr& p, std::string_view op);

// Offset of the block holding the slot at `offset` of class `size_class` (valid class: the slot
// is checked by CheckPtrShape), and the virtual block index slot headers name as its home
// (corm::BlockStartOf; multi-slot blocks and the base block are powers of two, so masks and
// shifts instead of divisions: these run on every one-sided read).
inline uint64_t BlockStart(const ObjectServerInfo& info, uint32_t size_class, uint64_t offset) {
  const auto& c = info.classes[size_class];
  return c.slots_per_block == 1 ? offset : offset & ~(uint64_t{c.block_bytes} - 1);
}
inline uint32_t HomeBlockOf(const ObjectServerInfo& info, uint32_t size_class, uint64_t offset) {
  return static_cast<uint32_t>(BlockStart(info, size_class, offset) >>
                               std::countr_zero(info.block_size));
}

// Whether direct_read/scan_read re-read the header around each copy (ReadValidation) for a server
// reached through a transport called `transport_name` (Transport::name()). kAuto trusts the
// version bytes alone only on native TCP, whose NIC thread copies 8-aligned reads word by word in
// ascending order (src/transport/tcp/ordered_copy.h); libfabric providers give no such order.
bool UsesHeaderRecheck(ReadValidation mode, std::string_view transport_name);

// Classifies a header word read on its own (the seqlock's first read) for the object with header
// tag `tag` (bits in tag_mask compared) of `size_class` homed at virtual block `home`, in
// corm::CheckSlot's order: freed, locked, wrong class, moved (tag or home differs), else kOk. It
// never returns kTorn: one aligned word carries one version.
corm::SlotCheck CheckHeaderWord(uint64_t word, uint16_t tag, uint16_t tag_mask, uint32_t size_class,
                                uint32_t home);

// ---- Test seam --------------------------------------------------------------------------------
// Lets a test change the remote memory (or the local copy) between the steps of a one-sided read,
// which is the only way to produce the interleavings the header recheck exists for on demand.
// Production code never sets it; when unset it costs one relaxed atomic load per read.
enum class ReadStage : uint8_t {
  kBeforeCopy,  // recheck mode only: the seqlock's first header read (direct_read) or the
                // block read (scan_read) found the object; the slot copy comes next
  kAfterCopy,   // the slot copy completed; `copy` (mutable) is what will be validated
};
using ReadHook = void (*)(void* ctx, ReadStage stage, uint64_t offset, std::span<uint8_t> copy);
// Installs `hook` (nullptr removes it) for every ObjectClient of the process.
void SetReadHookForTesting(ReadHook hook, void* ctx);

}  // namespace farmem::objects_internal
