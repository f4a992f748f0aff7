// libFuzzer target for what an ObjectClient decodes from a server (a lying or broken farmemd, or
// bytes torn by a racing write): the OBJ_INFO reply (objects_internal::DecodeInfoReply), the
// pointer shape check every read does against that geometry (CheckPtrShape), and the one-sided
// read path's slot decoding (corm::CheckSlot, DecodePayload, ScanBlockImage, CheckHeaderWord).
// Built with -DFARMEM_FUZZ=ON (scripts/test --fuzz).
//
// Input: byte 0 = mode bits; then an OBJ_INFO reply (its length taken from its own num_classes
// field unless mode bit 0 says "the rest, as is"); then 16-byte pointers (the fields of a Ptr in
// order: u64 offset, u16 id, u16 gen, u16 server, u8 size_class, u8 flags), each followed by the
// bytes of a slot image.
//
// Checked beyond "no crash": a decoded geometry is one the client can read (base block size a
// power of two in 4 KiB..1 MiB, id_bits 0/8/12/16, slot sizes ascending multiples of 8, each
// class's block whole base blocks holding a slot inside the region, a power of two when it holds
// several, capacities equal to this build's PayloadCapacity, ID masks 0 or full) and re-encodes to
// the very bytes it came from; a pointer CheckPtrShape accepts addresses a whole slot inside its
// class's block, inside the region; a slot image CheckSlot accepts (allocated, unlocked, the
// pointer's class and its whole 16-bit tag, TagOf(id, gen)) is rebuilt by EncodeSlot from its
// header and DecodePayload's bytes with the same header word, version bytes and payload bytes (only
// the unused slack differs), so nothing but payload leaks into an object's data, and is refused for
// any other class (wrong class) or tag (moved); the header-word check agrees with CheckSlot on
// freed / locked / wrong class / moved, and calls a slot homed elsewhere moved; a slot
// ScanBlockImage finds is a whole, allocated slot of the wanted class and tag.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "common/fuzz_support.h"
#include "objects/client/object_client_internal.h"
#include "objects/format/object_layout.h"
#include "objects/format/object_wire.h"

namespace {

using namespace farmem;
namespace wire = farmem::object_wire;
namespace oi = farmem::objects_internal;

std::vector<std::byte> EncodeInfo(const ObjectServerInfo& info) {
  wire::InfoReply head{};
  head.region_key = info.region_key;
  head.region_length = info.region_length;
  head.block_size = info.block_size;
  head.id_bits = static_cast<uint8_t>(info.id_bits);
  head.hybrid = info.hybrid ? 1 : 0;
  head.num_classes = static_cast<uint16_t>(info.classes.size());
  std::vector<std::byte> out(sizeof(head) + info.classes.size() * sizeof(wire::WireClass));
  std::memcpy(out.data(), &head, sizeof(head));
  for (size_t i = 0; i < info.classes.size(); ++i) {
    const wire::WireClass wc{info.classes[i].slot_size, info.classes[i].payload_capacity,
                             info.classes[i].id_mask, info.classes[i].block_bytes};
    std::memcpy(out.data() + sizeof(head) + i * sizeof(wc), &wc, sizeof(wc));
  }
  return out;
}

void CheckInfo(const ObjectServerInfo& info, std::span<const std::byte> reply) {
  const uint32_t bs = info.block_size;
  FUZZ_CHECK(bs >= 4096 && bs <= (1u << 20) && (bs & (bs - 1)) == 0);
  FUZZ_CHECK(info.id_bits == 0 || info.id_bits == 8 || info.id_bits == 12 || info.id_bits == 16);
  FUZZ_CHECK(!info.classes.empty() && info.classes.size() <= corm::kMaxSizeClasses &&
             info.region_length >= bs);
  const uint32_t full = info.id_bits == 0 ? 0 : (1u << info.id_bits) - 1;
  uint32_t prev = 0;
  for (const auto& c : info.classes) {
    FUZZ_CHECK(c.slot_size >= 16 && c.slot_size % corm::kSlotAlign == 0 &&
               c.slot_size <= c.block_bytes && c.block_bytes % bs == 0 &&
               c.block_bytes <= info.region_length);
    const uint32_t slots = c.block_bytes / c.slot_size;
    FUZZ_CHECK(c.slots_per_block == slots);
    FUZZ_CHECK(slots == 1 || (c.block_bytes & (c.block_bytes - 1)) == 0);
    FUZZ_CHECK(c.slot_size > prev);
    prev = c.slot_size;
    FUZZ_CHECK(c.payload_capacity == corm::PayloadCapacity(c.slot_size));
    FUZZ_CHECK(c.payload_capacity < c.slot_size);
    FUZZ_CHECK(c.id_mask == 0 || c.id_mask == full);
  }
  // Round trip: the geometry re-encodes to exactly the reply (hybrid was 0/1, nothing dropped).
  const std::vector<std::byte> again = EncodeInfo(info);
  FUZZ_CHECK(again.size() == reply.size() &&
             std::memcmp(again.data(), reply.data(), again.size()) == 0);
}

struct Reader {
  std::span<const uint8_t> in;
  std::span<const uint8_t> take(size_t n) {
    n = std::min(n, in.size());
    auto out = in.first(n);
    in = in.subspan(n);
    return out;
  }
};

// One pointer and a slot image from the input, checked against `info`.
void FuzzPointer(const ObjectServerInfo& info, Reader& in, uint8_t mode) {
  const auto raw = in.take(16);
  if (raw.size() < 16) return;
  Ptr p;
  std::memcpy(&p.offset, raw.data(), 8);
  std::memcpy(&p.id, raw.data() + 8, 2);
  std::memcpy(&p.gen, raw.data() + 10, 2);
  // Not checked by CheckPtrShape; its bytes pick the other class and tag tried below.
  std::memcpy(&p.server, raw.data() + 12, 2);
  p.size_class = raw[14];
  p.flags = raw[15];
  const Status shape = oi::CheckPtrShape(info, p, "fuzz");
  if (!shape.ok()) {
    FUZZ_CHECK(shape.code() == Code::kInvalidArgument);
    return;
  }
  FUZZ_CHECK(p.valid() && p.size_class < info.classes.size());
  const auto& cls = info.classes[p.size_class];
  FUZZ_CHECK(p.offset % corm::kSlotAlign == 0 && p.offset < info.region_length &&
             cls.slot_size <= info.region_length - p.offset);
  // The slot lies inside its class's block, which lies inside the region.
  const uint64_t block_start = oi::BlockStart(info, p.size_class, p.offset);
  FUZZ_CHECK(block_start <= p.offset && p.offset + cls.slot_size <= block_start + cls.block_bytes &&
             block_start + cls.block_bytes <= info.region_length);
  FUZZ_CHECK((p.id & ~cls.id_mask) == 0);

  // A one-sided copy of that slot (the server's memory, or garbage a broken server sent).
  const auto image = in.take(cls.slot_size);
  if (image.size() < cls.slot_size) return;
  const uint64_t addr = p.offset;  // absolute alignment mod 64 is what matters; region is aligned
  // The header tag the client expects (object_client.cc): the ID in the class's ID bits, the
  // generation's low bits above them (offset-only classes: all of the generation); the client
  // compares all 16 bits, and the class.
  const uint16_t mask = static_cast<uint16_t>(cls.id_mask);
  const uint16_t tag = corm::TagOf(p.id, p.gen, mask);
  FUZZ_CHECK((tag & mask) == p.id);
  if (mask == 0) FUZZ_CHECK(tag == p.gen);
  constexpr uint16_t kFull = corm::hdr::kTagMask;
  const corm::SlotCheck check = corm::CheckSlot(image, addr, tag, kFull, p.size_class);
  uint64_t word;
  std::memcpy(&word, image.data(), sizeof(word));
  const corm::Header h = corm::Header::Unpack(word);
  const corm::SlotCheck head_check =
      oi::CheckHeaderWord(word, tag, kFull, p.size_class, h.home_block);
  // The header-only check (seqlock's first read) agrees with the copy's check on everything but
  // torn versions, which one word cannot show.
  if (check == corm::SlotCheck::kTorn) {
    FUZZ_CHECK(head_check == corm::SlotCheck::kOk);
  } else {
    FUZZ_CHECK(head_check == check);
  }
  // With the home the client expects (the pointer's block): a slot homed elsewhere is another
  // object, "moved"; the other verdicts come first.
  const uint32_t home = oi::HomeBlockOf(info, p.size_class, p.offset);
  const corm::SlotCheck home_check = oi::CheckHeaderWord(word, tag, kFull, p.size_class, home);
  if (h.home_block == home || head_check != corm::SlotCheck::kOk) {
    FUZZ_CHECK(home_check == head_check);
  } else {
    FUZZ_CHECK(home_check == corm::SlotCheck::kMoved);
  }
  if (check != corm::SlotCheck::kOk) return;
  // An accepted slot is refused for any other class (never a move: objects keep their class) and
  // for any other tag (another ID or generation: moved, or a stale pointer).
  const uint32_t other_class =
      (p.size_class + 1u + raw[12] % (corm::kMaxSizeClasses - 1)) % corm::kMaxSizeClasses;
  FUZZ_CHECK(corm::CheckSlot(image, addr, tag, kFull, other_class) == corm::SlotCheck::kWrongClass);
  const auto other_tag = static_cast<uint16_t>(tag ^ (1u << (raw[13] % 16)));
  FUZZ_CHECK(corm::CheckSlot(image, addr, other_tag, kFull, p.size_class) ==
             corm::SlotCheck::kMoved);
  std::vector<uint8_t> payload(cls.payload_capacity + (mode & 0x10 ? 17 : 0), 0xee);
  const size_t n = corm::DecodePayload(image, addr, payload);
  FUZZ_CHECK(n == cls.payload_capacity);
  for (size_t i = n; i < payload.size(); ++i) FUZZ_CHECK(payload[i] == 0xee);
  payload.resize(n);
  // Every byte of an accepted slot is header, version or payload: re-encoding gives it back.
  std::vector<uint8_t> rebuilt(cls.slot_size);
  corm::EncodeSlot(rebuilt, addr, h, payload);
  // The header fields tile the whole word (no reserved bits), so it comes back bit for bit.
  uint64_t rebuilt_word;
  std::memcpy(&rebuilt_word, rebuilt.data(), sizeof(rebuilt_word));
  FUZZ_CHECK(rebuilt_word == word);
  // Version bytes come back as they were; other bytes either are payload (identical) or the
  // slack a slot has at addresses with fewer line starts than the worst case (EncodeSlot zeroes
  // it; DecodePayload never returned it).
  size_t slack = 0;
  for (size_t i = corm::kHeaderBytes; i < cls.slot_size; ++i) {
    if (rebuilt[i] == image[i]) continue;
    FUZZ_CHECK(!corm::IsVersionByte(addr, cls.slot_size, i) && rebuilt[i] == 0);
    ++slack;
  }
  FUZZ_CHECK(slack <= corm::MaxLineVersionBytes(cls.slot_size) -
                          corm::LineVersionBytes(addr, cls.slot_size));
  FUZZ_CHECK(corm::CheckSlot(rebuilt, addr, tag, kFull, p.size_class) == corm::SlotCheck::kOk);
  std::vector<uint8_t> again(payload.size());
  FUZZ_CHECK(corm::DecodePayload(rebuilt, addr, again) == payload.size() && again == payload);

  // The scan fallback over a "block" made of this slot and what follows in the input.
  std::vector<uint8_t> block(image.begin(), image.end());
  const auto more = in.take(std::min<size_t>(in.in.size(), 4 * cls.slot_size));
  block.insert(block.end(), more.begin(), more.end());
  const int64_t at = corm::ScanBlockImage(block, cls.slot_size, tag, kFull, p.size_class);
  FUZZ_CHECK(at == 0);  // the first slot matches (allocated, same class and tag)
  // Past it, whatever the scan finds is a whole allocated slot of that class and tag.
  const std::span<const uint8_t> rest = std::span<const uint8_t>(block).subspan(cls.slot_size);
  const int64_t next = corm::ScanBlockImage(rest, cls.slot_size, tag, kFull, p.size_class);
  FUZZ_CHECK(next >= -1);
  if (next >= 0) {
    FUZZ_CHECK(next % cls.slot_size == 0 &&
               static_cast<size_t>(next) + cls.slot_size <= rest.size());
    uint64_t w;
    std::memcpy(&w, rest.data() + next, sizeof(w));
    const corm::Header found = corm::Header::Unpack(w);
    FUZZ_CHECK(found.allocated && found.size_class == p.size_class && found.tag == tag);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  farmem::fuzz::RestoreCrashSignals();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  Reader in{std::span(data + 1, size - 1)};
  size_t info_len = in.in.size();
  if ((mode & 1) == 0 && in.in.size() >= sizeof(wire::InfoReply)) {
    wire::InfoReply head;
    std::memcpy(&head, in.in.data(), sizeof(head));
    info_len = sizeof(head) + size_t{head.num_classes} * sizeof(wire::WireClass);
  }
  const auto info_bytes = std::as_bytes(in.take(info_len));
  auto info = oi::DecodeInfoReply(info_bytes, "fuzz:1");
  if (!info.ok()) {
    FUZZ_CHECK(info.status().code() == Code::kProtocol);
    return 0;
  }
  CheckInfo(*info, info_bytes);
  for (int i = 0; i < 64 && !in.in.empty(); ++i) FuzzPointer(*info, in, mode);
  return 0;
}
