// BlockAllocator: memfd pools mapped block by block into one reserved virtual range; remap and
// punch for compaction; home reference counts and FIFO quarantine for virtual-block reuse (see
// block_allocator.h).

#include "objects/engine/block_allocator.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

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
  a->vstate_.assign(nblocks, VState::kFree);
  a->vphys_.assign(nblocks, 0);
  a->refs_.assign(nblocks, 0);
  return a;
}

BlockAllocator::~BlockAllocator() {
  if (map_base_ != nullptr) munmap(map_base_, map_len_);
  for (const Pool& p : pools_) close(p.fd);
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
                      (pblock % blocks_per_pool_) * uint64_t{block_size_}};
}

Result<uint32_t> BlockAllocator::TakePhysicalLocked() {
  if (max_physical_blocks_ != 0 && phys_in_use_count_ >= max_physical_blocks_) {
    return Status::ResourceExhausted("CoRM physical memory budget exhausted (" +
                                     std::to_string(max_physical_blocks_ * block_size_) +
                                     " bytes)");
  }
  uint32_t p;
  if (!free_phys_.empty()) {
    p = free_phys_.back();
    free_phys_.pop_back();
  } else {
    if (fresh_phys_ == pools_.size() * blocks_per_pool_) {
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
      phys_in_use_.resize(pools_.size() * blocks_per_pool_, 0);
    }
    p = static_cast<uint32_t>(fresh_phys_++);
  }
  phys_in_use_[p] = 1;
  ++phys_in_use_count_;
  return p;
}

Status BlockAllocator::MapLocked(uint32_t vblock, uint32_t pblock) {
  const BlockMapping loc = PhysLocation(pblock);
  [[maybe_unused]] TsanIgnoreScope ignore;
  void* r = mmap(VAddr(vblock), block_size_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                 loc.memfd, static_cast<off_t>(loc.file_offset));
  if (r == MAP_FAILED) return Status::FromErrno("mmap CoRM block", errno);
  vphys_[vblock] = pblock;
  return Status::OK();
}

Result<BlockGrant> BlockAllocator::AllocBlock() {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t v;
  bool fresh_v = false;
  // Oldest released block first, and only past the quarantine while fresh blocks remain: the
  // block a stale pointer names is reused as late as possible.
  if (!free_virt_.empty() &&
      (free_virt_.size() > vblock_quarantine_ || fresh_virt_ == num_vblocks_)) {
    v = free_virt_.front();
  } else if (fresh_virt_ < num_vblocks_) {
    v = fresh_virt_;
    fresh_v = true;
  } else {
    return Status::ResourceExhausted("CoRM virtual range exhausted");
  }
  FARMEM_ASSIGN_OR_RETURN(uint32_t p, TakePhysicalLocked());
  Status st = MapLocked(v, p);
  if (!st.ok()) {
    phys_in_use_[p] = 0;
    --phys_in_use_count_;
    free_phys_.push_back(p);
    return st;
  }
  if (fresh_v) {
    ++fresh_virt_;
  } else {
    free_virt_.pop_front();
  }
  vstate_[v] = VState::kMapped;
  refs_[v] = 0;
  ++vblocks_in_use_;
  return BlockGrant{v, p};
}

Status BlockAllocator::Remap(uint32_t vblock, uint32_t pblock) {
  std::lock_guard<std::mutex> lock(mu_);
  if (vblock >= num_vblocks_ || vstate_[vblock] != VState::kMapped) {
    return Status::InvalidArgument("remap of an unmapped virtual block");
  }
  if (pblock >= phys_in_use_.size() || !phys_in_use_[pblock]) {
    return Status::InvalidArgument("remap onto a physical block that is not in use");
  }
  FARMEM_RETURN_IF_ERROR(MapLocked(vblock, pblock));
  ++remaps_;
  return Status::OK();
}

Status BlockAllocator::ReleasePhysical(uint32_t pblock) {
  std::lock_guard<std::mutex> lock(mu_);
  if (pblock >= phys_in_use_.size() || !phys_in_use_[pblock]) {
    return Status::InvalidArgument("release of a physical block that is not in use");
  }
  const BlockMapping loc = PhysLocation(pblock);
  phys_in_use_[pblock] = 0;
  --phys_in_use_count_;
  if (fallocate(loc.memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                static_cast<off_t>(loc.file_offset), static_cast<off_t>(block_size_)) != 0) {
    // Not reused: a new block must start with zero pages (all headers "not allocated"), which an
    // unpunched block does not guarantee. Losing one block is the safe failure.
    return Status::FromErrno("punching CoRM block (block retired)", errno);
  }
  free_phys_.push_back(pblock);
  ++punches_;
  return Status::OK();
}

Status BlockAllocator::ReleaseVirtual(uint32_t vblock) {
  std::lock_guard<std::mutex> lock(mu_);
  if (vblock >= num_vblocks_ || vstate_[vblock] != VState::kMapped) {
    return Status::InvalidArgument("release of an unmapped virtual block");
  }
  if (refs_[vblock] != 0) {
    return Status::InvalidArgument("virtual block " + std::to_string(vblock) + " still homes " +
                                   std::to_string(refs_[vblock]) + " objects");
  }
  [[maybe_unused]] TsanIgnoreScope ignore;
  // Replaces the shared mapping in one step: a concurrent reader sees the old pages or zeros.
  void* r = mmap(VAddr(vblock), block_size_, kHoleProt, kHoleFlags | MAP_FIXED, -1, 0);
  if (r == MAP_FAILED) return Status::FromErrno("unmapping CoRM block", errno);
  vstate_[vblock] = VState::kFree;
  free_virt_.push_back(vblock);
  --vblocks_in_use_;
  return Status::OK();
}

Status BlockAllocator::AddHomeRef(uint32_t vblock) {
  std::lock_guard<std::mutex> lock(mu_);
  if (vblock >= num_vblocks_ || vstate_[vblock] != VState::kMapped) {
    return Status::InvalidArgument("home reference on an unmapped virtual block");
  }
  ++refs_[vblock];
  return Status::OK();
}

Result<uint32_t> BlockAllocator::DropHomeRef(uint32_t vblock) {
  std::lock_guard<std::mutex> lock(mu_);
  if (vblock >= num_vblocks_ || vstate_[vblock] != VState::kMapped || refs_[vblock] == 0) {
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
  if (vblock >= num_vblocks_ || vstate_[vblock] != VState::kMapped) {
    return Status::NotFound("virtual block " + std::to_string(vblock) + " is not mapped");
  }
  return PhysLocation(vphys_[vblock]);
}

BlockAllocatorStats BlockAllocator::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  BlockAllocatorStats s;
  s.physical_blocks_in_use = phys_in_use_count_;
  s.physical_bytes_held = phys_in_use_count_ * block_size_;
  s.physical_blocks_free = free_phys_.size();
  s.virtual_blocks_in_use = vblocks_in_use_;
  s.pools = pools_.size();
  s.pool_bytes_total = pools_.size() * pool_bytes_;
  s.remaps = remaps_;
  s.punches = punches_;
  // libstdc++'s deque holds its elements in 512-byte chunks (plus a small map of them).
  const uint64_t deque_bytes = (free_virt_.size() * sizeof(uint32_t) / 512 + 1) * 512;
  s.metadata_bytes = vstate_.capacity() * sizeof(VState) + vphys_.capacity() * sizeof(uint32_t) +
                     refs_.capacity() * sizeof(uint32_t) + phys_in_use_.capacity() +
                     free_phys_.capacity() * sizeof(uint32_t) + pools_.capacity() * sizeof(Pool) +
                     deque_bytes;
  return s;
}

}  // namespace farmem::corm
