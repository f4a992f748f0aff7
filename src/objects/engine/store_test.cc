// Tests for the CoRM Store: alloc/read/write, pointer correction, release_ptr, block retirement,
// worker selection and bad input (double free, forged pointers, sizes) answered with Status;
// free-slot list reuse, the per-block ID -> slot table, and object ownership (FreeOwned, SetOwner).

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "objects/engine/store.h"

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
  ASSERT_EQ(OneSidedReadSlot(q.addr, q.id, st.IdMask(q.size_class), q.size_class, copy),
            SlotCheck::kOk);
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
      ScanBlockImage(block, st.SlotSize(p->size_class), p->id, st.IdMask(p->size_class),
                     p->size_class),
      static_cast<int64_t>(p->addr - reinterpret_cast<uint64_t>(st.blocks().VAddr(p->block))));
}

TEST(Store, AllocFailureHookAndBudget) {
  auto o = SmallStore();
  auto classes = SizeClasses::Create(GeometryOptions{
      o.block_size, std::max(o.max_block_size, o.block_size), o.min_slots_per_block});
  ASSERT_TRUE(classes.ok());
  const uint32_t c2000 = classes->ClassFor(2000).value();
  o.max_physical_bytes = 2 * uint64_t{classes->at(c2000).block_bytes};
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

// A block that regains a free slot must be the next allocation's target: no new block while an
// owned block of the class has room, however many blocks the worker holds.
TEST(Store, FreedSlotInEarlyBlockIsReused) {
  auto s = Store::Create(SmallStore());
  ASSERT_TRUE(s.ok());
  Store& st = **s;
  auto c = st.classes().ClassFor(200);
  ASSERT_TRUE(c.ok());
  const uint32_t per_block = st.classes().at(*c).slots_per_block;
  ASSERT_GT(per_block, 2u);
  constexpr uint32_t kBlocks = 6;
  std::map<uint32_t, std::vector<ObjectPtr>> by_block;  // virtual block -> its objects
  std::vector<uint32_t> order;                          // blocks in creation order
  for (uint32_t i = 0; i < kBlocks * per_block; ++i) {
    auto p = st.Alloc(200, 0);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    if (by_block[p->block].empty()) order.push_back(p->block);
    by_block[p->block].push_back(*p);
  }
  ASSERT_EQ(order.size(), kBlocks);  // filled block by block
  const uint64_t held = st.blocks().Stats().physical_bytes_held;
  EXPECT_EQ(held, kBlocks * st.options().block_size);

  // One hole in the first block and one in the third: both are refilled before a new block.
  ASSERT_TRUE(st.Free(by_block[order[0]][per_block / 2]).ok());
  ASSERT_TRUE(st.Free(by_block[order[2]][0]).ok());
  std::set<uint32_t> refilled;
  for (int i = 0; i < 2; ++i) {
    auto p = st.Alloc(200, 0);
    ASSERT_TRUE(p.ok());
    refilled.insert(p->block);
  }
  EXPECT_EQ(refilled, (std::set<uint32_t>{order[0], order[2]}));
  EXPECT_EQ(st.blocks().Stats().physical_bytes_held, held) << "a block with room was skipped";
  EXPECT_EQ(st.Stats(*c).blocks, kBlocks);
  EXPECT_EQ(st.Stats(*c).live_objects, kBlocks * per_block);

  // Everything is full again: the next object needs a new block.
  auto extra = st.Alloc(200, 0);
  ASSERT_TRUE(extra.ok());
  EXPECT_EQ(by_block.count(extra->block), 0u);
  EXPECT_EQ(st.blocks().Stats().physical_bytes_held, held + st.options().block_size);

  // Empty a middle block entirely: it retires (leaves the lists, struct recycled on the next
  // alloc) and the worker's other blocks keep working; the only block with room is extra's.
  for (const ObjectPtr& p : by_block[order[3]]) ASSERT_TRUE(st.Free(p).ok());
  EXPECT_EQ(st.Stats(*c).blocks, kBlocks);  // 6 - 1 + extra's
  auto again = st.Alloc(200, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->block, extra->block);
  EXPECT_EQ(st.blocks().Stats().physical_bytes_held, kBlocks * st.options().block_size);
  // The other worker never shares this worker's blocks (it may reuse the retired block's
  // released virtual block, though).
  auto other = st.Alloc(200, 1);
  ASSERT_TRUE(other.ok());
  for (uint32_t i = 0; i < kBlocks; ++i) {
    if (i != 3) {
      EXPECT_NE(other->block, order[i]);
    }
  }
  EXPECT_NE(other->block, extra->block);
  EXPECT_EQ(st.blocks().Stats().physical_bytes_held, (kBlocks + 1) * st.options().block_size);
}

// Table mode: every ID of a 2^bits space in a block with as many slots (the densest case), and
// the pure CoRM-k shape (more slots than IDs). Insert all, look all up, erase a random half,
// re-insert it into other slots, erase everything.
void CheckIdTableAllIds(uint32_t id_bits, uint32_t slots) {
  SCOPED_TRACE("id_bits " + std::to_string(id_bits) + ", slots " + std::to_string(slots));
  const uint32_t n = 1u << id_bits;
  ASSERT_LE(n, slots);
  std::mt19937 rng(id_bits * 7919 + slots);
  std::vector<uint32_t> slot_of(n);  // id -> slot
  std::vector<uint32_t> perm(slots);
  std::iota(perm.begin(), perm.end(), 0u);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::copy_n(perm.begin(), n, slot_of.begin());
  std::vector<uint16_t> slot_id(slots, 0);
  std::vector<uint8_t> occupied(slots, 0);
  auto is_occupied = [&occupied](uint32_t s) { return occupied[s] != 0; };
  auto arena = MetaArena::Create(size_t{64} << 20);
  ASSERT_TRUE(arena.ok());
  detail::IdTable t;
  ASSERT_TRUE(t.Reset(**arena, slots, n));
  ASSERT_FALSE(t.scanning());
  auto add = [&](uint32_t id) {
    slot_id[slot_of[id]] = static_cast<uint16_t>(id);
    occupied[slot_of[id]] = 1;
    return t.Insert(slot_of[id], slot_id);
  };
  auto remove = [&](uint32_t id) {
    const bool ok = t.Erase(slot_of[id], slot_id);
    occupied[slot_of[id]] = 0;
    return ok;
  };
  auto check = [&](const std::vector<uint8_t>& present) {
    for (uint32_t id = 0; id < n; ++id) {
      const uint32_t want = present[id] ? slot_of[id] : detail::IdTable::kNotFound;
      ASSERT_EQ(t.Find(static_cast<uint16_t>(id), slot_id, is_occupied), want) << "id " << id;
    }
  };
  for (uint32_t id = 0; id < n; ++id) ASSERT_TRUE(add(id));
  EXPECT_EQ(t.size(), n);
  std::vector<uint8_t> present(n, 1);
  check(present);
  std::vector<uint32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0u);
  std::shuffle(ids.begin(), ids.end(), rng);
  const std::vector<uint32_t> half(ids.begin(), ids.begin() + n / 2);
  for (uint32_t id : half) {
    ASSERT_TRUE(remove(id));
    EXPECT_FALSE(t.Erase(slot_of[id], slot_id)) << "erased twice";
    present[id] = 0;
  }
  EXPECT_EQ(t.size(), n - n / 2);
  check(present);
  // Re-insert the erased IDs into the freed slots, permuted (objects keep IDs, move slots).
  std::vector<uint32_t> freed;
  for (uint32_t id : half) freed.push_back(slot_of[id]);
  std::shuffle(freed.begin(), freed.end(), rng);
  for (size_t k = 0; k < half.size(); ++k) {
    slot_of[half[k]] = freed[k];
    ASSERT_TRUE(add(half[k]));
    present[half[k]] = 1;
  }
  check(present);
  for (uint32_t id : ids) ASSERT_TRUE(remove(id));
  EXPECT_EQ(t.size(), 0u);
  check(std::vector<uint8_t>(n, 0));
}

TEST(IdTable, EveryIdOfTheSpace) {
  CheckIdTableAllIds(8, 512);
  CheckIdTableAllIds(8, 4096);  // pure CoRM-8: 256 usable of 4096 slots
  CheckIdTableAllIds(12, 4096);
  CheckIdTableAllIds(16, 65536);
}

// Random inserts and erases against a reference map, in a table small enough that probe runs
// wrap around its end (exercises backward-shift deletion), and in scan mode (no table).
TEST(IdTable, RandomOpsMatchReference) {
  for (uint32_t slots : {20u, 64u, 300u}) {
    SCOPED_TRACE("slots " + std::to_string(slots));
    const uint32_t capacity = std::min(slots, 40u);
    auto arena = MetaArena::Create(size_t{1} << 20);
    ASSERT_TRUE(arena.ok());
    detail::IdTable t;
    ASSERT_TRUE(t.Reset(**arena, slots, capacity));
    EXPECT_EQ(t.scanning(), slots <= detail::IdTable::kScanMaxSlots);
    std::vector<uint16_t> slot_id(slots, 0);
    std::vector<uint8_t> occupied(slots, 0);
    auto is_occupied = [&occupied](uint32_t s) { return occupied[s] != 0; };
    std::map<uint16_t, uint32_t> ref;
    std::mt19937 rng(slots);
    for (int op = 0; op < 20000; ++op) {
      const auto id = static_cast<uint16_t>(rng() % 96);  // small space: many hits and misses
      auto it = ref.find(id);
      if (it != ref.end() && rng() % 2 == 0) {
        ASSERT_TRUE(t.Erase(it->second, slot_id));
        occupied[it->second] = 0;
        ref.erase(it);
      } else if (it == ref.end() && ref.size() < capacity) {
        uint32_t slot = rng() % slots;
        while (occupied[slot]) slot = (slot + 1) % slots;
        slot_id[slot] = id;
        occupied[slot] = 1;
        ASSERT_TRUE(t.Insert(slot, slot_id));
        ref[id] = slot;
      }
      const uint32_t want = ref.count(id) ? ref[id] : detail::IdTable::kNotFound;
      ASSERT_EQ(t.Find(id, slot_id, is_occupied), want) << "op " << op;
      ASSERT_EQ(t.size(), ref.size());
    }
    for (uint32_t id = 0; id < 96; ++id) {
      const uint32_t want = ref.count(id) ? ref[id] : detail::IdTable::kNotFound;
      ASSERT_EQ(t.Find(static_cast<uint16_t>(id), slot_id, is_occupied), want) << "id " << id;
    }
    // Reset for another shape releases the old size; Clear empties.
    t.Clear();
    EXPECT_EQ(t.size(), 0u);
    ASSERT_TRUE(t.Reset(**arena, 0, 0));
    EXPECT_EQ(t.MemoryBytes(), 0u);
    EXPECT_EQ((*arena)->Stats().allocated_bytes, 0u);
  }
}

// Finding 6 on the RPC paths: pointers to freed objects whose slot was reused (same block, and a
// block retired and its virtual block reused at once for the same class) are NotFound on Read,
// Write, Locate, ReleasePtr and Free, and never change a live object — with 8-bit IDs (full blocks
// hand the freed ID back) and offset-only classes (no ID).
TEST(Store, StalePointersAreNotFoundOnEveryRpcPath) {
  for (int id_bits : {8, 0}) {
    SCOPED_TRACE("id_bits " + std::to_string(id_bits));
    StoreOptions o = SmallStore(id_bits);
    o.workers = 1;
    // Reuse a released virtual block at once: the generations must still tell its lives apart.
    o.vblock_quarantine = 0;
    auto s = Store::Create(o);
    ASSERT_TRUE(s.ok());
    Store& st = **s;
    std::map<uint64_t, std::pair<ObjectPtr, uint8_t>> live;  // addr -> (ptr, byte)
    uint8_t next = 1;
    std::vector<ObjectPtr> stale;
    // A full block of 16-byte slots (256 of them; with 8-bit IDs every ID is taken).
    for (int i = 0; i < 256; ++i) {
      auto p = st.Alloc(6, 0);
      ASSERT_TRUE(p.ok());
      ObjectPtr q = *p;
      ASSERT_TRUE(st.Write(q, std::vector<uint8_t>(6, next)).ok());
      live[q.addr] = {q, next++};
    }
    std::mt19937 rng(3);
    for (int i = 0; i < 150; ++i) {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      ObjectPtr victim = it->second.first;
      ASSERT_TRUE(st.Free(victim).ok());
      live.erase(it);
      auto p = st.Alloc(6, 0);
      ASSERT_TRUE(p.ok());
      ObjectPtr q = *p;
      EXPECT_EQ(q.addr, victim.addr) << "the freed slot is the only free one";
      ASSERT_TRUE(st.Write(q, std::vector<uint8_t>(6, next)).ok());
      live[q.addr] = {q, next};
      next = static_cast<uint8_t>(next == 255 ? 1 : next + 1);
      stale.push_back(victim);
    }
    // A whole block retired and its virtual block reused by the same class.
    int reused = 0;
    for (int i = 0; i < 20; ++i) {
      auto p = st.Alloc(2000, 0);
      ASSERT_TRUE(p.ok());
      ObjectPtr gone = *p;
      ASSERT_TRUE(st.Free(gone).ok());
      auto again = st.Alloc(2000, 0);
      ASSERT_TRUE(again.ok());
      ObjectPtr q = *again;
      ASSERT_TRUE(st.Write(q, std::vector<uint8_t>(6, 0x77)).ok());
      live[q.addr] = {q, 0x77};
      if (q.addr == gone.addr) {
        ++reused;
        stale.push_back(gone);
      }
    }
    EXPECT_EQ(reused, 20) << "without quarantine the released virtual block comes back";
    std::vector<uint8_t> out(6);
    int reached = 0;
    for (const ObjectPtr& p : stale) {
      ObjectPtr q = p;
      auto r = st.Read(q, out);
      if (r.ok()) ++reached;
      EXPECT_EQ(r.status().code(), Code::kNotFound) << r.status().ToString();
      q = p;
      EXPECT_EQ(st.Write(q, std::vector<uint8_t>(6, 0xEE)).code(), Code::kNotFound);
      EXPECT_EQ(st.Locate(p, CorrectionMode::kAskOwner).status().code(), Code::kNotFound);
      EXPECT_EQ(st.Locate(p, CorrectionMode::kScan).status().code(), Code::kNotFound);
      EXPECT_EQ(st.ReleasePtr(p).status().code(), Code::kNotFound);
      EXPECT_EQ(st.Free(p).code(), Code::kNotFound);
    }
    EXPECT_EQ(reached, 0);
    // Every live object is still allocated and holds its own bytes.
    for (auto& [addr, e] : live) {
      ObjectPtr q = e.first;
      auto r = st.Read(q, out);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(out, std::vector<uint8_t>(6, e.second));
    }
    EXPECT_EQ(st.Stats().live_objects, live.size());
  }
}

// Ownership: objects of owners 1 and 2 and persistent ones, in several classes, both workers and
// several blocks each. FreeOwned(1) frees exactly owner 1's (their pointers are NotFound on every
// RPC path), the others keep their bytes; counts and StoreStats stay exact.
TEST(StoreOwnership, FreeOwnedFreesExactlyThatOwnersObjects) {
  for (int id_bits : {16, 0}) {
    SCOPED_TRACE("id_bits " + std::to_string(id_bits));
    auto s = Store::Create(SmallStore(id_bits));
    ASSERT_TRUE(s.ok());
    Store& st = **s;
    struct Obj {
      ObjectPtr p;
      OwnerId owner;
      std::vector<uint8_t> bytes;
    };
    std::vector<Obj> objs;
    const size_t sizes[] = {10, 100, 700};
    std::mt19937 rng(11);
    for (int i = 0; i < 900; ++i) {
      const OwnerId owner = static_cast<OwnerId>(i % 3);  // 0 = persistent, 1, 2
      const size_t n = sizes[rng() % 3];
      auto p = st.Alloc(n, static_cast<uint32_t>(rng() % 2), owner);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      Obj o{*p, owner, Bytes(n, static_cast<uint8_t>(i))};
      ASSERT_TRUE(st.Write(o.p, o.bytes).ok());
      objs.push_back(o);
    }
    // Free some of each through Free: the counts follow.
    for (size_t i = 0; i < objs.size(); i += 7) ASSERT_TRUE(st.Free(objs[i].p).ok());
    std::vector<Obj> kept;
    for (size_t i = 0; i < objs.size(); ++i) {
      if (i % 7 != 0) kept.push_back(objs[i]);
    }
    uint64_t count[3] = {0, 0, 0};
    for (const Obj& o : kept) ++count[o.owner];
    EXPECT_EQ(st.OwnedObjects(kPersistentOwner), count[0]);
    EXPECT_EQ(st.OwnedObjects(1), count[1]);
    EXPECT_EQ(st.OwnedObjects(2), count[2]);
    StoreStats ss = st.Stats();
    EXPECT_EQ(ss.live_objects, kept.size());
    EXPECT_EQ(ss.owned_objects, count[1] + count[2]);
    EXPECT_EQ(ss.persistent_objects, count[0]);

    auto freed = st.FreeOwned(1);
    ASSERT_TRUE(freed.ok()) << freed.status().ToString();
    EXPECT_EQ(*freed, count[1]);
    EXPECT_EQ(st.OwnedObjects(1), 0u);
    EXPECT_EQ(st.OwnedObjects(2), count[2]);
    EXPECT_EQ(st.OwnedObjects(kPersistentOwner), count[0]);
    ss = st.Stats();
    EXPECT_EQ(ss.live_objects, count[0] + count[2]);
    EXPECT_EQ(ss.owned_objects, count[2]);
    EXPECT_EQ(ss.persistent_objects, count[0]);
    for (const Obj& o : kept) {
      ObjectPtr q = o.p;
      std::vector<uint8_t> out(o.bytes.size());
      if (o.owner == 1) {
        EXPECT_EQ(st.Read(q, out).status().code(), Code::kNotFound);
        EXPECT_EQ(st.Locate(o.p, CorrectionMode::kAskOwner).status().code(), Code::kNotFound);
        EXPECT_EQ(st.Free(o.p).code(), Code::kNotFound);
        EXPECT_EQ(st.SetOwner(o.p, 2).code(), Code::kNotFound);
      } else {
        auto r = st.Read(q, out);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        EXPECT_EQ(out, o.bytes);
      }
    }
    // Nothing left for 1, nothing ever for 9; the persistent owner is not a session.
    auto again = st.FreeOwned(1);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, 0u);
    auto none = st.FreeOwned(9);
    ASSERT_TRUE(none.ok());
    EXPECT_EQ(*none, 0u);
    EXPECT_EQ(st.FreeOwned(kPersistentOwner).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(st.Stats().live_objects, count[0] + count[2]);

    // Emptied blocks were retired on the way: freeing the rest releases every block.
    auto two = st.FreeOwned(2);
    ASSERT_TRUE(two.ok());
    EXPECT_EQ(*two, count[2]);
    for (const Obj& o : kept) {
      if (o.owner == kPersistentOwner) {
        ASSERT_TRUE(st.Free(o.p).ok());
      }
    }
    ss = st.Stats();
    EXPECT_EQ(ss.live_objects, 0u);
    EXPECT_EQ(ss.owned_objects, 0u);
    EXPECT_EQ(ss.persistent_objects, 0u);
    EXPECT_EQ(st.blocks().Stats().physical_bytes_held, 0u);
    EXPECT_EQ(st.blocks().Stats().virtual_blocks_in_use, 0u);
  }
}

// SetOwner: persisting an object takes it out of its session's FreeOwned; giving it to another
// session puts it into that one's. ReleasePtr of an object that is not aliased keeps the owner
// (the aliased case is in compaction_test.cc).
TEST(StoreOwnership, SetOwnerMovesObjectsBetweenOwners) {
  auto s = Store::Create(SmallStore());
  ASSERT_TRUE(s.ok());
  Store& st = **s;
  std::vector<ObjectPtr> ptrs;
  for (int i = 0; i < 6; ++i) {
    auto p = st.Alloc(50, 0, 3);
    ASSERT_TRUE(p.ok());
    ptrs.push_back(*p);
  }
  EXPECT_EQ(st.OwnedObjects(3), 6u);
  ASSERT_TRUE(st.SetOwner(ptrs[0], kPersistentOwner).ok());  // persist
  ASSERT_TRUE(st.SetOwner(ptrs[1], 4).ok());                 // hand over
  ASSERT_TRUE(st.SetOwner(ptrs[2], 3).ok());                 // no change
  EXPECT_EQ(st.OwnedObjects(3), 4u);
  EXPECT_EQ(st.OwnedObjects(4), 1u);
  EXPECT_EQ(st.OwnedObjects(kPersistentOwner), 1u);
  EXPECT_EQ(st.Stats().owned_objects, 5u);
  EXPECT_EQ(st.Stats().persistent_objects, 1u);
  auto rp = st.ReleasePtr(ptrs[3]);
  ASSERT_TRUE(rp.ok());
  EXPECT_EQ(*rp, ptrs[3]);  // primary home already: the same pointer

  auto freed = st.FreeOwned(3);
  ASSERT_TRUE(freed.ok()) << freed.status().ToString();
  EXPECT_EQ(*freed, 4u);
  std::vector<uint8_t> out(50);
  ObjectPtr q = ptrs[0];
  EXPECT_TRUE(st.Read(q, out).ok()) << "persisted object was freed with its session";
  q = ptrs[1];
  EXPECT_TRUE(st.Read(q, out).ok()) << "handed-over object was freed with its old session";
  for (int i = 2; i < 6; ++i) {
    q = ptrs[i];
    EXPECT_EQ(st.Read(q, out).status().code(), Code::kNotFound);
  }
  EXPECT_EQ(st.SetOwner(ptrs[2], kPersistentOwner).code(), Code::kNotFound);  // stale pointer
  auto four = st.FreeOwned(4);
  ASSERT_TRUE(four.ok());
  EXPECT_EQ(*four, 1u);
  q = ptrs[1];
  EXPECT_EQ(st.Read(q, out).status().code(), Code::kNotFound);
  EXPECT_EQ(st.Stats().live_objects, 1u);
  EXPECT_EQ(st.Stats().owned_objects, 0u);
  EXPECT_EQ(st.Stats().persistent_objects, 1u);
}

}  // namespace
}  // namespace farmem::corm
