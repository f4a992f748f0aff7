// Region layout tests: map entry encoding, step placement, and that the metadata decoders accept
// what the encoders write and reject malformed or hostile records with an error (never a crash).
#include "regions/format/region_layout.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>

namespace farmem::regions {
namespace {

TEST(RegionLayout, MapEntriesRoundTripAndHoleIsZero) {
  for (uint32_t gid : {1u, 2u, 1000u, kMaxGid}) {
    for (uint64_t i = 0; i < kChunksPerStep; ++i) {
      MapEntry e = MakeMapEntry(gid, i * kChunkBytes);
      EXPECT_NE(e, kHole);
      EXPECT_EQ(EntryGid(e), gid);
      EXPECT_EQ(EntryUnitOffset(e), i * kChunkBytes);
    }
  }
  EXPECT_EQ(ChunkOf(kChunkBytes - 1), 0u);
  EXPECT_EQ(ChunkOf(kChunkBytes), 1u);
  EXPECT_EQ(ChunksFor(0), 0u);
  EXPECT_EQ(ChunksFor(1), 1u);
  EXPECT_EQ(ChunksFor(kChunkBytes + 1), 2u);
}

TEST(RegionLayout, MultihostedStepsGoRoundRobinIn2MiB) {
  // Chunks 0..15 form the first 2 MiB step, on the home server; the next step on the next one.
  EXPECT_EQ(StepServer(0, 1, 3), 1u);
  EXPECT_EQ(StepServer(15, 1, 3), 1u);
  EXPECT_EQ(StepServer(16, 1, 3), 2u);
  EXPECT_EQ(StepServer(32, 1, 3), 0u);
  EXPECT_EQ(StepServer(48, 1, 3), 1u);
}

InodeRecord SampleFile() {
  InodeRecord r;
  r.h.mode = S_IFREG | 0644;
  r.h.ino = 7;
  r.h.size = 3 * kChunkBytes;
  r.h.nlink = 1;
  r.h.attr_flags = kAttrPersistent | kAttrOneWriter;
  r.map = {MakeMapEntry(1, 0), kHole, MakeMapEntry(2, 5 * kChunkBytes)};
  return r;
}

TEST(RegionLayout, InodeRecordRoundTrip) {
  InodeRecord r = SampleFile();
  std::string bytes = EncodeInode(r);
  EXPECT_EQ(bytes.size(), sizeof(InodeRecordHeader) + 3 * sizeof(MapEntry));
  auto d = DecodeInode(bytes);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->map, r.map);
  EXPECT_EQ(d->h.size, r.h.size);
  EXPECT_EQ(d->h.attr_flags, r.h.attr_flags);

  InodeRecord link;
  link.h.mode = S_IFLNK | 0777;
  link.h.ino = 9;
  link.target = "../some/where";
  auto l = DecodeInode(EncodeInode(link));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->target, link.target);

  InodeRecord placed = SampleFile();
  placed.hostalloc = "10.0.0.1:7000,10.0.0.2:7000";
  auto p = DecodeInode(EncodeInode(placed));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->hostalloc, placed.hostalloc);
  EXPECT_EQ(p->map, placed.map);
  EXPECT_EQ(SplitHostalloc(p->hostalloc),
            (std::vector<std::string>{"10.0.0.1:7000", "10.0.0.2:7000"}));
  EXPECT_TRUE(SplitHostalloc("").empty());
}

TEST(RegionLayout, HostallocListsAreChecked) {
  EXPECT_TRUE(CheckHostalloc("").ok());
  EXPECT_TRUE(CheckHostalloc("a:1").ok());
  const std::string_view kBad[] = {",", "a:1,", ",a:1", "a:1,,b:2", "a 1", {"a\0b", 3}};
  for (std::string_view bad : kBad) EXPECT_FALSE(CheckHostalloc(bad).ok()) << bad;
  EXPECT_FALSE(CheckHostalloc(std::string(kMaxHostallocBytes + 1, 'a')).ok());
  InodeRecord r = SampleFile();
  r.hostalloc = "a:1";
  std::string bytes = EncodeInode(r);
  bytes.back() = ' ';  // a hostile list is refused like any other field
  EXPECT_FALSE(DecodeInode(bytes).ok());
  InodeRecord link;
  link.h.mode = S_IFLNK | 0777;
  link.h.ino = 9;
  link.target = "x";
  link.hostalloc = "a:1";
  EXPECT_FALSE(DecodeInode(EncodeInode(link)).ok()) << "symlinks have no HOSTALLOC";
}

TEST(RegionLayout, HostileInodeRecordsAreRejected) {
  std::string good = EncodeInode(SampleFile());
  auto expect_bad = [](std::string bytes, const char* why) {
    auto d = DecodeInode(bytes);
    EXPECT_FALSE(d.ok()) << why;
    EXPECT_EQ(d.status().code(), Code::kInvalidArgument) << why;
  };
  expect_bad(good.substr(0, 10), "short");
  expect_bad(good.substr(0, good.size() - 1), "truncated map");
  expect_bad(good + "x", "trailing byte");
  auto patch = [&](size_t off, const void* v, size_t n) {
    std::string b = good;
    std::memcpy(b.data() + off, v, n);
    return b;
  };
  uint32_t bad_magic = 1;
  expect_bad(patch(offsetof(InodeRecordHeader, magic), &bad_magic, 4), "magic");
  uint32_t huge = 0xffffffff;
  expect_bad(patch(offsetof(InodeRecordHeader, map_entries), &huge, 4), "map length");
  expect_bad(patch(offsetof(InodeRecordHeader, target_len), &huge, 4), "target length");
  uint32_t seven = 7;
  // A fuzz find when this was a reserved 0: now a HOSTALLOC length the bytes do not back.
  expect_bad(patch(offsetof(InodeRecordHeader, hostalloc_len), &seven, 4), "hostalloc length");
  uint32_t fifo = S_IFIFO | 0644;
  expect_bad(patch(offsetof(InodeRecordHeader, mode), &fifo, 4), "mode");
  uint64_t small = 1;  // 3 chunks mapped, 1 byte long: fallocate KEEP_SIZE preallocation
  auto keep_size = DecodeInode(patch(offsetof(InodeRecordHeader, size), &small, 8));
  ASSERT_TRUE(keep_size.ok()) << keep_size.status().ToString();
  EXPECT_EQ(keep_size->map.size(), 3u);
  MapEntry gid0 = MakeMapEntry(0, 0) | 1;
  expect_bad(patch(sizeof(InodeRecordHeader), &gid0, 8), "gid 0");
  MapEntry past_unit = MakeMapEntry(1, 16 * kChunkBytes);
  expect_bad(patch(sizeof(InodeRecordHeader), &past_unit, 8), "offset past the unit");
}

TEST(RegionLayout, UnitRecordRoundTripAndRejects) {
  UnitRecord u{"127.0.0.1:7700", 42, 1 << 20, kStepBytes};
  auto d = DecodeUnit(EncodeUnit(u));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->address, u.address);
  EXPECT_EQ(d->key, 42u);
  EXPECT_EQ(d->offset, uint64_t{1} << 20);
  EXPECT_FALSE(DecodeUnit("short").ok());
  std::string b = EncodeUnit(u);
  EXPECT_FALSE(DecodeUnit(b.substr(0, b.size() - 1)).ok());
  u.length = 4096;
  EXPECT_FALSE(DecodeUnit(EncodeUnit(u)).ok());
}

TEST(RegionLayout, FreeOwnerAndMountRecordsRoundTripAndHostileOnesAreRefused) {
  FreeRecord f{42, {MakeMapEntry(1, 0), MakeMapEntry(7, 3 * kChunkBytes)}};
  auto back = DecodeFree(EncodeFree(f));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->ino, 42u);
  EXPECT_EQ(back->chunks, f.chunks);
  EXPECT_TRUE(DecodeFree(EncodeFree({42, {}})).ok()) << "an emptied free record";
  EXPECT_FALSE(DecodeFree(EncodeFree({42, {kHole}})).ok()) << "a hole in a free record";
  EXPECT_FALSE(DecodeFree(EncodeFree({0, {MakeMapEntry(1, 0)}})).ok()) << "inode 0";
  std::string cut = EncodeFree(f);
  cut.pop_back();
  EXPECT_FALSE(DecodeFree(cut).ok()) << "a cut record";
  OwnerRecord o{"m-1", "boot/4026531836", 1234, "5678"};
  auto ob = DecodeOwner(EncodeOwner(o));
  ASSERT_TRUE(ob.ok()) << ob.status().ToString();
  EXPECT_EQ(ob->mount, "m-1");
  EXPECT_EQ(ob->host, "boot/4026531836");
  EXPECT_EQ(ob->pid, 1234);
  EXPECT_EQ(ob->start, "5678");
  EXPECT_TRUE(DecodeOwner("mount=m host=h pid=1 start=").ok()) << "an unknown start time";
  for (const char* bad :
       {"mount=m host=h pid=x start=1", "mount=m host=h start=1",
        "mount=m host=h pid=1 start=1 extra=2", "mount=m mount=m host=h pid=1 start=1",
        "mount=m host=h pid=99999999999 start=1", "garbage"})
    EXPECT_FALSE(DecodeOwner(bad).ok()) << bad;
  auto mb = DecodeMount(EncodeMount({"boot/1", 77}));
  ASSERT_TRUE(mb.ok());
  EXPECT_EQ(mb->pid, 77);
  EXPECT_FALSE(DecodeMount("pid=1").ok());
  EXPECT_FALSE(DecodeMount("host=h pid=-1").ok());
}

}  // namespace
}  // namespace farmem::regions
