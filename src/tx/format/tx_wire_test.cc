// Tests of the transaction RPC wire format (tx_wire.h): every request and reply round-trips through
// its encoder and decoder, and each kind of malformed body (short, long, reserved bits, bad key
// length, bad count, unknown op, txid 0, truncated item, bad table info) is refused with kProtocol.
// Single-threaded.
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

}  // namespace
}  // namespace farmem::tx_wire
