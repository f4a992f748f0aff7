// AddressCache (address_cache.h): the sharded open-addressing table. Every call takes exactly
// one shard's mutex.
#include "tx/client/address_cache.h"

#include "tx/format/tx_layout.h"

namespace farmem::tx {

namespace {
constexpr size_t kFirstSlots = 64;
}  // namespace

uint64_t AddressCache::Tag(uint16_t table, std::span<const std::byte> key) {
  // A seed of its own per table: the same key in two tables gets unrelated tags.
  const uint64_t tag = HashKey(key, 0x9e3779b97f4a7c15ULL * (uint64_t{table} + 1));
  return tag == 0 ? 1 : tag;
}

std::optional<uint64_t> AddressCache::find_tag(uint64_t tag) const {
  const Shard& s = ShardOf(shards_, tag);
  std::lock_guard lock(s.mu);
  if (s.slots.empty()) return std::nullopt;
  const size_t mask = s.slots.size() - 1;
  for (size_t i = tag & mask;; i = (i + 1) & mask) {
    const Slot& slot = s.slots[i];
    if (slot.tag == tag) return slot.offset;
    if (slot.tag == 0) return std::nullopt;  // at most half full: a probe always ends
  }
}

void AddressCache::Insert(std::vector<Slot>& slots, Slot slot) {
  const size_t mask = slots.size() - 1;
  size_t i = slot.tag & mask;
  while (slots[i].tag != 0) i = (i + 1) & mask;
  slots[i] = slot;
}

void AddressCache::Grow(Shard& s) {
  std::vector<Slot> bigger(s.slots.empty() ? kFirstSlots : 2 * s.slots.size());
  for (const Slot& slot : s.slots) {
    if (slot.tag != 0) Insert(bigger, slot);
  }
  s.slots.swap(bigger);
}

void AddressCache::put_tag(uint64_t tag, uint64_t offset) {
  Shard& s = ShardOf(shards_, tag);
  std::lock_guard lock(s.mu);
  if (!s.slots.empty()) {
    const size_t mask = s.slots.size() - 1;
    for (size_t i = tag & mask;; i = (i + 1) & mask) {
      Slot& slot = s.slots[i];
      if (slot.tag == tag) {
        if (slot.offset != offset) slot.offset = offset;  // no store when unchanged
        return;
      }
      if (slot.tag == 0) break;
    }
  }
  if (2 * (s.used + 1) > s.slots.size()) Grow(s);
  Insert(s.slots, {tag, offset});
  s.used++;
}

void AddressCache::erase_tag(uint64_t tag) {
  Shard& s = ShardOf(shards_, tag);
  std::lock_guard lock(s.mu);
  if (s.slots.empty()) return;
  const size_t mask = s.slots.size() - 1;
  size_t hole = tag & mask;
  while (s.slots[hole].tag != tag) {
    if (s.slots[hole].tag == 0) return;  // not cached
    hole = (hole + 1) & mask;
  }
  // Backward-shift deletion: move later entries of the run into the hole when the hole lies on
  // their probe path (between their home slot and where they sit), so no probe ever meets an
  // empty slot before its entry.
  for (size_t j = (hole + 1) & mask; s.slots[j].tag != 0; j = (j + 1) & mask) {
    const size_t home = s.slots[j].tag & mask;
    const size_t dist_hole = (hole - home) & mask;  // steps from home to the hole
    const size_t dist_here = (j - home) & mask;     // steps from home to where it sits
    if (dist_hole < dist_here) {
      s.slots[hole] = s.slots[j];
      hole = j;
    }
  }
  s.slots[hole] = Slot{};
  s.used--;
}

size_t AddressCache::size() const {
  size_t n = 0;
  for (const Shard& s : shards_) {
    std::lock_guard lock(s.mu);
    n += s.used;
  }
  return n;
}

}  // namespace farmem::tx
