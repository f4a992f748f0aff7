// The region store's mirror of the cluster store and the multi-mount protocol (docs/regions.md
// "Several mounts"): loading the namespace, the watch that applies other mounts' changes (one key
// at a time, each only if newer than what this store has), compare-and-set commits, open records
// bound to this mount's lease, parked frees released once no mount has the inode open, unit
// ownership and adoption, self-fencing on the lease. Threads: the watch's (OnWatchEvent), the
// housekeeping thread (Housekeep) and every caller of the store; all state is under mu_.
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <unordered_set>

#include "common/log.h"
#include "regions/engine/region_store.h"
#include "regions/engine/store_internal.h"

namespace farmem::regions {

using internal::Err;
using internal::Fault;
using internal::InodeKey;
using internal::kNoServer;

namespace {

std::string FirstLine(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  char line[256] = {};
  if (std::fgets(line, sizeof(line), f) == nullptr) line[0] = 0;
  std::fclose(f);
  std::string s(line);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// A decimal number of at most 19 digits, or nullopt.
std::optional<uint64_t> Num(std::string_view t) {
  if (t.empty() || t.size() > 19) return std::nullopt;
  uint64_t v = 0;
  for (char ch : t) {
    if (ch < '0' || ch > '9') return std::nullopt;
    v = v * 10 + static_cast<uint64_t>(ch - '0');
  }
  return v;
}

// "<a>/<rest>" of a key after its kind's prefix: a as a number and the rest, or nullopt.
std::optional<std::pair<uint64_t, std::string_view>> NumAndRest(std::string_view t) {
  size_t slash = t.find('/');
  if (slash == std::string_view::npos) return std::nullopt;
  auto n = Num(t.substr(0, slash));
  if (!n) return std::nullopt;
  return std::make_pair(*n, t.substr(slash + 1));
}

class ClusterMeta : public MetaStore {
 public:
  ClusterMeta(Cluster& c, std::string prefix, std::string member)
      : c_(c), prefix_(std::move(prefix)), member_(std::move(member)) {
    if (member_.empty()) {
      std::random_device rd;
      char tag[16];
      std::snprintf(tag, sizeof(tag), "%08x", rd());
      member_ = "regions-mount-" + std::to_string(getpid()) + "-" + tag;
    }
  }
  Status join() override {
    if (c_.joined()) return Status::OK();
    ClusterMember self;
    self.name = member_;
    self.roles = {"regions-mount"};
    return c_.join(self);
  }
  std::string mount_id() const override { return member_; }
  Result<int64_t> put(std::string_view key, std::string_view value) override {
    return c_.put(prefix_ + std::string(key), value);
  }
  Result<int64_t> remove(std::string_view key) override {
    return c_.commit({}, {{ClusterOp::Type::kRemove, prefix_ + std::string(key), ""}});
  }
  Result<int64_t> put_bound(std::string_view key, std::string_view value,
                            bool create_only) override {
    ClusterPutOptions bound;
    bound.bind_to_lease = true;
    if (create_only) return c_.put_if(prefix_ + std::string(key), value, 0, bound);
    return c_.put(prefix_ + std::string(key), value, bound);
  }
  Result<int64_t> commit(const std::vector<MetaCheck>& checks,
                         const std::vector<MetaWrite>& writes) override {
    std::vector<ClusterCompare> cmp;
    for (const MetaCheck& c : checks) cmp.push_back({prefix_ + c.key, c.value});
    std::vector<ClusterOp> ops;
    for (const MetaWrite& w : writes)
      ops.push_back({w.value ? ClusterOp::Type::kPut : ClusterOp::Type::kRemove, prefix_ + w.key,
                     w.value.value_or("")});
    return c_.commit(cmp, ops);
  }
  Result<std::optional<MetaKv>> get(std::string_view key) override {
    auto r = c_.get(prefix_ + std::string(key));
    if (!r.ok()) {
      if (r.status().code() == Code::kNotFound) return std::optional<MetaKv>{};
      return r.status();
    }
    return std::optional<MetaKv>(MetaKv{std::string(key), std::move(r->value), r->mod_revision});
  }
  Result<std::vector<MetaKv>> list(std::string_view prefix) override {
    FARMEM_ASSIGN_OR_RETURN(auto kvs, c_.list(prefix_ + std::string(prefix)));
    std::vector<MetaKv> out;
    out.reserve(kvs.size());
    for (auto& kv : kvs)
      out.push_back({kv.key.substr(prefix_.size()), std::move(kv.value), kv.mod_revision});
    return out;
  }
  Result<int64_t> revision() override { return c_.revision(); }
  Result<std::unique_ptr<ClusterWatch>> watch(
      std::string_view prefix, int64_t from_revision,
      std::function<void(const MetaEvent&)> on_event,
      std::function<void(const Status&)> on_error) override {
    size_t strip = prefix_.size();
    return c_.watch(
        prefix_ + std::string(prefix), from_revision,
        [strip, on_event = std::move(on_event)](const ClusterWatchEvent& e) {
          MetaEvent out;
          out.key = e.kv.key.substr(std::min(strip, e.kv.key.size()));
          if (e.type == ClusterWatchEvent::Type::kPut) out.value = e.kv.value;
          out.revision = e.kv.mod_revision;
          on_event(out);
        },
        std::move(on_error));
  }
  Result<MetaLease> lease() override {
    FARMEM_ASSIGN_OR_RETURN(auto members, c_.members());
    for (const ClusterMember& m : members)
      if (m.name == member_) return MetaLease{m.lease_left, m.revision};
    return Status::NotFound("regions: this mount (" + member_ + ") is not a member any more");
  }
  bool in_process() const override { return c_.options().url.starts_with("memory://"); }

 private:
  Cluster& c_;
  std::string prefix_;
  std::string member_;
};

}  // namespace

std::unique_ptr<MetaStore> NewClusterMetaStore(Cluster& cluster, std::string prefix,
                                               std::string member) {
  return std::make_unique<ClusterMeta>(cluster, std::move(prefix), std::move(member));
}

std::string LocalHostId() {
  char buf[64] = {};
  ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  std::string ns = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "pid:[?]";
  // "pid:[4026531836]" -> "4026531836": no brackets or colons in a record value.
  std::string digits;
  for (char ch : ns)
    if (ch >= '0' && ch <= '9') digits += ch;
  std::string boot = FirstLine("/proc/sys/kernel/random/boot_id");
  return (boot.empty() ? std::string("unknown") : boot) + "/" + (digits.empty() ? "0" : digits);
}

// ---- loading ----

Status RegionStore::Load() {
  FARMEM_ASSIGN_OR_RETURN(int64_t r0, meta_.revision());
  std::lock_guard lk(mu_);  // the watch's first callbacks wait until the namespace is built
  {
    // The watch starts before the list: changes made in between come again and the per-key
    // revisions drop what the list already had.
    auto w = meta_.watch(
        "", r0 + 1, [this](const MetaEvent& e) { OnWatchEvent(e); },
        [this](const Status& s) {
          // The store can no longer say what changed (its history was compacted away): this
          // mirror would go stale, so the mount stops serving data (remount to recover).
          FARMEM_LOG_ERROR("regions: the metadata watch ended ({}); fencing this mount",
                           s.ToString());
          lease_lost_ = true;
        });
    if (!w.ok()) return w.status();
    watch_ = std::move(*w);
  }
  watch_rev_ = r0;
  FARMEM_ASSIGN_OR_RETURN(auto kvs, meta_.list(""));
  std::vector<std::pair<std::string, uint64_t>> dirents;
  std::vector<std::pair<uint32_t, std::string>> owners;
  for (auto& kv : kvs) {
    const std::string& key = kv.key;
    key_rev_[key] = kv.revision;
    std::string_view k = key;
    if (k.starts_with("inode/")) {
      auto ino = Num(k.substr(6));
      auto rec = DecodeInode(kv.value);
      if (!ino || !rec.ok() || rec->h.ino != *ino)
        return Status::InvalidArgument("regions metadata: bad " + key + ": " +
                                       (rec.ok() ? "number mismatch" : rec.status().ToString()));
      auto in = std::make_shared<Inode>();
      in->rec = std::move(*rec);
      in->raw = std::move(kv.value);
      inodes_[*ino] = in;
    } else if (k.starts_with("unit/")) {
      auto gid = Num(k.substr(5));
      auto rec = DecodeUnit(kv.value);
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
    } else if (k.starts_with("dirent/")) {
      auto pr = NumAndRest(k.substr(7));
      if (!pr || kv.value.size() != sizeof(DirentRecord) || !internal::CheckName(pr->second).ok())
        return Status::InvalidArgument("regions metadata: bad " + key);
      DirentRecord d;
      std::memcpy(&d, kv.value.data(), sizeof(d));
      dirents.emplace_back(key, d.ino);
    } else if (k.starts_with("free/")) {
      auto pr = NumAndRest(k.substr(5));
      auto rec = DecodeFree(kv.value);
      if (!pr || !rec.ok() || rec->ino != pr->first)
        return Status::InvalidArgument("regions metadata: bad " + key);
      frees_[key] = Parked{rec->ino, std::move(rec->chunks), std::move(kv.value)};
    } else if (k.starts_with("open/")) {
      auto pr = NumAndRest(k.substr(5));
      if (pr && !pr->second.empty()) open_mounts_[pr->first].insert(std::string(pr->second));
    } else if (k.starts_with("unitowner/")) {
      auto gid = Num(k.substr(10));
      if (gid && *gid > 0 && *gid <= kMaxGid) owners.emplace_back(*gid, kv.value);
    } else if (k.starts_with("owner/")) {
      auto ino = Num(k.substr(6));
      auto rec = DecodeOwner(kv.value);
      if (!ino || !rec.ok())
        return Status::InvalidArgument("regions metadata: bad " + key + ": " +
                                       (rec.ok() ? "inode number" : rec.status().ToString()));
      owner_info_[*ino] = std::move(*rec);
    } else if (k.starts_with("mount/")) {
      auto rec = DecodeMount(kv.value);
      if (rec.ok()) mounts_[key.substr(6)] = std::move(*rec);
    } else if (k.starts_with("fixvaddr/")) {
      auto slot = Num(k.substr(9));
      if (!slot || *slot >= kFixVaddrSlots || !Num(kv.value))
        return Status::InvalidArgument("regions metadata: bad " + key);
      ApplyVaddr(static_cast<uint32_t>(*slot), kv.value);
    }
  }
  for (auto& [gid, owner] : owners) unit_owners_[gid] = owner;
  // Session units die with the clients that allocated them: metadata naming units from an
  // earlier store can only be trusted when units are persistent (else its chunks may already
  // belong to someone else).
  if (!units_.empty() && !options_.persistent_units)
    return Status::FailedPrecondition(
        "regions metadata: names " + std::to_string(units_.size()) +
        " unit(s) of an earlier mount, but this store allocates session units, which do not "
        "outlive a mount; open it with persistent units");
  if (inodes_.empty()) {
    InodeRecord root;
    root.h.ino = kRootIno;
    root.h.mode = S_IFDIR | (options_.root_mode & 07777);
    root.h.nlink = 2;
    root.h.attr_flags = options_.root_attrs & kAttrKnown;
    root.h.atime_ns = root.h.mtime_ns = root.h.ctime_ns = internal::NowNs();
    auto made = CommitApply({{InodeKey(kRootIno), std::nullopt}},
                            {{InodeKey(kRootIno), EncodeInode(root)}});
    // Another mount made the namespace at the same time: the refresh brought its root.
    if (!made.ok() && !Conflict(made.status())) return made.status();
    if (!inodes_.contains(kRootIno))
      return Status::Unavailable("regions: the namespace's root could not be made or read");
  }
  if (!inodes_.contains(kRootIno) || !inodes_[kRootIno]->is_dir())
    return Status::InvalidArgument("regions metadata: no root directory");
  for (auto& [key, ino] : dirents) {
    auto pr = NumAndRest(std::string_view(key).substr(7));
    uint64_t parent = pr->first;
    auto p = inodes_.find(parent);
    auto c = inodes_.find(ino);
    if (p == inodes_.end() || !p->second->is_dir() || c == inodes_.end() || ino == kRootIno)
      return Status::InvalidArgument("regions metadata: dangling " + key);
    children_[parent].emplace(std::string(pr->second), ino);
    name_of_[ino] = {parent, std::string(pr->second)};
  }
  // Inode records no name leads to: an unlinked file (nlink 0) still open somewhere, or whose
  // last close could not remove its record (the cluster store was lost), is reclaimed once no
  // mount has it open (Open's sweep); other nameless records are leftovers of a create or delete
  // cut short by an older version: not part of the namespace, dropped (their records removed,
  // best effort) and their chunks not counted as used. A directory with children is not such a
  // leftover (a subtree cut off from the root is refused below).
  std::unordered_set<uint64_t> pending;  // nameless, nlink 0: awaiting reclaim
  if (!Fault("keep_orphans")) {
    for (auto it = inodes_.begin(); it != inodes_.end();) {
      const uint64_t ino = it->first;
      if (ino == kRootIno || name_of_.contains(ino) ||
          (it->second->is_dir() && !children_[ino].empty())) {
        ++it;
        continue;
      }
      if (!it->second->is_dir() && it->second->rec.h.nlink == 0) {
        pending.insert(ino);
        ++it;
        continue;
      }
      FARMEM_LOG_WARN(
          "regions metadata: inode/{} has no name (a create or delete cut short): dropped", ino);
      (void)meta_.remove(InodeKey(ino));
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
    uint64_t dir = todo.back();
    todo.pop_back();
    for (auto& [name, child] : children_[dir]) {
      if (++names[child] > 1)
        return Status::InvalidArgument("regions metadata: inode " + std::to_string(child) +
                                       " has more than one name");
      if (inodes_[child]->is_dir()) todo.push_back(child);
    }
  }
  if (names.size() + pending.size() != inodes_.size())
    return Status::InvalidArgument(
        "regions metadata: " + std::to_string(inodes_.size() - names.size() - pending.size()) +
        " inode(s) not reachable from the root");
  // Every chunk in exactly one map or free record, and only in units that exist.
  auto count = [&](MapEntry e, const std::string& where) -> Status {
    if (e == kHole) return Status::OK();
    auto u = units_.find(EntryGid(e));
    if (u == units_.end())
      return Status::InvalidArgument("regions metadata: " + where +
                                     " maps a chunk of unknown unit");
    uint16_t bit = static_cast<uint16_t>(1u << (EntryUnitOffset(e) >> kChunkShift));
    if (u->second->used & bit)
      return Status::InvalidArgument("regions metadata: a chunk is mapped twice");
    u->second->used |= bit;
    return Status::OK();
  };
  for (auto& [ino, in] : inodes_)
    for (MapEntry e : in->rec.map) FARMEM_RETURN_IF_ERROR(count(e, "inode " + std::to_string(ino)));
  for (auto& [key, p] : frees_)
    for (MapEntry e : p.chunks) FARMEM_RETURN_IF_ERROR(count(e, key));
  // Records of an earlier store of this same member (a reopen in one process): it has no handle
  // now, so its open records and writer claims go; its units stay this mount's.
  for (auto& [ino, ms] : open_mounts_)
    if (ms.contains(mount_id_)) (void)meta_.remove(internal::OpenKey(ino, mount_id_));
  // Owners of an earlier mount on this host: watched by pid again (with the start time the
  // record names, so a reused pid is not taken for the owner); gone ones reaped at the first
  // ReapOwners. Owners on other hosts are those hosts' mounts' to watch.
  for (auto& [ino, in] : inodes_) {
    if (!in->is_reg() || in->rec.h.owner_pid <= 0 || Fault("no_rewatch") || !OwnerHere(ino))
      continue;
    auto oi = owner_info_.find(ino);
    WatchOwner(in->rec.h.owner_pid, oi == owner_info_.end() ? "" : oi->second.start);
  }
  mounts_changed_ = true;
  loaded_ = true;
  return Status::OK();
}

// ---- applying changes ----

void RegionStore::OnWatchEvent(const MetaEvent& e) {
  if (options_.before_apply) options_.before_apply();
  std::lock_guard lk(mu_);
  ApplyKey(e.key, e.value, e.revision, true);
  if (e.revision > watch_rev_) {
    watch_rev_ = e.revision;
    watch_cv_.notify_all();
  }
}

void RegionStore::ApplyKey(const std::string& key, const std::optional<std::string>& value,
                           int64_t rev, bool remote) {
  int64_t& have = key_rev_[key];
  if (rev <= have) return;  // this store has that change or a later one
  have = rev;
  if (!value) tombstones_.emplace(rev, key);
  std::string_view k = key;
  if (k.starts_with("inode/")) {
    if (auto ino = Num(k.substr(6))) ApplyInode(*ino, value, remote);
  } else if (k.starts_with("dirent/")) {
    if (auto pr = NumAndRest(k.substr(7)); pr && internal::CheckName(pr->second).ok())
      ApplyDirent(pr->first, pr->second, value, remote);
  } else if (k.starts_with("unit/")) {
    if (auto gid = Num(k.substr(5)); gid && *gid > 0 && *gid <= kMaxGid)
      ApplyUnit(static_cast<uint32_t>(*gid), value);
  } else if (k.starts_with("free/")) {
    ApplyFree(key, value);
  } else if (k.starts_with("open/")) {
    if (auto pr = NumAndRest(k.substr(5)); pr && !pr->second.empty())
      ApplyOpen(pr->first, std::string(pr->second), value.has_value(), remote);
  } else if (k.starts_with("unitowner/")) {
    if (auto gid = Num(k.substr(10)); gid && *gid > 0 && *gid <= kMaxGid)
      ApplyUnitOwner(static_cast<uint32_t>(*gid), value);
  } else if (k.starts_with("owner/")) {
    if (auto ino = Num(k.substr(6))) ApplyOwner(*ino, value);
  } else if (k.starts_with("mount/")) {
    ApplyMount(key.substr(6), value, remote);
  } else if (k.starts_with("fixvaddr/")) {
    if (auto slot = Num(k.substr(9)); slot && *slot < kFixVaddrSlots)
      ApplyVaddr(static_cast<uint32_t>(*slot), value);
  }
  // writer/<ino> (ONEWRITER claims) and next-ino are decided by the store alone.
}

void RegionStore::ApplyInode(uint64_t ino, const std::optional<std::string>& value, bool remote) {
  auto it = inodes_.find(ino);
  if (!value) {
    if (it == inodes_.end()) return;
    std::shared_ptr<Inode> in = it->second;
    // Its chunks moved to a free record in the same transaction (they are not freed here). A
    // file this mount has open keeps its object (and map) until the last handle goes.
    in->stored = false;
    in->raw.clear();
    if (in->opens == 0) {
      in->reclaimed = true;
      inodes_.erase(it);
      if (in->is_dir() && children_[ino].empty()) children_.erase(ino);
    }
    if (remote) PushChange({RemoteChange::Kind::kInode, ino, 0, ""});
    return;
  }
  auto rec = DecodeInode(*value);
  if (!rec.ok() || rec->h.ino != ino) {
    FARMEM_LOG_WARN("regions: ignoring a bad record of inode {} from the metadata store: {}", ino,
                    rec.ok() ? "number mismatch" : rec.status().ToString());
    return;
  }
  if (it == inodes_.end()) it = inodes_.emplace(ino, std::make_shared<Inode>()).first;
  Inode& in = *it->second;
  in.rec = std::move(*rec);
  in.raw = *value;
  in.stored = true;
  for (MapEntry e : in.rec.map) MarkUsed(e);
  if (remote) PushChange({RemoteChange::Kind::kInode, ino, 0, ""});
}

void RegionStore::ApplyDirent(uint64_t parent, std::string_view name,
                              const std::optional<std::string>& value, bool remote) {
  auto& names = children_[parent];
  if (value) {
    if (value->size() != sizeof(DirentRecord)) return;
    DirentRecord d;
    std::memcpy(&d, value->data(), sizeof(d));
    if (d.ino == 0 || d.ino == kRootIno) return;
    names[std::string(name)] = d.ino;
    name_of_[d.ino] = {parent, std::string(name)};
  } else {
    auto it = names.find(name);
    if (it != names.end()) {
      auto n = name_of_.find(it->second);
      if (n != name_of_.end() && n->second.first == parent && n->second.second == name)
        name_of_.erase(n);
      names.erase(it);
    }
  }
  if (remote) PushChange({RemoteChange::Kind::kEntry, 0, parent, std::string(name)});
}

void RegionStore::ApplyUnit(uint32_t gid, const std::optional<std::string>& value) {
  if (!value) {
    units_.erase(gid);
    return;
  }
  auto rec = DecodeUnit(*value);
  if (!rec.ok()) {
    FARMEM_LOG_WARN("regions: ignoring a bad record of unit {}: {}", gid, rec.status().ToString());
    return;
  }
  auto u = std::make_unique<Unit>();
  auto it = std::find_if(servers_.begin(), servers_.end(),
                         [&](auto& s) { return s->address == rec->address; });
  if (it == servers_.end()) {
    FARMEM_LOG_WARN(
        "regions: unit {} is on server {}, which this mount was not given: its "
        "chunks read and write EIO here",
        gid, rec->address);
    u->server = kNoServer;
  } else {
    u->server = static_cast<uint32_t>(it - servers_.begin());
    u->base = RemoteRef{(*it)->client->server().id, rec->key, rec->offset};
  }
  auto old = units_.find(gid);
  if (old != units_.end() && old->second->server == u->server &&
      old->second->base.key == u->base.key && old->second->base.offset == u->base.offset)
    return;  // this store made it (or knew it already)
  units_[gid] = std::move(u);
  // References that arrived before the unit's record (none in revision order, but cheap).
  for (auto& [ino, in] : inodes_)
    for (MapEntry e : in->rec.map)
      if (e != kHole && EntryGid(e) == gid) MarkUsed(e);
  for (auto& [key, p] : frees_)
    for (MapEntry e : p.chunks)
      if (EntryGid(e) == gid) MarkUsed(e);
}

void RegionStore::ApplyFree(const std::string& key, const std::optional<std::string>& value) {
  if (value) {
    auto rec = DecodeFree(*value);
    auto pr = NumAndRest(std::string_view(key).substr(5));
    if (!rec.ok() || !pr || pr->first != rec->ino) {
      FARMEM_LOG_WARN("regions: ignoring a bad free record {}", key);
      return;
    }
    for (MapEntry e : rec->chunks) MarkUsed(e);
    frees_[key] = Parked{rec->ino, std::move(rec->chunks), *value};
    return;
  }
  auto it = frees_.find(key);
  if (it == frees_.end()) return;
  // The parked chunks are free now: the units' owners may hand them out again.
  for (MapEntry e : it->second.chunks) FreeChunk(e);
  frees_.erase(it);
}

void RegionStore::ApplyOpen(uint64_t ino, const std::string& mount, bool present, bool remote) {
  if (present) {
    open_mounts_[ino].insert(mount);
    return;
  }
  auto it = open_mounts_.find(ino);
  if (it != open_mounts_.end()) {
    it->second.erase(mount);
    if (it->second.empty()) open_mounts_.erase(it);
  }
  // Another mount closed it (or its lease ended): what waited for that may go now.
  if (remote && mount != mount_id_) Enqueue(ino);
}

void RegionStore::ApplyUnitOwner(uint32_t gid, const std::optional<std::string>& value) {
  if (value)
    unit_owners_[gid] = *value;
  else
    unit_owners_.erase(gid);
}

void RegionStore::ApplyOwner(uint64_t ino, const std::optional<std::string>& value) {
  if (!value) {
    owner_info_.erase(ino);
    return;
  }
  auto rec = DecodeOwner(*value);
  if (!rec.ok()) return;
  owner_info_[ino] = std::move(*rec);
  // A region another mount of this host made: its owner is ours to watch too.
  const OwnerRecord& o = owner_info_[ino];
  if (o.host == host_id_ && o.pid > 0) WatchOwner(o.pid, o.start);
}

void RegionStore::ApplyMount(const std::string& id, const std::optional<std::string>& value,
                             bool remote) {
  if (value) {
    auto rec = DecodeMount(*value);
    if (rec.ok()) mounts_[id] = std::move(*rec);
    return;
  }
  mounts_.erase(id);
  if (remote) mounts_changed_ = true;  // ReapOwners looks for owners left without a mount
}

void RegionStore::PushChange(RemoteChange c) {
  if (!want_changes_) return;  // nobody drops kernel caches for this store (no FUSE daemon)
  changes_.push_back(std::move(c));
  changes_cv_.notify_all();
}

void RegionStore::ApplyVaddr(uint32_t slot, const std::optional<std::string>& value) {
  auto old = vaddr_slots_.find(slot);
  if (old != vaddr_slots_.end()) {
    auto v = vaddr_of_.find(old->second);
    if (v != vaddr_of_.end() && v->second == slot) vaddr_of_.erase(v);
    vaddr_slots_.erase(old);
  }
  if (!value) return;
  auto ino = Num(*value);
  if (!ino) return;
  vaddr_slots_[slot] = *ino;
  vaddr_of_[*ino] = slot;
}

Result<uint32_t> RegionStore::FreeVaddrSlot() const {
  uint32_t slot = 0;
  for (const auto& [s, ino] : vaddr_slots_) {
    if (s != slot) break;
    ++slot;
  }
  if (slot >= kFixVaddrSlots)
    return Err(ENOSPC, "every FIXVADDR address range is taken (4096 regions)");
  return slot;
}

std::string RegionStore::VaddrKey(uint32_t slot) {
  return "fixvaddr/" + std::to_string(slot);
}

void RegionStore::MarkUsed(MapEntry e) {
  if (e == kHole) return;
  auto u = units_.find(EntryGid(e));
  if (u == units_.end()) return;
  u->second->used |= static_cast<uint16_t>(1u << (EntryUnitOffset(e) >> kChunkShift));
}

bool RegionStore::Mine(uint32_t gid) const {
  auto o = unit_owners_.find(gid);
  if (o == unit_owners_.end() || o->second != mount_id_) return false;
  auto u = units_.find(gid);
  return u != units_.end() && u->second->usable_rev <= watch_rev_;
}

bool RegionStore::OwnerHere(uint64_t ino) const {
  auto it = owner_info_.find(ino);
  return it == owner_info_.end() || it->second.host == host_id_;  // no record: an older mount's
}

// ---- committing ----

bool RegionStore::Conflict(const Status& s) {
  return s.code() == Code::kAborted && s.message().starts_with("conflict");
}

MetaCheck RegionStore::InodeCheck(const Inode& in) const {
  if (!in.stored) return {InodeKey(in.rec.h.ino), std::nullopt};
  return {InodeKey(in.rec.h.ino), in.raw};
}

Result<int64_t> RegionStore::CommitApply(const std::vector<MetaCheck>& checks,
                                         const std::vector<MetaWrite>& writes) {
  auto r = meta_.commit(checks, writes);
  if (!r.ok()) {
    if (r.status().code() != Code::kFailedPrecondition) return r.status();
    conflicts_++;
    std::vector<std::string> keys;
    for (const MetaCheck& c : checks) keys.push_back(c.key);
    FARMEM_RETURN_IF_ERROR(Refresh(keys));
    return Status::Aborted("conflict: another mount changed a record first");
  }
  for (const MetaWrite& w : writes) ApplyKey(w.key, w.value, *r, false);
  return *r;
}

Status RegionStore::Refresh(const std::vector<std::string>& keys) {
  FARMEM_ASSIGN_OR_RETURN(int64_t now, meta_.revision());
  for (const std::string& key : keys) {
    FARMEM_ASSIGN_OR_RETURN(auto kv, meta_.get(key));
    if (kv)
      ApplyKey(key, kv->value, kv->revision, true);
    else
      ApplyKey(key, std::nullopt, now, true);
    // An inode record read ahead of the watch may name units made since: those too.
    if (auto ino = key.starts_with("inode/") ? Num(std::string_view(key).substr(6)) : std::nullopt)
      if (auto in = inodes_.find(*ino); in != inodes_.end())
        FARMEM_RETURN_IF_ERROR(RefreshUnitsOf(*in->second));
  }
  return Status::OK();
}

Status RegionStore::RefreshUnitsOf(const Inode& in) {
  std::vector<std::string> missing;
  for (MapEntry e : in.rec.map)
    if (e != kHole && !units_.contains(EntryGid(e))) {
      std::string key = "unit/" + std::to_string(EntryGid(e));
      if (std::find(missing.begin(), missing.end(), key) == missing.end()) missing.push_back(key);
    }
  return missing.empty() ? Status::OK() : Refresh(missing);
}

Result<uint64_t> RegionStore::NextIno() {
  if (next_ino_ != 0 && next_ino_ < ino_limit_) return next_ino_++;
  // A batch of numbers from the namespace's counter: no two mounts hand out the same one, and
  // none is used twice (a kernel may still know an old inode by its number).
  constexpr uint64_t kBatch = 1024;
  for (int attempt = 0; attempt < internal::kMaxConflicts; ++attempt) {
    FARMEM_ASSIGN_OR_RETURN(auto kv, meta_.get("next-ino"));
    uint64_t base = kRootIno + 1;
    for (const auto& [ino, in] : inodes_) base = std::max(base, ino + 1);
    if (kv) {
      auto n = Num(kv->value);
      if (!n) return Err(EIO, "the namespace's inode counter is malformed");
      base = std::max(base, *n);
    }
    auto r = meta_.commit({{"next-ino", kv ? std::optional<std::string>(kv->value) : std::nullopt}},
                          {{"next-ino", std::to_string(base + kBatch)}});
    if (r.ok()) {
      next_ino_ = base + 1;
      ino_limit_ = base + kBatch;
      return base;
    }
    if (r.status().code() != Code::kFailedPrecondition) return r.status();
  }
  return Err(EIO, "the inode counter kept changing");
}

std::string RegionStore::NewFreeKey(uint64_t ino) {
  return internal::FreePrefix(ino) + mount_id_ + "." + std::to_string(next_free_tag_++);
}

// ---- open records, parked frees, units ----

Status RegionStore::Publish(Inode& in, uint64_t ino) {
  if (in.published) return Status::OK();
  // Bound to this mount's lease: a mount that dies lets go of what it had open when its lease
  // ends (unbound_opens, test only: a plain key, which outlives a killed mount).
  auto r = Fault("unbound_opens") ? meta_.put(internal::OpenKey(ino, mount_id_), "1")
                                  : meta_.put_bound(internal::OpenKey(ino, mount_id_), "1", false);
  if (!r.ok()) {
    NoteStoreError(r.status());
    return Err(EIO, "recording the open in the metadata store: " + r.status().ToString());
  }
  in.published = true;
  std::lock_guard lk(mu_);
  ApplyKey(internal::OpenKey(ino, mount_id_), std::string("1"), *r, false);
  return Status::OK();
}

Status RegionStore::Unpublish(Inode& in, uint64_t ino) {
  if (!in.published) return Status::OK();
  auto r = meta_.remove(internal::OpenKey(ino, mount_id_));
  if (!r.ok()) return r.status();
  in.published = false;
  std::lock_guard lk(mu_);
  ApplyKey(internal::OpenKey(ino, mount_id_), std::nullopt, *r, false);
  return Status::OK();
}

Result<bool> RegionStore::OpenAnywhere(uint64_t ino) {
  FARMEM_ASSIGN_OR_RETURN(auto kvs, meta_.list(internal::OpenPrefix(ino)));
  return !kvs.empty();
}

void RegionStore::TryReclaim(const std::shared_ptr<Inode>& in) {
  if (!in) return;
  const bool unpinned = Fault("no_pin") || Fault("no_open_check");
  uint64_t ino = 0;
  {
    std::lock_guard lk(mu_);
    if (in->reclaimed || !in->stored || in->rec.h.nlink != 0 || in->is_dir() ||
        (in->opens > 0 && !Fault("no_pin")))
      return;
    ino = in->rec.h.ino;
  }
  // The record (and so the chunk map) goes first, then the open records are checked
  // (TryFree): an open that got in before sees the record and is waited for, one after it finds
  // no record. This check only saves parking chunks that are still in use.
  if (!unpinned) {
    auto any = OpenAnywhere(ino);
    if (!any.ok() || *any) return;
  }
  std::unique_lock io(in->io);
  {
    std::lock_guard lk(mu_);
    if (in->reclaimed || !in->stored || in->rec.h.nlink != 0) return;
    FreeRecord parked{ino, {}};
    for (MapEntry e : in->rec.map)
      if (e != kHole) parked.chunks.push_back(e);
    std::vector<MetaWrite> writes{{InodeKey(ino), std::nullopt},
                                  {"owner/" + std::to_string(ino), std::nullopt}};
    if (auto v = vaddr_of_.find(ino); v != vaddr_of_.end())
      writes.push_back({VaddrKey(v->second), std::nullopt});
    if (!parked.chunks.empty()) writes.push_back({NewFreeKey(ino), EncodeFree(parked)});
    auto r = CommitApply({InodeCheck(*in)}, writes);
    if (!r.ok()) return;  // changed meanwhile, or the store is away: the housekeeper tries again
    in->reclaimed = true;
    in->rec.map.clear();
    inodes_.erase(ino);
  }
  TryFree(ino, /*io_held=*/true);
}

void RegionStore::TryFree(uint64_t ino, bool io_held) {
  std::vector<std::pair<std::string, std::string>> pending;
  std::shared_ptr<Inode> in;
  {
    std::lock_guard lk(mu_);
    const std::string prefix = internal::FreePrefix(ino);
    for (auto it = frees_.lower_bound(prefix); it != frees_.end() && it->first.starts_with(prefix);
         ++it)
      pending.emplace_back(it->first, it->second.raw);
    auto i = inodes_.find(ino);
    if (i != inodes_.end()) in = i->second;
  }
  if (pending.empty()) return;
  // Invalidate-before-free: the chunks go back only when no mount (this one included) has the
  // inode open; a mount's open record lives as long as its lease.
  if (!Fault("no_pin") && !Fault("no_open_check")) {
    auto any = OpenAnywhere(ino);
    if (!any.ok() || *any) return;
  }
  // Reads and writes of this mount still running on the old map finish first.
  std::unique_lock<std::shared_mutex> io;
  if (in && !io_held) io = std::unique_lock<std::shared_mutex>(in->io);
  std::lock_guard lk(mu_);
  for (auto& [key, raw] : pending) (void)CommitApply({{key, raw}}, {{key, std::nullopt}});
  ReleaseEmptyUnits();
}

void RegionStore::ReleaseEmptyUnits() {
  std::vector<uint32_t> empty;
  for (auto& [gid, u] : units_)
    if (u->used == 0 && Mine(static_cast<uint32_t>(gid)))
      empty.push_back(static_cast<uint32_t>(gid));
  for (uint32_t gid : empty) {
    Unit& u = *units_[gid];
    RemoteRef base = u.base;
    uint32_t server = u.server;
    // An empty unit goes back to its server, so statfs and other clients see the memory. Its
    // record goes first: a record left behind would name memory the server may have handed to
    // someone else by the next Load. If the record cannot be removed (the cluster store is
    // unreachable) the unit stays, empty, and is used again.
    if (Fault("free_unit_first")) (void)servers_[server]->client->free_raw(base);
    auto r = CommitApply({{"unitowner/" + std::to_string(gid), mount_id_}},
                         {{"unit/" + std::to_string(gid), std::nullopt}});
    if (!r.ok()) continue;
    if (!Fault("free_unit_first")) (void)servers_[server]->client->free_raw(base);
    auto o = meta_.remove("unitowner/" + std::to_string(gid));
    if (o.ok()) ApplyKey("unitowner/" + std::to_string(gid), std::nullopt, *o, false);
    units_freed_++;
  }
}

void RegionStore::AdoptOrphanUnits(bool wait) {
  std::vector<uint32_t> orphans;
  {
    std::lock_guard lk(mu_);
    for (auto& [gid, u] : units_)
      if (u->server != kNoServer && !unit_owners_.contains(static_cast<uint32_t>(gid)))
        orphans.push_back(static_cast<uint32_t>(gid));
  }
  int64_t last = 0;
  for (uint32_t gid : orphans) {
    const std::string key = "unitowner/" + std::to_string(gid);
    auto r = meta_.put_bound(key, mount_id_, /*create_only=*/true);
    if (!r.ok()) continue;  // another mount took it, or the store is away
    std::lock_guard lk(mu_);
    ApplyKey(key, mount_id_, *r, false);
    auto u = units_.find(gid);
    if (u == units_.end()) continue;
    // Its previous owner's chunks are known once the watch has delivered this revision (every
    // record naming them was committed before its claim went).
    u->second->usable_rev = *r;
    u->second->touched = 0xffff;
    last = std::max(last, *r);
  }
  if (wait && last > 0) {
    std::unique_lock lk(mu_);
    watch_cv_.wait_for(lk, std::chrono::seconds(5), [&] { return watch_rev_ >= last; });
  }
}

void RegionStore::Enqueue(uint64_t ino) {
  todo_.insert(ino);
  house_cv_.notify_all();
}

// ---- the lease ----

namespace {
int64_t SteadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

bool RegionStore::LeaseOk() const {
  return !lease_lost_ && SteadyNs() <= lease_deadline_ns_.load();
}

Status RegionStore::CheckLease() {
  if (meta_.in_process() || Fault("no_fence")) return Status::OK();
  if (!lease_lost_ && !LeaseOk()) {
    // Past the deadline the housekeeper's last look gave: ask once more before refusing (etcd may
    // just be back), but not more often than every 500 ms while it stays away.
    const int64_t now = SteadyNs();
    int64_t last = last_sync_probe_ns_.load();
    if (now - last > 500'000'000 && last_sync_probe_ns_.compare_exchange_strong(last, now))
      ProbeLease();
  }
  if (lease_lost_)
    return Err(EIO,
               "this mount's lease ran out (other mounts may have freed what it had open): "
               "remount");
  if (!LeaseOk())
    return Err(EIO,
               "this mount's lease is not confirmed (the metadata store does not answer): other "
               "mounts may free what it has open once the lease ends");
  return Status::OK();
}

std::string RegionStore::lease_state() const {
  if (meta_.in_process()) return "ok";
  if (lease_lost_) return "lost";
  return LeaseOk() ? "ok" : "unconfirmed";
}

bool RegionStore::StoreAway() const {
  return SteadyNs() < store_away_until_ns_.load();
}

void RegionStore::NoteStoreError(const Status& s) {
  if (s.code() == Code::kUnavailable || s.code() == Code::kTimedOut)
    store_away_until_ns_ = SteadyNs() + 1'000'000'000;
}

void RegionStore::ProbeLease() {
  if (meta_.in_process()) return;
  const auto t0 = std::chrono::steady_clock::now();
  auto l = meta_.lease();
  if (!l.ok()) {
    NoteStoreError(l.status());
    if (l.status().code() == Code::kNotFound) {
      FARMEM_LOG_ERROR("regions: {}; fencing this mount", l.status().ToString());
      lease_lost_ = true;
    }
    return;
  }
  if (member_revision_ == 0) member_revision_ = l->member_revision;
  if (l->member_revision != member_revision_ && !lease_lost_) {
    // The membership was made again with a new lease: the old one ran out, and with it this
    // mount's open records for a while.
    FARMEM_LOG_ERROR("regions: mount {} lost its lease (re-joined); fencing it", mount_id_);
    lease_lost_ = true;
  }
  if (l->left.count() < 0) return;
  // The lease lasts at least `left` from when the question was asked; a margin for the clock.
  const auto deadline = t0 + l->left - std::chrono::milliseconds(750);
  lease_deadline_ns_ =
      std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
}

// ---- the housekeeping thread ----

void RegionStore::Housekeep() {
  using Clock = std::chrono::steady_clock;
  auto next_probe = Clock::now();
  auto next_sweep = Clock::now() + std::chrono::seconds(2);
  std::unique_lock lk(mu_);
  while (!stop_) {
    house_cv_.wait_for(lk, std::chrono::milliseconds(200), [&] { return stop_ || !todo_.empty(); });
    if (stop_) break;
    std::set<uint64_t> todo;
    todo.swap(todo_);
    const bool sweep = Clock::now() >= next_sweep;
    if (sweep) {
      next_sweep = Clock::now() + std::chrono::seconds(2);
      for (auto& [key, p] : frees_) todo.insert(p.ino);
      for (auto& [ino, in] : inodes_)
        if (!in->is_dir() && in->rec.h.nlink == 0 && in->opens == 0) todo.insert(ino);
      // Tombstones the watch has passed: no older change of those keys can come any more.
      for (auto it = tombstones_.begin(); it != tombstones_.end() && it->first <= watch_rev_;) {
        auto k = key_rev_.find(it->second);
        if (k != key_rev_.end() && k->second == it->first) key_rev_.erase(k);
        it = tombstones_.erase(it);
      }
    }
    std::vector<std::shared_ptr<Inode>> stale;  // open records this mount failed to remove
    for (auto& [ino, in] : inodes_)
      if (in->published && in->opens == 0) stale.push_back(in);
    lk.unlock();
    for (auto& in : stale) {
      std::lock_guard ol(in->open_mu);
      uint64_t ino = 0;
      bool idle = false;
      {
        std::lock_guard g(mu_);
        ino = in->rec.h.ino;
        idle = in->opens == 0;
      }
      if (idle) (void)Unpublish(*in, ino);
      todo.insert(ino);
    }
    for (uint64_t ino : todo) {
      std::shared_ptr<Inode> in;
      {
        std::lock_guard g(mu_);
        auto it = inodes_.find(ino);
        if (it != inodes_.end()) in = it->second;
      }
      TryReclaim(in);
      TryFree(ino);
    }
    if (Clock::now() >= next_probe) {
      next_probe = Clock::now() + std::chrono::seconds(1);
      ProbeLease();
    }
    if (sweep) {
      AdoptOrphanUnits(false);
      std::lock_guard g(mu_);
      ReleaseEmptyUnits();
    }
    lk.lock();
  }
}

std::vector<RemoteChange> RegionStore::WaitChanges(std::chrono::milliseconds wait) {
  std::unique_lock lk(mu_);
  want_changes_ = true;
  changes_cv_.wait_for(lk, wait, [&] { return !changes_.empty() || stop_; });
  std::vector<RemoteChange> out(changes_.begin(), changes_.end());
  changes_.clear();
  return out;
}

}  // namespace farmem::regions
