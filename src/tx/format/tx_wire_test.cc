// Tests of the transaction RPC wire format (tx_wire.h): every request and reply round-trips through
// its encoder and decoder, and each kind of malformed body (short, long, reserved bits, bad key
// length, bad count, unknown op, txid 0, truncated item, bad table info, the prepare / decide /
// status rules) is refused with kProtocol. Single-threaded.
#include "tx/format/tx_wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace farmem::tx_wire {
namespace {

std::vector<std::byte> Bytes(size_t n, uint8_t fill) {
  return std::vector<std::byte>(n, std::byte{fill});
}

void ExpectProtocol(const Status& st) {
  EXPECT_EQ(st.code(), Code::kProtocol) << st.message();
}

TEST(TxWire, KeyRequestRoundTrip) {
  const auto key = Bytes(16, 7);
  const auto body = EncodeKeyRequest(3, key, 42, 1000);
  ASSERT_EQ(body.size(), sizeof(KeyRequest) + 16);
  auto op = DecodeKeyRequest(body, /*needs_txid=*/true);
  ASSERT_TRUE(op.ok()) << op.status().message();
  EXPECT_EQ(op->table, 3);
  EXPECT_EQ(op->txid, 42u);
  EXPECT_EQ(op->lease_ns, 1000u);
  EXPECT_EQ(op->key.size(), 16u);
  EXPECT_EQ(std::memcmp(op->key.data(), key.data(), 16), 0);
  // A lock request is not a lookup, and a lookup carries no txid.
  ExpectProtocol(DecodeKeyRequest(body, false).status());
  const auto lookup = EncodeKeyRequest(0, key, 0, 0);
  EXPECT_TRUE(DecodeKeyRequest(lookup, false).ok());
  ExpectProtocol(DecodeKeyRequest(lookup, true).status());
}

TEST(TxWire, KeyRequestMalformed) {
  const auto key = Bytes(8, 1);
  auto body = EncodeKeyRequest(0, key, 0, 0);
  // Every truncation and one byte too many.
  for (size_t n = 0; n < body.size(); ++n) {
    ExpectProtocol(DecodeKeyRequest(std::span(body).first(n), false).status());
  }
  auto longer = body;
  longer.push_back(std::byte{0});
  ExpectProtocol(DecodeKeyRequest(longer, false).status());
  // Reserved field, key length not a multiple of 8, too long, zero.
  auto bad = body;
  bad[4] = std::byte{1};
  ExpectProtocol(DecodeKeyRequest(bad, false).status());
  for (size_t klen : {0, 4, 12, 72}) {
    const auto k = Bytes(klen, 1);
    ExpectProtocol(DecodeKeyRequest(EncodeKeyRequest(0, k, 0, 0), false).status());
  }
}

TEST(TxWire, ValidateRoundTripAndMalformed) {
  const auto k1 = Bytes(8, 1), k2 = Bytes(8, 2);
  std::vector<ValidateItem> items{{5, k1}, {9, k2}};
  const auto body = EncodeValidateRequest(1, 77, items);
  auto op = DecodeValidateRequest(body);
  ASSERT_TRUE(op.ok()) << op.status().message();
  EXPECT_EQ(op->table, 1);
  EXPECT_EQ(op->txid, 77u);
  ASSERT_EQ(op->items.size(), 2u);
  EXPECT_EQ(op->items[1].version, 9u);
  EXPECT_EQ(op->items[1].key[0], std::byte{2});
  for (size_t n = 0; n < body.size(); ++n) {
    ExpectProtocol(DecodeValidateRequest(std::span(body).first(n)).status());
  }
  // Count 0 and count over the limit.
  ExpectProtocol(DecodeValidateRequest(EncodeValidateRequest(1, 77, {})).status());
  std::vector<ValidateItem> many(kMaxBatchItems + 1, ValidateItem{1, k1});
  ExpectProtocol(DecodeValidateRequest(EncodeValidateRequest(1, 77, many)).status());
  // Mixed key lengths: the header's key_len is the first one's, so the length is wrong.
  const auto k16 = Bytes(16, 3);
  std::vector<ValidateItem> mixed{{1, k1}, {1, k16}};
  ExpectProtocol(DecodeValidateRequest(EncodeValidateRequest(1, 77, mixed)).status());
}

TEST(TxWire, BatchRoundTrip) {
  const auto k1 = Bytes(8, 1), k2 = Bytes(16, 2), v = Bytes(24, 9);
  std::vector<BatchEntry> items{{kWrite, k1, v}, {kRemove, k2, {}}};
  const auto body = EncodeBatchRequest(2, 11, items);
  auto req = DecodeBatchRequest(body, /*commit=*/true);
  ASSERT_TRUE(req.ok()) << req.status().message();
  EXPECT_EQ(req->table, 2);
  EXPECT_EQ(req->txid, 11u);
  ASSERT_EQ(req->items.size(), 2u);
  EXPECT_EQ(req->items[0].op, kWrite);
  EXPECT_EQ(req->items[0].value.size(), 24u);
  EXPECT_EQ(req->items[1].op, kRemove);
  EXPECT_EQ(req->items[1].key.size(), 16u);
  EXPECT_TRUE(req->items[1].value.empty());
  EXPECT_TRUE(DecodeBatchRequest(body, false).ok());
}

TEST(TxWire, BatchMalformed) {
  const auto k = Bytes(8, 1), v = Bytes(8, 2);
  std::vector<BatchEntry> items{{kWrite, k, v}};
  const auto body = EncodeBatchRequest(0, 5, items);
  for (size_t n = 0; n < body.size(); ++n) {
    ExpectProtocol(DecodeBatchRequest(std::span(body).first(n), true).status());
  }
  auto longer = body;
  longer.push_back(std::byte{0});
  ExpectProtocol(DecodeBatchRequest(longer, true).status());
  // txid 0.
  ExpectProtocol(DecodeBatchRequest(EncodeBatchRequest(0, 0, items), true).status());
  // Count 0 / over the limit.
  ExpectProtocol(DecodeBatchRequest(EncodeBatchRequest(0, 5, {}), true).status());
  std::vector<BatchEntry> many(kMaxBatchItems + 1, BatchEntry{kRemove, k, {}});
  ExpectProtocol(DecodeBatchRequest(EncodeBatchRequest(0, 5, many), true).status());
  // Unknown op; kUnlockOnly only in TX_UNLOCK.
  auto bad_op = body;
  bad_op[sizeof(BatchHeader)] = std::byte{9};
  ExpectProtocol(DecodeBatchRequest(bad_op, true).status());
  std::vector<BatchEntry> unlock{{kUnlockOnly, k, {}}};
  ExpectProtocol(DecodeBatchRequest(EncodeBatchRequest(0, 5, unlock), true).status());
  EXPECT_TRUE(DecodeBatchRequest(EncodeBatchRequest(0, 5, unlock), false).ok());
  // A value on a remove (value_len set by hand).
  std::vector<BatchEntry> rm{{kRemove, k, {}}};
  auto rm_body = EncodeBatchRequest(0, 5, rm);
  const uint16_t vlen = 8;
  std::memcpy(rm_body.data() + sizeof(BatchHeader) + 4, &vlen, 2);
  rm_body.insert(rm_body.end(), v.begin(), v.end());
  ExpectProtocol(DecodeBatchRequest(rm_body, true).status());
  // Reserved fields.
  auto res = body;
  res[4] = std::byte{1};
  ExpectProtocol(DecodeBatchRequest(res, true).status());
  res = body;
  res[sizeof(BatchHeader) + 1] = std::byte{1};
  ExpectProtocol(DecodeBatchRequest(res, true).status());
}

TEST(TxWire, TableInfoRoundTripAndMalformed) {
  TableInfo t;
  t.name = "accounts";
  t.region_key = 0xabc;
  t.geometry.key_size = 8;
  t.geometry.value_size = 8;
  t.geometry.width = 2;
  t.geometry.num_buckets = 16;
  t.geometry.overflow_buckets = 4;
  t.geometry.partition = 1;
  t.geometry.num_partitions = 2;
  t.region_bytes = tx::RegionBytes(t.geometry);
  std::vector<TableInfo> tables{t};
  const auto body = EncodeTableInfoReply(tables);
  auto got = DecodeTableInfoReply(body);
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].name, "accounts");
  EXPECT_EQ((*got)[0].region_key, 0xabcu);
  EXPECT_EQ((*got)[0].geometry.partition, 1);
  EXPECT_EQ((*got)[0].geometry.num_buckets, 16u);
  for (size_t n = 0; n < body.size(); ++n) {
    ExpectProtocol(DecodeTableInfoReply(std::span(body).first(n)).status());
  }
  // Region length not matching the geometry; a bad geometry; a bad name.
  auto bad = tables;
  bad[0].region_bytes += 4096;
  ExpectProtocol(DecodeTableInfoReply(EncodeTableInfoReply(bad)).status());
  bad = tables;
  bad[0].geometry.key_size = 12;
  ExpectProtocol(DecodeTableInfoReply(EncodeTableInfoReply(bad)).status());
  bad = tables;
  bad[0].name = "a b";
  ExpectProtocol(DecodeTableInfoReply(EncodeTableInfoReply(bad)).status());
  bad[0].name = "";
  ExpectProtocol(DecodeTableInfoReply(EncodeTableInfoReply(bad)).status());
}

TEST(TxWire, ItemReply) {
  std::vector<std::byte> body(sizeof(ItemReply) + 16);
  const ItemReply r{64, 3, 0};
  std::memcpy(body.data(), &r, sizeof(r));
  auto got = DecodeItemReply(body, 16);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->item.offset, 64u);
  EXPECT_EQ(got->item.version, 3u);
  EXPECT_EQ(got->value.size(), 16u);
  ExpectProtocol(DecodeItemReply(body, 8).status());
  ExpectProtocol(DecodeItemReply(std::span(body).first(10), 0).status());
}

TEST(TxWire, TwoPhaseRoundTrip) {
  const auto k1 = Bytes(8, 1), k2 = Bytes(16, 2), v = Bytes(24, 3);
  const std::vector<std::string> parts = {"127.0.0.1:7000", "10.0.0.2:7001"};
  const TwoPhaseEntry items[] = {{kWrite, 0, k1, v}, {kRemove, 3, k2, {}}};
  const auto prep = EncodeTwoPhaseRequest(77, 5000, 0, 0, parts, items);
  ASSERT_EQ(prep.size(), sizeof(TwoPhaseHeader) + 2 * 64 + 2 * 8 + 8 + 24 + 16);
  auto p = DecodeTwoPhaseRequest(prep, /*prepare=*/true);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->txid, 77u);
  EXPECT_EQ(p->lease_ns, 5000u);
  ASSERT_EQ(p->participants.size(), 2u);
  EXPECT_EQ(p->participants[1], "10.0.0.2:7001");
  ASSERT_EQ(p->items.size(), 2u);
  EXPECT_EQ(p->items[0].value.size(), 24u);
  EXPECT_EQ(p->items[1].table, 3);
  EXPECT_EQ(p->items[1].op, kRemove);
  ExpectProtocol(DecodeTwoPhaseRequest(prep, false).status());  // a prepare is not a decide
  // A prepared participant's decision, and the first participant's commit with its writes.
  const auto decide = EncodeTwoPhaseRequest(77, 0, kDecideAbort, 0, {}, {});
  auto d = DecodeTwoPhaseRequest(decide, false);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->decision, kDecideAbort);
  EXPECT_TRUE(d->items.empty());
  const auto first = EncodeTwoPhaseRequest(77, 0, kDecideCommit, 2, {}, items);
  auto fc = DecodeTwoPhaseRequest(first, false);
  ASSERT_TRUE(fc.ok()) << fc.status().message();
  EXPECT_EQ(fc->num_participants, 2);
  EXPECT_EQ(fc->items.size(), 2u);
  const auto st = EncodeStruct(StatusRequest{77});
  EXPECT_EQ(DecodeStatusRequest(st)->txid, 77u);
  StatusReply r{};
  r.outcome = kDecideCommit;
  EXPECT_EQ(DecodeStatusReply(EncodeStruct(r))->outcome, kDecideCommit);
}

TEST(TxWire, TwoPhaseMalformed) {
  const auto k = Bytes(8, 1), v = Bytes(8, 3);
  const std::vector<std::string> parts = {"a:1", "b:2"};
  const TwoPhaseEntry items[] = {{kWrite, 0, k, v}};
  const auto prep = EncodeTwoPhaseRequest(9, 100, 0, 0, parts, items);
  for (size_t n = 0; n < prep.size(); ++n) {
    ExpectProtocol(DecodeTwoPhaseRequest(std::span(prep).first(n), true).status());
  }
  auto longer = prep;
  longer.push_back(std::byte{0});
  ExpectProtocol(DecodeTwoPhaseRequest(longer, true).status());
  const auto mutate = [&](const std::vector<std::byte>& body, size_t at, uint8_t b) {
    auto out = body;
    out[at] = std::byte{b};
    return out;
  };
  ExpectProtocol(DecodeTwoPhaseRequest(mutate(prep, 0, 0), true).status());  // txid 0
  for (size_t at : {20, 21, 22, 23}) {  // decision, reserved, reserved2 not 0
    ExpectProtocol(DecodeTwoPhaseRequest(mutate(prep, at, 1), true).status());
  }
  ExpectProtocol(DecodeTwoPhaseRequest(mutate(prep, 16, 1), true).status());  // 1 participant
  ExpectProtocol(DecodeTwoPhaseRequest(mutate(prep, 16, 17), true).status());
  // A participant not NUL-padded, or empty.
  ExpectProtocol(DecodeTwoPhaseRequest(mutate(prep, 24 + 10, 'x'), true).status());
  ExpectProtocol(DecodeTwoPhaseRequest(mutate(prep, 24 + 64, 0), true).status());
  // Item: an unlock op, a reserved byte (table ids are the service's check).
  const size_t item = 24 + 128;
  ExpectProtocol(DecodeTwoPhaseRequest(mutate(prep, item, 3), true).status());  // unlock op
  ExpectProtocol(DecodeTwoPhaseRequest(mutate(prep, item + 1, 1), true).status());
  // Prepare: lease 0, txid 0, count 0.
  ExpectProtocol(
      DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 0, 0, 0, parts, items), true).status());
  ExpectProtocol(
      DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(0, 1, 0, 0, parts, items), true).status());
  ExpectProtocol(
      DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 1, 0, 0, parts, {}), true).status());
  // Decide: unknown decision, a lease, a list, items with abort, participants without items.
  ExpectProtocol(DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 0, 3, 0, {}, {}), false).status());
  ExpectProtocol(DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 5, 1, 0, {}, {}), false).status());
  ExpectProtocol(
      DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 0, 1, 0, parts, items), false).status());
  ExpectProtocol(
      DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 0, kDecideAbort, 2, {}, items), false)
          .status());
  // Without items: 0 participants (a prepared participant's outcome) or 2..16 with a commit (a
  // first participant that only keeps the decision).
  ExpectProtocol(DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 0, 1, 1, {}, {}), false).status());
  ExpectProtocol(
      DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 0, 1, kMaxParticipants + 1, {}, {}), false)
          .status());
  ExpectProtocol(
      DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 0, kDecideAbort, 2, {}, {}), false).status());
  auto keeper = DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 0, kDecideCommit, 2, {}, {}), false);
  ASSERT_TRUE(keeper.ok()) << keeper.status().ToString();
  EXPECT_EQ(keeper->num_participants, 2);
  EXPECT_TRUE(keeper->items.empty());
  // A data structure's owner is never participant 0 (it keeps no decision, serves no TX_STATUS).
  const std::vector<std::string> ds_first = {"ds@127.0.0.1:9", "127.0.0.1:8"};
  ExpectProtocol(
      DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 1, 0, 0, ds_first, items), true).status());
  const std::vector<std::string> ds_second = {"127.0.0.1:8", "ds@127.0.0.1:9"};
  EXPECT_TRUE(
      DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 1, 0, 0, ds_second, items), true).ok());
  ExpectProtocol(
      DecodeTwoPhaseRequest(EncodeTwoPhaseRequest(9, 0, kDecideCommit, 0, {}, items), false)
          .status());
  // Status: length, txid 0, unknown outcome, reserved bytes.
  ExpectProtocol(DecodeStatusRequest(Bytes(7, 1)).status());
  ExpectProtocol(DecodeStatusRequest(Bytes(8, 0)).status());
  ExpectProtocol(DecodeStatusReply(Bytes(8, 0)).status());
  auto reply = Bytes(8, 0);
  reply[0] = std::byte{1};
  EXPECT_TRUE(DecodeStatusReply(reply).ok());
  reply[0] = std::byte{kOutcomeUndecided};
  EXPECT_EQ(DecodeStatusReply(reply)->outcome, kOutcomeUndecided);
  reply[0] = std::byte{4};
  ExpectProtocol(DecodeStatusReply(reply).status());
  reply[0] = std::byte{1};
  reply[3] = std::byte{1};
  ExpectProtocol(DecodeStatusReply(reply).status());
}

}  // namespace
}  // namespace farmem::tx_wire
