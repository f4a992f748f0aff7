// The layout of an rmalloc heap inside its byte range (docs/regions_sync.md, "rmalloc"): header at
// offset 0 (magic, lock word, geometry, free lists), one map byte per 64-byte grain, then the
// buddy blocks. Everything is an offset, so processes may map the range at different addresses.
// Read and written by every process/thread attached to the range, under the header's lock word.
#pragma once

#include <cstddef>
#include <cstdint>

namespace farmem::regions::rmalloc {

// Offset 0: 0 = never formatted (a fresh memfd / region is zero), kHeapFormatting while the first
// user formats it, kHeapMagic once usable. Anything else: not a heap.
inline constexpr uint64_t kHeapMagic = 0x3150414548524d46ull;       // "FMRHEAP1"
inline constexpr uint64_t kHeapFormatting = 0x2e2e2e5041454852ull;  // "RHEAP..."
inline constexpr uint64_t kGrain = 64;                              // order 0 block
inline constexpr int kOrders = 48;                                  // blocks of 64 << 0..47
inline constexpr uint64_t kMinRegion = 4096;

struct HeapHeader {
  uint64_t magic;
  uint32_t lock;         // 0 = free, else the holder's pid (std::atomic_ref, cross-process)
  uint32_t version;      // 1
  uint64_t region_size;  // bytes formatted; a later attach needs at least this many
  uint64_t map_offset;   // map byte i describes data grain i
  uint64_t data_offset;  // 64-aligned
  uint64_t data_size;    // a multiple of kGrain
  uint64_t allocated;    // bytes in allocated blocks
  uint64_t allocations;  // live allocations
  // Per order: data offset + 1 of the first free block, 0 = empty (doubly linked via FreeNode).
  uint64_t free_head[kOrders];
  uint64_t reserved[8];
};
static_assert(sizeof(HeapHeader) == 512, "the heap header is 512 bytes");

// A map byte: 0 = not a block start; kMapFree | order = a free block; kMapUsed | order = an
// allocated block. The map, not the block bytes, is the truth (user data cannot forge it).
inline constexpr uint8_t kMapFree = 0x40;
inline constexpr uint8_t kMapUsed = 0x80;
inline constexpr uint8_t kMapOrder = 0x3f;

// The first 16 bytes of a free block.
struct FreeNode {
  uint64_t next;  // data offset + 1, 0 = end
  uint64_t prev;
};
static_assert(sizeof(FreeNode) == 16);

// The first 16 bytes of an allocated block; rmalloc returns block + 16 (16-byte aligned).
struct AllocHeader {
  uint64_t tag;  // kAllocTag ^ the block's data offset
  uint64_t order;
};
static_assert(sizeof(AllocHeader) == 16);
inline constexpr uint64_t kAllocTag = 0xa110c8eda110c8edull;

}  // namespace farmem::regions::rmalloc
