// Redis baseline of `farmem bench objects-throughput`: a redis-server started on a free loopback
// port (no persistence), loaded with N keys of 32 B values, then GETs from T client threads with
// K pipelined requests each (hiredis), measured like the object reads of the same run.
#pragma once

#include <hiredis/hiredis.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "farmem/status.h"
#include "target_process.h"
#include "zipf.h"

namespace farmem::bench {

struct RedisContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using RedisConn = std::unique_ptr<redisContext, RedisContextDeleter>;
struct RedisReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using RedisReplyPtr = std::unique_ptr<redisReply, RedisReplyDeleter>;

// A connection to `host`:`port` whose every call returns within 5 s (another host: a redis-server
// in another network namespace, bench tx --redis and bench channels --netns).
Result<RedisConn> RedisConnect(uint16_t port, const std::string& host = "127.0.0.1");
// The next reply; an error reply is kInternal with its text.
Result<RedisReplyPtr> RedisGetReply(redisContext* c);

// Absolute path of redis-server found on PATH, or "" when it is not installed.
std::string FindRedisServer();
// Absolute path of `program` in PATH (then /usr/sbin, /sbin), or "" when there is none.
std::string FindOnPath(std::string_view program);

// Child role: starts `redis_server` (its own child, killed with this process) on a free
// 127.0.0.1 port with `--save "" --appendonly no`, waits until it answers PING, reports the port
// (2 bytes), and stops it when the parent stops this target. `extra_bind`: one more address it
// listens on (the namespace benchmark's bridge address; readiness is still checked on loopback).
TargetRole RedisServerRole(std::string redis_server, std::string extra_bind = "");

// The key of object `index` ("obj:<index>").
std::string RedisKey(uint64_t index);

// SETs `count` keys whose values are FillObjectValue(index) of `value_size` bytes, `pipeline`
// commands per round trip, printing progress every 10 %.
Status RedisLoad(uint16_t port, uint64_t count, size_t value_size, int pipeline);

struct RedisGetResult {
  uint64_t ops = 0;  // GETs that completed inside the measurement window
  double seconds = 0;
};

// `clients` threads, each with its own connection keeping `inflight` GETs pipelined, keys drawn
// uniformly (zipf == nullptr) or from `zipf` over `count` keys. Every reply is checked (a string
// of `value_size` bytes naming the key's index). Warm-up, then `seconds` measured. The server is
// at `host` (another network namespace's address in the namespace benchmark).
Result<RedisGetResult> RunRedisGets(uint16_t port, uint64_t count, size_t value_size,
                                    const ZipfGenerator* zipf, int clients, int inflight,
                                    double warmup_s, double seconds,
                                    const std::string& host = "127.0.0.1");

}  // namespace farmem::bench
