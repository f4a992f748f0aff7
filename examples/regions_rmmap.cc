// Example: rmmap of a file in a farmem mount from another process (farmem/regions.h), built
// against an installed farmem. The program mounts a farmem file system on a thread (RunRegionFs,
// embedded farmemd; `farmem mount DIR` does the same as a command), writes a file through it, and
// a forked child maps the file with rmmap(path): page faults read farmemd memory one-sidedly, not
// through FUSE. The child changes a page and rsyncs it; the parent reads the change back through
// the mount. Needs /dev/fuse and root (mount, userfaultfd); prints "skipped" and exits 0 otherwise.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <farmem/regionfs.h>
#include <farmem/regions.h>

namespace {

constexpr size_t kSize = 200 * 1024;  // two 128 KiB chunks, the second one partly
constexpr size_t kPage = 4096;

// The child: map, check, change page 1, rsync. Exit code 0 = all well.
int Child(const std::string& path) {
  auto p = farmem::rmmap(path);  // length 0: the file's size
  if (!p.ok()) {
    std::fprintf(stderr, "child: rmmap: %s\n", p.status().ToString().c_str());
    return 1;
  }
  auto* b = static_cast<char*>(*p);
  for (size_t i = 0; i < kSize; ++i)
    if (b[i] != static_cast<char>('a' + i % 26)) {
      std::fprintf(stderr, "child: byte %zu differs\n", i);
      return 1;
    }
  std::memset(b + kPage, 'Z', kPage);
  // Without userfaultfd write-protect the store above is not tracked: mark it (harmless with it).
  farmem::Status st = farmem::rmarkdirty(b + kPage, kPage, false);
  if (st.ok()) st = farmem::rsync(b, kSize);  // one-sided writes of the dirty page
  auto stats = farmem::rmmap_stats(b);
  std::printf("child: mapped %zu bytes, %llu page faults, %llu page(s) written back\n", kSize,
              stats.ok() ? static_cast<unsigned long long>(stats->faults) : 0ull,
              stats.ok() ? static_cast<unsigned long long>(stats->pages_written) : 0ull);
  std::fflush(stdout);
  if (farmem::Status u = farmem::rmunmap(b); st.ok()) st = u;
  if (!st.ok()) std::fprintf(stderr, "child: %s\n", st.ToString().c_str());
  return st.ok() ? 0 : 1;
}

}  // namespace

int main() {
  if (access("/dev/fuse", R_OK | W_OK) != 0 || geteuid() != 0) {
    std::printf("regions_rmmap: skipped (needs /dev/fuse and root)\n");
    return 0;
  }
  char tmpl[] = "/tmp/farmem-example-rmmap.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl, file = dir + "/data";

  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  std::optional<farmem::Status> done;
  farmem::RegionFsOptions o;
  o.mountpoint = dir;
  o.memory_bytes = 16ull << 20;
  o.on_ready = [&] {
    std::lock_guard lk(mu);
    ready = true;
    cv.notify_all();
  };
  std::thread mount([&] {
    farmem::Status st = farmem::RunRegionFs(o);
    std::lock_guard lk(mu);
    done = st;
    cv.notify_all();
  });
  {
    std::unique_lock lk(mu);
    cv.wait_for(lk, std::chrono::seconds(20), [&] { return ready || done.has_value(); });
  }
  int rc = 1;
  if (ready) {
    std::string data(kSize, 0);
    for (size_t i = 0; i < kSize; ++i) data[i] = static_cast<char>('a' + i % 26);
    int fd = open(file.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    bool wrote =
        fd >= 0 && write(fd, data.data(), kSize) == static_cast<ssize_t>(kSize) && fsync(fd) == 0;
    if (fd >= 0) close(fd);
    std::fflush(stdout);
    pid_t child = wrote ? fork() : -1;
    if (child == 0) _exit(Child(file));
    int status = 1;
    if (child > 0) waitpid(child, &status, 0);
    if (child > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      // O_DIRECT: the mount's bytes, not pages the kernel cached before the child's rsync.
      fd = open(file.c_str(), O_RDONLY | O_DIRECT);
      void* buf = nullptr;
      bool same = fd >= 0 && posix_memalign(&buf, kPage, kSize + kPage) == 0 &&
                  pread(fd, buf, kSize + kPage, 0) == static_cast<ssize_t>(kSize);
      for (size_t i = 0; same && i < kSize; ++i) {
        char want = (i >= kPage && i < 2 * kPage) ? 'Z' : data[i];
        same = static_cast<char*>(buf)[i] == want;
      }
      free(buf);
      if (fd >= 0) close(fd);
      std::printf("parent: %s\n", same ? "the child's rsync'ed page reads back through the mount"
                                       : "the file does not hold the child's change");
      rc = same ? 0 : 1;
    } else {
      std::fprintf(stderr, "regions_rmmap: the child failed\n");
    }
    if (std::system(("fusermount3 -u " + dir).c_str()) != 0)
      (void)std::system(("fusermount3 -uz " + dir).c_str());
  } else {
    std::fprintf(stderr, "regions_rmmap: mount failed: %s\n",
                 done ? done->ToString().c_str() : "not ready within 20 s");
    (void)std::system(("fusermount3 -uz " + dir + " 2>/dev/null").c_str());
  }
  mount.join();
  rmdir(dir.c_str());
  std::printf("regions_rmmap: %s\n", rc == 0 ? "ok" : "FAILED");
  return rc;
}
