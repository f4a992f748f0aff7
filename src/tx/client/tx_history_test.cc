// Tests of the history checker (tx_history.h) on hand-made histories: a serializable one, and one
// of each anomaly it must name (lost update, gap, unknown version, dependency cycle) plus bad
// input. Single-threaded.
#include "tx/client/tx_history.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace farmem::tx {
namespace {

constexpr uint64_t kX = 1, kY = 2;

HistoryTx T(uint64_t id, std::vector<HistoryTx::Read> reads, std::vector<HistoryTx::Write> writes) {
  return HistoryTx{id, std::move(reads), std::move(writes)};
}

void ExpectProblem(const std::vector<HistoryTx>& h, const std::string& what) {
  Status st = CheckHistory(h);
  EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find(what), std::string::npos) << st.ToString();
}

TEST(TxHistory, ASerialHistoryPasses) {
  // T1 writes x; T2 reads x (T1's) and writes y; T3 reads both, then T4 overwrites x.
  const std::vector<HistoryTx> h = {
      T(4, {}, {{kX, 1}}),
      T(1, {}, {{kX, 0}}),
      T(2, {{kX, 1}}, {{kY, 0}}),
      T(3, {{kX, 1}, {kY, 2}}, {}),
  };
  HistoryStats stats;
  Status st = CheckHistory(h, &stats);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(stats.transactions, 4u);
  EXPECT_EQ(stats.versions, 3u);
  // ww 1->4; wr 1->2, 1->3, 2->3; rw 2->4, 3->4.
  EXPECT_EQ(stats.edges, 6u);
  EXPECT_TRUE(CheckHistory(std::vector<HistoryTx>{}).ok());
}

TEST(TxHistory, TwoWritesOverTheSameVersionAreALostUpdate) {
  ExpectProblem({T(1, {}, {{kX, 0}}), T(2, {}, {{kX, 0}})}, "lost update");
}

TEST(TxHistory, AWriteOverAVersionNobodyInstalledIsAGap) {
  ExpectProblem({T(1, {}, {{kX, 0}}), T(2, {}, {{kX, 7}})}, "gap");
}

TEST(TxHistory, AReadOfAVersionNobodyCommittedIsUnknown) {
  ExpectProblem({T(1, {{kX, 9}}, {})}, "unknown version");
}

TEST(TxHistory, AnAuditBetweenTheTwoHalvesOfATransferIsACycle) {
  // T5 moves money x -> y; audit T6 saw x before T5 and y after it.
  const std::vector<HistoryTx> h = {T(5, {}, {{kX, 0}, {kY, 0}}), T(6, {{kX, 0}, {kY, 5}}, {})};
  ExpectProblem(h, "cycle");
  Status st = CheckHistory(h);
  EXPECT_NE(st.message().find("T6 -rw-> T5"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("T5 -wr-> T6"), std::string::npos) << st.ToString();
}

TEST(TxHistory, WriteSkewIsACycle) {
  // T1 reads y, writes x; T2 reads x, writes y; both from the initial versions.
  ExpectProblem({T(1, {{kY, 0}}, {{kX, 0}}), T(2, {{kX, 0}}, {{kY, 0}})}, "cycle");
}

TEST(TxHistory, BadInput) {
  using H = std::vector<HistoryTx>;
  EXPECT_EQ(CheckHistory(H{T(0, {}, {})}).code(), Code::kInvalidArgument);
  EXPECT_EQ(CheckHistory(H{T(1, {}, {}), T(1, {}, {})}).code(), Code::kInvalidArgument);
  EXPECT_EQ(CheckHistory(H{T(1, {}, {{kX, 0}, {kX, 0}})}).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace farmem::tx
