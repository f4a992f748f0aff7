// The Redis baselines of `farmem bench tx`: TATP on a redis-server (started by redis_bench.h's
// RedisServerRole), as one Lua script per transaction (EVALSHA, pipelined like the farmem
// clients' coroutines) and with WATCH/MULTI/EXEC (Redis's optimistic transactions). Client
// threads are the runner's own; the load runs on the caller's thread.
#pragma once

#include <cstdint>
#include <string>

#include "farmem/status.h"
#include "tatp_workload.h"

namespace farmem::bench::tatp {

// Loads the population of `subscribers` (Populate(s_id, seed)) into the redis-server on
// `host`:`port` (another host: `farmem bench tx --servers ... --redis`).
Status RedisTatpLoad(uint16_t port, uint64_t subscribers, uint64_t seed,
                     const std::string& host = "127.0.0.1");

enum class RedisMode : uint8_t {
  kLua,             // EVALSHA of one script per transaction type; `inflight` pipelined per thread
  kWatchMultiExec,  // WATCH the read set, read, MULTI, writes, EXEC (nil = conflict, retried)
};
const char* RedisModeName(RedisMode m);

// `threads` client threads, each with one connection; Lua keeps `inflight` transactions
// pipelined on it, WATCH/MULTI/EXEC runs one at a time (a WATCH belongs to its connection).
// Warm-up, then `seconds` counted.
Result<Counts> RunRedisTatp(uint16_t port, RedisMode mode, uint64_t subscribers, int threads,
                            int inflight, double warmup_s, double seconds, uint64_t seed,
                            const std::string& host = "127.0.0.1");

}  // namespace farmem::bench::tatp
