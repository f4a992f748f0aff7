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
  h.hostalloc_len = static_cast<uint32_t>(r.hostalloc.size());
  std::string out(
      sizeof(h) + r.map.size() * sizeof(MapEntry) + r.target.size() + r.hostalloc.size(), '\0');
  std::memcpy(out.data(), &h, sizeof(h));
  if (!r.map.empty())
    std::memcpy(out.data() + sizeof(h), r.map.data(), r.map.size() * sizeof(MapEntry));
  if (!r.target.empty())
    std::memcpy(out.data() + sizeof(h) + r.map.size() * sizeof(MapEntry), r.target.data(),
                r.target.size());
  if (!r.hostalloc.empty())
    std::memcpy(out.data() + out.size() - r.hostalloc.size(), r.hostalloc.data(),
                r.hostalloc.size());
  return out;
}

Result<InodeRecord> DecodeInode(std::string_view bytes) {
  InodeRecord r;
  if (bytes.size() < sizeof(InodeRecordHeader))
    return Status::InvalidArgument("inode record: shorter than its header");
  std::memcpy(&r.h, bytes.data(), sizeof(r.h));
  if (r.h.magic != kInodeMagic) return Status::InvalidArgument("inode record: bad magic");
  if (r.h.version != kInodeVersion) return Status::InvalidArgument("inode record: bad version");
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
  if (r.h.hostalloc_len > kMaxHostallocBytes)
    return Status::InvalidArgument("inode record: HOSTALLOC list too long");
  uint64_t want = sizeof(InodeRecordHeader) + uint64_t{r.h.map_entries} * sizeof(MapEntry) +
                  r.h.target_len + r.h.hostalloc_len;
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
  if (type == S_IFLNK && r.h.hostalloc_len != 0)
    return Status::InvalidArgument("inode record: a symlink with a HOSTALLOC list");
  r.hostalloc.assign(bytes.data() + bytes.size() - r.h.hostalloc_len, r.h.hostalloc_len);
  Status ha = CheckHostalloc(r.hostalloc);
  if (!ha.ok()) return Status::InvalidArgument("inode record: " + std::string(ha.message()));
  return r;
}

Status CheckHostalloc(std::string_view list) {
  if (list.size() > kMaxHostallocBytes)
    return Status::InvalidArgument("HOSTALLOC list longer than 4096 bytes");
  if (list.empty()) return Status::OK();
  size_t entry = 0;
  for (char ch : list) {
    auto c = static_cast<unsigned char>(ch);
    if (c == ',') {
      if (entry == 0) return Status::InvalidArgument("HOSTALLOC list with an empty entry");
      entry = 0;
    } else if (c <= 0x20 || c >= 0x7f) {
      return Status::InvalidArgument("HOSTALLOC list with a space or non-printable byte");
    } else {
      ++entry;
    }
  }
  if (entry == 0) return Status::InvalidArgument("HOSTALLOC list with an empty entry");
  return Status::OK();
}

std::vector<std::string> SplitHostalloc(std::string_view list) {
  std::vector<std::string> out;
  while (!list.empty()) {
    size_t comma = list.find(',');
    out.emplace_back(list.substr(0, comma));
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
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

Result<std::string> EncodeMapDescriptor(const MapDescriptor& d) {
  std::string addresses;
  for (size_t i = 0; i < d.servers.size(); ++i) addresses += (i ? "," : "") + d.servers[i];
  const uint64_t total = sizeof(MapDescriptorHeader) + d.token.size() + addresses.size() +
                         d.units.size() * sizeof(MapUnit) + d.chunks.size() * sizeof(uint32_t);
  if (total > kMaxMapDescriptorBytes)
    return Status::ResourceExhausted("E2BIG: map descriptor of " + std::to_string(total) +
                                     " bytes is larger than an xattr value (64 KiB)");
  MapDescriptorHeader h{};
  h.magic = kMapMagic;
  h.version = kMapVersion;
  h.servers = static_cast<uint16_t>(d.servers.size());
  h.ino = d.ino;
  h.size = d.size;
  h.chunk_bytes = static_cast<uint32_t>(kChunkBytes);
  h.units = static_cast<uint32_t>(d.units.size());
  h.chunks = static_cast<uint32_t>(d.chunks.size());
  h.token_len = static_cast<uint32_t>(d.token.size());
  h.addresses_len = static_cast<uint32_t>(addresses.size());
  std::string out(reinterpret_cast<const char*>(&h), sizeof(h));
  out += d.token;
  out += addresses;
  out.append(reinterpret_cast<const char*>(d.units.data()), d.units.size() * sizeof(MapUnit));
  out.append(reinterpret_cast<const char*>(d.chunks.data()), d.chunks.size() * sizeof(uint32_t));
  return out;
}

Result<MapDescriptor> DecodeMapDescriptor(std::string_view bytes) {
  MapDescriptorHeader h;
  if (bytes.size() < sizeof(h))
    return Status::InvalidArgument("map descriptor: shorter than its header");
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic != kMapMagic) return Status::InvalidArgument("map descriptor: bad magic");
  if (h.version != kMapVersion) return Status::InvalidArgument("map descriptor: bad version");
  if (h.chunk_bytes != kChunkBytes)
    return Status::InvalidArgument("map descriptor: another chunk size");
  if (h.size > kMaxRegionBytes) return Status::InvalidArgument("map descriptor: size too large");
  if (h.servers == 0) return Status::InvalidArgument("map descriptor: no server");
  const uint64_t want = sizeof(h) + uint64_t{h.token_len} + h.addresses_len +
                        uint64_t{h.units} * sizeof(MapUnit) + uint64_t{h.chunks} * sizeof(uint32_t);
  if (bytes.size() != want) return Status::InvalidArgument("map descriptor: length mismatch");
  MapDescriptor d;
  d.ino = h.ino;
  d.size = h.size;
  size_t at = sizeof(h);
  d.token.assign(bytes.data() + at, h.token_len);
  at += h.token_len;
  std::string_view addresses = bytes.substr(at, h.addresses_len);
  at += h.addresses_len;
  if (!CheckHostalloc(addresses).ok())
    return Status::InvalidArgument("map descriptor: malformed server list");
  d.servers = SplitHostalloc(addresses);
  if (d.servers.size() != h.servers)
    return Status::InvalidArgument("map descriptor: server count mismatch");
  d.units.resize(h.units);
  if (h.units) std::memcpy(d.units.data(), bytes.data() + at, h.units * sizeof(MapUnit));
  at += h.units * sizeof(MapUnit);
  d.chunks.resize(h.chunks);
  if (h.chunks) std::memcpy(d.chunks.data(), bytes.data() + at, h.chunks * sizeof(uint32_t));
  for (const MapUnit& u : d.units)
    if (u.server >= d.servers.size())
      return Status::InvalidArgument("map descriptor: unit of an unknown server");
  for (uint32_t w : d.chunks)
    if (w != 0 && ((w >> 4) == 0 || (w >> 4) > d.units.size() || (w & 15) >= kChunksPerStep))
      return Status::InvalidArgument("map descriptor: chunk word outside any unit");
  return d;
}

}  // namespace farmem::regions
