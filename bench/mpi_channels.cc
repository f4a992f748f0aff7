// farmem_mpi_channels: the Open MPI baseline of `farmem bench channels` (bench/channels_bench.cc
// starts it under mpirun, 3 ranks, one thread each): transfer transactions under MPI_Win_lock,
// one contended window lock around a read-modify-write, and MPI_Barrier latency. Rank 0 prints
// one JSON line with the totals; no farmem code is linked (the wire is whatever mpirun chose).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_stats.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string workload;     // transfer | lock | barrier
  double seconds = 1.0;     // measured time of transfer and lock
  long accounts = 1000000;  // transfer: accounts over all ranks
  int windows = 341;        // transfer: windows per rank (one lock each per rank)
  long episodes = 2000;     // barrier: barriers timed
  long initial_balance = 1000;
};

bool Parse(int argc, char** argv, Options* o) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--workload") {
      o->workload = v;
    } else if (k == "--seconds") {
      o->seconds = std::atof(v);
    } else if (k == "--accounts") {
      o->accounts = std::atol(v);
    } else if (k == "--windows") {
      o->windows = std::atoi(v);
    } else if (k == "--episodes") {
      o->episodes = std::atol(v);
    } else {
      return false;
    }
  }
  return (o->workload == "transfer" || o->workload == "lock" || o->workload == "barrier") &&
         o->seconds > 0 && o->accounts >= 2 && o->windows >= 1 && o->episodes >= 1;
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A JSON number, or null when not measured.
std::string Number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

// Counts and timing gathered on rank 0 and printed as one JSON line.
void Report(const char* workload, long ops, double seconds, long long violations, double p50_us,
            double p99_us, int rank, int size) {
  std::vector<long> per_rank(static_cast<size_t>(size));
  MPI_Gather(&ops, 1, MPI_LONG, per_rank.data(), 1, MPI_LONG, 0, MPI_COMM_WORLD);
  double max_seconds = 0;
  MPI_Reduce(&seconds, &max_seconds, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  long total = 0;
  std::string list;
  for (long v : per_rank) {
    total += v;
    list += (list.empty() ? "" : ",") + std::to_string(v);
  }
  std::printf(
      "{\"workload\":\"%s\",\"ops\":%ld,\"seconds\":%.6f,\"per_node\":[%s],"
      "\"violations\":%lld,\"p50_us\":%s,\"p99_us\":%s}\n",
      workload, total, max_seconds, list.c_str(), violations, Number(p50_us).c_str(),
      Number(p99_us).c_str());
  std::fflush(stdout);
}

// Lock two of `accounts` accounts (account i lives on rank i % size, in window (i / size) % W at
// index (i / size) / W), move an amount between them, unlock. Locks are taken in (window, rank)
// order so two transfers never wait on each other in a cycle; the sum of all balances is audited.
int Transfer(const Options& o, int rank, int size) {
  const long per_rank = (o.accounts + size - 1) / size;
  const long per_window = (per_rank + o.windows - 1) / o.windows;
  std::vector<MPI_Win> wins(static_cast<size_t>(o.windows));
  std::vector<int64_t*> base(static_cast<size_t>(o.windows));
  // Accounts that exist (below o.accounts) start with the initial balance, the others with 0:
  // window w at this rank holds slots j = k * W + w, i.e. accounts i = j * size + rank.
  for (int w = 0; w < o.windows; w++) {
    MPI_Win_allocate(per_window * 8, 8, MPI_INFO_NULL, MPI_COMM_WORLD, &base[w], &wins[w]);
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, wins[w]);
    for (long k = 0; k < per_window; k++) {
      const long i = (k * o.windows + w) * size + rank;
      base[w][k] = i < o.accounts ? o.initial_balance : 0;
    }
    MPI_Win_unlock(rank, wins[w]);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::mt19937_64 rng(0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(rank + 1));
  std::uniform_int_distribution<long> pick(0, o.accounts - 1);
  long ops = 0;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(o.seconds);
  auto now = t0;
  while ((now = Clock::now()) < end) {
    long a = pick(rng), b = pick(rng);
    while (b == a) b = pick(rng);
    const int64_t amount = static_cast<int64_t>(rng() % 10) + 1;
    struct Acc {
      int target, win;
      MPI_Aint disp;
      int64_t value;
    } acc[2];
    for (int k = 0; k < 2; k++) {
      const long i = k == 0 ? a : b;
      const long j = i / size;
      acc[k] = {static_cast<int>(i % size), static_cast<int>(j % o.windows), j / o.windows, 0};
    }
    const bool same = acc[0].target == acc[1].target && acc[0].win == acc[1].win;
    const int first =
        std::make_pair(acc[0].win, acc[0].target) <= std::make_pair(acc[1].win, acc[1].target) ? 0
                                                                                               : 1;
    for (int n = 0; n < (same ? 1 : 2); n++) {
      const Acc& x = acc[n == 0 ? first : 1 - first];
      MPI_Win_lock(MPI_LOCK_EXCLUSIVE, x.target, 0, wins[x.win]);
    }
    for (auto& x : acc)
      MPI_Get(&x.value, 1, MPI_INT64_T, x.target, x.disp, 1, MPI_INT64_T, wins[x.win]);
    MPI_Win_flush(acc[0].target, wins[acc[0].win]);
    if (!same) MPI_Win_flush(acc[1].target, wins[acc[1].win]);
    acc[0].value -= amount;
    acc[1].value += amount;
    for (auto& x : acc)
      MPI_Put(&x.value, 1, MPI_INT64_T, x.target, x.disp, 1, MPI_INT64_T, wins[x.win]);
    for (int n = 0; n < (same ? 1 : 2); n++) {
      const Acc& x = acc[n == 0 ? first : 1 - first];
      MPI_Win_unlock(x.target, wins[x.win]);
    }
    ops++;
  }
  const double secs = Seconds(t0, now);
  MPI_Barrier(MPI_COMM_WORLD);
  long long local = 0;
  for (int w = 0; w < o.windows; w++) {
    MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, wins[w]);
    for (long k = 0; k < per_window; k++) local += base[w][k];
    MPI_Win_unlock(rank, wins[w]);
  }
  long long sum = 0;
  MPI_Reduce(&local, &sum, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  const long long expect = static_cast<long long>(o.accounts) * o.initial_balance;
  Report("transfer", ops, secs, rank == 0 ? std::llabs(sum - expect) : 0, NAN, NAN, rank, size);
  for (auto& w : wins) MPI_Win_free(&w);
  return 0;
}

// One window lock at rank 0 around a non-atomic read, +1, write of a counter there; the final
// counter must equal the number of acquisitions.
int Lock(const Options& o, int rank, int size) {
  int64_t* base = nullptr;
  MPI_Win win;
  MPI_Win_allocate(rank == 0 ? 8 : 0, 8, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
  if (rank == 0) {
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
    base[0] = 0;
    MPI_Win_unlock(0, win);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  long ops = 0;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration<double>(o.seconds);
  auto now = t0;
  while ((now = Clock::now()) < end) {
    int64_t v = 0;
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
    MPI_Get(&v, 1, MPI_INT64_T, 0, 0, 1, MPI_INT64_T, win);
    MPI_Win_flush(0, win);
    v++;
    MPI_Put(&v, 1, MPI_INT64_T, 0, 0, 1, MPI_INT64_T, win);
    MPI_Win_unlock(0, win);
    ops++;
  }
  const double secs = Seconds(t0, now);
  MPI_Barrier(MPI_COMM_WORLD);
  long total = 0;
  MPI_Reduce(&ops, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
  long long violations = 0;
  if (rank == 0) {
    MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
    violations = std::llabs(static_cast<long long>(total) - base[0]);
    MPI_Win_unlock(0, win);
  }
  Report("lock", ops, secs, violations, NAN, NAN, rank, size);
  MPI_Win_free(&win);
  return 0;
}

// `episodes` timed MPI_Barrier calls (after 100 untimed); percentiles over every rank's samples.
int Barrier(const Options& o, int rank, int size) {
  for (int i = 0; i < 100; i++) MPI_Barrier(MPI_COMM_WORLD);
  std::vector<int64_t> ns(static_cast<size_t>(o.episodes));
  const auto t0 = Clock::now();
  for (long i = 0; i < o.episodes; i++) {
    const auto a = Clock::now();
    MPI_Barrier(MPI_COMM_WORLD);
    ns[static_cast<size_t>(i)] =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - a).count();
  }
  const double secs = Seconds(t0, Clock::now());
  std::vector<int64_t> all(rank == 0 ? ns.size() * static_cast<size_t>(size) : 0);
  MPI_Gather(ns.data(), static_cast<int>(o.episodes), MPI_INT64_T, all.data(),
             static_cast<int>(o.episodes), MPI_INT64_T, 0, MPI_COMM_WORLD);
  double p50 = NAN, p99 = NAN;
  if (rank == 0) {
    p50 = farmem::bench::Percentile(all, 50) / 1e3;
    p99 = farmem::bench::Percentile(all, 99) / 1e3;
  }
  Report("barrier", o.episodes, secs, 0, p50, p99, rank, size);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Options o;
  if (!Parse(argc, argv, &o) || size < 2) {
    if (rank == 0)
      std::fprintf(stderr,
                   "usage: mpirun -np 3 farmem_mpi_channels --workload transfer|lock|barrier "
                   "[--seconds S] [--accounts N] [--windows W] [--episodes E] (2+ ranks)\n");
    MPI_Finalize();
    return 2;
  }
  int rc = 0;
  if (o.workload == "transfer") rc = Transfer(o, rank, size);
  if (o.workload == "lock") rc = Lock(o, rank, size);
  if (o.workload == "barrier") rc = Barrier(o, rank, size);
  MPI_Finalize();
  return rc;
}
