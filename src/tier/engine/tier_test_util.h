// Helpers for the TeRM engine tests: a temporary directory on a real disk (never tmpfs: the store
// refuses it), a tiny loop-mounted ext4 that can be filled up (device errors), store options for
// small regions, and a one-sided-reader style copy of the mapped range. Used by the test threads
// only.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tier/engine/tier_store.h"

namespace farmem::tier::testing {

// mkdtemp under /tmp, or /var/tmp when /tmp is tmpfs; removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* root = "/tmp";
    struct statfs st;
    if (statfs(root, &st) == 0 && static_cast<unsigned long>(st.f_type) == 0x01021994) {
      root = "/var/tmp";
    }
    std::string tmpl = std::string(root) + "/farmem-tier-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  bool ok() const { return !path_.empty(); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A real, tiny ext4 file system (no journal, no reserved blocks) on a loop device, mounted in a
// TempDir, so a test can fill it and see the kernel's own ENOSPC. Needs root, mkfs.ext4 and a
// loop device; skip_reason() says which is missing (the test then skips with that message).
class TinyExt4 {
 public:
  explicit TinyExt4(uint64_t mib) {
    if (geteuid() != 0) {
      skip_ = "needs root to loop-mount a tiny ext4";
      return;
    }
    if (std::system("command -v mkfs.ext4 >/dev/null 2>&1") != 0) {
      skip_ = "needs mkfs.ext4 (e2fsprogs)";
      return;
    }
    if (!dir_.ok()) {
      skip_ = "no temp dir";
      return;
    }
    const std::string img = dir_.File("fs.img");
    mnt_ = dir_.File("mnt");
    std::error_code ec;
    std::filesystem::create_directory(mnt_, ec);
    const std::string mk = "truncate -s " + std::to_string(mib) + "M " + img +
                           " && mkfs.ext4 -q -F -m 0 -O ^has_journal " + img + " >/dev/null 2>&1";
    if (ec || std::system(mk.c_str()) != 0) {
      skip_ = "mkfs.ext4 of a " + std::to_string(mib) + " MiB image failed";
      return;
    }
    if (std::system(("mount -o loop " + img + " " + mnt_ + " 2>/dev/null").c_str()) != 0) {
      skip_ = "mount -o loop failed (no loop device in this container?)";
      return;
    }
    mounted_ = true;
  }
  ~TinyExt4() {
    if (mounted_) std::system(("umount -l " + mnt_).c_str());
  }
  TinyExt4(const TinyExt4&) = delete;
  TinyExt4& operator=(const TinyExt4&) = delete;

  const std::string& skip_reason() const { return skip_; }
  std::string File(const std::string& name) const { return mnt_ + "/" + name; }

  // Writes a filler file until the file system is full (ENOSPC), synced; returns its bytes or -1
  // when it failed otherwise.
  int64_t Fill() {
    const int fd = ::open(File("filler").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    std::vector<char> block(64 * 1024, 'f');
    int64_t total = 0;
    for (size_t chunk : {size_t{64 * 1024}, size_t{4096}}) {
      for (;;) {
        const ssize_t n = ::write(fd, block.data(), chunk);
        if (n > 0) {
          total += n;
          continue;
        }
        if (n < 0 && errno != ENOSPC) total = -1;
        break;
      }
      if (total < 0) break;
      // Delayed allocation: blocks are reserved at write time, so ENOSPC above is final.
      ::fsync(fd);
    }
    ::close(fd);
    return total;
  }
  // Removes the filler: the space is free again.
  void Unfill() { ::unlink(File("filler").c_str()); }

 private:
  TempDir dir_;
  std::string mnt_;
  std::string skip_;
  bool mounted_ = false;
};

// FARMEM_TIER_FAULT=writeback: demotions go on after a failed write-back; =no_grace: demotions
// never call the grace hook; =sync_miss: the service reads TIER_READ misses on the RPC worker;
// =ignore_io_errors: failed file IO is taken as complete (tier_store.h TierStoreFaults).
inline TierStoreFaults TierFaultsFromEnv() {
  TierStoreFaults f;
  const char* e = std::getenv("FARMEM_TIER_FAULT");
  const std::string v = e != nullptr ? e : "";
  f.demote_despite_failed_writeback = v == "writeback";
  f.skip_grace = v == "no_grace";
  f.sync_miss_io = v == "sync_miss";
  f.sync_write_io = v == "sync_write";
  f.accept_short_io = v == "accept_short";
  f.ignore_io_errors = v == "ignore_io_errors";
  if (f.demote_despite_failed_writeback || f.skip_grace || f.sync_miss_io || f.sync_write_io ||
      f.accept_short_io || f.ignore_io_errors) {
    std::printf("[ fault    ] FARMEM_TIER_FAULT=%s\n", e);
  }
  return f;
}

// `st` is the kernel's ENOSPC, reported as an IoError that says so.
inline void ExpectNoSpace(const Status& st, const std::string& what) {
  EXPECT_FALSE(st.ok()) << what << " succeeded on a full file system";
  EXPECT_EQ(st.code(), Code::kIoError) << what << ": " << st.ToString();
  EXPECT_NE(st.ToString().find("No space left on device"), std::string::npos)
      << what << ": " << st.ToString();
}

// Pages of the first `bytes` of the file at `path` that are in the page cache (mincore on a
// shared mapping: neither the mapping nor mincore brings a page in); -1 when it cannot tell.
inline int64_t CachedPages(const std::string& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return -1;
  std::vector<unsigned char> vec((bytes + 4095) / 4096);
  int64_t cached = 0;
  if (::mincore(m, bytes, vec.data()) != 0) {
    cached = -1;
  } else {
    for (unsigned char c : vec) cached += c & 1;
  }
  ::munmap(m, bytes);
  return cached;
}

inline TierOptions SmallOptions(const std::string& path, uint64_t units, uint64_t budget_units,
                                uint64_t unit = 16 * 1024) {
  TierOptions o;
  o.path = path;
  o.unit_size = unit;
  o.capacity = units * unit;
  o.dram_budget = budget_units * unit;
  o.fill_percent = 100;
  return o;
}

// Copies [off, off + out.size()) of the mapped range the way a one-sided reader does: aligned
// 8-byte seq_cst loads in ascending order (off and size multiples of 8).
inline void DirectCopy(const uint8_t* base, uint64_t off, std::span<uint8_t> out) {
  for (size_t i = 0; i < out.size(); i += 8) {
    const uint64_t w =
        __atomic_load_n(reinterpret_cast<const uint64_t*>(base + off + i), __ATOMIC_SEQ_CST);
    std::memcpy(out.data() + i, &w, 8);
  }
}

// s.Read(off, n bytes), with a test failure (and whatever was read) if it does not succeed.
inline std::vector<uint8_t> MustRead(TierStore& s, uint64_t off, size_t n) {
  std::vector<uint8_t> out(n);
  const Status st = s.Read(off, out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

inline std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

}  // namespace farmem::tier::testing
