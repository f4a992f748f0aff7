// rmmap of a file in a farmem mount from any process (docs/regions_mmap.md, "rmmap of a mounted
// file"): the mount's "user.region.map" descriptor says where each chunk lives; faults read those
// chunks one-sidedly through a process-wide client Node, rsync writes them back the same way (or
// through the file, over holes). The fault / rsync engine itself is rmmap.cc's.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "farmem/coro.h"
#include "farmem/node.h"
#include "farmem/regions.h"
#include "regions/engine/chunk_io.h"
#include "regions/format/region_layout.h"
#include "regions/mmap/backing.h"

namespace farmem {
namespace {

using regions::kChunkBytes;
using regions::kChunkShift;
using rmmap_internal::Backing;

constexpr const char* kMapXattr = "user.region.map";

// One client Node per cluster token and process, shared by every mapping that needs it and
// stopped with the last one. `pid`: a forked child must not use its parent's (its threads are
// not in the child), so it gets its own.
struct ClientNode {
  pid_t pid = 0;
  std::unique_ptr<Node> node;
  std::mutex mu;  // guards peers; held across a connect (bounded by its connect_timeout)
  std::map<std::string, PeerId, std::less<>> peers;

  ~ClientNode() {
    if (node) node->stop();
  }
  Result<PeerId> Peer(const std::string& address) {
    std::lock_guard lk(mu);
    auto it = peers.find(address);
    if (it != peers.end()) return it->second;
    auto info = node->connect(address);
    if (!info.ok())
      return Status(info.status().code(),
                    "rmmap: memory server " + address + ": " + info.status().ToString());
    peers[address] = info->id;
    return info->id;
  }
};

std::mutex g_nodes_mu;
std::map<std::string, std::weak_ptr<ClientNode>> g_nodes;  // by token

Result<std::shared_ptr<ClientNode>> NodeFor(const std::string& token) {
  std::lock_guard lk(g_nodes_mu);
  std::weak_ptr<ClientNode>& slot = g_nodes[token];
  if (auto n = slot.lock(); n && n->pid == getpid()) return n;
  auto n = std::make_shared<ClientNode>();
  n->pid = getpid();
  NodeConfig nc;
  nc.name = "rmmap-" + std::to_string(getpid());
  // The mount's own node and its servers speak native TCP (region_fs.cc RunRegionFs).
  nc.transport.backend = "tcp";
  nc.transport.cluster_token = token;
  FARMEM_ASSIGN_OR_RETURN(n->node, Node::Create(nc));
  FARMEM_RETURN_IF_ERROR(n->node->start());
  slot = n;
  return n;
}

// The descriptor of the file open at `fd`. The kernel's writeback cache may hold bytes written
// through the mount that the store has not seen yet: fsync first, so the map includes them.
Result<regions::MapDescriptor> ReadDescriptor(int fd) {
  if (fsync(fd) != 0 && errno != EINVAL) return Status::FromErrno("rmmap: fsync", errno);
  std::string buf(regions::kMaxMapDescriptorBytes, '\0');
  ssize_t n = fgetxattr(fd, kMapXattr, buf.data(), buf.size());
  if (n < 0) {
    const int e = errno;
    if (e == ENODATA || e == ENOTSUP)
      return Status::InvalidArgument("rmmap: not a file of a farmem mount (no user.region.map)");
    if (e == EACCES || e == EPERM)
      return Status::PermissionDenied(
          "rmmap: user.region.map is answered to root and the mount's user only");
    if (e == E2BIG || e == ERANGE)
      return Status::InvalidArgument(
          "rmmap: the file's map descriptor exceeds an xattr value (64 KiB): too large to map "
          "through the mount");
    return Status::FromErrno("rmmap: getxattr user.region.map", e);
  }
  buf.resize(static_cast<size_t>(n));
  return regions::DecodeMapDescriptor(buf);
}

// A descriptor with every unit's base resolved to a peer of the client node.
struct Layout {
  regions::MapDescriptor d;
  std::vector<RemoteRef> units;

  // Where byte `pos` lives, or nullopt for a hole.
  std::optional<RemoteRef> At(uint64_t pos) const {
    const uint64_t c = pos >> kChunkShift;
    if (c >= d.chunks.size() || d.chunks[c] == 0) return std::nullopt;
    const uint32_t w = d.chunks[c];
    RemoteRef r = units[(w >> 4) - 1];
    r.offset += (w & 15) * kChunkBytes + pos % kChunkBytes;
    return r;
  }
};

using Piece = regions::ChunkPiece;

// RunChunkPieces, its error worded for rmmap (the code kept: Unavailable, TimedOut...).
Status RunPieces(Scheduler& s, const std::vector<Piece>& pieces, bool write) {
  Status st = regions::RunChunkPieces(s, pieces, write);
  if (st.ok()) return st;
  return Status(st.code(), std::string(write ? "rmmap: remote write: " : "rmmap: remote read: ") +
                               st.ToString());
}

class MountBacking : public Backing {
 public:
  // Takes `fd` (a file of a mount, opened by the caller of this function).
  static Result<std::unique_ptr<MountBacking>> Open(int fd, bool writable) {
    std::unique_ptr<MountBacking> b(new MountBacking(fd, writable));
    FARMEM_ASSIGN_OR_RETURN(regions::MapDescriptor d, ReadDescriptor(fd));
    FARMEM_ASSIGN_OR_RETURN(b->node_, NodeFor(d.token));
    FARMEM_ASSIGN_OR_RETURN(auto layout, b->Resolve(std::move(d)));
    b->layout_ = std::move(layout);
    return b;
  }
  ~MountBacking() override {
    {
      std::lock_guard lk(sched_mu_);
      scheds_.clear();  // before the node (member order keeps node_ alive until after)
    }
    close(fd_);
  }
  uint64_t size() const { return Current()->d.size; }
  // The address the descriptor read at rmmap named (a FIXVADDR region keeps it while mapped).
  uint64_t fixed_address() const override { return Current()->d.vaddr; }

  Result<size_t> read(uint64_t offset, std::span<std::byte> out) override {
    auto l = Current();
    if (offset >= l->d.size) return size_t{0};
    const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), l->d.size - offset));
    std::vector<Piece> pieces;
    for (uint64_t pos = offset; pos < offset + n;) {
      const uint64_t len =
          std::min<uint64_t>(((pos >> kChunkShift) + 1) * kChunkBytes, offset + n) - pos;
      std::byte* dst = out.data() + (pos - offset);
      if (auto ref = l->At(pos))
        pieces.push_back(Piece{*ref, dst, nullptr, len});
      else
        std::memset(dst, 0, len);  // a hole: zeros, no remote read
      pos += len;
    }
    FARMEM_ASSIGN_OR_RETURN(Scheduler * s, Sched());
    FARMEM_RETURN_IF_ERROR(RunPieces(*s, pieces, false));
    return n;
  }

  // Per chunk: allocated and wholly below the size -> one-sided; otherwise (a hole, or bytes
  // past the size, which must grow it) pwrite through the file, so the mount allocates, zeroes
  // and extends as for any write; then the descriptor is re-read. A chunk goes wholly one way,
  // and chunk boundaries are page-aligned, so no page is split between the two paths.
  Status write(uint64_t offset, std::span<const std::byte> data) override {
    if (!writable_)
      return Status::PermissionDenied("rsync: the mapped file is open read-only (no write access)");
    auto l = Current();
    std::vector<Piece> pieces;
    std::vector<std::pair<uint64_t, size_t>> through_file;  // (offset, length), merged
    for (uint64_t pos = offset; pos < offset + data.size();) {
      const uint64_t len =
          std::min<uint64_t>(((pos >> kChunkShift) + 1) * kChunkBytes, offset + data.size()) - pos;
      auto ref = l->At(pos);
      if (ref && pos + len <= l->d.size) {
        pieces.push_back(Piece{*ref, nullptr, data.data() + (pos - offset), len});
      } else if (!through_file.empty() &&
                 through_file.back().first + through_file.back().second == pos) {
        through_file.back().second += len;
      } else {
        through_file.emplace_back(pos, len);
      }
      pos += len;
    }
    FARMEM_ASSIGN_OR_RETURN(Scheduler * s, Sched());
    FARMEM_RETURN_IF_ERROR(RunPieces(*s, pieces, true));
    if (through_file.empty()) return Status::OK();
    for (auto [pos, len] : through_file) {
      size_t done = 0;
      while (done < len) {
        ssize_t w = pwrite(fd_, data.data() + (pos - offset) + done, len - done,
                           static_cast<off_t>(pos + done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
          return Status::FromErrno("rsync: pwrite through the mount", w < 0 ? errno : EIO);
        done += static_cast<size_t>(w);
      }
    }
    // The file was opened O_DIRECT when the mount allows it (the write reached the daemon);
    // otherwise the kernel's writeback cache holds it until this.
    if (fdatasync(fd_) != 0) return Status::FromErrno("rsync: fdatasync", errno);
    return refresh();
  }

  Status refresh() override {
    FARMEM_ASSIGN_OR_RETURN(regions::MapDescriptor d, ReadDescriptor(fd_));
    if (d.token != Current()->d.token)
      return Status::FailedPrecondition("rmmap: the mount's cluster token changed");
    FARMEM_ASSIGN_OR_RETURN(auto layout, Resolve(std::move(d)));
    std::lock_guard lk(mu_);
    layout_ = std::move(layout);
    return Status::OK();
  }

 private:
  MountBacking(int fd, bool writable) : fd_(fd), writable_(writable) {}

  std::shared_ptr<const Layout> Current() const {
    std::lock_guard lk(mu_);
    return layout_;
  }
  Result<std::shared_ptr<const Layout>> Resolve(regions::MapDescriptor d) {
    auto l = std::make_shared<Layout>();
    for (const regions::MapUnit& u : d.units) {
      FARMEM_ASSIGN_OR_RETURN(PeerId peer, node_->Peer(d.servers[u.server]));
      l->units.push_back(RemoteRef{peer, u.key, u.offset});
    }
    l->d = std::move(d);
    return std::shared_ptr<const Layout>(std::move(l));
  }
  // One scheduler per calling thread (the handler's, and rprefetch / rsync callers').
  Result<Scheduler*> Sched() {
    std::lock_guard lk(sched_mu_);
    auto& s = scheds_[std::this_thread::get_id()];
    if (!s) {
      FARMEM_ASSIGN_OR_RETURN(s, node_->node->make_scheduler());
    }
    return s.get();
  }

  const int fd_;
  const bool writable_;
  std::shared_ptr<ClientNode> node_;  // before scheds_: they are destroyed first
  mutable std::mutex mu_;             // guards layout_ (replaced whole by refresh)
  std::shared_ptr<const Layout> layout_;
  std::mutex sched_mu_;
  std::unordered_map<std::thread::id, std::unique_ptr<Scheduler>> scheds_;
};

// Opens `path` for the mapping: read-write (O_DIRECT when the mount takes it, so rsync's
// pwrites reach the daemon at once), else read-only.
Result<std::pair<int, bool>> OpenForMap(const std::string& path) {
  int fd = open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (fd < 0 && errno == EINVAL) fd = open(path.c_str(), O_RDWR | O_CLOEXEC);  // no O_DIRECT
  if (fd >= 0) return std::make_pair(fd, true);
  if (errno == EISDIR)
    return Status::InvalidArgument("rmmap: " + path + " is a directory, not a region");
  if (errno != EACCES && errno != EPERM && errno != EROFS)
    return Status::FromErrno("rmmap: open " + path, errno);
  fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("rmmap: open " + path, errno);
  return std::make_pair(fd, false);
}

Result<void*> MapPath(const std::string& path, size_t length) {
  FARMEM_ASSIGN_OR_RETURN(auto opened, OpenForMap(path));
  struct stat st {};
  if (fstat(opened.first, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(opened.first);
    return Status::InvalidArgument("rmmap: " + path + " is not a regular file");
  }
  FARMEM_ASSIGN_OR_RETURN(auto b, MountBacking::Open(opened.first, opened.second));
  if (length == 0) length = b->size();
  if (length == 0) return Status::InvalidArgument("rmmap: empty file and no length given");
  return rmmap_internal::MapBacking(std::move(b), length);
}

}  // namespace

Result<void*> rmmap(std::string_view path, size_t length) {
  return MapPath(std::string(path), length);
}

Result<void*> rmmap(int fd, size_t length) {
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0) return Status::InvalidArgument("rmmap: bad file descriptor");
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument("rmmap: fd is not a regular file");
  // A new open file description of the same file: its flags and offset are the mapping's own.
  return MapPath("/proc/self/fd/" + std::to_string(fd), length);
}

}  // namespace farmem
