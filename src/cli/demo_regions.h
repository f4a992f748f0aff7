// `farmem demo`'s regions part (issue 14, docs/cli.md): mounts a farmem file system, has a forked
// child read a file back after a RegionSync barrier, unmounts. Called from the demo's main thread.
#pragma once

#include "cli/commands.h"

namespace farmem::cli {

// Runs the regions part with its own embedded farmemd (the mount's) and prints one line per
// check; `node` is the demo's client node and `address` the demo's farmemd, where the barrier's
// cell lives. Returns false if a check failed; a host without /dev/fuse is skipped (true).
bool RunRegionSteps(Node& node, const std::string& address, const ClientOptions& client);

}  // namespace farmem::cli
