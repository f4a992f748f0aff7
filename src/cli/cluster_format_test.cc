// Tests of the `farmem cluster` output: the members table (aligned columns, "?" for a memory
// member whose STAT failed, "-" for one without memory), its JSON, STAT parsing, and the
// one-line and JSON forms of member events.
#include <gtest/gtest.h>

#include "cli/commands.h"

namespace farmem::cli {
namespace {

ClusterMember Member(std::string name, std::string address, std::vector<std::string> roles,
                     int64_t lease_ms) {
  ClusterMember m;
  m.name = std::move(name);
  m.address = std::move(address);
  m.roles = std::move(roles);
  m.capacity_bytes = 64ull << 20;
  m.lease_left = std::chrono::milliseconds(lease_ms);
  m.revision = 7;
  return m;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    out.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

TEST(ClusterFormatTest, MembersTable) {
  std::vector<MemberRow> rows(3);
  rows[0].member = Member("node-1", "127.0.0.1:7700", {"memory"}, 4200);
  rows[0].stat_ok = true;
  rows[0].used_bytes = 4096;
  rows[0].total_bytes = 64ull << 20;
  rows[0].objects_bytes = 8192;
  rows[1].member = Member("a-much-longer-node-name", "10.0.0.12:17700", {"memory", "manager"}, -1);
  rows[1].stat_error = "Unavailable: connection refused";
  rows[2].member = Member("client-9", "", {"client"}, 900);

  const std::vector<std::string> lines = Lines(FormatMembersTable(rows));
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0].find("NAME"), 0u);
  // Every row starts its ADDRESS column where the header's does.
  const size_t address_col = lines[0].find("ADDRESS");
  EXPECT_EQ(address_col, std::string("a-much-longer-node-name").size() + 2);
  EXPECT_EQ(lines[1].find("127.0.0.1:7700"), address_col);
  EXPECT_EQ(lines[2].find("10.0.0.12:17700"), address_col);
  EXPECT_NE(lines[1].find("4.0 KiB / 64.0 MiB"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("8.0 KiB"), std::string::npos) << lines[1];
  EXPECT_NE(lines[1].find("4.2 s"), std::string::npos) << lines[1];
  EXPECT_NE(lines[2].find("memory,manager"), std::string::npos) << lines[2];
  EXPECT_NE(lines[2].find(" ?"), std::string::npos) << lines[2];  // STAT failed, lease unknown
  // A member without memory has no STAT to ask: dashes, not question marks.
  EXPECT_NE(lines[3].find("client-9"), std::string::npos);
  EXPECT_EQ(lines[3].find('?'), std::string::npos) << lines[3];
  EXPECT_NE(lines[3].find("0.9 s"), std::string::npos) << lines[3];
  EXPECT_EQ(lines[4], "3 member(s), 2 with memory, 1 did not answer STAT (\"?\")");
}

TEST(ClusterFormatTest, EmptyTable) {
  EXPECT_EQ(Lines(FormatMembersTable({})).back(), "0 member(s), 0 with memory");
}

TEST(ClusterFormatTest, MembersJson) {
  std::vector<MemberRow> rows(2);
  rows[0].member = Member("node-1", "127.0.0.1:7700", {"memory"}, 4200);
  rows[0].stat_ok = true;
  rows[0].used_bytes = 4096;
  rows[0].total_bytes = 1 << 20;
  rows[1].member = Member("node-2", "127.0.0.1:7702", {"memory"}, 1000);
  rows[1].stat_error = "TimedOut: x";
  const nlohmann::json j = MembersJson(rows);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["name"], "node-1");
  EXPECT_EQ(j[0]["roles"], nlohmann::json::array({"memory"}));
  EXPECT_EQ(j[0]["lease_left_ms"], 4200);
  EXPECT_EQ(j[0]["stat"]["allocated_bytes"], 4096);
  EXPECT_FALSE(j[0]["stat"].contains("objects_physical_bytes"));
  EXPECT_TRUE(j[1]["stat"].is_null());
  EXPECT_EQ(j[1]["stat_error"], "TimedOut: x");
}

TEST(ClusterFormatTest, MemoryFromStat) {
  MemberRow row;
  EXPECT_FALSE(MemoryFromStat(nlohmann::json::parse(R"({"node": "x"})"), row));
  EXPECT_FALSE(MemoryFromStat(nlohmann::json(), row));  // a reply that was not JSON
  ASSERT_TRUE(MemoryFromStat(
      nlohmann::json::parse(R"({"memory": {"allocated_bytes": 10, "budget_bytes": 100},
                                "objects": {"physical_bytes_held": 4096}})"),
      row));
  EXPECT_EQ(row.used_bytes, 10u);
  EXPECT_EQ(row.total_bytes, 100u);
  EXPECT_EQ(row.objects_bytes, 4096);
  ASSERT_TRUE(MemoryFromStat(
      nlohmann::json::parse(R"({"memory": {"allocated_bytes": 1, "budget_bytes": 2}})"), row));
  EXPECT_EQ(row.objects_bytes, -1);  // --services pools: no object store
}

TEST(ClusterFormatTest, MemberEvents) {
  ClusterMemberEvent e;
  e.type = ClusterMemberEvent::Type::kExpire;
  e.member = Member("node-2", "127.0.0.1:7702", {"memory"}, -1);
  e.revision = 42;
  EXPECT_EQ(FormatMemberEvent(e),
            "expire node-2 127.0.0.1:7702 roles=memory capacity=64.0 MiB revision=42");
  const nlohmann::json j = MemberEventJson(e);
  EXPECT_EQ(j["event"], "expire");
  EXPECT_EQ(j["name"], "node-2");
  EXPECT_EQ(j["revision"], 42);
  EXPECT_EQ(MemberEventName(ClusterMemberEvent::Type::kJoin), "join");
  EXPECT_EQ(MemberEventName(ClusterMemberEvent::Type::kLeave), "leave");
  e.type = ClusterMemberEvent::Type::kJoin;
  e.member.address.clear();
  e.member.roles.clear();
  EXPECT_EQ(FormatMemberEvent(e).substr(0, 20), "join   node-2 - role");
}

}  // namespace
}  // namespace farmem::cli
