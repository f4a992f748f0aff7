// Remote regions as a file system (docs/regions.md): `farmem mount DIR` as a library call. Each
// file in the mount is a region whose bytes live in farmemd memory. The call runs the FUSE loop
// on its own worker threads and returns when the file system is unmounted or the process gets
// SIGINT/SIGTERM.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "farmem/status.h"

namespace farmem {

struct RegionFsOptions {
  std::string mountpoint;
  // Metadata store ("memory://NAME" or "etcd://..."); empty = memory://regions in this process.
  std::string cluster_url;
  std::string cluster_name = "default";
  // farmemd bootstrap addresses; empty = an embedded memory server in this process with
  // `memory_bytes` (and a random cluster token).
  std::vector<std::string> servers;
  std::string token;  // cluster token of `servers`
  uint64_t memory_bytes = 1ull << 30;
  uint32_t threads = 4;  // FUSE worker threads at most
  // Every one-sided transfer and RPC to a farmemd gives up after this long (the call then fails
  // with EIO): how long a read of data on a farmemd that stopped answering waits. 100..30000.
  uint32_t op_timeout_ms = 5000;
  // Every metadata-store (etcd) call gives up after this long (the change fails with EIO): how
  // long a create waits for an etcd that stopped answering. 100..30000.
  uint32_t meta_timeout_ms = 2000;
  // Several mounts of one namespace (docs/regions.md "Several mounts"). kShared: other mounts may
  // share the namespace; the kernel's caches are kept coherent with theirs (no writeback cache,
  // pages dropped at open, invalidations as others change things). kExclusive: this mount claims
  // the namespace alone (a second mount is refused) and keeps the kernel's writeback cache, its
  // pages across opens and negative entries. kAuto: kExclusive for memory:// (no other process
  // can share it), kShared otherwise.
  enum class Sharing { kAuto, kExclusive, kShared };
  Sharing sharing = Sharing::kAuto;
  bool debug = false;  // libfuse's request log on stderr
  // Called once the mount is live (the FUSE session is mounted, requests will be served).
  std::function<void()> on_ready;
};

// Mounts and serves until unmounted (fusermount3 -u) or SIGINT/SIGTERM, then unmounts. Errors:
// InvalidArgument (bad options, e.g. a timeout out of its range), Unavailable (no /dev/fuse or the
// servers are unreachable), IoError (mount failed).
Status RunRegionFs(const RegionFsOptions& options);

// rsetdefaultattr (the paper's per-thread defaults, docs/regions.md "Attributes"): `attr`
// ("persistent", "multihosted", "onewriter", "fixvaddr" with "0" or "1"; "hostalloc" with a server
// list, "" for all) becomes the default for the files and directories the *calling thread* creates
// in the mount at `mountpoint` from now on, over what they would inherit from their directory.
// Other threads are not affected; the defaults end with the thread. It is the xattr
// "user.region.default.<attr>" of the mount's root, so any language (or setfattr, for that one
// short-lived process) can set it. Errors as setxattr's: InvalidArgument (EINVAL: bad value,
// unknown server), EPERM for "ownerpid" (set at creation), ENOTSUP for other names; also
// InvalidArgument when `mountpoint` is not the root of a farmem mount.
Status rsetdefaultattr(const std::string& mountpoint, std::string_view attr,
                       std::string_view value);
// Drops the calling thread's default for `attr` (no default: OK).
Status rcleardefaultattr(const std::string& mountpoint, std::string_view attr);
// The calling thread's default for `attr`; NotFound without one.
Result<std::string> rgetdefaultattr(const std::string& mountpoint, std::string_view attr);

}  // namespace farmem
