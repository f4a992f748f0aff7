// StructSlab<T>: fixed-address storage for long-lived structs (the object store's block structs)
// that hands out the lowest free slot, and gives back to the kernel the pages whose structs are all
// free, so the memory it holds follows the structs in use rather than their peak.
//
// Layout: one reserved range (private anonymous, MAP_NORESERVE) of whole pages, each holding
// kPerPage structs (none straddles a page). A slot is *constructed* (placement new) the first time
// it is taken after its page was last given back; a page given back reads as zeros again and its
// structs are constructed anew on their next use (their destructors are not run: T must hold no
// resource while free). Thread-safe: one mutex, a leaf (callers may hold any other lock).
//
// Releasing pages safely is the caller's business: a struct may be referenced by a thread that
// loaded a pointer to it before it was freed. BeginRelease() takes the releasable pages out of
// circulation, the caller waits until no such thread can exist (its grace period), then calls
// FinishRelease() (or AbortRelease() to put them back untouched).
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <vector>

#include "farmem/status.h"

namespace farmem::corm {

struct StructSlabStats {
  uint64_t in_use = 0;          // structs taken
  uint64_t resident_pages = 0;  // pages holding a constructed struct
  uint64_t pages_released = 0;  // pages given back (ever)
  uint64_t high_water = 0;      // slots ever constructed up to (exclusive)
  uint64_t bookkeeping_bytes = 0;
};

template <typename T>
class StructSlab {
 public:
  static constexpr size_t kPage = 4096;
  static constexpr size_t kPerPage = kPage / sizeof(T);
  static_assert(kPerPage >= 1, "a struct must fit in a page");
  static_assert(alignof(T) <= 64 && kPage % alignof(T) == 0);

  StructSlab() = default;
  ~StructSlab() {
    if (base_ == nullptr) return;
    for (size_t i = 0; i < high_; ++i) {
      if (constructed_[i]) At(i)->~T();
    }
    munmap(base_, pages_ * kPage);
  }
  StructSlab(const StructSlab&) = delete;
  StructSlab& operator=(const StructSlab&) = delete;

  // Room for at most `max_items` structs (reserved, not allocated).
  Status Init(size_t max_items) {
    pages_ = std::max<size_t>(1, (max_items + kPerPage - 1) / kPerPage);
    void* m = mmap(nullptr, pages_ * kPage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return Status::FromErrno("reserving the block struct slab", errno);
    base_ = static_cast<uint8_t*>(m);
    capacity_ = pages_ * kPerPage;
    return Status::OK();
  }

  T* At(size_t i) const {
    return reinterpret_cast<T*>(base_ + (i / kPerPage) * kPage + (i % kPerPage) * sizeof(T));
  }
  size_t IndexOf(const T* p) const {
    const size_t off = static_cast<size_t>(reinterpret_cast<const uint8_t*>(p) - base_);
    return off / kPage * kPerPage + off % kPage / sizeof(T);
  }

  // The lowest free slot (constructed if its page was given back), or nullptr when every slot is
  // in use. With `below`, only a slot with a lower index than it (nullptr otherwise).
  T* Take(const T* below = nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t limit = below == nullptr ? capacity_ : IndexOf(below);
    const size_t i = LowestFreeLocked(limit);
    if (i == kNone) return nullptr;
    SetFree(i, false);
    ++in_use_;
    ++page_used_[i / kPerPage];
    if (!constructed_[i]) {
      new (At(i)) T();
      constructed_[i] = 1;
      if (page_constructed_[i / kPerPage]++ == 0) ++resident_pages_;
    }
    high_ = std::max(high_, i + 1);
    return At(i);
  }
  // Returns a taken struct (it stays constructed; its page may be given back later).
  void Put(T* p) {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t i = IndexOf(p);
    SetFree(i, true);
    --in_use_;
    --page_used_[i / kPerPage];
    hint_ = std::min(hint_, i / 64);
  }

  // Every constructed struct, in use or free (in index order), except those of pages being given
  // back. Pointers stay valid while the caller excludes releases.
  std::vector<T*> AllConstructed() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<T*> out;
    for (size_t i = 0; i < high_; ++i) {
      if (constructed_[i] && !releasing_[i / kPerPage]) out.push_back(At(i));
    }
    return out;
  }
  // Structs in use.
  size_t in_use() const {
    std::lock_guard<std::mutex> lock(mu_);
    return in_use_;
  }

  // Takes every resident page none of whose structs is in use out of circulation (Take skips
  // them) and returns them; FinishRelease or AbortRelease must follow.
  std::vector<size_t> BeginRelease() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<size_t> pages;
    for (size_t pg = 0; pg * kPerPage < high_; ++pg) {
      if (page_used_[pg] == 0 && page_constructed_[pg] > 0 && !releasing_[pg]) {
        releasing_[pg] = 1;
        pages.push_back(pg);
      }
    }
    return pages;
  }
  // Gives the pages back (their structs read as zeros and are constructed again when taken).
  void FinishRelease(const std::vector<size_t>& pages) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t pg : pages) {
      // madvise cannot fail on a private anonymous range we own; if it did the page just stays.
      if (madvise(base_ + pg * kPage, kPage, MADV_DONTNEED) == 0) {
        for (size_t i = pg * kPerPage; i < (pg + 1) * kPerPage; ++i) constructed_[i] = 0;
        page_constructed_[pg] = 0;
        --resident_pages_;
        ++pages_released_;
      }
      releasing_[pg] = 0;
      hint_ = std::min(hint_, pg * kPerPage / 64);
    }
  }
  void AbortRelease(const std::vector<size_t>& pages) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t pg : pages) {
      releasing_[pg] = 0;
      hint_ = std::min(hint_, pg * kPerPage / 64);
    }
  }

  StructSlabStats Stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    StructSlabStats s;
    s.in_use = in_use_;
    s.resident_pages = resident_pages_;
    s.pages_released = pages_released_;
    s.high_water = high_;
    s.bookkeeping_bytes = free_.capacity() * sizeof(uint64_t) + constructed_.capacity() +
                          page_used_.capacity() * sizeof(uint16_t) +
                          page_constructed_.capacity() * sizeof(uint16_t) + releasing_.capacity();
    return s;
  }

 private:
  static constexpr size_t kNone = SIZE_MAX;

  // Free bits grow with the high-water mark (bit set = free); slots at or above it are free.
  void Grow(size_t n) {
    if (n <= constructed_.size()) return;
    const size_t pages = (n + kPerPage - 1) / kPerPage;
    const size_t items = pages * kPerPage;
    free_.resize((items + 63) / 64, ~uint64_t{0});
    // Bits past `items` in the last word stay set; LowestFreeLocked bounds by capacity.
    constructed_.resize(items, 0);
    page_used_.resize(pages, 0);
    page_constructed_.resize(pages, 0);
    releasing_.resize(pages, 0);
  }
  void SetFree(size_t i, bool on) {
    if (on) {
      free_[i / 64] |= uint64_t{1} << (i % 64);
    } else {
      free_[i / 64] &= ~(uint64_t{1} << (i % 64));
    }
  }
  size_t LowestFreeLocked(size_t limit) {
    // Lowest free slot of a page not being given back; the bitmap covers [0, constructed_.size()),
    // everything past it is free and never constructed.
    // No free slot below word hint_ (Take raises it past full words, Put lowers it).
    for (size_t w = hint_; w < free_.size(); ++w) {
      uint64_t bits = free_[w];
      if (bits == 0 && w == hint_) ++hint_;
      while (bits != 0) {
        const size_t i = w * 64 + static_cast<size_t>(std::countr_zero(bits));
        if (i >= limit || i >= capacity_) return kNone;
        if (i < constructed_.size() && !releasing_[i / kPerPage]) return i;
        if (i >= constructed_.size()) break;
        bits &= bits - 1;
      }
    }
    const size_t i = constructed_.size();  // the first slot past the bitmap
    if (i >= limit || i >= capacity_) return kNone;
    Grow(i + 1);
    return i;
  }

  uint8_t* base_ = nullptr;
  size_t pages_ = 0;
  size_t capacity_ = 0;
  mutable std::mutex mu_;
  std::vector<uint64_t> free_;
  std::vector<uint8_t> constructed_;
  std::vector<uint16_t> page_used_;
  std::vector<uint16_t> page_constructed_;
  std::vector<uint8_t> releasing_;
  size_t hint_ = 0;  // word index of free_
  size_t high_ = 0;
  size_t in_use_ = 0;
  uint64_t resident_pages_ = 0;
  uint64_t pages_released_ = 0;
};

}  // namespace farmem::corm
