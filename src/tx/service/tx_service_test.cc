// Tests of TxService on its own (handlers called directly, as RPC workers would, over a node that
// is never started): --tx-table parsing and config checks, every RPC's happy path, malformed and
// wrong-table requests refused with clear errors, the lease cap, the reaper, STAT and metrics.
// Main thread plus the service's reaper thread.
#include "tx/service/tx_service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "node/node_test_util.h"
#include "tx/format/tx_wire.h"

namespace farmem {
namespace {

namespace wire = tx_wire;

std::vector<std::byte> Key(uint64_t k) {
  std::vector<std::byte> out(8);
  std::memcpy(out.data(), &k, 8);
  return out;
}

class TxServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto n = Node::Create(node::testing::MakeConfig("tcp", "tx-service-test"));
    ASSERT_TRUE(n.ok());
    node_ = std::move(*n);
  }
  void Make(uint32_t lease_ms = 5000) {
    ServerConfig sc;
    sc.tx.tables = {"kv:8:16:16:2", "wide:16:8:8"};
    sc.tx.lease_ms = lease_ms;
    auto s = TxService::Create(sc, *node_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    svc_ = std::move(*s);
  }
  Status Call(uint16_t op, std::span<const std::byte> body, std::vector<std::byte>* reply) {
    std::vector<std::byte> r;
    Status st = svc_->Handle(RpcCall{op, body, "test"}, r);
    if (reply) *reply = r;
    return st;
  }
  std::unique_ptr<Node> node_;
  std::unique_ptr<TxService> svc_;
};

TEST(TxConfig, ParsesAndRefusesTableSpecs) {
  TxConfig c;
  c.partition = 1;
  c.partitions = 2;
  auto s = ParseTxTableSpec("acct:8:32:1024:4", c);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->name, "acct");
  EXPECT_EQ(s->geometry.value_size, 32u);
  EXPECT_EQ(s->geometry.num_buckets, 1024u);
  EXPECT_EQ(s->geometry.overflow_buckets, 256u);
  EXPECT_EQ(s->geometry.partition, 1);
  EXPECT_EQ(s->geometry.num_partitions, 2);
  EXPECT_EQ(ParseTxTableSpec("a:8:8:16", c)->geometry.width, 4u);
  for (const char* bad : {"", "a", "a:8:8", "a:8:8:16:2:9", "a b:8:8:16", "a:12:8:16", "a:8:x:16",
                          "a:8:8:0", "a:8:8:16:65"}) {
    EXPECT_EQ(ParseTxTableSpec(bad, c).status().code(), Code::kInvalidArgument) << bad;
  }
  ServerConfig sc;
  sc.tx.tables = {"a:8:8:16", "a:8:8:32"};
  EXPECT_EQ(ValidateTxConfig(sc).code(), Code::kInvalidArgument);
  sc.tx.tables = {"a:8:8:16"};
  sc.tx.partition = 2;
  sc.tx.partitions = 2;
  EXPECT_EQ(ValidateTxConfig(sc).code(), Code::kInvalidArgument);
  sc.tx.partition = 0;
  sc.tx.lease_ms = 0;
  EXPECT_EQ(ValidateTxConfig(sc).code(), Code::kInvalidArgument);
}

TEST_F(TxServiceTest, ServesEveryRpc) {
  Make();
  ASSERT_EQ(svc_->table_count(), 2u);
  std::vector<std::byte> reply;
  ASSERT_TRUE(Call(wire::kOpTableInfo, {}, &reply).ok());
  auto infos = wire::DecodeTableInfoReply(reply);
  ASSERT_TRUE(infos.ok()) << infos.status().ToString();
  ASSERT_EQ(infos->size(), 2u);
  EXPECT_EQ((*infos)[0].name, "kv");
  EXPECT_EQ((*infos)[1].geometry.key_size, 16u);
  // Insert k1 through lock-insert + commit.
  const auto k1 = Key(1);
  ASSERT_TRUE(Call(wire::kOpLockInsert, wire::EncodeKeyRequest(0, k1, 7, 1'000'000), &reply).ok());
  ASSERT_EQ(reply.size(), sizeof(wire::ItemReply));
  std::vector<std::byte> value(16, std::byte{5});
  std::vector<wire::BatchEntry> w{{wire::kWrite, k1, value}};
  ASSERT_TRUE(Call(wire::kOpCommit, wire::EncodeBatchRequest(0, 7, w), &reply).ok());
  EXPECT_TRUE(reply.empty());
  // Lookup returns value, version and an item offset.
  ASSERT_TRUE(Call(wire::kOpLookup, wire::EncodeKeyRequest(0, k1, 0, 0), &reply).ok());
  auto item = wire::DecodeItemReply(reply, 16);
  ASSERT_TRUE(item.ok());
  EXPECT_EQ(item->value[0], std::byte{5});
  EXPECT_TRUE(tx::IsItemOffset(svc_->table(0).geometry(), item->item.offset));
  const uint64_t version = item->item.version;
  // Validate, lock, validate by another tx fails, unlock.
  std::vector<wire::ValidateItem> v{{version, k1}};
  EXPECT_TRUE(Call(wire::kOpValidate, wire::EncodeValidateRequest(0, 9, v), nullptr).ok());
  ASSERT_TRUE(Call(wire::kOpLock, wire::EncodeKeyRequest(0, k1, 8, 1'000'000), &reply).ok());
  Status st = Call(wire::kOpValidate, wire::EncodeValidateRequest(0, 9, v), nullptr);
  EXPECT_EQ(tx::AbortReasonOf(st), tx::AbortReason::kValidation) << st.ToString();
  st = Call(wire::kOpLock, wire::EncodeKeyRequest(0, k1, 9, 1'000'000), nullptr);
  EXPECT_EQ(tx::AbortReasonOf(st), tx::AbortReason::kLocked) << st.ToString();
  std::vector<wire::BatchEntry> u{{wire::kUnlockOnly, k1, {}}};
  EXPECT_TRUE(Call(wire::kOpUnlock, wire::EncodeBatchRequest(0, 8, u), nullptr).ok());
  // Commit by a transaction that holds no lock: stale commit, nothing installed.
  st = Call(wire::kOpCommit, wire::EncodeBatchRequest(0, 8, w), nullptr);
  EXPECT_EQ(tx::AbortReasonOf(st), tx::AbortReason::kStaleCommit) << st.ToString();
  const nlohmann::json stat = svc_->Stats();
  EXPECT_EQ(stat["lookups"], 1);
  EXPECT_EQ(stat["locks"], 2);
  EXPECT_EQ(stat["commits"], 2);
  EXPECT_EQ(stat["aborts"]["locked"], 1);
  EXPECT_EQ(stat["aborts"]["validation"], 1);
  EXPECT_EQ(stat["aborts"]["stale_commit"], 1);
  EXPECT_EQ(stat["tables"][0]["live_items"], 1);
  MetricsWriter mw;
  svc_->metrics(mw);
  EXPECT_NE(mw.text().find("farmem_tx_aborts_total{reason=\"locked\"} 1"), std::string::npos)
      << mw.text();
}

TEST_F(TxServiceTest, RefusesBadRequests) {
  Make();
  const auto k1 = Key(1);
  // Malformed bodies: kProtocol.
  EXPECT_EQ(Call(wire::kOpTableInfo, k1, nullptr).code(), Code::kProtocol);
  std::vector<std::byte> junk(5, std::byte{1});
  for (uint16_t op = wire::kOpLookup; op <= wire::kLastTxOpcode; ++op) {
    EXPECT_EQ(Call(op, junk, nullptr).code(), Code::kProtocol) << op;
    EXPECT_EQ(Call(op, {}, nullptr).code(), Code::kProtocol) << op;
  }
  EXPECT_EQ(Call(wire::kLastTxOpcode + 1, {}, nullptr).code(), Code::kProtocol);
  // Unknown table: kNotFound; key of the wrong size for the table: kInvalidArgument.
  EXPECT_EQ(Call(wire::kOpLookup, wire::EncodeKeyRequest(5, k1, 0, 0), nullptr).code(),
            Code::kNotFound);
  EXPECT_EQ(Call(wire::kOpLookup, wire::EncodeKeyRequest(1, k1, 0, 0), nullptr).code(),
            Code::kInvalidArgument);
  // Oversized value, duplicate key in one commit: kInvalidArgument from the engine.
  ASSERT_TRUE(Call(wire::kOpLockInsert, wire::EncodeKeyRequest(0, k1, 7, 1'000'000), nullptr).ok());
  std::vector<std::byte> big(24, std::byte{1});
  std::vector<wire::BatchEntry> w{{wire::kWrite, k1, big}};
  EXPECT_EQ(Call(wire::kOpCommit, wire::EncodeBatchRequest(0, 7, w), nullptr).code(),
            Code::kInvalidArgument);
  std::vector<std::byte> ok(16, std::byte{1});
  std::vector<wire::BatchEntry> dup{{wire::kWrite, k1, ok}, {wire::kWrite, k1, ok}};
  EXPECT_EQ(Call(wire::kOpCommit, wire::EncodeBatchRequest(0, 7, dup), nullptr).code(),
            Code::kInvalidArgument);
  // Missing key: kNotFound.
  EXPECT_EQ(Call(wire::kOpLookup, wire::EncodeKeyRequest(0, Key(99), 0, 0), nullptr).code(),
            Code::kNotFound);
}

TEST_F(TxServiceTest, ReaperFreesLocksAfterTheCappedLease) {
  Make(/*lease_ms=*/20);
  ASSERT_TRUE(svc_->start().ok());
  const auto k1 = Key(1);
  std::vector<std::byte> value(16, std::byte{1});
  ASSERT_TRUE(svc_->table(0).Insert(k1, value).ok());
  // Asks for an hour; the service grants at most 20 ms.
  ASSERT_TRUE(
      Call(wire::kOpLock, wire::EncodeKeyRequest(0, k1, 8, 3600'000'000'000ull), nullptr).ok());
  EXPECT_EQ(svc_->table(0).Stats().locked_items, 1u);
  // The reaper frees the lock inside ReapExpired and counts it after: wait for both.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((svc_->table(0).Stats().locked_items != 0 ||
          svc_->Stats()["reaped_locks"].get<uint64_t>() == 0) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(svc_->table(0).Stats().locked_items, 0u);
  EXPECT_GE(svc_->Stats()["reaped_locks"].get<uint64_t>(), 1u);
  svc_->stop();
}

}  // namespace
}  // namespace farmem
