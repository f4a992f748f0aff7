// Encoding and checked decoding of the region store's metadata records (region_layout.h).
// Decoders treat their input as hostile: every length is checked before it is used.
#include "regions/format/region_layout.h"

#include <sys/stat.h>

#include <cstring>

namespace farmem::regions {

std::string EncodeInode(const InodeRecord& r) {
  InodeRecordHeader h = r.h;
  h.magic = kInodeMagic;
  h.version = kInodeVersion;
  h.map_entries = static_cast<uint32_t>(r.map.size());
  h.target_len = static_cast<uint32_t>(r.target.size());
  h.reserved = 0;
  std::string out(sizeof(h) + r.map.size() * sizeof(MapEntry) + r.target.size(), '\0');
  std::memcpy(out.data(), &h, sizeof(h));
  if (!r.map.empty())
    std::memcpy(out.data() + sizeof(h), r.map.data(), r.map.size() * sizeof(MapEntry));
  if (!r.target.empty())
    std::memcpy(out.data() + sizeof(h) + r.map.size() * sizeof(MapEntry), r.target.data(),
                r.target.size());
  return out;
}

Result<InodeRecord> DecodeInode(std::string_view bytes) {
  InodeRecord r;
  if (bytes.size() < sizeof(InodeRecordHeader))
    return Status::InvalidArgument("inode record: shorter than its header");
  std::memcpy(&r.h, bytes.data(), sizeof(r.h));
  if (r.h.magic != kInodeMagic) return Status::InvalidArgument("inode record: bad magic");
  if (r.h.version != kInodeVersion) return Status::InvalidArgument("inode record: bad version");
  if (r.h.reserved != 0) return Status::InvalidArgument("inode record: reserved field not 0");
  if ((r.h.attr_flags & ~kAttrKnown) != 0)
    return Status::InvalidArgument("inode record: unknown attribute flags");
  uint32_t type = r.h.mode & S_IFMT;
  if (type != S_IFREG && type != S_IFDIR && type != S_IFLNK)
    return Status::InvalidArgument("inode record: mode is not a file, directory or symlink");
  if (r.h.ino == 0) return Status::InvalidArgument("inode record: inode number 0");
  if (r.h.map_entries > kMaxRegionChunks)
    return Status::InvalidArgument("inode record: map longer than the largest region");
  if (r.h.target_len > kMaxSymlinkBytes)
    return Status::InvalidArgument("inode record: symlink target too long");
  if (r.h.size > kMaxRegionBytes) return Status::InvalidArgument("inode record: size too large");
  uint64_t want =
      sizeof(InodeRecordHeader) + uint64_t{r.h.map_entries} * sizeof(MapEntry) + r.h.target_len;
  if (bytes.size() != want) return Status::InvalidArgument("inode record: length mismatch");
  if (type != S_IFREG && r.h.map_entries != 0)
    return Status::InvalidArgument("inode record: only files have a chunk map");
  // A map may reach past the size: fallocate(FALLOC_FL_KEEP_SIZE) preallocates chunks past the
  // end of a file (they are zero, like every byte past the size); kMaxRegionChunks bounds it.
  r.map.resize(r.h.map_entries);
  if (!r.map.empty())
    std::memcpy(r.map.data(), bytes.data() + sizeof(InodeRecordHeader),
                r.map.size() * sizeof(MapEntry));
  for (MapEntry e : r.map) {
    if (e != kHole && (EntryGid(e) == 0 || EntryUnitOffset(e) >= kStepBytes))
      return Status::InvalidArgument("inode record: map entry outside any unit");
  }
  r.target.assign(bytes.data() + sizeof(InodeRecordHeader) + r.map.size() * sizeof(MapEntry),
                  r.h.target_len);
  return r;
}

std::string EncodeUnit(const UnitRecord& r) {
  UnitRecordHeader h{};
  h.magic = kUnitMagic;
  h.address_len = static_cast<uint32_t>(r.address.size());
  h.key = r.key;
  h.offset = r.offset;
  h.length = r.length;
  std::string out(sizeof(h) + r.address.size(), '\0');
  std::memcpy(out.data(), &h, sizeof(h));
  std::memcpy(out.data() + sizeof(h), r.address.data(), r.address.size());
  return out;
}

Result<UnitRecord> DecodeUnit(std::string_view bytes) {
  UnitRecordHeader h;
  if (bytes.size() < sizeof(h)) return Status::InvalidArgument("unit record: shorter than header");
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic != kUnitMagic) return Status::InvalidArgument("unit record: bad magic");
  if (h.address_len == 0 || h.address_len > 256 || bytes.size() != sizeof(h) + h.address_len)
    return Status::InvalidArgument("unit record: bad address length");
  if (h.length != kStepBytes) return Status::InvalidArgument("unit record: length is not 2 MiB");
  UnitRecord r;
  r.address.assign(bytes.data() + sizeof(h), h.address_len);
  r.key = h.key;
  r.offset = h.offset;
  r.length = h.length;
  return r;
}

}  // namespace farmem::regions
