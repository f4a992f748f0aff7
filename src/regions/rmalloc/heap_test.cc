// Tests of rmalloc/rfree (RegionHeap): attach checks, alignment, out of space and coalescing,
// double/foreign frees as errors, random alloc/free with tagged contents; and a stress test of
// three forked processes sharing one memfd (each maps it at its own address).
// FARMEM_REGIONS_RMALLOC_FAULT=no_lock removes the heap's lock: the process test then fails.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "farmem/regions.h"
#include "regions/rmalloc/heap_faults.h"
#include "regions/rmalloc/heap_layout.h"

namespace farmem {
namespace {

void ApplyFault() {
  const char* e = std::getenv("FARMEM_REGIONS_RMALLOC_FAULT");
  const std::string f = e != nullptr ? e : "";
  if (f == "no_lock") {
    regions::rmalloc::testing::SetHeapLockDisabled(true);
    std::printf("[ fault    ] FARMEM_REGIONS_RMALLOC_FAULT=no_lock\n");
  } else if (!f.empty()) {
    std::fprintf(stderr, "unknown FARMEM_REGIONS_RMALLOC_FAULT=%s\n", f.c_str());
    std::abort();
  }
}

// A zeroed, 64-byte aligned buffer.
struct Buffer {
  explicit Buffer(size_t n) : bytes(static_cast<std::byte*>(std::aligned_alloc(4096, n))), size(n) {
    std::memset(bytes, 0, n);
  }
  ~Buffer() { std::free(bytes); }
  std::span<std::byte> span() { return {bytes, size}; }
  std::byte* bytes;
  size_t size;
};

TEST(RegionHeap, AttachChecksTheRange) {
  Buffer b(64 * 1024);
  EXPECT_EQ(RegionHeap::Attach(b.span().subspan(16)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(RegionHeap::Attach(b.span().first(1024)).status().code(), Code::kInvalidArgument);
  std::memset(b.bytes, 0x5a, 8);  // not zero, not a heap
  EXPECT_EQ(RegionHeap::Attach(b.span()).status().code(), Code::kInvalidArgument);
  std::memset(b.bytes, 0, 8);
  auto h = RegionHeap::Attach(b.span());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  auto p = h->rmalloc(100);
  ASSERT_TRUE(p.ok());
  // A second attach finds the initialised heap (and its allocation) instead of formatting it.
  auto h2 = RegionHeap::Attach(b.span());
  ASSERT_TRUE(h2.ok());
  auto st = h2->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->allocations, 1u);
  EXPECT_TRUE(h2->rfree(*p).ok());
  // Formatted for 64 KiB: a shorter span is refused (the heap would reach past it).
  EXPECT_EQ(RegionHeap::Attach(b.span().first(32 * 1024)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(h->rmalloc(0).status().code(), Code::kInvalidArgument);
}

TEST(RegionHeap, AlignedOutOfSpaceAndCoalescing) {
  Buffer b(256 * 1024);
  auto h = RegionHeap::Attach(b.span());
  ASSERT_TRUE(h.ok());
  const uint64_t capacity = h->stats()->capacity;
  std::vector<void*> ptrs;
  for (size_t len : {1, 15, 16, 17, 48, 49, 100, 1000, 4000}) {
    auto p = h->rmalloc(len);
    ASSERT_TRUE(p.ok()) << len;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(*p) % 16, 0u) << len;
    EXPECT_GE(static_cast<std::byte*>(*p), b.bytes);
    EXPECT_LE(static_cast<std::byte*>(*p) + len, b.bytes + b.size);
    ptrs.push_back(*p);
  }
  for (void* p : ptrs) ASSERT_TRUE(h->rfree(p).ok());
  ptrs.clear();
  EXPECT_EQ(h->rmalloc(capacity).status().code(), Code::kResourceExhausted);
  // Fill with small blocks until out of space: an error, not a crash.
  while (true) {
    auto p = h->rmalloc(40);
    if (!p.ok()) {
      EXPECT_EQ(p.status().code(), Code::kResourceExhausted) << p.status().ToString();
      break;
    }
    ptrs.push_back(*p);
  }
  EXPECT_EQ(ptrs.size(), capacity / regions::rmalloc::kGrain);
  for (void* p : ptrs) ASSERT_TRUE(h->rfree(p).ok());
  auto st = h->stats();
  EXPECT_EQ(st->allocated, 0u);
  EXPECT_EQ(st->allocations, 0u);
  // Every block merged back: the largest block is allocatable again.
  uint64_t largest = regions::rmalloc::kGrain;
  while (largest * 2 <= capacity) largest *= 2;
  auto big = h->rmalloc(largest - 16);
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_TRUE(h->rfree(*big).ok());
}

TEST(RegionHeap, DoubleAndForeignFreesAreErrors) {
  Buffer b(64 * 1024);
  auto h = RegionHeap::Attach(b.span());
  ASSERT_TRUE(h.ok());
  auto p = h->rmalloc(200);
  ASSERT_TRUE(p.ok());
  auto q = h->rmalloc(200);
  ASSERT_TRUE(q.ok());
  int local = 0;
  EXPECT_EQ(h->rfree(&local).code(), Code::kInvalidArgument);
  EXPECT_EQ(h->rfree(nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(h->rfree(static_cast<char*>(*p) + 8).code(), Code::kInvalidArgument);   // interior
  EXPECT_EQ(h->rfree(static_cast<char*>(*p) + 64).code(), Code::kInvalidArgument);  // no block
  EXPECT_EQ(h->rfree(b.bytes + 16).code(), Code::kInvalidArgument);                 // header
  ASSERT_TRUE(h->rfree(*p).ok());
  Status again = h->rfree(*p);
  EXPECT_EQ(again.code(), Code::kInvalidArgument);
  EXPECT_NE(again.message().find("double free"), std::string::npos) << again.ToString();
  ASSERT_TRUE(h->rfree(*q).ok());
  EXPECT_EQ(h->rfree(*q).code(), Code::kInvalidArgument);  // after merging with its buddy too
  EXPECT_EQ(h->stats()->allocations, 0u);
}

TEST(RegionHeap, CorruptedStateIsAnErrorNotACrash) {
  Buffer b(64 * 1024);
  auto h = RegionHeap::Attach(b.span());
  ASSERT_TRUE(h.ok());
  auto p = h->rmalloc(100);
  ASSERT_TRUE(p.ok());
  auto* hdr = reinterpret_cast<regions::rmalloc::HeapHeader*>(b.bytes);
  // Every free-list head points somewhere that is not a free block of its order.
  uint64_t saved[regions::rmalloc::kOrders];
  std::memcpy(saved, hdr->free_head, sizeof saved);
  for (auto& head : hdr->free_head) head = head == 0 ? 0 : head + 64;
  auto q = h->rmalloc(100);
  EXPECT_EQ(q.status().code(), Code::kInternal) << q.status().ToString();
  std::memcpy(hdr->free_head, saved, sizeof saved);
  // The block's header was overwritten (a write before the pointer): refused, not followed.
  auto* block_header = static_cast<uint64_t*>(*p) - 2;
  const uint64_t tag = block_header[0];
  block_header[0] = 0;
  EXPECT_EQ(h->rfree(*p).code(), Code::kInternal);
  block_header[0] = tag;
  EXPECT_TRUE(h->rfree(*p).ok());
  // A header whose geometry reaches past the range.
  hdr->data_size += 1 << 20;
  EXPECT_EQ(RegionHeap::Attach(b.span()).status().code(), Code::kInvalidArgument);
}

struct Live {
  unsigned char* p;
  size_t len;
  unsigned char tag;
};

// Random allocs and frees; every allocation is filled with its own tag and checked before it is
// freed (and at the end), so two overlapping allocations show. Returns the number of bad bytes.
size_t RandomWorkload(RegionHeap& h, uint64_t seed, int ops) {
  std::mt19937_64 rng(seed);
  std::vector<Live> live;
  size_t bad = 0;
  auto check = [&](const Live& l) {
    for (size_t i = 0; i < l.len; i++) bad += l.p[i] != l.tag;
  };
  for (int i = 0; i < ops; i++) {
    if (live.empty() || rng() % 100 < 55) {
      const size_t len = 1 + rng() % (rng() % 8 == 0 ? 3000 : 200);
      auto p = h.rmalloc(len);
      if (!p.ok()) {
        if (p.status().code() != Code::kResourceExhausted) bad++;
        continue;
      }
      Live l{static_cast<unsigned char*>(*p), len, static_cast<unsigned char>(1 + rng() % 255)};
      std::memset(l.p, l.tag, len);
      live.push_back(l);
    } else {
      const size_t k = rng() % live.size();
      check(live[k]);
      if (!h.rfree(live[k].p).ok()) bad++;
      live[k] = live.back();
      live.pop_back();
    }
  }
  for (const Live& l : live) {
    check(l);
    if (!h.rfree(l.p).ok()) bad++;
  }
  return bad;
}

TEST(RegionHeap, RandomAllocFreeNeverOverlaps) {
  Buffer b(512 * 1024);
  auto h = RegionHeap::Attach(b.span());
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(RandomWorkload(*h, 42, 20000), 0u);
  EXPECT_EQ(h->stats()->allocations, 0u);
  EXPECT_EQ(h->stats()->allocated, 0u);
}

// Three processes (fork; the test binary has no other threads here) share one memfd, each
// mapping it at its own address, and run the random workload on the one heap at once.
TEST(RegionHeapProcessStress, SharedMemfdNeverOverlaps) {
  ApplyFault();
  constexpr size_t kSize = 1 << 20;
  const int fd = memfd_create("rmalloc-test", 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kSize), 0);
  constexpr int kProcs = 3;
  // The children start together: each blocks reading this pipe until the parent closes it.
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcs; i++) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(go[1]);
      char c;
      if (read(go[0], &c, 1) != 0) _exit(5);
      void* m = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (m == MAP_FAILED) _exit(3);
      auto h = RegionHeap::Attach({static_cast<std::byte*>(m), kSize});
      if (!h.ok()) _exit(4);
      const size_t bad = RandomWorkload(*h, 1000 + i, 100000);
      if (bad != 0) std::fprintf(stderr, "child %d: %zu bad bytes or failed frees\n", i, bad);
      _exit(bad == 0 ? 0 : 1);
    }
    pids.push_back(pid);
  }
  close(go[0]);
  close(go[1]);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (pid_t pid : pids) {
    int status = -1;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);  // pid > 0: a child of ours
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << pid << " status " << status;
  }
  void* m = mmap(nullptr, kSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  auto h = RegionHeap::Attach({static_cast<std::byte*>(m), kSize});
  ASSERT_TRUE(h.ok());
  auto st = h->stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->allocations, 0u) << "every process freed what it allocated";
  munmap(m, kSize);
  close(fd);
}

}  // namespace
}  // namespace farmem
