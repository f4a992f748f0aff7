// TATP on Redis (see tatp_redis.h). Keys are hash-tagged by s_id ("s:{7}", "f:{7}:2", ...); the
// sub_nbr index "n:<15 digits>" holds the s_id in decimal. Values are the same bytes as the farmem
// tables'. Threads: the caller's (load) and `threads` client threads of RunRedisTatp.
#include "tatp_redis.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "redis_bench.h"

namespace farmem::bench::tatp {
namespace {

using RClock = std::chrono::steady_clock;

std::string SubKey(uint64_t s) {
  return fmt::format("s:{{{}}}", s);
}
std::string SecKey(uint64_t s) {
  return "n:" + SubNbr(s);
}
std::string AiKey(uint64_t s, uint8_t t) {
  return fmt::format("a:{{{}}}:{}", s, t);
}
std::string SfKey(uint64_t s, uint8_t t) {
  return fmt::format("f:{{{}}}:{}", s, t);
}
std::string CfKey(uint64_t s, uint8_t t, uint8_t st) {
  return fmt::format("c:{{{}}}:{}:{}", s, t, st);
}

// The type byte of a populated row's key (AccessInfoKey etc.: (s_id << 16) | type << 8 | st).
uint8_t TypeOf(uint64_t key) {
  return static_cast<uint8_t>(key >> 8);
}
uint8_t StartOf(uint64_t key) {
  return static_cast<uint8_t>(key);
}

// One script per transaction type, in TxType order. Reads return the row (or 0 when missing),
// the others 1 (success) or 0 (unsuccessful by the spec). Keys derived from the sub_nbr index
// inside a script are not in KEYS: fine on one instance (the hash tag keeps them on one slot).
constexpr const char* kScripts[kTxTypes] = {
    // GSD
    "local v = redis.call('GET', KEYS[1]) if v then return v end return 0",
    // GAD
    "local v = redis.call('GET', KEYS[1]) if v then return v end return 0",
    // GND: KEYS[1] the SF row, KEYS[2..] the CF rows with start_time <= given; ARGV[1] end_time
    "local sf = redis.call('GET', KEYS[1]) "
    "if not sf or string.byte(sf, 1) ~= 1 then return 0 end "
    "local et = tonumber(ARGV[1]) "
    "for i = 2, #KEYS do local cf = redis.call('GET', KEYS[i]) "
    "if cf and string.byte(cf, 1) > et then return 1 end end return 0",
    // USD: KEYS sub, sf; ARGV bit (0/1), data_a (one byte)
    "if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end "
    "local s = redis.call('GETRANGE', KEYS[1], 8, 8) local b = string.byte(s, 1) "
    "b = b - (b % 2) + tonumber(ARGV[1]) "
    "redis.call('SETRANGE', KEYS[1], 8, string.char(b)) "
    "redis.call('SETRANGE', KEYS[2], 2, ARGV[2]) return 1",
    // UL: KEYS sec; ARGV vlr_location (4 bytes)
    "local id = redis.call('GET', KEYS[1]) if not id then return 0 end "
    "redis.call('SETRANGE', 's:{' .. id .. '}', 32, ARGV[1]) return 1",
    // ICF: KEYS sec; ARGV sf_type, start_time, the CF value
    "local id = redis.call('GET', KEYS[1]) if not id then return 0 end "
    "if redis.call('EXISTS', 'f:{' .. id .. '}:' .. ARGV[1]) == 0 then return 0 end "
    "return redis.call('SETNX', 'c:{' .. id .. '}:' .. ARGV[1] .. ':' .. ARGV[2], ARGV[3])",
    // DCF: KEYS sec; ARGV sf_type, start_time
    "local id = redis.call('GET', KEYS[1]) if not id then return 0 end "
    "return redis.call('DEL', 'c:{' .. id .. '}:' .. ARGV[1] .. ':' .. ARGV[2])",
};

std::string CfValue(const TxInput& in) {
  std::string v(kCallForwardingBytes, '\0');
  v[kCfEndTimeOffset] = static_cast<char>(in.end_time);
  std::memcpy(v.data() + 1, in.numberx.data(), in.numberx.size());
  return v;
}

// Appends a command given as strings (binary safe).
Status Append(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  if (redisAppendCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data()) !=
      REDIS_OK)
    return Status::Internal(fmt::format("redis append: {}", c->errstr));
  return Status::OK();
}

// The EVALSHA of `in`'s script.
std::vector<std::string> LuaCommand(const TxInput& in, const std::vector<std::string>& shas) {
  const uint64_t s = in.s_id;
  std::vector<std::string> cmd = {"EVALSHA", shas[static_cast<size_t>(in.type)]};
  switch (in.type) {
    case TxType::kGetSubscriberData:
      return {cmd[0], cmd[1], "1", SubKey(s)};
    case TxType::kGetAccessData:
      return {cmd[0], cmd[1], "1", AiKey(s, in.sub_type)};
    case TxType::kGetNewDestination: {
      std::vector<std::string> keys = {SfKey(s, in.sub_type)};
      for (uint8_t st : kStartTimes)
        if (st <= in.start_time) keys.push_back(CfKey(s, in.sub_type, st));
      cmd.push_back(std::to_string(keys.size()));
      cmd.insert(cmd.end(), keys.begin(), keys.end());
      cmd.push_back(std::to_string(in.end_time));
      return cmd;
    }
    case TxType::kUpdateSubscriberData:
      return {cmd[0],
              cmd[1],
              "2",
              SubKey(s),
              SfKey(s, in.sub_type),
              std::to_string(in.bit),
              std::string(1, static_cast<char>(in.data_a))};
    case TxType::kUpdateLocation:
      return {cmd[0], cmd[1], "1", SecKey(s),
              std::string(reinterpret_cast<const char*>(&in.vlr_location), 4)};
    case TxType::kInsertCallForwarding:
      return {cmd[0],
              cmd[1],
              "1",
              SecKey(s),
              std::to_string(in.sub_type),
              std::to_string(in.start_time),
              CfValue(in)};
    case TxType::kDeleteCallForwarding:
      return {cmd[0],
              cmd[1],
              "1",
              SecKey(s),
              std::to_string(in.sub_type),
              std::to_string(in.start_time)};
  }
  return cmd;
}

bool LuaSucceeded(const redisReply* r) {
  if (r->type == REDIS_REPLY_STRING) return true;
  return r->type == REDIS_REPLY_INTEGER && r->integer == 1;
}

// Sends `cmds` in one round trip and returns their replies.
Result<std::vector<RedisReplyPtr>> RoundTrip(redisContext* c,
                                             const std::vector<std::vector<std::string>>& cmds) {
  for (const auto& cmd : cmds) FARMEM_RETURN_IF_ERROR(Append(c, cmd));
  std::vector<RedisReplyPtr> out;
  for (size_t i = 0; i < cmds.size(); ++i) {
    FARMEM_ASSIGN_OR_RETURN(auto r, RedisGetReply(c));
    out.push_back(std::move(r));
  }
  return out;
}

enum class Wme { kSuccess, kUnsuccessful, kConflict };

// EXEC's reply: nil = a watched key changed (conflict).
Result<Wme> Exec(redisContext* c, std::vector<std::vector<std::string>> writes) {
  writes.insert(writes.begin(), {"MULTI"});
  writes.push_back({"EXEC"});
  FARMEM_ASSIGN_OR_RETURN(auto r, RoundTrip(c, writes));
  return r.back()->type == REDIS_REPLY_NIL ? Wme::kConflict : Wme::kSuccess;
}

Result<Wme> Unwatch(redisContext* c) {
  FARMEM_ASSIGN_OR_RETURN(auto r, RoundTrip(c, {{"UNWATCH"}}));
  return Wme::kUnsuccessful;
}

// Resolves sub_nbr to s_id (one GET of the read-only index).
Result<std::string> SecLookup(redisContext* c, uint64_t s) {
  FARMEM_ASSIGN_OR_RETURN(auto r, RoundTrip(c, {{"GET", SecKey(s)}}));
  if (r[0]->type != REDIS_REPLY_STRING) return Status::NotFound("sub_nbr not in the index");
  return std::string(r[0]->str, r[0]->len);
}

// One attempt of a WATCH/MULTI/EXEC transaction.
Result<Wme> WmeAttempt(redisContext* c, const TxInput& in) {
  const uint64_t s = in.s_id;
  switch (in.type) {
    case TxType::kGetSubscriberData:
    case TxType::kGetAccessData: {
      // One read is atomic by itself: no WATCH needed.
      const std::string key =
          in.type == TxType::kGetSubscriberData ? SubKey(s) : AiKey(s, in.sub_type);
      FARMEM_ASSIGN_OR_RETURN(auto r, RoundTrip(c, {{"GET", key}}));
      return r[0]->type == REDIS_REPLY_STRING ? Wme::kSuccess : Wme::kUnsuccessful;
    }
    case TxType::kGetNewDestination: {
      std::vector<std::string> watch = {"WATCH", SfKey(s, in.sub_type)};
      std::vector<std::vector<std::string>> cmds = {{}, {"GET", SfKey(s, in.sub_type)}};
      for (uint8_t st : kStartTimes) {
        if (st > in.start_time) continue;
        watch.push_back(CfKey(s, in.sub_type, st));
        cmds.push_back({"GET", CfKey(s, in.sub_type, st)});
      }
      cmds[0] = watch;
      FARMEM_ASSIGN_OR_RETURN(auto r, RoundTrip(c, cmds));
      if (r[1]->type != REDIS_REPLY_STRING || r[1]->len < 1 || r[1]->str[0] != 1) return Unwatch(c);
      bool found = false;
      for (size_t i = 2; i < r.size(); ++i)
        found |= r[i]->type == REDIS_REPLY_STRING && r[i]->len >= 1 &&
                 static_cast<uint8_t>(r[i]->str[0]) > in.end_time;
      FARMEM_ASSIGN_OR_RETURN(Wme w, Exec(c, {}));  // validates the snapshot
      if (w == Wme::kConflict) return w;
      return found ? Wme::kSuccess : Wme::kUnsuccessful;
    }
    case TxType::kUpdateSubscriberData: {
      const std::string sub = SubKey(s), sf = SfKey(s, in.sub_type);
      FARMEM_ASSIGN_OR_RETURN(
          auto r, RoundTrip(c, {{"WATCH", sub, sf}, {"GETRANGE", sub, "8", "8"}, {"EXISTS", sf}}));
      if (r[2]->integer == 0 || r[1]->type != REDIS_REPLY_STRING || r[1]->len != 1)
        return Unwatch(c);
      uint8_t b = static_cast<uint8_t>(r[1]->str[0]);
      b = static_cast<uint8_t>((b & ~1u) | in.bit);
      return Exec(c, {{"SETRANGE", sub, "8", std::string(1, static_cast<char>(b))},
                      {"SETRANGE", sf, "2", std::string(1, static_cast<char>(in.data_a))}});
    }
    case TxType::kUpdateLocation: {
      FARMEM_ASSIGN_OR_RETURN(std::string id, SecLookup(c, s));
      // A blind write of one key is atomic by itself.
      FARMEM_ASSIGN_OR_RETURN(
          auto r,
          RoundTrip(c, {{"SETRANGE", "s:{" + id + "}", "32",
                         std::string(reinterpret_cast<const char*>(&in.vlr_location), 4)}}));
      return Wme::kSuccess;
    }
    case TxType::kInsertCallForwarding: {
      FARMEM_ASSIGN_OR_RETURN(std::string id, SecLookup(c, s));
      const std::string t = std::to_string(in.sub_type);
      const std::string sf = "f:{" + id + "}:" + t;
      const std::string cf = "c:{" + id + "}:" + t + ":" + std::to_string(in.start_time);
      FARMEM_ASSIGN_OR_RETURN(auto r,
                              RoundTrip(c, {{"WATCH", sf, cf}, {"EXISTS", sf}, {"EXISTS", cf}}));
      if (r[1]->integer == 0 || r[2]->integer == 1) return Unwatch(c);
      return Exec(c, {{"SET", cf, CfValue(in)}});
    }
    case TxType::kDeleteCallForwarding: {
      FARMEM_ASSIGN_OR_RETURN(std::string id, SecLookup(c, s));
      const std::string cf =
          "c:{" + id + "}:" + std::to_string(in.sub_type) + ":" + std::to_string(in.start_time);
      FARMEM_ASSIGN_OR_RETURN(auto r, RoundTrip(c, {{"DEL", cf}}));
      return r[0]->integer == 1 ? Wme::kSuccess : Wme::kUnsuccessful;
    }
  }
  return Status::Internal("unknown TATP transaction type");
}

}  // namespace

const char* RedisModeName(RedisMode m) {
  return m == RedisMode::kLua ? "redis-lua" : "redis-watch-multi-exec";
}

Status RedisTatpLoad(uint16_t port, uint64_t subscribers, uint64_t seed, const std::string& host) {
  FARMEM_ASSIGN_OR_RETURN(RedisConn c, RedisConnect(port, host));
  FARMEM_ASSIGN_OR_RETURN(auto flush, RoundTrip(c.get(), {{"FLUSHALL"}}));
  auto bytes = [](const std::vector<std::byte>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size());
  };
  std::vector<std::vector<std::string>> batch;
  for (uint64_t s = 1; s <= subscribers; ++s) {
    const SubscriberRows rows = Populate(s, seed);
    batch.push_back({"SET", SubKey(s), bytes(rows.subscriber.value)});
    batch.push_back({"SET", SecKey(s), std::to_string(s)});
    for (const Row& r : rows.access_info)
      batch.push_back({"SET", AiKey(s, TypeOf(r.key)), bytes(r.value)});
    for (const Row& r : rows.special_facility)
      batch.push_back({"SET", SfKey(s, TypeOf(r.key)), bytes(r.value)});
    for (const Row& r : rows.call_forwarding)
      batch.push_back({"SET", CfKey(s, TypeOf(r.key), StartOf(r.key)), bytes(r.value)});
    if (batch.size() >= 512 || s == subscribers) {
      FARMEM_ASSIGN_OR_RETURN(auto replies, RoundTrip(c.get(), batch));
      batch.clear();
    }
  }
  return Status::OK();
}

Result<Counts> RunRedisTatp(uint16_t port, RedisMode mode, uint64_t subscribers, int threads,
                            int inflight, double warmup_s, double seconds, uint64_t seed,
                            const std::string& host) {
  std::vector<std::string> shas;
  {
    FARMEM_ASSIGN_OR_RETURN(RedisConn c, RedisConnect(port, host));
    for (const char* script : kScripts) {
      FARMEM_ASSIGN_OR_RETURN(auto r, RoundTrip(c.get(), {{"SCRIPT", "LOAD", script}}));
      if (r[0]->type != REDIS_REPLY_STRING) return Status::Protocol("SCRIPT LOAD: no sha");
      shas.emplace_back(r[0]->str, r[0]->len);
    }
  }
  const auto start = RClock::now();
  const auto warm_end =
      start + std::chrono::duration_cast<RClock::duration>(std::chrono::duration<double>(warmup_s));
  const auto end = warm_end + std::chrono::duration_cast<RClock::duration>(
                                  std::chrono::duration<double>(seconds));
  std::vector<Counts> per(static_cast<size_t>(threads));
  std::mutex mu;
  Status first_error;
  auto fail = [&](Status st) {
    std::lock_guard lock(mu);
    if (first_error.ok()) first_error = std::move(st);
  };
  auto body = [&](int t) {
    auto conn = RedisConnect(port, host);
    if (!conn.ok()) return fail(conn.status());
    redisContext* c = conn->get();
    SplitMix64 rng(seed * 7919 + static_cast<uint64_t>(t) + 1);
    Counts& out = per[static_cast<size_t>(t)];
    if (mode == RedisMode::kLua) {
      struct Pending {
        TxType type;
        RClock::time_point t0;
      };
      std::deque<Pending> pending;
      auto send = [&]() -> Status {
        const TxInput in = NextInput(rng, subscribers);
        FARMEM_RETURN_IF_ERROR(Append(c, LuaCommand(in, shas)));
        pending.push_back({in.type, RClock::now()});
        return Status::OK();
      };
      for (int i = 0; i < inflight; ++i)
        if (Status st = send(); !st.ok()) return fail(st);
      while (!pending.empty()) {
        auto r = RedisGetReply(c);
        if (!r.ok()) return fail(r.status());
        const Pending p = pending.front();
        pending.pop_front();
        const auto now = RClock::now();
        if (now >= warm_end && now < end)
          out.Add(p.type, LuaSucceeded(r->get()) ? Outcome::kSuccess : Outcome::kUnsuccessful,
                  std::chrono::duration_cast<std::chrono::nanoseconds>(now - p.t0).count());
        if (now < end)
          if (Status st = send(); !st.ok()) return fail(st);
      }
      return;
    }
    while (RClock::now() < end) {
      const TxInput in = NextInput(rng, subscribers);
      const auto t0 = RClock::now();
      Outcome o = Outcome::kError;
      for (int attempt = 0; attempt < 100; ++attempt) {
        auto w = WmeAttempt(c, in);
        if (!w.ok()) {
          if (w.status().code() == Code::kNotFound) {
            o = Outcome::kUnsuccessful;
            break;
          }
          return fail(w.status());
        }
        if (*w == Wme::kConflict) {
          ++out.conflicts;
          continue;
        }
        o = *w == Wme::kSuccess ? Outcome::kSuccess : Outcome::kUnsuccessful;
        break;
      }
      const auto now = RClock::now();
      if (now >= warm_end && now < end)
        out.Add(in.type, o, std::chrono::duration_cast<std::chrono::nanoseconds>(now - t0).count());
    }
  };
  std::vector<std::thread> ths;
  for (int t = 0; t < threads; ++t) ths.emplace_back(body, t);
  for (auto& th : ths) th.join();
  if (!first_error.ok()) return first_error;
  Counts total;
  for (const Counts& c : per) total.Merge(c);
  return total;
}

}  // namespace farmem::bench::tatp
