// Internals shared by the raw benchmark's files: measurement window/recorder, the target memory
// layout and data pattern, and the two baselines (TCP echo, process_vm_readv).
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "farmem/status.h"
#include "target_process.h"

namespace farmem::bench {

using Clock = std::chrono::steady_clock;

// Upper bound on how long any target process serves; the parent normally stops it much sooner.
inline constexpr std::chrono::hours kMaxTargetLifetime{2};

// Layout of the 1 MiB region every target exports. Reads and writes use disjoint areas so that
// reads can be checked against the fill pattern; each in-flight slot owns one CAS word and one
// FAA word, so atomics can be checked exactly.
inline constexpr size_t kRegionBytes = 1u << 20;
inline constexpr size_t kReadAreaOffset = 0;
inline constexpr size_t kReadAreaBytes = 512u << 10;
inline constexpr size_t kWriteAreaOffset = 512u << 10;
inline constexpr size_t kWriteAreaBytes = 256u << 10;
inline constexpr size_t kCasAreaOffset = 768u << 10;
inline constexpr size_t kFaaAreaOffset = 896u << 10;
inline constexpr size_t kAtomicStride = 32;
inline constexpr int kMaxInflight = 4096;  // = 128 KiB atomic area / kAtomicStride
inline constexpr size_t kMaxOpBytes = 64u << 10;
static_assert(kCasAreaOffset + kMaxInflight * kAtomicStride <= kFaaAreaOffset);
static_assert(kFaaAreaOffset + kMaxInflight * kAtomicStride <= kRegionBytes);
static_assert(kWriteAreaOffset + kWriteAreaBytes <= kCasAreaOffset);

// The byte the target stores at region offset `off` of the read area.
inline uint8_t PatternByte(uint64_t off) {
  return static_cast<uint8_t>((off * 0x9E3779B1u) >> 13);
}
// Fill [base, base+len) as if it started at region offset 0.
inline void FillPattern(void* base, size_t len) {
  auto* p = static_cast<uint8_t*>(base);
  for (size_t i = 0; i < len; ++i) p[i] = PatternByte(i);
}

// Latencies and count of the operations that completed inside [warm_end, end).
struct Measurement {
  uint64_t ops = 0;
  double seconds = 0;
  std::vector<int64_t> lat_ns;
};

class Recorder {
 public:
  Recorder(double warmup_s, double seconds) : seconds_(seconds) {
    auto start = Clock::now();
    warm_end_ = start + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(warmup_s));
    end_ = warm_end_ +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    // Room for ~3 M ops/s (capped at 64 MiB) so the measured loop rarely reallocates.
    m_.lat_ns.reserve(static_cast<size_t>(std::min(seconds * 3e6, 8e6)));
  }
  // An operation that started at `start` completed at `done`.
  void Add(Clock::time_point start, Clock::time_point done) {
    if (done >= warm_end_ && done < end_) {
      m_.lat_ns.push_back(
          std::chrono::duration_cast<std::chrono::nanoseconds>(done - start).count());
      ++m_.ops;
    }
  }
  // True while new operations should still be issued.
  bool Running(Clock::time_point now) const { return now < end_; }
  Measurement Finish() {
    m_.seconds = seconds_;
    return std::move(m_);
  }

 private:
  double seconds_;
  Clock::time_point warm_end_, end_;
  Measurement m_;
};

// --- process_vm_readv baseline ----------------------------------------------------------------
// Child role: allocate and fill a region, report its address (8 bytes), wait for stop.
TargetRole PvmTargetRole();
// Read `size` bytes per call (1 iovec) from the child's region for warm-up + `seconds`.
Result<Measurement> RunPvmCase(pid_t pid, uint64_t remote_addr, size_t size, double warmup_s,
                               double seconds);

// --- busy-polled TCP echo baseline ------------------------------------------------------------
// Child role: listen on 127.0.0.1, report the port (2 bytes), then serve connections one after
// the other. Each connection starts with a u32 message size; every complete message is echoed.
// recv/send are non-blocking and busy-polled; TCP_NODELAY is set.
TargetRole EchoServerRole();
// Keep `inflight` messages of `size` bytes outstanding on one connection (pipelined).
Result<Measurement> RunEchoCase(uint16_t port, size_t size, int inflight, double warmup_s,
                                double seconds, std::chrono::milliseconds stall_timeout);

}  // namespace farmem::bench
