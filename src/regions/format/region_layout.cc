// Encoding and checked decoding of the region store's metadata records (region_layout.h).
// Decoders treat their input as hostile: every length is checked before it is used.
#include "regions/format/region_layout.h"

#include <sys/stat.h>

#include <cstdint>
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
  if ((r.h.attr_flags & ~kInodeFlagsKnown) != 0)
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

std::string EncodeFree(const FreeRecord& r) {
  FreeRecordHeader h{};
  h.magic = kFreeMagic;
  h.version = kFreeVersion;
  h.ino = r.ino;
  h.entries = static_cast<uint32_t>(r.chunks.size());
  std::string out(sizeof(h) + r.chunks.size() * sizeof(MapEntry), '\0');
  std::memcpy(out.data(), &h, sizeof(h));
  if (!r.chunks.empty())
    std::memcpy(out.data() + sizeof(h), r.chunks.data(), r.chunks.size() * sizeof(MapEntry));
  return out;
}

Result<FreeRecord> DecodeFree(std::string_view bytes) {
  FreeRecordHeader h;
  if (bytes.size() < sizeof(h)) return Status::InvalidArgument("free record: shorter than header");
  std::memcpy(&h, bytes.data(), sizeof(h));
  if (h.magic != kFreeMagic) return Status::InvalidArgument("free record: bad magic");
  if (h.version != kFreeVersion) return Status::InvalidArgument("free record: bad version");
  if (h.reserved != 0 || h.reserved2 != 0)
    return Status::InvalidArgument("free record: reserved field not 0");
  if (h.ino == 0) return Status::InvalidArgument("free record: inode number 0");
  if (h.entries > kMaxRegionChunks)
    return Status::InvalidArgument("free record: more chunks than the largest region");
  if (bytes.size() != sizeof(h) + uint64_t{h.entries} * sizeof(MapEntry))
    return Status::InvalidArgument("free record: length mismatch");
  FreeRecord r;
  r.ino = h.ino;
  r.chunks.resize(h.entries);
  if (h.entries)
    std::memcpy(r.chunks.data(), bytes.data() + sizeof(h), h.entries * sizeof(MapEntry));
  for (MapEntry e : r.chunks)
    if (e == kHole || EntryGid(e) == 0 || EntryUnitOffset(e) >= kStepBytes)
      return Status::InvalidArgument("free record: entry outside any unit");
  return r;
}

namespace {
// "k=v k=v ...": the fields, or InvalidArgument for a token without '=' or a repeated key.
Result<std::vector<std::pair<std::string, std::string>>> SplitFields(std::string_view text,
                                                                     std::string_view what) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!text.empty()) {
    size_t sp = text.find(' ');
    std::string_view tok = text.substr(0, sp);
    size_t eq = tok.find('=');
    if (eq == std::string_view::npos || eq == 0)
      return Status::InvalidArgument(std::string(what) + ": malformed field");
    for (const auto& [k, v] : out)
      if (k == tok.substr(0, eq))
        return Status::InvalidArgument(std::string(what) + ": repeated field");
    out.emplace_back(std::string(tok.substr(0, eq)), std::string(tok.substr(eq + 1)));
    if (sp == std::string_view::npos) break;
    text.remove_prefix(sp + 1);
  }
  return out;
}
// A value without spaces or control bytes (what the text records may hold).
bool PlainValue(std::string_view v) {
  for (char ch : v)
    if (static_cast<unsigned char>(ch) <= 0x20 || static_cast<unsigned char>(ch) == 0x7f)
      return false;
  return v.size() <= 256;
}
Result<int32_t> PidField(std::string_view v, std::string_view what) {
  if (v.empty() || v.size() > 10) return Status::InvalidArgument(std::string(what) + ": bad pid");
  int64_t n = 0;
  for (char ch : v) {
    if (ch < '0' || ch > '9') return Status::InvalidArgument(std::string(what) + ": bad pid");
    n = n * 10 + (ch - '0');
  }
  if (n > INT32_MAX) return Status::InvalidArgument(std::string(what) + ": bad pid");
  return static_cast<int32_t>(n);
}
}  // namespace

std::string EncodeOwner(const OwnerRecord& r) {
  return "mount=" + r.mount + " host=" + r.host + " pid=" + std::to_string(r.pid) +
         " start=" + r.start;
}

Result<OwnerRecord> DecodeOwner(std::string_view text) {
  FARMEM_ASSIGN_OR_RETURN(auto fields, SplitFields(text, "owner record"));
  OwnerRecord r;
  bool seen[4] = {};
  for (const auto& [k, v] : fields) {
    if (!PlainValue(v)) return Status::InvalidArgument("owner record: bad value of " + k);
    if (k == "mount") {
      r.mount = v;
      seen[0] = true;
    } else if (k == "host") {
      r.host = v;
      seen[1] = true;
    } else if (k == "pid") {
      FARMEM_ASSIGN_OR_RETURN(r.pid, PidField(v, "owner record"));
      seen[2] = true;
    } else if (k == "start") {
      r.start = v;
      seen[3] = true;
    } else {
      return Status::InvalidArgument("owner record: unknown field " + k);
    }
  }
  if (!seen[0] || !seen[1] || !seen[2] || !seen[3] || r.mount.empty() || r.host.empty())
    return Status::InvalidArgument("owner record: missing field");
  return r;
}

std::string EncodeMount(const MountRecord& r) {
  return "host=" + r.host + " pid=" + std::to_string(r.pid);
}

Result<MountRecord> DecodeMount(std::string_view text) {
  FARMEM_ASSIGN_OR_RETURN(auto fields, SplitFields(text, "mount record"));
  MountRecord r;
  bool host = false, pid = false;
  for (const auto& [k, v] : fields) {
    if (!PlainValue(v)) return Status::InvalidArgument("mount record: bad value of " + k);
    if (k == "host") {
      r.host = v;
      host = !v.empty();
    } else if (k == "pid") {
      FARMEM_ASSIGN_OR_RETURN(r.pid, PidField(v, "mount record"));
      pid = true;
    } else {
      return Status::InvalidArgument("mount record: unknown field " + k);
    }
  }
  if (!host || !pid) return Status::InvalidArgument("mount record: missing field");
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
  if (d.vaddr != 0) {
    if (d.vaddr < kFixVaddrBase || (d.vaddr - kFixVaddrBase) % kFixVaddrSlotBytes != 0 ||
        (d.vaddr - kFixVaddrBase) / kFixVaddrSlotBytes >= kFixVaddrSlots)
      return Status::InvalidArgument("map descriptor: a fixed address outside the FIXVADDR range");
    h.vaddr_slot = static_cast<uint32_t>((d.vaddr - kFixVaddrBase) / kFixVaddrSlotBytes) + 1;
  }
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
  if (h.vaddr_slot > kFixVaddrSlots)
    return Status::InvalidArgument("map descriptor: FIXVADDR slot out of range");
  MapDescriptor d;
  d.ino = h.ino;
  d.size = h.size;
  d.vaddr = h.vaddr_slot == 0 ? 0 : FixVaddrOf(h.vaddr_slot - 1);
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
