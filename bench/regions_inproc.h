// The in-process half of `farmem bench regions`: an embedded farmemd (default config, pools
// service, loopback TCP) with a RegionStore on a memory:// namespace, as the rmmap tests set it up,
// and the latencies the issue compares there: a one-sided 4 KiB read, an rmmap cold fault, a first
// write after rmarkdirty(zero), and rmalloc(64). Main thread only (plus the mappings' handlers).
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

#include "farmem/status.h"

namespace farmem::bench {

class RegionsInproc {
 public:
  // `pages`: 4 KiB pages each latency sample set covers (one sample per page, each page cold).
  static Result<std::unique_ptr<RegionsInproc>> Start(size_t pages);
  ~RegionsInproc();
  RegionsInproc(const RegionsInproc&) = delete;
  RegionsInproc& operator=(const RegionsInproc&) = delete;

  // Median microseconds of one-sided 4 KiB reads (one in flight, the scheduler's default wait,
  // from a raw range of the same farmemd over the same loopback TCP) and of cold read faults
  // (the first load of each page of a freshly rmmap'ed region holding data: one store read,
  // UFFDIO_COPY), interleaved page by page: read page i, fault page i, read page i+1, ...
  Result<std::pair<double, double>> RawReadAndReadFaultMedianUs();
  // Median microseconds of RegionStore::read of 4 KiB (what a fault's handler calls: the store's
  // own scheduler, which blocks between polls) of each page of the region the faults read.
  Result<double> StoreReadMedianUs();
  // Median microseconds of the first load of each page of a freshly rmmap'ed region holding data
  // (a missing fault: one store read, UFFDIO_COPY).
  Result<double> ReadFaultMedianUs();
  // Median microseconds of rmarkdirty(page, 4096, zero=true) plus a store into the page, on each
  // cold page of a freshly rmmap'ed region holding data (no fetch: the page is zero-filled).
  Result<double> ZeroWriteMedianUs();
  // Median microseconds of a plain store to each cold page of a freshly rmmap'ed region holding
  // data (no rmarkdirty: the page is fetched, then its write-protect fault marks it dirty).
  Result<double> WriteFaultMedianUs();
  // rmalloc(64) calls per second: `n` allocations (then freed, not timed) from a RegionHeap in an
  // rmmap'ed region, rprefetch'ed so the heap's pages take no faults while timed.
  Result<double> RmallocPerSec(size_t n);

 private:
  struct Impl;
  explicit RegionsInproc(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace farmem::bench
