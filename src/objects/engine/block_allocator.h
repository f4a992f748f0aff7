// Process-wide CoRM block allocator: one read-only zero-page virtual reservation, 16 MiB memfd
// pools carved into blocks of one or more base blocks (spans), the virtual-block -> (memfd,
// offset) map, remapping of a virtual span onto another span's physical pages, hole punching, and
// home reference counts that gate virtual-block reuse.
//
// Spans: a block of `span` base blocks occupies `span` consecutive virtual base blocks (its head
// is the first; a power-of-two span starts at a multiple of itself) and `span` consecutive base
// blocks of one memfd pool. Every per-block call below takes the head; Remap moves a whole span
// onto a physical span of the same length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "farmem/status.h"
#include "objects/engine/lazy_array.h"

namespace farmem::corm {

struct BlockAllocatorOptions {
  size_t block_size = 4096;                // base block: power of two, 4 KiB .. 1 MiB
  size_t reserve_bytes = size_t{4} << 30;  // virtual range (reads as zeros until blocks are mapped)
  size_t pool_bytes = size_t{16} << 20;    // one memfd file; multiple of block_size, >= every span
  size_t max_physical_bytes = 0;           // 0 = unlimited; else AllocBlock fails beyond it
  // Released virtual spans are reused first in, first out, and only once more than this many base
  // blocks were released after them (or no never-used virtual block is left). A stale pointer into
  // a released block reads zeros ("freed") until the block is reused; the quarantine makes that
  // window long. The Store also changes generations across lives (docs/objects.md, "Pointer
  // identity").
  size_t vblock_quarantine = 0;
};

// Where a virtual span's pages come from.
struct BlockMapping {
  int memfd = -1;
  uint64_t file_offset = 0;
  uint32_t span = 0;  // base blocks
};

struct BlockGrant {
  uint32_t vblock = 0;  // head virtual block index (address = base + vblock * block_size)
  uint32_t pblock = 0;  // first physical block index (pool * blocks_per_pool + index in pool)
};

struct BlockAllocatorStats {
  uint64_t physical_bytes_held = 0;     // physical base blocks in use * block size (own accounting)
  uint64_t physical_blocks_in_use = 0;  // base blocks
  uint64_t physical_blocks_free = 0;    // punched (or never used) base blocks ready for reuse
  uint64_t virtual_blocks_in_use = 0;   // base blocks of mapped spans
  uint64_t pools = 0;
  uint64_t pool_bytes_total = 0;  // memfd capacity created (not resident memory)
  uint64_t remaps = 0;
  uint64_t punches = 0;
  // Bytes of the allocator's own tables: the per-virtual-block ones up to the highest virtual
  // block ever handed out (lazily zeroed: the rest costs nothing), per physical block, and the
  // free lists.
  uint64_t metadata_bytes = 0;
};

// Thread-safe (one internal mutex; calls are rare, block-granular). Takes no other lock, so any
// caller lock may be held while calling in (it is last in the CoRM lock order).
class BlockAllocator {
 public:
  static Result<std::unique_ptr<BlockAllocator>> Create(const BlockAllocatorOptions& options);
  ~BlockAllocator();
  BlockAllocator(const BlockAllocator&) = delete;
  BlockAllocator& operator=(const BlockAllocator&) = delete;

  size_t block_size() const { return block_size_; }
  uint8_t* base() const { return base_; }
  size_t reserve_bytes() const { return reserve_bytes_; }
  uint32_t num_virtual_blocks() const { return num_vblocks_; }
  // Highest virtual block index ever handed out, plus one.
  uint32_t virtual_high_water() const;
  uint8_t* VAddr(uint32_t vblock) const { return base_ + size_t{vblock} * block_size_; }
  // Virtual block containing `addr`, or error if outside the reservation.
  Result<uint32_t> VBlockOf(uint64_t addr) const;

  // A fresh physical span of `span` base blocks (zero pages) mapped at a free virtual span; the
  // head's home count is 0. ResourceExhausted when the physical budget or the reservation is used
  // up; InvalidArgument for a span of 0 or larger than a pool.
  Result<BlockGrant> AllocBlock(uint32_t span = 1);
  // Maps the physical span starting at `pblock` at the virtual span headed by `vblock`
  // (MAP_FIXED|MAP_SHARED), replacing whatever was there; both spans must have the same length.
  // Concurrent readers see either the old or the new pages, never a hole.
  Status Remap(uint32_t vblock, uint32_t pblock);
  // Punches the physical span's pages (FALLOC_FL_PUNCH_HOLE) and makes it reusable. The caller
  // guarantees no virtual span maps it any more (or that the mapping is about to be released).
  Status ReleasePhysical(uint32_t pblock);
  // Returns a virtual span to the free list, mapped back to read-only zero pages (so one-sided
  // readers holding a stale pointer read "freed", never fault); fails if objects still home there.
  Status ReleaseVirtual(uint32_t vblock);

  // Home counts (per head): live objects whose pointer addresses this virtual span.
  Status AddHomeRef(uint32_t vblock);
  // Returns the count after the decrement; error if it was already 0 or vblock is not mapped.
  Result<uint32_t> DropHomeRef(uint32_t vblock);
  uint32_t HomeRefs(uint32_t vblock) const;

  Result<BlockMapping> MappingOf(uint32_t vblock) const;
  BlockAllocatorStats Stats() const;

 private:
  struct Pool {
    int fd = -1;
  };
  enum class VState : uint8_t { kFree = 0, kMapped = 1 };
  struct Released {
    uint32_t vblock;
    uint64_t stamp;  // released_blocks_ after this span's release
  };

  BlockAllocator() = default;
  Result<uint32_t> TakePhysicalLocked(uint32_t span);
  void PutPhysicalPieceLocked(uint32_t first, uint32_t n);
  Result<uint32_t> TakeVirtualLocked(uint32_t span);
  Status MapLocked(uint32_t vblock, uint32_t pblock, uint32_t span);
  BlockMapping PhysLocation(uint32_t pblock) const;
  bool HeadMappedLocked(uint32_t vblock) const {
    return vblock < num_vblocks_ && vstate_[vblock] == VState::kMapped;
  }
  std::vector<uint32_t>& FreePhysLocked(uint32_t span);

  size_t block_size_ = 0;
  size_t pool_bytes_ = 0;
  size_t blocks_per_pool_ = 0;
  size_t max_physical_blocks_ = 0;  // 0 = unlimited
  uint8_t* map_base_ = nullptr;     // what mmap returned (for munmap)
  size_t map_len_ = 0;
  uint8_t* base_ = nullptr;  // block-aligned start of the usable reservation
  size_t reserve_bytes_ = 0;
  uint32_t num_vblocks_ = 0;

  mutable std::mutex mu_;
  std::vector<Pool> pools_;
  // Free physical spans (punched or never used), by length: index = span.
  std::vector<std::vector<uint32_t>> free_phys_;
  uint64_t free_phys_blocks_ = 0;
  std::vector<uint16_t> pspan_;  // per physical block: span length at a span's first block, else 0
  uint64_t fresh_phys_ = 0;      // physical blocks below this were handed out at least once
  uint64_t phys_in_use_count_ = 0;  // base blocks
  // Per virtual block (lazily zeroed: kFree, span 0, no physical block, no references).
  LazyArray<VState> vstate_;   // at a mapped span's head: kMapped
  LazyArray<uint16_t> vspan_;  // at a mapped span's head: its length
  LazyArray<uint32_t> vphys_;  // at a head: the physical span mapped there
  LazyArray<uint32_t> refs_;   // at a head: home references
  // Released virtual spans by length (index = span), oldest first (reused FIFO past the
  // quarantine), and never-used aligned pieces left over by alignment (reused at once).
  std::vector<std::deque<Released>> free_virt_;
  std::vector<std::vector<uint32_t>> gap_virt_;
  uint64_t released_blocks_ = 0;  // base blocks ever released (quarantine clock)
  size_t vblock_quarantine_ = 0;
  uint32_t fresh_virt_ = 0;
  uint64_t vblocks_in_use_ = 0;  // base blocks
  uint64_t remaps_ = 0;
  uint64_t punches_ = 0;
};

}  // namespace farmem::corm
