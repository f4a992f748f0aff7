// Unit tests of TxTable: every owner-side operation and each of its errors, chains, reaping, what
// one-sided copies of the region show after each operation, and the three protections shown to
// matter (odd marking, lock check, lease check: each test runs with and without it).
// Single-threaded apart from the table's own locking.
#include "tx/engine/tx_table.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tx/engine/tx_test_util.h"

namespace farmem::tx {
namespace {

using testing::CopyBucket;
using testing::CopyItem;
using testing::K;
using testing::ManualClock;
using testing::V;
using testing::Word;

constexpr uint64_t kLease = 50'000'000;  // 50 ms

TxGeometry Geo() {
  TxGeometry g;
  g.key_size = 8;
  g.value_size = 32;
  g.width = 2;
  g.num_buckets = 16;
  g.overflow_buckets = 8;
  return g;
}

struct Fixture {
  ManualClock clock;
  std::unique_ptr<TxTable> t;
  explicit Fixture(TxGeometry g = Geo(), TxTableFaults faults = {},
                   std::function<void(uint64_t)> hook = nullptr) {
    TxTableOptions o;
    o.now_ns = clock.fn();
    o.faults = faults;
    o.mid_value_hook = std::move(hook);
    auto r = TxTable::Create(g, std::move(o));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    t = std::move(r).value();
  }
  // A one-sided ordered copy of the item at `offset`, checked for `key`.
  ItemCheck Check(uint64_t offset, uint64_t key, ItemView* v, std::vector<std::byte>* keep) {
    *keep = CopyItem(*t, offset);
    const auto k = K(key);
    return CheckItemCopy(t->geometry(), *keep, k, nullptr, v);
  }
};

TEST(TxTable, CreateMapsAPageAlignedRegionWithItsHeader) {
  Fixture f;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.t->region()) % kPageSize, 0u);
  EXPECT_EQ(f.t->region_bytes(), RegionBytes(Geo()));
  auto g = DecodeTableHeader(std::span(f.t->region(), kTableHeaderBytes));
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(g->value_size, 32u);
  TxGeometry bad = Geo();
  bad.width = 0;
  EXPECT_EQ(TxTable::Create(bad).status().code(), Code::kInvalidArgument);
}

TEST(TxTable, InsertLookupAndTheOneSidedCopyAgree) {
  Fixture f;
  auto off = f.t->Insert(K(1), V(0x1111, 32));
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_TRUE(IsItemOffset(f.t->geometry(), *off));
  std::vector<std::byte> value(32);
  auto r = f.t->Lookup(K(1), value);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->offset, *off);
  EXPECT_EQ(r->version, 1u);
  EXPECT_EQ(r->lock_txid, 0u);
  EXPECT_EQ(value, V(0x1111, 32));
  ItemView v;
  std::vector<std::byte> copy;
  ASSERT_EQ(f.Check(*off, 1, &v, &copy), ItemCheck::kOk);
  EXPECT_EQ(v.version, 1u);
  EXPECT_EQ(Word(v.value, 3), 0x1111u);
  // A short value is zero-padded.
  ASSERT_TRUE(f.t->Insert(K(2), V(7, 8)).ok());
  ASSERT_TRUE(f.t->Lookup(K(2), value).ok());
  EXPECT_EQ(Word(value, 0), 7u);
  EXPECT_EQ(Word(value, 1), 0u);
  // Lookup without a value buffer.
  EXPECT_TRUE(f.t->Lookup(K(2), {}).ok());
}

TEST(TxTable, ErrorsOfInsertLookupRemove) {
  Fixture f;
  ASSERT_TRUE(f.t->Insert(K(1), V(1, 32)).ok());
  auto dup = f.t->Insert(K(1), V(2, 32));
  EXPECT_EQ(dup.status().code(), Code::kAborted);
  EXPECT_EQ(AbortReasonOf(dup.status()), AbortReason::kExists);
  EXPECT_EQ(f.t->Lookup(K(9), {}).status().code(), Code::kNotFound);
  EXPECT_EQ(f.t->Remove(K(9)).code(), Code::kNotFound);
  EXPECT_EQ(f.t->Insert(std::vector<std::byte>(16), V(1, 32)).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(f.t->Insert(K(3), V(1, 40)).status().code(), Code::kInvalidArgument);
  std::vector<std::byte> small(16);
  EXPECT_EQ(f.t->Lookup(K(1), small).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(f.t->LockForUpdate(K(1), 0, kLease, {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(f.t->LockForUpdate(K(9), 5, kLease, {}).status().code(), Code::kNotFound);
  EXPECT_EQ(f.t->Unlock(K(9), 5).code(), Code::kNotFound);
  EXPECT_EQ(AbortReasonOf(Status::Aborted("something else")), AbortReason::kNone);
  EXPECT_EQ(AbortReasonOf(Status::OK()), AbortReason::kNone);
}

TEST(TxTable, LockForUpdateLocksAndALiveLeaseRefusesOthers) {
  Fixture f;
  auto off = f.t->Insert(K(1), V(5, 32));
  ASSERT_TRUE(off.ok());
  std::vector<std::byte> value(32);
  auto r = f.t->LockForUpdate(K(1), 100, kLease, value);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->lock_txid, 100u);
  EXPECT_EQ(r->version, 1u);
  EXPECT_EQ(Word(value, 0), 5u);
  auto other = f.t->LockForUpdate(K(1), 200, kLease, {});
  EXPECT_EQ(AbortReasonOf(other.status()), AbortReason::kLocked) << other.status().ToString();
  // The holder renews; the version did not move (locking is not a write).
  auto again = f.t->LockForUpdate(K(1), 100, kLease, {});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->version, 1u);
  ItemView v;
  std::vector<std::byte> copy;
  ASSERT_EQ(f.Check(*off, 1, &v, &copy), ItemCheck::kOk);
  EXPECT_EQ(v.lock_txid, 100u);
  EXPECT_EQ(v.version, 1u);
  // A lock held is not removable directly.
  EXPECT_EQ(AbortReasonOf(f.t->Remove(K(1))), AbortReason::kLocked);
}

TEST(TxTable, AnExpiredLeaseIsTakenOverAndTheOldHoldersCommitIsStale) {
  Fixture f;
  ASSERT_TRUE(f.t->Insert(K(1), V(5, 32)).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  f.clock.ns += kLease + 1;
  auto r = f.t->LockForUpdate(K(1), 200, kLease, {});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->lock_txid, 200u);
  auto stale = f.t->CommitWrite(K(1), 100, V(9, 32));
  EXPECT_EQ(AbortReasonOf(stale.status()), AbortReason::kStaleCommit) << stale.status().ToString();
  auto ok = f.t->CommitWrite(K(1), 200, V(6, 32));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  std::vector<std::byte> value(32);
  ASSERT_TRUE(f.t->Lookup(K(1), value).ok());
  EXPECT_EQ(Word(value, 0), 6u);
}

TEST(TxTable, CommitWriteInstallsBumpsTheVersionAndUnlocks) {
  Fixture f;
  auto off = f.t->Insert(K(1), V(5, 32));
  ASSERT_TRUE(off.ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  auto ver = f.t->CommitWrite(K(1), 100, V(6, 32));
  ASSERT_TRUE(ver.ok()) << ver.status().ToString();
  EXPECT_EQ(*ver, 2u);
  ItemView v;
  std::vector<std::byte> copy;
  ASSERT_EQ(f.Check(*off, 1, &v, &copy), ItemCheck::kOk);
  EXPECT_EQ(v.version, 2u);
  EXPECT_EQ(v.lock_txid, 0u);
  EXPECT_EQ(Word(v.value, 2), 6u);
  // A second commit of the same transaction: it holds no lock any more.
  EXPECT_EQ(AbortReasonOf(f.t->CommitWrite(K(1), 100, V(7, 32)).status()),
            AbortReason::kStaleCommit);
  // A commit by a transaction that never locked, and of an oversized value.
  EXPECT_EQ(AbortReasonOf(f.t->CommitWrite(K(1), 300, V(7, 32)).status()),
            AbortReason::kStaleCommit);
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 101, kLease, {}).ok());
  EXPECT_EQ(f.t->CommitWrite(K(1), 101, V(7, 48)).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(f.t->CommitWrite(K(1), 0, V(7, 32)).status().code(), Code::kInvalidArgument);
}

TEST(TxTable, ACommitAfterTheLeaseRanOutIsRefusedAndReleasesTheLock) {
  Fixture f;
  ASSERT_TRUE(f.t->Insert(K(1), V(5, 32)).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  f.clock.ns += kLease;  // expiry == now: expired
  auto r = f.t->CommitWrite(K(1), 100, V(6, 32));
  EXPECT_EQ(AbortReasonOf(r.status()), AbortReason::kStaleCommit) << r.status().ToString();
  std::vector<std::byte> value(32);
  auto l = f.t->Lookup(K(1), value);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->lock_txid, 0u);
  EXPECT_EQ(l->version, 1u);
  EXPECT_EQ(Word(value, 0), 5u);
}

TEST(TxTable, WithoutTheLeaseCheckAStaleCommitIsAccepted) {
  TxTableFaults faults;
  faults.no_lease_check = true;
  Fixture f(Geo(), faults);
  ASSERT_TRUE(f.t->Insert(K(1), V(5, 32)).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  f.clock.ns += 10 * kLease;
  // The protection removed: the dead-by-lease transaction installs its value.
  EXPECT_TRUE(f.t->CommitWrite(K(1), 100, V(6, 32)).ok());
}

TEST(TxTable, ValidateChecksVersionAndForeignLocks) {
  Fixture f;
  ASSERT_TRUE(f.t->Insert(K(1), V(5, 32)).ok());
  EXPECT_TRUE(f.t->Validate(K(1), 1, 0).ok());
  auto wrong = f.t->Validate(K(1), 0, 0);
  EXPECT_EQ(AbortReasonOf(wrong), AbortReason::kValidation) << wrong.ToString();
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  EXPECT_EQ(AbortReasonOf(f.t->Validate(K(1), 1, 0)), AbortReason::kValidation);
  EXPECT_EQ(AbortReasonOf(f.t->Validate(K(1), 1, 200)), AbortReason::kValidation);
  EXPECT_TRUE(f.t->Validate(K(1), 1, 100).ok());
  ASSERT_TRUE(f.t->CommitWrite(K(1), 100, V(6, 32)).ok());
  EXPECT_EQ(AbortReasonOf(f.t->Validate(K(1), 1, 0)), AbortReason::kValidation);
  EXPECT_TRUE(f.t->Validate(K(1), 2, 0).ok());
  ASSERT_TRUE(f.t->Remove(K(1)).ok());
  EXPECT_EQ(AbortReasonOf(f.t->Validate(K(1), 2, 0)), AbortReason::kValidation);
  EXPECT_EQ(AbortReasonOf(f.t->Validate(K(1), 3, 0)), AbortReason::kValidation);
}

TEST(TxTable, CommitAllInstallsEveryItemOrNone) {
  Fixture f;
  for (uint64_t k = 1; k <= 3; ++k) ASSERT_TRUE(f.t->Insert(K(k), V(k, 32)).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(2), 100, kLease, {}).ok());
  ASSERT_TRUE(f.t->LockForInsert(K(4), 100, kLease).ok());
  const auto k1 = K(1), k2 = K(2), k4 = K(4), v1 = V(11, 32), v4 = V(44, 32);
  const TxTable::TxWrite dup[] = {{k1, false, v1}, {k1, false, v1}};
  EXPECT_EQ(f.t->CommitAll(100, dup).code(), Code::kInvalidArgument);
  const TxTable::TxWrite big[] = {{k1, false, V(1, 40)}};
  EXPECT_EQ(f.t->CommitAll(100, big).code(), Code::kInvalidArgument);
  EXPECT_EQ(f.t->CommitAll(0, {}).code(), Code::kInvalidArgument);
  const TxTable::TxWrite all[] = {{k1, false, v1}, {k2, true, {}}, {k4, false, v4}};
  ASSERT_TRUE(f.t->CommitAll(100, all).ok());
  std::vector<std::byte> value(32);
  auto r1 = f.t->Lookup(K(1), value);
  ASSERT_TRUE(r1.ok());
  EXPECT_EQ(r1->version, 2u);
  EXPECT_EQ(r1->lock_txid, 0u);
  EXPECT_EQ(Word(value, 0), 11u);
  EXPECT_EQ(f.t->Lookup(K(2), {}).status().code(), Code::kNotFound);
  ASSERT_TRUE(f.t->Lookup(K(4), value).ok());
  EXPECT_EQ(Word(value, 0), 44u);
  EXPECT_EQ(f.t->Stats().locked_items, 0u);
}

TEST(TxTable, CommitAllWithOneStaleItemInstallsNothingAndReleasesTheLocks) {
  Fixture f;
  for (uint64_t k = 1; k <= 3; ++k) ASSERT_TRUE(f.t->Insert(K(k), V(k, 32)).ok());
  // Item 1 locked with a short lease, item 2 with a long one; item 3 never locked.
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(2), 100, 10 * kLease, {}).ok());
  f.clock.ns += kLease + 1;
  const auto k1 = K(1), k2 = K(2), k3 = K(3), v = V(9, 32);
  const TxTable::TxWrite two[] = {{k1, false, v}, {k2, false, v}};
  EXPECT_EQ(AbortReasonOf(f.t->CommitAll(100, two)), AbortReason::kStaleCommit);
  for (uint64_t k = 1; k <= 2; ++k) {
    std::vector<std::byte> value(32);
    auto r = f.t->Lookup(K(k), value);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->version, 1u) << k;
    EXPECT_EQ(r->lock_txid, 0u) << k;
    EXPECT_EQ(Word(value, 0), k);
  }
  ASSERT_TRUE(f.t->LockForUpdate(K(2), 200, kLease, {}).ok());
  const TxTable::TxWrite not_held[] = {{k2, false, v}, {k3, false, v}};
  EXPECT_EQ(AbortReasonOf(f.t->CommitAll(200, not_held)), AbortReason::kStaleCommit);
  EXPECT_EQ(f.t->Lookup(K(2), {})->version, 1u);
  EXPECT_EQ(f.t->Lookup(K(2), {})->lock_txid, 0u);
}

TEST(TxTable, UnlockLeavesNoTraceAndRefusesNonHolders) {
  Fixture f;
  auto off = f.t->Insert(K(1), V(5, 32));
  ASSERT_TRUE(off.ok());
  std::vector<std::byte> before = CopyItem(*f.t, *off);
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  auto st = f.t->Unlock(K(1), 200);
  EXPECT_EQ(AbortReasonOf(st), AbortReason::kNotLockHolder) << st.ToString();
  auto still = f.t->Lookup(K(1), {});
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->lock_txid, 100u);
  ASSERT_TRUE(f.t->Unlock(K(1), 100).ok());
  // Value, version, key, lock and lease as before the lock; only seq/tail moved (by 4).
  std::vector<std::byte> after = CopyItem(*f.t, *off);
  const TxGeometry& g = f.t->geometry();
  EXPECT_EQ(Word(after, 0), Word(before, 0) + 4);
  EXPECT_EQ(std::memcmp(after.data() + 8, before.data() + 8, TailByteInItem(g) - 8), 0);
  EXPECT_EQ(AbortReasonOf(f.t->Unlock(K(1), 100)), AbortReason::kNotLockHolder);
}

TEST(TxTable, LockForInsertReservesInvisiblyAndCommitMakesItLive) {
  Fixture f;
  ASSERT_TRUE(f.t->Insert(K(1), V(5, 32)).ok());
  EXPECT_EQ(AbortReasonOf(f.t->LockForInsert(K(1), 100, kLease).status()), AbortReason::kExists);
  auto off = f.t->LockForInsert(K(2), 100, kLease);
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(f.t->Lookup(K(2), {}).status().code(), Code::kNotFound);
  ItemView v;
  std::vector<std::byte> copy;
  EXPECT_EQ(f.Check(*off, 2, &v, &copy), ItemCheck::kEmpty);
  EXPECT_EQ(AbortReasonOf(f.t->LockForInsert(K(2), 200, kLease).status()), AbortReason::kLocked);
  EXPECT_EQ(AbortReasonOf(f.t->Insert(K(2), V(1, 32)).status()), AbortReason::kLocked);
  EXPECT_EQ(f.t->LockForUpdate(K(2), 200, kLease, {}).status().code(), Code::kNotFound);
  auto ver = f.t->CommitWrite(K(2), 100, V(8, 32));
  ASSERT_TRUE(ver.ok()) << ver.status().ToString();
  EXPECT_EQ(*ver, 1u);
  ASSERT_EQ(f.Check(*off, 2, &v, &copy), ItemCheck::kOk);
  EXPECT_EQ(v.lock_txid, 0u);
  EXPECT_EQ(Word(v.value, 0), 8u);
}

TEST(TxTable, AnAbortedOrExpiredInsertReservationFreesItsSlot) {
  TxGeometry g = Geo();
  g.num_buckets = 1;
  g.width = 1;
  g.overflow_buckets = 0;
  Fixture f(g);
  ASSERT_TRUE(f.t->LockForInsert(K(1), 100, kLease).ok());
  // The only slot is reserved: another key finds no room.
  EXPECT_EQ(f.t->Insert(K(2), V(1, 32)).status().code(), Code::kResourceExhausted);
  ASSERT_TRUE(f.t->Unlock(K(1), 100).ok());
  EXPECT_EQ(f.t->Lookup(K(1), {}).status().code(), Code::kNotFound);
  ASSERT_TRUE(f.t->LockForInsert(K(2), 200, kLease).ok());
  f.clock.ns += kLease + 1;
  // Expired: the same key is taken over by another transaction, and another key may reuse it.
  ASSERT_TRUE(f.t->LockForInsert(K(2), 300, kLease).ok());
  f.clock.ns += kLease + 1;
  auto off = f.t->Insert(K(3), V(3, 32));
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(AbortReasonOf(f.t->CommitWrite(K(2), 300, V(1, 32)).status()),
            AbortReason::kStaleCommit);
}

TEST(TxTable, CommitRemoveAndReinsertMakeStaleAddressesDetectable) {
  Fixture f;
  auto off = f.t->Insert(K(1), V(5, 32));
  ASSERT_TRUE(off.ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  ASSERT_TRUE(f.t->CommitRemove(K(1), 100).ok());
  EXPECT_EQ(f.t->Lookup(K(1), {}).status().code(), Code::kNotFound);
  ItemView v;
  std::vector<std::byte> copy;
  EXPECT_EQ(f.Check(*off, 1, &v, &copy), ItemCheck::kEmpty);
  EXPECT_EQ(AbortReasonOf(f.t->CommitRemove(K(1), 100)), AbortReason::kStaleCommit);
  // Reinsert the same key: the same slot (first free of the chain), a new version.
  auto again = f.t->Insert(K(1), V(6, 32));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *off);
  ASSERT_EQ(f.Check(*off, 1, &v, &copy), ItemCheck::kOk);
  EXPECT_EQ(v.version, 3u);                 // 1 insert, 2 remove, 3 reinsert
  EXPECT_FALSE(ValidatesAgainst(v, 1, 0));  // a read of the old item does not validate
  // Remove and insert another key in the slot: a cached address of key 1 sees another key.
  ASSERT_TRUE(f.t->Remove(K(1)).ok());
  uint64_t other = 2;
  for (;; ++other) {  // a key of the same main bucket
    if (PlaceKey(f.t->geometry(), HashKey(K(other), 0)).bucket ==
        PlaceKey(f.t->geometry(), HashKey(K(1), 0)).bucket) {
      break;
    }
  }
  auto off2 = f.t->Insert(K(other), V(7, 32));
  ASSERT_TRUE(off2.ok());
  ASSERT_EQ(*off2, *off);
  EXPECT_EQ(f.Check(*off, 1, &v, &copy), ItemCheck::kOtherKey);
  // CommitRemove of a key whose lease ran out is refused.
  ASSERT_TRUE(f.t->LockForUpdate(K(other), 100, kLease, {}).ok());
  f.clock.ns += kLease + 1;
  EXPECT_EQ(AbortReasonOf(f.t->CommitRemove(K(other), 100)), AbortReason::kStaleCommit);
  EXPECT_TRUE(f.t->Lookup(K(other), {}).ok());
}

TEST(TxTable, FullBucketsChainIntoOverflowUntilItRunsOut) {
  TxGeometry g = Geo();
  g.num_buckets = 1;
  g.width = 2;
  g.overflow_buckets = 2;
  Fixture f(g);
  std::vector<uint64_t> offs;
  for (uint64_t k = 0; k < 6; ++k) {
    auto off = f.t->Insert(K(k), V(k, 32));
    ASSERT_TRUE(off.ok()) << k << ": " << off.status().ToString();
    offs.push_back(*off);
  }
  EXPECT_EQ(f.t->Insert(K(6), V(6, 32)).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(f.t->LockForInsert(K(6), 1, kLease).status().code(), Code::kResourceExhausted);
  EXPECT_EQ(f.t->Stats().overflow_buckets_used, 2u);
  EXPECT_EQ(f.t->Stats().live_items, 6u);
  for (uint64_t k = 0; k < 6; ++k) {
    std::vector<std::byte> value(32);
    auto r = f.t->Lookup(K(k), value);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->offset, offs[k]);
    EXPECT_EQ(Word(value, 0), k);
  }
  // A one-sided reader walks the chain with the bucket links.
  uint64_t bucket = 0;
  int hops = 0;
  BucketMatch m;
  std::vector<std::byte> copy;  // m.view points into it
  for (;;) {
    copy = CopyBucket(*f.t, bucket);
    m = ParseBucketCopy(g, copy, K(5));
    if (m.kind != BucketMatch::kMiss || m.next_bucket == 0) break;
    bucket = m.next_bucket - 1;
    ++hops;
  }
  ASSERT_EQ(m.kind, BucketMatch::kFound);
  EXPECT_EQ(hops, 2);
  EXPECT_EQ(Word(m.view.value, 0), 5u);
  // Removing frees a slot in the middle of the chain; the next insert reuses it.
  ASSERT_TRUE(f.t->Remove(K(2)).ok());
  auto reuse = f.t->Insert(K(7), V(7, 32));
  ASSERT_TRUE(reuse.ok());
  EXPECT_EQ(*reuse, offs[2]);
}

TEST(TxTable, ReapExpiredFreesOnlyExpiredLocks) {
  Fixture f;
  ASSERT_TRUE(f.t->Insert(K(1), V(1, 32)).ok());
  ASSERT_TRUE(f.t->Insert(K(2), V(2, 32)).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  ASSERT_TRUE(f.t->LockForInsert(K(3), 100, kLease).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(2), 200, 10 * kLease, {}).ok());
  EXPECT_EQ(f.t->Stats().locked_items, 3u);
  EXPECT_EQ(f.t->ReapExpired(), 0u);
  f.clock.ns += kLease + 1;
  EXPECT_EQ(f.t->ReapExpired(), 2u);
  TxTableStats st = f.t->Stats();
  EXPECT_EQ(st.locked_items, 1u);
  EXPECT_EQ(st.live_items, 2u);
  EXPECT_EQ(f.t->Lookup(K(1), {})->lock_txid, 0u);
  EXPECT_EQ(f.t->Lookup(K(3), {}).status().code(), Code::kNotFound);
}

// The reaper visits the items locked since its last step, not the table: a hot item locked and
// unlocked many times is visited once, released items leave the list, and a takeover of an
// expired lock keeps the item listed (its new holder's lock is reaped in turn).
TEST(TxTable, ReaperVisitsOnlyLockedItemsAndItsListStaysBounded) {
  Fixture f;
  for (uint64_t k = 1; k <= 3; ++k) ASSERT_TRUE(f.t->Insert(K(k), V(k, 32)).ok());
  for (uint64_t txid = 1; txid <= 500; ++txid) {
    ASSERT_TRUE(f.t->LockForUpdate(K(1), txid, kLease, {}).ok());
    ASSERT_TRUE(f.t->Unlock(K(1), txid).ok());
  }
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 600, 10 * kLease, {}).ok());  // hot item, held
  ASSERT_TRUE(f.t->LockForUpdate(K(2), 601, kLease, {}).ok());       // will expire
  EXPECT_EQ(f.t->LockCandidatesForTesting(), 502u);
  EXPECT_EQ(f.t->ReapExpired(), 0u);
  EXPECT_EQ(f.t->LockCandidatesForTesting(), 2u) << "one entry per item still locked";
  f.clock.ns += kLease + 1;
  EXPECT_EQ(f.t->ReapExpired(), 1u);
  EXPECT_EQ(f.t->Lookup(K(2), {})->lock_txid, 0u);
  EXPECT_EQ(f.t->LockCandidatesForTesting(), 1u);
  // Takeover of an expired lock: the item is listed already, and the new lock is reaped later.
  ASSERT_TRUE(f.t->LockForUpdate(K(3), 700, kLease, {}).ok());
  f.clock.ns += kLease + 1;
  ASSERT_TRUE(f.t->LockForUpdate(K(3), 701, kLease, {}).ok());
  f.clock.ns += kLease + 1;
  EXPECT_EQ(f.t->ReapExpired(), 1u);
  EXPECT_EQ(f.t->Lookup(K(3), {})->lock_txid, 0u);
  ASSERT_TRUE(f.t->Unlock(K(1), 600).ok());
  EXPECT_EQ(f.t->ReapExpired(), 0u);
  EXPECT_EQ(f.t->LockCandidatesForTesting(), 0u);
  EXPECT_EQ(f.t->Stats().locked_items, 0u);
}

// The odd marking: an owner change paused in the middle of its value (the hook runs there) is
// copied by a one-sided reader. With the marking the copy is refused (busy); without it the
// copy passes the check with half old, half new value words.
ItemCheck CopyInTheMiddleOfACommit(bool marking, std::vector<std::byte>* value_seen) {
  TxTableFaults faults;
  faults.no_odd_marking = !marking;
  ItemCheck result = ItemCheck::kEmpty;
  Fixture* fp = nullptr;
  auto hook = [&](uint64_t offset) {
    auto copy = CopyItem(*fp->t, offset);
    ItemView v;
    const auto k = K(1);
    result = CheckItemCopy(fp->t->geometry(), copy, k, nullptr, &v);
    if (result == ItemCheck::kOk) value_seen->assign(v.value.begin(), v.value.end());
  };
  Fixture f(Geo(), faults, hook);
  fp = &f;
  EXPECT_TRUE(f.t->Insert(K(1), V(0xAAAA, 32)).ok());  // the hook runs here too
  EXPECT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  EXPECT_TRUE(f.t->CommitWrite(K(1), 100, V(0xBBBB, 32)).ok());
  return result;
}

TEST(TxTable, ACopyInTheMiddleOfACommitIsRefused) {
  std::vector<std::byte> seen;
  EXPECT_EQ(CopyInTheMiddleOfACommit(true, &seen), ItemCheck::kBusy);
}

TEST(TxTable, WithoutOddMarkingACopyInTheMiddleOfACommitIsAcceptedTorn) {
  std::vector<std::byte> seen;
  ASSERT_EQ(CopyInTheMiddleOfACommit(false, &seen), ItemCheck::kOk);
  // The accepted value mixes the two commits: the torn read the marking prevents.
  EXPECT_EQ(Word(seen, 0), 0xBBBBu);
  EXPECT_EQ(Word(seen, 3), 0xAAAAu);
}

// The lock check: two transactions read-for-update the same counter, each adds 1 and commits
// (A locks, B locks, A commits, B commits). Returns {commits that succeeded, final counter}.
std::pair<uint64_t, uint64_t> TwoIncrements(bool lock_check) {
  TxTableFaults faults;
  faults.no_lock_check = !lock_check;
  Fixture f(Geo(), faults);
  EXPECT_TRUE(f.t->Insert(K(1), V(0, 32)).ok());
  std::vector<std::byte> a(32), b(32);
  const bool a_ok = f.t->LockForUpdate(K(1), 100, kLease, a).ok();
  const bool b_ok = f.t->LockForUpdate(K(1), 200, kLease, b).ok();
  uint64_t committed = 0;
  if (a_ok && f.t->CommitWrite(K(1), 100, V(Word(a, 0) + 1, 32)).ok()) ++committed;
  if (b_ok && f.t->CommitWrite(K(1), 200, V(Word(b, 0) + 1, 32)).ok()) ++committed;
  std::vector<std::byte> end(32);
  EXPECT_TRUE(f.t->Lookup(K(1), end).ok());
  return {committed, Word(end, 0)};
}

TEST(TxTable, TheLockCheckPreventsALostUpdate) {
  const auto [committed, counter] = TwoIncrements(true);
  EXPECT_EQ(committed, 1u);  // B was refused ("locked")
  EXPECT_EQ(counter, committed);
}

TEST(TxTable, WithoutTheLockCheckAnUpdateIsLost) {
  const auto [committed, counter] = TwoIncrements(false);
  EXPECT_EQ(committed, 2u);
  EXPECT_EQ(counter, 1u);  // two increments committed, one visible: a lost update
}

TEST(TxTable, PrepareAllPinsTheLocksPastTheLeaseUntilCommitOrUnlock) {
  Fixture f;
  for (uint64_t k = 1; k <= 3; ++k) ASSERT_TRUE(f.t->Insert(K(k), V(k, 32)).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(2), 100, kLease, {}).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(3), 200, kLease, {}).ok());
  const auto k1 = K(1), k2 = K(2), k3 = K(3), v = V(9, 32);
  const TxTable::TxWrite two[] = {{k1, false, v}, {k2, false, v}};
  ASSERT_TRUE(f.t->PrepareAll(100, two).ok());
  const TxTable::TxWrite remove3[] = {{k3, true, {}}};
  ASSERT_TRUE(f.t->PrepareAll(200, remove3).ok());
  f.clock.ns += 100 * kLease;
  // Pinned: not reaped, not taken over, and the holder may still commit or unlock.
  EXPECT_EQ(f.t->ReapExpired(), 0u);
  EXPECT_EQ(AbortReasonOf(f.t->LockForUpdate(K(1), 300, kLease, {}).status()),
            AbortReason::kLocked);
  ASSERT_TRUE(f.t->CommitAll(100, two).ok());
  std::vector<std::byte> value(32);
  auto r = f.t->Lookup(K(2), value);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->version, 2u);
  EXPECT_EQ(Word(value, 0), 9u);
  ASSERT_TRUE(f.t->Unlock(K(3), 200).ok());  // the abort decision: nothing changes
  ASSERT_TRUE(f.t->Lookup(K(3), value).ok());
  EXPECT_EQ(Word(value, 0), 3u);
  EXPECT_EQ(f.t->Stats().locked_items, 0u);
}

TEST(TxTable, PrepareAllOfAStaleTransactionRefusesAndReleases) {
  Fixture f;
  for (uint64_t k = 1; k <= 2; ++k) ASSERT_TRUE(f.t->Insert(K(k), V(k, 32)).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, 10 * kLease, {}).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(2), 100, kLease, {}).ok());
  f.clock.ns += kLease;
  const auto k1 = K(1), k2 = K(2), v = V(9, 32);
  const TxTable::TxWrite two[] = {{k1, false, v}, {k2, false, v}};
  EXPECT_EQ(AbortReasonOf(f.t->PrepareAll(100, two)), AbortReason::kStaleCommit);
  EXPECT_EQ(f.t->Stats().locked_items, 0u);
  const TxTable::TxWrite dup[] = {{k1, false, v}, {k1, false, v}};
  EXPECT_EQ(f.t->PrepareAll(100, dup).code(), Code::kInvalidArgument);
}

TEST(TxTable, WithoutPinningAPreparedLockExpiresAndItsCommitIsRefused) {
  TxTableFaults faults;
  faults.no_prepare_pin = true;
  Fixture f(Geo(), faults);
  ASSERT_TRUE(f.t->Insert(K(1), V(1, 32)).ok());
  ASSERT_TRUE(f.t->LockForUpdate(K(1), 100, kLease, {}).ok());
  const auto k1 = K(1), v = V(9, 32);
  const TxTable::TxWrite one[] = {{k1, false, v}};
  ASSERT_TRUE(f.t->PrepareAll(100, one).ok());
  f.clock.ns += kLease;
  // The protection removed: the prepared lock is reaped, and the decided commit cannot install.
  EXPECT_EQ(f.t->ReapExpired(), 1u);
  EXPECT_EQ(AbortReasonOf(f.t->CommitAll(100, one)), AbortReason::kStaleCommit);
}

}  // namespace
}  // namespace farmem::tx
