// Tests of the `farmem stat` table's tier section (residency against the budget, promotions,
// demotions, write-backs and file IO from a STAT "tier" object; absent without one) and of the
// objects section's metadata line and per-class merge success rate, and of the tx section
// (counters, 2PC and recovery state, non-zero aborts, one row per table).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"

namespace farmem::cli {
namespace {

TEST(StatFormat, TierSectionShowsResidencyBudgetMovesAndIo) {
  nlohmann::json s = {{"node", "n"}};
  EXPECT_EQ(FormatStatTable(s, "a:1").find("tier:"), std::string::npos);
  s["tier"] = {{"config", {{"file", "/var/tmp/t"}, {"mode", "full"}, {"period_ms", 1000u}}},
               {"capacity_bytes", 8u << 20},
               {"units", 128u},
               {"unit_bytes", 64u << 10},
               {"resident_units", 3u},
               {"budget_units", 4u},
               {"resident_bytes", 3u * (64u << 10)},
               {"budget_bytes", 4u * (64u << 10)},
               {"residency", 3.0 / 128},
               {"promotions", 17u},
               {"demotions", 14u},
               {"writebacks", 5u},
               {"io_read_bytes", 2u << 20},
               {"io_write_bytes", 1u << 20}};
  const std::string out = FormatStatTable(s, "a:1");
  EXPECT_NE(out.find("tier: /var/tmp/t mode full, 8.0 MiB in 128 unit(s) of 64.0 KiB"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("resident 3 of 4 budget unit(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("17 promotion(s), 14 demotion(s), 5 write-back(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("file IO: read 2.0 MiB, written 1.0 MiB"), std::string::npos) << out;
}

TEST(StatFormat, ObjectsSectionShowsMetadataAndMergeSuccessPerClass) {
  nlohmann::json s = {{"node", "n"}};
  s["objects"] = {{"config", {{"block_size", 4096u}, {"id_bits", 16}}},
                  {"live_objects", 10u},
                  {"live_blocks", 2u},
                  {"classes",
                   {{{"class", 3u},
                     {"slot_size", 64u},
                     {"blocks", 2u},
                     {"live", 10u},
                     {"capacity_slots", 100u},
                     {"fragmentation", 0.9}}}}};
  // A server without the metadata and merge fields (older farmemd): no metadata line, "-".
  std::string out = FormatStatTable(s, "a:1");
  EXPECT_EQ(out.find("metadata"), std::string::npos) << out;
  EXPECT_NE(out.find("MERGED/TRIED"), std::string::npos) << out;
  s["objects"]["metadata"] = {{"total", 3u << 20},      {"dynamic", 1u << 20},
                              {"block_structs", 512u},  {"per_slot", 700u},
                              {"id_tables", 256u},      {"owner_lists", 64u},
                              {"per_vblock", 1u << 20}, {"per_owner", 1u << 20}};
  s["objects"]["classes"][0]["merge_attempts"] = 8u;
  s["objects"]["classes"][0]["merges"] = 2u;
  s["objects"]["classes"][0]["merge_success_rate"] = 0.25;
  s["objects"]["classes"][0]["merge_redraws"] = 2u;  // both merges re-drew IDs
  s["objects"]["classes"][0]["ids_redrawn"] = 17u;
  out = FormatStatTable(s, "a:1");
  EXPECT_NE(out.find("metadata 3.0 MiB outside the blocks: 1.0 MiB growing with the objects"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("2.0 MiB fixed tables"), std::string::npos) << out;
  EXPECT_NE(out.find("2/8 25%"), std::string::npos) << out;
  EXPECT_NE(out.find("REDRAWN"), std::string::npos) << out;
  EXPECT_NE(out.find("2 (17 IDs)"), std::string::npos) << out;
}

TEST(StatFormat, TxSectionShowsCountersRecoveryAbortsAndTables) {
  nlohmann::json s = {{"node", "n"}};
  EXPECT_EQ(FormatStatTable(s, "a:1").find("tx:"), std::string::npos);
  s["tx"] = {{"partition", 1u},
             {"partitions", 3u},
             {"lease_ms", 2000u},
             {"lookups", 40u},
             {"not_found", 2u},
             {"locks", 7u},
             {"commits", 5u},
             {"commit_items", 9u},
             {"prepares", 3u},
             {"decides", 4u},
             {"prepared", 1u},
             {"decisions", 2u},
             {"statuses", 6u},
             {"recovered_commits", 1u},
             {"recovered_aborts", 2u},
             {"recovery_unreachable", 0u},
             {"recovered_from_peers", 1u},
             {"reaped_locks", 8u},
             {"aborts", {{"locked", 3u}, {"exists", 0u}, {"validation", 1u}}},
             {"tables",
              {{{"name", "bank"},
                {"key_size", 8u},
                {"value_size", 16u},
                {"width", 4u},
                {"buckets", 1024u},
                {"overflow_buckets", 256u},
                {"overflow_used", 12u},
                {"live_items", 1000u},
                {"locked_items", 1u},
                {"region_bytes", 2u << 20}}}}};
  const std::string out = FormatStatTable(s, "a:1");
  EXPECT_NE(out.find("tx: partition 1 of 3, lock lease 2000 ms"), std::string::npos) << out;
  EXPECT_NE(out.find("40 lookup(s) (2 not found), 7 lock(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("5 commit(s) of 9 item(s); 2PC: 3 prepare(s), 4 decide(s), 1 prepared now"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("resolved 1 commit(s), 2 abort(s) (1 by a participant other than the "
                     "first), 0 unreachable; 8 expired lock(s)"),
            std::string::npos)
      << out;
  // Only the reasons that happened.
  EXPECT_NE(out.find("aborts: locked 3, validation 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("TX TABLE"), std::string::npos) << out;
  EXPECT_NE(out.find("bank"), std::string::npos) << out;
  EXPECT_NE(out.find("12/256"), std::string::npos) << out;
  EXPECT_NE(out.find("2.0 MiB"), std::string::npos) << out;
}

}  // namespace
}  // namespace farmem::cli
