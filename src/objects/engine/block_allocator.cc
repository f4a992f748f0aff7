// BlockAllocator: memfd pools mapped span by span into one reserved virtual range; remap and
// punch for compaction; home reference counts and FIFO quarantine for virtual-span reuse (see
// block_allocator.h).

#include "objects/engine/block_allocator.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <string>

#include "objects/format/size_classes.h"

#if defined(__SANITIZE_THREAD__)
#define FARMEM_CORM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FARMEM_CORM_TSAN 1
#endif
#endif

#ifdef FARMEM_CORM_TSAN
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace farmem::corm {
namespace {

// Every virtual block without a physical block behind it (never used, or released) is mapped like
// this: private anonymous, read-only, no swap reservation. Reads hit the kernel's shared zero page
// (no RSS, no memory charge; only page-table entries), so a transport thread copying through a
// stale pointer reads zeros, i.e. a header with the allocated bit clear ("freed"), instead of
// faulting (PROT_NONE would SIGSEGV the daemon). Writes still fault: nothing may write there.
constexpr int kHoleProt = PROT_READ;
constexpr int kHoleFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

// TSan models mmap(MAP_FIXED) over live memory as a plain write to the range, which it would
// report as racing with the concurrent atomic loads of one-sided readers. The kernel swaps the
// pages atomically (readers see old or new pages), so ignore the imitated write; TSan then
// resets the range's shadow instead.
struct TsanIgnoreScope {
#ifdef FARMEM_CORM_TSAN
  TsanIgnoreScope() {
    __tsan_ignore_thread_begin();
  }
  ~TsanIgnoreScope() {
    __tsan_ignore_thread_end();
  }
#endif
};

}  // namespace

Result<std::unique_ptr<BlockAllocator>> BlockAllocator::Create(
    const BlockAllocatorOptions& options) {
  const size_t bs = options.block_size;
  if (bs < kMinBlockSize || bs > kMaxBlockSize || (bs & (bs - 1)) != 0) {
    return Status::InvalidArgument("block size must be a power of two in [4096, 1048576], got " +
                                   std::to_string(bs));
  }
  if (options.pool_bytes < bs || options.pool_bytes % bs != 0) {
    return Status::InvalidArgument("pool size must be a non-zero multiple of the block size");
  }
  if (options.reserve_bytes < bs || options.reserve_bytes % bs != 0) {
    return Status::InvalidArgument("reserve size must be a non-zero multiple of the block size");
  }
  const uint64_t nblocks = options.reserve_bytes / bs;
  if (nblocks > UINT32_MAX) {
    return Status::InvalidArgument("reservation has more than 2^32 blocks");
  }
  std::unique_ptr<BlockAllocator> a(new BlockAllocator());
  a->block_size_ = bs;
  a->pool_bytes_ = options.pool_bytes;
  a->blocks_per_pool_ = options.pool_bytes / bs;
  a->max_physical_blocks_ = options.max_physical_bytes / bs;
  a->vblock_quarantine_ = options.vblock_quarantine;
  if (options.max_physical_bytes != 0 && a->max_physical_blocks_ == 0) {
    return Status::InvalidArgument("physical budget is smaller than one block");
  }
  // Over-reserve by one block so the usable range can start block-aligned.
  a->map_len_ = options.reserve_bytes + bs;
  void* m = mmap(nullptr, a->map_len_, kHoleProt, kHoleFlags, -1, 0);
  if (m == MAP_FAILED) return Status::FromErrno("reserving CoRM virtual range", errno);
  a->map_base_ = static_cast<uint8_t*>(m);
  const uintptr_t aligned = (reinterpret_cast<uintptr_t>(m) + bs - 1) / bs * bs;
  a->base_ = reinterpret_cast<uint8_t*>(aligned);
  a->reserve_bytes_ = options.reserve_bytes;
  a->num_vblocks_ = static_cast<uint32_t>(nblocks);
  FARMEM_RETURN_IF_ERROR(a->vstate_.Allocate(nblocks));
  FARMEM_RETURN_IF_ERROR(a->vspan_.Allocate(nblocks));
  FARMEM_RETURN_IF_ERROR(a->vphys_.Allocate(nblocks));
  FARMEM_RETURN_IF_ERROR(a->refs_.Allocate(nblocks));
  return a;
}

BlockAllocator::~BlockAllocator() {
  if (map_base_ != nullptr) munmap(map_base_, map_len_);
  for (const Pool& p : pools_) close(p.fd);
}

uint32_t BlockAllocator::virtual_high_water() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fresh_virt_;
}

Result<uint32_t> BlockAllocator::VBlockOf(uint64_t addr) const {
  const auto b = reinterpret_cast<uint64_t>(base_);
  if (addr < b || addr >= b + reserve_bytes_) {
    return Status::OutOfRange("address outside the CoRM object range");
  }
  return static_cast<uint32_t>((addr - b) / block_size_);
}

BlockMapping BlockAllocator::PhysLocation(uint32_t pblock) const {
  return BlockMapping{pools_[pblock / blocks_per_pool_].fd,
                      (pblock % blocks_per_pool_) * uint64_t{block_size_},
                      pblock < pspan_.size() ? pspan_[pblock] : 0u};
}

std::vector<uint32_t>& BlockAllocator::FreePhysLocked(uint32_t span) {
  if (free_phys_.size() <= span) free_phys_.resize(span + 1);
  return free_phys_[span];
}

void BlockAllocator::PutPhysicalPieceLocked(uint32_t first, uint32_t n) {
  // A never-used run (zero pages): as good as a punched span of its length.
  if (n == 0) return;
  FreePhysLocked(n).push_back(first);
  free_phys_blocks_ += n;
}

Result<uint32_t> BlockAllocator::TakePhysicalLocked(uint32_t span) {
  if (max_physical_blocks_ != 0 && phys_in_use_count_ + span > max_physical_blocks_) {
    return Status::ResourceExhausted("CoRM physical memory budget exhausted (" +
                                     std::to_string(max_physical_blocks_ * block_size_) +
                                     " bytes)");
  }
  uint32_t p;
  std::vector<uint32_t>& list = FreePhysLocked(span);
  if (!list.empty()) {
    p = list.back();
    list.pop_back();
    free_phys_blocks_ -= span;
  } else {
    // A span lies inside one pool (one mmap of one file range): skip a pool's tail that is too
    // short, keeping it for spans of its length.
    const uint64_t in_pool = fresh_phys_ % blocks_per_pool_;
    if (in_pool != 0 && in_pool + span > blocks_per_pool_) {
      const auto rest = static_cast<uint32_t>(blocks_per_pool_ - in_pool);
      PutPhysicalPieceLocked(static_cast<uint32_t>(fresh_phys_), rest);
      fresh_phys_ += rest;
    }
    if (fresh_phys_ + span > pools_.size() * blocks_per_pool_) {
      if ((pools_.size() + 1) * blocks_per_pool_ > UINT32_MAX) {
        return Status::ResourceExhausted("too many physical blocks");
      }
      const int fd = memfd_create("farmem-corm-pool", MFD_CLOEXEC);
      if (fd < 0) return Status::FromErrno("memfd_create", errno);
      if (ftruncate(fd, static_cast<off_t>(pool_bytes_)) != 0) {
        const int err = errno;
        close(fd);
        return Status::FromErrno("ftruncate memfd pool", err);
      }
      pools_.push_back(Pool{fd});
      pspan_.resize(pools_.size() * blocks_per_pool_, 0);
    }
    p = static_cast<uint32_t>(fresh_phys_);
    fresh_phys_ += span;
  }
  pspan_[p] = static_cast<uint16_t>(span);
  phys_in_use_count_ += span;
  return p;
}

Result<uint32_t> BlockAllocator::TakeVirtualLocked(uint32_t span) {
  if (free_virt_.size() <= span) {
    free_virt_.resize(span + 1);
    gap_virt_.resize(span + 1);
  }
  std::deque<Released>& released = free_virt_[span];
  // Oldest released span first, and only past the quarantine while fresh blocks remain: the
  // block a stale pointer names is reused as late as possible.
  if (!released.empty() && released_blocks_ - released.front().stamp >= vblock_quarantine_) {
    const uint32_t v = released.front().vblock;
    released.pop_front();
    return v;
  }
  if (!gap_virt_[span].empty()) {
    const uint32_t v = gap_virt_[span].back();
    gap_virt_[span].pop_back();
    return v;
  }
  // Power-of-two spans start at a multiple of themselves (a slot's block is found from its
  // offset alone); the pieces skipped to get there are kept for spans of their sizes.
  const bool aligned = std::has_single_bit(span);
  const uint64_t start = aligned ? (uint64_t{fresh_virt_} + span - 1) / span * span : fresh_virt_;
  if (start + span <= num_vblocks_) {
    uint64_t at = fresh_virt_;
    while (at < start) {
      // Largest power of two that divides `at` (> 0: `start` is past it) and fits before
      // `start`; shorter than `span`, so its lists exist.
      uint64_t piece = at & (~at + 1);
      while (at + piece > start) piece /= 2;
      gap_virt_[static_cast<uint32_t>(piece)].push_back(static_cast<uint32_t>(at));
      at += piece;
    }
    fresh_virt_ = static_cast<uint32_t>(start + span);
    return static_cast<uint32_t>(start);
  }
  if (!released.empty()) {  // no fresh space left: past the quarantine or not
    const uint32_t v = released.front().vblock;
    released.pop_front();
    return v;
  }
  return Status::ResourceExhausted("CoRM virtual range exhausted");
}

Status BlockAllocator::MapLocked(uint32_t vblock, uint32_t pblock, uint32_t span) {
  const BlockMapping loc = PhysLocation(pblock);
  [[maybe_unused]] TsanIgnoreScope ignore;
  void* r = mmap(VAddr(vblock), size_t{span} * block_size_, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_FIXED, loc.memfd, static_cast<off_t>(loc.file_offset));
  if (r == MAP_FAILED) return Status::FromErrno("mmap CoRM block", errno);
  vphys_[vblock] = pblock;
  return Status::OK();
}

Result<BlockGrant> BlockAllocator::AllocBlock(uint32_t span) {
  if (span == 0 || span > blocks_per_pool_ || span > UINT16_MAX) {
    return Status::InvalidArgument(
        "block of " + std::to_string(span) + " base blocks: must be 1.." +
        std::to_string(std::min<size_t>(blocks_per_pool_, UINT16_MAX)) + " (one pool)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  FARMEM_ASSIGN_OR_RETURN(uint32_t p, TakePhysicalLocked(span));
  auto v = TakeVirtualLocked(span);
  Status st = v.ok() ? MapLocked(*v, p, span) : v.status();
  if (!st.ok()) {
    pspan_[p] = 0;
    phys_in_use_count_ -= span;
    FreePhysLocked(span).push_back(p);
    free_phys_blocks_ += span;
    // A virtual span taken but not mapped goes back as a never-used piece.
    if (v.ok()) gap_virt_[span].push_back(*v);
    return st;
  }
  vstate_[*v] = VState::kMapped;
  vspan_[*v] = static_cast<uint16_t>(span);
  refs_[*v] = 0;
  vblocks_in_use_ += span;
  return BlockGrant{*v, p};
}

Status BlockAllocator::Remap(uint32_t vblock, uint32_t pblock) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!HeadMappedLocked(vblock)) {
    return Status::InvalidArgument("remap of an unmapped virtual block");
  }
  if (pblock >= pspan_.size() || pspan_[pblock] == 0) {
    return Status::InvalidArgument("remap onto a physical block that is not in use");
  }
  if (pspan_[pblock] != vspan_[vblock]) {
    return Status::InvalidArgument("remap of a " + std::to_string(vspan_[vblock]) +
                                   "-block span onto a " + std::to_string(pspan_[pblock]) +
                                   "-block one");
  }
  FARMEM_RETURN_IF_ERROR(MapLocked(vblock, pblock, vspan_[vblock]));
  ++remaps_;
  return Status::OK();
}

Status BlockAllocator::ReleasePhysical(uint32_t pblock) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pblock >= pspan_.size() || pspan_[pblock] == 0) {
    return Status::InvalidArgument("release of a physical block that is not in use");
  }
  const BlockMapping loc = PhysLocation(pblock);
  const uint32_t span = pspan_[pblock];
  pspan_[pblock] = 0;
  phys_in_use_count_ -= span;
  if (fallocate(loc.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(loc.file_offset),
                static_cast<off_t>(size_t{span} * block_size_)) != 0) {
    // Not reused: a new block must start with zero pages (all headers "not allocated"), which an
    // unpunched block does not guarantee. Losing one span is the safe failure.
    return Status::FromErrno("punching CoRM block (block retired)", errno);
  }
  FreePhysLocked(span).push_back(pblock);
  free_phys_blocks_ += span;
  ++punches_;
  return Status::OK();
}

Status BlockAllocator::ReleaseVirtual(uint32_t vblock) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!HeadMappedLocked(vblock)) {
    return Status::InvalidArgument("release of an unmapped virtual block");
  }
  if (refs_[vblock] != 0) {
    return Status::InvalidArgument("virtual block " + std::to_string(vblock) + " still homes " +
                                   std::to_string(refs_[vblock]) + " objects");
  }
  const uint32_t span = vspan_[vblock];
  [[maybe_unused]] TsanIgnoreScope ignore;
  // Replaces the shared mapping in one step: a concurrent reader sees the old pages or zeros.
  void* r =
      mmap(VAddr(vblock), size_t{span} * block_size_, kHoleProt, kHoleFlags | MAP_FIXED, -1, 0);
  if (r == MAP_FAILED) return Status::FromErrno("unmapping CoRM block", errno);
  vstate_[vblock] = VState::kFree;
  vspan_[vblock] = 0;
  released_blocks_ += span;
  free_virt_[span].push_back(Released{vblock, released_blocks_});
  vblocks_in_use_ -= span;
  return Status::OK();
}

Status BlockAllocator::AddHomeRef(uint32_t vblock) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!HeadMappedLocked(vblock)) {
    return Status::InvalidArgument("home reference on an unmapped virtual block");
  }
  ++refs_[vblock];
  return Status::OK();
}

Result<uint32_t> BlockAllocator::DropHomeRef(uint32_t vblock) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!HeadMappedLocked(vblock) || refs_[vblock] == 0) {
    return Status::Internal("home reference underflow on virtual block " + std::to_string(vblock));
  }
  return --refs_[vblock];
}

uint32_t BlockAllocator::HomeRefs(uint32_t vblock) const {
  std::lock_guard<std::mutex> lock(mu_);
  return vblock < num_vblocks_ ? refs_[vblock] : 0;
}

Result<BlockMapping> BlockAllocator::MappingOf(uint32_t vblock) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!HeadMappedLocked(vblock)) {
    return Status::NotFound("virtual block " + std::to_string(vblock) + " is not mapped");
  }
  return PhysLocation(vphys_[vblock]);
}

BlockAllocatorStats BlockAllocator::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  BlockAllocatorStats s;
  s.physical_blocks_in_use = phys_in_use_count_;
  s.physical_bytes_held = phys_in_use_count_ * block_size_;
  s.physical_blocks_free = free_phys_blocks_;
  s.virtual_blocks_in_use = vblocks_in_use_;
  s.pools = pools_.size();
  s.pool_bytes_total = pools_.size() * pool_bytes_;
  s.remaps = remaps_;
  s.punches = punches_;
  uint64_t lists = 0;
  for (const auto& l : free_phys_) lists += sizeof(l) + l.capacity() * sizeof(uint32_t);
  for (const auto& l : gap_virt_) lists += sizeof(l) + l.capacity() * sizeof(uint32_t);
  // libstdc++'s deque holds its elements in 512-byte chunks (plus a small map of them).
  for (const auto& d : free_virt_) {
    lists += sizeof(d) + (d.size() * sizeof(Released) / 512 + 1) * 512;
  }
  // The per-virtual-block tables are lazily zeroed: only the part up to the high-water mark was
  // ever touched (whole pages of it).
  const uint64_t per_vblock = sizeof(VState) + sizeof(uint16_t) + 2 * sizeof(uint32_t);
  const uint64_t touched = (uint64_t{fresh_virt_} * per_vblock + 4095) / 4096 * 4096;
  s.metadata_bytes =
      touched + pspan_.capacity() * sizeof(uint16_t) + pools_.capacity() * sizeof(Pool) + lists;
  return s;
}

}  // namespace farmem::corm
