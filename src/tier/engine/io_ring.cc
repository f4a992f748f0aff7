// IoRings: synchronous reads and writes through a small pool of io_uring instances (see
// io_ring.h). Any thread.
#include "tier/engine/io_ring.h"

#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

namespace farmem::tier {

namespace {
// A simulated short transfer moves whole pages (O_DIRECT needs block-aligned continuations).
constexpr unsigned kShortIoGranule = 4096;
}  // namespace

struct IoRings::Ring {
  std::mutex mu;
  struct io_uring ring;
  bool ready = false;
};

Result<std::unique_ptr<IoRings>> IoRings::Create(unsigned count, unsigned depth,
                                                 IoRingFaults faults) {
  if (count == 0 || depth == 0)
    return Status::InvalidArgument("io ring count and depth must be > 0");
  std::unique_ptr<IoRings> r(new IoRings());
  r->rings_ = std::make_unique<Ring[]>(count);
  r->count_ = count;
  r->faults_ = std::move(faults);
  for (unsigned i = 0; i < count; ++i) {
    const int rc = io_uring_queue_init(depth, &r->rings_[i].ring, 0);
    if (rc < 0) {
      return Status::FromErrno(
          "io_uring_queue_init (is io_uring disabled? see "
          "/proc/sys/kernel/io_uring_disabled)",
          -rc);
    }
    r->rings_[i].ready = true;
  }
  return r;
}

IoRings::~IoRings() {
  for (unsigned i = 0; i < count_; ++i) {
    if (rings_[i].ready) io_uring_queue_exit(&rings_[i].ring);
  }
}

Status IoRings::Read(int fd, void* buf, size_t len, uint64_t off) {
  return Rw(false, fd, buf, len, off);
}

Status IoRings::Write(int fd, const void* buf, size_t len, uint64_t off) {
  return Rw(true, fd, const_cast<void*>(buf), len, off);
}

Status IoRings::Rw(bool write, int fd, void* buf, size_t len, uint64_t off) {
  // A free ring if there is one, else wait for the one this thread hashes to.
  Ring* ring = nullptr;
  std::unique_lock<std::mutex> lock;
  for (unsigned i = 0; i < count_ && ring == nullptr; ++i) {
    std::unique_lock<std::mutex> l(rings_[i].mu, std::try_to_lock);
    if (l.owns_lock()) {
      ring = &rings_[i];
      lock = std::move(l);
    }
  }
  if (ring == nullptr) {
    ring = &rings_[std::hash<std::thread::id>()(std::this_thread::get_id()) % count_];
    lock = std::unique_lock<std::mutex>(ring->mu);
  }
  auto* p = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < len) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring->ring);
    if (sqe == nullptr) return Status::Internal("io_uring submission queue full");
    // One operation is at most 1 GiB (the kernel caps a read/write at 2 GiB - 4 KiB).
    const auto asked = static_cast<unsigned>(std::min<size_t>(len - done, size_t{1} << 30));
    unsigned n = asked;
    // Test-only simulated short transfer (IoRingFaults::short_io): the kernel is asked for half,
    // in whole pages, so its completion is short exactly as a real short one would be.
    if (faults_.short_io && n >= 2 * kShortIoGranule) n = n / 2 / kShortIoGranule * kShortIoGranule;
    if (write) {
      io_uring_prep_write(sqe, fd, p + done, n, off + done);
    } else {
      io_uring_prep_read(sqe, fd, p + done, n, off + done);
    }
    int rc = io_uring_submit_and_wait(&ring->ring, 1);
    if (rc < 0 && rc != -EINTR) return Status::FromErrno("io_uring_submit_and_wait", -rc);
    io_uring_cqe* cqe = nullptr;
    do {
      rc = io_uring_wait_cqe(&ring->ring, &cqe);
    } while (rc == -EINTR);
    if (rc < 0) return Status::FromErrno("io_uring_wait_cqe", -rc);
    // Test-only simulated slow device (TierStoreFaults::hold_io): the completion is there, the
    // caller does not see it until the test lets go.
    if (faults_.hold != nullptr) {
      while (faults_.hold->load(std::memory_order_acquire)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    int res = cqe->res;
    io_uring_cqe_seen(&ring->ring, cqe);
    // Test-only simulated device error (TierStoreFaults::simulated_io_errno): the kernel's result
    // is replaced, so everything after this line is the path a real error takes.
    if (faults_.simulated_errno != nullptr) {
      if (const int e = faults_.simulated_errno->load(std::memory_order_relaxed); e != 0) res = -e;
    }
    if (res == -EINTR || res == -EAGAIN) continue;
    // Test-only (IoRingFaults::ignore_errors): the check removed, the error taken as success.
    if (res < 0 && faults_.ignore_errors) res = static_cast<int>(n);
    if (res < 0) {
      errors_.fetch_add(1, std::memory_order_relaxed);
      return Status::FromErrno(std::string(write ? "tier file write" : "tier file read") +
                                   " at offset " + std::to_string(off + done),
                               -res);
    }
    if (res == 0) {
      // The store extends its file to the whole region at Open, so a read that finds the end
      // inside it found a cut file: an error, never zeros or the buffer's old bytes as data.
      errors_.fetch_add(1, std::memory_order_relaxed);
      if (write) return Status::IoError("tier file write made no progress");
      return Status::IoError("tier file read at offset " + std::to_string(off + done) +
                             " found the end of the file (" + std::to_string(len - done) +
                             " bytes missing; was the file truncated?)");
    }
    if (static_cast<unsigned>(res) < asked) {
      short_completions_.fetch_add(1, std::memory_order_relaxed);
      // Test-only (IoRingFaults::accept_short): the check removed, the tail is never moved.
      if (faults_.accept_short) return Status::OK();
    }
    // A short transfer (res < n) loops for the rest: the next operation starts where the kernel
    // stopped, so no byte of the range is skipped.
    done += static_cast<size_t>(res);
  }
  return Status::OK();
}

}  // namespace farmem::tier
