// `farmem mount DIR`: remote regions as a FUSE file system (docs/regions.md). Prints one
// "mounted" line once the mount is live, serves until unmounted (fusermount3 -u) or SIGINT/SIGTERM.
#include <cstdio>

#include "cli/commands.h"
#include "common/log.h"
#include "farmem/regionfs.h"

namespace farmem::cli {

int RunMount(RegionFsOptions o) {
  InitLogging();
  std::string where = o.servers.empty() ? "an embedded memory server" : "the given servers";
  o.on_ready = [&] {
    std::printf("regions: mounted at %s (data on %s, metadata in %s)\n", o.mountpoint.c_str(),
                where.c_str(), o.cluster_url.empty() ? "memory://regions" : o.cluster_url.c_str());
    std::fflush(stdout);
  };
  Status s = RunRegionFs(o);
  if (!s.ok()) {
    std::fprintf(stderr, "farmem mount: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("regions: unmounted %s\n", o.mountpoint.c_str());
  return 0;
}

}  // namespace farmem::cli
