// `farmem stat ADDR [--json]` (or `--cluster URL [MEMBER]`): fetch a farmemd's STAT document and
// print it as a table (or raw JSON), including the object store's, the tiered region's, the
// transactions' and the cluster's sections. The formatter tolerates missing keys so older/newer
// servers still print.
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"
#include "common/log.h"
#include "farmem/client.h"

namespace farmem::cli {
namespace {

uint64_t U(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return (it != j.end() && it->is_number_unsigned()) ? it->get<uint64_t>() : 0;
}

std::string S(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return (it != j.end() && it->is_string()) ? it->get<std::string>() : "?";
}

double D(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return (it != j.end() && it->is_number()) ? it->get<double>() : 0.0;
}

// The STAT "objects" section (CoRM object store): totals, one row per size class in use, and
// the compaction counters. Empty when the server predates objects; one line when disabled.
std::string FormatObjectsSection(const nlohmann::json& s) {
  auto it = s.find("objects");
  if (it == s.end() || !it->is_object()) return "";
  const nlohmann::json& o = *it;
  if (o.contains("enabled") && o["enabled"].is_boolean() && !o["enabled"].get<bool>()) {
    return "\nobjects: disabled\n";
  }
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& cfg = o.contains("config") && o["config"].is_object() ? o["config"] : empty;
  std::string out;
  out +=
      fmt::format("\nobjects: {} live in {} block(s), {} of slots; {} physical held, RSS {}\n",
                  U(o, "live_objects"), U(o, "live_blocks"), FormatBytes(U(o, "live_slot_bytes")),
                  FormatBytes(U(o, "physical_bytes_held")), FormatBytes(U(o, "process_rss_bytes")));
  if (o.contains("owned_objects")) {
    out += fmt::format("         {} owned by client sessions, {} persistent\n",
                       U(o, "owned_objects"), U(o, "persistent_objects"));
  }
  if (o.contains("metadata") && o["metadata"].is_object()) {
    const nlohmann::json& m = o["metadata"];
    out += fmt::format(
        "         metadata {} outside the blocks: {} growing with the objects (block structs {}, "
        "per-slot {}, ID tables {}, lists {}), {} fixed tables\n",
        FormatBytes(U(m, "total")), FormatBytes(U(m, "dynamic")),
        FormatBytes(U(m, "block_structs")), FormatBytes(U(m, "per_slot")),
        FormatBytes(U(m, "id_tables")), FormatBytes(U(m, "owner_lists")),
        FormatBytes(U(m, "per_vblock") + U(m, "per_owner")));
  }
  auto id_bits = cfg.find("id_bits");
  out += fmt::format("         block {}, id_bits {}, {} size classes, objects up to {}\n",
                     FormatBytes(U(cfg, "block_size")),
                     id_bits != cfg.end() && id_bits->is_number() ? id_bits->dump() : "?",
                     U(o, "num_classes"), FormatBytes(U(o, "max_object_size")));
  if (o.contains("classes") && o["classes"].is_array() && !o["classes"].empty()) {
    out += fmt::format("\n{:<6} {:>9} {:>8} {:>10} {:>10} {:>6} {:>18} {:>16}\n", "CLASS", "SLOT",
                       "BLOCKS", "LIVE", "CAPACITY", "FRAG", "MERGED/TRIED", "REDRAWN");
    for (const auto& c : o["classes"]) {
      if (!c.is_object()) continue;
      // Merge success rate per class: collisions keep half-empty blocks apart (issue 15).
      const std::string merges =
          U(c, "merge_attempts") == 0
              ? std::string("-")
              : fmt::format("{}/{} {:.0f}%", U(c, "merges"), U(c, "merge_attempts"),
                            100.0 * D(c, "merge_success_rate"));
      // Merges that re-drew colliding IDs, and how many objects got a new ID.
      const std::string redraws =
          U(c, "merge_redraws") == 0
              ? std::string("-")
              : fmt::format("{} ({} IDs)", U(c, "merge_redraws"), U(c, "ids_redrawn"));
      out += fmt::format("{:<6} {:>9} {:>8} {:>10} {:>10} {:>5.1f}% {:>18} {:>16}\n", U(c, "class"),
                         FormatBytes(U(c, "slot_size")), U(c, "blocks"), U(c, "live"),
                         U(c, "capacity_slots"), 100.0 * D(c, "fragmentation"), merges, redraws);
    }
  }
  if (o.contains("compaction") && o["compaction"].is_object()) {
    const nlohmann::json& k = o["compaction"];
    out += fmt::format(
        "\ncompaction: {} round(s), {} merge(s), {} block(s) freed, {} moved, {} object(s) "
        "copied, {} relocated, {} collision(s), {} ID(s) re-drawn, {} busy skip(s)\n",
        U(k, "rounds"), U(k, "compactions"), U(k, "blocks_freed"), FormatBytes(U(k, "bytes_moved")),
        U(k, "objects_copied"), U(k, "objects_relocated"), U(k, "collisions"), U(k, "ids_redrawn"),
        U(k, "skipped_busy"));
    if (k.contains("grace_wait_ns")) {
      out += fmt::format(
          "grace periods (merges waiting for one-sided copies): {:.3f} ms in all, "
          "longest {:.1f} us\n",
          U(k, "grace_wait_ns") / 1e6, U(k, "grace_wait_max_ns") / 1e3);
    }
  }
  return out;
}

// The STAT "sessions" section (docs/sessions.md): open client sessions, how they ended, and what
// their ends freed. Empty when the server predates sessions.
std::string FormatSessionsSection(const nlohmann::json& s) {
  auto it = s.find("sessions");
  if (it == s.end() || !it->is_object()) return "";
  const nlohmann::json& x = *it;
  return fmt::format(
      "sessions: {} open (max {}, leases up to {:.0f} s); {} opened, {} closed, {} expired, "
      "{} refused\n          freed at session end: {} object(s), {} raw\n",
      U(x, "open"), U(x, "max"), D(x, "ttl_max_ms") / 1000, U(x, "opened_total"),
      U(x, "closed_total"), U(x, "expired_total"), U(x, "refused_total"),
      U(x, "objects_freed_total"), FormatBytes(U(x, "raw_bytes_freed_total")));
}

// The STAT "tier" section (docs/tier.md "STAT"): residency against the exact DRAM budget, what
// the hotspot periods moved, file IO and where server-side reads were served. Empty without it.
std::string FormatTierSection(const nlohmann::json& s) {
  auto it = s.find("tier");
  if (it == s.end() || !it->is_object()) return "";
  const nlohmann::json& t = *it;
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& c = t.contains("config") && t["config"].is_object() ? t["config"] : empty;
  std::string out = fmt::format("\ntier: {} mode {}, {} in {} unit(s) of {}, period {} ms\n",
                                S(c, "file"), S(c, "mode"), FormatBytes(U(t, "capacity_bytes")),
                                U(t, "units"), FormatBytes(U(t, "unit_bytes")), U(c, "period_ms"));
  out += fmt::format(
      "      resident {} of {} budget unit(s) ({} of {}, residency {:.1f} %), {} quarantined\n",
      U(t, "resident_units"), U(t, "budget_units"), FormatBytes(U(t, "resident_bytes")),
      FormatBytes(U(t, "budget_bytes")), D(t, "residency") * 100, U(t, "quarantined_frames"));
  out += fmt::format(
      "      {} promotion(s), {} demotion(s), {} write-back(s), {} period(s), {} counter "
      "push(es)\n",
      U(t, "promotions"), U(t, "demotions"), U(t, "writebacks"), U(t, "periods"),
      U(t, "counter_pushes"));
  out += fmt::format(
      "      file IO: read {}, written {}; RPC reads from DRAM {} / file {} ({} / {}), RPC "
      "writes {}\n",
      FormatBytes(U(t, "io_read_bytes")), FormatBytes(U(t, "io_write_bytes")), U(t, "reads_dram"),
      U(t, "reads_file"), FormatBytes(U(t, "read_bytes_dram")),
      FormatBytes(U(t, "read_bytes_file")), U(t, "rpc_writes"));
  return out;
}

// The STAT "cluster" section of a farmemd started with --cluster: where it is a member and the
// control-plane client's counters (whatever keys Cluster::stats_json has, in one line).
std::string FormatClusterSection(const nlohmann::json& s) {
  auto it = s.find("cluster");
  if (it == s.end() || !it->is_object()) return "";
  const nlohmann::json& c = *it;
  const bool joined = c.contains("joined") && c["joined"].is_boolean() && c["joined"].get<bool>();
  std::string out = fmt::format("\ncluster: '{}' at {}, {}\n", S(c, "name"), S(c, "url"),
                                joined ? "joined" : "NOT joined (re-joining)");
  if (c.contains("stats") && c["stats"].is_object() && !c["stats"].empty()) {
    std::string counters;
    for (const auto& [key, value] : c["stats"].items()) {
      counters += (counters.empty() ? "" : ", ") + key + " " + value.dump();
    }
    out += "         " + counters + "\n";
  }
  return out;
}

// The STAT "tx" section (docs/tx.md "STAT"): the partition this server holds, request counters,
// the two-phase commit and recovery state, aborts by reason (only the non-zero ones) and one row
// per table. Empty when the server runs no tx service.
std::string FormatTxSection(const nlohmann::json& s) {
  auto it = s.find("tx");
  if (it == s.end() || !it->is_object()) return "";
  const nlohmann::json& x = *it;
  std::string out = fmt::format("\ntx: partition {} of {}, lock lease {} ms\n", U(x, "partition"),
                                U(x, "partitions"), U(x, "lease_ms"));
  out += fmt::format(
      "    {} lookup(s) ({} not found), {} lock(s), {} lock-insert(s), {} validate(s), {} "
      "unlock(s)\n",
      U(x, "lookups"), U(x, "not_found"), U(x, "locks"), U(x, "lock_inserts"), U(x, "validates"),
      U(x, "unlocks"));
  out += fmt::format(
      "    {} commit(s) of {} item(s); 2PC: {} prepare(s), {} decide(s), {} prepared now, {} "
      "decision(s) kept\n",
      U(x, "commits"), U(x, "commit_items"), U(x, "prepares"), U(x, "decides"), U(x, "prepared"),
      U(x, "decisions"));
  out += fmt::format(
      "    recovery: {} status request(s) served; resolved {} commit(s), {} abort(s) ({} by a "
      "participant other than the first), {} unreachable; {} expired lock(s) reaped\n",
      U(x, "statuses"), U(x, "recovered_commits"), U(x, "recovered_aborts"),
      U(x, "recovered_from_peers"), U(x, "recovery_unreachable"), U(x, "reaped_locks"));
  if (x.contains("aborts") && x["aborts"].is_object()) {
    std::string aborts;
    for (const auto& [reason, n] : x["aborts"].items()) {
      if (!n.is_number_unsigned() || n.get<uint64_t>() == 0) continue;
      aborts += fmt::format("{}{} {}", aborts.empty() ? "" : ", ", reason, n.get<uint64_t>());
    }
    out += fmt::format("    aborts: {}\n", aborts.empty() ? "none" : aborts);
  }
  if (x.contains("tables") && x["tables"].is_array() && !x["tables"].empty()) {
    out += fmt::format("\n{:<12} {:>5} {:>7} {:>5} {:>9} {:>15} {:>10} {:>7} {:>10}\n", "TX TABLE",
                       "KEY", "VALUE", "WIDTH", "BUCKETS", "OVERFLOW USED", "LIVE", "LOCKED",
                       "REGION");
    for (const auto& t : x["tables"]) {
      if (!t.is_object()) continue;
      out +=
          fmt::format("{:<12} {:>5} {:>7} {:>5} {:>9} {:>15} {:>10} {:>7} {:>10}\n", S(t, "name"),
                      U(t, "key_size"), U(t, "value_size"), U(t, "width"), U(t, "buckets"),
                      fmt::format("{}/{}", U(t, "overflow_used"), U(t, "overflow_buckets")),
                      U(t, "live_items"), U(t, "locked_items"), FormatBytes(U(t, "region_bytes")));
    }
  }
  return out;
}

}  // namespace

std::string FormatBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes) / 1024;
  int unit = 0;
  while (v >= 1024 && unit < 3) {
    v /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", v, kUnits[unit]);
}

std::string FormatStatTable(const nlohmann::json& s, const std::string& address) {
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& mem = s.contains("memory") && s["memory"].is_object() ? s["memory"] : empty;
  const nlohmann::json& tr =
      s.contains("transport") && s["transport"].is_object() ? s["transport"] : empty;
  double uptime = s.contains("uptime_seconds") && s["uptime_seconds"].is_number()
                      ? s["uptime_seconds"].get<double>()
                      : 0.0;
  std::string out;
  out += fmt::format("farmemd '{}' at {}  (transport {} {}, up {:.1f} s)\n", S(s, "node"), address,
                     S(tr, "name"), S(tr, "address"), uptime);
  if (s.contains("services") && s["services"].is_array()) {
    std::string names;
    for (const auto& n : s["services"]) {
      if (n.is_string()) names += (names.empty() ? "" : ", ") + n.get<std::string>();
    }
    out += fmt::format("services: {}\n", names.empty() ? "(none)" : names);
  }
  if (s.contains("memory")) {
    out += fmt::format("memory: budget {}, {} of {} pools created ({} mapped)\n",
                       FormatBytes(U(mem, "budget_bytes")), U(mem, "pools"), U(mem, "max_pools"),
                       FormatBytes(U(mem, "mapped_bytes")));
    out += fmt::format("        allocated {} in {} allocation(s), free {}\n",
                       FormatBytes(U(mem, "allocated_bytes")), U(mem, "allocations"),
                       FormatBytes(U(mem, "free_bytes")));
    if (mem.contains("owned_bytes")) {
      out += fmt::format(
          "        owned by client sessions {} in {} allocation(s), persistent {} in {}\n",
          FormatBytes(U(mem, "owned_bytes")), U(mem, "owned_allocations"),
          FormatBytes(U(mem, "persistent_bytes")), U(mem, "persistent_allocations"));
    }
  }
  out += FormatSessionsSection(s);
  if (s.contains("pools") && s["pools"].is_array() && !s["pools"].empty()) {
    out += fmt::format("\n{:<10} {:>10} {:>12} {:>12} {:>8} {:>12} {:>10}\n", "POOL", "SIZE",
                       "ALLOCATED", "FREE", "ALLOCS", "LARGEST FREE", "FREE RANGES");
    for (const auto& p : s["pools"]) {
      if (!p.is_object()) continue;
      out += fmt::format("{:<10} {:>10} {:>12} {:>12} {:>8} {:>12} {:>10}\n", S(p, "name"),
                         FormatBytes(U(p, "bytes")), FormatBytes(U(p, "allocated_bytes")),
                         FormatBytes(U(p, "free_bytes")), U(p, "allocations"),
                         FormatBytes(U(p, "largest_free")), U(p, "free_ranges"));
    }
    if (s.value("pools_truncated", false)) out += "(more pools not listed)\n";
  }
  if (s.contains("rpc") && s["rpc"].is_object()) {
    out += fmt::format("\n{:<18} {:<8} {:>7} {:>10} {:>10}\n", "RPC", "SERVICE", "OPCODE", "CALLS",
                       "ERRORS");
    for (const auto& [op, c] : s["rpc"].items()) {
      if (!c.is_object()) continue;
      out += fmt::format("{:<18} {:<8} {:>7} {:>10} {:>10}\n", op, S(c, "service"), U(c, "opcode"),
                         U(c, "calls"), U(c, "errors"));
    }
  }
  out += FormatObjectsSection(s);
  out += FormatTierSection(s);
  out += FormatTxSection(s);
  out += FormatClusterSection(s);
  return out;
}

int RunStat(const StatOptions& options) {
  InitLogging();
  // The servers to ask: the address given, or the cluster's memory members (one by name or all).
  std::vector<std::pair<std::string, std::string>> targets;  // {member name or "", address}
  if (!options.cluster.url.empty()) {
    int code = 0;
    auto cluster = OpenClusterForCli(options.cluster, "farmem stat", &code);
    if (!cluster.ok()) return code;
    auto members = MemoryMembers(**cluster, options.address);
    if (!members.ok()) {
      std::fprintf(stderr, "farmem stat: error: %s\n", members.status().ToString().c_str());
      return 1;
    }
    for (const auto& m : *members) targets.emplace_back(m.name, m.address);
  } else {
    targets.emplace_back("", options.address);
  }
  auto node = MakeClientNode(options.client, "farmem-stat");
  if (!node.ok()) {
    std::fprintf(stderr, "farmem stat: error: %s\n", node.status().ToString().c_str());
    return 1;
  }
  // Several members: one table each (or one JSON object keyed by member name); a member that
  // fails is reported and the others are still printed.
  const bool many = targets.size() > 1 || (!options.cluster.url.empty() && options.address.empty());
  nlohmann::json all = nlohmann::json::object();
  int rc = 0;
  for (const auto& [member, address] : targets) {
    RawClientOptions ro;
    ro.open_session = false;  // only STAT: do not show up as a client session
    auto client = RawClient::Connect(**node, address, ro);
    Result<std::string> text =
        client.ok() ? (*client)->stats_json() : Result<std::string>(client.status());
    if (!text.ok()) {
      std::fprintf(stderr, "farmem stat: error: %s%s\n",
                   member.empty() ? "" : ("member '" + member + "': ").c_str(),
                   text.status().ToString().c_str());
      rc = 1;
      continue;
    }
    const nlohmann::json st = nlohmann::json::parse(*text);  // validated by stats_json()
    if (options.json) {
      if (many) {
        all[member] = st;
      } else {
        std::printf("%s\n", st.dump(2).c_str());
      }
    } else {
      if (many && &member != &targets.front().first) std::printf("\n");
      std::fputs(FormatStatTable(st, address).c_str(), stdout);
    }
  }
  if (options.json && many) std::printf("%s\n", all.dump(2).c_str());
  (*node)->stop();
  return rc;
}

}  // namespace farmem::cli
