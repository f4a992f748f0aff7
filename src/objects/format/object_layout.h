// CoRM object slot layout: the 8-byte header word, the per-cacheline version bytes and the tail
// version byte, plus the encode/decode/consistency-check/re-lay helpers shared by the server and
// (later) by clients doing one-sided reads. Documented in docs/objects.md; keep both in sync.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

namespace farmem::corm {

// Cachelines are ABSOLUTE: a line starts at every virtual address that is a multiple of 64, so
// where the version bytes fall inside a slot depends on the slot's address modulo 64.
inline constexpr size_t kCacheLine = 64;
inline constexpr size_t kHeaderBytes = 8;
// Slots and payload words are 8-byte aligned: the header and every slot word can be loaded and
// stored as one aligned 64-bit atomic.
inline constexpr size_t kSlotAlign = 8;
inline constexpr int kMaxIdBits = 16;

// Header word (little endian, first 8 bytes of a slot):
//   bits  0..15  tag: the object ID in the low id_bits, the allocation's generation above it
//                (TagOf; offset-only classes: all 16 bits are generation)
//   bit  16      lock bit        (a writer owns the slot)
//   bit  17      compaction bit  (the compactor is moving the slot)
//   bit  18      allocated bit
//   bits 19..25  size class of the slot (so a reader can tell a pointer whose class is wrong)
//   bits 26..33  version (wraps at 256)
//   bits 34..63  home virtual block index (the block the object's pointer addresses)
// Why the class is here: nothing else in a slot says how big it is, and a one-sided reader that
// trusts a forged class would read a neighbour's bytes as part of the object. Why the
// generation is in the tag: an ID is only unique among live objects of a block, so a freed slot
// that is reused (often with the same ID in a nearly full block) would look like the old object;
// the generation changes with every allocation of the slot (docs/objects.md, "Pointer identity").
// The home index has 30 bits: a reservation has at most 2^30 blocks (4 TiB of 4 KiB blocks).
namespace hdr {
inline constexpr uint64_t kTagMask = 0xFFFFull;
inline constexpr uint64_t kLockBit = 1ull << 16;
inline constexpr uint64_t kCompactionBit = 1ull << 17;
inline constexpr uint64_t kAllocatedBit = 1ull << 18;
inline constexpr int kClassShift = 19;
inline constexpr uint64_t kClassMask = 0x7Full << kClassShift;
inline constexpr int kVersionShift = 26;
inline constexpr uint64_t kVersionMask = 0xFFull << kVersionShift;
inline constexpr int kHomeShift = 34;
inline constexpr int kHomeBits = 64 - kHomeShift;
}  // namespace hdr

// Size classes and virtual blocks the header can name.
inline constexpr uint32_t kMaxSizeClasses = 1u << 7;
inline constexpr uint64_t kMaxHomeBlocks = uint64_t{1} << hdr::kHomeBits;

static_assert((hdr::kTagMask & hdr::kLockBit) == 0 && (hdr::kLockBit & hdr::kCompactionBit) == 0);
static_assert((hdr::kTagMask | hdr::kLockBit | hdr::kCompactionBit | hdr::kAllocatedBit |
               hdr::kClassMask | hdr::kVersionMask) == (uint64_t{1} << hdr::kHomeShift) - 1,
              "header fields below the home block index must tile bits 0..33 exactly");
static_assert(((hdr::kTagMask ^ hdr::kLockBit ^ hdr::kCompactionBit ^ hdr::kAllocatedBit ^
                hdr::kClassMask ^ hdr::kVersionMask) ==
               (hdr::kTagMask | hdr::kLockBit | hdr::kCompactionBit | hdr::kAllocatedBit |
                hdr::kClassMask | hdr::kVersionMask)),
              "header fields must not overlap");
static_assert(hdr::kTagMask == (1ull << kMaxIdBits) - 1);
static_assert(hdr::kClassMask >> hdr::kClassShift == kMaxSizeClasses - 1);

// The header tag of an allocation: its ID in the bits of `id_mask` ((1 << id_bits) - 1, 0 in
// offset-only classes) and the low (16 - id_bits) bits of its 16-bit generation above them.
// Pointers carry the ID and the whole generation; one-sided readers compare this tag, the server
// compares the whole generation (docs/objects.md, "Pointer identity").
constexpr uint16_t TagOf(uint16_t id, uint16_t gen, uint16_t id_mask) {
  const int id_bits = std::popcount(id_mask);
  const uint32_t shifted = id_bits >= 16 ? 0u : uint32_t{gen} << id_bits;
  return static_cast<uint16_t>((id & id_mask) | (shifted & 0xFFFFu));
}
static_assert(TagOf(0xAB, 0x1234, 0xFF) == 0x34AB);
static_assert(TagOf(0xABC, 0x1234, 0xFFF) == 0x4ABC);
static_assert(TagOf(0xBEEF, 0x1234, 0xFFFF) == 0xBEEF);
static_assert(TagOf(0, 0x1234, 0) == 0x1234);

// Decoded view of a header word.
struct Header {
  uint16_t tag = 0;
  bool locked = false;
  bool compacting = false;
  bool allocated = false;
  uint8_t version = 0;
  uint32_t home_block = 0;  // < kMaxHomeBlocks
  uint8_t size_class = 0;   // < kMaxSizeClasses

  constexpr uint64_t Pack() const {
    return uint64_t{tag} | (locked ? hdr::kLockBit : 0) | (compacting ? hdr::kCompactionBit : 0) |
           (allocated ? hdr::kAllocatedBit : 0) |
           ((uint64_t{size_class} << hdr::kClassShift) & hdr::kClassMask) |
           (uint64_t{version} << hdr::kVersionShift) | (uint64_t{home_block} << hdr::kHomeShift);
  }
  static constexpr Header Unpack(uint64_t w) {
    Header h;
    h.tag = static_cast<uint16_t>(w & hdr::kTagMask);
    h.locked = (w & hdr::kLockBit) != 0;
    h.compacting = (w & hdr::kCompactionBit) != 0;
    h.allocated = (w & hdr::kAllocatedBit) != 0;
    h.size_class = static_cast<uint8_t>((w & hdr::kClassMask) >> hdr::kClassShift);
    h.version = static_cast<uint8_t>((w & hdr::kVersionMask) >> hdr::kVersionShift);
    h.home_block = static_cast<uint32_t>(w >> hdr::kHomeShift);
    return h;
  }
};
static_assert(sizeof(uint64_t) == kHeaderBytes);
static_assert(Header::Unpack(Header{0xBEEF, true, false, true, 0xA5, 0x2345678, 0x55}.Pack())
                  .home_block == 0x2345678);
static_assert(Header::Unpack(Header{0xBEEF, true, false, true, 0xA5, 0x2345678, 0x55}.Pack())
                  .version == 0xA5);
static_assert(Header::Unpack(Header{0xBEEF, true, false, true, 0xA5, 0x2345678, 0x55}.Pack())
                  .size_class == 0x55);
static_assert(Header::Unpack(Header{0xBEEF, true, false, true, 0xA5, 0x2345678, 0x55}.Pack()).tag ==
              0xBEEF);

// Number of cacheline starts strictly inside (addr, addr + slot_size): each holds a copy of the
// version. The header's own line is protected by the header itself.
constexpr size_t LineVersionBytes(uint64_t addr, size_t slot_size) {
  const uint64_t first = (addr / kCacheLine + 1) * kCacheLine;
  const uint64_t end = addr + slot_size;
  return first >= end ? 0 : static_cast<size_t>((end - 1 - first) / kCacheLine + 1);
}

// Worst case of LineVersionBytes over all 8-aligned addresses (slot starting 8 bytes before a
// line start).
constexpr size_t MaxLineVersionBytes(size_t slot_size) {
  return slot_size <= kHeaderBytes ? 0 : (slot_size - kHeaderBytes + kCacheLine - 1) / kCacheLine;
}

// Payload bytes a slot of `slot_size` holds at ANY 8-aligned address: header, worst-case line
// versions and the tail version byte (the slot's last byte) are not payload. Using the worst case
// means an object can move to any offset of its class without losing bytes.
constexpr size_t PayloadCapacity(size_t slot_size) {
  const size_t overhead = kHeaderBytes + MaxLineVersionBytes(slot_size) + 1;
  return slot_size > overhead ? slot_size - overhead : 0;
}
static_assert(PayloadCapacity(16) == 6);
static_assert(PayloadCapacity(64) == 54);
static_assert(PayloadCapacity(72) == 62);
static_assert(PayloadCapacity(80) == 69);
// The tail byte is at addr + size - 1 ≡ 7 (mod 8): never a line start, so it never collides.
static_assert((kSlotAlign - 1) % kCacheLine != 0);

// True when byte `i` of a slot at `addr` holds a copy of the version (line start or tail).
constexpr bool IsVersionByte(uint64_t addr, size_t slot_size, size_t i) {
  return i == slot_size - 1 || (i >= kHeaderBytes && (addr + i) % kCacheLine == 0);
}

// Result of checking a raw copy of a slot.
enum class SlotCheck : uint8_t {
  kOk = 0,
  kTorn,    // a version byte disagrees with the header: the copy mixes two writes
  kLocked,  // a writer or the compactor holds the slot: retry later
  kMoved,   // allocated, but another object's tag: the object moved (or the pointer is stale)
  kFreed,   // the slot is not allocated (freed, or moved away by compaction)
  // Allocated, but a slot of another size class: the pointer's class is forged, or the pointer
  // is stale and its block now holds another class. Never a move: objects keep their class.
  kWrongClass,
};
std::string_view SlotCheckName(SlotCheck c);

// Encodes `payload` (at most PayloadCapacity(slot_size) bytes; the rest is zero-filled) into
// `image` (slot_size bytes), laid out for a slot living at absolute address `addr`, with header
// `h`; every version byte gets h.version.
void EncodeSlot(std::span<uint8_t> image, uint64_t addr, const Header& h,
                std::span<const uint8_t> payload);

// Copies up to out.size() payload bytes out of a slot image laid out for `addr`; returns the
// number copied (min(out.size(), PayloadCapacity)).
size_t DecodePayload(std::span<const uint8_t> image, uint64_t addr, std::span<uint8_t> out);

// The consistency check of a one-sided read: `image` is a copy of the slot at `addr`, which the
// pointer says holds an object of `size_class` whose header tag is `expected_tag` (TagOf). Only
// the tag bits in `tag_mask` are compared (0xFFFF for a pointer's full identity).
// Order of checks: freed, locked, wrong class, moved (tag), torn (versions).
SlotCheck CheckSlot(std::span<const uint8_t> image, uint64_t addr, uint16_t expected_tag,
                    uint16_t tag_mask, uint32_t size_class);

// Re-lays a slot image copied from `src_addr` for a new home at `dst_addr` (same slot size):
// header copied verbatim, payload re-positioned around the destination's version bytes.
void ReLaySlot(std::span<const uint8_t> src, uint64_t src_addr, std::span<uint8_t> dst,
               uint64_t dst_addr);

// ---- Racy access to live slots -------------------------------------------------------------
// Readers copy slots while writers and the compactor change them, so every access to slot memory
// is an aligned 64-bit atomic (no torn words, and no data race in the C++ model / for TSan).
//
// Writer protocol (caller holds the header lock bit, i.e. the header word reads locked):
//   1. store the words that contain a version byte (line starts, tail) with the new version;
//   2. store the remaining payload words with release order (each orders step 1 before it);
//   3. store the header word (new version, lock released) with release order.
// Reader protocol (ReadSlotWords): load words in ascending address order, each at least acquire.
// Why this is sound: the header is loaded first (acquire) and the tail word last. If any loaded
// word came from a later write W's payload stores (release in W, acquire load here), every word W
// stored before it, in particular its tail word, is visible to the later loads, so the tail
// (or a line version word in between) disagrees with the header version and the copy is "torn".
// Line-start words carry their version in the same atomic word as their payload bytes, so they
// are self-consistent. Residual risk: exactly 256*k writes completing during one read (8-bit
// version wrap) — the same assumption FaRM/CoRM make.

// Copies `len` bytes (multiple of 8) from 8-aligned live slot memory, ascending. The loads are
// seq_cst (acquire, plus what a merge's grace period needs: common/copy_epoch.h; on x86 and ARMv8
// the same instruction as acquire), like the TCP NIC thread's CopyForRead.
inline void ReadSlotWords(const void* src, void* dst, size_t len) {
  auto* s = static_cast<uint64_t*>(const_cast<void*>(src));
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < len / 8; ++i) {
    const uint64_t w = std::atomic_ref<uint64_t>(s[i]).load(std::memory_order_seq_cst);
    std::memcpy(d + i * 8, &w, 8);
  }
}

inline uint64_t LoadHeader(const void* slot) {
  return std::atomic_ref<uint64_t>(*static_cast<uint64_t*>(const_cast<void*>(slot)))
      .load(std::memory_order_acquire);
}
inline void StoreHeader(void* slot, uint64_t w) {
  std::atomic_ref<uint64_t>(*static_cast<uint64_t*>(slot)).store(w, std::memory_order_release);
}
// CAS on the header word (seq_cst: a merge's compaction bits are the marker of its grace period,
// common/copy_epoch.h; acquire on failure).
inline bool CasHeader(void* slot, uint64_t& expected, uint64_t desired) {
  return std::atomic_ref<uint64_t>(*static_cast<uint64_t*>(slot))
      .compare_exchange_strong(expected, desired, std::memory_order_seq_cst,
                               std::memory_order_acquire);
}

// Steps 1-3 of the writer protocol: stores `image` (slot_size bytes, laid out for `addr` ==
// address of `slot`) into live memory; the image's header word is stored last.
void PublishSlot(void* slot, std::span<const uint8_t> image);

// One-sided helpers: what a client does with bytes it read over the transport.
// Copies the slot at `addr` (live memory, ascending atomic words) into `copy` and checks it.
SlotCheck OneSidedReadSlot(uint64_t addr, uint16_t expected_tag, uint16_t tag_mask,
                           uint32_t size_class, std::span<uint8_t> copy);
// Finds the slot carrying `tag` (allocated, tag bits in tag_mask equal, header of `size_class`,
// homed at `home` unless kAnyHome) in a copy of a whole block; returns its offset or -1. A forged
// class walks the wrong slot grid, whose headers (where they are headers at all) name the block's
// real class: no match. Why the home: a block shows objects of several homes after merges, and a
// merge that re-draws an ID can leave an object of another home with the tag an old pointer
// carries (docs/objects.md, "Merges that re-draw IDs"); that object is not the pointer's.
inline constexpr uint32_t kAnyHome = UINT32_MAX;
int64_t ScanBlockImage(std::span<const uint8_t> block, uint32_t slot_size, uint16_t tag,
                       uint16_t tag_mask, uint32_t size_class, uint32_t home = kAnyHome);

}  // namespace farmem::corm
