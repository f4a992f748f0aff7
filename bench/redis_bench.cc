// Redis baseline for the object throughput benchmark: redis-server as a grandchild of a target
// process (so it dies with the benchmark), pipelined loading and GET measurement with hiredis.
#include "redis_bench.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "child_process.h"
#include "objects_throughput_internal.h"

namespace farmem::bench {
namespace {

using RClock = std::chrono::steady_clock;

constexpr timeval kRedisTimeout{5, 0};  // every hiredis call returns within this

// Fork + exec redis-server; the child dies with this process (PR_SET_PDEATHSIG).
Result<pid_t> SpawnRedis(const std::string& path, uint16_t port, const std::string& extra_bind) {
  const std::string port_s = std::to_string(port);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return Status::FromErrno("fork", errno);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    int devnull = ::open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
    }
    // --bind takes several addresses; without an extra one the argument list ends early. With
    // one, protected mode (no password: loopback clients only) is off: the extra address is a
    // private namespace bridge of the benchmark's own, and its clients are in other namespaces.
    const char* extra = extra_bind.empty() ? nullptr : extra_bind.c_str();
    if (extra)
      ::execl(path.c_str(), path.c_str(), "--port", port_s.c_str(), "--bind", "127.0.0.1", extra,
              "--protected-mode", "no", "--save", "", "--appendonly", "no", "--daemonize", "no",
              "--dir", "/tmp", static_cast<char*>(nullptr));
    else
      ::execl(path.c_str(), path.c_str(), "--port", port_s.c_str(), "--bind", "127.0.0.1", "--save",
              "", "--appendonly", "no", "--daemonize", "no", "--dir", "/tmp",
              static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

void StopRedis(pid_t pid) {
  ::kill(pid, SIGTERM);
  auto deadline = RClock::now() + std::chrono::seconds(3);
  int st;
  while (RClock::now() < deadline) {
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
}

// Waits until redis on `port` answers PING (or the process exits / the deadline passes).
Status WaitForPing(pid_t pid, uint16_t port, std::chrono::milliseconds timeout) {
  auto deadline = RClock::now() + timeout;
  Status last = Status::TimedOut("redis-server did not answer PING in time");
  while (RClock::now() < deadline) {
    int st;
    if (::waitpid(pid, &st, WNOHANG) == pid)
      return Status::Unavailable(
          fmt::format("redis-server exited (status {}) on port {}", st, port));
    if (auto c = RedisConnect(port); c.ok()) {
      RedisReplyPtr r(static_cast<redisReply*>(redisCommand(c->get(), "PING")));
      if (r && r->type == REDIS_REPLY_STATUS && std::string(r->str) == "PONG") return Status::OK();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return last;
}

}  // namespace

Result<RedisConn> RedisConnect(uint16_t port, const std::string& host) {
  RedisConn c(redisConnectWithTimeout(host.c_str(), port, kRedisTimeout));
  if (!c) return Status::ResourceExhausted("hiredis: cannot allocate a context");
  if (c->err)
    return Status::Unavailable(fmt::format("redis connect to {}:{}: {}", host, port, c->errstr));
  if (redisSetTimeout(c.get(), kRedisTimeout) != REDIS_OK)
    return Status::Internal(fmt::format("redis set timeout: {}", c->errstr));
  return c;
}

Result<RedisReplyPtr> RedisGetReply(redisContext* c) {
  void* r = nullptr;
  if (redisGetReply(c, &r) != REDIS_OK || r == nullptr)
    return Status::Unavailable(fmt::format("redis: {}", c->err ? c->errstr : "no reply"));
  RedisReplyPtr reply(static_cast<redisReply*>(r));
  if (reply->type == REDIS_REPLY_ERROR)
    return Status::Internal(fmt::format("redis error reply: {}", reply->str ? reply->str : "?"));
  return reply;
}

std::string FindRedisServer() {
  return FindOnPath("redis-server");
}

std::string FindOnPath(std::string_view program) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  dirs += ":/usr/sbin:/sbin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (!dir.empty()) {
      std::string candidate = dir + "/" + std::string(program);
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    start = end + 1;
  }
  return "";
}

TargetRole RedisServerRole(std::string redis_server, std::string extra_bind) {
  return [redis_server, extra_bind](int report_fd, int control_fd) {
    Status last;
    for (int attempt = 0; attempt < 5; ++attempt) {
      auto port = PickFreePort();
      if (!port.ok()) {
        last = port.status();
        continue;
      }
      auto pid = SpawnRedis(redis_server, *port, extra_bind);
      if (!pid.ok()) {
        last = pid.status();
        continue;
      }
      last = WaitForPing(*pid, *port, std::chrono::seconds(10));
      if (!last.ok()) {
        StopRedis(*pid);
        continue;
      }
      std::string msg(reinterpret_cast<const char*>(&*port), sizeof(uint16_t));
      if (WriteMessage(report_fd, true, msg).ok()) WaitForStop(control_fd, std::chrono::hours(2));
      StopRedis(*pid);
      return;
    }
    (void)WriteMessage(report_fd, false, last.WithContext("starting redis-server").ToString());
  };
}

std::string RedisKey(uint64_t index) {
  return fmt::format("obj:{}", index);
}

Status RedisLoad(uint16_t port, uint64_t count, size_t value_size, int pipeline) {
  FARMEM_ASSIGN_OR_RETURN(RedisConn c, RedisConnect(port));
  std::vector<std::byte> value(value_size);
  uint64_t next_report = std::max<uint64_t>(1, count / 10);
  for (uint64_t base = 0; base < count; base += static_cast<uint64_t>(pipeline)) {
    const uint64_t end = std::min<uint64_t>(count, base + static_cast<uint64_t>(pipeline));
    for (uint64_t i = base; i < end; ++i) {
      std::string key = RedisKey(i);
      FillObjectValue(i, value);
      if (redisAppendCommand(c.get(), "SET %b %b", key.data(), key.size(), value.data(),
                             value.size()) != REDIS_OK)
        return Status::Internal(fmt::format("redis append SET: {}", c->errstr));
    }
    for (uint64_t i = base; i < end; ++i) {
      FARMEM_ASSIGN_OR_RETURN(auto r, RedisGetReply(c.get()));
      if (r->type != REDIS_REPLY_STATUS)
        return Status::Protocol(fmt::format("redis SET {}: unexpected reply type {}", i, r->type));
    }
    if (end >= next_report || end == count) {
      fmt::print("  redis load: {} / {} keys ({:.0f} %)\n", end, count,
                 100.0 * static_cast<double>(end) / static_cast<double>(count));
      std::fflush(stdout);
      while (next_report <= end) next_report += std::max<uint64_t>(1, count / 10);
    }
  }
  return Status::OK();
}

Result<RedisGetResult> RunRedisGets(uint16_t port, uint64_t count, size_t value_size,
                                    const ZipfGenerator* zipf, int clients, int inflight,
                                    double warmup_s, double seconds, const std::string& host) {
  StartGate gate;
  std::atomic<int64_t> warm_end_ns{0}, end_ns{0};
  std::vector<uint64_t> ops(static_cast<size_t>(clients), 0);
  std::mutex err_mu;
  Status first_error;
  auto record = [&](Status st) {
    std::lock_guard lock(err_mu);
    if (first_error.ok()) first_error = std::move(st);
  };
  auto body = [&](int t) {
    auto c = RedisConnect(port, host);
    gate.Arrive();
    if (!c.ok()) {
      record(c.status());
      return;
    }
    if (!gate.WaitForGo()) return;
    const RClock::time_point warm_end{RClock::duration(warm_end_ns.load())};
    const RClock::time_point end{RClock::duration(end_ns.load())};
    KeyChooser chooser(count, zipf, 0x5eed0000ull + static_cast<uint64_t>(t));
    std::vector<uint64_t> pending;  // keys of the GETs in flight, in order (redis answers FIFO)
    pending.reserve(static_cast<size_t>(inflight));
    size_t head = 0;
    auto append = [&]() -> Status {
      uint64_t k = chooser.Next();
      std::string key = RedisKey(k);
      if (redisAppendCommand(c->get(), "GET %b", key.data(), key.size()) != REDIS_OK)
        return Status::Internal(fmt::format("redis append GET: {}", (*c)->errstr));
      pending.push_back(k);
      return Status::OK();
    };
    for (int i = 0; i < inflight; ++i) {
      if (Status st = append(); !st.ok()) return record(st);
    }
    uint64_t n = 0;
    while (head < pending.size()) {
      auto r = RedisGetReply(c->get());
      if (!r.ok()) return record(r.status());
      const uint64_t k = pending[head++];
      if ((*r)->type != REDIS_REPLY_STRING || (*r)->len != value_size ||
          !ValueMatches(k, std::span<const std::byte>(reinterpret_cast<std::byte*>((*r)->str),
                                                      static_cast<size_t>((*r)->len))))
        return record(Status::Internal(fmt::format("redis GET {} returned a wrong value", k)));
      const auto now = RClock::now();
      if (now >= warm_end && now < end) ++n;
      if (now < end) {
        if (Status st = append(); !st.ok()) return record(st);
      }
      // Keep the key queue short: drop answered keys once they are a full window behind.
      if (head > 4096 && head * 2 > pending.size()) {
        pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(head));
        head = 0;
      }
    }
    ops[static_cast<size_t>(t)] = n;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < clients; ++t) threads.emplace_back(body, t);
  if (!gate.WaitForArrivals(clients, std::chrono::seconds(30))) {
    gate.Abort();
    for (auto& th : threads) th.join();
    return Status::TimedOut("redis clients did not connect in time");
  }
  auto start = RClock::now();
  auto warm =
      start + std::chrono::duration_cast<RClock::duration>(std::chrono::duration<double>(warmup_s));
  auto stop =
      warm + std::chrono::duration_cast<RClock::duration>(std::chrono::duration<double>(seconds));
  warm_end_ns.store(warm.time_since_epoch().count());
  end_ns.store(stop.time_since_epoch().count());
  gate.Go();
  for (auto& th : threads) th.join();
  if (!first_error.ok()) return first_error;
  RedisGetResult res;
  res.seconds = seconds;
  for (uint64_t n : ops) res.ops += n;
  return res;
}

}  // namespace farmem::bench
