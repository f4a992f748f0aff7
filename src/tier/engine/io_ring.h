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

class IoRings {
 public:
  // `count` rings of `depth` entries each. IoError when io_uring is unavailable (disabled by
  // kernel.io_uring_disabled or seccomp), with the reason.
  // `simulated_errno` is test-only (TierStoreFaults::simulated_io_errno): while it holds a
  // non-zero errno, every completion is taken as that error.
  // `hold` is test-only too (TierStoreFaults::hold_io): while it is true, a completion is held
  // before it is reaped.
  static Result<std::unique_ptr<IoRings>> Create(
      unsigned count, unsigned depth, std::shared_ptr<std::atomic<int>> simulated_errno = {},
      std::shared_ptr<std::atomic<bool>> hold = {});
  ~IoRings();
  IoRings(const IoRings&) = delete;
  IoRings& operator=(const IoRings&) = delete;

  // Reads len bytes at file offset `off` into buf, continuing after short reads; bytes past the
  // end of the file read as zeros. With O_DIRECT, buf, len and off must be block aligned.
  Status Read(int fd, void* buf, size_t len, uint64_t off);
  // Writes len bytes, continuing after short writes; IoError (with the errno text) on failure,
  // e.g. ENOSPC.
  Status Write(int fd, const void* buf, size_t len, uint64_t off);

 private:
  struct Ring;
  IoRings() = default;
  Status Rw(bool write, int fd, void* buf, size_t len, uint64_t off);

  std::unique_ptr<Ring[]> rings_;
  unsigned count_ = 0;
  std::shared_ptr<std::atomic<int>> simulated_errno_;
  std::shared_ptr<std::atomic<bool>> hold_;
};

}  // namespace farmem::tier
