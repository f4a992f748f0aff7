// RegionStore: the remote-regions file system without FUSE (docs/regions.md "Store"): an inode
// table and directory tree mirrored from the cluster store (a MetaStore) and kept current by a
// watch, so that several stores (mounts, on one host or several) share one namespace; region data
// in 128 KiB chunks carved from 2 MiB units that farmemd servers grant by ALLOC_RAW, read and
// written one-sidedly. Every change is a compare-and-set transaction on the records it read;
// freed chunks return only once no mount has their inode open (docs/regions.md "Several mounts").
// Thread-safe: any number of threads (the FUSE loop's) call it; the watch callback and one
// housekeeping thread of its own run beside them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "farmem/client.h"
#include "farmem/cluster.h"
#include "farmem/node.h"
#include "farmem/status.h"
#include "regions/format/region_layout.h"

namespace farmem::regions {

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
// A key as read from the store, with the revision of its last change.
struct MetaKv {
  std::string key;
  std::string value;
  int64_t revision = 0;
};
// A change delivered by MetaStore::watch: `value` unset for a removal.
struct MetaEvent {
  std::string key;
  std::optional<std::string> value;
  int64_t revision = 0;
};
// This mount's membership lease as the store saw it: time left, and the revision of the member
// key (a re-join after the lease was lost writes it again, so the revision changes).
struct MetaLease {
  std::chrono::milliseconds left{-1};
  int64_t member_revision = 0;
};

// Where the store keeps its metadata: the cluster store (memory:// for one process, etcd for
// several), behind a small interface so tests can make its writes fail. Keys are relative to the
// store's prefix. Thread-safe.
class MetaStore {
 public:
  virtual ~MetaStore() = default;
  // Joins the cluster as this mount (its member name is mount_id()) unless already joined.
  virtual Status join() = 0;
  virtual std::string mount_id() const = 0;
  // Each returns the revision of its write. remove: OK if absent.
  virtual Result<int64_t> put(std::string_view key, std::string_view value) = 0;
  virtual Result<int64_t> remove(std::string_view key) = 0;
  // A key bound to this mount's lease: it vanishes when the mount leaves or its lease expires.
  // create_only: FailedPrecondition (nothing written) if the key exists.
  virtual Result<int64_t> put_bound(std::string_view key, std::string_view value,
                                    bool create_only) = 0;
  // Every write or none (the cluster store's transaction; etcd's txn): applied only if every
  // check holds (FailedPrecondition otherwise). Each key at most once; at most 64 writes.
  virtual Result<int64_t> commit(const std::vector<MetaCheck>& checks,
                                 const std::vector<MetaWrite>& writes) = 0;
  // nullopt if absent.
  virtual Result<std::optional<MetaKv>> get(std::string_view key) = 0;
  virtual Result<std::vector<MetaKv>> list(std::string_view prefix) = 0;
  virtual Result<int64_t> revision() = 0;
  // Changes under `prefix` from `from_revision` on, in revision order, on a thread of the store's.
  virtual Result<std::unique_ptr<ClusterWatch>> watch(
      std::string_view prefix, int64_t from_revision,
      std::function<void(const MetaEvent&)> on_event,
      std::function<void(const Status&)> on_error) = 0;
  virtual Result<MetaLease> lease() = 0;
  // True for memory://: no other process shares the store and a lease cannot run out while this
  // process lives (no self-fencing needed).
  virtual bool in_process() const = 0;
};
// The cluster store as a MetaStore, every key under `prefix` ("regions/" by default). `cluster`
// must outlive it. `member`: the member name join() uses ("" = "regions-mount-<pid>-<random>").
std::unique_ptr<MetaStore> NewClusterMetaStore(Cluster& cluster, std::string prefix = "regions/",
                                               std::string member = "");

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
  // Test hooks of the multi-mount protocol. host_id: who this store is for OWNERPID ("" = this
  // kernel and pid namespace, "<boot id>/<pid namespace>"). before_apply: called on the watch's
  // thread before each change is applied (a test blocks in it to delay what this store sees).
  std::string host_id;
  std::function<void()> before_apply;
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

// A change another mount made that the kernel may have cached (WaitChanges): an inode's
// attributes and pages (kInode), or a name in a directory (kEntry).
struct RemoteChange {
  enum class Kind { kInode, kEntry };
  Kind kind = Kind::kInode;
  uint64_t ino = 0;     // kInode
  uint64_t parent = 0;  // kEntry
  std::string name;     // kEntry
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
  uint64_t orphans_dropped = 0;  // nameless inode records Load dropped or reclaimed
  uint64_t conflicts = 0;        // transactions retried because another mount changed a record
  uint64_t frees_waiting = 0;    // free records (chunks parked until no mount has them open)
};

// Errors carry POSIX meaning: ErrnoOf(status) gives the errno FUSE replies with (messages start
// with the errno name, e.g. "ENOTEMPTY: ...").
int ErrnoOf(const Status& s);
// The status ErrnoOf maps back to `e` (one of the errnos it knows; others read as EIO/EINVAL).
Status ErrnoStatus(int e, std::string_view what);

// A value of an introspection report field: bytes that would split a line or a field (space,
// control bytes, '%', '=') as %XX.
std::string EscapeField(std::string_view v);

// This kernel and pid namespace: "<boot id>/<pid namespace>" (OWNERPID's host id).
std::string LocalHostId();

class RegionStore {
 public:
  // Connects a RawClient to every server through `node` (started, outlives the store), joins the
  // cluster through `meta` (outlives the store), loads the namespace or creates the root
  // directory, and starts following the other mounts' changes.
  static Result<std::unique_ptr<RegionStore>> Open(Node& node, MetaStore& meta,
                                                   RegionStoreOptions options);
  ~RegionStore();
  RegionStore(const RegionStore&) = delete;
  RegionStore& operator=(const RegionStore&) = delete;

  // ---- namespace ----
  Result<InodeAttr> getattr(uint64_t ino);
  // A name this store does not know yet is looked up in the cluster store (another mount may
  // have just made it).
  Result<InodeAttr> lookup(uint64_t parent, std::string_view name);
  // A regular file (a region); inherits the parent's attribute flags. EEXIST if the name exists
  // (in any mount: the create is a compare-and-set on the name).
  Result<InodeAttr> create(uint64_t parent, std::string_view name, uint32_t mode,
                           const Caller& who);
  Result<InodeAttr> mkdir(uint64_t parent, std::string_view name, uint32_t mode, const Caller& who);
  Result<InodeAttr> symlink(uint64_t parent, std::string_view name, std::string_view target,
                            const Caller& who);
  Result<std::string> readlink(uint64_t ino);
  // The inode's chunks are returned once no mount has it open.
  Status unlink(uint64_t parent, std::string_view name);
  Status rmdir(uint64_t parent, std::string_view name);
  // Replaces an existing target (a file by a file, an empty directory by a directory).
  // `noreplace`: EEXIST instead.
  Status rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                std::string_view new_name, bool noreplace);
  Result<std::vector<DirEntry>> readdir(uint64_t ino);
  // size: truncate (grow leaves a hole; shrink returns whole chunks past the end once no mount
  // has the inode open, and zeroes the tail of the last chunk).
  Result<InodeAttr> setattr(uint64_t ino, const SetAttrRequest& req);

  // ---- region attributes as xattrs "user.region.{persistent,multihosted,onewriter,fixvaddr,
  // ownerpid,hostalloc}" (hostalloc: comma-separated server addresses of this store, "" = all),
  // and the read-only "user.region.vaddr" of a FIXVADDR region ("0x...": its fixed address) ----
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
  // A handle pins the inode: this mount's open record (bound to its lease) keeps every mount
  // from freeing its chunks until the last handle goes. The open reads the inode's record from
  // the cluster store (close-to-open: what another mount closed before is seen). `write`: counts
  // as a writer for ONEWRITER (a second writer in any mount gets EBUSY).
  Result<uint64_t> open(uint64_t ino, bool write);
  Status release(uint64_t handle);
  // Bytes read (short at end of file); holes are zeros without a remote read.
  Result<size_t> read(uint64_t ino, uint64_t offset, std::span<std::byte> out);
  // Allocates the chunks it needs (ENOSPC, with nothing changed, if the servers are out of
  // memory), writes delivery-complete, then records the map and size (compare-and-set; a record
  // another mount changed meanwhile makes it start over): when it returns OK the bytes are in
  // remote memory.
  Status write(uint64_t ino, uint64_t offset, std::span<const std::byte> data);

  // fallocate(2). mode 0 or FALLOC_FL_KEEP_SIZE: every chunk of [offset, offset+len) gets
  // allocated and zeroed, so later writes there cannot fail with ENOSPC; mode 0 also extends the
  // size (KEEP_SIZE preallocates past the end without changing it). ENOSPC changes nothing.
  // FALLOC_FL_PUNCH_HOLE|KEEP_SIZE: whole chunks in the range become holes (their memory returns
  // once no mount has the file open, as for a truncate) and the covered bytes of partial ones are
  // zeroed. FALLOC_FL_ZERO_RANGE[|KEEP_SIZE]: the range reads zero afterwards and is allocated as
  // for mode 0 / KEEP_SIZE (chunks it already had are zeroed in place, holes get zeroed chunks).
  // Any other mode: ENOTSUP (== EOPNOTSUPP).
  Status fallocate(uint64_t ino, int mode, uint64_t offset, uint64_t len);

  Result<StoreStatFs> statfs();
  RegionStoreStats stats() const;

  // ---- OWNERPID / PERSISTENT (docs/regions.md "Attributes") ----
  // A regular file records its creating process (the TGID of Caller::pid) and host; a store
  // watches, with a pidfd, the owners on its own host (same kernel and pid namespace). Waits up
  // to `wait` for a watched process to exit; then every region of every exited owner that is not
  // PERSISTENT (at that moment) is unlinked and revoked: its name goes, IO through handles still
  // open in any mount gets EIO, its memory returns once no mount has it open. Regions whose
  // owner's host has no live mount left are deleted the same way. Returns what was deleted.
  // Regions whose owner is unknown (pid 0: another pid namespace; no pidfd) are never deleted
  // this way. Called in a loop by one thread.
  Result<std::vector<ReapedRegion>> ReapOwners(std::chrono::milliseconds wait);

  // ---- other mounts ----
  // Waits up to `wait` for changes other mounts made to inodes and names (what the kernel may
  // have cached) and returns them, each once. Called in a loop by one thread.
  std::vector<RemoteChange> WaitChanges(std::chrono::milliseconds wait);
  const std::string& mount_id() const { return mount_id_; }
  // "ok", "unconfirmed" (no lease renewal seen recently: data calls fail with EIO until there
  // is one) or "lost" (the lease ran out: data calls fail with EIO until the store is reopened).
  std::string lease_state() const;

  // ---- introspection (the paper's /proc/regions; docs/regions.md "Introspection") ----
  // The text of one report: "hosts" (one line per memory server), "memusage" (one line),
  // "pools" (one line per 2 MiB unit), "open" (one line per open region), "files" (one line per
  // region: path, size, attributes, owner, chunk map). Every line is space-separated key=value
  // fields; paths are %XX-escaped (space, '%', '=', control bytes). NotFound for another name.
  Result<std::string> report(std::string_view name);
  static constexpr std::string_view kReports[] = {"hosts", "memusage", "pools", "open", "files"};

  // rmmap of a file in a mount (docs/regions_mmap.md): where the chunks of regular file `ino` live
  // now, for the xattr "user.region.map" (the token is left empty: the mount adds it). Chunks
  // within the size only. EINVAL for a directory or symlink, EIO for a revoked region.
  Result<MapDescriptor> map_descriptor(uint64_t ino);

 private:
  struct Inode;
  struct Unit;
  struct Server;
  // Chunks parked by a free record ("free/<ino>/<tag>"), as this store last saw it.
  struct Parked {
    uint64_t ino = 0;
    std::vector<MapEntry> chunks;
    std::string raw;
  };
  using Fresh = std::vector<std::pair<uint64_t, MapEntry>>;  // (chunk index, its new chunk)
  RegionStore(Node& node, MetaStore& meta, RegionStoreOptions options);

  // ---- the mirror (region_store_mirror.cc) ----
  Status Load();
  // Applies one key's new value (unset: removed) at `rev` if it is newer than what this store
  // has; `remote`: it came from the watch or a refresh, not from this store's own commit.
  void ApplyKey(const std::string& key, const std::optional<std::string>& value, int64_t rev,
                bool remote);  // mu_ held
  void ApplyInode(uint64_t ino, const std::optional<std::string>& value, bool remote);
  void ApplyDirent(uint64_t parent, std::string_view name, const std::optional<std::string>& value,
                   bool remote);
  void ApplyUnit(uint32_t gid, const std::optional<std::string>& value);
  void ApplyFree(const std::string& key, const std::optional<std::string>& value);
  void ApplyOpen(uint64_t ino, const std::string& mount, bool present, bool remote);
  void ApplyUnitOwner(uint32_t gid, const std::optional<std::string>& value);
  void ApplyOwner(uint64_t ino, const std::optional<std::string>& value);
  void ApplyMount(const std::string& id, const std::optional<std::string>& value, bool remote);
  void ApplyVaddr(uint32_t slot, const std::optional<std::string>& value);
  // FIXVADDR: the lowest slot no region holds (ENOSPC when none is left), and its key. mu_ held.
  Result<uint32_t> FreeVaddrSlot() const;
  static std::string VaddrKey(uint32_t slot);
  void OnWatchEvent(const MetaEvent& e);
  // Commits `writes` if every check holds and applies them here (mu_ held). A check that failed
  // (another mount changed a record first) refreshes the checked keys from the store and returns
  // Aborted: the caller recomputes and tries again (Conflict() tells them apart).
  Result<int64_t> CommitApply(const std::vector<MetaCheck>& checks,
                              const std::vector<MetaWrite>& writes);
  static bool Conflict(const Status& s);
  Status Refresh(const std::vector<std::string>& keys);  // mu_ held
  // Refreshes the records of units `in`'s map names that this mirror does not have yet (a record
  // read ahead of the watch may name a unit made since). mu_ held.
  Status RefreshUnitsOf(const Inode& in);
  MetaCheck InodeCheck(const Inode& in) const;
  void MarkUsed(MapEntry e);        // mu_ held
  void PushChange(RemoteChange c);  // mu_ held: for WaitChanges
  Result<uint64_t> NextIno();       // mu_ held
  std::string NewFreeKey(uint64_t ino);
  // Fails data calls with EIO while this mount's lease is unconfirmed (asking the store once
  // more first, at most every 500 ms) or lost.
  Status CheckLease();
  bool LeaseOk() const;
  void ProbeLease();
  // Reads that only make this mirror fresher (a lookup of an unknown name, an open's refresh) are
  // skipped for a second after the store failed to answer: the mirror is all there is then.
  bool StoreAway() const;
  void NoteStoreError(const Status& s);
  void Housekeep();            // the housekeeping thread
  void Enqueue(uint64_t ino);  // mu_ held: TryReclaim/TryFree it on the housekeeping thread
  // Open records (this mount's "open/<ino>/<mount>", bound to its lease); in->open_mu held.
  Status Publish(Inode& in, uint64_t ino);
  Status Unpublish(Inode& in, uint64_t ino);
  // The last name of `in` went: once no mount has it open, its record goes and its chunks are
  // parked in a free record (then TryFree). Takes in->io. Called without mu_.
  void TryReclaim(const std::shared_ptr<Inode>& in);
  // Frees the parked chunks of `ino` once no mount has it open. `io_held`: the caller holds the
  // inode's io lock (else it is taken while the store is told). Called without mu_.
  void TryFree(uint64_t ino, bool io_held = false);
  // Gives every empty unit of this mount back to its server (mu_ held).
  void ReleaseEmptyUnits();
  // Whether another mount (or this one: count_self) has `ino` open, as the store says now.
  Result<bool> OpenAnywhere(uint64_t ino);
  void AdoptOrphanUnits(bool wait);
  bool OwnerHere(uint64_t ino) const;  // mu_ held: the owner of `ino` lives on this host
  // mu_ held: this mount allocates from unit `gid` (and may use it now: its chunks are known).
  bool Mine(uint32_t gid) const;

  // ---- operations ----
  Result<std::shared_ptr<Inode>> Get(uint64_t ino);     // mu_ held
  Result<std::shared_ptr<Inode>> GetDir(uint64_t ino);  // mu_ held
  // The names in directory `dir` (mu_ held).
  std::map<std::string, uint64_t, std::less<>>& Children(uint64_t dir) { return children_[dir]; }
  uint64_t ParentOf(uint64_t dir) const;  // mu_ held
  Result<std::shared_ptr<Inode>> NewInode(uint64_t parent, std::string_view name, uint32_t mode,
                                          const Caller& who,
                                          std::string_view target = {});  // mu_ held
  // Applies `change` to a copy of in.rec (it may add writes to `extra`) and commits it with a
  // compare on the record; retries when another mount changed the record first. mu_ held.
  Status UpdateInode(Inode& in,
                     const std::function<Status(InodeRecord& next, std::vector<MetaWrite>& extra,
                                                std::vector<MetaCheck>& checks)>& change);
  // `known_zero`: the chunk was never used since its unit was granted (it reads zero). mu_ held.
  Result<MapEntry> AllocChunk(uint32_t server, bool& known_zero);
  // Allocates a chunk for every hole among chunks [first, last] of `map` (for inode `rec`),
  // appending (index, chunk) to `fresh` and the indexes that may hold a freed region's bytes (not
  // known zero) to `dirty`; on failure frees what it got and returns the error. mu_ held.
  Status AllocRange(const InodeRecord& rec, const std::vector<MapEntry>& map, uint64_t first,
                    uint64_t last, Fresh& fresh, std::vector<uint64_t>& dirty);
  void Unalloc(const Fresh& fresh);           // mu_ held: chunks never recorded go back at once
  void FreeChunk(MapEntry e);                 // mu_ held: clears the chunk's bit
  Result<RemoteRef> RefOf(MapEntry e) const;  // mu_ held
  Scheduler& Sched();
  InodeAttr AttrOf(const Inode& in) const;
  std::unordered_map<uint64_t, std::string> Paths() const;  // mu_ held; ino -> "/a/b"
  // Starts watching process `pid` with a pidfd (mu_ held); one that does not exist, or whose
  // start time is not `start` (when known), has exited.
  void WatchOwner(int32_t pid, const std::string& start = "");
  // Unlinks and revokes the regions `doomed` picks (ReapOwners). mu_ held.
  Status ReapWhere(const std::function<bool(const Inode&)>& doomed, std::vector<ReapedRegion>& out,
                   std::vector<std::shared_ptr<Inode>>& victims);

  Node& node_;
  MetaStore& meta_;
  RegionStoreOptions options_;
  std::vector<std::unique_ptr<Server>> servers_;
  std::string mount_id_;
  std::string host_id_;

  // The mirror of the store and the local state around it.
  mutable std::mutex mu_;
  std::condition_variable claims_cv_;  // with mu_: some write's claimed span was released
  std::unordered_map<uint64_t, std::shared_ptr<Inode>> inodes_;
  std::unordered_map<uint64_t, std::map<std::string, uint64_t, std::less<>>> children_;
  std::unordered_map<uint64_t, std::pair<uint64_t, std::string>> name_of_;  // ino -> its dirent
  std::map<uint64_t, std::unique_ptr<Unit>> units_;                         // by gid
  std::map<uint32_t, std::string> unit_owners_;  // gid -> the mount allocating from it
  std::map<std::string, Parked> frees_;          // by key
  std::unordered_map<uint64_t, std::set<std::string>> open_mounts_;  // ino -> mounts with it open
  std::map<std::string, MountRecord> mounts_;                        // live mounts
  std::unordered_map<uint64_t, OwnerRecord> owner_info_;             // ino -> its owner
  std::map<uint32_t, uint64_t> vaddr_slots_;                         // FIXVADDR slot -> its region
  std::unordered_map<uint64_t, uint32_t> vaddr_of_;                  // region -> its FIXVADDR slot
  std::unordered_map<std::string, int64_t> key_rev_;                 // revision applied per key
  std::multimap<int64_t, std::string> tombstones_;  // removed keys by revision (pruned)
  int64_t watch_rev_ = 0;                           // the last revision the watch delivered
  std::condition_variable watch_cv_;                // with mu_: watch_rev_ moved
  bool loaded_ = false;
  bool mounts_changed_ = false;  // a mount went: ReapOwners looks for owners without a host
  std::unordered_map<uint64_t, std::shared_ptr<Inode>> handles_;
  std::map<int32_t, int> owners_;          // watched owner TGID -> pidfd (-1: known to have exited)
  uint64_t next_ino_ = 0, ino_limit_ = 0;  // this mount's batch of inode numbers
  uint64_t next_handle_ = 1;
  uint64_t next_free_tag_ = 1;
  std::deque<RemoteChange> changes_;
  bool want_changes_ = false;  // someone calls WaitChanges (else nothing is queued)
  std::condition_variable changes_cv_;
  std::set<uint64_t> todo_;  // inodes for the housekeeping thread
  std::condition_variable house_cv_;
  bool stop_ = false;

  std::unique_ptr<ClusterWatch> watch_;
  std::thread housekeeper_;
  // Self-fencing (docs/regions.md "Several mounts"): data calls are refused past this deadline
  // (steady clock, ns) unless a lease renewal moved it; `lease_lost_` for good.
  std::atomic<int64_t> lease_deadline_ns_{0};
  std::atomic<bool> lease_lost_{false};
  std::atomic<int64_t> last_sync_probe_ns_{0};
  std::atomic<int64_t> store_away_until_ns_{0};
  int64_t member_revision_ = 0;

  std::mutex sched_mu_;  // one Scheduler per calling thread
  std::unordered_map<std::thread::id, std::unique_ptr<Scheduler>> scheds_;

  std::atomic<uint64_t> remote_reads_{0}, remote_writes_{0}, units_freed_{0}, alloc_failures_{0},
      orphans_dropped_{0}, conflicts_{0};
};

}  // namespace farmem::regions
