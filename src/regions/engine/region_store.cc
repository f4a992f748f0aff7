// RegionStore implementation. Lock order: an inode's `io` lock before mu_. Reads and writes hold
// `io` shared and truncates/fallocates/reclaims hold it exclusive while their one-sided operations
// run, so no chunk is freed (and possibly handed to another region) while an operation may touch
// it. Writes to one inode overlap: each claims a span of bytes (under mu_) and waits only for
// claimed spans it overlaps, so disjoint writes run together and overlapping ones one at a time.
// Invariant: every byte of an allocated chunk at or past the inode's size is zero (reused chunks
// are zeroed where a write does not cover them, never-used ones are zero from ALLOC_RAW; a shrink
// zeroes the tail of its last chunk).
#include "regions/engine/region_store.h"

#include "regions/engine/chunk_io.h"

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

namespace farmem::regions {

namespace {

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
//     short by a failed metadata write) instead of dropping them.
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

// The thread group (process) of thread `tid` (FUSE reports the calling thread), from
// /proc/<tid>/status; `tid` itself when that cannot be read (the caller is gone, or a test's
// made-up pid).
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

class ClusterMeta : public MetaStore {
 public:
  ClusterMeta(Cluster& c, std::string prefix) : c_(c), prefix_(std::move(prefix)) {}
  Status put(std::string_view key, std::string_view value) override {
    auto r = c_.put(prefix_ + std::string(key), value);
    return r.ok() ? Status::OK() : r.status();
  }
  Status remove(std::string_view key) override {
    Status s = c_.remove(prefix_ + std::string(key));
    return s.code() == Code::kNotFound ? Status::OK() : s;
  }
  Status commit(const std::vector<MetaCheck>& checks,
                const std::vector<MetaWrite>& writes) override {
    std::vector<ClusterCompare> cmp;
    for (const MetaCheck& c : checks) cmp.push_back({prefix_ + c.key, c.value});
    std::vector<ClusterOp> ops;
    for (const MetaWrite& w : writes)
      ops.push_back({w.value ? ClusterOp::Type::kPut : ClusterOp::Type::kRemove, prefix_ + w.key,
                     w.value.value_or("")});
    auto r = c_.commit(cmp, ops);
    return r.ok() ? Status::OK() : r.status();
  }
  Result<std::vector<std::pair<std::string, std::string>>> list(std::string_view prefix) override {
    FARMEM_ASSIGN_OR_RETURN(auto kvs, c_.list(prefix_ + std::string(prefix)));
    std::vector<std::pair<std::string, std::string>> out;
    out.reserve(kvs.size());
    for (auto& kv : kvs) out.emplace_back(kv.key.substr(prefix_.size()), std::move(kv.value));
    return out;
  }

 private:
  Cluster& c_;
  std::string prefix_;
};

}  // namespace

std::unique_ptr<MetaStore> NewClusterMetaStore(Cluster& cluster, std::string prefix) {
  return std::make_unique<ClusterMeta>(cluster, std::move(prefix));
}

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

struct RegionStore::Inode {
  InodeRecord rec;  // header (size, mode, ...), map, symlink target
  std::map<std::string, uint64_t, std::less<>> children;  // directories
  uint64_t parent = 0;                                    // directories
  uint32_t opens = 0;
  uint32_t writers = 0;
  std::vector<MapEntry> deferred;  // cut off by a shrink while open: freed at the last release
  bool reclaimed = false;
  bool revoked = false;  // its owner exited (not PERSISTENT): IO through open handles is EIO
  // Writes in flight: the bytes each claimed (its own, widened to whole chunks where it allocated:
  // its zeroing covers them) and the chunks it allocated, which read as holes until it is done
  // (their bytes are not zeroed yet). A write waits until no claimed span overlaps its own.
  struct Claim {
    uint64_t from = 0, to = 0;
    std::vector<uint64_t> fresh;
  };
  std::list<Claim> claims;
  std::shared_mutex io;
  bool Overlaps(uint64_t from, uint64_t to) const {
    for (const Claim& c : claims)
      if (c.from < to && from < c.to) return true;
    return false;
  }
  bool Fresh(uint64_t chunk) const {
    for (const Claim& c : claims)
      if (std::find(c.fresh.begin(), c.fresh.end(), chunk) != c.fresh.end()) return true;
    return false;
  }
  bool is_dir() const { return (rec.h.mode & S_IFMT) == S_IFDIR; }
  bool is_reg() const { return (rec.h.mode & S_IFMT) == S_IFREG; }
};

struct RegionStore::Unit {
  uint32_t server = 0;
  RemoteRef base;
  uint16_t used = 0;  // bit i: chunk i is in some region's map
  // Bit i: chunk i was handed out since ALLOC_RAW granted the unit, so it may hold a freed
  // region's bytes. A chunk never handed out reads zero (ALLOC_RAW gives zeroed memory,
  // docs/server.md) and needs no zeroing. Units loaded from metadata: all set (unknown history).
  uint16_t touched = 0xffff;
};

struct RegionStore::Server {
  std::string address;
  std::unique_ptr<RawClient> client;
};

RegionStore::RegionStore(Node& node, MetaStore& meta, RegionStoreOptions options)
    : node_(node), meta_(meta), options_(std::move(options)) {}

RegionStore::~RegionStore() {
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
    for (auto& [gid, u] : units_) (void)servers_[u->server]->client->free_raw(u->base);
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
  FARMEM_RETURN_IF_ERROR(s->Load());
  return s;
}

Status RegionStore::Load() {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto kvs, meta_.list(""));
  std::vector<std::pair<std::string, uint64_t>> dirents;
  for (auto& [key, value] : kvs) {
    auto num = [](std::string_view t) -> std::optional<uint64_t> {
      if (t.empty() || t.size() > 19) return std::nullopt;
      uint64_t v = 0;
      for (char ch : t) {
        if (ch < '0' || ch > '9') return std::nullopt;
        v = v * 10 + static_cast<uint64_t>(ch - '0');
      }
      return v;
    };
    if (key.starts_with("inode/")) {
      auto ino = num(std::string_view(key).substr(6));
      auto rec = DecodeInode(value);
      if (!ino || !rec.ok() || rec->h.ino != *ino)
        return Status::InvalidArgument("regions metadata: bad " + key + ": " +
                                       (rec.ok() ? "number mismatch" : rec.status().ToString()));
      auto in = std::make_shared<Inode>();
      in->rec = std::move(*rec);
      inodes_[*ino] = in;
      next_ino_ = std::max(next_ino_, *ino + 1);
    } else if (key.starts_with("unit/")) {
      auto gid = num(std::string_view(key).substr(5));
      auto rec = DecodeUnit(value);
      if (!gid || *gid == 0 || *gid > kMaxGid || !rec.ok())
        return Status::InvalidArgument("regions metadata: bad " + key);
      auto u = std::make_unique<Unit>();
      auto it = std::find_if(servers_.begin(), servers_.end(),
                             [&](auto& s) { return s->address == rec->address; });
      if (it == servers_.end())
        return Status::InvalidArgument("regions metadata: " + key + " is on server " +
                                       rec->address + ", which this store was not given");
      u->server = static_cast<uint32_t>(it - servers_.begin());
      u->base = RemoteRef{(*it)->client->server().id, rec->key, rec->offset};
      units_[*gid] = std::move(u);
      next_gid_ = std::max<uint32_t>(next_gid_, static_cast<uint32_t>(*gid) + 1);
    } else if (key.starts_with("dirent/")) {
      std::string_view rest = std::string_view(key).substr(7);
      size_t slash = rest.find('/');
      auto parent = slash == std::string_view::npos ? std::nullopt : num(rest.substr(0, slash));
      if (!parent || value.size() != sizeof(DirentRecord) ||
          !CheckName(rest.substr(slash + 1)).ok())
        return Status::InvalidArgument("regions metadata: bad " + key);
      DirentRecord d;
      std::memcpy(&d, value.data(), sizeof(d));
      dirents.emplace_back(key, d.ino);
    }
  }
  // Session units die with the clients that allocated them: metadata naming units from an
  // earlier store can only be trusted when units are persistent (else its chunks may already
  // belong to someone else).
  if (!units_.empty() && !options_.persistent_units)
    return Status::FailedPrecondition(
        "regions metadata: names " + std::to_string(units_.size()) +
        " unit(s) of an earlier mount, but this store allocates session units, which do not "
        "outlive a mount; open it with persistent units");
  if (inodes_.empty()) {
    auto root = std::make_shared<Inode>();
    root->rec.h.ino = kRootIno;
    root->rec.h.mode = S_IFDIR | (options_.root_mode & 07777);
    root->rec.h.nlink = 2;
    root->rec.h.attr_flags = options_.root_attrs & kAttrKnown;
    root->rec.h.atime_ns = root->rec.h.mtime_ns = root->rec.h.ctime_ns = NowNs();
    root->parent = kRootIno;
    inodes_[kRootIno] = root;
    return Persist(*root);
  }
  if (!inodes_.contains(kRootIno) || !inodes_[kRootIno]->is_dir())
    return Status::InvalidArgument("regions metadata: no root directory");
  // Owners of an earlier mount: watched by pid again (a pid reused since would be taken for the
  // owner; the record has no start time), gone ones reaped at the first ReapOwners.
  for (auto& [ino, in] : inodes_)
    if (in->is_reg() && in->rec.h.owner_pid > 0 && !Fault("no_rewatch"))
      WatchOwner(in->rec.h.owner_pid);
  inodes_[kRootIno]->parent = kRootIno;
  for (auto& [key, ino] : dirents) {
    std::string_view rest = std::string_view(key).substr(7);
    size_t slash = rest.find('/');
    uint64_t parent = std::stoull(std::string(rest.substr(0, slash)));
    auto p = inodes_.find(parent);
    auto c = inodes_.find(ino);
    if (p == inodes_.end() || !p->second->is_dir() || c == inodes_.end() || ino == kRootIno)
      return Status::InvalidArgument("regions metadata: dangling " + key);
    p->second->children.emplace(std::string(rest.substr(slash + 1)), ino);
    if (c->second->is_dir()) c->second->parent = parent;
  }
  // Inode records no name leads to are leftovers of a create whose name could not be written, or
  // of a delete whose record could not be removed (the cluster store was lost between the two
  // writes): not part of the namespace. They are dropped (their records removed, best effort)
  // and their chunks are not counted as used. A directory with children is not such a leftover
  // (a subtree cut off from the root is refused below).
  if (!Fault("keep_orphans")) {
    std::unordered_set<uint64_t> named;
    for (auto& [key, ino] : dirents) named.insert(ino);
    for (auto it = inodes_.begin(); it != inodes_.end();) {
      if (it->first == kRootIno || named.contains(it->first) ||
          (it->second->is_dir() && !it->second->children.empty())) {
        ++it;
        continue;
      }
      FARMEM_LOG_WARN(
          "regions metadata: inode/{} has no name (a create or delete cut short): "
          "dropped",
          it->first);
      (void)meta_.remove("inode/" + std::to_string(it->first));
      orphans_dropped_++;
      it = inodes_.erase(it);
    }
  }
  // One tree: every inode reachable from the root through exactly one name (no cycles, no
  // orphans, no second parent), so walks up the tree (rename's cycle check) end at the root.
  std::unordered_map<uint64_t, int> names;
  std::vector<uint64_t> todo{kRootIno};
  names[kRootIno] = 1;
  while (!todo.empty()) {
    auto dir = inodes_[todo.back()];
    todo.pop_back();
    for (auto& [name, child] : dir->children) {
      if (++names[child] > 1)
        return Status::InvalidArgument("regions metadata: inode " + std::to_string(child) +
                                       " has more than one name");
      if (inodes_[child]->is_dir()) todo.push_back(child);
    }
  }
  if (names.size() != inodes_.size())
    return Status::InvalidArgument(
        "regions metadata: " + std::to_string(inodes_.size() - names.size()) +
        " inode(s) not reachable from the root");
  // Every chunk in exactly one map, and only in units that exist.
  for (auto& [ino, in] : inodes_) {
    for (MapEntry e : in->rec.map) {
      if (e == kHole) continue;
      auto u = units_.find(EntryGid(e));
      if (u == units_.end())
        return Status::InvalidArgument("regions metadata: inode " + std::to_string(ino) +
                                       " maps a chunk of unknown unit");
      uint16_t bit = static_cast<uint16_t>(1u << (EntryUnitOffset(e) >> kChunkShift));
      if (u->second->used & bit)
        return Status::InvalidArgument("regions metadata: a chunk is mapped twice");
      u->second->used |= bit;
    }
  }
  return Status::OK();
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

Status RegionStore::Persist(const Inode& in) {
  return PersistRecord(in.rec);
}

Status RegionStore::PersistRecord(const InodeRecord& rec) {
  return meta_.put("inode/" + std::to_string(rec.h.ino), EncodeInode(rec));
}

Status RegionStore::Commit(Inode& in, InodeRecord next) {
  if (Fault("no_meta_rollback")) {
    in.rec = std::move(next);
    return Persist(in);
  }
  FARMEM_RETURN_IF_ERROR(PersistRecord(next));
  in.rec = std::move(next);
  return Status::OK();
}

Status RegionStore::PersistDirent(uint64_t parent, std::string_view name, uint64_t ino) {
  std::string key = "dirent/" + std::to_string(parent) + "/" + std::string(name);
  if (ino == 0) return meta_.remove(key);
  DirentRecord d{ino};
  return meta_.put(key, std::string_view(reinterpret_cast<const char*>(&d), sizeof(d)));
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
  a.attr_flags = h.attr_flags;
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
  auto it = dir->children.find(name);
  if (it == dir->children.end()) return Err(ENOENT, std::string(name));
  FARMEM_ASSIGN_OR_RETURN(auto in, Get(it->second));
  return AttrOf(*in);
}

Result<std::shared_ptr<RegionStore::Inode>> RegionStore::NewInode(uint64_t parent,
                                                                  std::string_view name,
                                                                  uint32_t mode, const Caller& who,
                                                                  std::string_view target) {
  FARMEM_RETURN_IF_ERROR(CheckName(name));
  FARMEM_ASSIGN_OR_RETURN(auto dir, GetDir(parent));
  if (dir->children.contains(name)) return Err(EEXIST, std::string(name));
  auto in = std::make_shared<Inode>();
  InodeRecordHeader& h = in->rec.h;
  h.ino = next_ino_++;
  h.mode = mode;
  h.uid = who.uid;
  h.gid = who.gid;
  h.nlink = (mode & S_IFMT) == S_IFDIR ? 2 : 1;
  h.attr_flags = dir->rec.h.attr_flags;  // inherited from the directory
  if ((mode & S_IFMT) != S_IFLNK) in->rec.hostalloc = dir->rec.hostalloc;
  // ... unless the creating thread set defaults (rsetdefaultattr): they win.
  if (who.defaults != nullptr && (mode & S_IFMT) != S_IFLNK && !Fault("no_thread_defaults")) {
    h.attr_flags = static_cast<uint16_t>((h.attr_flags & ~who.defaults->set) |
                                         (who.defaults->flags & who.defaults->set));
    if (who.defaults->hostalloc) in->rec.hostalloc = *who.defaults->hostalloc;
  }
  h.owner_pid = who.pid > 0 ? TgidOf(who.pid) : 0;  // the process, not the thread
  h.atime_ns = h.mtime_ns = h.ctime_ns = NowNs();
  if (in->is_dir()) in->parent = parent;
  in->rec.target = std::string(target);  // symlinks: in the record before it is first persisted
  FARMEM_RETURN_IF_ERROR(Persist(*in));
  FARMEM_RETURN_IF_ERROR(PersistDirent(parent, name, h.ino));
  inodes_[h.ino] = in;
  if (in->is_reg() && h.owner_pid > 0) WatchOwner(h.owner_pid);
  dir->children.emplace(std::string(name), h.ino);
  if (in->is_dir()) ++dir->rec.h.nlink;
  dir->rec.h.mtime_ns = dir->rec.h.ctime_ns = h.ctime_ns;
  FARMEM_RETURN_IF_ERROR(Persist(*dir));
  return in;
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

// The inode lost a name. Files with no name left and no handle are reclaimed by the caller
// (returns true through `reclaim`).
Status RegionStore::DropLink(const std::shared_ptr<Inode>& in) {
  if (in->rec.h.nlink > 0) --in->rec.h.nlink;
  if (in->is_dir()) in->rec.h.nlink = 0;
  in->rec.h.ctime_ns = NowNs();
  if (in->rec.h.nlink == 0) return Status::OK();
  return Persist(*in);
}

// Frees an inode that has no name and no open handle: waits for reads and writes in flight
// (io exclusive), then returns its chunks and removes its record. Called without mu_.
void RegionStore::MaybeReclaim(const std::shared_ptr<Inode>& in) {
  std::unique_lock io(in->io);
  std::lock_guard lk(mu_);
  if (in->reclaimed || in->rec.h.nlink != 0 || (in->opens != 0 && !Fault("no_pin"))) return;
  in->reclaimed = true;
  for (MapEntry e : in->rec.map)
    if (e != kHole) FreeChunk(e);
  for (MapEntry e : in->deferred) FreeChunk(e);
  in->rec.map.clear();
  in->deferred.clear();
  (void)meta_.remove("inode/" + std::to_string(in->rec.h.ino));
  inodes_.erase(in->rec.h.ino);
}

Status RegionStore::unlink(uint64_t parent, std::string_view name) {
  std::shared_ptr<Inode> victim;
  {
    std::lock_guard lk(mu_);
    FARMEM_ASSIGN_OR_RETURN(auto dir, GetDir(parent));
    auto it = dir->children.find(name);
    if (it == dir->children.end()) return Err(ENOENT, std::string(name));
    FARMEM_ASSIGN_OR_RETURN(victim, Get(it->second));
    if (victim->is_dir()) return Err(EISDIR, std::string(name) + " is a directory");
    FARMEM_RETURN_IF_ERROR(PersistDirent(parent, name, 0));
    dir->children.erase(it);
    dir->rec.h.mtime_ns = dir->rec.h.ctime_ns = NowNs();
    FARMEM_RETURN_IF_ERROR(Persist(*dir));
    FARMEM_RETURN_IF_ERROR(DropLink(victim));
  }
  MaybeReclaim(victim);
  return Status::OK();
}

Status RegionStore::rmdir(uint64_t parent, std::string_view name) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto dir, GetDir(parent));
  auto it = dir->children.find(name);
  if (it == dir->children.end()) return Err(ENOENT, std::string(name));
  FARMEM_ASSIGN_OR_RETURN(auto victim, Get(it->second));
  if (!victim->is_dir()) return Err(ENOTDIR, std::string(name) + " is not a directory");
  if (!victim->children.empty()) return Err(ENOTEMPTY, std::string(name) + " is not empty");
  FARMEM_RETURN_IF_ERROR(PersistDirent(parent, name, 0));
  dir->children.erase(it);
  --dir->rec.h.nlink;
  dir->rec.h.mtime_ns = dir->rec.h.ctime_ns = NowNs();
  FARMEM_RETURN_IF_ERROR(Persist(*dir));
  (void)meta_.remove("inode/" + std::to_string(victim->rec.h.ino));
  inodes_.erase(victim->rec.h.ino);
  return Status::OK();
}

Status RegionStore::rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                           std::string_view new_name, bool noreplace) {
  std::shared_ptr<Inode> replaced;
  {
    std::lock_guard lk(mu_);
    FARMEM_RETURN_IF_ERROR(CheckName(new_name));
    FARMEM_ASSIGN_OR_RETURN(auto from, GetDir(parent));
    FARMEM_ASSIGN_OR_RETURN(auto to, GetDir(new_parent));
    auto it = from->children.find(name);
    if (it == from->children.end()) return Err(ENOENT, std::string(name));
    FARMEM_ASSIGN_OR_RETURN(auto moving, Get(it->second));
    if (parent == new_parent && name == new_name) return Status::OK();
    if (moving->is_dir()) {
      // Not into its own subtree.
      for (uint64_t p = new_parent;; p = inodes_[p]->parent) {
        if (p == moving->rec.h.ino) return Err(EINVAL, "a directory cannot move into itself");
        if (p == kRootIno) break;
      }
    }
    auto old = to->children.find(new_name);
    if (old != to->children.end()) {
      if (noreplace) return Err(EEXIST, std::string(new_name));
      FARMEM_ASSIGN_OR_RETURN(replaced, Get(old->second));
      if (replaced->is_dir() != moving->is_dir())
        return replaced->is_dir() ? Err(EISDIR, std::string(new_name))
                                  : Err(ENOTDIR, std::string(new_name));
      if (replaced->is_dir() && !replaced->children.empty())
        return Err(ENOTEMPTY, std::string(new_name));
    }
    // Every record the rename changes goes to the store in one transaction, checked against
    // the names as this store knows them: cut short (etcd lost), it changed nothing, so a reload
    // never finds two names for one inode. Memory follows once the store has it.
    const uint64_t ino = moving->rec.h.ino;
    const int64_t now = NowNs();
    auto dirent = [](uint64_t dir, std::string_view n) {
      return "dirent/" + std::to_string(dir) + "/" + std::string(n);
    };
    auto direntValue = [](uint64_t child) {
      DirentRecord d{child};
      return std::string(reinterpret_cast<const char*>(&d), sizeof(d));
    };
    std::vector<MetaCheck> checks{{dirent(parent, name), direntValue(ino)}};
    checks.push_back(
        {dirent(new_parent, new_name),
         replaced ? std::optional<std::string>(direntValue(replaced->rec.h.ino)) : std::nullopt});
    std::vector<MetaWrite> writes{{dirent(new_parent, new_name), direntValue(ino)},
                                  {dirent(parent, name), std::nullopt}};
    InodeRecord from_next = from->rec, to_next = to->rec, moving_next = moving->rec;
    InodeRecord& tn = to == from ? from_next : to_next;  // the target directory's next record
    std::optional<InodeRecord> replaced_next;
    const bool moves_dir = moving->is_dir() && parent != new_parent;
    if (replaced) {
      if (replaced->is_dir()) {
        --tn.h.nlink;
        writes.push_back({"inode/" + std::to_string(replaced->rec.h.ino), std::nullopt});
      } else {
        // As DropLink: a file with no name left keeps its record until it is reclaimed (a
        // record no name leads to is dropped at load).
        replaced_next = replaced->rec;
        if (replaced_next->h.nlink > 0) --replaced_next->h.nlink;
        replaced_next->h.ctime_ns = now;
        if (replaced_next->h.nlink > 0)
          writes.push_back(
              {"inode/" + std::to_string(replaced->rec.h.ino), EncodeInode(*replaced_next)});
      }
    }
    if (moves_dir) {
      --from_next.h.nlink;
      ++tn.h.nlink;
    }
    from_next.h.mtime_ns = from_next.h.ctime_ns = now;
    tn.h.mtime_ns = tn.h.ctime_ns = now;
    moving_next.h.ctime_ns = now;
    writes.push_back({"inode/" + std::to_string(from->rec.h.ino), EncodeInode(from_next)});
    if (to != from)
      writes.push_back({"inode/" + std::to_string(to->rec.h.ino), EncodeInode(to_next)});
    writes.push_back({"inode/" + std::to_string(ino), EncodeInode(moving_next)});
    if (Fault("split_rename")) {
      // The old way: one write after the other; a failure leaves the ones before it.
      for (const MetaWrite& w : writes)
        FARMEM_RETURN_IF_ERROR(w.value ? meta_.put(w.key, *w.value) : meta_.remove(w.key));
    } else {
      Status c = meta_.commit(checks, writes);
      if (!c.ok())
        return c.code() == Code::kFailedPrecondition
                   ? Err(EIO, "rename: the metadata store's names differ from this mount's: " +
                                  c.ToString())
                   : c;
    }
    from->children.erase(it);
    if (replaced) {
      to->children.erase(std::string(new_name));
      if (replaced->is_dir()) {
        inodes_.erase(replaced->rec.h.ino);
        replaced.reset();
      } else {
        replaced->rec = std::move(*replaced_next);
      }
    }
    to->children.emplace(std::string(new_name), ino);
    if (moves_dir) moving->parent = new_parent;
    from->rec = std::move(from_next);
    if (to != from) to->rec = std::move(to_next);
    moving->rec = std::move(moving_next);
  }
  if (replaced) MaybeReclaim(replaced);
  return Status::OK();
}

Result<std::vector<DirEntry>> RegionStore::readdir(uint64_t ino) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto dir, GetDir(ino));
  std::vector<DirEntry> out;
  out.push_back({".", ino, S_IFDIR});
  out.push_back({"..", dir->parent, S_IFDIR});
  for (auto& [name, child] : dir->children) {
    auto c = inodes_.find(child);
    out.push_back({name, child, c == inodes_.end() ? 0u : c->second->rec.h.mode});
  }
  return out;
}

Result<InodeAttr> RegionStore::setattr(uint64_t ino, const SetAttrRequest& req) {
  std::shared_ptr<Inode> in;
  {
    std::lock_guard lk(mu_);
    FARMEM_ASSIGN_OR_RETURN(in, Get(ino));
  }
  std::unique_lock io(in->io);  // no read or write of this inode in flight from here on
  std::unique_lock lk(mu_);
  if (in->revoked) return Err(EIO, "region revoked: its owner process exited");
  if (in->reclaimed) return Err(ENOENT, "inode was deleted");
  int64_t now = NowNs();
  // The change is made on a copy and applied only once the store has it: a failed metadata
  // write (the cluster store unreachable) changes nothing.
  InodeRecord next = in->rec;
  InodeRecordHeader& h = next.h;
  std::vector<MapEntry> cut;
  std::vector<Piece> tail;  // zeroes of the new last chunk's tail, written after the commit
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
  const InodeRecord before = in->rec;
  FARMEM_RETURN_IF_ERROR(Commit(*in, std::move(next)));
  // Zeroed after the commit, so a truncate the store refused leaves the bytes as they were. No
  // read or write runs meanwhile (io is held) and reclaim waits for io too; the chunks cut off
  // are freed only once the zeroing is done, so a rollback can give them back to the map.
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
      // leaves the file as it was. Only the fields this call changed: a setxattr or unlink may
      // have changed the record meanwhile (they take mu_ only).
      InodeRecord back = in->rec;
      back.h.size = before.h.size;
      back.map = before.map;
      back.h.mode = before.h.mode;
      back.h.uid = before.h.uid;
      back.h.gid = before.h.gid;
      back.h.atime_ns = before.h.atime_ns;
      back.h.mtime_ns = before.h.mtime_ns;
      back.h.ctime_ns = before.h.ctime_ns;
      Status r = Commit(*in, std::move(back));
      if (r.ok()) return z;
      // Both failed: the store has the new size and so does memory; the bytes past it in the
      // last chunk were not zeroed (docs/regions.md "Failures").
      FARMEM_LOG_WARN(
          "regions: truncate of inode {}: tail zeroing failed ({}) and so did the "
          "rollback ({}); the size stays changed",
          ino, z.ToString(), r.ToString());
    }
  }
  // Handles of this inode keep what was cut until the last one goes (docs/regions.md).
  if (in->opens > 0 && !Fault("no_pin"))
    in->deferred.insert(in->deferred.end(), cut.begin(), cut.end());
  else
    for (MapEntry e : cut) FreeChunk(e);
  if (!z.ok()) return z;
  return AttrOf(*in);
}

namespace {
struct XattrName {
  std::string_view name;
  uint16_t flag;
};
constexpr XattrName kXattrs[] = {{"user.region.persistent", kAttrPersistent},
                                 {"user.region.multihosted", kAttrMultihosted},
                                 {"user.region.onewriter", kAttrOneWriter}};
constexpr std::string_view kOwnerPidXattr = "user.region.ownerpid";
constexpr std::string_view kHostallocXattr = "user.region.hostalloc";
}  // namespace

Result<std::string> RegionStore::getxattr(uint64_t ino, std::string_view name) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto in, Get(ino));
  if (name == kOwnerPidXattr) return std::to_string(in->rec.h.owner_pid);
  if (name == kHostallocXattr) return in->rec.hostalloc;
  for (const auto& x : kXattrs)
    if (x.name == name) return std::string((in->rec.h.attr_flags & x.flag) ? "1" : "0");
  return Err(ENODATA, std::string(name));
}

Status RegionStore::setxattr(uint64_t ino, std::string_view name, std::string_view value) {
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto in, Get(ino));
  if (name == kOwnerPidXattr) return Err(EPERM, "user.region.ownerpid is set at creation");
  if (name == kHostallocXattr) {
    if ((in->rec.h.mode & S_IFMT) == S_IFLNK) return Err(EINVAL, "a symlink has no HOSTALLOC");
    Status ok = CheckHostalloc(value);
    if (!ok.ok()) return Err(EINVAL, std::string(ok.message()));
    for (const std::string& a : SplitHostalloc(value))
      if (std::none_of(servers_.begin(), servers_.end(), [&](auto& s) { return s->address == a; }))
        return Err(EINVAL, "HOSTALLOC: " + a + " is not a memory server of this mount");
    // Like MULTIHOSTED, it decides where chunks go: fixed once a file has any.
    if (in->is_reg() &&
        std::any_of(in->rec.map.begin(), in->rec.map.end(), [](MapEntry e) { return e; }))
      return Err(EBUSY, "user.region.hostalloc cannot change once the region has data");
    InodeRecord next = in->rec;  // applied once the store has it
    next.hostalloc = std::string(value);
    next.h.ctime_ns = NowNs();
    return Commit(*in, std::move(next));
  }
  for (const auto& x : kXattrs) {
    if (x.name != name) continue;
    if (value != "0" && value != "1") return Err(EINVAL, std::string(name) + " takes 0 or 1");
    // MULTIHOSTED decides where chunks go: fixed once a file has any.
    if (x.flag == kAttrMultihosted && in->is_reg() &&
        std::any_of(in->rec.map.begin(), in->rec.map.end(), [](MapEntry e) { return e; }))
      return Err(EBUSY, "user.region.multihosted cannot change once the region has data");
    InodeRecord next = in->rec;  // applied once the store has it
    if (value == "1")
      next.h.attr_flags |= x.flag;
    else
      next.h.attr_flags &= static_cast<uint16_t>(~x.flag);
    next.h.ctime_ns = NowNs();
    return Commit(*in, std::move(next));
  }
  // Other names (ACLs, security labels, user xattrs) are not stored: ENOTSUP, which tools such as
  // cp -a take as "this file system has none".
  return Err(ENOTSUP, "only user.region.{persistent,multihosted,onewriter,hostalloc} can be set");
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
  return Err(ENOTSUP,
             "only user.region.{persistent,multihosted,onewriter,hostalloc} have defaults");
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
  std::lock_guard lk(mu_);
  FARMEM_ASSIGN_OR_RETURN(auto in, Get(ino));
  if (in->revoked) return Err(EIO, "region revoked: its owner process exited");
  if (write && (in->rec.h.attr_flags & kAttrOneWriter) && in->writers > 0 && !Fault("no_onewriter"))
    return Err(EBUSY, "ONEWRITER region already has a writer");
  ++in->opens;
  if (write) ++in->writers;
  uint64_t h = next_handle_++;
  handles_[h] = in;
  if (write) h |= uint64_t{1} << 63;  // the handle remembers it was a writer
  return h;
}

Status RegionStore::release(uint64_t handle) {
  std::shared_ptr<Inode> in;
  {
    std::lock_guard lk(mu_);
    bool writer = handle >> 63;
    auto it = handles_.find(handle & ~(uint64_t{1} << 63));
    if (it == handles_.end()) return Err(EBADF, "unknown handle");
    in = it->second;
    handles_.erase(it);
    --in->opens;
    if (writer) --in->writers;
    if (in->opens == 0 && !in->deferred.empty()) {
      for (MapEntry e : in->deferred) FreeChunk(e);
      in->deferred.clear();
    }
  }
  MaybeReclaim(in);
  return Status::OK();
}

Result<RemoteRef> RegionStore::RefOf(MapEntry e) const {
  auto u = units_.find(EntryGid(e));
  if (u == units_.end()) return Err(EIO, "map entry of an unknown unit");
  RemoteRef r = u->second->base;
  r.offset += EntryUnitOffset(e);
  return r;
}

Result<MapEntry> RegionStore::AllocChunk(uint32_t server, bool& known_zero) {
  for (auto& [gid, u] : units_) {
    if (u->server != server || u->used == 0xffff) continue;
    unsigned i = static_cast<unsigned>(std::countr_one(u->used));
    const auto bit = static_cast<uint16_t>(1u << i);
    u->used |= bit;
    known_zero = !(u->touched & bit) || Fault("no_touched");
    u->touched |= bit;
    return MakeMapEntry(static_cast<uint32_t>(gid), uint64_t{i} << kChunkShift);
  }
  uint32_t gid = next_gid_;
  while (units_.contains(gid)) ++gid;
  if (gid > kMaxGid) return Err(ENOSPC, "unit table full (2^17 units)");
  Server& s = *servers_[server];
  auto a = s.client->alloc_raw(
      kStepBytes, options_.persistent_units ? Lifetime::kPersistent : Lifetime::kSession);
  if (!a.ok()) {
    alloc_failures_++;
    if (a.status().code() == Code::kResourceExhausted)
      return Err(ENOSPC, "server " + s.address + " is out of memory");
    return Err(EIO, "ALLOC_RAW at " + s.address + ": " + a.status().ToString());
  }
  UnitRecord rec{s.address, a->ref.key, a->ref.offset, kStepBytes};
  Status p = meta_.put("unit/" + std::to_string(gid), EncodeUnit(rec));
  if (!p.ok()) {
    (void)s.client->free_raw(a->ref);
    return p;
  }
  auto u = std::make_unique<Unit>();
  u->server = server;
  u->base = a->ref;
  u->used = 1;
  u->touched = 1;
  known_zero = true;  // fresh from ALLOC_RAW: zeroed
  units_[gid] = std::move(u);
  next_gid_ = gid + 1;
  return MakeMapEntry(gid, 0);
}

void RegionStore::FreeChunk(MapEntry e) {
  auto it = units_.find(EntryGid(e));
  if (it == units_.end()) return;
  Unit& u = *it->second;
  u.used &= static_cast<uint16_t>(~(1u << (EntryUnitOffset(e) >> kChunkShift)));
  if (u.used != 0) return;
  // An empty unit goes back to its server, so statfs and other clients see the memory. Its
  // record goes first: a record left behind would name memory the server may have handed to
  // someone else by the next Load. If the record cannot be removed (the cluster store is
  // unreachable) the unit stays, empty, and is used again.
  if (Fault("free_unit_first")) (void)servers_[u.server]->client->free_raw(u.base);
  if (!meta_.remove("unit/" + std::to_string(it->first)).ok()) return;
  if (!Fault("free_unit_first")) (void)servers_[u.server]->client->free_raw(u.base);
  if (it->first < next_gid_) next_gid_ = static_cast<uint32_t>(it->first);
  units_.erase(it);
  units_freed_++;
}

Result<size_t> RegionStore::read(uint64_t ino, uint64_t offset, std::span<std::byte> out) {
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
    if (in->revoked) return Err(EIO, "region revoked: its owner process exited");
    if (in->reclaimed) return Err(ENOENT, "inode was deleted");
    if (!in->is_reg()) return Err(EISDIR, "read of a non-file");
    uint64_t size = in->rec.h.size;
    if (offset >= size) return size_t{0};
    n = static_cast<size_t>(std::min<uint64_t>(out.size(), size - offset));
    for (uint64_t pos = offset; pos < offset + n;) {
      uint64_t c = ChunkOf(pos);
      uint64_t len = std::min<uint64_t>((c + 1) * kChunkBytes, offset + n) - pos;
      std::byte* dst = out.data() + (pos - offset);
      MapEntry e = c < in->rec.map.size() ? in->rec.map[c] : kHole;
      // A chunk a write in flight allocated is still a hole for readers: its bytes may be a freed
      // region's until that write's zeroing is done.
      if (e == kHole || in->Fresh(c)) {
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
  std::vector<Piece> pieces;
  std::vector<uint64_t> fresh;  // chunk indexes allocated by this write
  std::vector<uint64_t> dirty;  // those of them that may hold a freed region's bytes
  uint64_t end = offset + data.size();
  std::list<Inode::Claim>::iterator claim;
  {
    std::unique_lock lk(mu_);
    uint64_t from = offset, to = end;
    for (;;) {
      if (in->revoked) return Err(EIO, "region revoked: its owner process exited");
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
    FARMEM_RETURN_IF_ERROR(AllocRange(*in, ChunkOf(offset), ChunkOf(end - 1), fresh, dirty));
    for (uint64_t pos = offset; pos < end;) {
      uint64_t c = ChunkOf(pos);
      uint64_t len = std::min<uint64_t>((c + 1) * kChunkBytes, end) - pos;
      FARMEM_ASSIGN_OR_RETURN(RemoteRef ref, RefOf(in->rec.map[c]));
      RemoteRef at = ref;
      at.offset += pos % kChunkBytes;
      pieces.push_back(Piece{at, nullptr, data.data() + (pos - offset), len});
      pos += len;
    }
    // A reused chunk may hold a freed region's bytes: zero what this write does not cover. (A
    // chunk never used since its unit was granted reads zero already: no transfer.)
    if (!Fault("no_zero")) {
      for (uint64_t c : dirty) {
        FARMEM_ASSIGN_OR_RETURN(RemoteRef ref, RefOf(in->rec.map[c]));
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
    claim = in->claims.insert(in->claims.end(), Inode::Claim{from, to, fresh});
  }
  remote_writes_ += pieces.size();
  Status w = RunPieces(Sched(), pieces, true);
  std::lock_guard lk(mu_);
  in->claims.erase(claim);
  claims_cv_.notify_all();
  if (!w.ok()) {
    Unalloc(*in, fresh);
    return w;
  }
  // The new size and times count only once the store has them. The chunks this write allocated
  // stay in the map either way: they hold its bytes, read as nothing past the size, and the next
  // record written of this inode names them (freeing them here could free chunks another write's
  // record already named).
  const InodeRecordHeader before = in->rec.h;
  in->rec.h.size = std::max(in->rec.h.size, end);
  in->rec.h.mtime_ns = in->rec.h.ctime_ns = NowNs();
  Status p = Persist(*in);
  if (!p.ok() && !Fault("no_meta_rollback")) in->rec.h = before;
  return p;
}

Status RegionStore::AllocRange(Inode& in, uint64_t first, uint64_t last,
                               std::vector<uint64_t>& fresh, std::vector<uint64_t>& dirty) {
  // HOSTALLOC: the servers this region may use, in its list's order (all when empty); a
  // single-host region lives on the first, a MULTIHOSTED one goes round-robin over them.
  std::vector<uint32_t> hosts;
  if (in.rec.hostalloc.empty() || Fault("no_hostalloc")) {
    for (uint32_t i = 0; i < servers_.size(); ++i) hosts.push_back(i);
  } else {
    for (const std::string& a : SplitHostalloc(in.rec.hostalloc)) {
      auto it =
          std::find_if(servers_.begin(), servers_.end(), [&](auto& s) { return s->address == a; });
      if (it == servers_.end())
        return Err(EIO, "HOSTALLOC names " + a + ", which is not a memory server of this mount");
      hosts.push_back(static_cast<uint32_t>(it - servers_.begin()));
    }
  }
  if (in.rec.map.size() <= last) in.rec.map.resize(last + 1, kHole);
  uint32_t n = static_cast<uint32_t>(hosts.size());
  bool multi = in.rec.h.attr_flags & kAttrMultihosted;
  for (uint64_t c = first; c <= last; ++c) {
    if (in.rec.map[c] != kHole) continue;
    bool zero = false;
    auto e = AllocChunk(
        hosts[multi ? StepServer(c, static_cast<uint32_t>(in.rec.h.ino % n), n) : 0], zero);
    if (!e.ok()) {
      if (!Fault("no_rollback")) Unalloc(in, fresh);
      return e.status();
    }
    in.rec.map[c] = *e;
    fresh.push_back(c);
    if (!zero) dirty.push_back(c);
  }
  return Status::OK();
}

void RegionStore::Unalloc(Inode& in, const std::vector<uint64_t>& fresh) {
  for (uint64_t c : fresh) {
    FreeChunk(in.rec.map[c]);
    in.rec.map[c] = kHole;
  }
  while (!in.rec.map.empty() && in.rec.map.back() == kHole &&
         in.rec.map.size() > ChunksFor(in.rec.h.size))
    in.rec.map.pop_back();
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
  std::shared_ptr<Inode> in;
  {
    std::lock_guard lk(mu_);
    FARMEM_ASSIGN_OR_RETURN(in, Get(ino));
  }
  std::unique_lock io(in->io);  // no read or write of this inode in flight: the map is ours
  std::unique_lock lk(mu_);
  if (in->revoked) return Err(EIO, "region revoked: its owner process exited");
  if (in->reclaimed) return Err(ENOENT, "inode was deleted");
  if (!in->is_reg()) return Err(in->is_dir() ? EISDIR : EINVAL, "fallocate of a non-file");
  const uint64_t end = offset + len;
  const uint64_t first = ChunkOf(offset), last = ChunkOf(end - 1);
  std::vector<Piece> zero;
  std::vector<uint64_t> fresh, dirty, whole;
  if (punch) {
    // Partial chunks are zeroed where the range covers them; whole ones are cut afterwards, so a
    // failed zeroing changes nothing.
    for (uint64_t c = first; c <= last && c < in->rec.map.size(); ++c) {
      if (in->rec.map[c] == kHole) continue;
      uint64_t cs = c * kChunkBytes, ce = cs + kChunkBytes;
      if (offset <= cs && end >= ce) {
        whole.push_back(c);
        continue;
      }
      if (Fault("no_punch_zero")) continue;
      FARMEM_ASSIGN_OR_RETURN(RemoteRef ref, RefOf(in->rec.map[c]));
      uint64_t from = std::max(offset, cs), to = std::min(end, ce);
      ref.offset += from - cs;
      zero.push_back(Piece{ref, nullptr, ZeroChunk(), to - from});
    }
  } else if (!Fault("no_prealloc")) {
    // ZERO_RANGE: chunks allocated before the call are zeroed where the range covers them (a
    // chunk stays allocated, so later writes there cannot fail with ENOSPC); the holes get chunks
    // as for mode 0.
    if (zero_range && !Fault("no_zero_range"))
      for (uint64_t c = first; c <= last && c < in->rec.map.size(); ++c) {
        if (in->rec.map[c] == kHole) continue;
        FARMEM_ASSIGN_OR_RETURN(RemoteRef ref, RefOf(in->rec.map[c]));
        const uint64_t cs = c * kChunkBytes;
        const uint64_t from = std::max(offset, cs), to = std::min(end, cs + kChunkBytes);
        ref.offset += from - cs;
        zero.push_back(Piece{ref, nullptr, ZeroChunk(), to - from});
      }
    FARMEM_RETURN_IF_ERROR(AllocRange(*in, first, last, fresh, dirty));
    // Reused chunks may hold a freed region's bytes, and all of a fresh chunk reads zero.
    if (!Fault("no_zero"))
      for (uint64_t c : dirty) {
        FARMEM_ASSIGN_OR_RETURN(RemoteRef ref, RefOf(in->rec.map[c]));
        zero.push_back(Piece{ref, nullptr, ZeroChunk(), kChunkBytes});
      }
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
    Unalloc(*in, fresh);
    return w;
  }
  // The punched chunks are freed, and the new size counts, only once the store has the record
  // (a failed metadata write changes nothing; chunks a preallocation got stay in the map, past
  // the size where it was to grow, and the next record written names them).
  InodeRecord next = in->rec;
  std::vector<MapEntry> cut;
  for (uint64_t c : whole) {
    cut.push_back(next.map[c]);
    next.map[c] = kHole;
  }
  // Trailing holes past the size go (as Unalloc drops them).
  while (!next.map.empty() && next.map.back() == kHole && next.map.size() > ChunksFor(next.h.size))
    next.map.pop_back();
  int64_t now = NowNs();
  if ((mode == 0 || mode == FALLOC_FL_ZERO_RANGE) && end > next.h.size) {
    next.h.size = end;
    next.h.mtime_ns = now;
  }
  if (punch || zero_range) next.h.mtime_ns = now;  // the bytes changed
  next.h.ctime_ns = now;
  FARMEM_RETURN_IF_ERROR(Commit(*in, std::move(next)));
  // As for a shrink: open handles keep the memory until the last one goes.
  if (in->opens > 0 && !Fault("no_pin"))
    in->deferred.insert(in->deferred.end(), cut.begin(), cut.end());
  else
    for (MapEntry e : cut) FreeChunk(e);
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
  std::lock_guard lk(mu_);
  s.units = units_.size();
  for (auto& [gid, u] : units_) s.chunks_in_use += static_cast<uint64_t>(std::popcount(u->used));
  return s;
}

}  // namespace farmem::regions

namespace farmem::regions {

void RegionStore::WatchOwner(int32_t pid) {
  if (owners_.contains(pid)) return;
  int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd >= 0) {
    owners_[pid] = fd;
  } else if (errno == ESRCH) {
    owners_[pid] = -1;  // already gone: reaped at the next ReapOwners
  }
  // Other errors (no pidfd_open, out of fds, a made-up pid of another kind): not watched, so
  // the region behaves as PERSISTENT (docs/regions.md "Attributes").
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
    if (dead.empty() || Fault("no_reap")) return out;
    auto doomed = [&](const Inode& in) {
      return in.is_reg() && in.rec.h.nlink > 0 &&
             std::find(dead.begin(), dead.end(), in.rec.h.owner_pid) != dead.end() &&
             (!(in.rec.h.attr_flags & kAttrPersistent) || Fault("reap_persistent"));
    };
    for (auto& [dino, dir] : inodes_) {
      if (!dir->is_dir()) continue;
      for (auto it = dir->children.begin(); it != dir->children.end() && failed.ok();) {
        auto c = inodes_.find(it->second);
        if (c == inodes_.end() || !doomed(*c->second)) {
          ++it;
          continue;
        }
        std::shared_ptr<Inode> in = c->second;
        failed = PersistDirent(dino, it->first, 0);
        if (!failed.ok()) break;  // this one unchanged
        // The name is gone from the store: the rest follows in memory even if a record write
        // fails (the next change of the directory rewrites it).
        out.push_back({dino, it->first, in->rec.h.ino, in->rec.h.owner_pid});
        it = dir->children.erase(it);
        dir->rec.h.mtime_ns = dir->rec.h.ctime_ns = NowNs();
        failed = Persist(*dir);
        Status dropped = DropLink(in);
        if (failed.ok()) failed = dropped;
        if (!Fault("no_revoke")) in->revoked = true;
        victims.push_back(std::move(in));
      }
      if (!failed.ok()) break;
    }
    // A metadata write failed: the owners stay marked as gone, so the next call goes on.
    if (!failed.ok())
      for (int32_t pid : dead) owners_.emplace(pid, -1);
  }
  for (auto& in : victims) MaybeReclaim(in);
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
    auto d = inodes_.find(dir);
    if (d == inodes_.end()) continue;
    for (const auto& [name, child] : d->second->children) {
      std::string path = prefix + "/" + name;
      auto c = inodes_.find(child);
      if (c != inodes_.end() && c->second->is_dir()) todo.emplace_back(child, path);
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
      << " units_freed=" << st.units_freed << " alloc_failures=" << st.alloc_failures << "\n";
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
      o << "gid=" << gid << " server=" << u->server << " address=" << servers_[u->server]->address
        << " key=" << u->base.key << " offset=" << u->base.offset << " bytes=" << kStepBytes
        << " used_bitmap=" << used << " chunks_in_use=" << std::popcount(u->used) << "\n";
    }
  } else if (name == "open") {
    auto paths = Paths();
    std::map<uint64_t, std::shared_ptr<Inode>> open;
    for (const auto& [h, in] : handles_) open[in->rec.h.ino] = in;
    for (const auto& [ino, in] : open) {
      auto p = paths.find(ino);
      o << "ino=" << ino << " path=" << (p == paths.end() ? "-" : EscapeField(p->second))
        << " opens=" << in->opens << " writers=" << in->writers << "\n";
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
        << " hostalloc=" << (in->rec.hostalloc.empty() ? "-" : EscapeField(in->rec.hostalloc))
        << " map=";
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
  if (in->revoked) return Err(EIO, "region revoked: its owner process exited");
  if (in->reclaimed) return Err(ENOENT, "inode was deleted");
  MapDescriptor d;
  d.ino = ino;
  d.size = in->rec.h.size;
  for (const auto& s : servers_) d.servers.push_back(s->address);
  std::map<uint32_t, uint32_t> index;  // gid -> position in d.units
  d.chunks.assign(std::min<uint64_t>(in->rec.map.size(), ChunksFor(d.size)), 0);
  for (size_t c = 0; c < d.chunks.size(); ++c) {
    const MapEntry e = in->rec.map[c];
    if (e == kHole || in->Fresh(c)) continue;
    auto u = units_.find(EntryGid(e));
    if (u == units_.end()) return Err(EIO, "map entry of an unknown unit");
    auto [it, fresh] = index.emplace(EntryGid(e), static_cast<uint32_t>(d.units.size()));
    if (fresh)
      d.units.push_back(MapUnit{u->second->server, 0, u->second->base.key, u->second->base.offset});
    d.chunks[c] = MapChunkWord(it->second, EntryUnitOffset(e) >> kChunkShift);
  }
  return d;
}

}  // namespace farmem::regions
