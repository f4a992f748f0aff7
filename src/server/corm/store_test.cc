// Tests for the CoRM Store: alloc/read/write, pointer correction, release_ptr, block retirement,
// worker selection and bad input (double free, forged pointers, sizes) answered with Status.

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "server/corm/thread_allocator.h"

namespace farmem::corm {
namespace {

StoreOptions SmallStore(int id_bits = 16) {
  StoreOptions o;
  o.block_size = 4096;
  o.id_bits = id_bits;
  o.workers = 2;
  o.reserve_bytes = 64 << 20;
  o.pool_bytes = 1 << 20;
  o.seed = 42;
  return o;
}

std::vector<uint8_t> Bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 31);
  return v;
}

TEST(Store, AllocWriteReadFree) {
  auto s = Store::Create(SmallStore());
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Store& st = **s;
  auto p = st.Alloc(100, 0);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::vector<uint8_t> out(100, 0xFF);
  ObjectPtr q = *p;
  auto n = st.Read(q, out);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(out, std::vector<uint8_t>(100, 0));  // zero-filled
  const auto data = Bytes(100, 7);
  ASSERT_TRUE(st.Write(q, data).ok());
  ASSERT_TRUE(st.Read(q, out).ok());
  EXPECT_EQ(out, data);
  // One-sided read of the same bytes agrees.
  std::vector<uint8_t> copy(st.SlotSize(q.size_class));
  ASSERT_EQ(OneSidedReadSlot(q.addr, q.id, st.IdMask(q.size_class), copy), SlotCheck::kOk);
  std::vector<uint8_t> decoded(100);
  DecodePayload(copy, q.addr, decoded);
  EXPECT_EQ(decoded, data);
  EXPECT_EQ(st.Stats().live_objects, 1u);
  ASSERT_TRUE(st.Free(q).ok());
  EXPECT_EQ(st.Stats().live_objects, 0u);
  // The block emptied: its pages and virtual block were released.
  EXPECT_EQ(st.blocks().Stats().physical_bytes_held, 0u);
}

TEST(Store, IdsAreUniquePerBlockAndPointersConsistent) {
  auto s = Store::Create(SmallStore(8));
  ASSERT_TRUE(s.ok());
  Store& st = **s;
  std::map<uint32_t, std::set<uint16_t>> ids;
  for (int i = 0; i < 2000; ++i) {
    auto p = st.Alloc(20, static_cast<uint32_t>(i % 2));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_TRUE(ids[p->block].insert(p->id).second) << "duplicate ID in a block";
    EXPECT_LE(p->id, 255);
    auto v = st.blocks().VBlockOf(p->addr);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(*v, p->block);
  }
}

TEST(Store, BadInputIsAnErrorNotACrash) {
  auto s = Store::Create(SmallStore(12));
  ASSERT_TRUE(s.ok());
  Store& st = **s;
  EXPECT_EQ(st.Alloc(0, 0).status().code(), Code::kOutOfRange);
  EXPECT_EQ(st.Alloc(1 << 20, 0).status().code(), Code::kOutOfRange);
  EXPECT_EQ(st.Alloc(10, 99).status().code(), Code::kInvalidArgument);

  auto p = st.Alloc(40, 0);
  auto keep = st.Alloc(40, 0);  // keeps the block alive after p is freed
  ASSERT_TRUE(p.ok() && keep.ok());
  std::vector<uint8_t> buf(40);

  ObjectPtr f = *p;
  f.id = static_cast<uint16_t>((p->id + 1) & 0xFFF);
  if (f.id == keep->id) f.id = static_cast<uint16_t>((f.id + 1) & 0xFFF);
  EXPECT_EQ(st.Read(f, buf).status().code(), Code::kNotFound);  // wrong ID
  f = *p;
  f.id = 0xF000;
  EXPECT_EQ(st.Free(f).code(), Code::kInvalidArgument);  // beyond the ID width
  f = *p;
  f.size_class = p->size_class + 1;
  EXPECT_EQ(st.Read(f, buf).status().code(), Code::kInvalidArgument);  // wrong class
  f.size_class = 10000;
  EXPECT_EQ(st.Read(f, buf).status().code(), Code::kInvalidArgument);
  f = *p;
  f.addr += 8;
  EXPECT_EQ(st.Free(f).code(), Code::kInvalidArgument);  // not a slot boundary
  f = *p;
  f.addr = 12345;
  EXPECT_EQ(st.Read(f, buf).status().code(), Code::kOutOfRange);  // outside the range
  f = *p;
  f.block += 1;
  EXPECT_EQ(st.Write(f, buf).code(), Code::kInvalidArgument);  // block/address disagree
  f = *p;
  f.addr = reinterpret_cast<uint64_t>(st.blocks().base()) + 4096 * 100;
  f.block = 100;
  EXPECT_EQ(st.Read(f, buf).status().code(), Code::kNotFound);  // unmapped block
  ObjectPtr w = *p;
  EXPECT_EQ(st.Write(w, std::vector<uint8_t>(4000)).code(), Code::kOutOfRange);

  ASSERT_TRUE(st.Free(*p).ok());
  EXPECT_EQ(st.Free(*p).code(), Code::kNotFound);  // double free
  ObjectPtr r = *p;
  EXPECT_EQ(st.Read(r, buf).status().code(), Code::kNotFound);  // read after free
  // The server is unharmed.
  ObjectPtr k = *keep;
  EXPECT_TRUE(st.Write(k, Bytes(40, 1)).ok());
  EXPECT_TRUE(st.Read(k, buf).ok());
  EXPECT_EQ(buf, Bytes(40, 1));
  EXPECT_TRUE(st.Free(k).ok());
  // Freed again after the block was retired (virtual block released).
  EXPECT_EQ(st.Free(k).code(), Code::kNotFound);
}

TEST(Store, OffsetOnlyRejectsForeignAliases) {
  auto s = Store::Create(SmallStore(0));
  ASSERT_TRUE(s.ok());
  Store& st = **s;
  auto p = st.Alloc(10, 0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->id, 0);
  EXPECT_EQ(st.ModeOf(p->size_class), ClassMode::kOffsetOnly);
  ObjectPtr q = *p;
  ASSERT_TRUE(st.Write(q, Bytes(10, 3)).ok());
  std::vector<uint8_t> out(10);
  ASSERT_TRUE(st.Read(q, out).ok());
  EXPECT_EQ(out, Bytes(10, 3));
  ObjectPtr next = *p;
  next.addr += st.SlotSize(p->size_class);
  EXPECT_EQ(st.Read(next, out).status().code(), Code::kNotFound);
}

TEST(Store, HybridModeSelection) {
  auto o = SmallStore(8);
  auto s = Store::Create(o);
  ASSERT_TRUE(s.ok());
  // 4 KiB blocks of 16-byte slots have 256 slots: 8-bit IDs suffice.
  EXPECT_EQ((*s)->ModeOf(0), ClassMode::kIds);
  o.block_size = 65536;
  auto big = Store::Create(o);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ((*big)->ModeOf(0), ClassMode::kOffsetOnly);  // 4096 slots > 256 IDs
  EXPECT_EQ((*big)->ModeOf((*big)->classes().count() - 1), ClassMode::kIds);
  o.hybrid = false;
  auto pure = Store::Create(o);
  ASSERT_TRUE(pure.ok());
  EXPECT_EQ((*pure)->ModeOf(0), ClassMode::kIds);
  // Pure CoRM-8: only 256 objects per block.
  std::set<uint32_t> blocks;
  for (int i = 0; i < 257; ++i) {
    auto p = (*pure)->Alloc(4, 0);
    ASSERT_TRUE(p.ok());
    blocks.insert(p->block);
  }
  EXPECT_EQ(blocks.size(), 2u);
  o.id_bits = 5;
  EXPECT_EQ(Store::Create(o).status().code(), Code::kInvalidArgument);
}

TEST(Store, LocateAndCorrection) {
  auto s = Store::Create(SmallStore());
  ASSERT_TRUE(s.ok());
  Store& st = **s;
  auto p = st.Alloc(30, 0);
  ASSERT_TRUE(p.ok());
  for (CorrectionMode m : {CorrectionMode::kAskOwner, CorrectionMode::kScan}) {
    auto q = st.Locate(*p, m);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_EQ(*q, *p);
  }
  std::vector<uint8_t> block(4096);
  ReadSlotWords(st.blocks().VAddr(p->block), block.data(), block.size());
  EXPECT_EQ(
      ScanBlockImage(block, st.SlotSize(p->size_class), p->id, st.IdMask(p->size_class)),
      static_cast<int64_t>(p->addr - reinterpret_cast<uint64_t>(st.blocks().VAddr(p->block))));
}

TEST(Store, AllocFailureHookAndBudget) {
  auto o = SmallStore();
  o.max_physical_bytes = 2 * 4096;
  auto s = Store::Create(o);
  ASSERT_TRUE(s.ok());
  Store& st = **s;
  int calls = 0;
  st.SetAllocFailureHook([&](uint32_t) { ++calls; });
  std::vector<ObjectPtr> ptrs;
  Status last;
  for (int i = 0; i < 1000; ++i) {
    auto p = st.Alloc(2000, 0);
    if (!p.ok()) {
      last = p.status();
      break;
    }
    ptrs.push_back(*p);
  }
  auto c = st.classes().ClassFor(2000);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(ptrs.size(), 2u * st.classes().at(*c).slots_per_block);  // the 2-block budget
  EXPECT_EQ(last.code(), Code::kResourceExhausted);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace farmem::corm
