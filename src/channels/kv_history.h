// Test-only: kvstore histories for the linearizability checker (tests/porcupine, docs/channels.md
// "Linearizability"): one operation of the checked mix per call and the history file's format.
// Also several asynchronous gets in flight on one thread. Shared by kvstore_test.cc (3 nodes in one
// process) and `farmem bench channels-node --workload kvlin` (one process per network namespace);
// every client thread calls it with its own state.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "farmem/channels.h"

namespace farmem::channels {

// One completed operation: a line `client op key value call_ns return_ns status out`.
struct KvHistoryOp {
  int client;
  const char* op;  // get | insert | update | delete
  uint64_t key, value;
  int64_t call, ret;   // CLOCK_MONOTONIC (steady_clock) ns: one clock for every process
  const char* status;  // ok | notfound | exists
  uint64_t out;        // the value a get returned
};

// Hot keys 1..kKvHistoryKeys: many operations meet on each.
inline constexpr uint64_t kKvHistoryKeys = 8;

inline int64_t KvHistoryNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Operation `i` of client `client`: 40 % get, 25 % insert, 25 % update, 10 % erase, on a random
// hot key; written values are unique (client + 1) << 40 | (i + 1). Each update's value write is
// held back (ChannelThread test hook) until a wait or fence needs it: a transport may place a
// write late, and only the update fence covers that. OK, kNotFound and kFailedPrecondition are
// outcomes; any other status is returned in `*error` (the operation's outcome is then unknown
// and must not go into the history).
inline KvHistoryOp KvHistoryStep(KvStore& kv, ChannelThread& thr, int client, long i,
                                 std::mt19937_64& rng, Status* error) {
  KvHistoryOp h{client, "get", 1 + rng() % kKvHistoryKeys, 0, 0, 0, "ok", 0};
  const unsigned r = rng() % 100;
  Status st;
  h.call = KvHistoryNowNs();
  if (r < 40) {
    auto v = kv.get(thr, h.key);
    st = v.status();
    if (v.ok()) h.out = *v;
  } else {
    h.value = (uint64_t(client + 1) << 40) | uint64_t(i + 1);
    if (r < 65) {
      h.op = "insert";
      st = kv.insert(thr, h.key, h.value);
    } else if (r < 90) {
      h.op = "update";
      thr.testing_hold_next_write();
      st = kv.update(thr, h.key, h.value);
    } else {
      h.op = "delete";
      h.value = 0;
      st = kv.erase(thr, h.key);
    }
  }
  h.ret = KvHistoryNowNs();
  *error = Status::OK();
  if (st.code() == Code::kNotFound) {
    h.status = "notfound";
  } else if (st.code() == Code::kFailedPrecondition) {
    h.status = "exists";
  } else if (!st.ok()) {
    *error = st;
  }
  return h;
}

// `n` gets in flight at once on one thread (KvStore::get_async), of random hot keys: started one
// after another while the earlier ones are polled, each with its own invoke time (before its
// get_async) and return time (when get_poll first reports it done: never before the read
// completed, so the interval holds the linearization point). Appends them to `*ops`; any outcome
// other than OK or kNotFound is returned in `*error` (and that get is left out, the others kept).
inline void KvHistoryAsyncGets(KvStore& kv, ChannelThread& thr, int client, int n,
                               std::mt19937_64& rng, std::vector<KvHistoryOp>* ops, Status* error) {
  std::vector<KvGet> gets(static_cast<size_t>(n));
  std::vector<uint64_t> outs(gets.size(), 0);
  std::vector<KvHistoryOp> hs(gets.size());
  *error = Status::OK();
  size_t started = 0, finished = 0;
  auto collect = [&](size_t j) {
    hs[j].ret = KvHistoryNowNs();
    finished++;
    const Status& st = gets[j].status();
    if (st.ok()) {
      hs[j].out = outs[j];
    } else if (st.code() == Code::kNotFound) {
      hs[j].status = "notfound";
    } else {
      if (error->ok()) *error = st;
      return;
    }
    ops->push_back(hs[j]);
  };
  std::vector<bool> reported(gets.size(), false);
  while (finished < gets.size()) {
    if (started < gets.size()) {
      const size_t j = started++;
      hs[j] = KvHistoryOp{client, "get", 1 + rng() % kKvHistoryKeys, 0, 0, 0, "ok", 0};
      hs[j].call = KvHistoryNowNs();
      Status st = kv.get_async(thr, hs[j].key,
                               std::as_writable_bytes(std::span<uint64_t>(&outs[j], 1)), &gets[j]);
      if (!st.ok()) {  // a handle still in flight: a bug in this helper, not an outcome
        if (error->ok()) *error = st;
        reported[j] = true;
        finished++;
        continue;
      }
    }
    for (size_t j = 0; j < started; j++) {
      if (!reported[j] && kv.get_poll(thr, gets[j])) {
        reported[j] = true;
        collect(j);
      }
    }
  }
}

// Step `i` of a client's history: every 4th step a burst of 2..6 asynchronous gets in flight at
// once (at most `room`, and only when room >= 2), else one KvHistoryStep. Appends the completed
// operations (at least one unless `*error`) to `*ops`; true when the step was a burst.
inline bool KvHistoryNext(KvStore& kv, ChannelThread& thr, int client, long i, std::mt19937_64& rng,
                          size_t room, std::vector<KvHistoryOp>* ops, Status* error) {
  if (i % 4 == 3 && room >= 2) {
    const size_t n = std::min<size_t>(room, 2 + rng() % 5);
    KvHistoryAsyncGets(kv, thr, client, static_cast<int>(n), rng, ops, error);
    return true;
  }
  const KvHistoryOp h = KvHistoryStep(kv, thr, client, i, rng, error);
  if (error->ok()) ops->push_back(h);
  return false;
}

// Writes every client's operations to `path` (tests/porcupine's input); false on a write error.
inline bool WriteKvHistory(const std::string& path,
                           const std::vector<std::vector<KvHistoryOp>>& clients) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  for (const auto& ops : clients) {
    for (const KvHistoryOp& h : ops) {
      std::fprintf(f, "%d %s %llu %llu %lld %lld %s %llu\n", h.client, h.op,
                   static_cast<unsigned long long>(h.key), static_cast<unsigned long long>(h.value),
                   static_cast<long long>(h.call), static_cast<long long>(h.ret), h.status,
                   static_cast<unsigned long long>(h.out));
    }
  }
  return std::fclose(f) == 0;
}

}  // namespace farmem::channels
