// RegionStore: the remote-regions file system without FUSE (docs/regions.md "Store"): an inode
// table and directory tree whose metadata is written through a MetaStore (the cluster store), and
// region data in 128 KiB chunks carved from 2 MiB units that farmemd servers grant by ALLOC_RAW,
// read and written one-sidedly. Thread-safe: any number of threads (the FUSE loop's) call it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "farmem/client.h"
#include "farmem/cluster.h"
#include "farmem/node.h"
#include "farmem/status.h"
#include "regions/format/region_layout.h"

namespace farmem::regions {

// Where the store keeps its metadata: a small key/value interface so the cluster store
// (memory:// for one mount, etcd for several) can be swapped. Keys are relative to the store's
// prefix. Thread-safe.
// A write of MetaStore::commit: put `value`, or remove the key (value unset; OK if absent).
struct MetaWrite {
  std::string key;
  std::optional<std::string> value;
};
// A condition of MetaStore::commit: the key holds `value`, or is absent (value unset).
struct MetaCheck {
  std::string key;
  std::optional<std::string> value;
};

class MetaStore {
 public:
  virtual ~MetaStore() = default;
  virtual Status put(std::string_view key, std::string_view value) = 0;
  virtual Status remove(std::string_view key) = 0;  // OK if absent
  // Every write or none (the cluster store's transaction; etcd's txn): applied only if every
  // check holds (FailedPrecondition otherwise). Each key at most once; at most 64 writes.
  virtual Status commit(const std::vector<MetaCheck>& checks,
                        const std::vector<MetaWrite>& writes) = 0;
  virtual Result<std::vector<std::pair<std::string, std::string>>> list(
      std::string_view prefix) = 0;
};
// The cluster store as a MetaStore, every key under `prefix` ("regions/" by default). `cluster`
// must outlive it.
std::unique_ptr<MetaStore> NewClusterMetaStore(Cluster& cluster, std::string prefix = "regions/");

inline constexpr uint64_t kRootIno = 1;  // FUSE_ROOT_ID

struct RegionStoreOptions {
  // farmemd bootstrap addresses ("host:port"); at least one. A region lives on the first
  // (its home) unless MULTIHOSTED.
  std::vector<std::string> servers;
  // Units are allocated Lifetime::kPersistent (they survive this store; a later store opened on
  // the same metadata finds them) or kSession (freed when this store's clients go away).
  bool persistent_units = false;
  std::chrono::milliseconds session_ttl{10000};
  // Attribute flags of the root directory when the metadata holds none (new namespace).
  uint16_t root_attrs = 0;
  uint32_t root_mode = 0755;
  // Test hook: a named step ("truncate_tail": a shrink's zeroing of its last chunk's tail) fails
  // as a failed remote transfer would (EIO) when this returns true for its name. Unset: never.
  std::function<bool(std::string_view step)> fail_step;
};

// What stat() reports; times in nanoseconds since the epoch.
struct InodeAttr {
  uint64_t ino = 0;
  uint32_t mode = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t nlink = 0;
  uint64_t size = 0;
  uint64_t chunks = 0;  // chunks allocated (st_blocks = chunks * 256)
  int64_t atime_ns = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  uint16_t attr_flags = 0;
  int32_t owner_pid = 0;
};

struct DirEntry {
  std::string name;
  uint64_t ino = 0;
  uint32_t mode = 0;
};

// Fields of setattr; unset ones stay.
struct SetAttrRequest {
  std::optional<uint64_t> size;
  std::optional<uint32_t> mode;  // permission bits only
  std::optional<uint32_t> uid;
  std::optional<uint32_t> gid;
  std::optional<int64_t> atime_ns;
  std::optional<int64_t> mtime_ns;
};

// Attribute defaults for the regions one thread creates (`rsetdefaultattr`, docs/regions.md
// "Attributes"): they override what a new file or directory inherits from its directory.
struct AttrDefaults {
  uint16_t set = 0;    // which attribute flags (kAttr*) have a default
  uint16_t flags = 0;  // their values (bits outside `set` are 0)
  std::optional<std::string> hostalloc;
  bool empty() const { return set == 0 && !hostalloc; }
};

// Who asks (FUSE request context).
struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
  int32_t pid = 0;
  const AttrDefaults* defaults = nullptr;  // the calling thread's, if it set any
};

// A region deleted because its owner process exited (ReapOwners): the FUSE daemon drops the
// kernel's cached name and pages of it.
struct ReapedRegion {
  uint64_t parent = 0;
  std::string name;
  uint64_t ino = 0;
  int32_t owner_pid = 0;
};

struct StoreStatFs {
  uint64_t budget_bytes = 0;  // sum of the servers' budgets
  uint64_t free_bytes = 0;    // what the servers have left plus free chunks in our units
  uint64_t inodes = 0;
};

// Counters (tests use remote_reads to show holes are not read remotely).
struct RegionStoreStats {
  uint64_t remote_reads = 0;
  uint64_t remote_writes = 0;
  uint64_t units = 0;
  uint64_t chunks_in_use = 0;
  uint64_t units_freed = 0;
  uint64_t alloc_failures = 0;
  uint64_t orphans_dropped = 0;  // nameless inode records Load dropped (a change cut short)
};

// Errors carry POSIX meaning: ErrnoOf(status) gives the errno FUSE replies with (messages start
// with the errno name, e.g. "ENOTEMPTY: ...").
int ErrnoOf(const Status& s);
// The status ErrnoOf maps back to `e` (one of the errnos it knows; others read as EIO/EINVAL).
Status ErrnoStatus(int e, std::string_view what);

// A value of an introspection report field: bytes that would split a line or a field (space,
// control bytes, '%', '=') as %XX.
std::string EscapeField(std::string_view v);

class RegionStore {
 public:
  // Connects a RawClient to every server through `node` (started, outlives the store), loads the
  // namespace from `meta` (outlives the store) or creates the root directory.
  static Result<std::unique_ptr<RegionStore>> Open(Node& node, MetaStore& meta,
                                                   RegionStoreOptions options);
  ~RegionStore();
  RegionStore(const RegionStore&) = delete;
  RegionStore& operator=(const RegionStore&) = delete;

  // ---- namespace ----
  Result<InodeAttr> getattr(uint64_t ino);
  Result<InodeAttr> lookup(uint64_t parent, std::string_view name);
  // A regular file (a region); inherits the parent's attribute flags. EEXIST if the name exists.
  Result<InodeAttr> create(uint64_t parent, std::string_view name, uint32_t mode,
                           const Caller& who);
  Result<InodeAttr> mkdir(uint64_t parent, std::string_view name, uint32_t mode, const Caller& who);
  Result<InodeAttr> symlink(uint64_t parent, std::string_view name, std::string_view target,
                            const Caller& who);
  Result<std::string> readlink(uint64_t ino);
  // The inode's chunks are returned once no handle has it open.
  Status unlink(uint64_t parent, std::string_view name);
  Status rmdir(uint64_t parent, std::string_view name);
  // Replaces an existing target (a file by a file, an empty directory by a directory).
  // `noreplace`: EEXIST instead.
  Status rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                std::string_view new_name, bool noreplace);
  Result<std::vector<DirEntry>> readdir(uint64_t ino);
  // size: truncate (grow leaves a hole; shrink returns whole chunks past the end once no read
  // or write of this inode is in flight, and zeroes the tail of the last chunk).
  Result<InodeAttr> setattr(uint64_t ino, const SetAttrRequest& req);

  // ---- region attributes as xattrs "user.region.{persistent,multihosted,onewriter,ownerpid,
  // hostalloc}" (hostalloc: comma-separated server addresses of this store, "" = all) ----
  Result<std::string> getxattr(uint64_t ino, std::string_view name);
  Status setxattr(uint64_t ino, std::string_view name, std::string_view value);
  Result<std::vector<std::string>> listxattr(uint64_t ino);
  // Flags go back to 0, HOSTALLOC to "" (all servers).
  Status removexattr(uint64_t ino, std::string_view name);
  // Checks `value` for the attribute xattr `name` as setxattr would (EINVAL, EPERM for
  // ownerpid, ENOTSUP for other names) and records it in `into`; "" as a flag's value removes
  // its default. No inode is touched.
  Status SetDefaultAttr(AttrDefaults& into, std::string_view name, std::string_view value);
  // The value `defaults` holds for `name`, ENODATA without one.
  static Result<std::string> DefaultAttr(const AttrDefaults& defaults, std::string_view name);

  // ---- data ----
  // A handle pins the inode (its chunks stay until the last handle goes). `write`: counts as a
  // writer for ONEWRITER (a second writer gets EBUSY).
  Result<uint64_t> open(uint64_t ino, bool write);
  Status release(uint64_t handle);
  // Bytes read (short at end of file); holes are zeros without a remote read.
  Result<size_t> read(uint64_t ino, uint64_t offset, std::span<std::byte> out);
  // Allocates the chunks it needs (ENOSPC, with nothing changed, if the servers are out of
  // memory), writes delivery-complete, then extends the size: when it returns OK the bytes are
  // in remote memory.
  Status write(uint64_t ino, uint64_t offset, std::span<const std::byte> data);

  // fallocate(2). mode 0 or FALLOC_FL_KEEP_SIZE: every chunk of [offset, offset+len) gets
  // allocated and zeroed, so later writes there cannot fail with ENOSPC; mode 0 also extends the
  // size (KEEP_SIZE preallocates past the end without changing it). ENOSPC changes nothing.
  // FALLOC_FL_PUNCH_HOLE|KEEP_SIZE: whole chunks in the range become holes (their memory returns
  // at the last release, as for a truncate) and the covered bytes of partial ones are zeroed.
  // FALLOC_FL_ZERO_RANGE[|KEEP_SIZE]: the range reads zero afterwards and is allocated as for
  // mode 0 / KEEP_SIZE (chunks it already had are zeroed in place, holes get zeroed chunks).
  // Any other mode: ENOTSUP (== EOPNOTSUPP).
  Status fallocate(uint64_t ino, int mode, uint64_t offset, uint64_t len);

  Result<StoreStatFs> statfs();
  RegionStoreStats stats() const;

  // ---- OWNERPID / PERSISTENT (docs/regions.md "Attributes") ----
  // A regular file records its creating process (the TGID of Caller::pid) and the store watches
  // that process with a pidfd. Waits up to `wait` for a watched process to exit; then every
  // region of every exited owner that is not PERSISTENT (at that moment) is unlinked and revoked:
  // its name goes, IO through handles still open gets EIO, its memory returns at the last
  // release. Returns what was deleted. Regions whose owner is unknown (pid 0: another pid
  // namespace; no pidfd) are never deleted this way. Called in a loop by one thread.
  Result<std::vector<ReapedRegion>> ReapOwners(std::chrono::milliseconds wait);

  // ---- introspection (the paper's /proc/regions; docs/regions.md "Introspection") ----
  // The text of one report: "hosts" (one line per memory server), "memusage" (one line),
  // "pools" (one line per 2 MiB unit), "open" (one line per open region), "files" (one line per
  // region: path, size, attributes, owner, chunk map). Every line is space-separated key=value
  // fields; paths are %XX-escaped (space, '%', '=', control bytes). NotFound for another name.
  Result<std::string> report(std::string_view name);
  static constexpr std::string_view kReports[] = {"hosts", "memusage", "pools", "open", "files"};

 private:
  struct Inode;
  struct Unit;
  struct Server;
  RegionStore(Node& node, MetaStore& meta, RegionStoreOptions options);

  Status Load();
  Result<std::shared_ptr<Inode>> Get(uint64_t ino);     // mu_ held
  Result<std::shared_ptr<Inode>> GetDir(uint64_t ino);  // mu_ held
  Result<std::shared_ptr<Inode>> NewInode(uint64_t parent, std::string_view name, uint32_t mode,
                                          const Caller& who,
                                          std::string_view target = {});  // mu_ held
  Status Persist(const Inode& in);                                        // mu_ held
  Status PersistRecord(const InodeRecord& rec);                           // mu_ held
  // Writes `next` (a changed copy of in.rec) to the store, then makes it in.rec; when the write
  // fails in.rec stays as it was (mu_ held).
  Status Commit(Inode& in, InodeRecord next);
  Status PersistDirent(uint64_t parent, std::string_view name, uint64_t ino);
  Status DropLink(const std::shared_ptr<Inode>& in);    // mu_ held
  void MaybeReclaim(const std::shared_ptr<Inode>& in);  // mu_ held
  // `known_zero`: the chunk was never used since its unit was granted (it reads zero). mu_ held.
  Result<MapEntry> AllocChunk(uint32_t server, bool& known_zero);
  // Allocates every hole among chunks [first, last] of `in` (growing its map), appending their
  // indexes to `fresh` and those that may hold a freed region's bytes (not known zero) to `dirty`;
  // on failure frees what it got (Unalloc) and returns the error. mu_ held.
  Status AllocRange(Inode& in, uint64_t first, uint64_t last, std::vector<uint64_t>& fresh,
                    std::vector<uint64_t>& dirty);
  void Unalloc(Inode& in, const std::vector<uint64_t>& fresh);  // mu_ held
  void FreeChunk(MapEntry e);                                   // mu_ held
  Result<RemoteRef> RefOf(MapEntry e) const;                    // mu_ held
  Scheduler& Sched();
  InodeAttr AttrOf(const Inode& in) const;
  std::unordered_map<uint64_t, std::string> Paths() const;  // mu_ held; ino -> "/a/b"
  // Starts watching process `pid` with a pidfd (mu_ held); one that does not exist has exited.
  void WatchOwner(int32_t pid);

  Node& node_;
  MetaStore& meta_;
  RegionStoreOptions options_;
  std::vector<std::unique_ptr<Server>> servers_;

  mutable std::mutex mu_;  // the namespace, inodes' metadata, units, handles, write claims
  std::condition_variable claims_cv_;  // with mu_: some write's claimed span was released
  std::unordered_map<uint64_t, std::shared_ptr<Inode>> inodes_;
  std::map<uint64_t, std::unique_ptr<Unit>> units_;  // by gid
  std::unordered_map<uint64_t, std::shared_ptr<Inode>> handles_;
  std::map<int32_t, int> owners_;  // watched owner TGID -> pidfd (-1: known to have exited)
  uint64_t next_ino_ = kRootIno + 1;
  uint64_t next_handle_ = 1;
  uint32_t next_gid_ = 1;

  std::mutex sched_mu_;  // one Scheduler per calling thread
  std::unordered_map<std::thread::id, std::unique_ptr<Scheduler>> scheds_;

  std::atomic<uint64_t> remote_reads_{0}, remote_writes_{0}, units_freed_{0}, alloc_failures_{0},
      orphans_dropped_{0};

 public:
  // rmmap of a file in a mount (docs/regions_mmap.md): where the chunks of regular file `ino` live
  // now, for the xattr "user.region.map" (the token is left empty: the mount adds it). Chunks
  // within the size only; those a write in flight allocated are holes, as for read. EINVAL for a
  // directory or symlink, EIO for a revoked region.
  Result<MapDescriptor> map_descriptor(uint64_t ino);
};

}  // namespace farmem::regions
