// Tiering IO for the TeRM engine: a few io_uring instances (liburing) that run one synchronous
// read or write at a time each. Any thread may call; a call takes a free ring (try-lock scan, then
// blocks on one), submits, waits for its completion and returns.
//
// Data structures: `rings_` is a fixed array of {mutex, struct io_uring}; the mutex owns the
// ring's submission and completion queues for one operation. No SQPOLL (2-core machines: a polling
// kernel thread would take a core). The ring lock is the last lock in the engine's lock order.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "farmem/status.h"

namespace farmem::tier {

// Test-only faults of the io rings (TierStoreFaults carries them; farmemd never sets any).
struct IoRingFaults {
  // While it holds a non-zero errno, every completion is taken as that error.
  std::shared_ptr<std::atomic<int>> simulated_errno;
  // While it is true, a completion is held before it is reaped.
  std::shared_ptr<std::atomic<bool>> hold;
  // SIMULATED short transfers: an operation of more than one page is submitted for half its
  // length (whole pages, so O_DIRECT alignment holds), so the kernel really moves fewer bytes
  // and the completion reports that, as a device or file system may.
  bool short_io = false;
  // The protection removed: a short completion is taken as the whole operation (no retry), so
  // the untransferred tail is stale in the buffer (read) or never reaches the file (write).
  bool accept_short = false;
  // The protection removed: a failed completion (the kernel's -errno, e.g. EIO or ENOSPC) is
  // taken as if every asked byte had moved, so the caller gets OK with whatever the buffer held
  // (read) or a write that never reached the file.
  bool ignore_errors = false;
};

class IoRings {
 public:
  // `count` rings of `depth` entries each. IoError when io_uring is unavailable (disabled by
  // kernel.io_uring_disabled or seccomp), with the reason.
  static Result<std::unique_ptr<IoRings>> Create(unsigned count, unsigned depth,
                                                 IoRingFaults faults = {});
  ~IoRings();
  IoRings(const IoRings&) = delete;
  IoRings& operator=(const IoRings&) = delete;

  // Reads len bytes at file offset `off` into buf, continuing after short reads until all len
  // bytes are in; IoError when the file ends first (the store's file is extended to the region,
  // so an end inside it means the file was cut: never zeros or stale bytes as data). With
  // O_DIRECT, buf, len and off must be block aligned.
  Status Read(int fd, void* buf, size_t len, uint64_t off);
  // Writes len bytes, continuing after short writes; IoError (with the errno text) on failure,
  // e.g. ENOSPC.
  Status Write(int fd, const void* buf, size_t len, uint64_t off);
  // Completions that moved fewer bytes than submitted (each one continued), since Create.
  uint64_t short_completions() const { return short_completions_.load(std::memory_order_relaxed); }
  // Operations that failed (an error completion, e.g. EIO or ENOSPC, or a read that found the end
  // of the file), since Create: what STAT's `io_errors` shows.
  uint64_t errors() const { return errors_.load(std::memory_order_relaxed); }

 private:
  struct Ring;
  IoRings() = default;
  Status Rw(bool write, int fd, void* buf, size_t len, uint64_t off);

  std::unique_ptr<Ring[]> rings_;
  unsigned count_ = 0;
  IoRingFaults faults_;
  std::atomic<uint64_t> short_completions_{0};
  std::atomic<uint64_t> errors_{0};
};

}  // namespace farmem::tier
