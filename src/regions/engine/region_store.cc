// RegionStore implementation: the file-system operations (the mirror of the cluster store and the
// multi-mount protocol are in region_store_mirror.cc). Lock order: an inode's `open_mu`, then its
// `io` lock, then mu_. Reads and writes hold `io` shared and truncates/fallocates/reclaims hold
// it exclusive while their one-sided operations run, so no chunk is freed (and possibly handed to
// another region) while an operation of this mount may touch it; other mounts are kept off by
// this mount's open records. Writes to one inode overlap: each claims a span of bytes (under mu_)
// and waits only for claimed spans it overlaps. Every change of the store is a compare-and-set on
// the records it was computed from (CommitApply); when another mount changed one first, the
// change is computed again on the refreshed records.
// Invariant: every byte of an allocated chunk at or past the inode's size is zero (reused chunks
// are zeroed where a write does not cover them, never-used ones are zero from ALLOC_RAW; a shrink
// zeroes the tail of its last chunk).
#include "regions/engine/region_store.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_set>

#include "common/log.h"
#include "regions/engine/chunk_io.h"
#include "regions/engine/store_internal.h"

namespace farmem::regions {

namespace internal {

// Test-only protections that FARMEM_REGIONS_FAULT removes (docs/regions.md "Tests"):
//   no_zero: fresh chunks are not zeroed where a write does not cover them;
//   no_tail: a shrink does not zero the tail of its last chunk;
//   no_pin: an unlinked or shrunk inode's chunks are freed while handles still have it open;
//   no_onewriter: ONEWRITER lets a second writer in;
//   no_rollback: a write or fallocate that ran out of memory keeps the chunks it did get;
//   no_prealloc: fallocate mode 0 / KEEP_SIZE sets the size but allocates nothing;
//   no_punch_zero: PUNCH_HOLE leaves the covered bytes of partial chunks as they were;
//   no_zero_range: ZERO_RANGE leaves the bytes of chunks it already had as they were;
//   no_reap: regions of an exited owner are not deleted;
//   no_revoke: they are deleted, but handles still open keep reading and writing them;
//   reap_persistent: PERSISTENT regions are deleted with their owner too;
//   no_hostalloc: chunks are placed as if HOSTALLOC were empty (all servers);
//   no_rewatch: owners recorded in loaded metadata are not watched again;
//   no_touched: every fresh chunk is taken as never used (zeroed), reused ones too;
//   no_thread_defaults: new regions ignore their creating thread's rsetdefaultattr defaults;
//   no_range_lock: a write does not wait for in-flight writes whose span it overlaps;
//   serial_writes: writes to one inode go one at a time (io exclusive), as before they
//     overlapped (a switch that must not break anything: the stress test passes with it);
//   no_meta_rollback: setattr, setxattr and write keep their change in memory when its metadata
//     write fails (the live namespace then differs from the store's);
//   free_unit_first: an empty unit goes back to its server before its record is removed (a failed
//     removal leaves a record naming memory the server may hand to someone else);
//   no_io_errors: a read or write whose remote transfers failed reports success (a read then
//     returns whatever its buffer held);
//   split_rename: rename writes its records one at a time instead of in one transaction (cut
//     short between two of them, it leaves two names for one inode);
//   no_truncate_rollback: a shrink whose tail zeroing failed keeps its new size (the EIO then
//     comes with the size changed and the cut bytes still in the chunk);
//   keep_orphans: Load refuses inode records no name leads to (left by a delete or create cut
//     short by a failed metadata write) instead of dropping or reclaiming them.
// And of the multi-mount protocol (docs/regions.md "Several mounts"):
//   no_create_cas: create/mkdir/symlink commit without checking that the name is still free
//     (racing creates in two mounts both succeed);
//   no_write_cas: a write records its map and size without checking the record it started from
//     (concurrent writers in two mounts lose each other's chunks);
//   no_open_check: chunks are freed without asking whether another mount has the inode open;
//   no_open_sync: opens and lookups of unknown names use what the watch delivered so far instead
//     of reading the store (close-to-open then depends on the watch's delay);
//   no_cluster_onewriter: ONEWRITER is enforced per mount only;
//   no_fence: data calls go on while this mount's lease is unconfirmed or lost;
//   no_unit_owner: a mount allocates chunks from any unit, not only its own;
//   no_hostless_reap: regions whose owner's host has no mount left are kept (nobody watches
//     their owner any more);
//   no_taken_check: a write records its new chunks over chunks another write recorded for the
//     same holes meanwhile (that write's bytes are lost);
//   no_vaddr_cas: a FIXVADDR slot is taken without checking that no other region holds it (two
//     mounts may give two regions one address);
//   unbound_opens: open records are plain keys, not bound to the mount's lease (a killed mount's
//     open files are then never freed).
bool Fault(std::string_view name) {
  static const std::string fault = [] {
    const char* e = std::getenv("FARMEM_REGIONS_FAULT");
    return std::string(e ? e : "");
  }();
  return fault == name;
}

Status Err(int e, std::string_view what) {
  const char* n = "EIO";
  switch (e) {
    case ENOENT:
      n = "ENOENT";
      break;
    case EEXIST:
      n = "EEXIST";
      break;
    case ENOTDIR:
      n = "ENOTDIR";
      break;
    case EISDIR:
      n = "EISDIR";
      break;
    case ENOTEMPTY:
      n = "ENOTEMPTY";
      break;
    case ENOSPC:
      n = "ENOSPC";
      break;
    case EBUSY:
      n = "EBUSY";
      break;
    case EINVAL:
      n = "EINVAL";
      break;
    case EFBIG:
      n = "EFBIG";
      break;
    case ENAMETOOLONG:
      n = "ENAMETOOLONG";
      break;
    case ENODATA:
      n = "ENODATA";
      break;
    case EPERM:
      n = "EPERM";
      break;
    case EBADF:
      n = "EBADF";
      break;
    case ENOTSUP:
      n = "ENOTSUP";
      break;
    default:
      break;
  }
  std::string msg = std::string(n) + ": " + std::string(what);
  switch (e) {
    case ENOENT:
    case ENODATA:
      return Status::NotFound(msg);
    case EEXIST:
    case ENOTEMPTY:
    case EBUSY:
      return Status::FailedPrecondition(msg);
    case ENOSPC:
      return Status::ResourceExhausted(msg);
    case EIO:
      return Status::IoError(msg);
    default:
      return Status::InvalidArgument(msg);
  }
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string ProcStartTime(int32_t pid) {
  if (pid <= 0) return "";
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return "";
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (p == nullptr || p[1] == 0) return "";
  char state = 0;
  unsigned long long start = 0;
  // After ") ": state (field 3) ... starttime (field 22): skip 18 fields after the state.
  if (std::sscanf(p + 2,
                  "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                  &state, &start) != 2 ||
      state == 'Z' || state == 'X')
    return "";
  return std::to_string(start);
}

int32_t TgidOf(int32_t tid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(tid) + "/status").c_str(), "r");
  if (f == nullptr) return tid;
  char line[256];
  int32_t tgid = tid;
  while (std::fgets(line, sizeof(line), f) != nullptr)
    if (std::sscanf(line, "Tgid: %d", &tgid) == 1) break;
  std::fclose(f);
  return tgid > 0 ? tgid : tid;
}

Status CheckName(std::string_view name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string_view::npos ||
      name.find('\0') != std::string_view::npos)
    return Err(EINVAL, "bad file name");
  if (name.size() > 255) return Err(ENAMETOOLONG, "file name longer than 255 bytes");
  return Status::OK();
}

std::string InodeKey(uint64_t ino) {
  return "inode/" + std::to_string(ino);
}
std::string DirentKey(uint64_t parent, std::string_view name) {
  return "dirent/" + std::to_string(parent) + "/" + std::string(name);
}
std::string DirentValue(uint64_t child) {
  DirentRecord d{child};
  return std::string(reinterpret_cast<const char*>(&d), sizeof(d));
}
std::string OpenKey(uint64_t ino, std::string_view mount) {
  return OpenPrefix(ino) + std::string(mount);
}
std::string OpenPrefix(uint64_t ino) {
  return "open/" + std::to_string(ino) + "/";
}
std::string FreePrefix(uint64_t ino) {
  return "free/" + std::to_string(ino) + "/";
}

}  // namespace internal

using internal::CheckName;
using internal::DirentKey;
using internal::DirentValue;
using internal::Err;
using internal::Fault;
using internal::InodeKey;
using internal::kMaxConflicts;
using internal::kNoServer;
using internal::NowNs;

namespace {

using Piece = ChunkPiece;

const std::byte* ZeroChunk() {
  static const std::vector<std::byte> zeros(kChunkBytes);
  return zeros.data();
}

// RunChunkPieces, with every failure the store's EIO (a user of the mount sees errno EIO).
Status RunPieces(Scheduler& s, const std::vector<Piece>& pieces, bool write) {
  Status run = RunChunkPieces(s, pieces, write);
  if (Fault("no_io_errors")) return Status::OK();
  if (!run.ok())
    return Err(EIO, "remote " + std::string(write ? "write" : "read") + ": " + run.ToString());
  return Status::OK();
}

Status KeptChanging(std::string_view what) {
  return Err(EIO, std::string(what) + ": other mounts kept changing the records it needs");
}

}  // namespace

Status ErrnoStatus(int e, std::string_view what) {
  return Err(e, what);
}

int ErrnoOf(const Status& s) {
  if (s.ok()) return 0;
  static const std::pair<const char*, int> kNames[] = {{"ENOENT:", ENOENT},
                                                       {"EEXIST:", EEXIST},
                                                       {"ENOTDIR:", ENOTDIR},
                                                       {"EISDIR:", EISDIR},
                                                       {"ENOTEMPTY:", ENOTEMPTY},
                                                       {"ENOSPC:", ENOSPC},
                                                       {"EBUSY:", EBUSY},
                                                       {"EINVAL:", EINVAL},
                                                       {"EFBIG:", EFBIG},
                                                       {"ENAMETOOLONG:", ENAMETOOLONG},
                                                       {"ENODATA:", ENODATA},
                                                       {"EPERM:", EPERM},
                                                       {"EBADF:", EBADF},
                                                       {"ENOTSUP:", ENOTSUP},
                                                       {"EIO:", EIO}};
  for (const auto& [n, e] : kNames)
    if (s.message().starts_with(n)) return e;
  if (s.code() == Code::kResourceExhausted) return ENOSPC;
  if (s.code() == Code::kNotFound) return ENOENT;
  return EIO;
}

RegionStore::RegionStore(Node& node, MetaStore& meta, RegionStoreOptions options)
    : node_(node), meta_(meta), options_(std::move(options)) {}

RegionStore::~RegionStore() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  house_cv_.notify_all();
  changes_cv_.notify_all();
  if (housekeeper_.joinable()) housekeeper_.join();
  if (watch_) watch_->cancel();  // waits for a running callback (which takes mu_)
  watch_.reset();
  // What this store held in the cluster store goes with it (best effort: its lease ends them
  // anyway, and a later store of the same member removes stale open records at Load).
  std::vector<std::shared_ptr<Inode>> held;
  for (auto& [ino, in] : inodes_)
    if (in->published || in->writer_claimed) held.push_back(in);
  for (auto& in : held) {
    if (in->published) (void)meta_.remove(internal::OpenKey(in->rec.h.ino, mount_id_));
    if (in->writer_claimed)
      (void)meta_.commit({{"writer/" + std::to_string(in->rec.h.ino), mount_id_}},
                         {{"writer/" + std::to_string(in->rec.h.ino), std::nullopt}});
  }
  if (!mount_id_.empty()) (void)meta_.remove("mount/" + mount_id_);
  for (auto& [pid, fd] : owners_)
    if (fd >= 0) close(fd);
  {
    std::lock_guard lk(sched_mu_);
    scheds_.clear();
  }
  if (!options_.persistent_units) {
    // Session units go with the clients' sessions anyway; free them now so the servers see it
    // at once.
    std::lock_guard lk(mu_);
    for (auto& [gid, u] : units_)
      if (u->server != kNoServer && unit_owners_.contains(static_cast<uint32_t>(gid)) &&
          unit_owners_[static_cast<uint32_t>(gid)] == mount_id_)
        (void)servers_[u->server]->client->free_raw(u->base);
  }
}

Result<std::unique_ptr<RegionStore>> RegionStore::Open(Node& node, MetaStore& meta,
                                                       RegionStoreOptions options) {
  if (options.servers.empty()) return Status::InvalidArgument("regions: no memory server given");
  std::unique_ptr<RegionStore> s(new RegionStore(node, meta, std::move(options)));
  for (const std::string& a : s->options_.servers) {
    RawClientOptions ro;
    ro.session_ttl = s->options_.session_ttl;
    auto c = RawClient::Connect(node, a, ro);
    if (!c.ok())
      return Status(c.status().code(), "regions: server " + a + ": " + c.status().ToString());
    auto srv = std::make_unique<Server>();
    srv->address = a;
    srv->client = std::move(*c);
    s->servers_.push_back(std::move(srv));
  }
  FARMEM_RETURN_IF_ERROR(meta.join());
  s->mount_id_ = meta.mount_id();
  s->host_id_ = s->options_.host_id.empty() ? LocalHostId() : s->options_.host_id;
  FARMEM_RETURN_IF_ERROR(s->Load());
  // This mount, for the others: its host (OWNERPID) and that it lives (the key goes with its
  // lease).
  const std::string mkey = "mount/" + s->mount_id_;
  auto reg =
      meta.put_bound(mkey, EncodeMount({s->host_id_, static_cast<int32_t>(getpid())}), false);
  if (!reg.ok()) return reg.status();
  {
    std::lock_guard lk(s->mu_);
    s->ApplyKey(mkey, EncodeMount({s->host_id_, static_cast<int32_t>(getpid())}), *reg, false);
  }
  s->ProbeLease();
  s->AdoptOrphanUnits(/*wait=*/true);
  // Unlinked files no mount has open any more, and chunks parked for them: freed now.
  std::vector<std::shared_ptr<Inode>> nameless;
  std::set<uint64_t> parked;
  {
    std::lock_guard lk(s->mu_);
    for (auto& [ino, in] : s->inodes_)
      if (!in->is_dir() && in->rec.h.nlink == 0) nameless.push_back(in);
    for (auto& [key, p] : s->frees_) parked.insert(p.ino);
  }
  for (auto& in : nameless) {
    s->TryReclaim(in);
    std::lock_guard lk(s->mu_);
    if (in->reclaimed) s->orphans_dropped_++;
  }
  for (uint64_t ino : parked) s->TryFree(ino);
  s->housekeeper_ = std::thread([p = s.get()] { p->Housekeep(); });
  return s;
}

Scheduler& RegionStore::Sched() {
  std::lock_guard lk(sched_mu_);
  auto& s = scheds_[std::this_thread::get_id()];
  if (!s) {
    auto made = node_.make_scheduler();
    if (!made.ok()) std::abort();  // the node is started; a scheduler cannot fail then
    s = std::move(*made);
  }
  return *s;
}

Result<std::shared_ptr<RegionStore::Inode>> RegionStore::Get(uint64_t ino) {
  auto it = inodes_.find(ino);
  if (it == inodes_.end()) return Err(ENOENT, "no inode " + std::to_string(ino));
  return it->second;
}

Result<std::shared_ptr<RegionStore::Inode>> RegionStore::GetDir(uint64_t ino) {
  FARMEM_ASSIGN_OR_RETURN(auto in, Get(ino));
  if (!in->is_dir()) return Err(ENOTDIR, "inode " + std::to_string(ino) + " is not a directory");
  return in;
}

uint64_t RegionStore::ParentOf(uint64_t dir) const {
  if (dir == kRootIno) return kRootIno;
  auto it = name_of_.find(dir);
  return it == name_of_.end() ? kRootIno : it->second.first;
}

InodeAttr RegionStore::AttrOf(const Inode& in) const {
  const InodeRecordHeader& h = in.rec.h;
  InodeAttr a;
  a.ino = h.ino;
  a.mode = h.mode;
  a.uid = h.uid;
  a.gid = h.gid;
  a.nlink = h.nlink;
  a.size = in.is_reg() ? h.size : (in.is_dir() ? 4096 : in.rec.target.size());
  a.chunks = static_cast<uint64_t>(
      std::count_if(in.rec.map.begin(), in.rec.map.end(), [](MapEntry e) { return e != kHole; }));
  a.atime_ns = h.atime_ns;
  a.mtime_ns = h.mtime_ns;
  a.ctime_ns = h.ctime_ns;
  a.attr_flags = static_cast<uint16_t>(h.attr_flags & kAttrKnown);
  a.owner_pid = h.owner_pid;
  return a;
}

Result<InodeAttr> RegionStore::getattr(uint64_t ino) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto in, Get(ino));
  return AttrOf(*in);
}

Result<InodeAttr> RegionStore::lookup(uint64_t parent, std::string_view name) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto dir, GetDir(parent));
  auto& names = Children(parent);
  auto it = names.find(name);
  if ((it == names.end() || !inodes_.contains(it->second)) && CheckName(name).ok() &&
      !Fault("no_open_sync") && !StoreAway()) {
    // Another mount may have made the name a moment ago (its change not here yet): the store
    // knows.
    const std::string key = DirentKey(parent, name);
    auto kv = meta_.get(key);
    if (!kv.ok()) NoteStoreError(kv.status());
    if (kv.ok() && *kv && (*kv)->value.size() == sizeof(DirentRecord)) {
      DirentRecord d;
      std::memcpy(&d, (*kv)->value.data(), sizeof(d));
      auto rec = meta_.get(InodeKey(d.ino));
      if (rec.ok() && *rec) ApplyKey(InodeKey(d.ino), (*rec)->value, (*rec)->revision, true);
      ApplyKey(key, (*kv)->value, (*kv)->revision, true);
      if (auto in = inodes_.find(d.ino); in != inodes_.end()) (void)RefreshUnitsOf(*in->second);
    }
    it = names.find(name);
  }
  if (it == names.end()) return Err(ENOENT, std::string(name));
  FARMEM_ASSIGN_OR_RETURN(auto in, Get(it->second));
  return AttrOf(*in);
}

Result<std::shared_ptr<RegionStore::Inode>> RegionStore::NewInode(uint64_t parent,
                                                                  std::string_view name,
                                                                  uint32_t mode, const Caller& who,
                                                                  std::string_view target) {
  FARMEM_RETURN_IF_ERROR(CheckName(name));
  const bool is_reg = (mode & S_IFMT) == S_IFREG, is_dir = (mode & S_IFMT) == S_IFDIR;
  const int32_t owner = who.pid > 0 ? internal::TgidOf(who.pid) : 0;  // the process, not thread
  const std::string owner_start = owner > 0 && is_reg ? internal::ProcStartTime(owner) : "";
  for (int attempt = 0;; ++attempt) {
    FARMEM_ASSIGN_OR_RETURN(auto dir, GetDir(parent));
    if (Children(parent).contains(name)) return Err(EEXIST, std::string(name));
    FARMEM_ASSIGN_OR_RETURN(uint64_t ino, NextIno());
    InodeRecord rec;
    InodeRecordHeader& h = rec.h;
    h.ino = ino;
    h.mode = mode;
    h.uid = who.uid;
    h.gid = who.gid;
    h.nlink = is_dir ? 2 : 1;
    h.attr_flags = dir->rec.h.attr_flags & kAttrKnown;  // inherited from the directory
    if ((mode & S_IFMT) != S_IFLNK) rec.hostalloc = dir->rec.hostalloc;
    // ... unless the creating thread set defaults (rsetdefaultattr): they win.
    if (who.defaults != nullptr && (mode & S_IFMT) != S_IFLNK && !Fault("no_thread_defaults")) {
      h.attr_flags = static_cast<uint16_t>((h.attr_flags & ~who.defaults->set) |
                                           (who.defaults->flags & who.defaults->set));
      if (who.defaults->hostalloc) rec.hostalloc = *who.defaults->hostalloc;
    }
    h.owner_pid = owner;
    h.atime_ns = h.mtime_ns = h.ctime_ns = NowNs();
    rec.target = std::string(target);
    InodeRecord dn = dir->rec;
    if (is_dir) ++dn.h.nlink;
    dn.h.mtime_ns = dn.h.ctime_ns = h.ctime_ns;
    std::vector<MetaWrite> writes{{InodeKey(ino), EncodeInode(rec)},
                                  {DirentKey(parent, name), DirentValue(ino)},
                                  {InodeKey(parent), EncodeInode(dn)}};
    if (is_reg && owner > 0)
      writes.push_back(
          {"owner/" + std::to_string(ino), EncodeOwner({mount_id_, host_id_, owner, owner_start})});
    // The name must still be free, and the directory as this mount saw it (a racing create in
    // another mount, or an rmdir, changed one of them): exactly one of racing creates wins.
    std::vector<MetaCheck> checks;
    if (!Fault("no_create_cas"))
      checks = {
          {DirentKey(parent, name), std::nullopt}, InodeCheck(*dir), {InodeKey(ino), std::nullopt}};
    // An inherited FIXVADDR takes a free slot of the fixed range, checked free in the store.
    if (is_reg && (h.attr_flags & kAttrFixVaddr)) {
      FARMEM_ASSIGN_OR_RETURN(uint32_t slot, FreeVaddrSlot());
      writes.push_back({VaddrKey(slot), std::to_string(ino)});
      if (!Fault("no_vaddr_cas")) checks.push_back({VaddrKey(slot), std::nullopt});
    }
    auto r = CommitApply(checks, writes);
    if (r.ok()) {
      FARMEM_ASSIGN_OR_RETURN(auto in, Get(ino));
      if (is_reg && owner > 0) WatchOwner(owner, owner_start);
      return in;
    }
    if (!Conflict(r.status())) return r.status();
    if (attempt + 1 >= kMaxConflicts) return KeptChanging("create");
  }
}

Result<InodeAttr> RegionStore::create(uint64_t parent, std::string_view name, uint32_t mode,
                                      const Caller& who) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto in, NewInode(parent, name, S_IFREG | (mode & 07777), who));
  return AttrOf(*in);
}

Result<InodeAttr> RegionStore::mkdir(uint64_t parent, std::string_view name, uint32_t mode,
                                     const Caller& who) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto in, NewInode(parent, name, S_IFDIR | (mode & 07777), who));
  return AttrOf(*in);
}

Result<InodeAttr> RegionStore::symlink(uint64_t parent, std::string_view name,
                                       std::string_view target, const Caller& who) {
  if (target.empty() || target.size() > kMaxSymlinkBytes)
    return Err(ENAMETOOLONG, "symlink target empty or longer than 4096 bytes");
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto in, NewInode(parent, name, S_IFLNK | 0777, who, target));
  return AttrOf(*in);
}

Result<std::string> RegionStore::readlink(uint64_t ino) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto in, Get(ino));
  if ((in->rec.h.mode & S_IFMT) != S_IFLNK) return Err(EINVAL, "not a symlink");
  return in->rec.target;
}

Status RegionStore::unlink(uint64_t parent, std::string_view name) {
  std::shared_ptr<Inode> victim;
  {
    std::lock_guard lk(mu_);
    for (int attempt = 0;; ++attempt) {
      FARMEM_ASSIGN_OR_RETURN(auto dir, GetDir(parent));
      auto it = Children(parent).find(name);
      if (it == Children(parent).end()) return Err(ENOENT, std::string(name));
      FARMEM_ASSIGN_OR_RETURN(victim, Get(it->second));
      if (victim->is_dir()) return Err(EISDIR, std::string(name) + " is a directory");
      const uint64_t ino = victim->rec.h.ino;
      InodeRecord dn = dir->rec, vn = victim->rec;
      dn.h.mtime_ns = dn.h.ctime_ns = vn.h.ctime_ns = NowNs();
      if (vn.h.nlink > 0) --vn.h.nlink;
      // The name goes and the record stays with nlink 0 until no mount has the file open
      // (TryReclaim): one transaction, so the file never has a name without a record or the
      // other way round.
      auto r = CommitApply(
          {{DirentKey(parent, name), DirentValue(ino)}, InodeCheck(*dir), InodeCheck(*victim)},
          {{DirentKey(parent, name), std::nullopt},
           {InodeKey(parent), EncodeInode(dn)},
           {InodeKey(ino), EncodeInode(vn)}});
      if (r.ok()) break;
      if (!Conflict(r.status())) return r.status();
      if (attempt + 1 >= kMaxConflicts) return KeptChanging("unlink");
    }
  }
  TryReclaim(victim);
  return Status::OK();
}

Status RegionStore::rmdir(uint64_t parent, std::string_view name) {
  std::lock_guard lk(mu_);
  for (int attempt = 0;; ++attempt) {
    FARMEM_ASSIGN_OR_RETURN(auto dir, GetDir(parent));
    auto it = Children(parent).find(name);
    if (it == Children(parent).end()) return Err(ENOENT, std::string(name));
    FARMEM_ASSIGN_OR_RETURN(auto victim, Get(it->second));
    if (!victim->is_dir()) return Err(ENOTDIR, std::string(name) + " is not a directory");
    const uint64_t ino = victim->rec.h.ino;
    if (!Children(ino).empty()) return Err(ENOTEMPTY, std::string(name) + " is not empty");
    InodeRecord dn = dir->rec;
    --dn.h.nlink;
    dn.h.mtime_ns = dn.h.ctime_ns = NowNs();
    // Every create in the directory rewrites its record: the compare on it keeps a name made in
    // another mount meanwhile from being cut off.
    auto r = CommitApply(
        {{DirentKey(parent, name), DirentValue(ino)}, InodeCheck(*dir), InodeCheck(*victim)},
        {{DirentKey(parent, name), std::nullopt},
         {InodeKey(parent), EncodeInode(dn)},
         {InodeKey(ino), std::nullopt}});
    if (r.ok()) return Status::OK();
    if (!Conflict(r.status())) return r.status();
    if (attempt + 1 >= kMaxConflicts) return KeptChanging("rmdir");
  }
}

Status RegionStore::rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                           std::string_view new_name, bool noreplace) {
  std::shared_ptr<Inode> replaced;
  {
    std::lock_guard lk(mu_);
    FARMEM_RETURN_IF_ERROR(CheckName(new_name));
    for (int attempt = 0;; ++attempt) {
      replaced.reset();
      FARMEM_ASSIGN_OR_RETURN(auto from, GetDir(parent));
      FARMEM_ASSIGN_OR_RETURN(auto to, GetDir(new_parent));
      auto it = Children(parent).find(name);
      if (it == Children(parent).end()) return Err(ENOENT, std::string(name));
      FARMEM_ASSIGN_OR_RETURN(auto moving, Get(it->second));
      if (parent == new_parent && name == new_name) return Status::OK();
      const uint64_t ino = moving->rec.h.ino;
      if (moving->is_dir()) {
        // Not into its own subtree (bounded: the walk ends at the root).
        uint64_t p = new_parent;
        for (size_t steps = 0; steps <= inodes_.size(); ++steps, p = ParentOf(p)) {
          if (p == ino) return Err(EINVAL, "a directory cannot move into itself");
          if (p == kRootIno) break;
        }
      }
      auto old = Children(new_parent).find(new_name);
      if (old != Children(new_parent).end()) {
        if (noreplace) return Err(EEXIST, std::string(new_name));
        FARMEM_ASSIGN_OR_RETURN(replaced, Get(old->second));
        if (replaced->is_dir() != moving->is_dir())
          return replaced->is_dir() ? Err(EISDIR, std::string(new_name))
                                    : Err(ENOTDIR, std::string(new_name));
        if (replaced->is_dir() && !Children(replaced->rec.h.ino).empty())
          return Err(ENOTEMPTY, std::string(new_name));
      }
      // Every record the rename changes goes to the store in one transaction, checked against
      // the names and records as this mount knows them: cut short (etcd lost), it changed
      // nothing, so a reload never finds two names for one inode; another mount's change to any
      // of them first makes it start over on the new records.
      const int64_t now = NowNs();
      std::vector<MetaCheck> checks{{DirentKey(parent, name), DirentValue(ino)}};
      checks.push_back(
          {DirentKey(new_parent, new_name),
           replaced ? std::optional<std::string>(DirentValue(replaced->rec.h.ino)) : std::nullopt});
      checks.push_back(InodeCheck(*from));
      if (to != from) checks.push_back(InodeCheck(*to));
      checks.push_back(InodeCheck(*moving));
      if (replaced) checks.push_back(InodeCheck(*replaced));
      std::vector<MetaWrite> writes{{DirentKey(new_parent, new_name), DirentValue(ino)},
                                    {DirentKey(parent, name), std::nullopt}};
      InodeRecord from_next = from->rec, to_next = to->rec, moving_next = moving->rec;
      InodeRecord& tn = to == from ? from_next : to_next;  // the target directory's next record
      const bool moves_dir = moving->is_dir() && parent != new_parent;
      if (replaced) {
        if (replaced->is_dir()) {
          --tn.h.nlink;
          writes.push_back({InodeKey(replaced->rec.h.ino), std::nullopt});
        } else {
          // As unlink: a file with no name left keeps its record, nlink 0, until it is reclaimed.
          InodeRecord rn = replaced->rec;
          if (rn.h.nlink > 0) --rn.h.nlink;
          rn.h.ctime_ns = now;
          writes.push_back({InodeKey(replaced->rec.h.ino), EncodeInode(rn)});
        }
      }
      if (moves_dir) {
        --from_next.h.nlink;
        ++tn.h.nlink;
      }
      from_next.h.mtime_ns = from_next.h.ctime_ns = now;
      tn.h.mtime_ns = tn.h.ctime_ns = now;
      moving_next.h.ctime_ns = now;
      writes.push_back({InodeKey(from->rec.h.ino), EncodeInode(from_next)});
      if (to != from) writes.push_back({InodeKey(to->rec.h.ino), EncodeInode(to_next)});
      writes.push_back({InodeKey(ino), EncodeInode(moving_next)});
      if (Fault("split_rename")) {
        // The old way: one write after the other; a failure leaves the ones before it.
        for (const MetaWrite& w : writes) {
          auto r = w.value ? meta_.put(w.key, *w.value) : meta_.remove(w.key);
          if (!r.ok()) return r.status();
          ApplyKey(w.key, w.value, *r, false);
        }
        break;
      }
      auto r = CommitApply(checks, writes);
      if (r.ok()) break;
      if (!Conflict(r.status())) return r.status();
      if (attempt + 1 >= kMaxConflicts) return KeptChanging("rename");
    }
    if (replaced && replaced->is_dir()) replaced.reset();
  }
  if (replaced) TryReclaim(replaced);
  return Status::OK();
}

Result<std::vector<DirEntry>> RegionStore::readdir(uint64_t ino) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto dir, GetDir(ino));
  std::vector<DirEntry> out;
  out.push_back({".", ino, S_IFDIR});
  out.push_back({"..", ParentOf(ino), S_IFDIR});
  for (auto& [name, child] : Children(ino)) {
    auto c = inodes_.find(child);
    if (c == inodes_.end()) continue;  // its record is not here yet
    out.push_back({name, child, c->second->rec.h.mode});
  }
  return out;
}

Status RegionStore::UpdateInode(
    Inode& in, const std::function<Status(InodeRecord& next, std::vector<MetaWrite>& extra,
                                          std::vector<MetaCheck>& checks)>& change) {
  for (int attempt = 0;; ++attempt) {
    if (!in.stored) return Err(ENOENT, "inode was deleted");
    InodeRecord next = in.rec;
    std::vector<MetaWrite> writes{{InodeKey(in.rec.h.ino), ""}};
    std::vector<MetaCheck> checks{InodeCheck(in)};
    FARMEM_RETURN_IF_ERROR(change(next, writes, checks));
    writes[0].value = EncodeInode(next);
    // Applied once the store has it: a failed metadata write (the cluster store unreachable)
    // changes nothing, and another mount's change first makes it start over on that record.
    auto r = CommitApply(checks, writes);
    if (r.ok()) return Status::OK();
    if (!Conflict(r.status())) {
      if (Fault("no_meta_rollback")) in.rec = std::move(next);
      return r.status();
    }
    if (attempt + 1 >= kMaxConflicts) return KeptChanging("a change of inode");
  }
}

Result<InodeAttr> RegionStore::setattr(uint64_t ino, const SetAttrRequest& req) {
  if (req.size) FARMEM_RETURN_IF_ERROR(CheckLease());
  std::shared_ptr<Inode> in;
  {
    std::lock_guard lk(mu_);
    FARMEM_ASSIGN_OR_RETURN(in, Get(ino));
  }
  std::unique_lock io(in->io);  // no read or write of this inode in flight from here on
  std::unique_lock lk(mu_);
  if (in->revoked()) return Err(EIO, "region revoked: its owner process exited");
  if (in->reclaimed || !in->stored) return Err(ENOENT, "inode was deleted");
  std::vector<Piece> tail;  // zeroes of the new last chunk's tail, written after the commit
  std::string free_key;     // where the chunks cut off are parked
  InodeRecord before;
  Status st = UpdateInode(
      *in,
      [&](InodeRecord& next, std::vector<MetaWrite>& extra, std::vector<MetaCheck>&) -> Status {
        before = next;
        tail.clear();
        free_key.clear();
        int64_t now = NowNs();
        InodeRecordHeader& h = next.h;
        std::vector<MapEntry> cut;
        if (req.size) {
          if (!in->is_reg()) return Err(in->is_dir() ? EISDIR : EINVAL, "truncate of a non-file");
          uint64_t n = *req.size;
          if (n > kMaxRegionBytes) return Err(EFBIG, "larger than the largest region (8 GiB)");
          if (n < h.size) {
            // The tail of the new last chunk must read zero if the file grows again.
            uint64_t c = ChunkOf(n);
            if (n % kChunkBytes != 0 && c < next.map.size() && next.map[c] != kHole &&
                !Fault("no_tail")) {
              FARMEM_ASSIGN_OR_RETURN(RemoteRef ref, RefOf(next.map[c]));
              uint64_t in_chunk = n % kChunkBytes;
              uint64_t end = std::min<uint64_t>(kChunkBytes, h.size - c * kChunkBytes);
              ref.offset += in_chunk;
              tail.push_back(Piece{ref, nullptr, ZeroChunk(), end - in_chunk});
            }
            size_t keep = ChunksFor(n);
            for (size_t i = keep; i < next.map.size(); ++i)
              if (next.map[i] != kHole) cut.push_back(next.map[i]);
            if (next.map.size() > keep) next.map.resize(keep);
          }
          h.size = n;
          h.mtime_ns = now;
        }
        if (req.mode) h.mode = (h.mode & S_IFMT) | (*req.mode & 07777);
        if (req.uid) h.uid = *req.uid;
        if (req.gid) h.gid = *req.gid;
        if (req.atime_ns) h.atime_ns = *req.atime_ns;
        if (req.mtime_ns) h.mtime_ns = *req.mtime_ns;
        h.ctime_ns = now;
        // The chunks cut off are parked, not freed: a mount with the file open may still read them
        // (TryFree returns them once none has it open).
        if (!cut.empty()) {
          free_key = NewFreeKey(ino);
          extra.push_back({free_key, EncodeFree({ino, cut})});
        }
        return Status::OK();
      });
  if (!st.ok()) return st;
  // Zeroed after the commit, so a truncate the store refused leaves the bytes as they were. No
  // read or write of this mount runs meanwhile (io is held) and the chunks cut off are freed only
  // after this, so a rollback can give them back to the map.
  Status z;
  if (!tail.empty()) {
    lk.unlock();
    z = options_.fail_step && options_.fail_step("truncate_tail")
            ? Err(EIO, "remote write: the tail zeroing failed (test hook)")
            : RunPieces(Sched(), tail, true);
    remote_writes_++;
    lk.lock();
    if (!z.ok() && !Fault("no_truncate_rollback")) {
      // The tail still holds the cut bytes: put the old size, map and times back, so the EIO
      // leaves the file as it was. Only the fields this call changed (a setxattr or unlink may
      // have changed the record meanwhile). The free record is emptied in the same transaction,
      // not removed: a removal frees its chunks, which are in the map again.
      Status r = UpdateInode(
          *in, [&](InodeRecord& back, std::vector<MetaWrite>& extra, std::vector<MetaCheck>&) {
            back.h.size = before.h.size;
            back.map = before.map;
            back.h.mode = before.h.mode;
            back.h.uid = before.h.uid;
            back.h.gid = before.h.gid;
            back.h.atime_ns = before.h.atime_ns;
            back.h.mtime_ns = before.h.mtime_ns;
            back.h.ctime_ns = before.h.ctime_ns;
            if (!free_key.empty()) extra.push_back({free_key, EncodeFree({ino, {}})});
            return Status::OK();
          });
      if (r.ok()) return z;
      // Both failed: the store has the new size and so does memory; the bytes past it in the
      // last chunk were not zeroed (docs/regions.md "Failures").
      FARMEM_LOG_WARN(
          "regions: truncate of inode {}: tail zeroing failed ({}) and so did the "
          "rollback ({}); the size stays changed",
          ino, z.ToString(), r.ToString());
    }
  }
  InodeAttr a = AttrOf(*in);
  lk.unlock();
  TryFree(ino, /*io_held=*/true);
  if (!z.ok()) return z;
  return a;
}

namespace {
struct XattrName {
  std::string_view name;
  uint16_t flag;
};
constexpr XattrName kXattrs[] = {{"user.region.persistent", kAttrPersistent},
                                 {"user.region.multihosted", kAttrMultihosted},
                                 {"user.region.onewriter", kAttrOneWriter},
                                 {"user.region.fixvaddr", kAttrFixVaddr}};
constexpr std::string_view kOwnerPidXattr = "user.region.ownerpid";
// FIXVADDR's address ("0x..."), read-only and not listed (as user.region.map).
constexpr std::string_view kVaddrXattr = "user.region.vaddr";
constexpr std::string_view kHostallocXattr = "user.region.hostalloc";
}  // namespace

Result<std::string> RegionStore::getxattr(uint64_t ino, std::string_view name) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto in, Get(ino));
  if (name == kOwnerPidXattr) return std::to_string(in->rec.h.owner_pid);
  if (name == kHostallocXattr) return in->rec.hostalloc;
  if (name == kVaddrXattr) {
    auto v = vaddr_of_.find(ino);
    if (v == vaddr_of_.end()) return Err(ENODATA, "not a FIXVADDR region");
    char buf[32];
    std::snprintf(buf, sizeof(buf), "0x%llx",
                  static_cast<unsigned long long>(FixVaddrOf(v->second)));
    return std::string(buf);
  }
  for (const auto& x : kXattrs)
    if (x.name == name) return std::string((in->rec.h.attr_flags & x.flag) ? "1" : "0");
  return Err(ENODATA, std::string(name));
}

Status RegionStore::setxattr(uint64_t ino, std::string_view name, std::string_view value) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto in, Get(ino));
  if (name == kOwnerPidXattr) return Err(EPERM, "user.region.ownerpid is set at creation");
  if (name == kVaddrXattr) return Err(EPERM, "user.region.vaddr is assigned by the store");
  auto has_data = [](const InodeRecord& r) {
    return std::any_of(r.map.begin(), r.map.end(), [](MapEntry e) { return e != kHole; });
  };
  if (name == kHostallocXattr) {
    if ((in->rec.h.mode & S_IFMT) == S_IFLNK) return Err(EINVAL, "a symlink has no HOSTALLOC");
    Status ok = CheckHostalloc(value);
    if (!ok.ok()) return Err(EINVAL, std::string(ok.message()));
    for (const std::string& a : SplitHostalloc(value))
      if (std::none_of(servers_.begin(), servers_.end(), [&](auto& s) { return s->address == a; }))
        return Err(EINVAL, "HOSTALLOC: " + a + " is not a memory server of this mount");
    return UpdateInode(
        *in, [&](InodeRecord& next, std::vector<MetaWrite>&, std::vector<MetaCheck>&) -> Status {
          // Like MULTIHOSTED, it decides where chunks go: fixed once a file has any.
          if (in->is_reg() && has_data(next))
            return Err(EBUSY, "user.region.hostalloc cannot change once the region has data");
          next.hostalloc = std::string(value);
          next.h.ctime_ns = NowNs();
          return Status::OK();
        });
  }
  for (const auto& x : kXattrs) {
    if (x.name != name) continue;
    if (value != "0" && value != "1") return Err(EINVAL, std::string(name) + " takes 0 or 1");
    return UpdateInode(
        *in,
        [&](InodeRecord& next, std::vector<MetaWrite>& extra,
            std::vector<MetaCheck>& checks) -> Status {
          // MULTIHOSTED decides where chunks go: fixed once a file has any.
          if (x.flag == kAttrMultihosted && in->is_reg() && has_data(next))
            return Err(EBUSY, "user.region.multihosted cannot change once the region has data");
          if (value == "1")
            next.h.attr_flags |= x.flag;
          else
            next.h.attr_flags &= static_cast<uint16_t>(~x.flag);
          next.h.ctime_ns = NowNs();
          // FIXVADDR on a file: it takes a free slot of the fixed range (one no other region holds:
          // the key's absence is checked), and gives it back when cleared.
          if (x.flag == kAttrFixVaddr && in->is_reg()) {
            auto v = vaddr_of_.find(ino);
            if (value == "1" && v == vaddr_of_.end()) {
              FARMEM_ASSIGN_OR_RETURN(uint32_t slot, FreeVaddrSlot());
              extra.push_back({VaddrKey(slot), std::to_string(ino)});
              if (!Fault("no_vaddr_cas")) checks.push_back({VaddrKey(slot), std::nullopt});
            } else if (value == "0" && v != vaddr_of_.end()) {
              extra.push_back({VaddrKey(v->second), std::nullopt});
            }
          }
          return Status::OK();
        });
  }
  // Other names (ACLs, security labels, user xattrs) are not stored: ENOTSUP, which tools such as
  // cp -a take as "this file system has none".
  return Err(ENOTSUP,
             "only user.region.{persistent,multihosted,onewriter,fixvaddr,hostalloc} can be set");
}

Status RegionStore::SetDefaultAttr(AttrDefaults& into, std::string_view name,
                                   std::string_view value) {
  if (name == kOwnerPidXattr) return Err(EPERM, "user.region.ownerpid is set at creation");
  if (name == kHostallocXattr) {
    Status ok = CheckHostalloc(value);
    if (!ok.ok()) return Err(EINVAL, std::string(ok.message()));
    std::lock_guard lk(mu_);
    for (const std::string& a : SplitHostalloc(value))
      if (std::none_of(servers_.begin(), servers_.end(), [&](auto& s) { return s->address == a; }))
        return Err(EINVAL, "HOSTALLOC: " + a + " is not a memory server of this mount");
    into.hostalloc = std::string(value);
    return Status::OK();
  }
  for (const auto& x : kXattrs) {
    if (x.name != name) continue;
    if (value.empty()) {
      into.set = static_cast<uint16_t>(into.set & ~x.flag);
      into.flags = static_cast<uint16_t>(into.flags & ~x.flag);
      return Status::OK();
    }
    if (value != "0" && value != "1") return Err(EINVAL, std::string(name) + " takes 0 or 1");
    into.set |= x.flag;
    into.flags =
        static_cast<uint16_t>(value == "1" ? (into.flags | x.flag) : (into.flags & ~x.flag));
    return Status::OK();
  }
  return Err(
      ENOTSUP,
      "only user.region.{persistent,multihosted,onewriter,fixvaddr,hostalloc} have defaults");
}

Result<std::string> RegionStore::DefaultAttr(const AttrDefaults& defaults, std::string_view name) {
  if (name == kHostallocXattr) {
    if (!defaults.hostalloc) return Err(ENODATA, "no default HOSTALLOC for this thread");
    return *defaults.hostalloc;
  }
  for (const auto& x : kXattrs)
    if (x.name == name) {
      if (!(defaults.set & x.flag)) return Err(ENODATA, "no default for this thread");
      return std::string((defaults.flags & x.flag) ? "1" : "0");
    }
  return Err(ENODATA, "no such default");
}

Status RegionStore::removexattr(uint64_t ino, std::string_view name) {
  return setxattr(ino, name, name == kHostallocXattr ? "" : "0");
}

Result<std::vector<std::string>> RegionStore::listxattr(uint64_t ino) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto in, Get(ino));
  std::vector<std::string> out;
  for (const auto& x : kXattrs) out.emplace_back(x.name);
  out.emplace_back(kOwnerPidXattr);
  if ((in->rec.h.mode & S_IFMT) != S_IFLNK) out.emplace_back(kHostallocXattr);
  return out;
}

Result<uint64_t> RegionStore::open(uint64_t ino, bool write) {
  FARMEM_RETURN_IF_ERROR(CheckLease());
  std::shared_ptr<Inode> in;
  {
    std::lock_guard lk(mu_);
    auto got = Get(ino);
    if (!got.ok() && !Fault("no_open_sync")) {
      // Known to the kernel but not (yet) here: another mount's new file.
      (void)Refresh({InodeKey(ino)});
      got = Get(ino);
    }
    if (!got.ok()) return got.status();
    in = *got;
  }
  std::lock_guard ol(in->open_mu);
  // Invalidate-before-free, the opener's half: this mount's open record goes to the store first,
  // then the inode's record is read from the store. A free that committed before the read is
  // seen (the record is gone or no longer maps the chunks); one after it sees the open record.
  // (With the store away an open fails: other mounts could free the chunks once it is back.)
  const bool first = !in->published;
  FARMEM_RETURN_IF_ERROR(Publish(*in, ino));
  auto undo = [&](Status s) -> Status {
    bool idle;
    {
      std::lock_guard lk(mu_);
      idle = in->opens == 0;
    }
    if (first && idle) (void)Unpublish(*in, ino);
    return s;
  };
  if (!Fault("no_open_sync")) {
    // Close-to-open: what another mount wrote and closed before is in this record.
    std::lock_guard lk(mu_);
    Status r = Refresh({InodeKey(ino)});
    if (!r.ok()) {
      NoteStoreError(r);
      return undo(Err(EIO, "reading the inode's record: " + r.ToString()));
    }
  }
  bool claim = false;
  Status refused;
  {
    std::lock_guard lk(mu_);
    const bool onewriter =
        write && (in->rec.h.attr_flags & kAttrOneWriter) && !Fault("no_onewriter");
    if (!in->stored || in->reclaimed)
      refused = Err(ENOENT, "the file was deleted");
    else if (in->revoked())
      refused = Err(EIO, "region revoked: its owner process exited");
    else if (onewriter && in->writers > 0)
      refused = Err(EBUSY, "ONEWRITER region already has a writer");
    claim = onewriter && !in->writer_claimed && !Fault("no_cluster_onewriter");
  }
  if (!refused.ok()) return undo(refused);
  if (claim) {
    // ONEWRITER across mounts: the writer claim is a key only one mount can create, bound to its
    // lease (a mount that dies gives it up when its lease ends).
    const std::string key = "writer/" + std::to_string(ino);
    auto r = meta_.put_bound(key, mount_id_, /*create_only=*/true);
    if (!r.ok()) {
      if (r.status().code() == Code::kFailedPrecondition)
        return undo(Err(EBUSY, "ONEWRITER region already has a writer in another mount"));
      return undo(Err(EIO, "claiming the writer: " + r.status().ToString()));
    }
    in->writer_claimed = true;
  }
  std::lock_guard lk(mu_);
  ++in->opens;
  if (write) ++in->writers;
  uint64_t h = next_handle_++;
  handles_[h] = in;
  if (write) h |= uint64_t{1} << 63;  // the handle remembers it was a writer
  return h;
}

Status RegionStore::release(uint64_t handle) {
  std::shared_ptr<Inode> in;
  bool writer = handle >> 63;
  {
    std::lock_guard lk(mu_);
    auto it = handles_.find(handle & ~(uint64_t{1} << 63));
    if (it == handles_.end()) return Err(EBADF, "unknown handle");
    in = it->second;
    handles_.erase(it);
  }
  uint64_t ino = 0;
  bool last = false;
  {
    std::lock_guard ol(in->open_mu);
    bool drop_claim = false;
    {
      std::lock_guard lk(mu_);
      --in->opens;
      if (writer) --in->writers;
      ino = in->rec.h.ino;
      last = in->opens == 0;
      drop_claim = in->writers == 0 && in->writer_claimed;
      if (last && !in->stored && !in->reclaimed) {
        // Its record went while this mount had it open (another mount reclaimed it).
        in->reclaimed = true;
        inodes_.erase(ino);
      }
    }
    if (drop_claim) {
      const std::string key = "writer/" + std::to_string(ino);
      (void)meta_.commit({{key, mount_id_}}, {{key, std::nullopt}});
      in->writer_claimed = false;
    }
    // A failed removal (the store away) leaves the record: the housekeeper tries again.
    if (last) (void)Unpublish(*in, ino);
  }
  if (last) {
    TryReclaim(in);
    TryFree(ino);
  }
  return Status::OK();
}

Result<RemoteRef> RegionStore::RefOf(MapEntry e) const {
  auto u = units_.find(EntryGid(e));
  if (u == units_.end()) return Err(EIO, "map entry of an unknown unit");
  if (u->second->server == kNoServer)
    return Err(EIO, "a chunk on a memory server this mount was not given");
  RemoteRef r = u->second->base;
  r.offset += EntryUnitOffset(e);
  return r;
}

Result<MapEntry> RegionStore::AllocChunk(uint32_t server, bool& known_zero) {
  // Only from units this mount owns: no other mount hands out their chunks, so the bitmap here
  // is the truth (others only free chunks, which this mirror learns from the free records).
  for (auto& [gid, u] : units_) {
    if (u->server != server || u->used == 0xffff) continue;
    if (!Mine(static_cast<uint32_t>(gid)) && !Fault("no_unit_owner")) continue;
    unsigned i = static_cast<unsigned>(std::countr_one(u->used));
    const auto bit = static_cast<uint16_t>(1u << i);
    u->used |= bit;
    known_zero = !(u->touched & bit) || Fault("no_touched");
    u->touched |= bit;
    return MakeMapEntry(static_cast<uint32_t>(gid), uint64_t{i} << kChunkShift);
  }
  Server& s = *servers_[server];
  for (int attempt = 0; attempt < kMaxConflicts; ++attempt) {
    // The lowest number no unit and no claim has (a claim may come before its unit's record).
    uint32_t gid = 1;
    while (units_.contains(gid) || unit_owners_.contains(gid)) ++gid;
    if (gid > kMaxGid) return Err(ENOSPC, "unit table full (2^17 units)");
    // The claim first: whoever creates "unitowner/<gid>" may allocate the unit.
    const std::string owner_key = "unitowner/" + std::to_string(gid);
    auto claimed = meta_.put_bound(owner_key, mount_id_, /*create_only=*/true);
    if (!claimed.ok()) {
      if (claimed.status().code() != Code::kFailedPrecondition)
        return Err(EIO,
                   "claiming unit " + std::to_string(gid) + ": " + claimed.status().ToString());
      (void)Refresh({owner_key, "unit/" + std::to_string(gid)});
      continue;
    }
    ApplyKey(owner_key, mount_id_, *claimed, false);
    auto drop_claim = [&] {
      auto r = meta_.remove(owner_key);
      if (r.ok()) ApplyKey(owner_key, std::nullopt, *r, false);
    };
    auto a = s.client->alloc_raw(
        kStepBytes, options_.persistent_units ? Lifetime::kPersistent : Lifetime::kSession);
    if (!a.ok()) {
      drop_claim();
      alloc_failures_++;
      if (a.status().code() == Code::kResourceExhausted)
        return Err(ENOSPC, "server " + s.address + " is out of memory");
      return Err(EIO, "ALLOC_RAW at " + s.address + ": " + a.status().ToString());
    }
    UnitRecord rec{s.address, a->ref.key, a->ref.offset, kStepBytes};
    const std::string unit_key = "unit/" + std::to_string(gid);
    auto p = CommitApply({{unit_key, std::nullopt}}, {{unit_key, EncodeUnit(rec)}});
    if (!p.ok()) {
      (void)s.client->free_raw(a->ref);
      drop_claim();
      if (Conflict(p.status())) continue;
      return p.status();
    }
    auto u = units_.find(gid);
    if (u == units_.end()) return Err(EIO, "unit " + std::to_string(gid) + " vanished");
    u->second->used = 1;
    u->second->touched = 1;
    u->second->usable_rev = 0;
    known_zero = true;  // fresh from ALLOC_RAW: zeroed
    return MakeMapEntry(gid, 0);
  }
  return Err(EIO, "no free unit number (other mounts kept taking them)");
}

void RegionStore::FreeChunk(MapEntry e) {
  auto it = units_.find(EntryGid(e));
  if (it == units_.end()) return;
  it->second->used &= static_cast<uint16_t>(~(1u << (EntryUnitOffset(e) >> kChunkShift)));
}

Status RegionStore::AllocRange(const InodeRecord& rec, const std::vector<MapEntry>& map,
                               uint64_t first, uint64_t last, Fresh& fresh,
                               std::vector<uint64_t>& dirty) {
  // HOSTALLOC: the servers this region may use, in its list's order (all when empty); a
  // single-host region lives on the first, a MULTIHOSTED one goes round-robin over them.
  std::vector<uint32_t> hosts;
  if (rec.hostalloc.empty() || Fault("no_hostalloc")) {
    for (uint32_t i = 0; i < servers_.size(); ++i) hosts.push_back(i);
  } else {
    for (const std::string& a : SplitHostalloc(rec.hostalloc)) {
      auto it =
          std::find_if(servers_.begin(), servers_.end(), [&](auto& s) { return s->address == a; });
      if (it == servers_.end())
        return Err(EIO, "HOSTALLOC names " + a + ", which is not a memory server of this mount");
      hosts.push_back(static_cast<uint32_t>(it - servers_.begin()));
    }
  }
  uint32_t n = static_cast<uint32_t>(hosts.size());
  bool multi = rec.h.attr_flags & kAttrMultihosted;
  const size_t had = fresh.size();
  for (uint64_t c = first; c <= last; ++c) {
    if (c < map.size() && map[c] != kHole) continue;
    bool zero = false;
    auto e =
        AllocChunk(hosts[multi ? StepServer(c, static_cast<uint32_t>(rec.h.ino % n), n) : 0], zero);
    if (!e.ok()) {
      if (!Fault("no_rollback")) {
        Unalloc(Fresh(fresh.begin() + static_cast<ptrdiff_t>(had), fresh.end()));
        fresh.resize(had);
      }
      return e.status();
    }
    fresh.emplace_back(c, *e);
    if (!zero) dirty.push_back(c);
  }
  return Status::OK();
}

void RegionStore::Unalloc(const Fresh& fresh) {
  if (fresh.empty()) return;
  for (const auto& [c, e] : fresh) FreeChunk(e);
  ReleaseEmptyUnits();
}

Result<size_t> RegionStore::read(uint64_t ino, uint64_t offset, std::span<std::byte> out) {
  FARMEM_RETURN_IF_ERROR(CheckLease());
  std::shared_ptr<Inode> in;
  {
    std::lock_guard lk(mu_);
    FARMEM_ASSIGN_OR_RETURN(in, Get(ino));
  }
  std::shared_lock io(in->io);
  std::vector<Piece> pieces;
  size_t n = 0;
  {
    std::lock_guard lk(mu_);
    if (in->revoked()) return Err(EIO, "region revoked: its owner process exited");
    if (in->reclaimed) return Err(ENOENT, "inode was deleted");
    if (!in->is_reg()) return Err(EISDIR, "read of a non-file");
    uint64_t size = in->rec.h.size;
    if (offset >= size) return size_t{0};
    n = static_cast<size_t>(std::min<uint64_t>(out.size(), size - offset));
    for (uint64_t pos = offset; pos < offset + n;) {
      uint64_t c = ChunkOf(pos);
      uint64_t len = std::min<uint64_t>((c + 1) * kChunkBytes, offset + n) - pos;
      std::byte* dst = out.data() + (pos - offset);
      // Chunks a write in flight allocated are not in the map yet: holes for readers (their
      // bytes may be a freed region's until that write's zeroing is done).
      MapEntry e = c < in->rec.map.size() ? in->rec.map[c] : kHole;
      if (e == kHole) {
        std::memset(dst, 0, len);  // a hole: zeros, no remote read
      } else {
        FARMEM_ASSIGN_OR_RETURN(RemoteRef ref, RefOf(e));
        ref.offset += pos % kChunkBytes;
        pieces.push_back(Piece{ref, dst, nullptr, len});
      }
      pos += len;
    }
  }
  remote_reads_ += pieces.size();
  FARMEM_RETURN_IF_ERROR(RunPieces(Sched(), pieces, false));
  return n;
}

Status RegionStore::write(uint64_t ino, uint64_t offset, std::span<const std::byte> data) {
  if (data.empty()) return Status::OK();
  if (offset > kMaxRegionBytes || data.size() > kMaxRegionBytes - offset)
    return Err(EFBIG, "past the largest region (8 GiB)");
  FARMEM_RETURN_IF_ERROR(CheckLease());
  std::shared_ptr<Inode> in;
  {
    std::lock_guard lk(mu_);
    FARMEM_ASSIGN_OR_RETURN(in, Get(ino));
  }
  // Reads and other writes run alongside (their spans decide); truncate, fallocate and reclaim
  // wait for io exclusively.
  std::shared_lock io_shared(in->io, std::defer_lock);
  std::unique_lock io_excl(in->io, std::defer_lock);
  if (Fault("serial_writes"))
    io_excl.lock();
  else
    io_shared.lock();
  const uint64_t end = offset + data.size();
  for (int attempt = 0;; ++attempt) {
    std::vector<Piece> pieces;
    Fresh fresh;                  // chunks allocated by this write, by index
    std::vector<uint64_t> dirty;  // those of them that may hold a freed region's bytes
    std::list<Inode::Claim>::iterator claim;
    {
      std::unique_lock lk(mu_);
      uint64_t from = offset, to = end;
      for (;;) {
        if (in->revoked()) return Err(EIO, "region revoked: its owner process exited");
        if (in->reclaimed) return Err(ENOENT, "inode was deleted");
        if (!in->is_reg()) return Err(EISDIR, "write to a non-file");
        // The span: this write's bytes, widened to every chunk it will allocate (it zeroes them).
        from = offset;
        to = end;
        for (uint64_t c = ChunkOf(offset); c <= ChunkOf(end - 1); ++c)
          if (c >= in->rec.map.size() || in->rec.map[c] == kHole) {
            from = std::min(from, c * kChunkBytes);
            to = std::max(to, (c + 1) * kChunkBytes);
          }
        if (!in->Overlaps(from, to) || Fault("no_range_lock")) break;
        claims_cv_.wait(lk);
      }
      FARMEM_RETURN_IF_ERROR(
          AllocRange(in->rec, in->rec.map, ChunkOf(offset), ChunkOf(end - 1), fresh, dirty));
      auto entry = [&](uint64_t c) {
        for (const auto& [i, e] : fresh)
          if (i == c) return e;
        return in->rec.map[c];
      };
      for (uint64_t pos = offset; pos < end;) {
        uint64_t c = ChunkOf(pos);
        uint64_t len = std::min<uint64_t>((c + 1) * kChunkBytes, end) - pos;
        auto ref = RefOf(entry(c));
        if (!ref.ok()) {
          Unalloc(fresh);
          return ref.status();
        }
        RemoteRef at = *ref;
        at.offset += pos % kChunkBytes;
        pieces.push_back(Piece{at, nullptr, data.data() + (pos - offset), len});
        pos += len;
      }
      // A reused chunk may hold a freed region's bytes: zero what this write does not cover. (A
      // chunk never used since its unit was granted reads zero already: no transfer.)
      if (!Fault("no_zero")) {
        for (uint64_t c : dirty) {
          RemoteRef ref = *RefOf(entry(c));
          uint64_t cs = c * kChunkBytes, ce = cs + kChunkBytes;
          if (offset > cs)
            pieces.push_back(Piece{ref, nullptr, ZeroChunk(), std::min(offset, ce) - cs});
          if (end < ce) {
            RemoteRef at = ref;
            at.offset += std::max(end, cs) - cs;
            pieces.push_back(Piece{at, nullptr, ZeroChunk(), ce - std::max(end, cs)});
          }
        }
      }
      claim = in->claims.insert(in->claims.end(), Inode::Claim{from, to});
    }
    remote_writes_ += pieces.size();
    Status w = RunPieces(Sched(), pieces, true);
    std::lock_guard lk(mu_);
    in->claims.erase(claim);
    claims_cv_.notify_all();
    if (!w.ok()) {
      Unalloc(fresh);
      return w;
    }
    if (!in->stored) {
      // Reclaimed by another mount while this one has it open: the bytes went to chunks that
      // are parked (held by this mount's handle), but nothing can be recorded any more.
      Unalloc(fresh);
      return Err(EIO, "the file was deleted and reclaimed by another mount");
    }
    // The new map, size and times count only once the store has them, checked against the record
    // this write started from: another mount's write may have recorded a chunk for one of the
    // same holes first (then this write starts over and writes into that chunk), or changed the
    // record otherwise (then it is recomputed on the new one).
    InodeRecord next = in->rec;
    bool taken = false;
    for (const auto& [c, e] : fresh) {
      if (next.map.size() <= c) next.map.resize(c + 1, kHole);
      if (next.map[c] != kHole && !Fault("no_taken_check")) taken = true;
      next.map[c] = e;
    }
    if (!taken) {
      next.h.size = std::max(next.h.size, end);
      next.h.mtime_ns = next.h.ctime_ns = NowNs();
      std::vector<MetaCheck> checks;
      if (!Fault("no_write_cas")) checks.push_back(InodeCheck(*in));
      auto r = CommitApply(checks, {{InodeKey(ino), EncodeInode(next)}});
      if (r.ok()) return Status::OK();
      if (!Conflict(r.status())) {
        Unalloc(fresh);
        if (Fault("no_meta_rollback")) in->rec.h = next.h;
        return r.status();
      }
    }
    Unalloc(fresh);
    conflicts_ += taken ? 1 : 0;
    if (attempt + 1 >= kMaxConflicts) return KeptChanging("write");
  }
}

Status RegionStore::fallocate(uint64_t ino, int mode, uint64_t offset, uint64_t len) {
  const bool punch = mode == (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE);
  const bool zero_range = (mode & ~FALLOC_FL_KEEP_SIZE) == FALLOC_FL_ZERO_RANGE;
  if (mode != 0 && mode != FALLOC_FL_KEEP_SIZE && !punch && !zero_range)
    return Err(
        ENOTSUP,
        "fallocate: only mode 0, KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE and ZERO_RANGE[|KEEP_SIZE]");
  if (len == 0) return Err(EINVAL, "fallocate of 0 bytes");
  if (offset > kMaxRegionBytes || len > kMaxRegionBytes - offset)
    return Err(EFBIG, "past the largest region (8 GiB)");
  FARMEM_RETURN_IF_ERROR(CheckLease());
  std::shared_ptr<Inode> in;
  {
    std::lock_guard lk(mu_);
    FARMEM_ASSIGN_OR_RETURN(in, Get(ino));
  }
  std::unique_lock io(in->io);  // no read or write of this mount in flight: the map is ours
  std::unique_lock lk(mu_);
  const uint64_t end = offset + len;
  const uint64_t first = ChunkOf(offset), last = ChunkOf(end - 1);
  for (int attempt = 0;; ++attempt) {
    if (in->revoked()) return Err(EIO, "region revoked: its owner process exited");
    if (in->reclaimed || !in->stored) return Err(ENOENT, "inode was deleted");
    if (!in->is_reg()) return Err(in->is_dir() ? EISDIR : EINVAL, "fallocate of a non-file");
    std::vector<Piece> zero;
    Fresh fresh;
    std::vector<uint64_t> dirty;
    std::vector<std::pair<uint64_t, MapEntry>> whole;  // punched chunks, as seen
    const std::vector<MapEntry> seen = in->rec.map;
    if (punch) {
      // Partial chunks are zeroed where the range covers them; whole ones are cut afterwards,
      // so a failed zeroing changes nothing.
      for (uint64_t c = first; c <= last && c < seen.size(); ++c) {
        if (seen[c] == kHole) continue;
        uint64_t cs = c * kChunkBytes, ce = cs + kChunkBytes;
        if (offset <= cs && end >= ce) {
          whole.emplace_back(c, seen[c]);
          continue;
        }
        if (Fault("no_punch_zero")) continue;
        FARMEM_ASSIGN_OR_RETURN(RemoteRef ref, RefOf(seen[c]));
        uint64_t from = std::max(offset, cs), to = std::min(end, ce);
        ref.offset += from - cs;
        zero.push_back(Piece{ref, nullptr, ZeroChunk(), to - from});
      }
    } else if (!Fault("no_prealloc")) {
      // ZERO_RANGE: chunks allocated before the call are zeroed where the range covers them (a
      // chunk stays allocated, so later writes there cannot fail with ENOSPC); the holes get
      // chunks as for mode 0.
      if (zero_range && !Fault("no_zero_range"))
        for (uint64_t c = first; c <= last && c < seen.size(); ++c) {
          if (seen[c] == kHole) continue;
          FARMEM_ASSIGN_OR_RETURN(RemoteRef ref, RefOf(seen[c]));
          const uint64_t cs = c * kChunkBytes;
          const uint64_t from = std::max(offset, cs), to = std::min(end, cs + kChunkBytes);
          ref.offset += from - cs;
          zero.push_back(Piece{ref, nullptr, ZeroChunk(), to - from});
        }
      FARMEM_RETURN_IF_ERROR(AllocRange(in->rec, seen, first, last, fresh, dirty));
      // Reused chunks may hold a freed region's bytes, and all of a fresh chunk reads zero.
      if (!Fault("no_zero"))
        for (uint64_t c : dirty)
          for (const auto& [i, e] : fresh)
            if (i == c) zero.push_back(Piece{*RefOf(e), nullptr, ZeroChunk(), kChunkBytes});
    }
    lk.unlock();
    remote_writes_ += zero.size();
    // In batches: a large preallocation (up to 2^16 chunks) must not put every write in flight.
    constexpr size_t kBatch = 64;
    Status w;
    for (size_t i = 0; i < zero.size() && w.ok(); i += kBatch) {
      std::vector<Piece> batch(
          zero.begin() + static_cast<ptrdiff_t>(i),
          zero.begin() + static_cast<ptrdiff_t>(std::min(zero.size(), i + kBatch)));
      w = RunPieces(Sched(), batch, true);
    }
    lk.lock();
    if (!w.ok()) {
      Unalloc(fresh);
      return w;
    }
    // The punched chunks are parked, and the new size counts, only once the store has the
    // record (a failed metadata write changes nothing). Another mount's change to the record
    // meanwhile makes this start over on the new one.
    InodeRecord next = in->rec;
    bool changed = next.map != seen;
    for (const auto& [c, e] : fresh) {
      if (next.map.size() <= c) next.map.resize(c + 1, kHole);
      next.map[c] = e;
    }
    std::vector<MapEntry> cut;
    for (const auto& [c, e] : whole) {
      cut.push_back(e);
      next.map[c] = kHole;
    }
    // Trailing holes past the size go.
    while (!next.map.empty() && next.map.back() == kHole &&
           next.map.size() > ChunksFor(next.h.size))
      next.map.pop_back();
    int64_t now = NowNs();
    if ((mode == 0 || mode == FALLOC_FL_ZERO_RANGE) && end > next.h.size) {
      next.h.size = end;
      next.h.mtime_ns = now;
    }
    if (punch || zero_range) next.h.mtime_ns = now;  // the bytes changed
    next.h.ctime_ns = now;
    if (!changed) {
      std::vector<MetaWrite> writes{{InodeKey(ino), EncodeInode(next)}};
      if (!cut.empty()) writes.push_back({NewFreeKey(ino), EncodeFree({ino, cut})});
      auto r = CommitApply({InodeCheck(*in)}, writes);
      if (r.ok()) break;
      if (!Conflict(r.status())) {
        Unalloc(fresh);
        return r.status();
      }
    }
    Unalloc(fresh);
    if (attempt + 1 >= kMaxConflicts) return KeptChanging("fallocate");
  }
  lk.unlock();
  TryFree(ino, /*io_held=*/true);
  return Status::OK();
}

Result<StoreStatFs> RegionStore::statfs() {
  StoreStatFs out;
  for (auto& s : servers_) {
    FARMEM_ASSIGN_OR_RETURN(std::string text, s->client->stats_json());
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.contains("memory") || !j["memory"].is_object())
      return Err(EIO, "server " + s->address + " sent a STAT without memory figures");
    out.budget_bytes += j["memory"].value("budget_bytes", uint64_t{0});
    out.free_bytes += j["memory"].value("free_bytes", uint64_t{0});
  }
  std::lock_guard lk(mu_);
  for (auto& [gid, u] : units_)
    if (Mine(static_cast<uint32_t>(gid)))
      out.free_bytes += static_cast<uint64_t>(16 - std::popcount(u->used)) * kChunkBytes;
  out.inodes = inodes_.size();
  return out;
}

RegionStoreStats RegionStore::stats() const {
  RegionStoreStats s;
  s.remote_reads = remote_reads_;
  s.remote_writes = remote_writes_;
  s.units_freed = units_freed_;
  s.alloc_failures = alloc_failures_;
  s.orphans_dropped = orphans_dropped_;
  s.conflicts = conflicts_;
  std::lock_guard lk(mu_);
  s.units = units_.size();
  for (auto& [gid, u] : units_) s.chunks_in_use += static_cast<uint64_t>(std::popcount(u->used));
  s.frees_waiting = frees_.size();
  return s;
}

void RegionStore::WatchOwner(int32_t pid, const std::string& start) {
  if (owners_.contains(pid)) return;
  int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd >= 0) {
    // A pid reused since the region was made (another start time) is not its owner.
    if (!start.empty() && internal::ProcStartTime(pid) != start) {
      close(fd);
      owners_[pid] = -1;
      return;
    }
    owners_[pid] = fd;
  } else if (errno == ESRCH) {
    owners_[pid] = -1;  // already gone: reaped at the next ReapOwners
  }
  // Other errors (no pidfd_open, out of fds, a made-up pid of another kind): not watched, so
  // the region behaves as PERSISTENT (docs/regions.md "Attributes").
}

Status RegionStore::ReapWhere(const std::function<bool(const Inode&)>& doomed,
                              std::vector<ReapedRegion>& out,
                              std::vector<std::shared_ptr<Inode>>& victims) {
  struct Candidate {
    uint64_t dir;
    std::string name;
    uint64_t ino;
  };
  std::vector<Candidate> found;
  for (auto& [dino, names] : children_)
    for (auto& [name, child] : names) {
      auto c = inodes_.find(child);
      if (c != inodes_.end() && doomed(*c->second)) found.push_back({dino, name, child});
    }
  Status failed;
  for (const Candidate& x : found) {
    auto d = inodes_.find(x.dir);
    auto c = inodes_.find(x.ino);
    auto it = Children(x.dir).find(x.name);
    if (d == inodes_.end() || c == inodes_.end() || it == Children(x.dir).end() ||
        it->second != x.ino)
      continue;
    std::shared_ptr<Inode> in = c->second;
    // Unlinked and revoked in one transaction: every mount's handles get EIO from then on (the
    // flag is in the record), and the chunks return once no mount has the file open.
    InodeRecord dn = d->second->rec, vn = in->rec;
    dn.h.mtime_ns = dn.h.ctime_ns = vn.h.ctime_ns = NowNs();
    if (vn.h.nlink > 0) --vn.h.nlink;
    if (!Fault("no_revoke")) vn.h.attr_flags |= kStateRevoked;
    auto r = CommitApply(
        {{DirentKey(x.dir, x.name), DirentValue(x.ino)}, InodeCheck(*d->second), InodeCheck(*in)},
        {{DirentKey(x.dir, x.name), std::nullopt},
         {InodeKey(x.dir), EncodeInode(dn)},
         {InodeKey(x.ino), EncodeInode(vn)}});
    if (!r.ok()) {
      if (!Conflict(r.status())) failed = r.status();
      continue;  // changed meanwhile: the next round looks again
    }
    out.push_back({x.dir, x.name, x.ino, in->rec.h.owner_pid});
    victims.push_back(std::move(in));
  }
  return failed;
}

Result<std::vector<ReapedRegion>> RegionStore::ReapOwners(std::chrono::milliseconds wait) {
  std::vector<pollfd> fds;
  std::vector<int32_t> pids;
  bool gone = false;
  {
    std::lock_guard lk(mu_);
    for (auto& [pid, fd] : owners_) {
      if (fd < 0) gone = true;
      fds.push_back(pollfd{fd, POLLIN, 0});  // poll ignores negative fds
      pids.push_back(pid);
    }
    if (mounts_changed_) gone = true;
  }
  // A pidfd turns readable when its process has exited.
  int n = poll(fds.data(), fds.size(), gone ? 0 : static_cast<int>(wait.count()));
  if (n < 0 && errno != EINTR)
    return Err(EIO, std::string("poll of owner pidfds: ") + strerror(errno));
  std::vector<ReapedRegion> out;
  std::vector<std::shared_ptr<Inode>> victims;
  Status failed;
  {
    std::lock_guard lk(mu_);
    std::vector<int32_t> dead;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd >= 0 && !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto it = owners_.find(pids[i]);
      if (it == owners_.end()) continue;
      if (it->second >= 0) close(it->second);
      owners_.erase(it);
      dead.push_back(pids[i]);
    }
    // Owners on a host where no mount lives any more (it ended or its lease ran out): nobody can
    // watch them, so their regions go as if they had exited.
    std::set<std::string> hostless;
    if (mounts_changed_ && !Fault("no_hostless_reap")) {
      mounts_changed_ = false;
      std::set<std::string> live;
      for (const auto& [id, m] : mounts_) live.insert(m.host);
      for (const auto& [ino, o] : owner_info_)
        if (o.host != host_id_ && !live.contains(o.host)) hostless.insert(o.host);
    }
    if ((dead.empty() && hostless.empty()) || Fault("no_reap")) return out;
    auto doomed = [&](const Inode& in) {
      if (!in.is_reg() || in.rec.h.nlink == 0 || in.revoked() ||
          ((in.rec.h.attr_flags & kAttrPersistent) && !Fault("reap_persistent")))
        return false;
      const uint64_t ino = in.rec.h.ino;
      if (std::find(dead.begin(), dead.end(), in.rec.h.owner_pid) != dead.end() && OwnerHere(ino))
        return true;
      auto o = owner_info_.find(ino);
      return o != owner_info_.end() && hostless.contains(o->second.host);
    };
    failed = ReapWhere(doomed, out, victims);
    // A metadata write failed: the owners stay marked as gone, so the next call goes on.
    if (!failed.ok()) {
      for (int32_t pid : dead) owners_.emplace(pid, -1);
      if (!hostless.empty()) mounts_changed_ = true;
    }
  }
  for (auto& in : victims) TryReclaim(in);
  if (!failed.ok() && out.empty()) return failed;
  return out;  // what did go (the caller drops the kernel's cache of it)
}

std::string EscapeField(std::string_view p) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char ch : p) {
    auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c == 0x7f || c == '%' || c == '=') {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += ch;
    }
  }
  return out;
}

std::unordered_map<uint64_t, std::string> RegionStore::Paths() const {
  std::unordered_map<uint64_t, std::string> out;
  out[kRootIno] = "/";
  std::vector<std::pair<uint64_t, std::string>> todo{{kRootIno, ""}};
  while (!todo.empty()) {
    auto [dir, prefix] = std::move(todo.back());
    todo.pop_back();
    auto d = children_.find(dir);
    if (d == children_.end()) continue;
    for (const auto& [name, child] : d->second) {
      std::string path = prefix + "/" + name;
      auto c = inodes_.find(child);
      if (c != inodes_.end() && c->second->is_dir() && !out.contains(child))
        todo.emplace_back(child, path);
      out[child] = std::move(path);
    }
  }
  return out;
}

Result<std::string> RegionStore::report(std::string_view name) {
  std::ostringstream o;
  if (name == "memusage") {
    FARMEM_ASSIGN_OR_RETURN(StoreStatFs fs, statfs());
    RegionStoreStats st = stats();
    std::lock_guard lk(mu_);
    uint64_t regions = static_cast<uint64_t>(std::count_if(
        inodes_.begin(), inodes_.end(), [](const auto& kv) { return kv.second->is_reg(); }));
    o << "budget_bytes=" << fs.budget_bytes << " free_bytes=" << fs.free_bytes
      << " used_bytes=" << st.chunks_in_use * kChunkBytes << " units=" << st.units
      << " unit_bytes=" << st.units * kStepBytes << " chunks_in_use=" << st.chunks_in_use
      << " inodes=" << inodes_.size() << " regions=" << regions
      << " remote_reads=" << st.remote_reads << " remote_writes=" << st.remote_writes
      << " units_freed=" << st.units_freed << " alloc_failures=" << st.alloc_failures
      << " mounts=" << mounts_.size() << " frees_waiting=" << st.frees_waiting
      << " conflicts=" << st.conflicts << "\n";
    return o.str();
  }
  std::lock_guard lk(mu_);
  if (name == "hosts") {
    for (size_t i = 0; i < servers_.size(); ++i) {
      uint64_t units = 0, chunks = 0;
      for (const auto& [gid, u] : units_)
        if (u->server == i) {
          ++units;
          chunks += static_cast<uint64_t>(std::popcount(u->used));
        }
      o << "server=" << i << " address=" << servers_[i]->address << " units=" << units
        << " chunks_in_use=" << chunks << " used_bytes=" << chunks * kChunkBytes << "\n";
    }
  } else if (name == "pools") {
    for (const auto& [gid, u] : units_) {
      char used[8];
      std::snprintf(used, sizeof(used), "%04x", u->used);
      auto owner = unit_owners_.find(static_cast<uint32_t>(gid));
      o << "gid=" << gid << " server=" << u->server
        << " address=" << (u->server == kNoServer ? std::string("-") : servers_[u->server]->address)
        << " key=" << u->base.key << " offset=" << u->base.offset << " bytes=" << kStepBytes
        << " used_bitmap=" << used << " chunks_in_use=" << std::popcount(u->used) << " owner="
        << (owner == unit_owners_.end() ? std::string("-") : EscapeField(owner->second)) << "\n";
    }
  } else if (name == "open") {
    auto paths = Paths();
    std::map<uint64_t, std::shared_ptr<Inode>> open;
    for (const auto& [h, in] : handles_) open[in->rec.h.ino] = in;
    for (const auto& [ino, in] : open) {
      auto p = paths.find(ino);
      auto m = open_mounts_.find(ino);
      o << "ino=" << ino << " path=" << (p == paths.end() ? "-" : EscapeField(p->second))
        << " opens=" << in->opens << " writers=" << in->writers
        << " mounts=" << (m == open_mounts_.end() ? 0 : m->second.size()) << "\n";
    }
  } else if (name == "files") {
    auto paths = Paths();
    std::map<uint64_t, std::shared_ptr<Inode>> sorted(inodes_.begin(), inodes_.end());
    for (const auto& [ino, in] : sorted) {
      if (!in->is_reg()) continue;
      const InodeRecordHeader& h = in->rec.h;
      auto p = paths.find(ino);
      o << "path=" << (p == paths.end() ? "-" : EscapeField(p->second)) << " ino=" << ino
        << " size=" << h.size << " chunks=" << AttrOf(*in).chunks
        << " persistent=" << ((h.attr_flags & kAttrPersistent) ? 1 : 0)
        << " multihosted=" << ((h.attr_flags & kAttrMultihosted) ? 1 : 0)
        << " onewriter=" << ((h.attr_flags & kAttrOneWriter) ? 1 : 0) << " ownerpid=" << h.owner_pid
        << " hostalloc=" << (in->rec.hostalloc.empty() ? "-" : EscapeField(in->rec.hostalloc));
      if (auto v = vaddr_of_.find(ino); v != vaddr_of_.end()) {
        char buf[32];
        std::snprintf(buf, sizeof(buf), "0x%llx",
                      static_cast<unsigned long long>(FixVaddrOf(v->second)));
        o << " vaddr=" << buf;
      } else {
        o << " vaddr=-";
      }
      o << " map=";
      // chunk:gid.index for every allocated chunk (holes left out), "-" when there is none.
      bool any = false;
      for (size_t c = 0; c < in->rec.map.size(); ++c) {
        MapEntry e = in->rec.map[c];
        if (e == kHole) continue;
        o << (any ? "," : "") << c << ":" << EntryGid(e) << "."
          << (EntryUnitOffset(e) >> kChunkShift);
        any = true;
      }
      o << (any ? "" : "-") << "\n";
    }
  } else {
    return Err(ENOENT, "no report " + std::string(name));
  }
  return o.str();
}

Result<MapDescriptor> RegionStore::map_descriptor(uint64_t ino) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto in, Get(ino));
  if (!in->is_reg()) return Err(EINVAL, "map of a non-file");
  if (in->revoked()) return Err(EIO, "region revoked: its owner process exited");
  if (in->reclaimed) return Err(ENOENT, "inode was deleted");
  MapDescriptor d;
  d.ino = ino;
  d.size = in->rec.h.size;
  if (auto v = vaddr_of_.find(ino); v != vaddr_of_.end()) d.vaddr = FixVaddrOf(v->second);
  for (const auto& s : servers_) d.servers.push_back(s->address);
  std::map<uint32_t, uint32_t> index;  // gid -> position in d.units
  d.chunks.assign(std::min<uint64_t>(in->rec.map.size(), ChunksFor(d.size)), 0);
  for (size_t c = 0; c < d.chunks.size(); ++c) {
    const MapEntry e = in->rec.map[c];
    if (e == kHole) continue;
    auto u = units_.find(EntryGid(e));
    if (u == units_.end() || u->second->server == kNoServer)
      return Err(EIO, "map entry of an unknown unit");
    auto [it, fresh] = index.emplace(EntryGid(e), static_cast<uint32_t>(d.units.size()));
    if (fresh)
      d.units.push_back(MapUnit{u->second->server, 0, u->second->base.key, u->second->base.offset});
    d.chunks[c] = MapChunkWord(it->second, EntryUnitOffset(e) >> kChunkShift);
  }
  return d;
}

}  // namespace farmem::regions
