// RegionHeap: rmalloc/rfree, a buddy allocator whose whole state is inside the caller's byte range
// (heap_layout.h; docs/regions_sync.md, "rmalloc"). Any thread of any process attached to the same
// range may call it: every operation holds the lock word in the range's header.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "farmem/regions.h"
#include "regions/rmalloc/heap_faults.h"
#include "regions/rmalloc/heap_layout.h"

namespace farmem {

namespace regions::rmalloc::testing {
namespace {
std::atomic<bool> g_lock_disabled{false};
}  // namespace
void SetHeapLockDisabled(bool disabled) {
  g_lock_disabled.store(disabled, std::memory_order_relaxed);
}
}  // namespace regions::rmalloc::testing

using namespace regions::rmalloc;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kLockTimeout = std::chrono::seconds(5);

uint64_t AlignUp(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}
uint64_t BlockSize(int order) {
  return kGrain << order;
}

// Waits with a growing sleep (spin first) until `ready` or the deadline.
template <typename F>
bool WaitUntil(F ready, Clock::time_point deadline) {
  for (int i = 0;; i++) {
    if (ready()) return true;
    if (Clock::now() >= deadline) return false;
    if (i < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(i < 1000 ? 10 : 200));
    }
  }
}

// The heap's state as this process sees it: pointers into the range, all under the lock.
class HeapView {
 public:
  explicit HeapView(std::span<std::byte> region)
      : base_(region.data()), hdr_(reinterpret_cast<HeapHeader*>(region.data())) {}

  HeapHeader* hdr() { return hdr_; }
  uint8_t* map() { return reinterpret_cast<uint8_t*>(base_ + hdr_->map_offset); }
  std::byte* data() { return base_ + hdr_->data_offset; }
  FreeNode* node(uint64_t off) { return reinterpret_cast<FreeNode*>(data() + off); }

  Status Lock() {
    if (testing::g_lock_disabled.load(std::memory_order_relaxed)) return Status::OK();
    std::atomic_ref<uint32_t> lock(hdr_->lock);
    const uint32_t me = static_cast<uint32_t>(::getpid());
    const bool ok = WaitUntil(
        [&] {
          uint32_t expected = 0;
          return lock.compare_exchange_weak(expected, me, std::memory_order_acquire);
        },
        Clock::now() + kLockTimeout);
    if (!ok) {
      return Status::TimedOut("rmalloc: the heap's lock stayed held for 5 s (by pid " +
                              std::to_string(lock.load(std::memory_order_relaxed)) +
                              "; a holder that died leaves it held)");
    }
    return Status::OK();
  }
  void Unlock() {
    if (testing::g_lock_disabled.load(std::memory_order_relaxed)) return;
    std::atomic_ref<uint32_t>(hdr_->lock).store(0, std::memory_order_release);
  }

  // The geometry is inside the range and self-consistent (a corrupted header is an error).
  Status CheckGeometry(uint64_t mapped) {
    const HeapHeader& h = *hdr_;
    if (h.version != 1) return Status::InvalidArgument("rmalloc: unknown heap version");
    if (h.region_size > mapped) {
      return Status::InvalidArgument("rmalloc: the heap was formatted for " +
                                     std::to_string(h.region_size) + " bytes; only " +
                                     std::to_string(mapped) + " given");
    }
    const uint64_t grains = h.data_size / kGrain;
    if (h.data_size % kGrain != 0 || h.data_offset % kGrain != 0 ||
        h.map_offset < sizeof(HeapHeader) || h.map_offset + grains > h.data_offset ||
        h.data_offset + h.data_size > h.region_size) {
      return Status::InvalidArgument("rmalloc: corrupted heap header (geometry)");
    }
    return Status::OK();
  }

  void Format(uint64_t size) {
    HeapHeader& h = *hdr_;
    // Everything after the magic word (the caller holds kHeapFormatting there).
    std::memset(reinterpret_cast<char*>(&h) + sizeof(h.magic), 0,
                sizeof(HeapHeader) - sizeof(h.magic));
    h.version = 1;
    h.region_size = size;
    h.map_offset = sizeof(HeapHeader);
    uint64_t grains = (size - sizeof(HeapHeader) - kGrain) / (kGrain + 1);
    h.data_offset = AlignUp(h.map_offset + grains, kGrain);
    while (h.data_offset + grains * kGrain > size) grains--;
    h.data_size = grains * kGrain;
    std::memset(map(), 0, grains);
    // Carve the data into the largest aligned blocks (the size need not be a power of two).
    uint64_t off = 0;
    while (off + kGrain <= h.data_size) {
      int k = 0;
      while (k + 1 < kOrders && off % BlockSize(k + 1) == 0 &&
             off + BlockSize(k + 1) <= h.data_size)
        k++;
      (void)Push(off, k);  // fresh lists: every head is valid
      off += BlockSize(k);
    }
  }

  // Free-list operations; offsets are data-relative. Corruption is reported, never followed.
  bool IsFree(uint64_t off, int k) {
    return off % kGrain == 0 && off + BlockSize(k) <= hdr_->data_size &&
           map()[off / kGrain] == (kMapFree | k);
  }
  Status Push(uint64_t off, int k) {
    const uint64_t head = hdr_->free_head[k];
    if (head != 0 && !IsFree(head - 1, k)) {
      return Status::Internal("rmalloc: corrupted heap (free list head of order " +
                              std::to_string(k) + ")");
    }
    FreeNode* n = node(off);
    n->prev = 0;
    n->next = head;
    if (n->next != 0) node(n->next - 1)->prev = off + 1;
    hdr_->free_head[k] = off + 1;
    map()[off / kGrain] = static_cast<uint8_t>(kMapFree | k);
    return Status::OK();
  }
  Status Remove(uint64_t off, int k) {
    FreeNode* n = node(off);
    if ((n->next != 0 && !IsFree(n->next - 1, k)) || (n->prev != 0 && !IsFree(n->prev - 1, k))) {
      return Status::Internal("rmalloc: corrupted heap (free list of order " + std::to_string(k) +
                              ")");
    }
    if (n->prev != 0) {
      node(n->prev - 1)->next = n->next;
    } else {
      hdr_->free_head[k] = n->next;
    }
    if (n->next != 0) node(n->next - 1)->prev = n->prev;
    map()[off / kGrain] = 0;
    return Status::OK();
  }

  Result<void*> Alloc(size_t len) {
    HeapHeader& h = *hdr_;
    if (len == 0) return Status::InvalidArgument("rmalloc: length 0");
    if (len > h.data_size) {
      return Status::ResourceExhausted("rmalloc: " + std::to_string(len) +
                                       " bytes is more than the heap holds");
    }
    const uint64_t need = len + sizeof(AllocHeader);
    int k = 0;
    while (BlockSize(k) < need) k++;
    int j = k;
    while (j < kOrders && h.free_head[j] == 0) j++;
    if (j == kOrders) {
      return Status::ResourceExhausted("rmalloc: no free block of " + std::to_string(BlockSize(k)) +
                                       " bytes (for " + std::to_string(len) + ")");
    }
    const uint64_t off = h.free_head[j] - 1;
    if (!IsFree(off, j)) return Status::Internal("rmalloc: corrupted heap (free list head)");
    FARMEM_RETURN_IF_ERROR(Remove(off, j));
    while (j > k) {  // split: the upper halves go to the free lists
      j--;
      FARMEM_RETURN_IF_ERROR(Push(off + BlockSize(j), j));
    }
    map()[off / kGrain] = static_cast<uint8_t>(kMapUsed | k);
    auto* a = reinterpret_cast<AllocHeader*>(data() + off);
    a->tag = kAllocTag ^ off;
    a->order = static_cast<uint64_t>(k);
    h.allocated += BlockSize(k);
    h.allocations++;
    return static_cast<void*>(data() + off + sizeof(AllocHeader));
  }

  Status Free(void* ptr) {
    HeapHeader& h = *hdr_;
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    const auto d = reinterpret_cast<uintptr_t>(data());
    auto foreign = [&](const char* why) {
      return Status::InvalidArgument(std::string("rfree: ") + why);
    };
    if (p < d + sizeof(AllocHeader) || p - d - sizeof(AllocHeader) >= h.data_size) {
      return foreign("pointer outside this heap");
    }
    uint64_t off = p - d - sizeof(AllocHeader);
    if (off % kGrain != 0) return foreign("not a pointer rmalloc returned (misaligned)");
    const uint8_t m = map()[off / kGrain];
    if ((m & kMapUsed) == 0) {
      return foreign("not an allocated block (double free, or a pointer rmalloc did not return)");
    }
    int k = m & kMapOrder;
    auto* a = reinterpret_cast<AllocHeader*>(data() + off);
    if (k >= kOrders || a->tag != (kAllocTag ^ off) || a->order != static_cast<uint64_t>(k)) {
      return Status::Internal("rmalloc: corrupted heap (the block's header was overwritten)");
    }
    a->tag = 0;
    map()[off / kGrain] = 0;
    h.allocated -= BlockSize(k);
    h.allocations--;
    while (k + 1 < kOrders) {  // merge with the buddy while it is free and of the same order
      const uint64_t buddy = off ^ BlockSize(k);
      if (!IsFree(buddy, k)) break;
      FARMEM_RETURN_IF_ERROR(Remove(buddy, k));
      off = std::min(off, buddy);
      k++;
    }
    return Push(off, k);
  }

 private:
  std::byte* base_;
  HeapHeader* hdr_;
};

}  // namespace

Result<RegionHeap> RegionHeap::Attach(std::span<std::byte> region) {
  if (reinterpret_cast<uintptr_t>(region.data()) % kGrain != 0) {
    return Status::InvalidArgument("rmalloc: the region must start 64-byte aligned");
  }
  if (region.size() < kMinRegion) {
    return Status::InvalidArgument("rmalloc: the region needs at least 4096 bytes");
  }
  HeapView v(region);
  std::atomic_ref<uint64_t> magic(v.hdr()->magic);
  uint64_t seen = magic.load(std::memory_order_acquire);
  if (seen == 0 && magic.compare_exchange_strong(seen, kHeapFormatting)) {
    v.Format(region.size());
    magic.store(kHeapMagic, std::memory_order_release);
    return RegionHeap(region);
  }
  if (seen == kHeapFormatting) {  // another user is formatting it right now
    WaitUntil([&] { return (seen = magic.load(std::memory_order_acquire)) != kHeapFormatting; },
              Clock::now() + kLockTimeout);
    if (seen == kHeapFormatting) {
      return Status::TimedOut("rmalloc: the heap stayed half-formatted for 5 s");
    }
  }
  if (seen != kHeapMagic) {
    return Status::InvalidArgument("rmalloc: the region is neither zeroed nor a heap (magic)");
  }
  FARMEM_RETURN_IF_ERROR(v.CheckGeometry(region.size()));
  return RegionHeap(region);
}

Result<void*> RegionHeap::rmalloc(size_t len) {
  HeapView v(region_);
  FARMEM_RETURN_IF_ERROR(v.Lock());
  auto r = v.Alloc(len);
  v.Unlock();
  return r;
}

Status RegionHeap::rfree(void* ptr) {
  HeapView v(region_);
  FARMEM_RETURN_IF_ERROR(v.Lock());
  Status st = v.Free(ptr);
  v.Unlock();
  return st;
}

Result<RegionHeapStats> RegionHeap::stats() {
  HeapView v(region_);
  FARMEM_RETURN_IF_ERROR(v.Lock());
  RegionHeapStats s{v.hdr()->data_size, v.hdr()->allocated, v.hdr()->allocations};
  v.Unlock();
  return s;
}

Result<void*> rmalloc(std::span<std::byte> region, size_t len) {
  FARMEM_ASSIGN_OR_RETURN(RegionHeap heap, RegionHeap::Attach(region));
  return heap.rmalloc(len);
}

Status rfree(std::span<std::byte> region, void* ptr) {
  FARMEM_ASSIGN_OR_RETURN(RegionHeap heap, RegionHeap::Attach(region));
  return heap.rfree(ptr);
}

}  // namespace farmem
