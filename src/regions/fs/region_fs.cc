// The FUSE 3 low-level daemon of remote regions (docs/regions.md "FUSE daemon"): translates
// requests into RegionStore calls. libfuse's worker threads (fuse_session_loop_mt) call every op;
// the store is thread-safe and gives each thread its own scheduler. A shared mount (several
// mounts of one namespace) also runs a notifier thread that drops what the kernel cached of other
// mounts' changes (fuse_lowlevel_notify_inval_inode / _entry).
#define FUSE_USE_VERSION 312
#include <fuse3/fuse_lowlevel.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/log.h"
#include "farmem/cluster.h"
#include "farmem/regionfs.h"
#include "farmem/server.h"
#include "regions/engine/region_store.h"

namespace farmem {

namespace {

using regions::Caller;
using regions::ErrnoOf;
using regions::InodeAttr;
using regions::RegionStore;

constexpr double kTimeout = 1.0;          // attr/entry cache, seconds (close-to-open)
constexpr unsigned kMaxWrite = 1u << 20;  // max_write / max_readahead

// TEST ONLY (docs/regions.md "Tests"): FARMEM_REGIONS_FAULT=no_claim lets a second mount of a
// namespace mounted exclusively in; no_perms mounts without default_permissions (the kernel then
// checks nothing); open_intro makes .regions/ readable by everyone (modes 0555/0444, no uid
// check); no_inval keeps the kernel's cached pages of a region deleted with its owner (readers
// then see no EIO); no_remote_inval keeps what the kernel cached of other mounts' changes (a file
// open here then shows its old pages after another mount rewrote it); exclusive_caching gives a
// shared mount an exclusive one's kernel caching (FsState::coherent).
bool FsFault(std::string_view name) {
  const char* f = std::getenv("FARMEM_REGIONS_FAULT");
  return f != nullptr && name == f;
}

// The request kinds the daemon counts (reported in .regions/daemon as op_NAME=N), in MakeOps'
// order.
constexpr std::string_view kOpNames[] = {
    "lookup",  "getattr",  "setattr",  "readlink",  "mknod",       "mkdir",  "unlink",   "rmdir",
    "symlink", "rename",   "link",     "open",      "read",        "write",  "release",  "readdir",
    "statfs",  "setxattr", "getxattr", "listxattr", "removexattr", "create", "fallocate"};
constexpr size_t kOpCount = sizeof(kOpNames) / sizeof(kOpNames[0]);
// The index of op `name` in kOpNames (a name not there does not compile: see Counted).
constexpr size_t OpIndex(std::string_view name) {
  for (size_t i = 0; i < kOpCount; ++i)
    if (kOpNames[i] == name) return i;
  return kOpCount;
}

// What every request handler shares (the FUSE session's userdata).
struct FsState {
  RegionStore& store;
  std::string mountpoint;
  uint32_t threads = 0;
  size_t servers = 0;
  std::string token;  // the servers' cluster token, handed out in user.region.map
  // Other mounts may share the namespace (RegionFsOptions::Sharing).
  bool shared = false;
  // The kernel's caches are kept coherent with other mounts' changes: no writeback cache, no
  // keep_cache, no negative entries, file attributes not cached. Set for shared mounts
  // (FARMEM_REGIONS_FAULT=exclusive_caching, test only: a shared mount with an exclusive one's
  // caching; another mount's growth or shrink is then not seen).
  bool coherent = false;
  std::mutex mu;  // guards intro and next_intro (any worker thread)
  // Open .regions/ files: handle -> the report's text, taken at open (a consistent snapshot).
  std::unordered_map<uint64_t, std::string> intro;
  uint64_t next_intro = 1;
  std::array<std::atomic<uint64_t>, kOpCount> ops{};  // requests served, by kind (any thread)
  // rsetdefaultattr: attribute defaults per calling thread id, with the thread's start time so
  // that a later thread given the same id does not inherit them. Guarded by defaults_mu.
  struct ThreadDefaults {
    uint64_t start_time = 0;
    regions::AttrDefaults attrs;
  };
  std::mutex defaults_mu;
  std::unordered_map<pid_t, ThreadDefaults> defaults;
};

FsState& State(fuse_req_t req) {
  return *static_cast<FsState*>(fuse_req_userdata(req));
}
RegionStore& Store(fuse_req_t req) {
  return State(req).store;
}

// ---- .regions/: the root-only introspection directory (docs/regions.md "Introspection") ----
// Virtual inodes far above any the store hands out (it counts up from 2); the directory is
// looked up by name in the root and not listed there.
constexpr std::string_view kIntroName = ".regions";
constexpr fuse_ino_t kIntroDir = 0xffffffff00000000ull;
constexpr std::string_view kIntroFiles[] = {"daemon", "hosts", "memusage",
                                            "pools",  "open",  "files"};
constexpr size_t kIntroCount = sizeof(kIntroFiles) / sizeof(kIntroFiles[0]);
constexpr uint64_t kIntroHandle = uint64_t{1} << 62;  // store handles stay below (bit 63: writer)

bool IsIntro(fuse_ino_t ino) {
  return ino >= kIntroDir && ino <= kIntroDir + kIntroCount;
}
bool IsIntroName(fuse_ino_t parent, std::string_view name) {
  return parent == FUSE_ROOT_ID && name == kIntroName;
}
// Root only (or the daemon's own user when it is not root: nobody else can use such a mount).
// The kernel refuses others first (default_permissions, modes 0500/0400); this is the second line.
bool IntroAllowed(fuse_req_t req) {
  uid_t uid = fuse_req_ctx(req)->uid;
  return uid == 0 || uid == geteuid() || FsFault("open_intro");
}
struct stat IntroStat(fuse_ino_t ino) {
  static const struct timespec born = [] {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return t;
  }();
  bool open = FsFault("open_intro");
  struct stat st {};
  st.st_ino = ino;
  st.st_mode =
      ino == kIntroDir ? (S_IFDIR | (open ? 0555 : 0500)) : (S_IFREG | (open ? 0444 : 0400));
  st.st_nlink = ino == kIntroDir ? 2 : 1;
  st.st_uid = geteuid();
  st.st_gid = getegid();
  st.st_size = 0;  // generated at open, read until EOF (direct_io), like /proc
  st.st_atim = st.st_mtim = st.st_ctim = born;
  return st;
}
void ReplyIntroEntry(fuse_req_t req, fuse_ino_t ino) {
  fuse_entry_param e{};
  e.ino = ino;
  e.attr = IntroStat(ino);
  e.attr_timeout = 1.0;
  e.entry_timeout = 1.0;
  fuse_reply_entry(req, &e);
}
// " op_lookup=N op_getattr=N ...": every request kind, in kOpNames' order.
std::string OpCounts(const FsState& fs) {
  std::string out;
  for (size_t i = 0; i < kOpCount; ++i)
    out += " op_" + std::string(kOpNames[i]) + "=" + std::to_string(fs.ops[i].load());
  return out;
}
Result<std::string> IntroText(FsState& fs, std::string_view name) {
  if (name != "daemon") return fs.store.report(name);
  return "pid=" + std::to_string(getpid()) + " uid=" + std::to_string(geteuid()) +
         " mountpoint=" + regions::EscapeField(fs.mountpoint) +
         " threads=" + std::to_string(fs.threads) + " servers=" + std::to_string(fs.servers) +
         " mount=" + regions::EscapeField(fs.store.mount_id()) +
         " shared=" + (fs.shared ? "1" : "0") + " lease=" + fs.store.lease_state() + OpCounts(fs) +
         "\n";
}

Caller Who(fuse_req_t req) {
  const fuse_ctx* c = fuse_req_ctx(req);
  return Caller{c->uid, c->gid, c->pid};
}

// ---- rsetdefaultattr: per-thread defaults, as xattrs "user.region.default.<attr>" of the root
// ---- (docs/regions.md "Attributes"). FUSE names the calling thread (its id in the daemon's pid
// namespace), so a setxattr of such a name on the root sets that thread's default for the
// regions it creates afterwards; getxattr reads it back, removexattr drops it.
constexpr std::string_view kDefaultPrefix = "user.region.default.";
constexpr size_t kMaxThreadDefaults = 4096;

// Field 22 of /proc/<tid>/stat (start time in clock ticks since boot); 0 if the thread is gone.
uint64_t ThreadStartTime(pid_t tid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(tid) + "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces and parentheses
  if (p == nullptr) return 0;
  unsigned long long start = 0;
  // After ") ": state (field 3) ... starttime (field 22): skip 19 fields.
  if (std::sscanf(
          p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
          &start) != 1)
    return 0;
  return start;
}

// The calling thread's defaults, if it set any and is still the thread that did.
std::optional<regions::AttrDefaults> CallerDefaults(fuse_req_t req) {
  FsState& fs = State(req);
  const pid_t tid = fuse_req_ctx(req)->pid;
  std::lock_guard lk(fs.defaults_mu);
  auto it = fs.defaults.find(tid);
  if (it == fs.defaults.end()) return std::nullopt;
  if (ThreadStartTime(tid) != it->second.start_time) {
    fs.defaults.erase(it);  // that thread has ended; this one only has its id
    return std::nullopt;
  }
  return it->second.attrs;
}

// setxattr (value) / removexattr (nullopt) of "user.region.default.<attr>" on the root.
Status SetCallerDefault(fuse_req_t req, std::string_view attr,
                        std::optional<std::string_view> value) {
  FsState& fs = State(req);
  const pid_t tid = fuse_req_ctx(req)->pid;
  if (tid <= 0)
    return regions::ErrnoStatus(ENOTSUP, "the calling thread is not visible from the daemon");
  const uint64_t start = ThreadStartTime(tid);
  if (start == 0) return regions::ErrnoStatus(EINVAL, "the calling thread is gone");
  const std::string name = "user.region." + std::string(attr);
  std::lock_guard lk(fs.defaults_mu);
  auto it = fs.defaults.find(tid);
  FsState::ThreadDefaults d;
  if (it != fs.defaults.end() && it->second.start_time == start) d = it->second;
  d.start_time = start;
  if (value) {
    FARMEM_RETURN_IF_ERROR(fs.store.SetDefaultAttr(d.attrs, name, *value));
  } else if (name == "user.region.hostalloc") {
    d.attrs.hostalloc.reset();
  } else {
    FARMEM_RETURN_IF_ERROR(fs.store.SetDefaultAttr(d.attrs, name, ""));
  }
  if (d.attrs.empty()) {
    if (it != fs.defaults.end()) fs.defaults.erase(it);
    return Status::OK();
  }
  if (it == fs.defaults.end() && fs.defaults.size() >= kMaxThreadDefaults) {
    std::erase_if(fs.defaults, [](const auto& e) {
      return ThreadStartTime(e.first) != e.second.start_time;  // ended threads
    });
    if (fs.defaults.size() >= kMaxThreadDefaults)
      return regions::ErrnoStatus(ENOSPC, "too many threads with attribute defaults");
  }
  fs.defaults[tid] = std::move(d);
  return Status::OK();
}

bool IsDefaultName(fuse_ino_t ino, std::string_view name) {
  return ino == FUSE_ROOT_ID && name.starts_with(kDefaultPrefix);
}

struct timespec Ts(int64_t ns) {
  struct timespec t;
  t.tv_sec = ns / 1000000000;
  t.tv_nsec = ns % 1000000000;
  return t;
}

int64_t Ns(const struct timespec& t) {
  return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

struct stat ToStat(const InodeAttr& a) {
  struct stat st {};
  st.st_ino = a.ino;
  st.st_mode = a.mode;
  st.st_nlink = a.nlink;
  st.st_uid = a.uid;
  st.st_gid = a.gid;
  st.st_size = static_cast<off_t>(a.size);
  st.st_blksize = static_cast<blksize_t>(regions::kChunkBytes);
  st.st_blocks = static_cast<blkcnt_t>(a.chunks * (regions::kChunkBytes / 512));
  st.st_atim = Ts(a.atime_ns);
  st.st_mtim = Ts(a.mtime_ns);
  st.st_ctim = Ts(a.ctime_ns);
  return st;
}

// How long the kernel may keep an inode's attributes. Shared: a file's size and times can change
// in another mount at any time, so the kernel asks each time it needs them (served from the
// store's mirror, which its watch keeps current; no round trip to etcd).
double AttrTimeout(fuse_req_t req, const InodeAttr& a) {
  return State(req).coherent && S_ISREG(a.mode) ? 0.0 : kTimeout;
}

void ReplyEntry(fuse_req_t req, const Result<InodeAttr>& a) {
  if (!a.ok()) {
    fuse_reply_err(req, ErrnoOf(a.status()));
    return;
  }
  fuse_entry_param e{};
  e.ino = a->ino;
  e.attr = ToStat(*a);
  e.attr_timeout = AttrTimeout(req, *a);
  e.entry_timeout = kTimeout;
  fuse_reply_entry(req, &e);
}

void ReplyStatus(fuse_req_t req, const Status& s) {
  fuse_reply_err(req, ErrnoOf(s));
}

bool IsWrite(int flags) {
  return (flags & O_ACCMODE) != O_RDONLY;
}

void Init(void* userdata, fuse_conn_info* conn) {
  const bool shared = static_cast<FsState*>(userdata)->coherent;
  // The writeback cache makes the kernel the owner of a file's size and mtime (it ignores the
  // daemon's): only one mount can see every change then. Shared mounts write through, and drop
  // pages by invalidation, not by the kernel's own mtime checks (auto_inval_data).
  if (!shared && (conn->capable & FUSE_CAP_WRITEBACK_CACHE)) conn->want |= FUSE_CAP_WRITEBACK_CACHE;
  if (shared) conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
  if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  conn->max_write = kMaxWrite;
  conn->max_readahead = kMaxWrite;
}

void Lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (IsIntroName(parent, name)) return ReplyIntroEntry(req, kIntroDir);
  if (parent == kIntroDir) {
    if (!IntroAllowed(req)) return (void)fuse_reply_err(req, EACCES);
    for (size_t i = 0; i < kIntroCount; ++i)
      if (kIntroFiles[i] == name) return ReplyIntroEntry(req, kIntroDir + 1 + i);
    return (void)fuse_reply_err(req, ENOENT);
  }
  if (IsIntro(parent)) return (void)fuse_reply_err(req, ENOTDIR);
  auto a = Store(req).lookup(parent, name);
  if (!a.ok() && ErrnoOf(a.status()) == ENOENT && !State(req).coherent) {
    // A negative entry the kernel keeps for kTimeout: an exclusive mount (the claim in
    // RunRegionFs), so every new name comes through this kernel, which replaces the entry. Saves
    // the second LOOKUP of `stat` then `open(O_CREAT)` of a new name (cp, tar). A shared mount
    // answers ENOENT, which the kernel does not keep: another mount may make the name next.
    fuse_entry_param e{};
    e.ino = 0;
    e.entry_timeout = kTimeout;
    return (void)fuse_reply_entry(req, &e);
  }
  ReplyEntry(req, a);
}

void Getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  if (IsIntro(ino)) {
    struct stat st = IntroStat(ino);
    return (void)fuse_reply_attr(req, &st, kTimeout);
  }
  auto a = Store(req).getattr(ino);
  if (!a.ok()) return ReplyStatus(req, a.status());
  struct stat st = ToStat(*a);
  fuse_reply_attr(req, &st, AttrTimeout(req, *a));
}

void Setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  if (IsIntro(ino)) return (void)fuse_reply_err(req, EPERM);  // read-only
  regions::SetAttrRequest r;
  if (to_set & FUSE_SET_ATTR_SIZE) r.size = static_cast<uint64_t>(attr->st_size);
  if (to_set & FUSE_SET_ATTR_MODE) r.mode = attr->st_mode;
  if (to_set & FUSE_SET_ATTR_UID) r.uid = attr->st_uid;
  if (to_set & FUSE_SET_ATTR_GID) r.gid = attr->st_gid;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  if (to_set & FUSE_SET_ATTR_ATIME) r.atime_ns = Ns(attr->st_atim);
  if (to_set & FUSE_SET_ATTR_ATIME_NOW) r.atime_ns = Ns(now);
  if (to_set & FUSE_SET_ATTR_MTIME) r.mtime_ns = Ns(attr->st_mtim);
  if (to_set & FUSE_SET_ATTR_MTIME_NOW) r.mtime_ns = Ns(now);
  auto a = Store(req).setattr(ino, r);
  if (!a.ok()) return ReplyStatus(req, a.status());
  struct stat st = ToStat(*a);
  fuse_reply_attr(req, &st, AttrTimeout(req, *a));
}

void Readlink(fuse_req_t req, fuse_ino_t ino) {
  auto t = Store(req).readlink(ino);
  if (!t.ok()) return ReplyStatus(req, t.status());
  fuse_reply_readlink(req, t->c_str());
}

// Refuses changes inside .regions/ (EPERM) and new entries named .regions in the root (EEXIST).
bool RefuseIntroChange(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (IsIntro(parent)) return fuse_reply_err(req, EPERM), true;
  if (IsIntroName(parent, name)) return fuse_reply_err(req, EEXIST), true;
  return false;
}

void Mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t) {
  if (RefuseIntroChange(req, parent, name)) return;
  if (!S_ISREG(mode)) return (void)fuse_reply_err(req, EPERM);  // regions are regular files
  auto d = CallerDefaults(req);
  Caller who = Who(req);
  if (d) who.defaults = &*d;
  ReplyEntry(req, Store(req).create(parent, name, mode, who));
}

void Mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  if (RefuseIntroChange(req, parent, name)) return;
  auto d = CallerDefaults(req);
  Caller who = Who(req);
  if (d) who.defaults = &*d;
  ReplyEntry(req, Store(req).mkdir(parent, name, mode, who));
}

void Unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (IsIntro(parent) || IsIntroName(parent, name)) return (void)fuse_reply_err(req, EPERM);
  ReplyStatus(req, Store(req).unlink(parent, name));
}

void Rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (IsIntro(parent) || IsIntroName(parent, name)) return (void)fuse_reply_err(req, EPERM);
  ReplyStatus(req, Store(req).rmdir(parent, name));
}

void Symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  if (RefuseIntroChange(req, parent, name)) return;
  ReplyEntry(req, Store(req).symlink(parent, name, link, Who(req)));
}

void Rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
            const char* newname, unsigned int flags) {
  if (flags & ~RENAME_NOREPLACE) return (void)fuse_reply_err(req, EINVAL);  // no EXCHANGE
  if (IsIntro(parent) || IsIntro(newparent) || IsIntroName(parent, name) ||
      IsIntroName(newparent, newname))
    return (void)fuse_reply_err(req, EPERM);
  ReplyStatus(req, Store(req).rename(parent, name, newparent, newname, flags & RENAME_NOREPLACE));
}

void Link(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) {
  fuse_reply_err(req, EPERM);  // a region has one name
}

void OpenIntro(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (ino == kIntroDir) return (void)fuse_reply_err(req, EISDIR);
  if (!IntroAllowed(req) || IsWrite(fi->flags)) return (void)fuse_reply_err(req, EACCES);
  FsState& fs = State(req);
  auto text = IntroText(fs, kIntroFiles[ino - kIntroDir - 1]);
  if (!text.ok()) return ReplyStatus(req, text.status());
  {
    std::lock_guard lk(fs.mu);
    fi->fh = kIntroHandle | fs.next_intro++;
    fs.intro[fi->fh] = std::move(*text);
  }
  fi->direct_io = 1;  // st_size is 0: every read comes here
  fuse_reply_open(req, fi);
}

void Open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (IsIntro(ino)) return OpenIntro(req, ino, fi);
  auto h = Store(req).open(ino, IsWrite(fi->flags));
  if (!h.ok()) return ReplyStatus(req, h.status());
  // libfuse asks for FUSE_CAP_ATOMIC_O_TRUNC by default: the kernel then passes O_TRUNC here and
  // sets its size to 0 itself, trusting the file system to truncate (no SETATTR follows).
  if ((fi->flags & O_TRUNC) && IsWrite(fi->flags)) {
    regions::SetAttrRequest trunc;
    trunc.size = 0;
    auto t = Store(req).setattr(ino, trunc);
    if (!t.ok()) {
      (void)Store(req).release(*h);
      return ReplyStatus(req, t.status());
    }
  }
  fi->fh = *h;
  // Exclusive (the claim in RunRegionFs): every change to a file went through this kernel's page
  // cache, so what it cached is current and an open need not drop it. Shared: another mount may
  // have written the file since, so the kernel drops its pages at each open (close-to-open).
  fi->keep_cache = State(req).coherent ? 0 : 1;
  fuse_reply_open(req, fi);
}

void Create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  if (RefuseIntroChange(req, parent, name)) return;
  RegionStore& s = Store(req);
  auto d = CallerDefaults(req);
  Caller who = Who(req);
  if (d) who.defaults = &*d;
  auto a = s.create(parent, name, mode, who);
  if (!a.ok() && ErrnoOf(a.status()) == EEXIST && !(fi->flags & O_EXCL))
    a = s.lookup(parent, name);  // another mount made it first: open(O_CREAT) opens it
  if (!a.ok()) return ReplyStatus(req, a.status());
  auto h = s.open(a->ino, IsWrite(fi->flags));
  if (!h.ok()) return ReplyStatus(req, h.status());
  fi->fh = *h;
  fi->keep_cache = State(req).coherent ? 0 : 1;
  fuse_entry_param e{};
  e.ino = a->ino;
  e.attr = ToStat(*a);
  e.attr_timeout = AttrTimeout(req, *a);
  e.entry_timeout = kTimeout;
  fuse_reply_create(req, &e, fi);
}

void Read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  if (fi->fh & kIntroHandle) {
    FsState& fs = State(req);
    std::lock_guard lk(fs.mu);
    auto it = fs.intro.find(fi->fh);
    if (it == fs.intro.end()) return (void)fuse_reply_err(req, EBADF);
    const std::string& t = it->second;
    size_t from = std::min(static_cast<size_t>(off), t.size());
    return (void)fuse_reply_buf(req, t.data() + from, std::min(size, t.size() - from));
  }
  std::vector<std::byte> buf(size);
  auto n = Store(req).read(ino, static_cast<uint64_t>(off), buf);
  if (!n.ok()) return ReplyStatus(req, n.status());
  fuse_reply_buf(req, reinterpret_cast<const char*>(buf.data()), *n);
}

void Write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
           fuse_file_info*) {
  // Replied only after the bytes are in remote memory (delivery-complete writes).
  Status s =
      Store(req).write(ino, static_cast<uint64_t>(off),
                       std::span<const std::byte>(reinterpret_cast<const std::byte*>(buf), size));
  if (!s.ok()) return ReplyStatus(req, s);
  fuse_reply_write(req, size);
}

// The kernel writes back and drops its cached pages of a punched range itself (FUSE_FALLOCATE),
// and updates i_size after a mode-0 call.
void Fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
               fuse_file_info*) {
  if (offset < 0 || length <= 0) return (void)fuse_reply_err(req, EINVAL);
  if (IsIntro(ino)) return (void)fuse_reply_err(req, EPERM);
  ReplyStatus(req, Store(req).fallocate(ino, mode, static_cast<uint64_t>(offset),
                                        static_cast<uint64_t>(length)));
}

// No FLUSH or FSYNC handler, by design (MakeOps leaves both out): every write the daemon
// acknowledged is already in remote memory and the kernel writes its dirty pages back before it
// would send them, so they have nothing to do. After libfuse's first ENOSYS reply the kernel stops
// sending FLUSH at each close(2) and FSYNC at each fsync(2): a round trip less per file closed.

void Release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  if (fi->fh & kIntroHandle) {
    FsState& fs = State(req);
    std::lock_guard lk(fs.mu);
    fs.intro.erase(fi->fh);
    return (void)fuse_reply_err(req, 0);
  }
  ReplyStatus(req, Store(req).release(fi->fh));
}

void Readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  Result<std::vector<regions::DirEntry>> list = std::vector<regions::DirEntry>{};
  if (ino == kIntroDir) {
    if (!IntroAllowed(req)) return (void)fuse_reply_err(req, EACCES);
    list->push_back({".", kIntroDir, S_IFDIR});
    list->push_back({"..", FUSE_ROOT_ID, S_IFDIR});
    for (size_t i = 0; i < kIntroCount; ++i)
      list->push_back({std::string(kIntroFiles[i]), kIntroDir + 1 + i, S_IFREG});
  } else {
    list = Store(req).readdir(ino);
  }
  if (!list.ok()) return ReplyStatus(req, list.status());
  std::vector<char> buf(size);
  size_t used = 0;
  for (size_t i = static_cast<size_t>(off); i < list->size(); ++i) {
    const regions::DirEntry& e = (*list)[i];
    struct stat st {};
    st.st_ino = e.ino;
    st.st_mode = e.mode;
    size_t need = fuse_add_direntry(req, buf.data() + used, size - used, e.name.c_str(), &st,
                                    static_cast<off_t>(i + 1));
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void Statfs(fuse_req_t req, fuse_ino_t) {
  auto s = Store(req).statfs();
  if (!s.ok()) return ReplyStatus(req, s.status());
  struct statvfs v {};
  v.f_bsize = 4096;
  v.f_frsize = 4096;
  v.f_blocks = s->budget_bytes / 4096;
  v.f_bfree = s->free_bytes / 4096;
  v.f_bavail = v.f_bfree;
  v.f_files = s->inodes + 1000000;
  v.f_ffree = 1000000;
  v.f_namemax = 255;
  fuse_reply_statfs(req, &v);
}

void Setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
              int) {
  if (IsIntro(ino)) return (void)fuse_reply_err(req, EPERM);
  if (IsDefaultName(ino, name))
    return ReplyStatus(req,
                       SetCallerDefault(req, std::string_view(name).substr(kDefaultPrefix.size()),
                                        std::string_view(value, size)));
  ReplyStatus(req, Store(req).setxattr(ino, name, std::string_view(value, size)));
}

// ---- user.region.map: the map descriptor rmmap(path) reads (docs/regions_mmap.md) ----
// Read-only, not listed. It holds the cluster token, which lets a process read and write any
// memory of the servers, so only root and the mount's own user get it (EACCES otherwise; the
// kernel checks read permission on the file first). FARMEM_REGIONS_FAULT=open_map drops the uid
// check (test only).
constexpr std::string_view kMapXattr = "user.region.map";
bool MapAllowed(fuse_req_t req) {
  uid_t uid = fuse_req_ctx(req)->uid;
  return uid == 0 || uid == geteuid() || FsFault("open_map");
}

void Getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  if (IsIntro(ino)) return (void)fuse_reply_err(req, ENODATA);
  Result<std::string> v = Status::OK();
  if (name == kMapXattr) {
    if (!MapAllowed(req)) return (void)fuse_reply_err(req, EACCES);
    auto d = Store(req).map_descriptor(ino);
    if (!d.ok()) return ReplyStatus(req, d.status());
    d->token = State(req).token;
    v = regions::EncodeMapDescriptor(*d);
    if (!v.ok()) return (void)fuse_reply_err(req, E2BIG);
  } else if (IsDefaultName(ino, name)) {
    auto d = CallerDefaults(req);
    v = RegionStore::DefaultAttr(
        d ? *d : regions::AttrDefaults{},
        "user.region." + std::string(std::string_view(name).substr(kDefaultPrefix.size())));
  } else {
    v = Store(req).getxattr(ino, name);
  }
  if (!v.ok()) return ReplyStatus(req, v.status());
  if (size == 0) return (void)fuse_reply_xattr(req, v->size());
  if (size < v->size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, v->data(), v->size());
}

void Listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  auto names = IsIntro(ino) ? Result<std::vector<std::string>>(std::vector<std::string>{})
                            : Store(req).listxattr(ino);
  if (!names.ok()) return ReplyStatus(req, names.status());
  std::string all;
  for (const std::string& n : *names) all.append(n).push_back('\0');
  if (size == 0) return (void)fuse_reply_xattr(req, all.size());
  if (size < all.size()) return (void)fuse_reply_err(req, ERANGE);
  fuse_reply_buf(req, all.data(), all.size());
}

void Removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  if (IsIntro(ino)) return (void)fuse_reply_err(req, EPERM);
  if (IsDefaultName(ino, name))
    return ReplyStatus(
        req,
        SetCallerDefault(req, std::string_view(name).substr(kDefaultPrefix.size()), std::nullopt));
  ReplyStatus(req, Store(req).removexattr(ino, name));
}

// A request of kind I (OpIndex), counted, then handled by Fn.
template <size_t I, auto Fn>
struct Counted;
template <size_t I, typename... A, void (*Fn)(fuse_req_t, A...)>
struct Counted<I, Fn> {
  static void Call(fuse_req_t req, A... a) {
    static_assert(I < kOpCount);
    State(req).ops[I].fetch_add(1, std::memory_order_relaxed);
    Fn(req, a...);
  }
};

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops ops{};
  ops.init = Init;
  ops.lookup = Counted<OpIndex("lookup"), Lookup>::Call;
  ops.getattr = Counted<OpIndex("getattr"), Getattr>::Call;
  ops.setattr = Counted<OpIndex("setattr"), Setattr>::Call;
  ops.readlink = Counted<OpIndex("readlink"), Readlink>::Call;
  ops.mknod = Counted<OpIndex("mknod"), Mknod>::Call;
  ops.mkdir = Counted<OpIndex("mkdir"), Mkdir>::Call;
  ops.unlink = Counted<OpIndex("unlink"), Unlink>::Call;
  ops.rmdir = Counted<OpIndex("rmdir"), Rmdir>::Call;
  ops.symlink = Counted<OpIndex("symlink"), Symlink>::Call;
  ops.rename = Counted<OpIndex("rename"), Rename>::Call;
  ops.link = Counted<OpIndex("link"), Link>::Call;
  ops.open = Counted<OpIndex("open"), Open>::Call;
  ops.read = Counted<OpIndex("read"), Read>::Call;
  ops.write = Counted<OpIndex("write"), Write>::Call;
  ops.release = Counted<OpIndex("release"), Release>::Call;
  ops.readdir = Counted<OpIndex("readdir"), Readdir>::Call;
  ops.statfs = Counted<OpIndex("statfs"), Statfs>::Call;
  ops.setxattr = Counted<OpIndex("setxattr"), Setxattr>::Call;
  ops.getxattr = Counted<OpIndex("getxattr"), Getxattr>::Call;
  ops.listxattr = Counted<OpIndex("listxattr"), Listxattr>::Call;
  ops.removexattr = Counted<OpIndex("removexattr"), Removexattr>::Call;
  ops.create = Counted<OpIndex("create"), Create>::Call;
  ops.fallocate = Counted<OpIndex("fallocate"), Fallocate>::Call;
  return ops;
}

// ---- the exclusive claim ----
// The value of the key "regions-mount" an exclusive mount holds (bound to its membership lease):
// the mount's member name and process, for the message a refused mount prints.
std::string ClaimValue(const std::string& member) {
  return member + " pid=" + std::to_string(getpid());
}

std::string RandomToken() {
  std::random_device rd;
  return "regions-" + std::to_string(rd()) + std::to_string(rd());
}

// Mounts, serves until unmount or signal, unmounts. `unblocked` is the signal mask the loop runs
// with: RunRegionFs blocks SIGINT/SIGTERM/SIGHUP before it starts any thread, so only this thread
// (libfuse's workers block every signal) receives them and its wait in the loop is interrupted.
Status Serve(RegionStore& store, const RegionFsOptions& o, const std::string& token,
             const sigset_t& unblocked, bool shared) {
  FsState state{store,
                o.mountpoint,
                o.threads,
                o.servers.empty() ? 1 : o.servers.size(),
                token,
                shared,
                shared && !FsFault("exclusive_caching")};
  std::vector<std::string> argv_s = {"farmem-mount", "-o", "fsname=farmem-regions,subtype=regions"};
  if (!FsFault("no_perms")) argv_s.back() += ",default_permissions";
  if (getuid() == 0) argv_s.back() += ",allow_other";
  if (o.debug) argv_s.push_back("-d");
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_lowlevel_ops ops = MakeOps();
  fuse_session* se = fuse_session_new(&args, &ops, sizeof(ops), &state);
  if (se == nullptr) return Status::IoError("regions: fuse_session_new failed");
  Status result;
  // libfuse installs its handlers only over SIG_DFL, and libinfinipath (libfabric's psm provider,
  // common/fuzz_support.h) has already installed SIGINT/SIGTERM handlers that call exit(1), which
  // would leave a dead mount behind (ENOTCONN until fusermount3 -u): put SIG_DFL back first.
  struct sigaction dfl {
  }, saved[3];
  dfl.sa_handler = SIG_DFL;
  const int kStop[3] = {SIGINT, SIGTERM, SIGHUP};
  for (int i = 0; i < 3; ++i) sigaction(kStop[i], &dfl, &saved[i]);
  if (fuse_set_signal_handlers(se) != 0) {
    result = Status::IoError("regions: cannot install signal handlers");
  } else {
    if (fuse_session_mount(se, o.mountpoint.c_str()) != 0) {
      result = Status::IoError("regions: cannot mount at " + o.mountpoint +
                               " (does it exist, is /dev/fuse usable?)");
    } else {
      if (o.on_ready) o.on_ready();
      // OWNERPID: deletes the regions of exited owners and drops what the kernel cached of them
      // (name and pages: other openers' reads then reach the store and get EIO). Started with
      // the stop signals still blocked; wakes at least every 100 ms to see `stop`.
      std::atomic<bool> stop{false};
      std::thread reaper([&] {
        while (!stop.load()) {
          auto r = store.ReapOwners(std::chrono::milliseconds(100));
          if (!r.ok()) {
            FARMEM_LOG_WARN("regions: reaping owners: {}", r.status().ToString());
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            continue;
          }
          for (const regions::ReapedRegion& x : *r) {
            fuse_lowlevel_notify_inval_entry(se, x.parent, x.name.data(), x.name.size());
            if (!FsFault("no_inval")) fuse_lowlevel_notify_inval_inode(se, x.ino, 0, 0);
          }
        }
      });
      // Shared: what other mounts changed is dropped from the kernel's caches (attributes and
      // pages of an inode, a name in a directory), so a stat, a lookup or a read of a file open
      // here sees it. From a thread of its own, never from a request handler (a notification can
      // wait for the kernel to finish a request that waits for the store).
      std::thread notifier;
      if (shared)
        notifier = std::thread([&] {
          while (!stop.load()) {
            std::vector<regions::RemoteChange> changes =
                store.WaitChanges(std::chrono::milliseconds(100));
            if (FsFault("no_remote_inval")) continue;
            std::set<uint64_t> inodes;
            std::set<std::pair<uint64_t, std::string>> entries;
            for (auto& c : changes) {
              if (c.kind == regions::RemoteChange::Kind::kInode)
                inodes.insert(c.ino);
              else
                entries.emplace(c.parent, c.name);
            }
            // Not cached (ENOENT) is fine: there is nothing to drop.
            for (const auto& [parent, name] : entries)
              (void)fuse_lowlevel_notify_inval_entry(se, parent, name.data(), name.size());
            for (uint64_t ino : inodes) (void)fuse_lowlevel_notify_inval_inode(se, ino, 0, 0);
          }
        });
      sigset_t blocked;
      pthread_sigmask(SIG_SETMASK, &unblocked, &blocked);
      fuse_loop_config* cfg = fuse_loop_cfg_create();
      fuse_loop_cfg_set_max_threads(cfg, o.threads);
      fuse_loop_cfg_set_clone_fd(cfg, 1);
      int rc = fuse_session_loop_mt(se, cfg);
      fuse_loop_cfg_destroy(cfg);
      pthread_sigmask(SIG_SETMASK, &blocked, nullptr);
      stop = true;
      reaper.join();
      if (notifier.joinable()) notifier.join();
      fuse_session_unmount(se);
      // A signal (SIGINT/SIGTERM) ends the loop with its number: a clean unmount.
      if (rc < 0) result = Status::IoError("regions: FUSE loop: " + std::string(strerror(-rc)));
    }
    fuse_remove_signal_handlers(se);
  }
  for (int i = 0; i < 3; ++i) sigaction(kStop[i], &saved[i], nullptr);
  fuse_session_destroy(se);
  fuse_opt_free_args(&args);
  return result;
}

// Blocks the stop signals for the threads the mount starts; restores the mask on return.
class StopSignalsBlocked {
 public:
  StopSignalsBlocked() {
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop, &old_);
  }
  ~StopSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  const sigset_t& old() const { return old_; }

 private:
  sigset_t old_;
};

}  // namespace

Status RunRegionFs(const RegionFsOptions& o) {
  if (o.mountpoint.empty()) return Status::InvalidArgument("regions: no mount point");
  struct stat st;
  if (stat(o.mountpoint.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status::InvalidArgument("regions: mount point " + o.mountpoint + " is not a directory");
  if (access("/dev/fuse", R_OK | W_OK) != 0)
    return Status::Unavailable("regions: /dev/fuse is missing or not usable");
  if (o.threads == 0 || o.threads > 64)
    return Status::InvalidArgument("regions: threads must be 1..64");
  // Bounded both ways: 0 would fail every call, and past 30 s a FUSE request (and the process
  // waiting in it) sits longer than any tool expects; the store's own wait for a call's transfers
  // (60 s) must stay the longer one.
  if (o.op_timeout_ms < 100 || o.op_timeout_ms > 30000)
    return Status::InvalidArgument("regions: --op-timeout " + std::to_string(o.op_timeout_ms) +
                                   " ms is out of range (100..30000 ms)");
  if (o.meta_timeout_ms < 100 || o.meta_timeout_ms > 30000)
    return Status::InvalidArgument("regions: --meta-timeout " + std::to_string(o.meta_timeout_ms) +
                                   " ms is out of range (100..30000 ms)");
  StopSignalsBlocked signals;  // before any thread starts
  std::string token = o.token;
  std::unique_ptr<MemoryServer> server;
  regions::RegionStoreOptions so;
  so.servers = o.servers;
  if (so.servers.empty()) {
    // Flagless: one process holds the memory too.
    if (token.empty()) token = RandomToken();
    ServerConfig sc;
    sc.memory_bytes = o.memory_bytes;
    sc.pool_bytes = std::min<uint64_t>(o.memory_bytes, 64ull << 20);
    sc.node.name = "regions-farmemd";
    sc.node.transport.backend = "tcp";
    sc.node.transport.cluster_token = token;
    sc.services = {"pools"};
    FARMEM_ASSIGN_OR_RETURN(server, MemoryServer::Create(sc));
    FARMEM_RETURN_IF_ERROR(server->start());
    so.servers.push_back(server->node().bootstrap_address());
  } else if (token.empty()) {
    return Status::InvalidArgument("regions: --server needs the cluster --token");
  }
  ClusterOptions co;
  co.url = o.cluster_url.empty() ? "memory://regions" : o.cluster_url;
  co.cluster_name = o.cluster_name;
  co.create_if_missing = true;
  co.call_timeout = std::chrono::milliseconds(o.meta_timeout_ms);
  FARMEM_ASSIGN_OR_RETURN(auto cluster, Cluster::Open(co));
  NodeConfig nc;
  nc.name = "regions-mount";
  nc.transport.backend = "tcp";
  nc.transport.cluster_token = token;
  nc.transport.op_timeout = std::chrono::milliseconds(o.op_timeout_ms);
  FARMEM_ASSIGN_OR_RETURN(auto node, Node::Create(nc));
  FARMEM_RETURN_IF_ERROR(node->start());
  so.root_mode = 0755;
  // The paper's default is a region that dies with its creating process; a file system used by
  // shell tools (each `cp`, `echo >` exits at once) needs PERSISTENT as the default, so a new
  // namespace's root carries it and directories inherit it. `setfattr -n user.region.persistent
  // -v 0 DIR` gives the paper's default to what is created in DIR (docs/regions.md).
  so.root_attrs = regions::kAttrPersistent;
  // Running farmemds outlive this mount, so its units must too (the metadata in a shared store
  // names them); the embedded server's memory dies with the process anyway.
  so.persistent_units = !o.servers.empty();
  // Shared (docs/regions.md "Several mounts") or exclusive (a claim bound to the membership
  // lease keeps every other mount out).
  const bool shared =
      o.sharing == RegionFsOptions::Sharing::kShared ||
      (o.sharing == RegionFsOptions::Sharing::kAuto && !co.url.starts_with("memory://"));
  std::string member = "regions-mount-" + std::to_string(getpid()) + "-" +
                       std::to_string(std::random_device{}() % 100000000);
  ClusterMember self;
  self.name = member;
  self.roles = {"regions-mount"};
  FARMEM_RETURN_IF_ERROR(cluster->join(self));
  auto meta = regions::NewClusterMetaStore(*cluster, "regions/", member);
  if (!shared) {
    ClusterPutOptions bound;
    bound.bind_to_lease = true;
    auto claimed = cluster->put_if("regions-mount", ClaimValue(member), 0, bound);
    if (FsFault("no_claim")) claimed = int64_t{0};
    if (!claimed.ok()) {
      auto holder = cluster->get("regions-mount");
      return Status::FailedPrecondition("regions: the namespace is mounted already (by " +
                                        (holder.ok() ? holder->value : std::string("?")) +
                                        ", exclusively)");
    }
    // Shared mounts register under regions/mount/ before they look for this claim: one of the
    // two sees the other.
    auto others = cluster->list("regions/mount/");
    if (others.ok() && !others->empty() && !FsFault("no_claim"))
      return Status::FailedPrecondition("regions: the namespace is mounted already (shared, by " +
                                        (*others)[0].key.substr(14) +
                                        "); it cannot be mounted exclusively");
  }
  Status result;
  {
    auto store = RegionStore::Open(*node, *meta, so);
    if (!store.ok()) {
      result = store.status();
    } else if (auto holder = cluster->get("regions-mount"); shared && holder.ok()) {
      result = Status::FailedPrecondition("regions: the namespace is mounted already (by " +
                                          holder->value + ", exclusively)");
    } else {
      result = Serve(**store, o, token, signals.old(), shared);
    }
  }
  node->stop();
  if (server) server->stop();
  return result;
}

}  // namespace farmem
