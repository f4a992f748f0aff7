// TierStore: the mapped range (magic memfd / frame memfd per unit), promotion and demotion in the
// orders of tier_store.h (I2, I3), server-local reads and writes, the hotspot period. Threads: see
// tier_store.h.
#include "tier/engine/tier_store.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#if defined(__SANITIZE_THREAD__)
#define FARMEM_TIER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FARMEM_TIER_TSAN 1
#endif
#endif

#ifdef FARMEM_TIER_TSAN
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace farmem::tier {
namespace {

// TSan models mmap(MAP_FIXED) over live memory as a plain write to the range, which it would
// report as racing with the atomic loads of one-sided readers. The kernel swaps the pages in one
// step (readers see old or new pages), so ignore the imitated write (as block_allocator.cc does).
struct TsanIgnoreScope {
#ifdef FARMEM_TIER_TSAN
  TsanIgnoreScope() {
    __tsan_ignore_thread_begin();
  }
  ~TsanIgnoreScope() {
    __tsan_ignore_thread_end();
  }
#endif
};

#ifndef RAMFS_MAGIC
#define RAMFS_MAGIC 0x858458f6
#endif
#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

// "tmpfs"/"ramfs" when statfs says the file system keeps its files in memory, else nullptr.
const char* MemoryFsName(const struct statfs& st) {
  if (static_cast<unsigned long>(st.f_type) == TMPFS_MAGIC) return "tmpfs";
  if (static_cast<unsigned long>(st.f_type) == RAMFS_MAGIC) return "ramfs";
  return nullptr;
}

Status RefuseMemoryFs(const struct statfs& st, const std::string& path) {
  if (const char* fs = MemoryFsName(st)) {
    return Status::InvalidArgument("tier backing file " + path + " is on " + fs +
                                   ": the SSD tier would then be DRAM; put it on a disk");
  }
  return Status::OK();
}

// A block-aligned buffer for O_DIRECT IO.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t n)
      : p(static_cast<uint8_t*>(
            std::aligned_alloc(kPageSize, (n + kPageSize - 1) & ~(kPageSize - 1)))) {}
  ~AlignedBuffer() { std::free(p); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  uint8_t* p;
};

// Word-atomic copies into and out of a frame (through frames_rw_): every aligned 8-byte word is
// loaded and stored with one atomic access, partial words merged with a CAS, so concurrent writers
// of other bytes of a word, Read and one-sided readers never see a torn word. The frame address
// and the region offset agree modulo 8 (frames and units are page aligned).
void CopyIntoFrame(uint8_t* dst, const uint8_t* src, size_t n) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t end = p + n;
  for (uintptr_t q = p & ~uintptr_t{7}; q < end; q += 8) {
    auto* w = reinterpret_cast<uint64_t*>(q);
    const uintptr_t lo = std::max(p, q);
    const uintptr_t hi = std::min(end, q + 8);
    const uint8_t* s = src + (lo - p);
    if (lo == q && hi == q + 8) {
      __atomic_store_n(w, LoadWord(s), __ATOMIC_RELEASE);
      continue;
    }
    uint64_t old = __atomic_load_n(w, __ATOMIC_RELAXED);
    for (;;) {
      uint64_t nv = old;
      std::memcpy(reinterpret_cast<uint8_t*>(&nv) + (lo - q), s, hi - lo);
      if (__atomic_compare_exchange_n(w, &old, nv, false, __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
        break;
      }
    }
  }
}

void CopyFromFrame(uint8_t* dst, const uint8_t* src, size_t n) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(src);
  const uintptr_t end = p + n;
  for (uintptr_t q = p & ~uintptr_t{7}; q < end; q += 8) {
    const uint64_t v = __atomic_load_n(reinterpret_cast<const uint64_t*>(q), __ATOMIC_ACQUIRE);
    const uintptr_t lo = std::max(p, q);
    const uintptr_t hi = std::min(end, q + 8);
    std::memcpy(dst + (lo - p), reinterpret_cast<const uint8_t*>(&v) + (lo - q), hi - lo);
  }
}

// Locks the stripes of file blocks [first, end) in ascending stripe order (shared or exclusive).
class StripeLocks {
 public:
  StripeLocks(std::shared_mutex* stripes, size_t nstripes, uint64_t first, uint64_t end,
              bool exclusive)
      : stripes_(stripes), exclusive_(exclusive) {
    if (end - first >= nstripes) {
      for (size_t i = 0; i < nstripes; ++i) idx_.push_back(i);
    } else {
      for (uint64_t b = first; b < end; ++b) idx_.push_back(static_cast<size_t>(b % nstripes));
      std::sort(idx_.begin(), idx_.end());
      idx_.erase(std::unique(idx_.begin(), idx_.end()), idx_.end());
    }
    for (size_t i : idx_) {
      if (exclusive_) {
        stripes_[i].lock();
      } else {
        stripes_[i].lock_shared();
      }
    }
  }
  ~StripeLocks() {
    for (auto it = idx_.rbegin(); it != idx_.rend(); ++it) {
      if (exclusive_) {
        stripes_[*it].unlock();
      } else {
        stripes_[*it].unlock_shared();
      }
    }
  }
  StripeLocks(const StripeLocks&) = delete;
  StripeLocks& operator=(const StripeLocks&) = delete;

 private:
  std::shared_mutex* stripes_;
  bool exclusive_;
  std::vector<size_t> idx_;
};

// Mappings this process holds now (lines of /proc/self/maps).
uint64_t CurrentMapCount() {
  std::ifstream f("/proc/self/maps");
  uint64_t n = 0;
  std::string line;
  while (std::getline(f, line)) ++n;
  return n;
}

}  // namespace

Result<std::unique_ptr<TierStore>> TierStore::Open(const TierOptions& options) {
  std::unique_ptr<TierStore> s(new TierStore());
  FARMEM_RETURN_IF_ERROR(s->Init(options).WithContext("opening tiered store"));
  return s;
}

Status TierStore::Init(const TierOptions& o) {
  FARMEM_ASSIGN_OR_RETURN(geo_, TierGeometry::Make(o.capacity, o.unit_size));
  if (o.dram_budget == 0 || o.dram_budget % o.unit_size != 0) {
    return Status::InvalidArgument("DRAM budget must be a non-zero multiple of the unit size (" +
                                   std::to_string(o.unit_size) + "), got " +
                                   std::to_string(o.dram_budget));
  }
  frames_ = std::min(o.dram_budget / o.unit_size, geo_.unit_count);
  if (o.fill_percent == 0 || o.fill_percent > 100) {
    return Status::InvalidArgument("fill percent must be in 1..100, got " +
                                   std::to_string(o.fill_percent));
  }
  fill_percent_ = o.fill_percent;
  if (o.hysteresis_percent > TierPolicy::kMaxHysteresisPercent) {
    return Status::InvalidArgument("hysteresis percent must be at most " +
                                   std::to_string(TierPolicy::kMaxHysteresisPercent) + ", got " +
                                   std::to_string(o.hysteresis_percent));
  }
  hysteresis_percent_ = o.hysteresis_percent;
  hysteresis_heat_ = o.hysteresis_heat;
  fill_free_frames_ = o.fill_free_frames;
  if (o.magic_word != 0 && !IsValidMagic(o.magic_word)) {
    return Status::InvalidArgument("magic word must not be one byte repeated");
  }
  magic_ = o.magic_word != 0 ? o.magic_word : DrawMagicWord();
  if (o.path.empty()) return Status::InvalidArgument("tier backing file path is empty");
  if (o.io_rings == 0 || o.io_rings > 64) {
    return Status::InvalidArgument("io_rings must be in 1..64");
  }
  grace_ = o.faults.skip_grace ? std::function<Status()>() : o.grace;
  faults_ = o.faults;

  // One mapping per unit at worst (cold units each map the magic memfd at offset 0, so adjacent
  // ones do not merge), on top of what the process holds already.
  {
    std::ifstream f("/proc/sys/vm/max_map_count");
    uint64_t max_maps = 0;
    if (f >> max_maps) {
      const uint64_t in_use = CurrentMapCount();
      const uint64_t need = geo_.unit_count + in_use + 256;
      if (need > max_maps) {
        return Status::InvalidArgument(
            std::to_string(geo_.unit_count) + " units of " + std::to_string(geo_.unit_size) +
            " bytes need as many mappings, but vm.max_map_count is " + std::to_string(max_maps) +
            " (" + std::to_string(in_use) +
            " in use): use larger units, a smaller capacity, or raise vm.max_map_count");
      }
    }
  }

  // After the mapping check: the heat arrays are per unit, so a capacity refused there must not
  // allocate them first (2^40 B of 4 KiB units asked for gigabytes before the check moved).
  FARMEM_ASSIGN_OR_RETURN(heat_, TierHeat::Make(geo_.unit_count, o.heat_keep_percent));
  filled_.assign(geo_.unit_count, 0);

  // Backing file: refuse memory file systems before creating anything.
  {
    std::filesystem::path dir = std::filesystem::path(o.path).parent_path();
    if (dir.empty()) dir = ".";
    struct statfs st;
    if (statfs(dir.c_str(), &st) != 0) {
      return Status::FromErrno("statfs of the tier file's directory " + dir.string(), errno);
    }
    FARMEM_RETURN_IF_ERROR(RefuseMemoryFs(st, o.path));
  }
  const int flags = O_RDWR | O_CREAT | O_CLOEXEC | (o.direct_io ? O_DIRECT : 0);
  file_fd_ = open(o.path.c_str(), flags, 0600);
  if (file_fd_ < 0) {
    const int err = errno;
    if (err == EINVAL && o.direct_io) {
      return Status::InvalidArgument("the file system of " + o.path +
                                     " does not support O_DIRECT (direct_io = false to use the "
                                     "page cache)");
    }
    return Status::FromErrno("open " + o.path, err);
  }
  {
    struct statfs st;
    if (fstatfs(file_fd_, &st) != 0) return Status::FromErrno("fstatfs " + o.path, errno);
    FARMEM_RETURN_IF_ERROR(RefuseMemoryFs(st, o.path));
    struct stat sb;
    if (fstat(file_fd_, &sb) != 0) return Status::FromErrno("fstat " + o.path, errno);
    if (!S_ISREG(sb.st_mode)) return Status::InvalidArgument(o.path + " is not a regular file");
    if (static_cast<uint64_t>(sb.st_size) < geo_.capacity &&
        ftruncate(file_fd_, static_cast<off_t>(geo_.capacity)) != 0) {
      return Status::FromErrno("extending " + o.path + " to the tier capacity", errno);
    }
  }
  if (o.cached_reads && o.direct_io) {
    cached_fd_ = open(o.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (cached_fd_ < 0) return Status::FromErrno("open " + o.path + " (cached reads)", errno);
  }
  FARMEM_ASSIGN_OR_RETURN(
      io_,
      IoRings::Create(o.io_rings, 8,
                      IoRingFaults{o.faults.simulated_io_errno, o.faults.hold_io, o.faults.short_io,
                                   o.faults.accept_short_io, o.faults.ignore_io_errors}));

  // The magic memfd: one unit of pattern words, written with pwrite (a writable shared mapping
  // would forbid F_SEAL_WRITE), then sealed so nothing can change or resize it.
  magic_fd_ = memfd_create("farmem-tier-magic", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (magic_fd_ < 0) return Status::FromErrno("memfd_create (magic)", errno);
  if (ftruncate(magic_fd_, static_cast<off_t>(geo_.unit_size)) != 0) {
    return Status::FromErrno("ftruncate magic memfd", errno);
  }
  {
    std::vector<uint64_t> page(kWordsPerPage, magic_);
    for (uint64_t off = 0; off < geo_.unit_size; off += kPageSize) {
      if (pwrite(magic_fd_, page.data(), kPageSize, static_cast<off_t>(off)) !=
          static_cast<ssize_t>(kPageSize)) {
        return Status::FromErrno("writing the magic memfd", errno);
      }
    }
    if (fcntl(magic_fd_, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) !=
        0) {
      return Status::FromErrno("sealing the magic memfd", errno);
    }
  }

  frame_fd_ = memfd_create("farmem-tier-frames", MFD_CLOEXEC);
  if (frame_fd_ < 0) return Status::FromErrno("memfd_create (frames)", errno);
  if (ftruncate(frame_fd_, static_cast<off_t>(frames_ * geo_.unit_size)) != 0) {
    return Status::FromErrno("ftruncate frame memfd", errno);
  }
  void* m =
      mmap(nullptr, frames_ * geo_.unit_size, PROT_READ | PROT_WRITE, MAP_SHARED, frame_fd_, 0);
  if (m == MAP_FAILED) return Status::FromErrno("mapping the frames", errno);
  frames_rw_ = static_cast<uint8_t*>(m);

  // The range: reserve, then map every unit onto the magic memfd.
  m = mmap(nullptr, geo_.capacity, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return Status::FromErrno("reserving the tier range", errno);
  base_ = static_cast<uint8_t*>(m);
  for (uint64_t u = 0; u < geo_.unit_count; ++u) {
    FARMEM_RETURN_IF_ERROR(MapMagic(static_cast<uint32_t>(u)));
  }

  bitmap_len_ = (geo_.bitmap_bytes() + kPageSize - 1) & ~(kPageSize - 1);
  m = mmap(nullptr, bitmap_len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return Status::FromErrno("mapping the page bitmap", errno);
  bitmap_ = static_cast<uint64_t*>(m);

  units_ = std::make_unique<Unit[]>(geo_.unit_count);
  stripes_ = std::make_unique<std::shared_mutex[]>(kStripes);
  free_frames_.reserve(frames_);
  for (uint64_t f = frames_; f > 0; --f) free_frames_.push_back(static_cast<int32_t>(f - 1));
  return Status::OK();
}

TierStore::~TierStore() {
  if (units_ != nullptr && file_fd_ >= 0) (void)Sync();
  if (base_ != nullptr) munmap(base_, geo_.capacity);
  if (frames_rw_ != nullptr) munmap(frames_rw_, frames_ * geo_.unit_size);
  if (bitmap_ != nullptr) munmap(bitmap_, bitmap_len_);
  for (int fd : {file_fd_, cached_fd_, magic_fd_, frame_fd_}) {
    if (fd >= 0) close(fd);
  }
}

Status TierStore::MapMagic(uint32_t u) {
  [[maybe_unused]] TsanIgnoreScope ignore;
  void* r = mmap(UnitAddr(u), geo_.unit_size, PROT_READ, MAP_SHARED | MAP_FIXED | MAP_POPULATE,
                 magic_fd_, 0);
  if (r == MAP_FAILED) {
    const int err = errno;
    return Status::FromErrno("mapping the magic memfd over unit " + std::to_string(u) +
                                 (err == ENOMEM ? " (vm.max_map_count reached?)" : ""),
                             err);
  }
  return Status::OK();
}

void TierStore::SetBits(uint32_t u, bool resident) {
  const uint64_t first = uint64_t{u} * geo_.pages_per_unit;
  const uint64_t last = first + geo_.pages_per_unit - 1;
  for (uint64_t w = BitmapWordOf(first); w <= BitmapWordOf(last); ++w) {
    const uint64_t bits = UnitBitsInWord(u, geo_.pages_per_unit, w);
    if (resident) {
      __atomic_fetch_or(&bitmap_[w], bits, __ATOMIC_SEQ_CST);
    } else {
      __atomic_fetch_and(&bitmap_[w], ~bits, __ATOMIC_SEQ_CST);
    }
  }
}

bool TierStore::IsResident(uint32_t unit) const {
  return unit < geo_.unit_count && units_[unit].frame.load(std::memory_order_acquire) >= 0;
}

std::vector<uint8_t> TierStore::Residency() const {
  std::vector<uint8_t> r(geo_.unit_count);
  for (uint64_t u = 0; u < geo_.unit_count; ++u) {
    r[u] = units_[u].frame.load(std::memory_order_acquire) >= 0 ? 1 : 0;
  }
  return r;
}

// ---- promotion and demotion ---------------------------------------------------------------------

void TierStore::RetryQuarantine() {
  bool any;
  {
    std::lock_guard<std::mutex> fl(frames_mu_);
    any = !quarantine_.empty() && free_frames_.empty();
  }
  if (any) (void)ReleaseFrames({});  // a failure keeps them quarantined and is counted
}

Status TierStore::Promote(uint32_t u) {
  if (u >= geo_.unit_count) {
    return Status::OutOfRange("promote: unit " + std::to_string(u) + " of " +
                              std::to_string(geo_.unit_count));
  }
  // Frames whose grace period failed get another one here, before any lock is taken.
  RetryQuarantine();
  Unit& s = units_[u];
  std::unique_lock<std::shared_mutex> lock(s.mu);
  if (s.frame.load(std::memory_order_relaxed) >= 0) return Status::OK();
  int32_t f;
  {
    std::lock_guard<std::mutex> fl(frames_mu_);
    if (free_frames_.empty()) {
      return Status::ResourceExhausted("promote unit " + std::to_string(u) +
                                       ": every DRAM frame is in use (budget " +
                                       std::to_string(frames_) + " units, " +
                                       std::to_string(quarantine_.size()) + " in quarantine)");
    }
    f = free_frames_.back();
    free_frames_.pop_back();
  }
  auto give_back = [&] {
    std::lock_guard<std::mutex> fl(frames_mu_);
    free_frames_.push_back(f);
  };
  // I3: file -> frame (never reachable through the range yet) -> map -> resident -> bits.
  Status st = io_->Read(file_fd_, FrameRw(f), geo_.unit_size, uint64_t{u} * geo_.unit_size);
  if (!st.ok()) {
    give_back();
    return st.WithContext("promote unit " + std::to_string(u));
  }
  io_read_bytes_.fetch_add(geo_.unit_size, std::memory_order_relaxed);
  {
    [[maybe_unused]] TsanIgnoreScope ignore;
    void* r = mmap(UnitAddr(u), geo_.unit_size, PROT_READ, MAP_SHARED | MAP_FIXED | MAP_POPULATE,
                   frame_fd_, static_cast<off_t>(uint64_t(f) * geo_.unit_size));
    if (r == MAP_FAILED) {
      const int err = errno;
      // The unit may now be unmapped: put the magic memfd back before anything else.
      Status back = MapMagic(u);
      give_back();
      if (!back.ok()) return back.WithContext("promote unit " + std::to_string(u));
      return Status::FromErrno("promote unit " + std::to_string(u) + ": mapping its frame", err);
    }
  }
  s.dirty.store(false, std::memory_order_relaxed);
  s.frame.store(f, std::memory_order_release);
  resident_.fetch_add(1, std::memory_order_relaxed);
  SetBits(u, true);
  promotions_.fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

Status TierStore::WriteBackLocked(uint32_t u, Unit& s) {
  const int32_t f = s.frame.load(std::memory_order_relaxed);
  FARMEM_RETURN_IF_ERROR(
      io_->Write(file_fd_, FrameRw(f), geo_.unit_size, uint64_t{u} * geo_.unit_size)
          .WithContext("writing back unit " + std::to_string(u)));
  s.dirty.store(false, std::memory_order_relaxed);
  io_write_bytes_.fetch_add(geo_.unit_size, std::memory_order_relaxed);
  writebacks_.fetch_add(1, std::memory_order_relaxed);
  return Status::OK();
}

Result<int32_t> TierStore::DetachLocked(uint32_t u, Unit& s) {
  const int32_t f = s.frame.load(std::memory_order_relaxed);
  SetBits(u, false);
  if (s.dirty.load(std::memory_order_relaxed)) {
    Status st = WriteBackLocked(u, s);
    if (!st.ok() && !faults_.demote_despite_failed_writeback) {
      SetBits(u, true);  // stays resident: the frame holds the only copy
      return st;
    }
  }
  Status st = MapMagic(u);
  if (!st.ok()) {
    SetBits(u, true);
    return st;
  }
  s.frame.store(-1, std::memory_order_release);
  resident_.fetch_sub(1, std::memory_order_relaxed);
  demotions_.fetch_add(1, std::memory_order_relaxed);
  return f;
}

Status TierStore::ReleaseFrames(std::vector<int32_t> frames) {
  {
    std::lock_guard<std::mutex> fl(frames_mu_);
    frames.insert(frames.end(), quarantine_.begin(), quarantine_.end());
    quarantine_.clear();
  }
  if (frames.empty()) return Status::OK();
  if (grace_) {
    Status st = grace_();
    if (!st.ok()) {
      grace_failures_.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard<std::mutex> fl(frames_mu_);
      quarantine_.insert(quarantine_.end(), frames.begin(), frames.end());
      return st.WithContext("grace period before reusing " + std::to_string(frames.size()) +
                            " frame(s) (kept out of use until one passes)");
    }
  }
  Status first;
  std::vector<int32_t> clean;
  for (int32_t f : frames) {
    if (fallocate(frame_fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                  static_cast<off_t>(uint64_t(f) * geo_.unit_size),
                  static_cast<off_t>(geo_.unit_size)) != 0) {
      // Not reused: a pinned reader could otherwise see the next unit. One frame less.
      if (first.ok())
        first =
            Status::FromErrno("punching frame " + std::to_string(f) + " (frame retired)", errno);
      continue;
    }
    clean.push_back(f);
  }
  std::lock_guard<std::mutex> fl(frames_mu_);
  free_frames_.insert(free_frames_.end(), clean.begin(), clean.end());
  return first;
}

Status TierStore::Demote(uint32_t u) {
  if (u >= geo_.unit_count) {
    return Status::OutOfRange("demote: unit " + std::to_string(u) + " of " +
                              std::to_string(geo_.unit_count));
  }
  int32_t f;
  {
    Unit& s = units_[u];
    std::unique_lock<std::shared_mutex> lock(s.mu);
    if (s.frame.load(std::memory_order_relaxed) < 0) return Status::OK();
    FARMEM_ASSIGN_OR_RETURN(f, DetachLocked(u, s));
  }
  return ReleaseFrames({f}).WithContext("demote unit " + std::to_string(u));
}

Status TierStore::Sync() {
  Status first;
  for (uint64_t u = 0; u < geo_.unit_count; ++u) {
    Unit& s = units_[u];
    if (!s.dirty.load(std::memory_order_relaxed)) continue;
    std::unique_lock<std::shared_mutex> lock(s.mu);
    if (s.frame.load(std::memory_order_relaxed) < 0 || !s.dirty.load(std::memory_order_relaxed)) {
      continue;
    }
    Status st = WriteBackLocked(static_cast<uint32_t>(u), s);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

Result<TierPeriodReport> TierStore::RunPeriod(std::span<const uint64_t> counts,
                                              std::chrono::steady_clock::time_point fill_until) {
  if (counts.size() != geo_.unit_count) {
    return Status::InvalidArgument("period: " + std::to_string(counts.size()) + " counts for " +
                                   std::to_string(geo_.unit_count) + " units");
  }
  RetryQuarantine();
  std::lock_guard<std::mutex> period(heat_mu_);
  std::vector<uint8_t> resident = Residency();
  FARMEM_ASSIGN_OR_RETURN(const TierHeat::Update up, heat_.Add(counts, resident));
  // Filled units keep their mark until someone counts them (or they went cold meanwhile).
  for (size_t u = 0; u < resident.size(); ++u) {
    if (filled_[u] != 0 && (counts[u] != 0 || resident[u] == 0)) filled_[u] = 0;
    if (filled_[u] != 0) resident[u] = 2;
  }
  TierPeriodReport rep;
  auto note = [&](const Status& st) {
    if (!st.ok() && rep.error.ok()) rep.error = st;
  };
  bool out_of_frames = false;
  if (up.accessed) {  // else no information this period: the policy keeps the resident set
    rep.shifted = up.shifted;
    rep.following = up.following;
    const bool free_ranking = up.free_ranking();
    FARMEM_ASSIGN_OR_RETURN(
        TierPolicyDecision d,
        TierPolicy::Decide(TierPolicyInput{
            heat_.heat(), resident, frames_, fill_percent_, free_ranking ? 0 : hysteresis_percent_,
            free_ranking ? 0 : TierHeat::FromAccesses(hysteresis_heat_)}));
    rep.uniform = d.uniform;
    rep.target_units = d.target_units;
    // Demote first (frees frames), with one grace period for all of them.
    std::vector<int32_t> frames;
    for (uint32_t u : d.demote) {
      Unit& s = units_[u];
      std::unique_lock<std::shared_mutex> lock(s.mu);
      if (s.frame.load(std::memory_order_relaxed) < 0) continue;
      Result<int32_t> f = DetachLocked(u, s);
      if (!f.ok()) {
        note(f.status());
        continue;
      }
      frames.push_back(*f);
      rep.demoted.push_back(u);
    }
    if (!frames.empty()) note(ReleaseFrames(std::move(frames)));
    for (uint32_t u : d.promote) {
      Status st = Promote(u);
      if (st.ok()) {
        rep.promoted.push_back(u);
      } else {
        note(st);
        if (st.code() == Code::kResourceExhausted) {
          out_of_frames = true;
          break;
        }
      }
    }
  } else {
    rep.target_units = TierPolicy::TargetFor(frames_, geo_.unit_count, fill_percent_);
  }
  // Not after a failure: a device that just failed a promotion or a write-back is not read
  // ahead of need; the next period tries again.
  if (fill_free_frames_ && !out_of_frames && rep.error.ok()) FillFreeRoom(rep, fill_until);
  return rep;
}

void TierStore::FillFreeRoom(TierPeriodReport& rep, std::chrono::steady_clock::time_point until) {
  // Only units whose heat is 0: every counted cold unit the target had room for was promoted by
  // the policy just now, so the ones still cold were ranked out (or failed) and must stay cold.
  const std::span<const uint64_t> heat = heat_.heat();
  const uint32_t n = static_cast<uint32_t>(geo_.unit_count);
  uint32_t looked = 0;
  while (resident_.load(std::memory_order_relaxed) < rep.target_units && looked < n) {
    if (std::chrono::steady_clock::now() >= until) {
      rep.fill_cut = true;
      return;
    }
    const uint32_t u = fill_cursor_;
    fill_cursor_ = fill_cursor_ + 1 == n ? 0 : fill_cursor_ + 1;
    ++looked;
    if (heat[u] != 0 || IsResident(u)) continue;
    Status st = Promote(u);
    if (!st.ok()) {
      // A failed fill is an error of this period like any other; the next period tries again.
      if (rep.error.ok()) rep.error = st.WithContext("filling free frames");
      return;
    }
    rep.filled.push_back(u);
    filled_[u] = 1;
    fills_.fetch_add(1, std::memory_order_relaxed);
  }
}

// ---- reads and writes ------------------------------------------------------------------------

Status TierStore::ColdRead(uint64_t offset, uint8_t* out, size_t n) {
  const uint64_t a = offset & ~(kPageSize - 1);
  const uint64_t b = (offset + n + kPageSize - 1) & ~(kPageSize - 1);
  AlignedBuffer buf(b - a);
  if (buf.p == nullptr) return Status::ResourceExhausted("no memory for a tier read buffer");
  {
    StripeLocks locks(stripes_.get(), kStripes, a / kPageSize, b / kPageSize, false);
    // Cached reads: a buffered RWF_NOWAIT read returns at once, either every byte from the page
    // cache or EAGAIN / a short count (some page is not cached), and then the O_DIRECT read. The
    // stripe locks order it against cold writes of the same blocks, whose O_DIRECT writes
    // invalidate the cached pages they cover.
    bool hit = false;
    if (cached_fd_ >= 0) {
      iovec iov{buf.p, b - a};
      hit = preadv2(cached_fd_, &iov, 1, static_cast<off_t>(a), RWF_NOWAIT) ==
            static_cast<ssize_t>(b - a);
      (hit ? cached_read_hits_ : cached_read_misses_).fetch_add(1, std::memory_order_relaxed);
    }
    if (!hit) {
      FARMEM_RETURN_IF_ERROR(io_->Read(file_fd_, buf.p, b - a, a));
      io_read_bytes_.fetch_add(b - a, std::memory_order_relaxed);
    }
  }
  std::memcpy(out, buf.p + (offset - a), n);
  return Status::OK();
}

Status TierStore::ColdWrite(uint64_t offset, const uint8_t* data, size_t n) {
  const uint64_t end = offset + n;
  const uint64_t a = offset & ~(kPageSize - 1);
  const uint64_t b = (end + kPageSize - 1) & ~(kPageSize - 1);
  AlignedBuffer buf(b - a);
  if (buf.p == nullptr) return Status::ResourceExhausted("no memory for a tier write buffer");
  StripeLocks locks(stripes_.get(), kStripes, a / kPageSize, b / kPageSize, true);
  // Read-modify-write of the partial first and last blocks, under their exclusive stripe locks.
  const bool head_partial = offset != a;
  const bool tail_partial = end != b;
  if (head_partial) {
    FARMEM_RETURN_IF_ERROR(io_->Read(file_fd_, buf.p, kPageSize, a));
    io_read_bytes_.fetch_add(kPageSize, std::memory_order_relaxed);
  }
  if (tail_partial && !(head_partial && b - a == kPageSize)) {
    FARMEM_RETURN_IF_ERROR(
        io_->Read(file_fd_, buf.p + (b - a - kPageSize), kPageSize, b - kPageSize));
    io_read_bytes_.fetch_add(kPageSize, std::memory_order_relaxed);
  }
  std::memcpy(buf.p + (offset - a), data, n);
  FARMEM_RETURN_IF_ERROR(io_->Write(file_fd_, buf.p, b - a, a));
  io_write_bytes_.fetch_add(b - a, std::memory_order_relaxed);
  return Status::OK();
}

Status TierStore::ReadRange(uint64_t offset, uint8_t* out, size_t n) {
  while (n > 0) {
    const uint32_t u = static_cast<uint32_t>(offset / geo_.unit_size);
    const uint64_t in_unit = offset - uint64_t{u} * geo_.unit_size;
    const size_t part = static_cast<size_t>(std::min<uint64_t>(n, geo_.unit_size - in_unit));
    Unit& s = units_[u];
    {
      std::shared_lock<std::shared_mutex> lock(s.mu);
      const int32_t f = s.frame.load(std::memory_order_relaxed);
      if (f >= 0) {
        CopyFromFrame(out, FrameRw(f) + in_unit, part);
        reads_dram_.fetch_add(1, std::memory_order_relaxed);
        read_bytes_dram_.fetch_add(part, std::memory_order_relaxed);
      } else {
        FARMEM_RETURN_IF_ERROR(ColdRead(offset, out, part));
        reads_file_.fetch_add(1, std::memory_order_relaxed);
        read_bytes_file_.fetch_add(part, std::memory_order_relaxed);
      }
    }
    offset += part;
    out += part;
    n -= part;
  }
  return Status::OK();
}

Status TierStore::Read(uint64_t offset, std::span<uint8_t> out) {
  FARMEM_RETURN_IF_ERROR(geo_.CheckRange(offset, out.size()).WithContext("tier read"));
  return ReadRange(offset, out.data(), out.size());
}

Status TierStore::ReadPages(uint64_t offset, std::span<uint8_t> out,
                            std::span<const uint64_t> page_mask) {
  FARMEM_RETURN_IF_ERROR(geo_.CheckRange(offset, out.size()).WithContext("tier sparse read"));
  FARMEM_RETURN_IF_ERROR(
      CheckPageMask(offset, out.size(), page_mask).WithContext("tier sparse read"));
  const uint64_t pages = PagesSpanned(offset, out.size());
  const uint64_t first_page = offset / kPageSize;
  const uint64_t end = offset + out.size();
  uint64_t i = 0;
  while (i < pages) {
    if (!BitmapTest(page_mask, i)) {
      ++i;
      continue;
    }
    uint64_t j = i;
    while (j < pages && BitmapTest(page_mask, j)) ++j;  // run [i, j) of listed pages
    const uint64_t lo = std::max(offset, (first_page + i) * kPageSize);
    const uint64_t hi = std::min(end, (first_page + j) * kPageSize);
    FARMEM_RETURN_IF_ERROR(ReadRange(lo, out.data() + (lo - offset), hi - lo));
    i = j;
  }
  return Status::OK();
}

Status TierStore::Write(uint64_t offset, std::span<const uint8_t> data) {
  FARMEM_RETURN_IF_ERROR(geo_.CheckRange(offset, data.size()).WithContext("tier write"));
  const uint8_t* p = data.data();
  size_t n = data.size();
  while (n > 0) {
    const uint32_t u = static_cast<uint32_t>(offset / geo_.unit_size);
    const uint64_t in_unit = offset - uint64_t{u} * geo_.unit_size;
    const size_t part = static_cast<size_t>(std::min<uint64_t>(n, geo_.unit_size - in_unit));
    Unit& s = units_[u];
    {
      // I4: shared for the whole part, so a promotion or demotion of u waits for it.
      std::shared_lock<std::shared_mutex> lock(s.mu);
      const int32_t f = s.frame.load(std::memory_order_relaxed);
      if (f >= 0) {
        CopyIntoFrame(FrameRw(f) + in_unit, p, part);
        s.dirty.store(true, std::memory_order_relaxed);
        writes_dram_.fetch_add(1, std::memory_order_relaxed);
      } else {
        FARMEM_RETURN_IF_ERROR(ColdWrite(offset, p, part).WithContext("tier write"));
        writes_file_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    offset += part;
    p += part;
    n -= part;
  }
  return Status::OK();
}

TierStats TierStore::Stats() const {
  TierStats s;
  s.capacity = geo_.capacity;
  s.unit_size = geo_.unit_size;
  s.unit_count = geo_.unit_count;
  s.budget_units = frames_;
  s.resident_units = resident_.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> fl(frames_mu_);
    s.quarantined_frames = quarantine_.size();
    s.free_frames = free_frames_.size();
  }
  s.promotions = promotions_.load(std::memory_order_relaxed);
  s.fills = fills_.load(std::memory_order_relaxed);
  s.demotions = demotions_.load(std::memory_order_relaxed);
  s.writebacks = writebacks_.load(std::memory_order_relaxed);
  s.grace_failures = grace_failures_.load(std::memory_order_relaxed);
  s.io_read_bytes = io_read_bytes_.load(std::memory_order_relaxed);
  s.io_write_bytes = io_write_bytes_.load(std::memory_order_relaxed);
  s.reads_dram = reads_dram_.load(std::memory_order_relaxed);
  s.reads_file = reads_file_.load(std::memory_order_relaxed);
  s.read_bytes_dram = read_bytes_dram_.load(std::memory_order_relaxed);
  s.read_bytes_file = read_bytes_file_.load(std::memory_order_relaxed);
  s.writes_dram = writes_dram_.load(std::memory_order_relaxed);
  s.writes_file = writes_file_.load(std::memory_order_relaxed);
  s.cached_read_hits = cached_read_hits_.load(std::memory_order_relaxed);
  s.cached_read_misses = cached_read_misses_.load(std::memory_order_relaxed);
  s.io_short_completions = io_->short_completions();
  s.io_errors = io_->errors();
  return s;
}

}  // namespace farmem::tier
