// The tx client's address cache: (table, key) -> the key's item offset, a guess that lets a read
// go straight to the item with one one-sided copy. One per TxClient, shared by all its threads
// (any thread may call anything; each shard has its own mutex).
//
// Layout: kShards shards, picked by the top bits of a 64-bit tag (HashKey of the key, seeded with
// the table id). Each shard is an open-addressing table of {tag, offset} slots: linear probing
// from the tag's low bits, tag 0 = empty, backward-shift deletion (no tombstones), doubled when
// half full. The key bytes are not stored, so two keys with one tag share an entry and that
// entry may name the other key's item. That is safe by construction: a cached offset is only ever
// a guess that the reader checks (CheckItemCopy compares the key in the copy) and forgets when
// it names another key or nothing, so a shared tag costs one RPC, never a wrong answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

namespace farmem::tx {

class AddressCache {
 public:
  static constexpr size_t kShards = 64;

  AddressCache() = default;
  AddressCache(const AddressCache&) = delete;
  AddressCache& operator=(const AddressCache&) = delete;

  std::optional<uint64_t> find(uint16_t table, std::span<const std::byte> key) const {
    return find_tag(Tag(table, key));
  }
  // Inserts or replaces; a put of the offset already cached writes nothing.
  void put(uint16_t table, std::span<const std::byte> key, uint64_t offset) {
    put_tag(Tag(table, key), offset);
  }
  void erase(uint16_t table, std::span<const std::byte> key) { erase_tag(Tag(table, key)); }
  size_t size() const;

  // The entry's tag (never 0). Exposed, with the *_tag calls, so tests can choose colliding tags.
  static uint64_t Tag(uint16_t table, std::span<const std::byte> key);
  std::optional<uint64_t> find_tag(uint64_t tag) const;
  void put_tag(uint64_t tag, uint64_t offset);
  void erase_tag(uint64_t tag);

 private:
  struct Slot {
    uint64_t tag = 0;  // 0: empty
    uint64_t offset = 0;
  };
  struct Shard {
    mutable std::mutex mu;
    std::vector<Slot> slots;  // size 0 or a power of two
    size_t used = 0;
  };
  static Shard& ShardOf(std::span<Shard, kShards> shards, uint64_t tag) {
    return shards[tag >> 58];  // 64 shards: the top 6 bits; slots use the low bits
  }
  static void Grow(Shard& s);
  static void Insert(std::vector<Slot>& slots, Slot slot);

  mutable Shard shards_[kShards];
};

static_assert(AddressCache::kShards == 64, "ShardOf takes the top 6 bits of the tag");

}  // namespace farmem::tx
