// The output of `farmem cluster members` and `farmem cluster watch`: the members table, its JSON,
// and one line (or JSON object) per member event. Apart from the commands so that cli_tests can
// check the formatting without a control plane.
#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "cli/commands.h"

namespace farmem::cli {
namespace {

std::string Roles(const std::vector<std::string>& roles) {
  std::string out;
  for (const auto& r : roles) out += (out.empty() ? "" : ",") + r;
  return out.empty() ? "-" : out;
}

bool HasRole(const ClusterMember& m, std::string_view role) {
  return std::find(m.roles.begin(), m.roles.end(), role) != m.roles.end();
}

// "4.2 s", or "?" when the store did not say.
std::string LeaseLeft(std::chrono::milliseconds left) {
  if (left.count() < 0) return "?";
  return fmt::format("{:.1f} s", left.count() / 1000.0);
}

}  // namespace

bool MemoryFromStat(const nlohmann::json& stat, MemberRow& row) {
  if (!stat.is_object()) return false;
  auto mem = stat.find("memory");
  if (mem == stat.end() || !mem->is_object()) return false;
  row.used_bytes = mem->value("allocated_bytes", uint64_t{0});
  row.total_bytes = mem->value("budget_bytes", uint64_t{0});
  row.objects_bytes = -1;
  auto obj = stat.find("objects");
  if (obj != stat.end() && obj->is_object() && obj->contains("physical_bytes_held")) {
    row.objects_bytes = static_cast<int64_t>(obj->value("physical_bytes_held", uint64_t{0}));
  }
  return true;
}

std::string FormatMembersTable(const std::vector<MemberRow>& rows) {
  // Column widths follow the longest cell, so long names and IPv6 addresses stay aligned.
  size_t name_w = 4, addr_w = 7, roles_w = 5;
  for (const auto& r : rows) {
    name_w = std::max(name_w, r.member.name.size());
    addr_w = std::max(addr_w, r.member.address.size());
    roles_w = std::max(roles_w, Roles(r.member.roles).size());
  }
  std::string out =
      fmt::format("{:<{}}  {:<{}}  {:<{}}  {:>21}  {:>10}  {:>7}\n", "NAME", name_w, "ADDRESS",
                  addr_w, "ROLES", roles_w, "POOLS USED/TOTAL", "OBJECTS", "LEASE");
  for (const auto& r : rows) {
    std::string pools = "-", objects = "-";
    if (r.stat_ok) {
      pools = FormatBytes(r.used_bytes) + " / " + FormatBytes(r.total_bytes);
      objects = r.objects_bytes >= 0 ? FormatBytes(static_cast<uint64_t>(r.objects_bytes)) : "-";
    } else if (HasRole(r.member, "memory")) {
      pools = "?";
      objects = "?";
    }
    out +=
        fmt::format("{:<{}}  {:<{}}  {:<{}}  {:>21}  {:>10}  {:>7}\n", r.member.name, name_w,
                    r.member.address.empty() ? "-" : r.member.address, addr_w,
                    Roles(r.member.roles), roles_w, pools, objects, LeaseLeft(r.member.lease_left));
  }
  size_t memory = 0, failed = 0;
  for (const auto& r : rows) {
    if (!HasRole(r.member, "memory")) continue;
    ++memory;
    if (!r.stat_ok) ++failed;
  }
  out += fmt::format("{} member(s), {} with memory", rows.size(), memory);
  if (failed > 0) out += fmt::format(", {} did not answer STAT (\"?\")", failed);
  out += "\n";
  return out;
}

nlohmann::json MembersJson(const std::vector<MemberRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : rows) {
    nlohmann::json m = {{"name", r.member.name},
                        {"address", r.member.address},
                        {"roles", r.member.roles},
                        {"capacity_bytes", r.member.capacity_bytes},
                        {"lease_left_ms", r.member.lease_left.count()},
                        {"revision", r.member.revision}};
    if (r.stat_ok) {
      m["stat"] = {{"allocated_bytes", r.used_bytes}, {"budget_bytes", r.total_bytes}};
      if (r.objects_bytes >= 0) m["stat"]["objects_physical_bytes"] = r.objects_bytes;
    } else {
      m["stat"] = nullptr;
      if (!r.stat_error.empty()) m["stat_error"] = r.stat_error;
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::string MemberEventName(ClusterMemberEvent::Type type) {
  switch (type) {
    case ClusterMemberEvent::Type::kJoin:
      return "join";
    case ClusterMemberEvent::Type::kLeave:
      return "leave";
    case ClusterMemberEvent::Type::kExpire:
      return "expire";
  }
  return "?";
}

std::string FormatMemberEvent(const ClusterMemberEvent& e) {
  const ClusterMember& m = e.member;
  return fmt::format("{:<6} {} {} roles={} capacity={} revision={}", MemberEventName(e.type),
                     m.name, m.address.empty() ? "-" : m.address, Roles(m.roles),
                     FormatBytes(m.capacity_bytes), e.revision);
}

nlohmann::json MemberEventJson(const ClusterMemberEvent& e) {
  return {{"event", MemberEventName(e.type)},
          {"name", e.member.name},
          {"address", e.member.address},
          {"roles", e.member.roles},
          {"capacity_bytes", e.member.capacity_bytes},
          {"revision", e.revision}};
}

}  // namespace farmem::cli
