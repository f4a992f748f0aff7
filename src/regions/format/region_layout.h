// Region layout (docs/regions.md "Layout"): chunk and step sizes, the 64-bit map entry that names
// where a 128 KiB chunk of a region lives, and the binary records the region store keeps in the
// cluster metadata store (inode, directory entry, allocation unit). Pure data, no threads.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "farmem/status.h"

namespace farmem::regions {

// A region's bytes live in chunks of 2^17 = 128 KiB; a region's map has one entry per chunk.
inline constexpr unsigned kChunkShift = 17;
inline constexpr uint64_t kChunkBytes = uint64_t{1} << kChunkShift;
// MULTIHOSTED regions are spread round-robin over the servers in steps of 2 MiB (the paper's
// ALLOC_SIZE, its largest contiguous transfer); the store also allocates memory from farmemd in
// units of this size, carving chunks out of them.
inline constexpr unsigned kStepShift = 21;
inline constexpr uint64_t kStepBytes = uint64_t{1} << kStepShift;
inline constexpr uint64_t kChunksPerStep = kStepBytes / kChunkBytes;
static_assert(kChunksPerStep == 16, "a unit's chunk bitmap is 16 bits wide");

// Map entry: gid << 47 | off >> 17, where gid (17 bits, 0 reserved) names an allocation unit in
// the store's unit table and off is the chunk's 128 KiB-aligned offset inside that unit. 0 is a
// hole: the chunk was never written (or was cut off), it reads as zeros without a remote read.
// (gid names a unit, not a whole pool, because ALLOC_RAW aligns to 64 bytes only; a unit's base
// is wherever ALLOC_RAW put it, so off is unit-relative.)
inline constexpr unsigned kGidBits = 17;
inline constexpr unsigned kOffBits = 47;
static_assert(kGidBits + kOffBits == 64, "one map entry is one 64-bit word");
inline constexpr uint32_t kMaxGid = (uint32_t{1} << kGidBits) - 1;
using MapEntry = uint64_t;
inline constexpr MapEntry kHole = 0;

constexpr MapEntry MakeMapEntry(uint32_t gid, uint64_t unit_offset) {
  return (uint64_t{gid} << kOffBits) | (unit_offset >> kChunkShift);
}
constexpr uint32_t EntryGid(MapEntry e) {
  return static_cast<uint32_t>(e >> kOffBits);
}
constexpr uint64_t EntryUnitOffset(MapEntry e) {
  return (e & ((uint64_t{1} << kOffBits) - 1)) << kChunkShift;
}
static_assert(EntryGid(MakeMapEntry(kMaxGid, 15 * kChunkBytes)) == kMaxGid);
static_assert(EntryUnitOffset(MakeMapEntry(kMaxGid, 15 * kChunkBytes)) == 15 * kChunkBytes);
static_assert(MakeMapEntry(1, 0) != kHole, "gid 0 is reserved so that no chunk encodes as a hole");

// Chunk index of a byte offset, and the number of chunks that cover `size` bytes.
constexpr uint64_t ChunkOf(uint64_t offset) {
  return offset >> kChunkShift;
}
constexpr uint64_t ChunksFor(uint64_t size) {
  return (size + kChunkBytes - 1) >> kChunkShift;
}
// Which of `servers` holds the step of a MULTIHOSTED region that contains chunk `chunk`
// (round-robin from the region's first server `home`).
constexpr uint32_t StepServer(uint64_t chunk, uint32_t home, uint32_t servers) {
  return static_cast<uint32_t>((home + chunk / kChunksPerStep) % servers);
}

// Largest region: its map must fit in one metadata value (1 MiB, kClusterMaxValueBytes) with room
// for the header and a symlink target: 2^16 chunks = 8 GiB.
inline constexpr uint64_t kMaxRegionChunks = uint64_t{1} << 16;
inline constexpr uint64_t kMaxRegionBytes = kMaxRegionChunks * kChunkBytes;

// Region attributes (docs/regions.md "Attributes"), kept as flags on every inode; a directory's
// flags are the defaults its new children inherit.
enum RegionAttr : uint16_t {
  kAttrPersistent = 1 << 0,   // survives its creating process
  kAttrMultihosted = 1 << 1,  // 2 MiB steps round-robin over every server
  kAttrOneWriter = 1 << 2,    // at most one open-for-writing handle at a time (else EBUSY)
  kAttrFixVaddr = 1 << 3,     // rmmap maps it at the same virtual address in every process
};
// HOSTALLOC (not a flag: a list): the servers a region's chunks may come from, as
// comma-separated farmemd bootstrap addresses ("" = all); at most this many bytes.
inline constexpr uint32_t kMaxHostallocBytes = 4096;
inline constexpr uint16_t kAttrKnown =
    kAttrPersistent | kAttrMultihosted | kAttrOneWriter | kAttrFixVaddr;

// FIXVADDR (docs/regions_mmap.md "FIXVADDR"): a region with the attribute holds one slot of a
// fixed range of virtual addresses, [kFixVaddrBase, + kFixVaddrSlots * kFixVaddrSlotBytes) =
// [16 TiB, 48 TiB), the same for every process and host; its slot is recorded in the key
// "<prefix>fixvaddr/<slot>" (value: the inode number, decimal). A slot holds the largest region.
inline constexpr uint64_t kFixVaddrBase = uint64_t{1} << 44;
inline constexpr uint64_t kFixVaddrSlotBytes = kMaxRegionBytes;
inline constexpr uint32_t kFixVaddrSlots = 4096;
static_assert(kFixVaddrBase + uint64_t{kFixVaddrSlots} * kFixVaddrSlotBytes <= uint64_t{1} << 47,
              "the FIXVADDR range fits in 47-bit user space");
constexpr uint64_t FixVaddrOf(uint32_t slot) {
  return kFixVaddrBase + uint64_t{slot} * kFixVaddrSlotBytes;
}
// Inode state, kept with the attribute flags but never inherited: the region's owner process
// exited (not PERSISTENT), so reads, writes and opens through any mount's handles fail with EIO.
inline constexpr uint16_t kStateRevoked = 1 << 15;
inline constexpr uint16_t kInodeFlagsKnown = kAttrKnown | kStateRevoked;

// ---- Metadata records (values in the cluster store; little-endian hosts only) ----

inline constexpr uint32_t kInodeMagic = 0x4e494752;  // "RGIN"
inline constexpr uint16_t kInodeVersion = 1;
inline constexpr uint32_t kMaxSymlinkBytes = 4096;

// Value of key "<prefix>inode/<ino>": this header, then `map_entries` MapEntry words, then
// `target_len` bytes of symlink target, then `hostalloc_len` bytes of HOSTALLOC list.
struct InodeRecordHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t attr_flags;  // RegionAttr bits
  uint32_t mode;        // S_IFREG / S_IFDIR / S_IFLNK | permission bits
  uint32_t uid;
  uint32_t gid;
  uint32_t nlink;
  uint64_t ino;
  uint64_t size;
  int64_t atime_ns;
  int64_t mtime_ns;
  int64_t ctime_ns;
  int32_t owner_pid;  // OWNERPID: the creating process (0 = unknown)
  uint32_t map_entries;
  uint32_t target_len;
  uint32_t hostalloc_len;  // files and directories; was a reserved 0, so older records have none
};
static_assert(sizeof(InodeRecordHeader) == 80, "inode record header is 80 bytes");

// Value of key "<prefix>dirent/<parent ino>/<name>": the child's inode number.
struct DirentRecord {
  uint64_t ino;
};
static_assert(sizeof(DirentRecord) == 8, "dirent record is 8 bytes");

// Value of key "<prefix>unit/<gid>": an ALLOC_RAW range of the server at `address`.
struct UnitRecordHeader {
  uint32_t magic;  // kUnitMagic
  uint32_t address_len;
  uint64_t key;     // RegionKey of the pool
  uint64_t offset;  // base offset in that pool
  uint64_t length;  // kStepBytes
};
static_assert(sizeof(UnitRecordHeader) == 32, "unit record header is 32 bytes");
inline constexpr uint32_t kUnitMagic = 0x4e555247;  // "GRUN"

// Value of key "<prefix>free/<ino>/<tag>" (docs/regions.md "Several mounts"): chunks cut from
// inode `ino` (by a truncate or a punched hole, or all of them when the record of an unlinked file
// went) that go back to their units only once no mount has the inode open; `entries` MapEntry
// words follow.
struct FreeRecordHeader {
  uint32_t magic;  // kFreeMagic
  uint16_t version;
  uint16_t reserved;  // 0
  uint64_t ino;
  uint32_t entries;
  uint32_t reserved2;  // 0
};
static_assert(sizeof(FreeRecordHeader) == 24, "free record header is 24 bytes");
inline constexpr uint32_t kFreeMagic = 0x52464752;  // "RGFR"
inline constexpr uint16_t kFreeVersion = 1;

// The decoded forms.
struct InodeRecord {
  InodeRecordHeader h{};
  std::vector<MapEntry> map;
  std::string target;
  std::string hostalloc;  // HOSTALLOC: "addr,addr,..." or "" (all servers)
};

// OK if `list` is a well-formed HOSTALLOC value: "" or comma-separated non-empty entries of
// printable non-space bytes, at most kMaxHostallocBytes. InvalidArgument otherwise.
Status CheckHostalloc(std::string_view list);
// The entries of a well-formed HOSTALLOC value.
std::vector<std::string> SplitHostalloc(std::string_view list);
struct UnitRecord {
  std::string address;
  uint64_t key = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

std::string EncodeInode(const InodeRecord& r);
// InvalidArgument (naming the field) for anything malformed: metadata may be hostile.
Result<InodeRecord> DecodeInode(std::string_view bytes);
std::string EncodeUnit(const UnitRecord& r);
Result<UnitRecord> DecodeUnit(std::string_view bytes);
struct FreeRecord {
  uint64_t ino = 0;
  std::vector<MapEntry> chunks;  // no holes
};
std::string EncodeFree(const FreeRecord& r);
// InvalidArgument for anything malformed (a hole or an entry outside a unit, lengths that do not
// add up, more entries than the largest region has).
Result<FreeRecord> DecodeFree(std::string_view bytes);

// Text records of the multi-mount protocol: space-separated key=value fields, values without
// spaces (docs/regions.md "Several mounts", key table).
//   "<prefix>mount/<mount>" (bound to that mount's lease): host=<host id> pid=<pid>
//   "<prefix>owner/<ino>": mount=<mount> host=<host id> pid=<tgid> start=<start time>
// A host id names a kernel and pid namespace ("<boot id>/<pid namespace>"): a process id means
// the same process to every mount with the same host id. start: field 22 of /proc/<pid>/stat
// ("" when unknown), so a reused pid is not taken for the owner.
struct OwnerRecord {
  std::string mount;
  std::string host;
  int32_t pid = 0;
  std::string start;
};
std::string EncodeOwner(const OwnerRecord& r);
// InvalidArgument for a missing or malformed field.
Result<OwnerRecord> DecodeOwner(std::string_view text);
struct MountRecord {
  std::string host;
  int32_t pid = 0;
};
std::string EncodeMount(const MountRecord& r);
Result<MountRecord> DecodeMount(std::string_view text);

// ---- Map descriptor: the xattr "user.region.map" of a file in a mount (docs/regions_mmap.md) ----
// What a process needs to rmmap a mounted file without the mount's RegionStore: the file's size,
// the servers and the cluster token to reach them, and where each chunk lives. Layout: this
// header, `token_len` bytes of cluster token, `addresses_len` bytes of server bootstrap addresses
// ("host:port,host:port"; server i is the i-th), `units` MapUnit records, then `chunks` uint32
// chunk words: 0 for a hole, else (unit index + 1) << 4 | the chunk's slot in that unit.
inline constexpr uint32_t kMapMagic = 0x504d4752;  // "RGMP"
inline constexpr uint16_t kMapVersion = 1;
// A getxattr value is at most 64 KiB (XATTR_SIZE_MAX): about 1.5 GiB of allocated chunks.
inline constexpr size_t kMaxMapDescriptorBytes = 65536;
struct MapDescriptorHeader {
  uint32_t magic;  // kMapMagic
  uint16_t version;
  uint16_t servers;  // entries in the address list
  uint64_t ino;
  uint64_t size;         // the file's size in bytes when the descriptor was made
  uint32_t chunk_bytes;  // kChunkBytes (a reader refuses another chunk size)
  uint32_t units;
  uint32_t chunks;
  uint32_t token_len;
  uint32_t addresses_len;
  // FIXVADDR: 0 for none, else the region's slot + 1 (its address is FixVaddrOf(slot)); was a
  // reserved 0, so an older descriptor reads as "not FIXVADDR".
  uint32_t vaddr_slot;
};
static_assert(sizeof(MapDescriptorHeader) == 48, "map descriptor header is 48 bytes");
// A 2 MiB allocation unit: pool `key` of server `server`, starting at `offset`.
struct MapUnit {
  uint32_t server;
  uint32_t reserved;  // 0
  uint64_t key;
  uint64_t offset;
};
static_assert(sizeof(MapUnit) == 24, "map unit record is 24 bytes");
static_assert(kChunksPerStep <= 16, "a chunk word keeps the slot in its low 4 bits");

struct MapDescriptor {
  uint64_t ino = 0;
  uint64_t size = 0;
  uint64_t vaddr = 0;  // FIXVADDR: the address every process maps it at (0: anywhere)
  std::string token;
  std::vector<std::string> servers;
  std::vector<MapUnit> units;
  std::vector<uint32_t> chunks;  // words as above; chunks past the end of the vector are holes
};
constexpr uint32_t MapChunkWord(uint32_t unit_index, uint64_t slot) {
  return ((unit_index + 1) << 4) | static_cast<uint32_t>(slot);
}
// ResourceExhausted ("E2BIG") when the encoding exceeds kMaxMapDescriptorBytes.
Result<std::string> EncodeMapDescriptor(const MapDescriptor& d);
// InvalidArgument (naming the field) for anything malformed: unit or server indexes out of range,
// a slot past a unit, lengths that do not add up, another version or chunk size.
Result<MapDescriptor> DecodeMapDescriptor(std::string_view bytes);

}  // namespace farmem::regions
