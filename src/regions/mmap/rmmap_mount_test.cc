// rmmap of a file in a farmem mount (RunRegionFs on a thread of this process, embedded farmemd)
// from another process: a forked child maps a file written through the mount, checks every byte,
// writes pages over a chunk and over a hole and rsyncs them; this process reads them back through
// the mount. Also: rmmap by fd, the uid check of user.region.map, bad input, and FIXVADDR (two
// children map a region at its fixed address and follow a pointer stored in it).
// Skips without /dev/fuse (FUSE needs it, and root to mount).
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "farmem/regionfs.h"
#include "farmem/regions.h"
#include "farmem/server.h"
#include "regions/format/region_layout.h"
#include "regions/fs/mount_test_util.h"

namespace farmem {
namespace {

using namespace std::chrono_literals;

constexpr size_t kKiB = 1024;
// The file: chunks 0-1 written, 2-3 a hole, chunk 4 written up to a size that is not a multiple
// of a page (a chunk is 128 KiB).
constexpr size_t kFirstPart = 256 * kKiB;
constexpr size_t kSecondAt = 512 * kKiB;
constexpr size_t kFileSize = kSecondAt + 8 * kKiB + 100;
// What the child writes: a page over chunk 0 and a page in the hole.
constexpr size_t kOverChunk = 4 * kKiB;
constexpr size_t kOverHole = 300 * kKiB;

unsigned char Pattern(size_t i) {
  return static_cast<unsigned char>((i * 131 + i / 4096) ^ 0x5a);
}
unsigned char Expected(size_t i) {
  return (i < kFirstPart || i >= kSecondAt) ? Pattern(i) : 0;
}
unsigned char ChildByte(size_t i) {
  return static_cast<unsigned char>(i * 7 + 3);
}

// Runs `fn` in a forked child; returns what it returned ("" = success), or a description of how
// it failed (no answer within 60 s: killed).
std::string InChild(const std::function<std::string()>& fn) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string r = fn();
    r = "=" + r;  // a non-empty answer even for success
    [[maybe_unused]] ssize_t w = write(fds[1], r.data(), r.size());
    _exit(0);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return "fork failed";
  }
  std::string out;
  pollfd p{fds[0], POLLIN, 0};
  char buf[4096];
  while (poll(&p, 1, 60000) == 1) {
    ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (out.empty()) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (out.empty()) return "the child gave no answer (status " + std::to_string(status) + ")";
  return out.substr(1);
}

class RmmapMountTest : public RegionFsMountTest {
 protected:
  void SetUp() override {
    Mount("rmmapfs", 32ull << 20);
    file_ = dir_ + "/data.bin";
  }
  // Writes the test file through the mount (two parts around a hole), fsync'ed.
  void WriteFile() {
    int fd = open(file_.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    std::vector<unsigned char> b(kFileSize);
    for (size_t i = 0; i < kFileSize; ++i) b[i] = Pattern(i);
    ASSERT_EQ(pwrite(fd, b.data(), kFirstPart, 0), static_cast<ssize_t>(kFirstPart));
    ASSERT_EQ(pwrite(fd, b.data() + kSecondAt, kFileSize - kSecondAt, kSecondAt),
              static_cast<ssize_t>(kFileSize - kSecondAt));
    ASSERT_EQ(fsync(fd), 0);
    ASSERT_EQ(close(fd), 0);
  }
  // The file's bytes as the mount serves them now (O_DIRECT: not the kernel's cached pages,
  // which one-sided writes bypass).
  std::vector<unsigned char> ReadThroughMount() {
    int fd = open(file_.c_str(), O_RDONLY | O_DIRECT);
    EXPECT_GE(fd, 0) << std::strerror(errno);
    void* mem = nullptr;
    const size_t cap = 1 << 20;
    EXPECT_EQ(posix_memalign(&mem, 4096, cap), 0);
    std::vector<unsigned char> out;
    for (ssize_t n; fd >= 0 && (n = pread(fd, mem, cap, static_cast<off_t>(out.size()))) > 0;)
      out.insert(out.end(), static_cast<unsigned char*>(mem), static_cast<unsigned char*>(mem) + n);
    free(mem);
    if (fd >= 0) close(fd);
    return out;
  }

  std::string file_;
};

TEST_F(RmmapMountTest, AnotherProcessMapsReadsWritesAndRsyncs) {
  WriteFile();
  std::string err = InChild([&]() -> std::string {
    auto p = rmmap(file_);
    if (!p.ok()) return "rmmap: " + p.status().ToString();
    auto* b = static_cast<unsigned char*>(*p);
    for (size_t i = 0; i < kFileSize; ++i)
      if (b[i] != Expected(i))
        return "byte " + std::to_string(i) + " is " + std::to_string(b[i]) + ", want " +
               std::to_string(Expected(i)) + " (the fault did not fetch the file's bytes)";
    for (size_t i = 0; i < 4096; ++i) {
      b[kOverChunk + i] = ChildByte(kOverChunk + i);
      b[kOverHole + i] = ChildByte(kOverHole + i);
    }
    // Without write-protect tracking the stores above are not seen: mark them.
    if (Status st = rmarkdirty(b + kOverChunk, 4096, false); !st.ok()) return st.ToString();
    if (Status st = rmarkdirty(b + kOverHole, 4096, false); !st.ok()) return st.ToString();
    if (Status st = rsync(b, kFileSize); !st.ok()) return "rsync: " + st.ToString();
    auto stats = rmmap_stats(b);
    if (!stats.ok() || stats->faults == 0) return "no fault was counted";
    if (Status st = rmunmap(b); !st.ok()) return "rmunmap: " + st.ToString();
    return "";
  });
  ASSERT_EQ(err, "") << "in the child";
  std::vector<unsigned char> got = ReadThroughMount();
  ASSERT_EQ(got.size(), kFileSize) << "rsync changed the file's size";
  for (size_t i = 0; i < kFileSize; ++i) {
    const bool child =
        (i >= kOverChunk && i < kOverChunk + 4096) || (i >= kOverHole && i < kOverHole + 4096);
    ASSERT_EQ(got[i], child ? ChildByte(i) : Expected(i))
        << "byte " << i << (child ? " (the child's rsync)" : " (untouched)");
  }
}

TEST_F(RmmapMountTest, MapByFdAndRclearcacheSeesGrowth) {
  WriteFile();
  int fd = open(file_.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  auto p = rmmap(fd, kFileSize + 8192);  // longer than the file: its tail reads zero
  close(fd);                             // the mapping holds its own open file
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto* b = static_cast<unsigned char*>(*p);
  // The mapping holds the file open: a failed check must still unmap it, or the unmount in
  // TearDown waits for that file forever.
  struct Unmap {
    void* p;
    ~Unmap() { (void)rmunmap(p); }
  } unmap{b};
  for (size_t i = 0; i < kFileSize + 8192; ++i)
    ASSERT_EQ(b[i], i < kFileSize ? Expected(i) : 0) << "byte " << i;
  // The file grows through the mount; after rclearcache the mapping sees the new bytes.
  {
    int w = open(file_.c_str(), O_WRONLY);
    ASSERT_GE(w, 0);
    const unsigned char more[5] = {1, 2, 3, 4, 5};
    ASSERT_EQ(pwrite(w, more, sizeof(more), kFileSize), 5);
    ASSERT_EQ(close(w), 0);
  }
  ASSERT_TRUE(rclearcache(b, kFileSize + 8192).ok());
  EXPECT_EQ(b[kFileSize], 1);
  EXPECT_EQ(b[kFileSize + 4], 5);
  EXPECT_EQ(b[kFileSize + 5], 0);
  EXPECT_EQ(b[0], Expected(0));
}

TEST_F(RmmapMountTest, OnlyRootOrTheMountsUserGetsTheDescriptor) {
  WriteFile();
  // Root (this test's user, the mount's) gets it; it is not listed.
  char buf[65536];
  EXPECT_GT(getxattr(file_.c_str(), "user.region.map", buf, sizeof(buf)), 0)
      << std::strerror(errno);
  ssize_t n = listxattr(file_.c_str(), buf, sizeof(buf));
  ASSERT_GE(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)).find("user.region.map"), std::string::npos);
  std::string err = InChild([&]() -> std::string {
    if (setgid(65534) != 0 || setuid(65534) != 0) return "setuid nobody failed";
    char b[65536];
    if (getxattr(file_.c_str(), "user.region.map", b, sizeof(b)) >= 0)
      return "nobody read user.region.map (it holds the cluster token)";
    if (errno != EACCES) return std::string("getxattr: ") + std::strerror(errno) + ", want EACCES";
    auto p = rmmap(file_);
    if (p.ok() || p.status().code() != Code::kPermissionDenied)
      return "rmmap as nobody: " + (p.ok() ? std::string("mapped") : p.status().ToString());
    return "";
  });
  EXPECT_EQ(err, "") << "in the child running as nobody";
}

TEST_F(RmmapMountTest, BadInput) {
  // Not a farmem file.
  char tmpl[] = "/tmp/farmem-rmmapfs-plain.XXXXXX";
  int plain = mkstemp(tmpl);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(write(plain, "x", 1), 1);
  auto r = rmmap(std::string_view(tmpl));
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
  r = rmmap(plain);
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status().ToString();
  close(plain);
  unlink(tmpl);
  // A directory of the mount, a missing file, an empty file without a length, a bad fd.
  ASSERT_EQ(mkdir((dir_ + "/d").c_str(), 0755), 0);
  EXPECT_EQ(rmmap(dir_ + "/d").status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(rmmap(dir_ + "/missing").ok());
  int e = open((dir_ + "/empty").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(e, 0);
  close(e);
  EXPECT_EQ(rmmap(dir_ + "/empty").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(rmmap(-1).status().code(), Code::kInvalidArgument);
}

// A mount on a farmemd of the test's own, which then stops: rmmap must fail (within the
// transport's connect timeout), not map a file whose faults could never be served.
class RmmapMountServerTest : public RegionFsMountTest {
 protected:
  std::unique_ptr<MemoryServer> server_;  // outlives the mount: destroyed after TearDown
};

TEST_F(RmmapMountServerTest, UnreachableServersAreAnErrorNotAHang) {
  if (access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "no /dev/fuse";
  ServerConfig sc;
  sc.memory_bytes = 16ull << 20;
  sc.pool_bytes = 16ull << 20;
  sc.node.name = "rmmap-test-farmemd";
  sc.node.transport.cluster_token = "rmmap-test-token";
  sc.services = {"pools"};
  auto server = MemoryServer::Create(sc);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  server_ = std::move(*server);
  ASSERT_TRUE(server_->start().ok());
  RegionFsOptions o;
  o.servers = {server_->node().bootstrap_address()};
  o.token = "rmmap-test-token";
  o.cluster_url = "memory://rmmap-unreachable";
  ASSERT_NO_FATAL_FAILURE(Mount("rmmapfs-srv", std::move(o)));
  const std::string file = dir_ + "/f";
  int fd = open(file.c_str(), O_CREAT | O_WRONLY, 0644);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, "hello", 5), 5);
  EXPECT_EQ(fsync(fd), 0);
  close(fd);
  server_->stop();
  auto p = rmmap(file);
  EXPECT_FALSE(p.ok()) << "rmmap succeeded with its memory server stopped";
  if (p.ok()) {
    (void)rmunmap(*p);
  } else {
    EXPECT_TRUE(p.status().code() == Code::kUnavailable || p.status().code() == Code::kTimedOut)
        << p.status().ToString();
  }
}

// The descriptor comes from a file system: a reader must refuse one whose indexes point outside
// it (faults would otherwise index past the unit table).
// FIXVADDR: two processes map the region at its fixed address, the same in both; the first
// stores a pointer (an absolute address inside the region) and the bytes it points to, the
// second follows it. A process where that range is taken gets a clear error, not another place.
// FARMEM_REGIONS_MMAP_FAULT=no_fixvaddr (mapped anywhere) makes it fail.
TEST_F(RmmapMountTest, FixvaddrRegionsMapAtTheirAddressInEveryProcess) {
  const std::string f = dir_ + "/fixed.bin";
  int fd = open(f.c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  ASSERT_EQ(fsetxattr(fd, "user.region.fixvaddr", "1", 1, 0), 0) << std::strerror(errno);
  ASSERT_EQ(ftruncate(fd, 3 * regions::kChunkBytes), 0);
  ASSERT_EQ(close(fd), 0);
  char v[32] = {};
  ASSERT_GT(getxattr(f.c_str(), "user.region.vaddr", v, sizeof(v) - 1), 0) << std::strerror(errno);
  const uint64_t vaddr = std::strtoull(v, nullptr, 16);
  ASSERT_GE(vaddr, regions::kFixVaddrBase) << v;
  constexpr size_t kTarget = regions::kChunkBytes + 100;  // in another chunk than the pointer
  const char kText[] = "followed through a FIXVADDR pointer";
  std::string err = InChild([&]() -> std::string {
    auto p = rmmap(f);
    if (!p.ok()) return "rmmap: " + p.status().ToString();
    if (reinterpret_cast<uint64_t>(*p) != vaddr)
      return "mapped at " + std::to_string(reinterpret_cast<uint64_t>(*p)) + ", not at the " +
             "region's " + v;
    auto* b = static_cast<char*>(*p);
    std::memcpy(b + kTarget, kText, sizeof(kText));
    char* target = b + kTarget;
    std::memcpy(b, &target, sizeof(target));  // a pointer stored inside the region
    if (Status st = rmarkdirty(b, 4096, false); !st.ok()) return st.ToString();
    if (Status st = rmarkdirty(b + kTarget, 4096, false); !st.ok()) return st.ToString();
    if (Status st = rsync(b, 3 * regions::kChunkBytes); !st.ok()) return "rsync: " + st.ToString();
    return rmunmap(b).ok() ? "" : "rmunmap failed";
  });
  ASSERT_EQ(err, "") << "in the writing child";
  err = InChild([&]() -> std::string {
    auto p = rmmap(f);
    if (!p.ok()) return "rmmap: " + p.status().ToString();
    if (reinterpret_cast<uint64_t>(*p) != vaddr)
      return "mapped at " + std::to_string(reinterpret_cast<uint64_t>(*p)) + ", not at the " +
             "region's " + v;
    char* target = nullptr;
    std::memcpy(&target, *p, sizeof(target));
    const auto* base = static_cast<const char*>(*p);
    if (target < base || target >= base + 3 * regions::kChunkBytes)
      return "the stored pointer does not point into this process's mapping";
    if (std::strcmp(target, kText) != 0) return std::string("followed the pointer to: ") + target;
    return rmunmap(*p).ok() ? "" : "rmunmap failed";
  });
  ASSERT_EQ(err, "") << "in the reading child";
  err = InChild([&]() -> std::string {
    void* mine = mmap(reinterpret_cast<void*>(vaddr + 4096), 4096, PROT_READ,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (mine == MAP_FAILED) return "could not take the range first";
    auto p = rmmap(f);
    if (p.ok()) return "rmmap succeeded with its fixed range taken";
    if (p.status().message().find("is taken") == std::string::npos)
      return "unclear error: " + p.status().ToString();
    return "";
  });
  EXPECT_EQ(err, "") << "in the child that took the range first";
}

TEST(MapDescriptorTest, RoundTripsAndRefusesHostileBytes) {
  regions::MapDescriptor d;
  d.ino = 7;
  d.size = 3 * regions::kChunkBytes;
  d.token = "secret";
  d.servers = {"127.0.0.1:1", "127.0.0.1:2"};
  d.units = {{1, 0, 42, 4096}};
  d.chunks = {regions::MapChunkWord(0, 3), 0, regions::MapChunkWord(0, 15)};
  auto bytes = regions::EncodeMapDescriptor(d);
  ASSERT_TRUE(bytes.ok());
  auto back = regions::DecodeMapDescriptor(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->token, "secret");
  EXPECT_EQ(back->servers, d.servers);
  EXPECT_EQ(back->chunks, d.chunks);
  ASSERT_EQ(back->units.size(), 1u);
  EXPECT_EQ(back->units[0].key, 42u);
  EXPECT_EQ(back->units[0].offset, 4096u);
  // A chunk of a unit that is not there, a unit of a server that is not there, a cut value.
  auto bad = d;
  bad.chunks[1] = regions::MapChunkWord(1, 0);
  EXPECT_EQ(regions::DecodeMapDescriptor(*regions::EncodeMapDescriptor(bad)).status().code(),
            Code::kInvalidArgument)
      << "a chunk word naming a unit past the table was accepted";
  bad = d;
  bad.units[0].server = 2;
  EXPECT_EQ(regions::DecodeMapDescriptor(*regions::EncodeMapDescriptor(bad)).status().code(),
            Code::kInvalidArgument)
      << "a unit naming a server past the list was accepted";
  EXPECT_EQ(regions::DecodeMapDescriptor(bytes->substr(0, bytes->size() - 1)).status().code(),
            Code::kInvalidArgument);
  // FIXVADDR: the address comes back; a slot past the range is refused, and so is an address
  // outside it at encoding.
  auto fixed = d;
  fixed.vaddr = regions::FixVaddrOf(5);
  auto fb = regions::EncodeMapDescriptor(fixed);
  ASSERT_TRUE(fb.ok());
  EXPECT_EQ(regions::DecodeMapDescriptor(*fb)->vaddr, regions::FixVaddrOf(5));
  EXPECT_EQ(back->vaddr, 0u);
  std::string hostile = *fb;
  regions::MapDescriptorHeader h;
  std::memcpy(&h, hostile.data(), sizeof(h));
  h.vaddr_slot = regions::kFixVaddrSlots + 1;
  std::memcpy(hostile.data(), &h, sizeof(h));
  EXPECT_EQ(regions::DecodeMapDescriptor(hostile).status().code(), Code::kInvalidArgument)
      << "a FIXVADDR slot past the range was accepted";
  fixed.vaddr = regions::FixVaddrOf(5) + 4096;
  EXPECT_EQ(regions::EncodeMapDescriptor(fixed).status().code(), Code::kInvalidArgument);
  // Larger than an xattr value can be: refused at encoding.
  bad = d;
  bad.chunks.assign(regions::kMaxMapDescriptorBytes / 4, 0);
  EXPECT_EQ(regions::EncodeMapDescriptor(bad).status().code(), Code::kResourceExhausted);
}

}  // namespace
}  // namespace farmem
