// TxTable: the owner-side hash-table partition (see tx_table.h). Called by any owner thread; every
// item change runs under its chain's stripe mutex and follows the writer protocol of tx_layout.h.
#include "tx/engine/tx_table.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace farmem::tx {

namespace {

constexpr uint32_t kMaxStripes = 1024;

Status Aborted(std::string_view reason, std::string_view detail) {
  return Status::Aborted(std::string(reason) + ": " + std::string(detail));
}

}  // namespace

AbortReason AbortReasonOf(const Status& st) {
  if (st.code() != Code::kAborted) return AbortReason::kNone;
  const std::string_view m = st.message();
  auto starts = [&](std::string_view p) { return m.substr(0, p.size()) == p; };
  if (starts("locked")) return AbortReason::kLocked;
  if (starts("exists")) return AbortReason::kExists;
  if (starts("validation")) return AbortReason::kValidation;
  if (starts("stale commit")) return AbortReason::kStaleCommit;
  if (starts("not lock holder")) return AbortReason::kNotLockHolder;
  return AbortReason::kNone;
}

Result<std::unique_ptr<TxTable>> TxTable::Create(const TxGeometry& g, TxTableOptions options) {
  FARMEM_RETURN_IF_ERROR(ValidateGeometry(g));
  const uint64_t bytes = RegionBytes(g);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return Status::FromErrno("tx table: mmap of the region", errno);
  // Fresh anonymous memory is zero: every slot free (seq 0, not live, unlocked), no links.
  const TableHeader h = EncodeTableHeader(g);
  std::memcpy(p, &h, sizeof h);
  return std::unique_ptr<TxTable>(
      new TxTable(g, std::move(options), static_cast<std::byte*>(p), bytes));
}

TxTable::TxTable(const TxGeometry& g, TxTableOptions options, std::byte* region, uint64_t bytes)
    : g_(g),
      options_(std::move(options)),
      region_(region),
      region_bytes_(bytes),
      stripe_count_(std::min(g.num_buckets, kMaxStripes)),
      stripes_(new std::mutex[stripe_count_]) {}

TxTable::~TxTable() {
  munmap(region_, region_bytes_);
}

uint64_t TxTable::Now() const {
  if (options_.now_ns) return options_.now_ns();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

Status TxTable::CheckKey(std::span<const std::byte> key) const {
  if (key.size() != g_.key_size) {
    return Status::InvalidArgument("tx table: key of " + std::to_string(key.size()) +
                                   " bytes, the table's keys are " + std::to_string(g_.key_size));
  }
  return Status::OK();
}

Status TxTable::CheckValue(std::span<const std::byte> value) const {
  if (value.size() > g_.value_size) {
    return Status::InvalidArgument("tx table: value of " + std::to_string(value.size()) +
                                   " bytes, the table's values hold " +
                                   std::to_string(g_.value_size));
  }
  return Status::OK();
}

uint32_t TxTable::MainBucket(std::span<const std::byte> key) const {
  return PlaceKey(g_, HashKey(key, g_.hash_seed)).bucket;
}

uint64_t TxTable::Load(const Slot& s, uint32_t word) {
  return std::atomic_ref<uint64_t>(s.words[word]).load(std::memory_order_relaxed);
}

bool TxTable::LockLive(const Slot& s, uint64_t now) const {
  return Load(s, item::kLock) != 0 && Load(s, item::kLease) > now;
}

TxTable::Found TxTable::Search(uint32_t main_bucket, std::span<const std::byte> key, uint64_t now) {
  Found f;
  uint64_t bucket = main_bucket;
  const uint64_t item_words = ItemWords(g_);
  for (;;) {
    auto* b = reinterpret_cast<uint64_t*>(region_ + BucketOffset(g_, bucket));
    f.last_bucket = b;
    for (uint32_t s = 0; s < g_.width; ++s) {
      Slot slot{b + 1 + s * item_words, ItemOffset(g_, bucket, s)};
      const bool live = LiveOf(Load(slot, item::kVword));
      const uint64_t lock = Load(slot, item::kLock);
      if (live || lock != 0) {
        bool same = true;
        for (uint32_t w = 0; w < g_.key_words() && same; ++w) {
          uint64_t k;
          std::memcpy(&k, key.data() + w * kWord, kWord);
          same = Load(slot, item::kKey + w) == k;
        }
        if (same) {
          f.item = slot;
          continue;
        }
      }
      // Reusable: free, or an insert reservation (of another key) whose lease ran out.
      if (f.free.words == nullptr && !live && (lock == 0 || Load(slot, item::kLease) <= now)) {
        f.free = slot;
      }
    }
    const uint64_t link = std::atomic_ref<uint64_t>(b[0]).load(std::memory_order_relaxed);
    if (link == 0) break;
    bucket = link - 1;
  }
  return f;
}

Result<TxTable::Slot> TxTable::FreeSlot(const Found& f) {
  if (f.free.words != nullptr) return f.free;
  uint32_t used = overflow_used_.load(std::memory_order_relaxed);
  do {
    if (used >= g_.overflow_buckets) {
      return Status::ResourceExhausted("tx table: bucket full and all " +
                                       std::to_string(g_.overflow_buckets) +
                                       " overflow buckets in use");
    }
  } while (!overflow_used_.compare_exchange_weak(used, used + 1, std::memory_order_relaxed));
  const uint64_t bucket = uint64_t{g_.num_buckets} + used;
  // The new bucket is all zeros (free slots); linking it is one atomic store readers see whole.
  std::atomic_ref<uint64_t>(f.last_bucket[0]).store(bucket + 1, std::memory_order_release);
  auto* b = reinterpret_cast<uint64_t*>(region_ + BucketOffset(g_, bucket));
  return Slot{b + 1, ItemOffset(g_, bucket, 0)};
}

void TxTable::Begin(const Slot& s) {
  if (options_.faults.no_odd_marking) return;
  const uint64_t seq = Load(s, item::kSeq);
  const uint32_t tail = static_cast<uint32_t>(ItemWords(g_) - 1);
  // Steps 1-2: odd tail, then odd seq. Relaxed is enough here: every later store of the change
  // is a release store, which orders these before it for any reader that sees it.
  std::atomic_ref<uint64_t>(s.words[tail]).store(seq + 1, std::memory_order_relaxed);
  std::atomic_ref<uint64_t>(s.words[item::kSeq]).store(seq + 1, std::memory_order_relaxed);
}

void TxTable::Store(const Slot& s, uint32_t word, uint64_t value) {
  std::atomic_ref<uint64_t>(s.words[word]).store(value, std::memory_order_release);
}

void TxTable::StoreValue(const Slot& s, std::span<const std::byte> value) {
  const uint32_t words = g_.value_words();
  const uint32_t first = item::kKey + g_.key_words();
  const uint32_t hook_at = words / 2;
  for (uint32_t w = 0; w < words; ++w) {
    if (w == hook_at && options_.mid_value_hook) options_.mid_value_hook(s.offset);
    uint64_t v = 0;
    const size_t at = size_t{w} * kWord;
    if (at < value.size()) std::memcpy(&v, value.data() + at, std::min(kWord, value.size() - at));
    Store(s, first + w, v);
  }
}

void TxTable::StoreKey(const Slot& s, std::span<const std::byte> key) {
  for (uint32_t w = 0; w < g_.key_words(); ++w) {
    uint64_t k;
    std::memcpy(&k, key.data() + w * kWord, kWord);
    Store(s, item::kKey + w, k);
  }
}

void TxTable::End(const Slot& s) {
  const uint32_t tail = static_cast<uint32_t>(ItemWords(g_) - 1);
  // Steps 4-5. Without odd marking the seq is still even here: it moves by 2 either way.
  const uint64_t seq = Load(s, item::kSeq);
  const uint64_t next = (seq | 1) + 1;
  Store(s, tail, next);
  Store(s, item::kSeq, next);
}

ItemRead TxTable::ReadItem(const Slot& s, std::span<std::byte> value_out) const {
  ItemRead r;
  r.offset = s.offset;
  r.version = VersionOf(Load(s, item::kVword));
  r.lock_txid = Load(s, item::kLock);
  if (!value_out.empty()) {
    const uint32_t first = item::kKey + g_.key_words();
    for (uint32_t w = 0; w < g_.value_words(); ++w) {
      const uint64_t v = Load(s, first + w);
      std::memcpy(value_out.data() + size_t{w} * kWord, &v, kWord);
    }
  }
  return r;
}

Result<ItemRead> TxTable::Lookup(std::span<const std::byte> key, std::span<std::byte> value_out) {
  FARMEM_RETURN_IF_ERROR(CheckKey(key));
  if (!value_out.empty() && value_out.size() < g_.value_size) {
    return Status::InvalidArgument("tx table: value buffer smaller than value_size");
  }
  const uint32_t mb = MainBucket(key);
  std::lock_guard lk(StripeOf(mb));
  const Found f = Search(mb, key, Now());
  if (f.item.words == nullptr || !LiveOf(Load(f.item, item::kVword))) {
    return Status::NotFound("not found");
  }
  return ReadItem(f.item, value_out);
}

Result<ItemRead> TxTable::LockForUpdate(std::span<const std::byte> key, uint64_t txid,
                                        uint64_t lease_ns, std::span<std::byte> value_out) {
  FARMEM_RETURN_IF_ERROR(CheckKey(key));
  if (txid == 0) return Status::InvalidArgument("tx table: transaction id 0");
  if (!value_out.empty() && value_out.size() < g_.value_size) {
    return Status::InvalidArgument("tx table: value buffer smaller than value_size");
  }
  const uint32_t mb = MainBucket(key);
  std::lock_guard lk(StripeOf(mb));
  const uint64_t now = Now();
  const Found f = Search(mb, key, now);
  if (f.item.words == nullptr || !LiveOf(Load(f.item, item::kVword))) {
    return Status::NotFound("not found");
  }
  const uint64_t holder = Load(f.item, item::kLock);
  if (holder != 0 && holder != txid && LockLive(f.item, now) && !options_.faults.no_lock_check) {
    return Aborted("locked", "held by transaction " + std::to_string(holder));
  }
  if (holder == 0) NoteLocked(mb, f.item);
  Begin(f.item);
  Store(f.item, item::kLock, txid);
  Store(f.item, item::kLease, now + lease_ns);
  End(f.item);
  return ReadItem(f.item, value_out);
}

Result<uint64_t> TxTable::LockForInsert(std::span<const std::byte> key, uint64_t txid,
                                        uint64_t lease_ns) {
  FARMEM_RETURN_IF_ERROR(CheckKey(key));
  if (txid == 0) return Status::InvalidArgument("tx table: transaction id 0");
  const uint32_t mb = MainBucket(key);
  std::lock_guard lk(StripeOf(mb));
  const uint64_t now = Now();
  const Found f = Search(mb, key, now);
  Slot slot = f.item;
  if (slot.words != nullptr) {
    if (LiveOf(Load(slot, item::kVword))) return Aborted("exists", "key is live");
    const uint64_t holder = Load(slot, item::kLock);
    if (holder != txid && LockLive(slot, now) && !options_.faults.no_lock_check) {
      return Aborted("locked", "insert reserved by transaction " + std::to_string(holder));
    }
  } else {
    FARMEM_ASSIGN_OR_RETURN(slot, FreeSlot(f));
  }
  if (Load(slot, item::kLock) == 0) NoteLocked(mb, slot);
  Begin(slot);
  Store(slot, item::kLock, txid);
  Store(slot, item::kLease, now + lease_ns);
  StoreKey(slot, key);
  End(slot);
  return slot.offset;
}

Status TxTable::Validate(std::span<const std::byte> key, uint64_t version, uint64_t txid) {
  FARMEM_RETURN_IF_ERROR(CheckKey(key));
  const uint32_t mb = MainBucket(key);
  std::lock_guard lk(StripeOf(mb));
  const Found f = Search(mb, key, Now());
  if (f.item.words == nullptr || !LiveOf(Load(f.item, item::kVword))) {
    return Aborted("validation", "item gone");
  }
  const uint64_t now_version = VersionOf(Load(f.item, item::kVword));
  if (now_version != version) {
    return Aborted("validation",
                   "version " + std::to_string(version) + " is now " + std::to_string(now_version));
  }
  const uint64_t holder = Load(f.item, item::kLock);
  if (holder != 0 && holder != txid) {
    return Aborted("validation", "locked by transaction " + std::to_string(holder));
  }
  return Status::OK();
}

Result<uint64_t> TxTable::CommitWrite(std::span<const std::byte> key, uint64_t txid,
                                      std::span<const std::byte> value) {
  FARMEM_RETURN_IF_ERROR(CheckKey(key));
  FARMEM_RETURN_IF_ERROR(CheckValue(value));
  if (txid == 0) return Status::InvalidArgument("tx table: transaction id 0");
  const uint32_t mb = MainBucket(key);
  std::lock_guard lk(StripeOf(mb));
  const uint64_t now = Now();
  const Found f = Search(mb, key, now);
  const CommitRight right = RightOf(f.item, txid, now);
  // The holder is treated as dead from now on: release (a reservation frees its slot).
  if (right == CommitRight::kLeaseRanOut) Release(f.item);
  if (right != CommitRight::kHeld) return StaleCommit(right, txid, "");
  return InstallValue(f.item, value);
}

Status TxTable::CommitRemove(std::span<const std::byte> key, uint64_t txid) {
  FARMEM_RETURN_IF_ERROR(CheckKey(key));
  if (txid == 0) return Status::InvalidArgument("tx table: transaction id 0");
  const uint32_t mb = MainBucket(key);
  std::lock_guard lk(StripeOf(mb));
  const uint64_t now = Now();
  const Found f = Search(mb, key, now);
  const CommitRight right = RightOf(f.item, txid, now);
  if (right == CommitRight::kNotHeld) return StaleCommit(right, txid, "");
  if (right == CommitRight::kLeaseRanOut || !LiveOf(Load(f.item, item::kVword))) {
    Release(f.item);
    if (right == CommitRight::kLeaseRanOut) return StaleCommit(right, txid, "");
    return Status::NotFound("not found (remove of an insert reservation: dropped it)");
  }
  RemoveItem(f.item);
  return Status::OK();
}

TxTable::CommitRight TxTable::RightOf(const Slot& item, uint64_t txid, uint64_t now) const {
  const bool advisory = options_.faults.no_lock_check;
  if (item.words == nullptr || (Load(item, item::kLock) != txid && !advisory)) {
    return CommitRight::kNotHeld;
  }
  if (Load(item, item::kLease) <= now && !options_.faults.no_lease_check && !advisory) {
    return CommitRight::kLeaseRanOut;
  }
  return CommitRight::kHeld;
}

Status TxTable::StaleCommit(CommitRight right, uint64_t txid, std::string_view where) {
  const std::string tx = "transaction " + std::to_string(txid);
  return Aborted("stale commit", right == CommitRight::kNotHeld
                                     ? tx + " holds no lock" + std::string(where)
                                     : "lease of " + tx + " expired" + std::string(where));
}

uint64_t TxTable::InstallValue(const Slot& s, std::span<const std::byte> value) {
  const uint64_t version = VersionOf(Load(s, item::kVword)) + 1;
  Begin(s);
  Store(s, item::kVword, PackVword(version, true));
  StoreValue(s, value);
  Store(s, item::kLock, 0);
  Store(s, item::kLease, 0);
  End(s);
  return version;
}

void TxTable::RemoveItem(const Slot& s) {
  const uint64_t vword = Load(s, item::kVword);
  Begin(s);
  Store(s, item::kVword, PackVword(VersionOf(vword) + 1, false));
  Store(s, item::kLock, 0);
  Store(s, item::kLease, 0);
  End(s);
}

void TxTable::Release(const Slot& s) {
  Begin(s);
  Store(s, item::kLock, 0);
  Store(s, item::kLease, 0);
  End(s);
}

Status TxTable::Claim(uint64_t txid, std::span<const TxWrite> writes,
                      std::vector<std::unique_lock<std::mutex>>* held, std::vector<Slot>* slots) {
  if (txid == 0) return Status::InvalidArgument("tx table: transaction id 0");
  if (writes.size() > kMaxCommitItems) {
    return Status::InvalidArgument("tx table: commit of " + std::to_string(writes.size()) +
                                   " items, at most " + std::to_string(kMaxCommitItems));
  }
  std::vector<uint32_t> stripes;
  stripes.reserve(writes.size());
  for (size_t i = 0; i < writes.size(); ++i) {
    FARMEM_RETURN_IF_ERROR(CheckKey(writes[i].key));
    if (!writes[i].remove) FARMEM_RETURN_IF_ERROR(CheckValue(writes[i].value));
    for (size_t j = 0; j < i; ++j) {
      if (std::memcmp(writes[j].key.data(), writes[i].key.data(), g_.key_size) == 0) {
        return Status::InvalidArgument("tx table: duplicate key in one commit");
      }
    }
    stripes.push_back(MainBucket(writes[i].key) % stripe_count_);
  }
  // Stripes in ascending order, each once: no deadlock with other multi-stripe callers.
  std::sort(stripes.begin(), stripes.end());
  stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
  held->reserve(stripes.size());
  for (uint32_t s : stripes) held->emplace_back(stripes_[s]);
  const uint64_t now = Now();
  slots->assign(writes.size(), Slot{});
  Status refused = Status::OK();
  for (size_t i = 0; i < writes.size(); ++i) {
    const Found f = Search(MainBucket(writes[i].key), writes[i].key, now);
    (*slots)[i] = f.item;
    const CommitRight right = RightOf(f.item, txid, now);
    if (right != CommitRight::kHeld) {
      refused = StaleCommit(right, txid, " on item " + std::to_string(i));
    }
  }
  if (!refused.ok()) {
    for (const Slot& s : *slots) {
      if (s.words != nullptr && Load(s, item::kLock) == txid) Release(s);
    }
  }
  return refused;
}

Status TxTable::CommitAll(uint64_t txid, std::span<const TxWrite> writes) {
  std::vector<std::unique_lock<std::mutex>> held;
  std::vector<Slot> slots;
  FARMEM_RETURN_IF_ERROR(Claim(txid, writes, &held, &slots));
  for (size_t i = 0; i < writes.size(); ++i) {
    if (!writes[i].remove) {
      InstallValue(slots[i], writes[i].value);
    } else if (LiveOf(Load(slots[i], item::kVword))) {
      RemoveItem(slots[i]);
    } else {
      Release(slots[i]);  // remove of an insert reservation: drop it
    }
  }
  return Status::OK();
}

Status TxTable::PrepareAll(uint64_t txid, std::span<const TxWrite> writes) {
  std::vector<std::unique_lock<std::mutex>> held;
  std::vector<Slot> slots;
  FARMEM_RETURN_IF_ERROR(Claim(txid, writes, &held, &slots));
  if (options_.faults.no_prepare_pin) return Status::OK();
  for (const Slot& s : slots) {
    Begin(s);
    Store(s, item::kLease, kPinnedLease);
    End(s);
  }
  return Status::OK();
}

Status TxTable::Unlock(std::span<const std::byte> key, uint64_t txid) {
  FARMEM_RETURN_IF_ERROR(CheckKey(key));
  if (txid == 0) return Status::InvalidArgument("tx table: transaction id 0");
  const uint32_t mb = MainBucket(key);
  std::lock_guard lk(StripeOf(mb));
  const Found f = Search(mb, key, Now());
  if (f.item.words == nullptr) return Status::NotFound("not found");
  const uint64_t holder = Load(f.item, item::kLock);
  if (holder != txid) {
    return Aborted("not lock holder", "held by transaction " + std::to_string(holder) + ", not " +
                                          std::to_string(txid));
  }
  Begin(f.item);
  Store(f.item, item::kLock, 0);
  Store(f.item, item::kLease, 0);
  End(f.item);
  return Status::OK();
}

Result<uint64_t> TxTable::Insert(std::span<const std::byte> key, std::span<const std::byte> value) {
  FARMEM_RETURN_IF_ERROR(CheckKey(key));
  FARMEM_RETURN_IF_ERROR(CheckValue(value));
  const uint32_t mb = MainBucket(key);
  std::lock_guard lk(StripeOf(mb));
  const uint64_t now = Now();
  const Found f = Search(mb, key, now);
  Slot slot = f.item;
  uint64_t version = 0;
  if (slot.words != nullptr) {
    if (LiveOf(Load(slot, item::kVword))) return Aborted("exists", "key is live");
    const uint64_t holder = Load(slot, item::kLock);
    if (LockLive(slot, now)) {
      return Aborted("locked", "insert reserved by transaction " + std::to_string(holder));
    }
  } else {
    FARMEM_ASSIGN_OR_RETURN(slot, FreeSlot(f));
  }
  version = VersionOf(Load(slot, item::kVword)) + 1;
  Begin(slot);
  StoreKey(slot, key);
  Store(slot, item::kVword, PackVword(version, true));
  StoreValue(slot, value);
  Store(slot, item::kLock, 0);
  Store(slot, item::kLease, 0);
  End(slot);
  return slot.offset;
}

Status TxTable::Remove(std::span<const std::byte> key) {
  FARMEM_RETURN_IF_ERROR(CheckKey(key));
  const uint32_t mb = MainBucket(key);
  std::lock_guard lk(StripeOf(mb));
  const uint64_t now = Now();
  const Found f = Search(mb, key, now);
  if (f.item.words == nullptr || !LiveOf(Load(f.item, item::kVword))) {
    return Status::NotFound("not found");
  }
  if (LockLive(f.item, now)) {
    return Aborted("locked", "held by transaction " + std::to_string(Load(f.item, item::kLock)));
  }
  Begin(f.item);
  Store(f.item, item::kVword, PackVword(VersionOf(Load(f.item, item::kVword)) + 1, false));
  Store(f.item, item::kLock, 0);
  Store(f.item, item::kLease, 0);
  End(f.item);
  return Status::OK();
}

void TxTable::NoteLocked(uint32_t main_bucket, const Slot& s) {
  std::lock_guard lk(lock_candidates_mu_);
  lock_candidates_.emplace_back(main_bucket, s.offset);
}

uint64_t TxTable::ReapExpired() {
  std::vector<std::pair<uint32_t, uint64_t>> batch;
  {
    std::lock_guard lk(lock_candidates_mu_);
    batch.swap(lock_candidates_);
  }
  // An item locked and released many times between two calls is listed once per lock taken
  // over a zero word; keep one entry each, so the list never outgrows the locked items plus
  // the locks taken in one reaper period.
  std::sort(batch.begin(), batch.end());
  batch.erase(std::unique(batch.begin(), batch.end()), batch.end());
  uint64_t freed = 0;
  size_t kept = 0;
  for (const auto& [mb, offset] : batch) {
    std::lock_guard lk(StripeOf(mb));
    const Slot slot{reinterpret_cast<uint64_t*>(region_ + offset), offset};
    if (Load(slot, item::kLock) == 0) continue;  // released since: nothing to reap
    if (Load(slot, item::kLease) <= Now()) {
      Release(slot);
      ++freed;
      continue;
    }
    batch[kept++] = {mb, offset};
  }
  batch.resize(kept);
  std::lock_guard lk(lock_candidates_mu_);
  lock_candidates_.insert(lock_candidates_.end(), batch.begin(), batch.end());
  return freed;
}

size_t TxTable::LockCandidatesForTesting() {
  std::lock_guard lk(lock_candidates_mu_);
  return lock_candidates_.size();
}

TxTableStats TxTable::Stats() {
  TxTableStats st;
  st.overflow_buckets_used = overflow_used_.load(std::memory_order_relaxed);
  const uint64_t item_words = ItemWords(g_);
  for (uint32_t mb = 0; mb < g_.num_buckets; ++mb) {
    std::lock_guard lk(StripeOf(mb));
    uint64_t bucket = mb;
    for (;;) {
      auto* b = reinterpret_cast<uint64_t*>(region_ + BucketOffset(g_, bucket));
      for (uint32_t s = 0; s < g_.width; ++s) {
        Slot slot{b + 1 + s * item_words, ItemOffset(g_, bucket, s)};
        if (LiveOf(Load(slot, item::kVword))) ++st.live_items;
        if (Load(slot, item::kLock) != 0) ++st.locked_items;
      }
      const uint64_t link = std::atomic_ref<uint64_t>(b[0]).load(std::memory_order_relaxed);
      if (link == 0) break;
      bucket = link - 1;
    }
  }
  return st;
}

}  // namespace farmem::tx
