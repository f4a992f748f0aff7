// Two RegionStores sharing one namespace, as two mounts do (docs/regions.md "Several mounts"):
// each its own membership of one memory:// cluster store, both on the same farmemd. One mount's
// changes are seen by the other, disjoint writers end with the exact union, racing exclusive
// creates have one winner, ONEWRITER holds across mounts, a file one mount unlinks while the
// other reads it keeps its bytes until the other closes it (its memory returns only then), an
// open sees what the other mount wrote before, regions whose owner's host has no mount left are
// reaped, FIXVADDR addresses are unique across mounts, and a stress run of both mounts never reads
// another region's bytes.
// FARMEM_REGIONS_FAULT=no_write_cas|no_unit_owner|no_create_cas|no_cluster_onewriter|
// no_open_check|no_open_sync|no_hostless_reap|no_vaddr_cas removes one protection; the test
// guarding it fails.
// Threads: the test's, and the writer/reader threads it starts.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "regions/engine/region_store.h"
#include "regions/engine/region_store_test_util.h"

namespace farmem::regions {
namespace {

using namespace std::chrono_literals;
using testing::RandomBytes;

// A gate a test closes to hold a store's watch (RegionStoreOptions::before_apply): while closed,
// that store sees no change the other mount makes (except through its own reads of the store).
class Gate {
 public:
  void Close() {
    std::lock_guard lk(mu_);
    open_ = false;
  }
  void Open() {
    {
      std::lock_guard lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void Pass() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
};

class MultiMountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::FaultName().empty())
      std::printf("[ fault    ] FARMEM_REGIONS_FAULT=%s\n", testing::FaultName().c_str());
    ASSERT_TRUE(env_.Start(1, 24ull << 20, /*persistent_units=*/true).ok());
    url_ = env_.cluster->options().url;
    for (int i = 0; i < 2; ++i) ASSERT_NO_FATAL_FAILURE(OpenMount(i, i == 0 ? "host-a" : "host-b"));
  }
  void TearDown() override {
    gate_b_.Open();
    for (auto& m : mounts_) m = Mount{};
  }
  // Store i: its own Cluster (a membership of its own) on the shared memory:// store.
  void OpenMount(int i, const std::string& host) {
    Mount& m = mounts_[i];
    ClusterOptions co;
    co.url = url_;
    auto c = Cluster::Open(co);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    m.cluster = std::move(*c);
    m.meta = NewClusterMetaStore(*m.cluster, "regions/", "mount-" + std::to_string(i));
    RegionStoreOptions o = env_.options;
    o.host_id = host;
    if (i == 1) o.before_apply = [this] { gate_b_.Pass(); };
    auto s = RegionStore::Open(*env_.node, *m.meta, o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    m.store = std::move(*s);
  }
  RegionStore& A() { return *mounts_[0].store; }
  RegionStore& B() { return *mounts_[1].store; }
  uint64_t Allocated() {
    auto j = nlohmann::json::parse(env_.servers[0]->stats_json());
    return j["memory"]["allocated_bytes"].get<uint64_t>();
  }
  // Polls `ok` for up to 10 s (a store applies the other's changes from its watch, a moment
  // after they were made).
  static bool Eventually(const std::function<bool()>& ok) {
    for (int i = 0; i < 1000; ++i) {
      if (ok()) return true;
      std::this_thread::sleep_for(10ms);
    }
    return ok();
  }
  std::vector<std::byte> Read(RegionStore& s, uint64_t ino, size_t n) {
    return testing::ReadBytes(s, ino, 0, n);
  }

  struct Mount {
    std::unique_ptr<Cluster> cluster;
    std::unique_ptr<MetaStore> meta;
    std::unique_ptr<RegionStore> store;
    Mount& operator=(Mount&& o) noexcept {
      store.reset();
      meta.reset();
      cluster.reset();
      store = std::move(o.store);
      meta = std::move(o.meta);
      cluster = std::move(o.cluster);
      return *this;
    }
  };
  testing::RegionEnv env_;
  std::string url_;
  Mount mounts_[2];
  Gate gate_b_;
  Caller who_{0, 0, 0};
};

TEST_F(MultiMountTest, ChangesOfOneMountAreSeenByTheOther) {
  auto d = A().mkdir(kRootIno, "d", 0755, who_);
  ASSERT_TRUE(d.ok());
  auto f = A().create(d->ino, "f", 0644, who_);
  ASSERT_TRUE(f.ok());
  auto data = RandomBytes(3 * kChunkBytes + 5, 1);
  ASSERT_TRUE(A().write(f->ino, 0, data).ok());
  // B looks the names up (in the store when its watch has not brought them yet) and reads.
  auto bd = B().lookup(kRootIno, "d");
  ASSERT_TRUE(bd.ok()) << bd.status().ToString();
  auto bf = B().lookup(bd->ino, "f");
  ASSERT_TRUE(bf.ok()) << bf.status().ToString();
  auto h = B().open(bf->ino, false);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(Read(B(), bf->ino, data.size() + 10), data);
  ASSERT_TRUE(B().release(*h).ok());
  // A renames, truncates, makes a directory; B sees each.
  ASSERT_TRUE(A().rename(d->ino, "f", kRootIno, "g", false).ok());
  EXPECT_TRUE(Eventually([&] { return ErrnoOf(B().lookup(d->ino, "f").status()) == ENOENT; }))
      << "B still has the old name";
  EXPECT_TRUE(B().lookup(kRootIno, "g").ok());
  ASSERT_TRUE(A().setattr(f->ino, SetAttrRequest{.size = 1000}).ok());
  EXPECT_TRUE(Eventually([&] {
    auto a = B().getattr(f->ino);
    return a.ok() && a->size == 1000 && a->chunks == 1;
  })) << "B did not see the truncate";
  ASSERT_TRUE(A().mkdir(d->ino, "sub", 0700, who_).ok());
  EXPECT_TRUE(Eventually([&] {
    auto l = B().readdir(d->ino);
    return l.ok() && l->size() == 3 && (*l)[2].name == "sub";
  })) << "B did not see the mkdir";
  // B removes; A sees it.
  ASSERT_TRUE(B().rmdir(d->ino, "sub").ok());
  ASSERT_TRUE(B().unlink(kRootIno, "g").ok());
  EXPECT_TRUE(Eventually([&] {
    return ErrnoOf(A().lookup(kRootIno, "g").status()) == ENOENT &&
           ErrnoOf(A().lookup(d->ino, "sub").status()) == ENOENT;
  })) << "A still sees what B removed";
  EXPECT_TRUE(Eventually([&] { return A().stats().chunks_in_use == 0; }))
      << "the unlinked file's chunk was not freed";
}

TEST_F(MultiMountTest, DisjointWritersSeeTheExactUnion) {
  // One file written by both at once in 48 KiB slices (three per 128 KiB chunk, so the two often
  // race for the same hole), and a file of each. Twice: with B's watch held (B learns what A
  // recorded only when a commit of its own finds the record changed, as a mount whose watch lags
  // would: the compare-and-set decides), and with it running (B's mirror often has A's chunk for
  // a hole B allocated for too by the time B records it: the check of the holes decides).
  for (bool held : {true, false}) {
    SCOPED_TRACE(held ? "B's watch held" : "B's watch running");
    const std::string round = held ? "1" : "2";
    auto f = A().create(kRootIno, "shared" + round, 0644, who_);
    auto fa = A().create(kRootIno, "a" + round, 0644, who_);
    auto fb = B().create(kRootIno, "b" + round, 0644, who_);
    ASSERT_TRUE(f.ok() && fa.ok() && fb.ok());
    constexpr size_t kSlice = 48 * 1024, kSlices = 128;
    // The slices, then two chunks only A writes (in chunks only A allocates).
    std::vector<std::byte> model(kSlice * kSlices + 2 * kChunkBytes, std::byte{0xaa});
    for (size_t i = 0; i < kSlices; ++i)
      std::fill(model.begin() + static_cast<ptrdiff_t>(i * kSlice),
                model.begin() + static_cast<ptrdiff_t>((i + 1) * kSlice),
                static_cast<std::byte>(i + 1));
    auto own_a = RandomBytes(5 * kChunkBytes, 2), own_b = RandomBytes(5 * kChunkBytes, 3);
    std::atomic<int> errors{0};
    // Both open before either writes (an open reads the record from the store).
    auto ha = A().open(f->ino, true), hb = B().open(f->ino, true);
    ASSERT_TRUE(ha.ok() && hb.ok());
    auto writer = [&](RegionStore& s, size_t parity, uint64_t own,
                      const std::vector<std::byte>& mine) {
      for (size_t i = parity; i < kSlices; i += 2) {
        std::span<const std::byte> slice(model.data() + i * kSlice, kSlice);
        if (!s.write(f->ino, i * kSlice, slice).ok()) errors++;
        size_t k = i / 2 % 5;
        if (!s.write(own, k * kChunkBytes, std::span(mine).subspan(k * kChunkBytes, kChunkBytes))
                 .ok())
          errors++;
      }
      if (parity == 0 &&
          !s.write(f->ino, kSlices * kSlice, std::span(model).subspan(kSlices * kSlice)).ok())
        errors++;
    };
    if (held) gate_b_.Close();
    std::thread ta(writer, std::ref(A()), 0, fa->ino, std::cref(own_a));
    std::thread tb(writer, std::ref(B()), 1, fb->ino, std::cref(own_b));
    ta.join();
    tb.join();
    // B writes its last slice once more after A is done: whatever B records now must keep
    // everything A recorded.
    const size_t last = kSlices - 1;
    ASSERT_TRUE(
        B().write(f->ino, last * kSlice, std::span(model).subspan(last * kSlice, kSlice)).ok());
    ASSERT_TRUE(A().release(*ha).ok() && B().release(*hb).ok());
    gate_b_.Open();
    ASSERT_EQ(errors.load(), 0);
    for (RegionStore* s : {&A(), &B()}) {
      auto h = s->open(f->ino, false);  // an open reads the record from the store
      ASSERT_TRUE(h.ok());
      EXPECT_EQ(Read(*s, f->ino, model.size() + 1), model)
          << (s == &A() ? "A" : "B")
          << ": the shared file is not the union of both writers' slices";
      ASSERT_TRUE(s->release(*h).ok());
      auto oa = s->open(fa->ino, false), ob = s->open(fb->ino, false);
      ASSERT_TRUE(oa.ok() && ob.ok());
      EXPECT_EQ(Read(*s, fa->ino, own_a.size()), own_a) << "A's own file";
      EXPECT_EQ(Read(*s, fb->ino, own_b.size()), own_b) << "B's own file";
      ASSERT_TRUE(s->release(*oa).ok() && s->release(*ob).ok());
    }
  }
}

TEST_F(MultiMountTest, RacingExclusiveCreatesHaveOneWinner) {
  // B's watch held: B never learns of A's names except from the store itself, as a mount whose
  // watch lags would; then both create the same names at once (a real race).
  gate_b_.Close();
  int both = 0;
  for (int i = 0; i < 20; ++i) {
    std::string n = "held" + std::to_string(i);
    bool a = A().create(kRootIno, n, 0644, who_).ok();
    auto b = B().create(kRootIno, n, 0644, who_);
    if (a && b.ok()) ++both;
    EXPECT_TRUE(a);
    if (!b.ok()) {
      EXPECT_EQ(ErrnoOf(b.status()), EEXIST) << b.status().ToString();
    }
  }
  EXPECT_EQ(both, 0) << "both mounts created the same name (" << both << " of 20)";
  gate_b_.Open();
  constexpr int kNames = 40;
  std::atomic<int> wins[kNames] = {};
  std::atomic<int> other_errors{0};
  auto racer = [&](RegionStore& s) {
    for (int i = 0; i < kNames; ++i) {
      auto r = s.create(kRootIno, "race" + std::to_string(i), 0644, who_);
      if (r.ok())
        wins[i]++;
      else if (ErrnoOf(r.status()) != EEXIST)
        other_errors++;
    }
  };
  std::thread ta(racer, std::ref(A())), tb(racer, std::ref(B()));
  ta.join();
  tb.join();
  EXPECT_EQ(other_errors.load(), 0);
  for (int i = 0; i < kNames; ++i) EXPECT_EQ(wins[i].load(), 1) << "race" << i;
}

// FIXVADDR across mounts: with B's watch held (B does not know A's regions), A and B each make
// FIXVADDR regions; no two share an address, and B sees A's region at A's address.
TEST_F(MultiMountTest, FixvaddrAddressesAreUniqueAcrossMounts) {
  auto da = A().mkdir(kRootIno, "fa", 0755, who_);
  ASSERT_TRUE(da.ok());
  ASSERT_TRUE(A().setxattr(da->ino, "user.region.fixvaddr", "1").ok());
  ASSERT_TRUE(Eventually([&] { return B().lookup(kRootIno, "fa").ok(); }));
  gate_b_.Close();
  std::set<std::string> seen;
  std::vector<std::pair<RegionStore*, uint64_t>> made;
  for (int i = 0; i < 4; ++i)
    for (RegionStore* s : {&A(), &B()}) {
      auto f = s->create(da->ino, (s == &A() ? "a" : "b") + std::to_string(i), 0644, who_);
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      auto v = s->getxattr(f->ino, "user.region.vaddr");
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      EXPECT_TRUE(seen.insert(*v).second) << "two regions got the fixed address " << *v;
      made.emplace_back(s, f->ino);
    }
  gate_b_.Open();
  auto a0 = A().lookup(da->ino, "a0");
  ASSERT_TRUE(a0.ok());
  EXPECT_TRUE(Eventually([&] {
    auto va = A().getxattr(a0->ino, "user.region.vaddr");
    auto vb = B().getxattr(a0->ino, "user.region.vaddr");
    return va.ok() && vb.ok() && *va == *vb;
  })) << "B does not see A's region at A's address";
}

TEST_F(MultiMountTest, OneWriterHoldsAcrossMounts) {
  auto dir = A().mkdir(kRootIno, "solo", 0755, who_);
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(A().setxattr(dir->ino, "user.region.onewriter", "1").ok());
  auto f = A().create(dir->ino, "f", 0644, who_);
  ASSERT_TRUE(f.ok());
  auto wa = A().open(f->ino, true);
  ASSERT_TRUE(wa.ok());
  auto wb = B().open(f->ino, true);
  EXPECT_FALSE(wb.ok()) << "a second writer got in through the other mount";
  if (!wb.ok()) {
    EXPECT_EQ(ErrnoOf(wb.status()), EBUSY) << wb.status().ToString();
  }
  if (wb.ok()) {
    ASSERT_TRUE(B().release(*wb).ok());
  }
  auto rb = B().open(f->ino, false);
  EXPECT_TRUE(rb.ok()) << "a reader was refused";
  ASSERT_TRUE(A().release(*wa).ok());
  auto wb2 = B().open(f->ino, true);
  ASSERT_TRUE(wb2.ok()) << "the writer went, but the other mount still gets EBUSY";
  auto wa2 = A().open(f->ino, true);
  EXPECT_EQ(ErrnoOf(wa2.status()), EBUSY);
  ASSERT_TRUE(B().release(*wb2).ok());
  if (rb.ok()) {
    ASSERT_TRUE(B().release(*rb).ok());
  }
}

TEST_F(MultiMountTest, AFileUnlinkedInOneMountKeepsItsBytesForTheOtherUntilItCloses) {
  auto f = A().create(kRootIno, "f", 0644, who_);
  ASSERT_TRUE(f.ok());
  auto data = RandomBytes(4 * kChunkBytes, 4);
  ASSERT_TRUE(A().write(f->ino, 0, data).ok());
  auto bf = B().lookup(kRootIno, "f");
  ASSERT_TRUE(bf.ok());
  auto h = B().open(bf->ino, false);
  ASSERT_TRUE(h.ok());
  const uint64_t allocated = Allocated();
  ASSERT_TRUE(A().unlink(kRootIno, "f").ok());
  EXPECT_EQ(A().stats().chunks_in_use, 4u) << "A freed chunks B has open";
  // A fills new regions with a tag while B keeps reading: B must see f's bytes only.
  std::vector<std::byte> tag(4 * kChunkBytes, std::byte{0xee});
  for (int i = 0; i < 3; ++i) {
    auto g = A().create(kRootIno, "g" + std::to_string(i), 0644, who_);
    ASSERT_TRUE(g.ok());
    ASSERT_TRUE(A().write(g->ino, 0, tag).ok());
    EXPECT_EQ(Read(B(), bf->ino, data.size()), data)
        << "B read another region's bytes through a file it has open";
  }
  EXPECT_GT(A().stats().frees_waiting + A().stats().chunks_in_use, 0u);
  ASSERT_TRUE(B().release(*h).ok());
  // Now every mount has let go: the memory returns (to the units; the 4 chunks are free again).
  EXPECT_TRUE(Eventually([&] {
    return A().stats().frees_waiting == 0 && B().stats().frees_waiting == 0 &&
           A().stats().chunks_in_use == 12;
  })) << "the unlinked file's chunks did not come back after the last close: "
      << A().stats().chunks_in_use << " in use";
  EXPECT_GE(Allocated(), allocated);
  EXPECT_EQ(ErrnoOf(B().getattr(bf->ino).status()), ENOENT);
}

TEST_F(MultiMountTest, AnOpenSeesWhatTheOtherMountWroteBefore) {
  auto f = A().create(kRootIno, "f", 0644, who_);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(A().write(f->ino, 0, RandomBytes(1000, 5)).ok());
  auto bf = B().lookup(kRootIno, "f");
  ASSERT_TRUE(bf.ok());
  ASSERT_TRUE(Eventually([&] { return B().getattr(f->ino)->size == 1000; }));
  // B's watch held: only B's open can tell it what A wrote since.
  gate_b_.Close();
  auto now = RandomBytes(2 * kChunkBytes + 7, 6);
  auto wa = A().open(f->ino, true);
  ASSERT_TRUE(wa.ok());
  ASSERT_TRUE(A().write(f->ino, 0, now).ok());
  ASSERT_TRUE(A().release(*wa).ok());
  auto g = A().create(kRootIno, "new", 0644, who_);
  ASSERT_TRUE(g.ok());
  auto h = B().open(f->ino, false);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(Read(B(), f->ino, now.size() + 10), now)
      << "B's open did not see what A wrote and closed before";
  ASSERT_TRUE(B().release(*h).ok());
  EXPECT_TRUE(B().lookup(kRootIno, "new").ok()) << "B's lookup did not find A's new name";
  gate_b_.Open();
}

TEST_F(MultiMountTest, RegionsWhoseOwnerHostHasNoMountLeftAreReaped) {
  // B (on "host-b") makes a region owned by this live process, in a non-PERSISTENT directory.
  auto d = B().mkdir(kRootIno, "eph", 0755, who_);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(B().setxattr(d->ino, "user.region.persistent", "0").ok());
  auto f = B().create(d->ino, "f", 0644, Caller{0, 0, getpid()});
  ASSERT_TRUE(f.ok());
  auto kept = B().create(kRootIno, "kept", 0644, Caller{0, 0, getpid()});
  ASSERT_TRUE(kept.ok());
  ASSERT_TRUE(B().setxattr(kept->ino, "user.region.persistent", "1").ok());
  ASSERT_TRUE(Eventually([&] { return A().lookup(d->ino, "f").ok(); }));
  // A (on "host-a") cannot watch it: B's host does. While B lives nothing goes.
  auto none = A().ReapOwners(0ms);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty()) << "reaped while its host's mount lives";
  mounts_[1] = Mount{};  // B unmounts: nobody on host-b watches the owner any more
  std::vector<ReapedRegion> reaped;
  ASSERT_TRUE(Eventually([&] {
    auto r = A().ReapOwners(0ms);
    if (r.ok()) reaped.insert(reaped.end(), r->begin(), r->end());
    return !reaped.empty();
  })) << "the region of a host with no mount left was not reaped";
  ASSERT_EQ(reaped.size(), 1u);
  EXPECT_EQ(reaped[0].ino, f->ino);
  EXPECT_EQ(ErrnoOf(A().lookup(d->ino, "f").status()), ENOENT);
  EXPECT_TRUE(A().lookup(kRootIno, "kept").ok()) << "the PERSISTENT region went too";
}

// Both mounts at once: each has writers/truncaters of its own files (per-file tag bytes) and
// readers (with handles) of the other mount's files, and churns a file it creates, fills and
// deletes, so freed chunks keep moving between regions and mounts. No reader may ever see a byte
// that is neither its file's tag nor zero.
TEST_F(MultiMountTest, StressBothMountsNeverReadAnotherRegionsBytes) {
  constexpr int kFiles = 2;  // per mount
  constexpr int kRounds = 40;
  RegionStore* stores[2] = {&A(), &B()};
  std::vector<uint64_t> inos;
  for (int m = 0; m < 2; ++m)
    for (int i = 0; i < kFiles; ++i) {
      auto a = stores[m]->create(kRootIno, "f" + std::to_string(m) + std::to_string(i), 0644, who_);
      ASSERT_TRUE(a.ok());
      inos.push_back(a->ino);
    }
  std::atomic<int> foreign{0}, errors{0};
  std::vector<std::thread> threads;
  for (int m = 0; m < 2; ++m)
    for (int i = 0; i < kFiles; ++i) {
      const int file = m * kFiles + i;
      const auto tag = static_cast<std::byte>(file + 1);
      threads.emplace_back([&, m, file, tag] {
        RegionStore& s = *stores[m];
        std::vector<std::byte> buf(3 * kChunkBytes / 2, tag);
        for (int r = 0; r < kRounds; ++r) {
          uint64_t off = (static_cast<uint64_t>(r) * 77777) % (4 * kChunkBytes);
          Status w = s.write(inos[file], off, buf);
          if (!w.ok() && ErrnoOf(w) != ENOSPC) errors++;
          if (!s.setattr(inos[file], SetAttrRequest{.size = off / 3}).ok()) errors++;
        }
      });
      threads.emplace_back([&, m, file, tag] {
        RegionStore& s = *stores[1 - m];  // the other mount reads it
        auto h = s.open(inos[file], false);
        if (!h.ok()) {
          errors++;
          return;
        }
        std::vector<std::byte> out(6 * kChunkBytes);
        for (int r = 0; r < kRounds * 2; ++r) {
          auto n = s.read(inos[file], 0, out);
          if (!n.ok()) {
            errors++;
            continue;
          }
          for (size_t k = 0; k < *n; ++k)
            if (out[k] != std::byte{0} && out[k] != tag) {
              foreign++;
              break;
            }
        }
        (void)s.release(*h);
      });
    }
  for (int m = 0; m < 2; ++m)
    threads.emplace_back([&, m] {
      RegionStore& s = *stores[m];
      std::vector<std::byte> buf(2 * kChunkBytes, std::byte{0x77});
      const std::string name = "churn" + std::to_string(m);
      for (int r = 0; r < kRounds; ++r) {
        auto a = s.create(kRootIno, name, 0644, who_);
        if (!a.ok()) {
          errors++;
          continue;
        }
        (void)s.write(a->ino, 0, buf);
        if (!s.unlink(kRootIno, name).ok()) errors++;
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(foreign.load(), 0) << "a reader saw another region's bytes";
  for (int m = 0; m < 2; ++m)
    for (int i = 0; i < kFiles; ++i)
      ASSERT_TRUE(stores[m]->unlink(kRootIno, "f" + std::to_string(m) + std::to_string(i)).ok());
  EXPECT_TRUE(Eventually([&] {
    return A().stats().chunks_in_use == 0 && B().stats().chunks_in_use == 0;
  })) << "chunks still in use: "
      << A().stats().chunks_in_use << " / " << B().stats().chunks_in_use;
}

}  // namespace
}  // namespace farmem::regions
