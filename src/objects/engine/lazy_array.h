// LazyArray: a fixed-length array of trivially copyable elements that reads as zeros and costs
// memory only where it was written (anonymous MAP_NORESERVE mapping). The object store keeps its
// per-virtual-block tables in these, so a large virtual reservation costs nothing until used.
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>

#include "farmem/status.h"

namespace farmem::corm {

template <typename T>
class LazyArray {
  // Elements start as zero bytes and are never destroyed: plain integers, pointers, enums, or
  // std::atomic of those (whose zero bytes are the value 0 / nullptr on every target we build).
  static_assert(std::is_trivially_destructible_v<T> && std::is_standard_layout_v<T>,
                "LazyArray elements start as zero bytes and are never destroyed");

 public:
  LazyArray() = default;
  ~LazyArray() { Reset(); }
  LazyArray(const LazyArray&) = delete;
  LazyArray& operator=(const LazyArray&) = delete;
  LazyArray(LazyArray&& o) noexcept : data_(o.data_), size_(o.size_) {
    o.data_ = nullptr;
    o.size_ = 0;
  }
  LazyArray& operator=(LazyArray&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = o.data_;
      size_ = o.size_;
      o.data_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }

  // `n` zero elements (any previous contents are dropped).
  Status Allocate(size_t n) {
    Reset();
    if (n == 0) return Status::OK();
    void* m = mmap(nullptr, n * sizeof(T), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return Status::FromErrno("reserving a lazily zeroed table", errno);
    data_ = static_cast<T*>(m);
    size_ = n;
    return Status::OK();
  }
  size_t size() const { return size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* data() { return data_; }

 private:
  void Reset() {
    if (data_ != nullptr) munmap(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace farmem::corm
