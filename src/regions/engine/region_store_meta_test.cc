// RegionStore when its metadata writes fail (the cluster store unreachable, docs/regions.md
// "Failures"): a failed change leaves the live namespace as it was, an empty unit whose record
// cannot be removed stays allocated, and records left by a delete cut short do not keep the
// namespace from loading (an unlinked file's record whose last close came during the outage is
// reclaimed at the next load, an older version's leftover is dropped); a rename cut short leaves
// one name, and a truncate whose tail zeroing fails leaves the old size and bytes.
// FARMEM_REGIONS_FAULT=no_meta_rollback|free_unit_first|
// keep_orphans|split_rename|no_truncate_rollback removes one protection; the test guarding it
// fails. Main thread only.
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>
#include <string>

#include "regions/engine/region_store.h"
#include "regions/engine/region_store_test_util.h"

namespace farmem::regions {
namespace {

using testing::RandomBytes;
using testing::RegionEnv;

// The test's metadata store, whose writes (put, remove, commit, bound puts) fail with
// Unavailable while `down` is set, as the cluster store's do while etcd is unreachable; reads
// still work (a store is opened only once it is back).
class FlakyMeta : public MetaStore {
 public:
  explicit FlakyMeta(MetaStore& real) : real_(real) {}
  Status join() override { return real_.join(); }
  std::string mount_id() const override { return real_.mount_id(); }
  Result<int64_t> put(std::string_view key, std::string_view value) override {
    if (Down({{std::string(key), std::string(value)}})) return Unavailable();
    return real_.put(key, value);
  }
  Result<int64_t> remove(std::string_view key) override {
    if (Down({{std::string(key), std::nullopt}})) return Unavailable();
    return real_.remove(key);
  }
  Result<int64_t> put_bound(std::string_view key, std::string_view value,
                            bool create_only) override {
    if (Down({{std::string(key), std::string(value)}})) return Unavailable();
    return real_.put_bound(key, value, create_only);
  }
  Result<int64_t> commit(const std::vector<MetaCheck>& checks,
                         const std::vector<MetaWrite>& writes) override {
    if (Down(writes)) return Unavailable();
    return real_.commit(checks, writes);
  }
  Result<std::optional<MetaKv>> get(std::string_view key) override { return real_.get(key); }
  Result<std::vector<MetaKv>> list(std::string_view prefix) override { return real_.list(prefix); }
  Result<int64_t> revision() override { return real_.revision(); }
  Result<std::unique_ptr<ClusterWatch>> watch(
      std::string_view prefix, int64_t from_revision,
      std::function<void(const MetaEvent&)> on_event,
      std::function<void(const Status&)> on_error) override {
    return real_.watch(prefix, from_revision, std::move(on_event), std::move(on_error));
  }
  Result<MetaLease> lease() override { return real_.lease(); }
  bool in_process() const override { return real_.in_process(); }

  std::atomic<bool> down{false};
  // >= 0: that many more writes (put, remove, commit or bound put: one call each) go through,
  // then the store is down (a change cut short after its first N writes).
  std::atomic<int> writes_left{-1};
  // Non-empty: only writes that remove a key starting with this fail (while `down` is clear).
  std::string refuse_removal_of;

 private:
  static Status Unavailable() { return Status::Unavailable("test: the cluster store is down"); }
  bool Down(const std::vector<MetaWrite>& writes) {
    if (!refuse_removal_of.empty())
      for (const MetaWrite& w : writes)
        if (!w.value && w.key.starts_with(refuse_removal_of)) return true;
    if (down) return true;
    if (writes_left.load() < 0) return false;
    if (writes_left.load() == 0) return true;
    --writes_left;
    return false;
  }
  MetaStore& real_;
};

class RegionStoreMetaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::FaultName().empty())
      std::printf("[ fault    ] FARMEM_REGIONS_FAULT=%s\n", testing::FaultName().c_str());
    ASSERT_TRUE(env_.Start(1, 16ull << 20, /*persistent_units=*/true).ok());
    meta_ = std::make_unique<FlakyMeta>(*env_.meta);
    Reopen();
  }
  void Reopen() {
    store_.reset();
    auto s = RegionStore::Open(*env_.node, *meta_, env_.options);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  uint64_t Allocated() {
    auto j = nlohmann::json::parse(env_.servers[0]->stats_json());
    return j["memory"]["allocated_bytes"].get<uint64_t>();
  }
  size_t UnitRecords() {
    auto l = env_.meta->list("unit/");
    EXPECT_TRUE(l.ok());
    return l.ok() ? l->size() : 0;
  }

  RegionEnv env_;
  std::unique_ptr<FlakyMeta> meta_;
  std::unique_ptr<RegionStore> store_;
  Caller who_{1000, 1000, 0};
};

TEST_F(RegionStoreMetaTest, FailedMetadataWritesChangeNothing) {
  auto f = store_->create(kRootIno, "f", 0600, who_);
  ASSERT_TRUE(f.ok());
  auto data = RandomBytes(1000, 11);
  ASSERT_TRUE(store_->write(f->ino, 0, data).ok());
  auto p = store_->create(kRootIno, "p", 0644, who_);
  ASSERT_TRUE(p.ok());
  auto two = RandomBytes(2 * kChunkBytes, 2);
  ASSERT_TRUE(store_->write(p->ino, 0, two).ok());
  meta_->down = true;
  EXPECT_EQ(ErrnoOf(store_->fallocate(p->ino, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                                      kChunkBytes)),
            EIO);
  EXPECT_EQ(ErrnoOf(store_->fallocate(p->ino, 0, 0, 3 * kChunkBytes)), EIO);
  SetAttrRequest chmod;
  chmod.mode = 0644;
  chmod.uid = 7;
  EXPECT_EQ(ErrnoOf(store_->setattr(f->ino, chmod).status()), EIO);
  SetAttrRequest shrink;
  shrink.size = 10;
  EXPECT_EQ(ErrnoOf(store_->setattr(f->ino, shrink).status()), EIO);
  EXPECT_EQ(ErrnoOf(store_->setxattr(f->ino, "user.region.onewriter", "1")), EIO);
  EXPECT_EQ(ErrnoOf(store_->write(f->ino, 1000, RandomBytes(500, 2))), EIO);
  EXPECT_EQ(ErrnoOf(store_->create(kRootIno, "g", 0644, who_).status()), EIO);
  EXPECT_EQ(ErrnoOf(store_->unlink(kRootIno, "f")), EIO);
  auto a = store_->getattr(f->ino);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->mode, S_IFREG | 0600u) << "a chmod that failed changed the mode";
  EXPECT_EQ(a->uid, 1000u) << "a chown that failed changed the owner";
  EXPECT_EQ(a->size, 1000u) << "a truncate or write that failed changed the size";
  EXPECT_EQ(*store_->getxattr(f->ino, "user.region.onewriter"), "0")
      << "a setxattr that failed changed the attribute";
  EXPECT_EQ(ErrnoOf(store_->lookup(kRootIno, "g").status()), ENOENT);
  EXPECT_TRUE(store_->lookup(kRootIno, "f").ok());
  std::vector<std::byte> back(1000);
  auto n = store_->read(f->ino, 0, back);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(back, data) << "a truncate that failed cut the data";
  std::vector<std::byte> back2(2 * kChunkBytes);
  ASSERT_TRUE(store_->read(p->ino, 0, back2).ok());
  EXPECT_EQ(back2, two) << "a hole punch that failed cut the data";
  EXPECT_EQ(store_->getattr(p->ino)->size, 2 * kChunkBytes)
      << "a fallocate that failed changed the size";
  // Back again: what is live is what a new store loads.
  meta_->down = false;
  Reopen();
  auto b = store_->getattr(f->ino);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->mode, S_IFREG | 0600u);
  EXPECT_EQ(b->size, 1000u);
}

TEST_F(RegionStoreMetaTest, AnEmptyUnitWhoseRecordCannotGoStaysAllocated) {
  auto f = store_->create(kRootIno, "f", 0644, who_);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(store_->write(f->ino, 0, RandomBytes(4096, 3)).ok());
  auto h = store_->open(f->ino, false);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(store_->unlink(kRootIno, "f").ok());
  EXPECT_EQ(Allocated(), kStepBytes);
  // The last close frees the region's chunk, which empties its unit, while the store refuses
  // to remove unit records (as if it went away right then).
  meta_->refuse_removal_of = "unit/";
  ASSERT_TRUE(store_->release(*h).ok());
  EXPECT_EQ(store_->stats().chunks_in_use, 0u) << "the unlinked file's chunk was not freed";
  EXPECT_EQ(UnitRecords(), 1u);
  EXPECT_EQ(Allocated(), kStepBytes)
      << "the unit went back to farmemd while its record still names it (a later mount would "
         "use memory the server may give to someone else)";
  meta_->refuse_removal_of.clear();
  // The unit is used again (no second ALLOC_RAW), and a new store loads it.
  auto g = store_->create(kRootIno, "g", 0644, who_);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(store_->write(g->ino, 0, RandomBytes(4096, 4)).ok());
  EXPECT_EQ(Allocated(), kStepBytes);
  Reopen();
}

TEST_F(RegionStoreMetaTest, RecordsOfADeleteCutShortDoNotKeepTheNamespaceFromLoading) {
  auto d = store_->mkdir(kRootIno, "d", 0755, who_);
  ASSERT_TRUE(d.ok());
  auto keep = store_->create(d->ino, "keep", 0644, who_);
  ASSERT_TRUE(keep.ok());
  auto data = RandomBytes(3000, 5);
  ASSERT_TRUE(store_->write(keep->ino, 0, data).ok());
  auto f = store_->create(kRootIno, "f", 0644, who_);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(store_->write(f->ino, 0, RandomBytes(kChunkBytes, 6)).ok());
  auto h = store_->open(f->ino, false);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(store_->unlink(kRootIno, "f").ok());  // its name is gone from the store
  meta_->down = true;
  ASSERT_TRUE(store_->release(*h).ok());  // its record cannot be removed now
  meta_->down = false;
  auto g = store_->create(kRootIno, "g", 0644, who_);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(store_->write(g->ino, 0, RandomBytes(kChunkBytes, 7)).ok());
  // And the record an older version left when its delete was cut short: a name-less inode
  // (nlink 1) whose chunk was freed in memory and went to another region (g), whose record names
  // it.
  auto grec = DecodeInode(env_.meta->get("inode/" + std::to_string(g->ino))->value().value);
  ASSERT_TRUE(grec.ok());
  InodeRecord legacy = *grec;
  legacy.h.ino = 900000;
  ASSERT_TRUE(env_.meta->put("inode/900000", EncodeInode(legacy)).ok());
  store_.reset();
  auto s = RegionStore::Open(*env_.node, *meta_, env_.options);
  ASSERT_TRUE(s.ok()) << "the namespace no longer loads: " << s.status().ToString();
  store_ = std::move(*s);
  EXPECT_EQ(store_->stats().orphans_dropped, 2u);
  auto k = store_->lookup(d->ino, "keep");
  ASSERT_TRUE(k.ok());
  std::vector<std::byte> back(3000);
  ASSERT_TRUE(store_->read(k->ino, 0, back).ok());
  EXPECT_EQ(back, data);
  EXPECT_TRUE(store_->lookup(kRootIno, "g").ok());
  EXPECT_EQ(store_->stats().chunks_in_use, 2u) << "keep and g hold one chunk each";
  EXPECT_EQ(ErrnoOf(store_->getattr(f->ino).status()), ENOENT);
  // The leftover records are gone from the store too.
  EXPECT_EQ(env_.meta->list("inode/" + std::to_string(f->ino))->size(), 0u);
  EXPECT_EQ(env_.meta->list("inode/900000")->size(), 0u);
}

TEST_F(RegionStoreMetaTest, ARenameCutShortLeavesExactlyOneName) {
  auto d = store_->mkdir(kRootIno, "d", 0755, who_);
  ASSERT_TRUE(d.ok());
  // For every point a rename can be cut at (its first k metadata writes go through), into
  // another directory and over an existing file: the live store and a reload both see the file
  // under exactly one of its two names, with its bytes.
  int renamed = 0;
  for (int k = 0; k < 8; ++k) {
    for (bool over : {false, true}) {
      const std::string a = "a" + std::to_string(k) + (over ? "o" : "");
      const std::string b = "b" + std::to_string(k) + (over ? "o" : "");
      auto f = store_->create(kRootIno, a, 0644, who_);
      ASSERT_TRUE(f.ok());
      auto data = RandomBytes(2000, static_cast<uint32_t>(k));
      ASSERT_TRUE(store_->write(f->ino, 0, data).ok());
      uint64_t target_dir = over ? kRootIno : d->ino;
      if (over) {
        auto t = store_->create(target_dir, b, 0644, who_);
        ASSERT_TRUE(t.ok());
        ASSERT_TRUE(store_->write(t->ino, 0, RandomBytes(100, 99)).ok());
      }
      meta_->writes_left = k;
      Status r = store_->rename(kRootIno, a, target_dir, b, false);
      meta_->writes_left = -1;
      if (r.ok()) ++renamed;
      for (int pass = 0; pass < 2; ++pass) {
        if (pass == 1) {
          store_.reset();
          auto s = RegionStore::Open(*env_.node, *meta_, env_.options);
          ASSERT_TRUE(s.ok()) << "cut after " << k << " write(s): the namespace no longer loads: "
                              << s.status().ToString();
          store_ = std::move(*s);
        }
        auto at_a = store_->lookup(kRootIno, a);
        auto at_b = store_->lookup(target_dir, b);
        bool a_is_f = at_a.ok() && at_a->ino == f->ino;
        bool b_is_f = at_b.ok() && at_b->ino == f->ino;
        EXPECT_NE(a_is_f, b_is_f) << "cut after " << k << " write(s), "
                                  << (pass ? "reloaded" : "live") << ": the file has "
                                  << (a_is_f ? "two names" : "no name");
        EXPECT_EQ(b_is_f, r.ok()) << "the rename's result and the namespace disagree";
        std::vector<std::byte> back(2000);
        auto n = store_->read(f->ino, 0, back);
        ASSERT_TRUE(n.ok()) << n.status().ToString();
        EXPECT_EQ(back, data);
      }
    }
  }
  EXPECT_GT(renamed, 0) << "no rename went through";
}

TEST_F(RegionStoreMetaTest, ATruncateWhoseTailZeroingFailsChangesNothing) {
  bool fail = false;
  env_.options.fail_step = [&fail](std::string_view step) {
    return fail && step == "truncate_tail";
  };
  Reopen();
  auto f = store_->create(kRootIno, "f", 0644, who_);
  ASSERT_TRUE(f.ok());
  auto data = RandomBytes(kChunkBytes + 3000, 21);
  ASSERT_TRUE(store_->write(f->ino, 0, data).ok());
  SetAttrRequest shrink;
  shrink.size = 1000;
  fail = true;
  EXPECT_EQ(ErrnoOf(store_->setattr(f->ino, shrink).status()), EIO);
  fail = false;
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) Reopen();
    auto a = store_->getattr(f->ino);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(a->size, data.size())
        << (pass ? "reloaded" : "live") << ": a truncate that reported EIO changed the size";
    EXPECT_EQ(a->chunks, 2u) << "a truncate that reported EIO cut chunks";
    std::vector<std::byte> back(data.size());
    auto n = store_->read(f->ino, 0, back);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(back, data) << "a truncate that reported EIO changed the bytes";
  }
  // Without the failure it goes through, and the cut bytes read zero after a grow.
  ASSERT_TRUE(store_->setattr(f->ino, shrink).ok());
  SetAttrRequest grow;
  grow.size = 4000;
  ASSERT_TRUE(store_->setattr(f->ino, grow).ok());
  std::vector<std::byte> back(4000);
  ASSERT_TRUE(store_->read(f->ino, 0, back).ok());
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + 1000, data.begin()));
  EXPECT_TRUE(
      std::all_of(back.begin() + 1000, back.end(), [](std::byte x) { return x == std::byte{0}; }));
}

}  // namespace
}  // namespace farmem::regions
