// rmmap: a region mapped into the process as a write-back cache built on userfaultfd
// (docs/regions_mmap.md), backed either by a RegionStore of this process or by a file of a farmem
// mount (its map descriptor, read one-sidedly through a client Node). Threads: one fault-handler
// thread per mapping serves missing-page and write-protect faults; any application thread calls
// rmarkdirty / rsync / rclearcache / rmunmap.
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "farmem/regions.h"
#include "regions/engine/region_store.h"
#include "regions/format/region_layout.h"
#include "regions/mmap/backing.h"

namespace farmem {
namespace {

using rmmap_internal::Backing;

constexpr size_t kPage = 4096;

// Test-only switch (docs/regions_mmap.md, "Tests"): removes one protection so a test fails.
enum class MmapFault { kNone, kNoFetch, kNoDirty, kNoWp, kNoPrefetch, kNoFixVaddr };
MmapFault FaultFromEnv() {
  const char* e = std::getenv("FARMEM_REGIONS_MMAP_FAULT");
  if (e == nullptr) return MmapFault::kNone;
  std::string_view v(e);
  if (v == "no_fetch") return MmapFault::kNoFetch;  // faults filled with zeros, store not read
  if (v == "no_dirty") return MmapFault::kNoDirty;  // rmarkdirty records nothing
  if (v == "no_wp") return MmapFault::kNoWp;        // write-protect faults mark nothing dirty
  if (v == "no_prefetch") return MmapFault::kNoPrefetch;  // rprefetch installs nothing
  if (v == "no_fixvaddr") return MmapFault::kNoFixVaddr;  // FIXVADDR regions mapped anywhere
  return MmapFault::kNone;
}

// A region of a RegionStore in this process; the write handle pins its chunks until rmunmap.
class StoreBacking : public Backing {
 public:
  StoreBacking(regions::RegionStore& store, uint64_t ino, uint64_t handle)
      : store_(store), ino_(ino), handle_(handle) {
    // FIXVADDR: "0x..." (ENODATA for other regions).
    if (auto v = store_.getxattr(ino_, "user.region.vaddr"); v.ok())
      vaddr_ = std::strtoull(v->c_str(), nullptr, 16);
  }
  uint64_t fixed_address() const override { return vaddr_; }
  ~StoreBacking() override { (void)store_.release(handle_); }
  Result<size_t> read(uint64_t offset, std::span<std::byte> out) override {
    return store_.read(ino_, offset, out);
  }
  Status write(uint64_t offset, std::span<const std::byte> data) override {
    return store_.write(ino_, offset, data);
  }

 private:
  regions::RegionStore& store_;
  const uint64_t ino_;
  const uint64_t handle_;
  uint64_t vaddr_ = 0;
};

// One mapping. Invariants: `dirty[i]` is set by rmarkdirty or by the handler on a write fault
// (write-protect tracking: a page not dirty is installed or re-protected write-protected, so its
// first store faults); rsync write-protects a run *before* clearing its bits and copying it, so a
// store racing the copy re-dirties the page. `dirty` is atomic (the handler sets bits without a
// lock: rsync's copy may need the handler); `mu` serialises rmarkdirty / rsync / rclearcache.
struct Mapping {
  std::unique_ptr<Backing> backing;
  std::byte* base = nullptr;
  size_t length = 0;  // bytes of the region mapped (the VMA is rounded up to whole pages)
  size_t vma_len = 0;
  int uffd = -1;
  int stop_fd = -1;
  MmapFault fault = MmapFault::kNone;
  std::thread handler;
  std::mutex mu;
  bool wp = false;  // write-protect tracking registered
  std::unique_ptr<std::atomic<bool>[]> dirty;
  std::atomic<uint64_t> faults{0}, zero_fills{0}, fetch_errors{0}, pages_written{0}, prefetched{0};
};

std::mutex g_mu;  // guards g_maps
std::map<uintptr_t, std::shared_ptr<Mapping>> g_maps;

// The mapping containing [addr, addr+len), or NotFound / InvalidArgument.
Result<std::shared_ptr<Mapping>> Find(const void* addr, size_t len) {
  std::lock_guard lk(g_mu);
  auto a = reinterpret_cast<uintptr_t>(addr);
  auto it = g_maps.upper_bound(a);
  if (it == g_maps.begin()) return Status::NotFound("rmmap: address not in an rmmap'ed region");
  --it;
  auto& m = it->second;
  if (a >= it->first + m->vma_len)
    return Status::NotFound("rmmap: address not in an rmmap'ed region");
  if (len > it->first + m->vma_len - a)
    return Status::InvalidArgument("rmmap: range runs past the end of the mapping");
  return m;
}

// The pages of [addr, addr+len) in their mapping: `off` is addr's offset in it, [first, last]
// the page indices touched (meaningless when len == 0).
struct Pages {
  std::shared_ptr<Mapping> m;
  uintptr_t off = 0;
  size_t first = 0, last = 0;
};
Result<Pages> PagesOf(const void* addr, size_t len) {
  FARMEM_ASSIGN_OR_RETURN(auto m, Find(addr, len));
  Pages p;
  p.off = reinterpret_cast<uintptr_t>(addr) - reinterpret_cast<uintptr_t>(m->base);
  p.first = p.off / kPage;
  p.last = (p.off + std::max<size_t>(len, 1) - 1) / kPage;
  p.m = std::move(m);
  return p;
}

// Makes the faulting access fail with SIGBUS: UFFDIO_COPY cannot carry an error, so the page is
// replaced by a shared mapping of an empty memfd (an access past its end raises SIGBUS), then the
// faulting thread is woken and retries into it. The page stays that way until rmunmap.
void Poison(Mapping& m, uintptr_t page) {
  int fd = static_cast<int>(syscall(SYS_memfd_create, "rmmap-poison", MFD_CLOEXEC));
  if (fd >= 0) {
    void* p = mmap(reinterpret_cast<void*>(page), kPage, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, fd, 0);
    (void)p;  // on failure the wake below lets the thread retry: it faults again and we retry
    close(fd);
  }
  uffdio_range r{page, kPage};
  ioctl(m.uffd, UFFDIO_WAKE, &r);
}

// A store to a write-protected page: lift the protection without waking, mark the page dirty,
// then wake the faulting thread. Order matters: an rsync that clears the bit before we set it
// finds the page unprotected and skips it, but the store has not happened yet and the bit is set
// before it does (so the storing thread's own later rsync sees it); an rsync after we set it
// re-protects, and a not-yet-woken store then faults again.
void ServeWpFault(Mapping& m, uintptr_t addr) {
  uintptr_t page = addr & ~(uintptr_t{kPage} - 1);
  uffdio_writeprotect w{};
  w.range = {page, kPage};
  w.mode = UFFDIO_WRITEPROTECT_MODE_DONTWAKE;
  if (ioctl(m.uffd, UFFDIO_WRITEPROTECT, &w) != 0) {
    Poison(m, page);
    return;
  }
  if (m.fault != MmapFault::kNoWp)
    m.dirty[(page - reinterpret_cast<uintptr_t>(m.base)) / kPage] = true;
  uffdio_range r{page, kPage};
  ioctl(m.uffd, UFFDIO_WAKE, &r);
}

void ServeFault(Mapping& m, uintptr_t addr) {
  uintptr_t page = addr & ~(uintptr_t{kPage} - 1);
  uint64_t off = page - reinterpret_cast<uintptr_t>(m.base);
  m.faults.fetch_add(1, std::memory_order_relaxed);
  alignas(kPage) static thread_local std::byte buf[kPage];
  std::memset(buf, 0, kPage);
  size_t got = 0;
  if (off < m.length && m.fault != MmapFault::kNoFetch) {
    size_t want = std::min<size_t>(kPage, m.length - off);
    // Backings read holes as zeros without a remote read and bound every read by the
    // transport's op_timeout, so this never blocks forever.
    auto r = m.backing->read(off, std::span<std::byte>(buf, want));
    if (!r.ok()) {
      m.fetch_errors.fetch_add(1, std::memory_order_relaxed);
      Poison(m, page);
      return;
    }
    got = *r;
  }
  bool all_zero =
      got == 0 || std::all_of(buf, buf + got, [](std::byte b) { return b == std::byte{0}; });
  // With write-protect tracking a zero page would escape it (its writes copy it without a fault),
  // so zeros are copied in like data then.
  if (all_zero && !m.wp) {
    m.zero_fills.fetch_add(1, std::memory_order_relaxed);
    uffdio_zeropage z{};
    z.range = {page, kPage};
    if (ioctl(m.uffd, UFFDIO_ZEROPAGE, &z) != 0 && errno != EEXIST) Poison(m, page);
    return;
  }
  uffdio_copy c{};
  c.dst = page;
  c.src = reinterpret_cast<uintptr_t>(buf);
  c.len = kPage;
  // Always installed write-protected, even for a write fault: the retried store then takes a
  // write-protect fault and dirties the page through ServeWpFault's ordering (marking it here
  // could race an rsync copying the page before the store lands).
  c.mode = m.wp ? UFFDIO_COPY_MODE_WP : 0;
  // EEXIST: another thread's fault on the same page was served first; the waiter is woken.
  if (ioctl(m.uffd, UFFDIO_COPY, &c) != 0 && errno != EEXIST) Poison(m, page);
}

void HandlerLoop(Mapping* m) {
  pollfd fds[2] = {{m->uffd, POLLIN, 0}, {m->stop_fd, POLLIN, 0}};
  for (;;) {
    int n = poll(fds, 2, 1000);
    if (n < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    if (n <= 0 || (fds[0].revents & POLLIN) == 0) continue;
    uffd_msg msg;
    ssize_t r = read(m->uffd, &msg, sizeof(msg));
    if (r != sizeof(msg)) continue;  // EAGAIN: another wake consumed it
    if (msg.event != UFFD_EVENT_PAGEFAULT) continue;
    if (msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP)
      ServeWpFault(*m, msg.arg.pagefault.address);
    else
      ServeFault(*m, msg.arg.pagefault.address);
  }
}

void Teardown(Mapping& m) {
  if (m.handler.joinable()) {
    uint64_t one = 1;
    (void)!write(m.stop_fd, &one, sizeof(one));
    m.handler.join();
  }
  if (m.base != nullptr) munmap(m.base, m.vma_len);
  if (m.uffd >= 0) close(m.uffd);
  if (m.stop_fd >= 0) close(m.stop_fd);
  m.backing.reset();  // after the handler: it may be reading through it
}

Result<uint64_t> Resolve(regions::RegionStore& store, std::string_view path) {
  uint64_t ino = regions::kRootIno;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    if (j > i) {
      FARMEM_ASSIGN_OR_RETURN(auto a, store.lookup(ino, path.substr(i, j - i)));
      ino = a.ino;
    }
    i = j + 1;
  }
  return ino;
}

}  // namespace

namespace rmmap_internal {

Result<void*> MapBacking(std::unique_ptr<Backing> backing, size_t length) {
  auto m = std::make_shared<Mapping>();
  m->backing = std::move(backing);
  m->length = length;
  m->vma_len = (length + kPage - 1) & ~(kPage - 1);
  m->dirty = std::make_unique<std::atomic<bool>[]>(m->vma_len / kPage);
  m->fault = FaultFromEnv();
  auto fail = [&](Status s) -> Result<void*> {
    Teardown(*m);
    return s;
  };
  m->uffd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  if (m->uffd < 0) return fail(Status::FromErrno("rmmap: userfaultfd", errno));
  uffdio_api api{};
  api.api = UFFD_API;
  if (ioctl(m->uffd, UFFDIO_API, &api) != 0)
    return fail(Status::FromErrno("rmmap: UFFDIO_API", errno));
  m->stop_fd = eventfd(0, EFD_CLOEXEC);
  if (m->stop_fd < 0) return fail(Status::FromErrno("rmmap: eventfd", errno));
  // FIXVADDR: at the region's address or not at all (MAP_FIXED_NOREPLACE never replaces what is
  // mapped there; a kernel without it would take the address as a hint only).
  const uint64_t fixed = m->fault == MmapFault::kNoFixVaddr ? 0 : m->backing->fixed_address();
  if (fixed != 0 && m->vma_len > regions::kFixVaddrSlotBytes)
    return fail(Status::InvalidArgument(
        "rmmap: a FIXVADDR region maps at most 8 GiB (its fixed address range)"));
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | (fixed != 0 ? MAP_FIXED_NOREPLACE : 0);
  void* p = mmap(reinterpret_cast<void*>(fixed), m->vma_len, PROT_READ | PROT_WRITE, flags, -1, 0);
  if (p == MAP_FAILED) {
    if (fixed != 0 && errno == EEXIST) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), "[0x%llx, 0x%llx)", static_cast<unsigned long long>(fixed),
                    static_cast<unsigned long long>(fixed + m->vma_len));
      return fail(Status::FailedPrecondition(
          std::string("rmmap: the FIXVADDR region's address range ") + buf +
          " is taken in this process (something else is mapped there, or the region is mapped "
          "already)"));
    }
    return fail(Status::FromErrno("rmmap: mmap", errno));
  }
  if (fixed != 0 && reinterpret_cast<uint64_t>(p) != fixed) {
    munmap(p, m->vma_len);
    return fail(Status::FailedPrecondition(
        "rmmap: the kernel did not map the FIXVADDR region at its address (no "
        "MAP_FIXED_NOREPLACE)"));
  }
  m->base = static_cast<std::byte*>(p);
  uffdio_register reg{};
  reg.range = {reinterpret_cast<uintptr_t>(p), m->vma_len};
  // Write-protect tracking where the kernel has it (anonymous memory: Linux >= 5.7); otherwise
  // only rmarkdirty marks pages dirty.
  reg.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP;
  m->wp = ioctl(m->uffd, UFFDIO_REGISTER, &reg) == 0;
  if (!m->wp) {
    reg.mode = UFFDIO_REGISTER_MODE_MISSING;
    if (ioctl(m->uffd, UFFDIO_REGISTER, &reg) != 0)
      return fail(Status::FromErrno("rmmap: UFFDIO_REGISTER", errno));
  }
  m->handler = std::thread(HandlerLoop, m.get());
  std::lock_guard lk(g_mu);
  g_maps[reinterpret_cast<uintptr_t>(p)] = m;
  return p;
}

}  // namespace rmmap_internal

Result<void*> rmmap(regions::RegionStore& store, std::string_view path, size_t length) {
  FARMEM_ASSIGN_OR_RETURN(uint64_t ino, Resolve(store, path));
  FARMEM_ASSIGN_OR_RETURN(auto attr, store.getattr(ino));
  if ((attr.mode & S_IFMT) != S_IFREG)
    return Status::InvalidArgument("rmmap: " + std::string(path) + " is not a regular region");
  if (length == 0) length = attr.size;
  if (length == 0) return Status::InvalidArgument("rmmap: empty region and no length given");
  FARMEM_ASSIGN_OR_RETURN(uint64_t handle, store.open(ino, /*write=*/true));
  return rmmap_internal::MapBacking(std::make_unique<StoreBacking>(store, ino, handle), length);
}

Status rmunmap(void* addr) {
  std::shared_ptr<Mapping> m;
  {
    std::lock_guard lk(g_mu);
    auto it = g_maps.find(reinterpret_cast<uintptr_t>(addr));
    if (it == g_maps.end()) return Status::NotFound("rmunmap: not the start of an rmmap'ed region");
    m = std::move(it->second);
    g_maps.erase(it);
  }
  std::lock_guard lk(m->mu);
  Teardown(*m);
  return Status::OK();
}

Status rmarkdirty(void* addr, size_t len, bool zero) {
  FARMEM_ASSIGN_OR_RETURN(auto pages, PagesOf(addr, len));
  if (len == 0) return Status::OK();
  auto& m = pages.m;
  const uintptr_t a = pages.off;
  const size_t first = pages.first, last = pages.last;
  std::lock_guard lk(m->mu);
  if (zero) {
    // Pages wholly inside the range are filled with zeros without fetching them; a partial
    // page at either end keeps its other bytes, so it is fetched by the memset's fault.
    for (size_t i = first; i <= last; ++i) {
      uintptr_t pa = i * kPage;
      if (pa < a || pa + kPage > a + len) continue;
      uffdio_zeropage z{};
      z.range = {reinterpret_cast<uintptr_t>(m->base) + pa, kPage};
      if (ioctl(m->uffd, UFFDIO_ZEROPAGE, &z) != 0 && errno != EEXIST)
        return Status::FromErrno("rmarkdirty: UFFDIO_ZEROPAGE", errno);
    }
    std::memset(addr, 0, len);
  }
  if (m->fault == MmapFault::kNoDirty) return Status::OK();
  for (size_t i = first; i <= last; ++i) m->dirty[i] = true;
  return Status::OK();
}

namespace {

// Installs `n` fetched pages at `page` (UFFDIO_COPY, write-protected under WP tracking like a
// fault's page). EEXIST: that page became present meanwhile (a fault served it): it keeps what
// it has and the rest are still installed. Returns the pages installed.
Result<size_t> InstallRun(Mapping& m, uintptr_t page, const std::byte* src, size_t n) {
  size_t done = 0, installed = 0;
  while (done < n) {
    uffdio_copy c{};
    c.dst = page + done * kPage;
    c.src = reinterpret_cast<uintptr_t>(src + done * kPage);
    c.len = (n - done) * kPage;
    c.mode = m.wp ? UFFDIO_COPY_MODE_WP : 0;
    if (ioctl(m.uffd, UFFDIO_COPY, &c) == 0) return installed + (n - done);
    const int err = errno;
    const size_t copied = c.copy > 0 ? static_cast<size_t>(c.copy) / kPage : 0;
    done += copied;
    installed += copied;
    if (err == EEXIST)
      ++done;  // the page at `done` is present: skip it
    else if (err != EAGAIN)
      return Status::FromErrno("rprefetch: UFFDIO_COPY", err);
  }
  return installed;
}

}  // namespace

Status rprefetch(void* addr, size_t len) {
  FARMEM_ASSIGN_OR_RETURN(auto pages, PagesOf(addr, len));
  if (len == 0) return Status::OK();
  auto& m = pages.m;
  if (m->fault == MmapFault::kNoPrefetch) return Status::OK();
  // Under mu no rclearcache can drop a page between mincore and UFFDIO_COPY, so a page seen
  // present stays present; one faulted in meanwhile makes its UFFDIO_COPY EEXIST (skipped).
  std::lock_guard lk(m->mu);
  const size_t first = pages.first, count = pages.last - pages.first + 1;
  std::vector<unsigned char> present(count);
  if (mincore(m->base + first * kPage, count * kPage, present.data()) != 0)
    return Status::FromErrno("rprefetch: mincore", errno);
  constexpr size_t kMaxRunPages = (4u << 20) / kPage;  // bounds the buffer
  std::unique_ptr<std::byte[]> buf;
  for (size_t i = 0; i < count;) {
    if (present[i] & 1) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < count && j - i < kMaxRunPages && !(present[j] & 1)) ++j;
    const size_t n = j - i;
    if (!buf) buf = std::make_unique<std::byte[]>(kMaxRunPages * kPage);
    const uint64_t off = (first + i) * kPage;
    std::memset(buf.get(), 0, n * kPage);  // past the region's size: zeros, as a fault gives
    if (off < m->length) {
      const size_t want = std::min<size_t>(n * kPage, m->length - off);
      FARMEM_RETURN_IF_ERROR(m->backing->read(off, std::span<std::byte>(buf.get(), want)).status());
    }
    FARMEM_ASSIGN_OR_RETURN(
        size_t installed, InstallRun(*m, reinterpret_cast<uintptr_t>(m->base) + off, buf.get(), n));
    m->prefetched.fetch_add(installed, std::memory_order_relaxed);
    i = j;
  }
  return Status::OK();
}

Status rsync(void* addr, size_t len) {
  FARMEM_ASSIGN_OR_RETURN(auto pages, PagesOf(addr, len));
  if (len == 0) return Status::OK();
  auto& m = pages.m;
  std::lock_guard lk(m->mu);
  std::vector<std::byte> buf;
  for (size_t i = pages.first; i <= pages.last; ++i) {
    if (!m->dirty[i]) continue;
    // Adjacent dirty pages go in one write, clipped to the mapped length; copied out first
    // (user-mode memcpy: a page not yet present is fetched by our handler) so the store sees
    // one consistent snapshot of the run.
    size_t j = i;
    while (j + 1 <= pages.last && m->dirty[j + 1]) ++j;
    size_t off = i * kPage;
    // Clear, then protect, then copy: a store before the protection is in the copy, one after
    // it faults and dirties the page again for the next rsync.
    for (size_t k = i; k <= j; ++k) m->dirty[k] = false;
    if (m->wp) {
      uffdio_writeprotect w{};
      w.range = {reinterpret_cast<uintptr_t>(m->base) + off, (j - i + 1) * kPage};
      w.mode = UFFDIO_WRITEPROTECT_MODE_WP;
      if (ioctl(m->uffd, UFFDIO_WRITEPROTECT, &w) != 0) {
        for (size_t k = i; k <= j; ++k) m->dirty[k] = true;
        return Status::FromErrno("rsync: UFFDIO_WRITEPROTECT", errno);
      }
    }
    size_t n = std::min((j + 1) * kPage, m->length) - off;
    buf.resize(n);
    std::memcpy(buf.data(), m->base + off, n);
    if (Status st = m->backing->write(off, buf); !st.ok()) {
      for (size_t k = i; k <= j; ++k) m->dirty[k] = true;  // still to be written back
      return st;
    }
    m->pages_written.fetch_add(j - i + 1, std::memory_order_relaxed);
    i = j;
  }
  return Status::OK();
}

Status rclearcache(void* addr, size_t len) {
  FARMEM_ASSIGN_OR_RETURN(auto pages, PagesOf(addr, len));
  if (len == 0) return Status::OK();
  auto& m = pages.m;
  const size_t first = pages.first, last = pages.last;
  std::lock_guard lk(m->mu);
  for (size_t i = first; i <= last; ++i)
    if (m->dirty[i])
      return Status::FailedPrecondition("rclearcache: range holds dirty pages (rsync first)");
  // Dropping the pages of a userfaultfd-registered anonymous range makes the next access a
  // missing fault again, fetched afresh; the backing first re-reads its layout (a mount's file
  // may have grown or shrunk since), so those fetches see it.
  FARMEM_RETURN_IF_ERROR(m->backing->refresh());
  if (madvise(m->base + first * kPage, (last - first + 1) * kPage, MADV_DONTNEED) != 0)
    return Status::FromErrno("rclearcache: madvise", errno);
  return Status::OK();
}

Result<RmmapStats> rmmap_stats(void* addr) {
  FARMEM_ASSIGN_OR_RETURN(auto m, Find(addr, 0));
  RmmapStats s;
  s.faults = m->faults.load();
  s.zero_fills = m->zero_fills.load();
  s.fetch_errors = m->fetch_errors.load();
  s.pages_written = m->pages_written.load();
  s.prefetched = m->prefetched.load();
  s.write_protect = m->wp;
  return s;
}

}  // namespace farmem
