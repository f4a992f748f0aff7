// Remote regions as a file system (docs/regions.md): `farmem mount DIR` as a library call. Each
// file in the mount is a region whose bytes live in farmemd memory. The call runs the FUSE loop
// on its own worker threads and returns when the file system is unmounted or the process gets
// SIGINT/SIGTERM.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
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
  bool debug = false;    // libfuse's request log on stderr
  // Called once the mount is live (the FUSE session is mounted, requests will be served).
  std::function<void()> on_ready;
};

// Mounts and serves until unmounted (fusermount3 -u) or SIGINT/SIGTERM, then unmounts. Errors:
// InvalidArgument (bad options), Unavailable (no /dev/fuse or the servers are unreachable),
// IoError (mount failed).
Status RunRegionFs(const RegionFsOptions& options);

}  // namespace farmem
