// Address-ordered arena for the object store's per-block metadata (per-slot arrays, ID tables,
// virtual-block lists) and ArenaArray, the fixed-capacity array the Block struct keeps in it.
// Why not malloc: after compaction the few live blocks' arrays pinned most heap pages (issue 15).
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <type_traits>
#include <vector>

#include "farmem/status.h"

namespace farmem::corm {

struct MetaArenaStats {
  uint64_t allocated_bytes = 0;  // live allocations (whole units)
  uint64_t resident_bytes = 0;   // pages holding at least one live unit (what RSS can hold)
  uint64_t high_water_bytes = 0;
  uint64_t bookkeeping_bytes = 0;  // the bitmap and per-page counts (malloc heap)
  uint64_t pages_released = 0;     // pages given back with madvise(MADV_DONTNEED)
};

// One reserved virtual range (private anonymous, MAP_NORESERVE: costs nothing until touched),
// carved in 16-byte units. Alloc takes the lowest-addressed free run (first fit), so live
// metadata stays packed at the bottom; a page whose last unit is freed goes back to the OS at
// once. Thread-safe (one internal mutex, a leaf: callers may hold any store lock).
class MetaArena {
 public:
  static constexpr size_t kUnit = 16;
  static constexpr size_t kPage = 4096;
  static constexpr size_t kUnitsPerPage = kPage / kUnit;

  static Result<std::unique_ptr<MetaArena>> Create(size_t reserve_bytes);
  ~MetaArena();
  MetaArena(const MetaArena&) = delete;
  MetaArena& operator=(const MetaArena&) = delete;

  // `bytes` rounded up to units; nullptr when bytes == 0 or no run is free. Contents undefined.
  void* Alloc(size_t bytes) { return AllocBelow(bytes, nullptr); }
  // Like Alloc, but only a run that ends at or below `limit` (nullptr: anywhere): how an
  // allocation moves down (ArenaArray::Relocate).
  void* AllocBelow(size_t bytes, const void* limit);
  void Free(void* p, size_t bytes);
  MetaArenaStats Stats() const;
  // Pages of the used part of the range that the kernel has resident (mincore): what the
  // process really pays, for tests to check against Stats(). -1 if mincore fails.
  int64_t KernelResidentPages() const;
  static size_t RoundUp(size_t bytes) { return (bytes + kUnit - 1) / kUnit * kUnit; }
  // TEST ONLY (FARMEM_OBJECTS_FAULT=no_meta_release): keep emptied pages resident.
  void set_release_pages(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    release_pages_ = on;
  }

 private:
  MetaArena() = default;
  bool Used(size_t u) const { return u / 64 < used_.size() && ((used_[u / 64] >> (u % 64)) & 1); }
  size_t NextFree(size_t u) const;
  size_t NextUsed(size_t u, size_t end) const;
  void Mark(size_t first, size_t n, bool used);

  uint8_t* base_ = nullptr;
  size_t units_ = 0;  // capacity of the reservation in units
  mutable std::mutex mu_;
  std::vector<uint64_t> used_;        // bit per unit, up to the high-water mark
  std::vector<uint16_t> page_units_;  // live units per page
  size_t hint_ = 0;                   // no free unit below this one
  size_t high_ = 0;                   // units ever used (exclusive end)
  uint64_t allocated_units_ = 0;
  uint64_t resident_pages_ = 0;
  uint64_t pages_released_ = 0;
  bool release_pages_ = true;
};

// A growable array of trivially copyable T in a MetaArena, 16 B instead of a vector's 24. The
// arena is passed to every call that (re)allocates: block structs hold thousands of these and
// all share one arena. No destructor frees: the owner calls Release (the arena's memory goes
// away with the arena anyway).
template <typename T>
class ArenaArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  // Exactly n elements equal to v, in an allocation of n (old memory freed). False when the
  // arena is full (the array is then empty).
  bool Assign(MetaArena& a, size_t n, const T& v) {
    if (n != cap_) {
      Release(a);
      if (n == 0) return true;
      p_ = static_cast<T*>(a.Alloc(n * sizeof(T)));
      if (p_ == nullptr) return false;
      cap_ = static_cast<uint32_t>(n);
    }
    std::fill(p_, p_ + n, v);
    n_ = static_cast<uint32_t>(n);
    return true;
  }
  // Room for n elements without reallocating (false: arena full, nothing changed).
  bool Reserve(MetaArena& a, size_t n) {
    if (n <= cap_) return true;
    auto* q = static_cast<T*>(a.Alloc(n * sizeof(T)));
    if (q == nullptr) return false;
    if (n_ > 0) std::memcpy(q, p_, n_ * sizeof(T));
    if (p_ != nullptr) a.Free(p_, cap_ * sizeof(T));
    p_ = q;
    cap_ = static_cast<uint32_t>(n);
    return true;
  }
  bool PushBack(MetaArena& a, const T& v) {
    if (n_ == cap_ && !Reserve(a, std::max<size_t>(2, size_t{cap_} * 2))) return false;
    p_[n_++] = v;
    return true;
  }
  void Erase(T* it) {
    std::memmove(it, it + 1, static_cast<size_t>(end() - it - 1) * sizeof(T));
    --n_;
  }
  void Clear() { n_ = 0; }
  void Release(MetaArena& a) {
    if (p_ != nullptr) a.Free(p_, cap_ * sizeof(T));
    p_ = nullptr;
    n_ = cap_ = 0;
  }
  // Moves the elements to the lowest free run below their current one, if there is one, so
  // arrays that outlive their neighbours do not keep the pages above the live ones resident.
  void Relocate(MetaArena& a) {
    if (p_ == nullptr) return;
    auto* q = static_cast<T*>(a.AllocBelow(cap_ * sizeof(T), p_));
    if (q == nullptr) return;
    std::memcpy(q, p_, n_ * sizeof(T));
    a.Free(p_, cap_ * sizeof(T));
    p_ = q;
  }

  size_t size() const { return n_; }
  size_t capacity() const { return cap_; }
  bool empty() const { return n_ == 0; }
  T* data() { return p_; }
  const T* data() const { return p_; }
  T* begin() { return p_; }
  T* end() { return p_ + n_; }
  const T* begin() const { return p_; }
  const T* end() const { return p_ + n_; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }
  const T& front() const { return p_[0]; }
  operator std::span<const T>() const { return {p_, n_}; }
  // Arena bytes held (whole units).
  uint64_t MemoryBytes() const { return cap_ == 0 ? 0 : MetaArena::RoundUp(cap_ * sizeof(T)); }

 private:
  T* p_ = nullptr;
  uint32_t n_ = 0;
  uint32_t cap_ = 0;
};

}  // namespace farmem::corm
