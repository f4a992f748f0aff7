// FaultFs: a tiny FUSE file system for the tier's device-error tests. It passes the files of a
// backing directory through and, switched at run time, makes the kernel return real errors to
// the tier's O_DIRECT io_uring IO: EIO for reads and/or writes touching a byte range, ENOSPC for
// writes that need new blocks once a file's allocated bytes would exceed a limit. Test code only.
//
// Why FUSE: there is no device-mapper here (no dm-error), and a loop-mounted ext4 gives ENOSPC
// but never EIO. The error comes from the kernel (the FUSE reply), so the tier sees it exactly as
// from a failing disk: through io_uring's completion, not through a switch inside farmem.
//
// Threads: the file system is served by libfuse's worker threads (fuse_loop_mt) in this process,
// started by the constructor and stopped by the destructor; the switches are atomics any thread
// may flip. Every file is opened with direct_io (FOPEN_DIRECT_IO), so the kernel accepts O_DIRECT
// opens and sends every read and write to the file system as it was issued (no page cache).
// Destroy whatever holds files open here (the TierStore) before the FaultFs.
#pragma once

#define FUSE_USE_VERSION 312
#include <fcntl.h>
#include <fuse.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tier/engine/tier_test_util.h"

namespace farmem::tier::testing {

class FaultFs {
 public:
  FaultFs() {
    if (geteuid() != 0) {
      skip_ = "needs root to mount a FUSE file system";
      return;
    }
    if (access("/dev/fuse", R_OK | W_OK) != 0) {
      skip_ = "needs /dev/fuse";
      return;
    }
    if (!dir_.ok()) {
      skip_ = "no temp dir";
      return;
    }
    backing_ = dir_.File("backing");
    mnt_ = dir_.File("mnt");
    std::error_code ec;
    std::filesystem::create_directory(backing_, ec);
    std::filesystem::create_directory(mnt_, ec);
    if (ec) {
      skip_ = "cannot create the FUSE directories: " + ec.message();
      return;
    }
    static const fuse_operations ops = MakeOps();
    std::vector<std::string> argv_s = {"farmem-faultfs", "-o", "fsname=farmem-faultfs"};
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
    fuse_ = fuse_new(&args, &ops, sizeof(ops), this);
    fuse_opt_free_args(&args);
    if (fuse_ == nullptr) {
      skip_ = "fuse_new failed";
      return;
    }
    if (fuse_mount(fuse_, mnt_.c_str()) != 0) {
      fuse_destroy(fuse_);
      fuse_ = nullptr;
      skip_ = "cannot mount a FUSE file system at " + mnt_;
      return;
    }
    loop_ = std::thread([this] {
      fuse_loop_config* cfg = fuse_loop_cfg_create();
      fuse_loop_cfg_set_max_threads(cfg, 4);
      fuse_loop_mt(fuse_, cfg);
      fuse_loop_cfg_destroy(cfg);
    });
    mounted_ = true;
    // Only now: a stat of the mount is a FUSE request, served by the loop just started.
    struct stat st;
    if (stat(mnt_.c_str(), &st) == 0) conn_ = minor(st.st_dev);
  }

  ~FaultFs() {
    if (!mounted_) return;
    fuse_exit(fuse_);
    // A lazy unmount (with no file open the connection ends and the workers' reads of /dev/fuse
    // return ENODEV), then abort the connection through fusectl where it is mounted, so a file
    // still held open cannot keep the loop alive.
    umount2(mnt_.c_str(), MNT_DETACH);
    std::ofstream(std::string("/sys/fs/fuse/connections/") + std::to_string(conn_) + "/abort")
        << "1";
    loop_.join();
    fuse_unmount(fuse_);
    fuse_destroy(fuse_);
  }
  FaultFs(const FaultFs&) = delete;
  FaultFs& operator=(const FaultFs&) = delete;

  const std::string& skip_reason() const { return skip_; }
  // A path on the FUSE mount.
  std::string File(const std::string& name) const { return mnt_ + "/" + name; }
  // The same file in the backing directory (bypasses the FUSE layer and its faults).
  std::string BackingFile(const std::string& name) const { return backing_ + "/" + name; }

  // Reads (and/or writes) of any file overlapping [off, off + len) fail with EIO while set.
  void FailRange(uint64_t off, uint64_t len, bool reads, bool writes) {
    eio_off_.store(off);
    eio_len_.store(len);
    eio_reads_.store(reads);
    eio_writes_.store(writes);
  }
  void StopFailing() {
    eio_reads_.store(false);
    eio_writes_.store(false);
  }
  // A write that needs new blocks (touches a hole of the backing file) fails with ENOSPC while
  // the file's allocated bytes plus the write's length would exceed `bytes`: a full disk, as far
  // as that file can tell. Overwrites of allocated blocks still succeed, as on a real full disk.
  void LimitSpace(uint64_t bytes) { space_limit_.store(bytes); }
  void UnlimitSpace() { space_limit_.store(std::numeric_limits<uint64_t>::max()); }

  // Errors returned so far (a test checks its fault was really hit).
  uint64_t eio_returned() const { return eio_returned_.load(); }
  uint64_t enospc_returned() const { return enospc_returned_.load(); }
  // Read and write requests the kernel sent, and whether one came without direct_io.
  uint64_t reads() const { return reads_.load(); }
  uint64_t writes() const { return writes_.load(); }

 private:
  static FaultFs& Self() { return *static_cast<FaultFs*>(fuse_get_context()->private_data); }
  std::string Backing(const char* path) const { return backing_ + path; }
  bool Hits(uint64_t off, uint64_t len) const {
    const uint64_t a = eio_off_.load();
    const uint64_t b = a + eio_len_.load();
    return off < b && a < off + len;
  }

  static fuse_operations MakeOps() {
    fuse_operations o{};
    o.init = [](fuse_conn_info*, fuse_config* cfg) -> void* {
      cfg->direct_io = 1;  // every file: O_DIRECT accepted, no page cache in between
      cfg->attr_timeout = 0;
      cfg->entry_timeout = 0;
      cfg->use_ino = 0;
      return fuse_get_context()->private_data;
    };
    o.getattr = [](const char* path, struct stat* st, fuse_file_info* fi) -> int {
      const int rc = fi != nullptr ? fstat(static_cast<int>(fi->fh), st)
                                   : lstat(Self().Backing(path).c_str(), st);
      return rc == 0 ? 0 : -errno;
    };
    o.readdir = [](const char* path, void* buf, fuse_fill_dir_t fill, off_t, fuse_file_info*,
                   fuse_readdir_flags) -> int {
      std::error_code ec;
      fill(buf, ".", nullptr, 0, fuse_fill_dir_flags{});
      fill(buf, "..", nullptr, 0, fuse_fill_dir_flags{});
      for (const auto& e : std::filesystem::directory_iterator(Self().Backing(path), ec)) {
        fill(buf, e.path().filename().c_str(), nullptr, 0, fuse_fill_dir_flags{});
      }
      return ec ? -EIO : 0;
    };
    o.create = [](const char* path, mode_t mode, fuse_file_info* fi) -> int {
      // The backing file is plain buffered IO: the device under test is the FUSE reply.
      const int fd = open(Self().Backing(path).c_str(), (fi->flags & ~O_DIRECT) | O_CLOEXEC, mode);
      if (fd < 0) return -errno;
      fi->fh = static_cast<uint64_t>(fd);
      fi->direct_io = 1;
      return 0;
    };
    o.open = [](const char* path, fuse_file_info* fi) -> int {
      const int fd = open(Self().Backing(path).c_str(), (fi->flags & ~O_DIRECT) | O_CLOEXEC);
      if (fd < 0) return -errno;
      fi->fh = static_cast<uint64_t>(fd);
      fi->direct_io = 1;
      return 0;
    };
    o.release = [](const char*, fuse_file_info* fi) -> int {
      close(static_cast<int>(fi->fh));
      return 0;
    };
    o.read = [](const char*, char* buf, size_t n, off_t off, fuse_file_info* fi) -> int {
      FaultFs& fs = Self();
      fs.reads_.fetch_add(1);
      if (fs.eio_reads_.load() && fs.Hits(static_cast<uint64_t>(off), n)) {
        fs.eio_returned_.fetch_add(1);
        return -EIO;
      }
      const ssize_t r = pread(static_cast<int>(fi->fh), buf, n, off);
      return r < 0 ? -errno : static_cast<int>(r);
    };
    o.write = [](const char*, const char* buf, size_t n, off_t off, fuse_file_info* fi) -> int {
      FaultFs& fs = Self();
      fs.writes_.fetch_add(1);
      if (fs.eio_writes_.load() && fs.Hits(static_cast<uint64_t>(off), n)) {
        fs.eio_returned_.fetch_add(1);
        return -EIO;
      }
      const int fd = static_cast<int>(fi->fh);
      // One write at a time decides on space, so two cannot both take the last free bytes.
      std::lock_guard<std::mutex> lock(fs.space_mu_);
      if (fs.space_limit_.load() != std::numeric_limits<uint64_t>::max()) {
        const off_t hole = lseek(fd, off, SEEK_HOLE);
        struct stat st;
        if (hole >= 0 && static_cast<uint64_t>(hole) < static_cast<uint64_t>(off) + n &&
            fstat(fd, &st) == 0 &&
            static_cast<uint64_t>(st.st_blocks) * 512 + n > fs.space_limit_.load()) {
          fs.enospc_returned_.fetch_add(1);
          return -ENOSPC;
        }
      }
      const ssize_t r = pwrite(fd, buf, n, off);
      return r < 0 ? -errno : static_cast<int>(r);
    };
    o.truncate = [](const char* path, off_t size, fuse_file_info* fi) -> int {
      const int rc = fi != nullptr ? ftruncate(static_cast<int>(fi->fh), size)
                                   : ::truncate(Self().Backing(path).c_str(), size);
      return rc == 0 ? 0 : -errno;
    };
    o.fsync = [](const char*, int, fuse_file_info* fi) -> int {
      return fsync(static_cast<int>(fi->fh)) == 0 ? 0 : -errno;
    };
    o.unlink = [](const char* path) -> int {
      return unlink(Self().Backing(path).c_str()) == 0 ? 0 : -errno;
    };
    o.statfs = [](const char*, struct statvfs* st) -> int {
      return statvfs(Self().backing_.c_str(), st) == 0 ? 0 : -errno;
    };
    return o;
  }

  TempDir dir_;
  std::string backing_;
  std::string mnt_;
  std::string skip_;
  fuse* fuse_ = nullptr;
  std::thread loop_;
  unsigned conn_ = 0;
  bool mounted_ = false;
  std::atomic<uint64_t> eio_off_{0}, eio_len_{0};
  std::atomic<bool> eio_reads_{false}, eio_writes_{false};
  std::mutex space_mu_;
  std::atomic<uint64_t> space_limit_{std::numeric_limits<uint64_t>::max()};
  std::atomic<uint64_t> eio_returned_{0}, enospc_returned_{0}, reads_{0}, writes_{0};
};

}  // namespace farmem::tier::testing
