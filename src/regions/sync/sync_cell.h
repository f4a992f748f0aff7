// The layouts of the regions synchronization primitives (docs/regions_sync.md): the 64-byte cell
// a name maps to in a farmemd raw range, and the text record that maps the name in the cluster
// store. Pure data and codecs; used by every thread of a RegionSync user (no state of its own).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "farmem/status.h"

namespace farmem::regions::sync {

// What a name denotes; a call of another kind on it is FailedPrecondition.
enum class Kind : uint8_t { kBarrier = 1, kMutex = 2, kBell = 3 };
std::string_view KindName(Kind kind);

// "RSYC": the first 4 bytes of every live cell's magic word.
inline constexpr uint32_t kCellMagic = 0x52535943u;
inline constexpr uint32_t kCellVersion = 1;

// One name's state in remote memory: 8 little-endian u64 words, one 64-byte allocation of its
// own (ALLOC_RAW, persistent). Words 0-3 are written once by the creator before the name is
// published; words 4-7 change only by one-sided FAA/CAS afterwards.
struct Cell {
  // kCellMagic << 32 | kCellVersion << 8 | kind. Set to 0 by rdelete ("deleted").
  uint64_t magic_kind;
  // Random per cell, also in the name record: a cell whose memory was freed by rdelete and
  // reused for another name (or anything else) does not match, so a stale handle notices.
  uint64_t nonce;
  // Barrier: the party count n (>= 1). Others: 0.
  uint64_t parties;
  uint64_t reserved0;
  // Barrier: arrivals ever (c = FAA(+1); round c/n releases once this is >= (c/n+1)*n).
  // Mutex: next ticket. Bell: the value (rings ever).
  uint64_t counter;
  // Mutex: the ticket being served (advanced only by whoever is responsible for it).
  uint64_t serving;
  // Mutex: bit (t % 64) set = ticket t was abandoned by a waiter that timed out; the party that
  // clears it (CAS) while serving == t advances serving past it.
  uint64_t abandoned;
  uint64_t reserved1;
};
static_assert(sizeof(Cell) == 64, "a sync cell is one 64-byte ALLOC_RAW grain");
static_assert(offsetof(Cell, counter) == 32 && offsetof(Cell, serving) == 40 &&
                  offsetof(Cell, abandoned) == 48,
              "word offsets are part of the layout (docs/regions_sync.md)");
// Waiters a mutex can have at once (one abandon bit each).
inline constexpr uint64_t kMaxMutexWaiters = 64;

inline uint64_t MagicKind(Kind kind) {
  return (uint64_t{kCellMagic} << 32) | (uint64_t{kCellVersion} << 8) | static_cast<uint8_t>(kind);
}

// Where a name's cell is: the record stored (put-if-absent) under "<prefix><name>".
// Text: "farmem-sync 1 <kind> <parties> <nonce hex> <key hex> <offset> <farmemd address>".
struct NameRecord {
  Kind kind = Kind::kBarrier;
  uint64_t parties = 0;
  uint64_t nonce = 0;
  uint64_t key = 0;     // the farmemd region key of the cell's range
  uint64_t offset = 0;  // the cell's offset in that region
  std::string address;  // the farmemd's bootstrap address "host:port"
};
std::string EncodeNameRecord(const NameRecord& record);
// Protocol error for anything malformed (a foreign or corrupted key never crashes a caller).
Result<NameRecord> DecodeNameRecord(std::string_view text);

// Names: 1..200 bytes of [A-Za-z0-9_.-/]; InvalidArgument otherwise.
Status ValidateSyncName(std::string_view name);

}  // namespace farmem::regions::sync
