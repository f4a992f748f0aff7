// `farmem cluster members|watch|get|put|list|remove`: the control plane from the command line
// (include/farmem/cluster.h), and the helpers demo/stat/compact use to find memory servers
// through a cluster. Errors of the Cluster API are `farmem: error: <status>`, exit 1.
#include <signal.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>

#include <fmt/format.h>

#include "cli/commands.h"
#include "common/log.h"
#include "farmem/client.h"
#include "server/serve.h"

namespace farmem::cli {
namespace {

int Fail(const Status& st) {
  std::fprintf(stderr, "farmem: error: %s\n", st.ToString().c_str());
  return kExitFailure;
}

std::unique_ptr<Cluster> Open(const ClusterCmdOptions& o, int* code) {
  auto c = OpenClusterForCli(o.cluster, "farmem", code);
  return c.ok() ? std::move(*c) : nullptr;
}

// "12:03:04.567": local wall time of a watch line.
std::string TimeStamp() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm local{};
  localtime_r(&ts.tv_sec, &local);
  return fmt::format("{:02}:{:02}:{:02}.{:03}", local.tm_hour, local.tm_min, local.tm_sec,
                     ts.tv_nsec / 1000000);
}

// A value for one table cell: control characters escaped, long ones cut.
std::string Printable(const std::string& v, size_t max) {
  std::string out;
  for (unsigned char c : v) {
    if (out.size() >= max) {
      out += "...";
      break;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

nlohmann::json KvJson(const ClusterKeyValue& kv) {
  // Values are arbitrary bytes; JSON needs UTF-8, so invalid sequences are replaced on output.
  return {{"key", kv.key},
          {"value", kv.value},
          {"create_revision", kv.create_revision},
          {"mod_revision", kv.mod_revision},
          {"bound_to_lease", kv.bound_to_lease}};
}

std::string Dump(const nlohmann::json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

ClusterOptions MakeClusterOptions(const ClusterClientOptions& o) {
  ClusterOptions c;
  c.url = o.url;
  c.cluster_name = o.name;
  c.create_if_missing = false;  // a typo in --cluster-name must not create a cluster
  c.user = o.user;
  c.password = o.password;
  c.tls_ca_file = o.ca;
  c.tls_cert_file = o.cert;
  c.tls_key_file = o.key;
  return c;
}

Result<std::unique_ptr<Cluster>> OpenClusterForCli(const ClusterClientOptions& options,
                                                   std::string_view prog, int* exit_code) {
  auto c = Cluster::Open(MakeClusterOptions(options));
  if (!c.ok()) {
    std::fprintf(stderr, "%.*s: error: %s\n", static_cast<int>(prog.size()), prog.data(),
                 c.status().WithContext("cluster " + options.url).ToString().c_str());
    *exit_code = c.status().code() == Code::kInvalidArgument ? kExitUsage : kExitFailure;
  }
  return c;
}

Result<std::vector<ClusterMember>> MemoryMembers(Cluster& cluster, const std::string& only) {
  FARMEM_ASSIGN_OR_RETURN(std::vector<ClusterMember> all, cluster.members());
  std::vector<ClusterMember> out;
  std::string names;
  for (auto& m : all) {
    names += (names.empty() ? "" : ", ") + m.name;
    const bool memory = std::find(m.roles.begin(), m.roles.end(), "memory") != m.roles.end();
    if (!memory || m.address.empty()) continue;
    if (!only.empty() && m.name != only) continue;
    out.push_back(std::move(m));
  }
  if (out.empty()) {
    const std::string where = "cluster '" + cluster.options().cluster_name + "' at " +
                              cluster.options().url +
                              " (members: " + (names.empty() ? "none" : names) + ")";
    return Status::NotFound(only.empty() ? "no member with role 'memory' in " + where
                                         : "no memory member named '" + only + "' in " + where);
  }
  return out;
}

int RunClusterMembers(const ClusterCmdOptions& o) {
  InitLogging();
  int code = 0;
  auto cluster = Open(o, &code);
  if (!cluster) return code;
  auto members = cluster->members();
  if (!members.ok()) return Fail(members.status());

  std::vector<MemberRow> rows;
  std::unique_ptr<Node> node;  // made only when a member has memory to ask about
  Status node_error;
  for (ClusterMember& m : *members) {
    MemberRow row;
    row.member = std::move(m);
    const auto& roles = row.member.roles;
    if (std::find(roles.begin(), roles.end(), "memory") != roles.end() &&
        !row.member.address.empty()) {
      if (!node && node_error.ok()) {
        auto made = MakeClientNode(o.client, "farmem-cluster-members");
        if (made.ok()) {
          node = std::move(*made);
        } else {
          node_error = made.status();
        }
      }
      Result<std::string> text = node_error;
      if (node) {
        RawClientOptions ro;
        ro.open_session = false;  // only STAT
        auto client = RawClient::Connect(*node, row.member.address, ro);
        text = client.ok() ? (*client)->stats_json() : Result<std::string>(client.status());
      }
      if (text.ok()) {
        row.stat_ok = MemoryFromStat(nlohmann::json::parse(*text, nullptr, false), row);
        if (!row.stat_ok) row.stat_error = "STAT has no memory section";
      } else {
        row.stat_error = text.status().ToString();
      }
    }
    rows.push_back(std::move(row));
  }
  if (o.json) {
    std::printf("%s\n", Dump(MembersJson(rows), 2).c_str());
  } else {
    std::printf("cluster '%s' at %s\n", o.cluster.name.c_str(), o.cluster.url.c_str());
    std::fputs(FormatMembersTable(rows).c_str(), stdout);
    for (const auto& r : rows) {
      if (!r.stat_error.empty()) {
        std::printf("  %s: %s\n", r.member.name.c_str(), r.stat_error.c_str());
      }
    }
  }
  if (node) node->stop();
  return kExitOk;
}

int RunClusterWatch(const ClusterCmdOptions& o) {
  InitLogging();
  // SIGINT/SIGTERM end the watch cleanly: blocked before the Cluster starts its threads (they
  // inherit the mask), taken with sigtimedwait below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  int code = 0;
  auto cluster = Open(o, &code);
  if (!cluster) return code;
  // Events at or before this revision describe members that were there when the watch began:
  // printed as "member" lines, not counted as changes.
  auto start = cluster->revision();
  if (!start.ok()) return Fail(start.status());
  const int64_t start_revision = *start;

  std::mutex mu;
  int changes = 0;
  Status watch_error;
  auto on_event = [&](const ClusterMemberEvent& e) {
    std::lock_guard lock(mu);
    const bool existing = e.type == ClusterMemberEvent::Type::kJoin && e.revision <= start_revision;
    if (o.json) {
      nlohmann::json j = MemberEventJson(e);
      if (existing) j["event"] = "member";
      j["time"] = TimeStamp();
      std::printf("%s\n", Dump(j).c_str());
    } else {
      std::string line = FormatMemberEvent(e);
      if (existing) line = fmt::format("{:<6} {}", "member", line.substr(7));
      std::printf("%s %s\n", TimeStamp().c_str(), line.c_str());
    }
    std::fflush(stdout);
    if (!existing) ++changes;
  };
  auto on_error = [&](const Status& st) {
    std::lock_guard lock(mu);
    watch_error = st.ok() ? Status::Aborted("watch ended") : st;
  };
  auto watch = cluster->watch_members(on_event, on_error);
  if (!watch.ok()) return Fail(watch.status());

  const auto t0 = std::chrono::steady_clock::now();
  int result = kExitOk;
  for (;;) {
    {
      std::lock_guard lock(mu);
      if (!watch_error.ok()) {
        result = Fail(watch_error);
        break;
      }
      if (o.count > 0 && changes >= o.count) break;
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.timeout_seconds > 0 && elapsed >= o.timeout_seconds) {
      if (o.count > 0) {
        std::lock_guard lock(mu);
        std::fprintf(stderr, "farmem: error: TimedOut: %d of %d member change(s) within %.1f s\n",
                     changes, o.count, o.timeout_seconds);
        result = kExitFailure;
      }
      break;
    }
    timespec wait{0, 50 * 1000 * 1000};
    if (sigtimedwait(&signals, nullptr, &wait) > 0) break;
  }
  (*watch)->cancel();
  return result;
}

int RunClusterGet(const ClusterCmdOptions& o) {
  InitLogging();
  int code = 0;
  auto cluster = Open(o, &code);
  if (!cluster) return code;
  auto kv = cluster->get(o.key);
  if (!kv.ok()) return Fail(kv.status());
  if (o.json) {
    std::printf("%s\n", Dump(KvJson(*kv), 2).c_str());
  } else {
    std::fwrite(kv->value.data(), 1, kv->value.size(), stdout);
    if (kv->value.empty() || kv->value.back() != '\n') std::fputc('\n', stdout);
  }
  return kExitOk;
}

int RunClusterPut(const ClusterCmdOptions& o) {
  InitLogging();
  std::string value = o.value;
  if (!o.value_file.empty()) {
    std::ifstream in(o.value_file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "farmem: error: cannot read '%s'\n", o.value_file.c_str());
      return kExitUsage;
    }
    std::ostringstream buf;
    buf << in.rdbuf();
    value = buf.str();
  }
  int code = 0;
  auto cluster = Open(o, &code);
  if (!cluster) return code;
  auto rev = cluster->put(o.key, value);
  if (!rev.ok()) return Fail(rev.status());
  if (o.json) {
    std::printf("%s\n", Dump({{"key", o.key}, {"revision", *rev}}).c_str());
  } else {
    std::printf("put %s (%zu byte(s), revision %lld)\n", o.key.c_str(), value.size(),
                static_cast<long long>(*rev));
  }
  return kExitOk;
}

int RunClusterList(const ClusterCmdOptions& o) {
  InitLogging();
  int code = 0;
  auto cluster = Open(o, &code);
  if (!cluster) return code;
  auto kvs = cluster->list(o.key);
  if (!kvs.ok()) return Fail(kvs.status());
  if (o.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& kv : *kvs) arr.push_back(KvJson(kv));
    std::printf("%s\n", Dump(arr, 2).c_str());
    return kExitOk;
  }
  size_t key_w = 3;
  for (const auto& kv : *kvs) key_w = std::max(key_w, std::min<size_t>(kv.key.size(), 60));
  std::printf("%s", fmt::format("{:<{}}  {:>8}  {}\n", "KEY", key_w, "REVISION", "VALUE").c_str());
  for (const auto& kv : *kvs) {
    std::printf(
        "%s", fmt::format("{:<{}}  {:>8}  {}{}\n", Printable(kv.key, 60), key_w, kv.mod_revision,
                          Printable(kv.value, 60), kv.bound_to_lease ? "  (bound to a lease)" : "")
                  .c_str());
  }
  std::printf("%zu key(s)\n", kvs->size());
  return kExitOk;
}

int RunClusterRemove(const ClusterCmdOptions& o) {
  InitLogging();
  int code = 0;
  auto cluster = Open(o, &code);
  if (!cluster) return code;
  if (Status st = cluster->remove(o.key); !st.ok()) return Fail(st);
  if (o.json) {
    std::printf("%s\n", Dump({{"key", o.key}, {"removed", true}}).c_str());
  } else {
    std::printf("removed %s\n", o.key.c_str());
  }
  return kExitOk;
}

}  // namespace farmem::cli
