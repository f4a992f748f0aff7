// Storm hash-table layout helpers: geometry checks, the table header codec, key hashing and the
// consistency check of one-sided item and bucket copies. Pure functions, callable from any thread.
#include "tx/format/tx_layout.h"

#include <atomic>
#include <string>

namespace farmem::tx {

namespace {

uint64_t GetWord(std::span<const std::byte> bytes, uint64_t word) {
  uint64_t w;
  std::memcpy(&w, bytes.data() + word * kWord, kWord);
  return w;
}

uint64_t Fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

}  // namespace

Status ValidateGeometry(const TxGeometry& g) {
  if (g.key_size < kMinKeySize || g.key_size > kMaxKeySize || g.key_size % kWord != 0) {
    return Status::InvalidArgument("tx table: key_size " + std::to_string(g.key_size) +
                                   " must be a multiple of 8 in 8..64");
  }
  if (g.value_size < kMinValueSize || g.value_size > kMaxValueSize || g.value_size % kWord != 0) {
    return Status::InvalidArgument("tx table: value_size " + std::to_string(g.value_size) +
                                   " must be a multiple of 8 in 8..4096");
  }
  if (g.width < 1 || g.width > kMaxWidth) {
    return Status::InvalidArgument("tx table: width " + std::to_string(g.width) +
                                   " must be in 1..64");
  }
  if (g.num_buckets < 1) return Status::InvalidArgument("tx table: num_buckets must be >= 1");
  if (g.num_partitions < 1 || g.partition >= g.num_partitions) {
    return Status::InvalidArgument("tx table: partition " + std::to_string(g.partition) +
                                   " not below num_partitions " + std::to_string(g.num_partitions));
  }
  // All factors are below 2^32 and BucketBytes below 2^22: no overflow in 64 bits.
  const uint64_t raw = kTableHeaderBytes + TotalBuckets(g) * BucketBytes(g);
  if (raw > kMaxRegionBytes) {
    return Status::InvalidArgument("tx table: region of " + std::to_string(raw) +
                                   " bytes exceeds the 1 TiB limit");
  }
  return Status::OK();
}

bool IsItemOffset(const TxGeometry& g, uint64_t offset) {
  if (offset < kTableHeaderBytes) return false;
  const uint64_t rel = offset - kTableHeaderBytes;
  const uint64_t bucket = rel / BucketBytes(g);
  if (bucket >= TotalBuckets(g)) return false;
  const uint64_t in_bucket = rel % BucketBytes(g);
  if (in_bucket < kWord) return false;
  return (in_bucket - kWord) % ItemBytes(g) == 0;
}

TableHeader EncodeTableHeader(const TxGeometry& g) {
  TableHeader h{};
  h.magic = kTableMagic;
  h.format_version = kFormatVersion;
  h.key_size = g.key_size;
  h.value_size = g.value_size;
  h.width = g.width;
  h.num_buckets = g.num_buckets;
  h.overflow_buckets = g.overflow_buckets;
  h.partition = g.partition;
  h.num_partitions = g.num_partitions;
  h.hash_seed = g.hash_seed;
  return h;
}

Result<TxGeometry> DecodeTableHeader(std::span<const std::byte> bytes) {
  if (bytes.size() < sizeof(TableHeader)) {
    return Status::Protocol("tx table header: " + std::to_string(bytes.size()) + " bytes, need " +
                            std::to_string(sizeof(TableHeader)));
  }
  TableHeader h;
  std::memcpy(&h, bytes.data(), sizeof h);
  if (h.magic != kTableMagic) return Status::Protocol("tx table header: bad magic");
  if (h.format_version != kFormatVersion) {
    return Status::Protocol("tx table header: format version " + std::to_string(h.format_version) +
                            ", expected " + std::to_string(kFormatVersion));
  }
  TxGeometry g;
  g.key_size = h.key_size;
  g.value_size = h.value_size;
  g.width = h.width;
  g.num_buckets = h.num_buckets;
  g.overflow_buckets = h.overflow_buckets;
  g.partition = h.partition;
  g.num_partitions = h.num_partitions;
  g.hash_seed = h.hash_seed;
  if (Status st = ValidateGeometry(g); !st.ok()) {
    return Status::Protocol("tx table header: " + std::string(st.message()));
  }
  return g;
}

uint64_t HashKey(std::span<const std::byte> key, uint64_t seed) {
  uint64_t h = seed ^ (0x9e3779b97f4a7c15ull * (key.size() + 1));
  size_t i = 0;
  for (; i + kWord <= key.size(); i += kWord) {
    uint64_t w;
    std::memcpy(&w, key.data() + i, kWord);
    h = (h ^ Fmix64(w)) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
  }
  if (i < key.size()) {
    uint64_t w = 0;
    std::memcpy(&w, key.data() + i, key.size() - i);
    h = (h ^ Fmix64(w)) * 0x9e3779b97f4a7c15ull;
  }
  return Fmix64(h);
}

void OrderedCopy(const void* src, void* dst, size_t len) {
  auto* s = static_cast<uint64_t*>(const_cast<void*>(src));
  auto* d = static_cast<std::byte*>(dst);
  for (size_t i = 0; i < len / kWord; ++i) {
    const uint64_t w = std::atomic_ref<uint64_t>(s[i]).load(std::memory_order_seq_cst);
    std::memcpy(d + i * kWord, &w, kWord);
  }
}

uint64_t LoadWord(const void* word) {
  return std::atomic_ref<uint64_t>(*static_cast<uint64_t*>(const_cast<void*>(word)))
      .load(std::memory_order_acquire);
}

const char* ItemCheckName(ItemCheck c) {
  switch (c) {
    case ItemCheck::kOk:
      return "ok";
    case ItemCheck::kBusy:
      return "busy";
    case ItemCheck::kTorn:
      return "torn";
    case ItemCheck::kEmpty:
      return "empty";
    case ItemCheck::kOtherKey:
      return "other key";
  }
  return "?";
}

ItemCheck CheckItemCopy(const TxGeometry& g, std::span<const std::byte> copy,
                        std::span<const std::byte> key, const SeqlockRecheck* recheck,
                        ItemView* out) {
  if (copy.size() < ItemBytes(g)) return ItemCheck::kTorn;
  const uint64_t seq = GetWord(copy, item::kSeq);
  const uint64_t tail = GetWord(copy, ItemWords(g) - 1);
  if (seq & 1) return ItemCheck::kBusy;
  if (tail != seq) return ItemCheck::kTorn;
  if (recheck != nullptr) {
    if ((recheck->before & 1) || (recheck->after & 1)) return ItemCheck::kBusy;
    if (recheck->before != recheck->after || recheck->before != seq) return ItemCheck::kTorn;
  }
  const uint64_t vword = GetWord(copy, item::kVword);
  if (!LiveOf(vword)) return ItemCheck::kEmpty;
  const auto item_key = copy.subspan(item::kKey * kWord, g.key_size);
  if (!key.empty() &&
      (key.size() != g.key_size || std::memcmp(key.data(), item_key.data(), g.key_size) != 0)) {
    return ItemCheck::kOtherKey;
  }
  if (out != nullptr) {
    out->seq = seq;
    out->version = VersionOf(vword);
    out->lock_txid = GetWord(copy, item::kLock);
    out->key = item_key;
    out->value = copy.subspan(ValueByteInItem(g), g.value_size);
  }
  return ItemCheck::kOk;
}

BucketMatch ParseBucketCopy(const TxGeometry& g, std::span<const std::byte> copy,
                            std::span<const std::byte> key) {
  BucketMatch m;
  if (copy.size() < BucketBytes(g)) {
    m.kind = BucketMatch::kInconsistent;
    return m;
  }
  m.next_bucket = GetWord(copy, 0);
  bool inconsistent = false;
  for (uint32_t s = 0; s < g.width; ++s) {
    const auto item = copy.subspan(kWord + s * ItemBytes(g), ItemBytes(g));
    ItemView v;
    const ItemCheck c = CheckItemCopy(g, item, key, nullptr, &v);
    if (c == ItemCheck::kOk) {
      m.kind = BucketMatch::kFound;
      m.slot = static_cast<int>(s);
      m.view = v;
      return m;
    }
    if (c == ItemCheck::kBusy || c == ItemCheck::kTorn) inconsistent = true;
  }
  m.kind = inconsistent ? BucketMatch::kInconsistent : BucketMatch::kMiss;
  return m;
}

}  // namespace farmem::tx
