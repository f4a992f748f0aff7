// MetaArena: first-fit, address-ordered allocation of 16-byte units in one reserved range, with
// a bitmap of used units and per-page live counts so emptied pages are returned at once (see
// meta_arena.h and docs/objects.md "Metadata accounting").

#include "objects/engine/meta_arena.h"

#include <sys/mman.h>

#include <bit>
#include <cerrno>

namespace farmem::corm {

Result<std::unique_ptr<MetaArena>> MetaArena::Create(size_t reserve_bytes) {
  const size_t len = (std::max(reserve_bytes, kPage) + kPage - 1) / kPage * kPage;
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (m == MAP_FAILED) return Status::FromErrno("reserving the CoRM metadata arena", errno);
  std::unique_ptr<MetaArena> a(new MetaArena());
  a->base_ = static_cast<uint8_t*>(m);
  a->units_ = len / kUnit;
  return a;
}

MetaArena::~MetaArena() {
  if (base_ != nullptr) munmap(base_, units_ * kUnit);
}

size_t MetaArena::NextFree(size_t u) const {
  for (size_t w = u / 64; w < used_.size(); ++w) {
    uint64_t free_bits = ~used_[w];
    if (w == u / 64) free_bits &= ~uint64_t{0} << (u % 64);
    if (free_bits != 0) return w * 64 + static_cast<size_t>(std::countr_zero(free_bits));
  }
  return std::max(u, used_.size() * 64);  // past the bitmap everything is free
}

size_t MetaArena::NextUsed(size_t u, size_t end) const {
  for (size_t w = u / 64; w < used_.size() && w * 64 < end; ++w) {
    uint64_t bits = used_[w];
    if (w == u / 64) bits &= ~uint64_t{0} << (u % 64);
    if (bits != 0) return std::min(end, w * 64 + static_cast<size_t>(std::countr_zero(bits)));
  }
  return end;
}

void MetaArena::Mark(size_t first, size_t n, bool used) {
  const size_t end = first + n;
  if (used && (end + 63) / 64 > used_.size()) used_.resize((end + 63) / 64, 0);
  for (size_t u = first; u < end; ++u) {
    if (used) {
      used_[u / 64] |= uint64_t{1} << (u % 64);
    } else {
      used_[u / 64] &= ~(uint64_t{1} << (u % 64));
    }
  }
  const size_t last_page = (end - 1) / kUnitsPerPage;
  if (used && last_page >= page_units_.size()) page_units_.resize(last_page + 1, 0);
  for (size_t pg = first / kUnitsPerPage; pg <= last_page; ++pg) {
    const size_t lo = std::max(first, pg * kUnitsPerPage);
    const size_t hi = std::min(end, (pg + 1) * kUnitsPerPage);
    const auto k = static_cast<uint16_t>(hi - lo);
    if (used) {
      if (page_units_[pg] == 0) ++resident_pages_;
      page_units_[pg] = static_cast<uint16_t>(page_units_[pg] + k);
      continue;
    }
    page_units_[pg] = static_cast<uint16_t>(page_units_[pg] - k);
    if (page_units_[pg] != 0) continue;
    --resident_pages_;
    // The page holds no live metadata: give it back (it reads as zeros if touched again).
    if (release_pages_ && madvise(base_ + pg * kPage, kPage, MADV_DONTNEED) == 0) {
      ++pages_released_;
    }
  }
}

void* MetaArena::AllocBelow(size_t bytes, const void* limit) {
  if (bytes == 0) return nullptr;
  const size_t n = RoundUp(bytes) / kUnit;
  size_t bound = units_;
  if (limit != nullptr) {
    bound =
        std::min(bound, static_cast<size_t>(static_cast<const uint8_t*>(limit) - base_) / kUnit);
  }
  std::lock_guard<std::mutex> lock(mu_);
  const size_t first = NextFree(hint_);
  size_t u = first;
  while (true) {
    u = NextFree(u);
    if (u + n > bound) return nullptr;
    const size_t used = NextUsed(u, u + n);
    if (used == u + n) break;
    u = used;
  }
  Mark(u, n, true);
  // Every unit below `first` is used; below u + n too when the run starts there.
  hint_ = u == first ? u + n : first;
  high_ = std::max(high_, u + n);
  allocated_units_ += n;
  return base_ + u * kUnit;
}

void MetaArena::Free(void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return;
  const size_t n = RoundUp(bytes) / kUnit;
  const size_t u = static_cast<size_t>(static_cast<uint8_t*>(p) - base_) / kUnit;
  std::lock_guard<std::mutex> lock(mu_);
  Mark(u, n, false);
  hint_ = std::min(hint_, u);
  allocated_units_ -= n;
}

int64_t MetaArena::KernelResidentPages() const {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t pages = (high_ * kUnit + kPage - 1) / kPage;
  if (pages == 0) return 0;
  std::vector<unsigned char> vec(pages);
  if (mincore(base_, pages * kPage, vec.data()) != 0) return -1;
  int64_t n = 0;
  for (unsigned char c : vec) n += c & 1;
  return n;
}

MetaArenaStats MetaArena::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  MetaArenaStats s;
  s.allocated_bytes = allocated_units_ * kUnit;
  s.resident_bytes = resident_pages_ * kPage;
  s.high_water_bytes = high_ * kUnit;
  s.bookkeeping_bytes =
      used_.capacity() * sizeof(uint64_t) + page_units_.capacity() * sizeof(uint16_t);
  s.pages_released = pages_released_;
  return s;
}

}  // namespace farmem::corm
