// RegionStore when its metadata writes fail (the cluster store unreachable, docs/regions.md
// "Failures"): a failed change leaves the live namespace as it was, an empty unit whose record
// cannot be removed stays allocated, and records left by a delete cut short do not keep the
// namespace from loading. FARMEM_REGIONS_FAULT=no_meta_rollback|free_unit_first|keep_orphans
// removes one protection; the test guarding it fails. Main thread only.
#include <gtest/gtest.h>
#include <linux/falloc.h>
#include <sys/stat.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>

#include "regions/engine/region_store.h"
#include "regions/engine/region_store_test_util.h"

namespace farmem::regions {
namespace {

using testing::RandomBytes;
using testing::RegionEnv;

// The test's metadata store, whose writes (put, remove) fail with Unavailable while `down` is
// set, as the cluster store's do while etcd is unreachable; list still works (a store is opened
// only once it is back).
class FlakyMeta : public MetaStore {
 public:
  explicit FlakyMeta(MetaStore& real) : real_(real) {}
  Status put(std::string_view key, std::string_view value) override {
    if (down) return Status::Unavailable("test: the cluster store is down");
    return real_.put(key, value);
  }
  Status remove(std::string_view key) override {
    if (down) return Status::Unavailable("test: the cluster store is down");
    return real_.remove(key);
  }
  Result<std::vector<std::pair<std::string, std::string>>> list(std::string_view prefix) override {
    return real_.list(prefix);
  }
  std::atomic<bool> down{false};

 private:
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
  // The last close frees the region's chunk, which empties its unit, while the store is down.
  meta_->down = true;
  ASSERT_TRUE(store_->release(*h).ok());
  EXPECT_EQ(UnitRecords(), 1u);
  EXPECT_EQ(Allocated(), kStepBytes)
      << "the unit went back to farmemd while its record still names it (a later mount would "
         "use memory the server may give to someone else)";
  meta_->down = false;
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
  // Its chunk, freed in memory, goes to another region, whose record names it.
  auto g = store_->create(kRootIno, "g", 0644, who_);
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(store_->write(g->ino, 0, RandomBytes(kChunkBytes, 7)).ok());
  store_.reset();
  auto s = RegionStore::Open(*env_.node, *meta_, env_.options);
  ASSERT_TRUE(s.ok()) << "the namespace no longer loads: " << s.status().ToString();
  store_ = std::move(*s);
  EXPECT_EQ(store_->stats().orphans_dropped, 1u);
  auto k = store_->lookup(d->ino, "keep");
  ASSERT_TRUE(k.ok());
  std::vector<std::byte> back(3000);
  ASSERT_TRUE(store_->read(k->ino, 0, back).ok());
  EXPECT_EQ(back, data);
  EXPECT_TRUE(store_->lookup(kRootIno, "g").ok());
  EXPECT_EQ(ErrnoOf(store_->getattr(f->ino).status()), ENOENT);
  // The leftover record is gone from the store too.
  EXPECT_EQ(env_.meta->list("inode/" + std::to_string(f->ino))->size(), 0u);
}

}  // namespace
}  // namespace farmem::regions
