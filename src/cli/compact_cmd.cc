// `farmem compact ADDR [--class N]` (or `--cluster URL [MEMBER]`): ask a farmemd to run one
// compaction round of its object store (all size classes or one) and print the merges, the server's
// compaction counters and the physical memory the store holds before and after.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "common/log.h"
#include "farmem/objects.h"
#include "server/serve.h"

namespace farmem::cli {
namespace {

// physical_bytes_held of the STAT "objects" section, or -1 when the server does not report it.
int64_t HeldBytes(const Result<std::string>& text) {
  if (!text.ok()) return -1;
  const nlohmann::json st = nlohmann::json::parse(*text, nullptr, false);
  if (!st.is_object()) return -1;
  auto o = st.find("objects");
  if (o == st.end() || !o->is_object()) return -1;
  auto h = o->find("physical_bytes_held");
  return h != o->end() && h->is_number_unsigned() ? static_cast<int64_t>(h->get<uint64_t>()) : -1;
}

}  // namespace

int RunCompact(const CompactOptions& options) {
  InitLogging();
  if (!options.cluster.url.empty()) {
    // Through the cluster: the named memory member, or each one in turn.
    int code = 0;
    auto cluster = OpenClusterForCli(options.cluster, "farmem compact", &code);
    if (!cluster.ok()) return code;
    auto members = MemoryMembers(**cluster, options.address);
    if (!members.ok()) {
      std::fprintf(stderr, "farmem compact: error: %s\n", members.status().ToString().c_str());
      return 1;
    }
    int rc = 0;
    for (const ClusterMember& m : *members) {
      CompactOptions one = options;
      one.cluster = {};
      one.address = m.address;
      std::printf("member '%s':\n", m.name.c_str());
      std::fflush(stdout);
      rc = std::max(rc, RunCompact(one));
    }
    return rc;
  }
  auto node = MakeClientNode(options.client, "farmem-compact");
  if (!node.ok()) {
    std::fprintf(stderr, "farmem compact: error: %s\n", node.status().ToString().c_str());
    return 1;
  }
  std::vector<std::string> servers{options.address};
  ObjectClientOptions oo;
  oo.open_session = false;  // only OBJ_COMPACT and STAT
  auto client = ObjectClient::Connect(**node, servers, oo);
  if (!client.ok()) {
    std::fprintf(stderr, "farmem compact: error: %s\n", client.status().ToString().c_str());
    return 1;
  }
  ObjectClient& c = **client;
  const size_t classes = c.server_info(0).classes.size();
  if (options.size_class && *options.size_class >= classes) {
    std::fprintf(stderr,
                 "farmem compact: error: --class %u does not exist: the server has classes "
                 "0..%zu\n",
                 unsigned{*options.size_class}, classes - 1);
    return kExitUsage;
  }
  const int64_t before = HeldBytes(c.stats_json(0));
  Result<CompactResult> r = c.compact(0, options.size_class);
  if (!r.ok()) {
    std::fprintf(stderr, "farmem compact: error: %s\n", r.status().ToString().c_str());
    return r.status().code() == Code::kInvalidArgument ? kExitUsage : 1;
  }
  const int64_t after = HeldBytes(c.stats_json(0));

  std::string out = fmt::format(
      "compacted {} ({}): {} merge(s)\n", options.address,
      options.size_class ? fmt::format("class {}", *options.size_class) : "all classes", r->merges);
  if (r->partial) {
    out +=
        "the server paces compaction and stopped this round at its time budget: run again to "
        "continue\n";
  }
  if (before >= 0 && after >= 0) {
    out +=
        fmt::format("physical bytes held: {} -> {}\n", FormatBytes(static_cast<uint64_t>(before)),
                    FormatBytes(static_cast<uint64_t>(after)));
  }
  const nlohmann::json stats = nlohmann::json::parse(r->stats_json, nullptr, false);
  if (stats.is_object() && !stats.empty()) {
    out += "compaction counters (server lifetime):\n";
    for (const auto& [key, value] : stats.items()) {
      out += fmt::format("  {:<20} {}\n", key, value.dump());
    }
  }
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace farmem::cli
