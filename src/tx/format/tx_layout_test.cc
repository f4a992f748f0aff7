// Tests of the Storm hash-table layout: geometry checks and offsets, the table header codec, key
// placement, and the one-sided copy check (busy, torn, seqlock recheck, empty, other key) on item
// and bucket images built by hand. Single-threaded.
#include "tx/format/tx_layout.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace farmem::tx {
namespace {

TxGeometry Small() {
  TxGeometry g;
  g.key_size = 16;
  g.value_size = 24;
  g.width = 2;
  g.num_buckets = 8;
  g.overflow_buckets = 2;
  return g;
}

std::vector<std::byte> Key(uint64_t a, uint64_t b = 0) {
  std::vector<std::byte> k(16);
  std::memcpy(k.data(), &a, 8);
  std::memcpy(k.data() + 8, &b, 8);
  return k;
}

void Put(std::vector<std::byte>& img, uint64_t word, uint64_t v) {
  std::memcpy(img.data() + word * kWord, &v, kWord);
}

// A consistent item image: seq, live, version, lock, key, value words = fill.
std::vector<std::byte> Item(const TxGeometry& g, uint64_t seq, uint64_t version, bool live,
                            uint64_t lock, const std::vector<std::byte>& key, uint64_t fill) {
  std::vector<std::byte> img(ItemBytes(g));
  Put(img, item::kSeq, seq);
  Put(img, item::kVword, PackVword(version, live));
  Put(img, item::kLock, lock);
  std::memcpy(img.data() + item::kKey * kWord, key.data(), key.size());
  for (uint32_t w = 0; w < g.value_words(); ++w) Put(img, item::kKey + g.key_words() + w, fill);
  Put(img, ItemWords(g) - 1, seq);
  return img;
}

TEST(TxLayout, SizesAndOffsets) {
  const TxGeometry g = Small();
  ASSERT_TRUE(ValidateGeometry(g).ok());
  EXPECT_EQ(ItemWords(g), 5u + 2 + 3);
  EXPECT_EQ(ItemBytes(g), 80u);
  EXPECT_EQ(BucketBytes(g), 8u + 2 * 80);
  EXPECT_EQ(BucketOffset(g, 0), kTableHeaderBytes);
  EXPECT_EQ(ItemOffset(g, 1, 1), kTableHeaderBytes + BucketBytes(g) + 8 + 80);
  EXPECT_EQ(RegionBytes(g) % kPageSize, 0u);
  EXPECT_GE(RegionBytes(g), kTableHeaderBytes + 10 * BucketBytes(g));
  EXPECT_EQ(ValueByteInItem(g), 6u * 8);
  EXPECT_EQ(TailByteInItem(g), 72u);
  // TATP SUBSCRIBER (8 B key, 40 B value): 88 B, under the spec's 128 B per transfer.
  TxGeometry tatp;
  tatp.value_size = 40;
  EXPECT_EQ(ItemBytes(tatp), 88u);
}

TEST(TxLayout, IsItemOffsetAcceptsExactlyTheSlotStarts) {
  const TxGeometry g = Small();
  uint64_t count = 0;
  for (uint64_t off = 0; off < RegionBytes(g) + 200; ++off) {
    if (IsItemOffset(g, off)) ++count;
  }
  EXPECT_EQ(count, TotalBuckets(g) * g.width);
  EXPECT_TRUE(IsItemOffset(g, ItemOffset(g, 9, 1)));
  EXPECT_FALSE(IsItemOffset(g, BucketOffset(g, 3)));
  EXPECT_FALSE(IsItemOffset(g, ItemOffset(g, 2, 0) + 8));
  EXPECT_FALSE(IsItemOffset(g, BucketOffset(g, TotalBuckets(g)) + 8));
  EXPECT_FALSE(IsItemOffset(g, ~uint64_t{0}));
}

TEST(TxLayout, GeometryRangesAreChecked) {
  auto bad = [](auto mutate) {
    TxGeometry g = Small();
    mutate(g);
    return ValidateGeometry(g).code() == Code::kInvalidArgument;
  };
  EXPECT_TRUE(bad([](TxGeometry& g) { g.key_size = 12; }));
  EXPECT_TRUE(bad([](TxGeometry& g) { g.key_size = 0; }));
  EXPECT_TRUE(bad([](TxGeometry& g) { g.key_size = 72; }));
  EXPECT_TRUE(bad([](TxGeometry& g) { g.value_size = 4; }));
  EXPECT_TRUE(bad([](TxGeometry& g) { g.value_size = 4104; }));
  EXPECT_TRUE(bad([](TxGeometry& g) { g.width = 0; }));
  EXPECT_TRUE(bad([](TxGeometry& g) { g.width = 65; }));
  EXPECT_TRUE(bad([](TxGeometry& g) { g.num_buckets = 0; }));
  EXPECT_TRUE(bad([](TxGeometry& g) { g.partition = 1; }));
  EXPECT_TRUE(bad([](TxGeometry& g) {
    g.num_buckets = 0xffffffffu;
    g.width = 64;
    g.value_size = 4096;
  }));
  EXPECT_FALSE(bad([](TxGeometry& g) {
    g.key_size = 64;
    g.value_size = 4096;
    g.width = 64;
  }));
}

TEST(TxLayout, TableHeaderRoundTripsAndRejectsGarbage) {
  TxGeometry g = Small();
  g.partition = 2;
  g.num_partitions = 3;
  g.hash_seed = 0x1234;
  const TableHeader h = EncodeTableHeader(g);
  std::vector<std::byte> bytes(sizeof h);
  std::memcpy(bytes.data(), &h, sizeof h);
  auto back = DecodeTableHeader(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->key_size, g.key_size);
  EXPECT_EQ(back->value_size, g.value_size);
  EXPECT_EQ(back->width, g.width);
  EXPECT_EQ(back->num_buckets, g.num_buckets);
  EXPECT_EQ(back->overflow_buckets, g.overflow_buckets);
  EXPECT_EQ(back->partition, 2);
  EXPECT_EQ(back->num_partitions, 3);
  EXPECT_EQ(back->hash_seed, 0x1234u);
  EXPECT_EQ(DecodeTableHeader(std::span(bytes).first(10)).status().code(), Code::kProtocol);
  auto bad = bytes;
  bad[0] = std::byte{0};
  EXPECT_EQ(DecodeTableHeader(bad).status().code(), Code::kProtocol);
  TableHeader h2 = h;
  h2.key_size = 13;
  std::memcpy(bytes.data(), &h2, sizeof h2);
  EXPECT_EQ(DecodeTableHeader(bytes).status().code(), Code::kProtocol);
}

TEST(TxLayout, KeyPlacementIsDeterministicAndSpreads) {
  TxGeometry g = Small();
  g.num_buckets = 64;
  g.num_partitions = 4;
  std::vector<int> per_bucket(64), per_partition(4);
  for (uint64_t i = 0; i < 64000; ++i) {
    const auto k = Key(i);
    const uint64_t h = HashKey(k, g.hash_seed);
    EXPECT_EQ(h, HashKey(k, g.hash_seed));
    const KeyPlace p = PlaceKey(g, h);
    ASSERT_LT(p.bucket, 64u);
    ASSERT_LT(p.partition, 4u);
    ++per_bucket[p.bucket];
    ++per_partition[p.partition];
  }
  for (int c : per_bucket) EXPECT_NEAR(c, 1000, 200);
  for (int c : per_partition) EXPECT_NEAR(c, 16000, 1000);
  EXPECT_NE(HashKey(Key(1), 0), HashKey(Key(1), 1));
  EXPECT_NE(HashKey(Key(1, 0), 0), HashKey(Key(0, 1), 0));
}

TEST(TxLayout, CheckItemCopyOrderOfChecks) {
  const TxGeometry g = Small();
  const auto key = Key(7, 8);
  ItemView v;
  auto ok = Item(g, 4, 9, true, 0, key, 0xAA);
  ASSERT_EQ(CheckItemCopy(g, ok, key, nullptr, &v), ItemCheck::kOk);
  EXPECT_EQ(v.seq, 4u);
  EXPECT_EQ(v.version, 9u);
  EXPECT_EQ(v.lock_txid, 0u);
  EXPECT_EQ(std::memcmp(v.key.data(), key.data(), 16), 0);
  ASSERT_EQ(v.value.size(), 24u);
  EXPECT_EQ(v.value[0], std::byte{0xAA});
  // Any key (empty span) also accepts it.
  EXPECT_EQ(CheckItemCopy(g, ok, {}, nullptr, nullptr), ItemCheck::kOk);

  auto busy = ok;
  Put(busy, item::kSeq, 5);
  EXPECT_EQ(CheckItemCopy(g, busy, key, nullptr, &v), ItemCheck::kBusy);
  auto torn = ok;
  Put(torn, ItemWords(g) - 1, 6);
  EXPECT_EQ(CheckItemCopy(g, torn, key, nullptr, &v), ItemCheck::kTorn);
  auto odd_tail = ok;
  Put(odd_tail, ItemWords(g) - 1, 5);
  EXPECT_EQ(CheckItemCopy(g, odd_tail, key, nullptr, &v), ItemCheck::kTorn);
  auto empty = Item(g, 4, 9, false, 0, key, 0xAA);
  EXPECT_EQ(CheckItemCopy(g, empty, key, nullptr, &v), ItemCheck::kEmpty);
  auto reserved = Item(g, 4, 9, false, 77, key, 0);
  EXPECT_EQ(CheckItemCopy(g, reserved, key, nullptr, &v), ItemCheck::kEmpty);
  EXPECT_EQ(CheckItemCopy(g, ok, Key(7, 9), nullptr, &v), ItemCheck::kOtherKey);
  EXPECT_EQ(CheckItemCopy(g, ok, std::span(key).first(8), nullptr, &v), ItemCheck::kOtherKey);
  EXPECT_EQ(CheckItemCopy(g, std::span(ok).first(40), key, nullptr, &v), ItemCheck::kTorn);
  auto locked = Item(g, 4, 9, true, 42, key, 0xAA);
  ASSERT_EQ(CheckItemCopy(g, locked, key, nullptr, &v), ItemCheck::kOk);
  EXPECT_EQ(v.lock_txid, 42u);
}

TEST(TxLayout, SeqlockRecheckRejectsAMovedOrDisagreeingSeq) {
  const TxGeometry g = Small();
  const auto key = Key(1);
  const auto img = Item(g, 10, 3, true, 0, key, 1);
  SeqlockRecheck same{10, 10};
  EXPECT_EQ(CheckItemCopy(g, img, key, &same, nullptr), ItemCheck::kOk);
  SeqlockRecheck moved{10, 12};
  EXPECT_EQ(CheckItemCopy(g, img, key, &moved, nullptr), ItemCheck::kTorn);
  SeqlockRecheck writing{10, 11};
  EXPECT_EQ(CheckItemCopy(g, img, key, &writing, nullptr), ItemCheck::kBusy);
  // Both rechecks agree but the copy shows another (older) state: torn.
  SeqlockRecheck later{12, 12};
  EXPECT_EQ(CheckItemCopy(g, img, key, &later, nullptr), ItemCheck::kTorn);
  // An unordered copy mixing two states can have seq == tail (both from one state): the
  // ordered check alone would accept it, the recheck words reject it.
  auto mixed = img;
  Put(mixed, item::kKey + g.key_words(), 2);  // a value word from the next change
  EXPECT_EQ(CheckItemCopy(g, mixed, key, nullptr, nullptr), ItemCheck::kOk);
  SeqlockRecheck across{10, 12};
  EXPECT_EQ(CheckItemCopy(g, mixed, key, &across, nullptr), ItemCheck::kTorn);
}

TEST(TxLayout, ValidatesAgainstVersionAndLock) {
  ItemView v;
  v.version = 5;
  EXPECT_TRUE(ValidatesAgainst(v, 5, 0));
  EXPECT_FALSE(ValidatesAgainst(v, 4, 0));
  v.lock_txid = 9;
  EXPECT_FALSE(ValidatesAgainst(v, 5, 0));
  EXPECT_FALSE(ValidatesAgainst(v, 5, 8));
  EXPECT_TRUE(ValidatesAgainst(v, 5, 9));
}

TEST(TxLayout, ParseBucketCopyFindsMissesAndReportsInconsistency) {
  const TxGeometry g = Small();
  std::vector<std::byte> bucket(BucketBytes(g));
  const uint64_t link = 9 + 1;
  std::memcpy(bucket.data(), &link, 8);
  const auto a = Item(g, 2, 1, true, 0, Key(1), 0x11);
  const auto b = Item(g, 2, 1, true, 0, Key(2), 0x22);
  std::memcpy(bucket.data() + 8, a.data(), a.size());
  std::memcpy(bucket.data() + 8 + ItemBytes(g), b.data(), b.size());
  BucketMatch m = ParseBucketCopy(g, bucket, Key(2));
  ASSERT_EQ(m.kind, BucketMatch::kFound);
  EXPECT_EQ(m.slot, 1);
  EXPECT_EQ(m.view.value[0], std::byte{0x22});
  m = ParseBucketCopy(g, bucket, Key(3));
  EXPECT_EQ(m.kind, BucketMatch::kMiss);
  EXPECT_EQ(m.next_bucket, 10u);
  // Slot 0 torn: a miss is no longer clean (slot 0 might hold the key).
  uint64_t t = 4;
  std::memcpy(bucket.data() + 8 + TailByteInItem(g), &t, 8);
  EXPECT_EQ(ParseBucketCopy(g, bucket, Key(3)).kind, BucketMatch::kInconsistent);
  EXPECT_EQ(ParseBucketCopy(g, bucket, Key(2)).kind, BucketMatch::kFound);
  EXPECT_EQ(ParseBucketCopy(g, std::span(bucket).first(20), Key(2)).kind,
            BucketMatch::kInconsistent);
}

TEST(TxLayout, OrderedCopyAndLoadWordCopyWords) {
  alignas(8) uint64_t src[4] = {1, 2, 3, 4};
  uint64_t dst[4] = {};
  OrderedCopy(src, dst, sizeof src);
  EXPECT_EQ(std::memcmp(src, dst, sizeof src), 0);
  EXPECT_EQ(LoadWord(&src[2]), 3u);
}

}  // namespace
}  // namespace farmem::tx
