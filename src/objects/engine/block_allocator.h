// Process-wide CoRM block allocator: one read-only zero-page virtual reservation, 16 MiB memfd
// pools carved into blocks, the virtual-block -> (memfd, offset) map, remapping of a virtual block
// onto another block's physical pages, hole punching, and home reference counts that gate
// virtual-block reuse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "farmem/status.h"

namespace farmem::corm {

struct BlockAllocatorOptions {
  size_t block_size = 4096;                // power of two, 4 KiB .. 1 MiB
  size_t reserve_bytes = size_t{4} << 30;  // virtual range (reads as zeros until blocks are mapped)
  size_t pool_bytes = size_t{16} << 20;    // one memfd file; multiple of block_size
  size_t max_physical_bytes = 0;           // 0 = unlimited; else AllocBlock fails beyond it
  // Released virtual blocks are reused first in, first out, and only while more than this many
  // wait (or no never-used virtual block is left). A stale pointer into a released block reads
  // zeros ("freed") until the block is reused; the quarantine makes that window long. The Store
  // also changes generations across lives (docs/objects.md, "Pointer identity").
  size_t vblock_quarantine = 0;
};

// Where a virtual block's pages come from.
struct BlockMapping {
  int memfd = -1;
  uint64_t file_offset = 0;
};

struct BlockGrant {
  uint32_t vblock = 0;  // virtual block index (address = base + vblock * block_size)
  uint32_t pblock = 0;  // physical block index (pool * blocks_per_pool + index in pool)
};

struct BlockAllocatorStats {
  uint64_t physical_bytes_held = 0;  // physical blocks in use * block size (own accounting)
  uint64_t physical_blocks_in_use = 0;
  uint64_t physical_blocks_free = 0;  // punched, ready for reuse
  uint64_t virtual_blocks_in_use = 0;
  uint64_t pools = 0;
  uint64_t pool_bytes_total = 0;  // memfd capacity created (not resident memory)
  uint64_t remaps = 0;
  uint64_t punches = 0;
  // Heap bytes of the allocator's own tables: per virtual block (state, mapping, home count;
  // fixed by reserve_bytes), per physical block, and the free lists.
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
  uint8_t* VAddr(uint32_t vblock) const { return base_ + size_t{vblock} * block_size_; }
  // Virtual block containing `addr`, or error if outside the reservation.
  Result<uint32_t> VBlockOf(uint64_t addr) const;

  // A fresh physical block (zero pages) mapped at a free virtual block; the home count is 0.
  // ResourceExhausted when the physical budget or the reservation is used up.
  Result<BlockGrant> AllocBlock();
  // Maps physical block `pblock` at virtual block `vblock` (MAP_FIXED|MAP_SHARED), replacing
  // whatever was there. Concurrent readers see either the old or the new pages, never a hole.
  Status Remap(uint32_t vblock, uint32_t pblock);
  // Punches the physical block's pages (FALLOC_FL_PUNCH_HOLE) and makes it reusable. The caller
  // guarantees no virtual block maps it any more (or that the mapping is about to be released).
  Status ReleasePhysical(uint32_t pblock);
  // Returns a virtual block to the free list, mapped back to read-only zero pages (so one-sided
  // readers holding a stale pointer read "freed", never fault); fails if objects still home there.
  Status ReleaseVirtual(uint32_t vblock);

  // Home counts: live objects whose pointer addresses this virtual block.
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
  enum class VState : uint8_t { kFree, kMapped };

  BlockAllocator() = default;
  Result<uint32_t> TakePhysicalLocked();
  Status MapLocked(uint32_t vblock, uint32_t pblock);
  BlockMapping PhysLocation(uint32_t pblock) const;

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
  std::vector<uint32_t> free_phys_;
  std::vector<uint8_t> phys_in_use_;  // per physical block, 0/1
  uint64_t fresh_phys_ = 0;           // physical blocks handed out at least once
  uint64_t phys_in_use_count_ = 0;
  std::vector<VState> vstate_;
  std::vector<uint32_t> vphys_;  // mapped physical block per virtual block
  std::vector<uint32_t> refs_;
  std::deque<uint32_t> free_virt_;  // released, oldest first (reused FIFO, see vblock_quarantine)
  size_t vblock_quarantine_ = 0;
  uint32_t fresh_virt_ = 0;
  uint64_t vblocks_in_use_ = 0;
  uint64_t remaps_ = 0;
  uint64_t punches_ = 0;
};

}  // namespace farmem::corm
