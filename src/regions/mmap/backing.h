// rmmap's internal seam (docs/regions_mmap.md): what a mapping reads its pages from and writes
// them back to. rmmap.cc holds the one fault / prefetch / rsync engine; a RegionStore of this
// process (rmmap.cc) and a file of a farmem mount (mount_backing.cc) are its two backings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "farmem/status.h"

namespace farmem::rmmap_internal {

// Thread-safe: the handler thread reads while application threads read (rprefetch) and write
// (rsync).
class Backing {
 public:
  virtual ~Backing() = default;
  // Bytes read from `offset` (short at the end of the region); holes read as zeros. Bounded by
  // the transport's op_timeout: never blocks forever.
  virtual Result<size_t> read(uint64_t offset, std::span<std::byte> out) = 0;
  // Delivery-complete: when it returns OK the bytes are in remote memory.
  virtual Status write(uint64_t offset, std::span<const std::byte> data) = 0;
  // rclearcache: picks up layout changes made by others (a mount's file grown or truncated).
  virtual Status refresh() { return Status::OK(); }
  // FIXVADDR: the address every process maps the region at (0: anywhere).
  virtual uint64_t fixed_address() const { return 0; }
};

// Maps `length` (> 0) bytes of `backing` (userfaultfd registration, handler thread) and records
// the mapping for rmunmap and the other calls; at backing->fixed_address() when it has one
// (FailedPrecondition when that range is taken).
Result<void*> MapBacking(std::unique_ptr<Backing> backing, size_t length);

}  // namespace farmem::rmmap_internal
