// Test-only: kvstore histories for the linearizability checker (tests/porcupine, docs/channels.md
// "Linearizability"): one operation of the checked mix per call and the history file's format.
// Shared by kvstore_test.cc (3 nodes in one process) and `farmem bench channels-node --workload
// kvlin` (one process per network namespace); every client thread calls it with its own state.
#pragma once

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
