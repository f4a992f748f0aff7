// libFuzzer target for the region store's metadata decoders (region_layout.h): what a hostile or
// corrupted cluster store could hand a mount. Built with -DFARMEM_FUZZ=ON (scripts/test --fuzz).
// Input: byte 0 selects the decoder (even: inode record, 1 mod 4: unit record, 3 mod 4: free
// record, owner and mount records), the rest is the value.
// Checked beyond "no crash": an accepted record re-encodes to exactly the bytes it came from, and
// an accepted inode's map entries are holes or name a chunk inside a 2 MiB unit of a non-zero gid,
// and its HOSTALLOC list is well-formed.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/fuzz_support.h"
#include "regions/format/region_layout.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  farmem::fuzz::RestoreCrashSignals();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace farmem::regions;
  if (size == 0) return 0;
  std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    auto r = DecodeInode(bytes);
    if (!r.ok()) {
      FUZZ_CHECK(!r.status().message().empty());
      return 0;
    }
    FUZZ_CHECK(EncodeInode(*r) == bytes);
    FUZZ_CHECK(r->map.size() <= kMaxRegionChunks);  // may pass the size (KEEP_SIZE)
    FUZZ_CHECK(CheckHostalloc(r->hostalloc).ok());
    for (MapEntry e : r->map)
      FUZZ_CHECK(e == kHole || (EntryGid(e) != 0 && EntryUnitOffset(e) < kStepBytes));
  } else if ((data[0] & 3) == 3) {
    auto f = DecodeFree(bytes);
    if (!f.ok()) return 0;
    FUZZ_CHECK(EncodeFree(*f) == bytes);
    for (MapEntry e : f->chunks)
      FUZZ_CHECK(e != kHole && EntryGid(e) != 0 && EntryUnitOffset(e) < kStepBytes);
    // The text records of the multi-mount protocol: no crash, and what is accepted re-encodes
    // to a record that decodes to the same fields.
    if (auto o = DecodeOwner(bytes); o.ok()) {
      auto again = DecodeOwner(EncodeOwner(*o));
      FUZZ_CHECK(again.ok() && again->mount == o->mount && again->pid == o->pid);
    }
    if (auto m = DecodeMount(bytes); m.ok()) FUZZ_CHECK(DecodeMount(EncodeMount(*m)).ok());
  } else {
    auto u = DecodeUnit(bytes);
    if (!u.ok()) return 0;
    FUZZ_CHECK(EncodeUnit(*u) == bytes);
    FUZZ_CHECK(u->length == kStepBytes && !u->address.empty());
  }
  return 0;
}
