// Helpers of `farmem bench tiered`: the servers it forks (a farmemd tier service, and the mmap
// baseline server: a file mmap exported for one-sided reads and served by an RPC), memory
// cgroups that cap a child's memory, the data files, and the machine's fio figure. Main thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "farmem/opcodes.h"
#include "farmem/server.h"
#include "farmem/status.h"
#include "target_process.h"

namespace farmem::bench {

// ---- The mmap baseline server's wire format (bench-only; bench/README.md "bench tiered") ---
// MMAP_READ: request = MmapReadRequest, reply = the `length` bytes at `offset` of the file's
// mapping, copied by an RPC worker (which takes the page faults). Above every farmemd range.
inline constexpr uint16_t kOpMmapRead = kRegionsOpcodes.last + 1;
struct MmapReadRequest {
  uint64_t offset = 0;
  uint32_t length = 0;
  uint32_t reserved = 0;  // 0
};
static_assert(sizeof(MmapReadRequest) == 16);
// The region name the mmap server exports (read-only) for one-sided reads.
inline constexpr const char* kMmapRegionName = "mmap";
inline constexpr uint32_t kMmapMaxRead = 1u << 20;

// A farmemd tier service (MemoryServer with every default but the tier settings) in a forked
// child; reports its bootstrap address.
TargetRole TierServerRole(TierConfig tier);

// The mmap baseline: maps `file` (capacity bytes, MAP_SHARED, read-only; with `random`
// MADV_RANDOM, else the kernel's default readahead), exports it as region "mmap" and serves
// MMAP_READ; default node settings. Reports its bootstrap address.
TargetRole MmapServerRole(std::string file, uint64_t capacity, bool random);

// A memory cgroup (v2 memory.max, else v1 memory.limit_in_bytes) under /sys/fs/cgroup with a
// limit; processes moved into it are charged for their memory including the page cache they
// fault in. Removed (rmdir) on destruction, after its processes exited.
class MemoryCgroup {
 public:
  // Unavailable with the reason when no writable memory controller is mounted.
  static Result<std::unique_ptr<MemoryCgroup>> Create(const std::string& name, uint64_t limit);
  ~MemoryCgroup();
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  Status Add(pid_t pid);
  const std::string& path() const { return path_; }
  const std::string& kind() const { return kind_; }  // "v2" or "v1"
  uint64_t limit() const { return limit_; }
  // memory.current / memory.usage_in_bytes now (0 if unreadable).
  uint64_t Usage() const;
  uint64_t PeakUsage() const;  // v1 max_usage_in_bytes, v2 memory.peak where present, else 0

 private:
  MemoryCgroup(std::string path, std::string kind, uint64_t limit)
      : path_(std::move(path)), kind_(std::move(kind)), limit_(limit) {}
  std::string path_, kind_;
  uint64_t limit_ = 0;
};

// A directory on a real disk for the data files: /var/tmp when /tmp is tmpfs (as the tier
// tests choose), or `given`. Refuses tmpfs.
Result<std::string> PickDataDir(const std::string& given);

// Writes `bytes` of deterministic data (DataWord per 8 bytes) to `path`, fsyncs it and drops it
// from the page cache, so every server starts with the file on disk and nothing cached.
Status WriteDataFile(const std::string& path, uint64_t bytes);
inline uint64_t DataWord(uint64_t offset) {
  return (offset >> 3) * 0x9E3779B97F4A7C15ull + 0x1234567;
}

// fio 4 KiB random reads, O_DIRECT, io_uring at `iodepth`, on a 256 MiB file in `dir`: IOPS, or
// Unavailable("fio not found ...").
Result<double> FioRandomReadIops(const std::string& dir, double seconds, int iodepth);

}  // namespace farmem::bench
