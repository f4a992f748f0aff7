// The in-process half of `farmem bench regions` (see regions_inproc.h): embedded farmemd +
// RegionStore, one-sided read / rmmap fault / rmarkdirty(zero) / rmalloc(64) timings. Main thread
// only; each rmmap has its handler thread, the store's reads run on the calling thread's scheduler.
#include "regions_inproc.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench_stats.h"
#include "farmem/client.h"
#include "farmem/cluster.h"
#include "farmem/node.h"
#include "farmem/regions.h"
#include "farmem/server.h"
#include "regions/engine/region_store.h"

namespace farmem::bench {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kPage = 4096;
constexpr size_t kHeapBytes = 2u << 20;  // rmalloc's region: room for 10 000 64-byte blocks
constexpr auto kOpTimeout = std::chrono::seconds(30);

int64_t NsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

double MedianUs(std::vector<int64_t>& ns) {
  return Percentile(ns, 50.0) / 1e3;
}

// A load from a page: on a cold rmmap'ed page, a missing fault.
Status ReadTouch(size_t /*page*/, std::byte* p) {
  (void)*reinterpret_cast<volatile std::byte*>(p);
  return Status::OK();
}

}  // namespace

struct RegionsInproc::Impl {
  size_t pages = 0;
  std::vector<std::byte> data;  // what regions "rd" and "wr" hold
  std::unique_ptr<MemoryServer> server;
  std::unique_ptr<Node> node;
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<regions::MetaStore> meta;
  std::unique_ptr<regions::RegionStore> store;
  std::unique_ptr<RawClient> raw;
  std::unique_ptr<Scheduler> sched;
  RemoteRef ref;  // a raw range of `pages` pages on the same farmemd
  uint64_t rd_ino = 0;

  ~Impl() {
    store.reset();  // releases its units through the node
    raw.reset();
    sched.reset();
    if (node) node->stop();
    if (server) server->stop();
  }

  // rmmap of `name` and the bytes it maps (unmapped by the caller with rmunmap).
  Result<std::byte*> Map(std::string_view name) {
    FARMEM_ASSIGN_OR_RETURN(void* p, rmmap(*store, name));
    return static_cast<std::byte*>(p);
  }

  // One-sided read of page i of the raw range (it holds `data`, like "rd").
  Status RawRead(size_t i, std::byte* buf) {
    RemoteRef at = ref;
    at.offset += i * kPage;
    return sched->block_on(sched->read(at, buf, kPage));
  }

  // Nanoseconds of `read(i, buf)` of page i into a 4 KiB buffer; its bytes are checked.
  template <typename Read>
  Result<int64_t> TimeRead(std::string_view what, size_t i, Read read) {
    alignas(kPage) static std::byte buf[kPage];
    const auto t0 = Clock::now();
    Status st = read(i, buf);
    const int64_t ns = NsSince(t0);
    FARMEM_RETURN_IF_ERROR(st);
    if (std::memcmp(buf, data.data() + i * kPage, kPage) != 0)
      return Status::Internal(
          fmt::format("regions bench: {} of page {} returned wrong bytes", what, i));
    return ns;
  }

  // Maps `name` afresh (every page cold), times `touch(i, page)` on each page in order, and checks
  // that the mapping served exactly `want_faults` missing faults, and (read-only touches: when
  // want_faults is every page) that it holds the region's bytes. Median microseconds.
  // `raw_ns`: when given, a one-sided read of page i of the raw range is timed into it right
  // before page i's touch, so both series see the same moments of the machine's load.
  template <typename Touch>
  Result<double> TimeColdPages(std::string_view name, uint64_t want_faults, Touch touch,
                               std::vector<int64_t>* raw_ns = nullptr) {
    FARMEM_ASSIGN_OR_RETURN(std::byte * b, Map(name));
    std::vector<int64_t> ns;
    ns.reserve(pages);
    Status touched;
    for (size_t i = 0; i < pages && touched.ok(); ++i) {
      if (raw_ns != nullptr) {
        auto t =
            TimeRead("raw read", i, [this](size_t i, std::byte* buf) { return RawRead(i, buf); });
        if (!t.ok()) {
          touched = t.status();
          break;
        }
        raw_ns->push_back(*t);
      }
      const auto t0 = Clock::now();
      touched = touch(i, b + i * kPage);
      ns.push_back(NsSince(t0));
    }
    auto st = rmmap_stats(b);
    const bool same = want_faults != pages || std::memcmp(b, data.data(), data.size()) == 0;
    FARMEM_RETURN_IF_ERROR(rmunmap(b));
    FARMEM_RETURN_IF_ERROR(touched);
    if (!st.ok()) return st.status();
    if (!same) return Status::Internal("regions bench: rmmap'ed bytes differ from the region's");
    if (st->faults != want_faults)
      return Status::Internal(
          fmt::format("regions bench: {} missing faults on {} pages of {}, "
                      "expected {}",
                      st->faults, pages, name, want_faults));
    return MedianUs(ns);
  }
};

RegionsInproc::RegionsInproc(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RegionsInproc::~RegionsInproc() = default;

Result<std::unique_ptr<RegionsInproc>> RegionsInproc::Start(size_t pages) {
  if (pages == 0) return Status::InvalidArgument("regions bench: pages must be >= 1");
  auto m = std::make_unique<Impl>();
  m->pages = pages;
  const std::string token = fmt::format("regions-bench-{}", getpid());
  // The same embedded farmemd a flagless `farmem mount` runs (pools only, loopback TCP), with
  // the server's default budget and pool size.
  ServerConfig sc;
  sc.node.name = "regions-bench-farmemd";
  sc.node.transport.backend = "tcp";
  sc.node.transport.cluster_token = token;
  sc.services = {"pools"};
  FARMEM_ASSIGN_OR_RETURN(m->server, MemoryServer::Create(sc));
  FARMEM_RETURN_IF_ERROR(m->server->start());
  NodeConfig nc;
  nc.name = "regions-bench-client";
  nc.transport.backend = "tcp";
  nc.transport.cluster_token = token;
  FARMEM_ASSIGN_OR_RETURN(m->node, Node::Create(nc));
  FARMEM_RETURN_IF_ERROR(m->node->start());
  ClusterOptions co;
  co.url = fmt::format("memory://regions-bench-{}", getpid());
  co.create_if_missing = true;
  FARMEM_ASSIGN_OR_RETURN(m->cluster, Cluster::Open(co));
  m->meta = regions::NewClusterMetaStore(*m->cluster);
  regions::RegionStoreOptions so;
  so.servers = {m->server->node().bootstrap_address()};
  FARMEM_ASSIGN_OR_RETURN(m->store, regions::RegionStore::Open(*m->node, *m->meta, so));

  // Regions "rd" (read faults) and "wr" (zero writes) hold random data, so every page is an
  // allocated chunk read remotely; "heap" is a hole (zeros) for rmalloc.
  m->data.resize(pages * kPage);
  std::mt19937_64 rng(14);
  for (auto& b : m->data) b = static_cast<std::byte>(rng());
  const regions::Caller who{static_cast<uint32_t>(getuid()), static_cast<uint32_t>(getgid()),
                            static_cast<int32_t>(getpid())};
  for (const char* name : {"rd", "wr"}) {
    FARMEM_ASSIGN_OR_RETURN(auto a, m->store->create(regions::kRootIno, name, 0600, who));
    FARMEM_RETURN_IF_ERROR(m->store->write(a.ino, 0, m->data));
    if (std::string_view(name) == "rd") m->rd_ino = a.ino;
  }
  FARMEM_ASSIGN_OR_RETURN(auto h, m->store->create(regions::kRootIno, "heap", 0600, who));
  regions::SetAttrRequest grow;
  grow.size = kHeapBytes;
  FARMEM_RETURN_IF_ERROR(m->store->setattr(h.ino, grow).status());

  FARMEM_ASSIGN_OR_RETURN(m->raw,
                          RawClient::Connect(*m->node, m->server->node().bootstrap_address()));
  FARMEM_ASSIGN_OR_RETURN(auto range, m->raw->alloc_raw(pages * kPage));
  m->ref = range.ref;
  FARMEM_ASSIGN_OR_RETURN(m->sched, m->node->make_scheduler());
  // The scheduler's default wait (poll, then block until a completion may be there), as every
  // farmem client and the store's own reads use it. `bench raw` busy-polls instead; on this
  // loaded 2-CPU machine a spinning reader starved the NIC threads the read needs (medians of
  // 212 us with an unbounded spin and 51 us with a 30 us one, against ~20 us without: README).
  FARMEM_RETURN_IF_ERROR(
      m->sched->block_on(m->sched->write(m->ref, m->data.data(), m->data.size(), true)));
  return std::unique_ptr<RegionsInproc>(new RegionsInproc(std::move(m)));
}

Result<std::pair<double, double>> RegionsInproc::RawReadAndReadFaultMedianUs() {
  std::vector<int64_t> raw_ns;
  raw_ns.reserve(impl_->pages);
  FARMEM_ASSIGN_OR_RETURN(double fault_us,
                          impl_->TimeColdPages("rd", impl_->pages, ReadTouch, &raw_ns));
  return std::pair{MedianUs(raw_ns), fault_us};
}

Result<double> RegionsInproc::StoreReadMedianUs() {
  Impl& m = *impl_;
  std::vector<int64_t> ns;
  ns.reserve(m.pages);
  for (size_t i = 0; i < m.pages; ++i) {
    FARMEM_ASSIGN_OR_RETURN(int64_t t, m.TimeRead("store read", i, [&m](size_t i, std::byte* buf) {
      return m.store->read(m.rd_ino, i * kPage, std::span<std::byte>(buf, kPage)).status();
    }));
    ns.push_back(t);
  }
  return MedianUs(ns);
}

Result<double> RegionsInproc::ReadFaultMedianUs() {
  return impl_->TimeColdPages("rd", impl_->pages, ReadTouch);
}

Result<double> RegionsInproc::ZeroWriteMedianUs() {
  // No missing faults: rmarkdirty(zero) installs zero pages; the dirty pages are dropped at the
  // rmunmap, so "wr" keeps its data for the next round.
  return impl_->TimeColdPages("wr", 0, [](size_t, std::byte* p) {
    Status marked = rmarkdirty(p, kPage, /*zero=*/true);
    *reinterpret_cast<volatile std::byte*>(p + 64) = std::byte{1};
    return marked;
  });
}

Result<double> RegionsInproc::WriteFaultMedianUs() {
  // A store of the byte the page holds: a write fault (the page is fetched, installed
  // write-protected, then the store's write-protect fault marks it dirty) that leaves the bytes
  // as they were, so the mapping is still checked against the region's.
  const std::vector<std::byte>& data = impl_->data;
  return impl_->TimeColdPages("wr", impl_->pages, [&data](size_t i, std::byte* p) {
    *reinterpret_cast<volatile std::byte*>(p + 64) = data[i * kPage + 64];
    return Status::OK();
  });
}

Result<double> RegionsInproc::RmallocPerSec(size_t n) {
  Impl& m = *impl_;
  FARMEM_ASSIGN_OR_RETURN(std::byte * b, m.Map("heap"));
  const std::span<std::byte> region(b, kHeapBytes);
  std::vector<void*> ptrs;
  ptrs.reserve(n);
  auto run = [&]() -> Result<double> {
    FARMEM_RETURN_IF_ERROR(rprefetch(b, kHeapBytes));
    // One untimed pass first: under write-protect tracking a page's first store takes a fault.
    double secs = 0;
    for (int pass = 0; pass < 2; ++pass) {
      const auto t0 = Clock::now();
      for (size_t i = 0; i < n; ++i) {
        FARMEM_ASSIGN_OR_RETURN(void* p, rmalloc(region, 64));
        ptrs.push_back(p);
      }
      secs = std::chrono::duration<double>(Clock::now() - t0).count();
      for (void* p : ptrs) FARMEM_RETURN_IF_ERROR(rfree(region, p));
      ptrs.clear();
    }
    return static_cast<double>(n) / secs;
  };
  auto r = run();
  FARMEM_RETURN_IF_ERROR(rmunmap(b));  // not rsync'ed: the next round starts a fresh heap
  return r;
}

}  // namespace farmem::bench
