// `farmem bench soak` and its hidden child client: legitimate clients vs hostile ones against a
// default farmemd child, in interleaved rounds. Threads: main (rounds, output), 2 legitimate
// client threads, 1 hostile thread (floods, garbage, slow readers, killed children), 1 RSS sampler.
#include "soak_bench.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "bench_json.h"
#include "bench_stats.h"
#include "child_process.h"
#include "farmem/client.h"
#include "farmem/node.h"
#include "farmem/objects.h"
#include "farmemd_process.h"
#include "machine_info.h"
#include "node/bootstrap.h"
#include "objects_throughput_internal.h"
#include "soak_internal.h"
#include "transport/tcp/frame_codec.h"

extern char** environ;

namespace farmem {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace soak = bench::soak;
using bench::Farmemd;
using bench::FindFarmemd;
using bench::KillAndReap;
using bench::Spawn;

constexpr const char* kSoakProg = "farmem bench soak";
constexpr const char* kToken = "farmem";  // farmemd's default cluster token
// Source addresses of the hostile clients (all of 127.0.0.0/8 is loopback): the listeners'
// per-address limits then hit the hostile clients, as they would on a real network, and not the
// legitimate ones on 127.0.0.1.
constexpr const char* kFloodIp = "127.0.0.2";
constexpr const char* kGarbageIp = "127.0.0.3";
constexpr const char* kSlowReaderIp = "127.0.0.4";
constexpr auto kSettle = 500ms;  // after each round's change of load, not measured
constexpr uint32_t kSlowReadBytes = 1u << 20;
// READs a slow reader posts per round (1 GiB of replies it never reads): far more than farmemd
// queues per connection before it stops reading the connection (TcpLimits, 64 MiB by default).
constexpr uint64_t kSlowReadsPerConnection = 1024;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
double Mib(double bytes) {
  return bytes / (1024.0 * 1024.0);
}

// ---- Child processes ----------------------------------------------------------------------

// Samples farmemd's RSS every 50 ms and keeps the peak of each phase (2 per round).
class RssMonitor {
 public:
  RssMonitor(const Farmemd& server, size_t phases) : server_(server), peaks_(phases, 0) {
    thread_ = std::thread([this] {
      while (!stop_.load()) {
        const uint64_t rss = server_.RssBytes();
        {
          std::lock_guard<std::mutex> lock(mu_);
          const int ph = phase_.load();
          if (ph >= 0 && static_cast<size_t>(ph) < peaks_.size())
            peaks_[static_cast<size_t>(ph)] = std::max(peaks_[static_cast<size_t>(ph)], rss);
          overall_ = std::max(overall_, rss);
        }
        std::this_thread::sleep_for(50ms);
      }
    });
  }
  ~RssMonitor() {
    stop_.store(true);
    thread_.join();
  }
  void SetPhase(int p) { phase_.store(p); }
  uint64_t Peak(size_t phase) {
    std::lock_guard<std::mutex> lock(mu_);
    return phase < peaks_.size() ? peaks_[phase] : 0;
  }
  uint64_t Overall() {
    std::lock_guard<std::mutex> lock(mu_);
    return overall_;
  }

 private:
  const Farmemd& server_;
  std::mutex mu_;
  std::vector<uint64_t> peaks_;
  uint64_t overall_ = 0;
  std::atomic<int> phase_{-1};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- Legitimate clients ---------------------------------------------------------------------

struct LegitCounters {
  std::atomic<uint64_t> obj_ops{0}, raw_ops{0}, errors{0}, wrong{0};
  std::atomic<int> ready{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::string> error_samples, wrong_samples;
  // Allocations the legitimate clients could not free at the end (excluded from leaks).
  std::atomic<int64_t> unfreed_objects{0}, unfreed_raw{0};

  void Error(const std::string& what) {
    errors.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu);
    if (error_samples.size() < 8) error_samples.push_back(what);
  }
  void Wrong(const std::string& what) {
    wrong.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu);
    if (wrong_samples.size() < 8) wrong_samples.push_back(what);
  }
  uint64_t Ops() const { return obj_ops.load() + raw_ops.load(); }
};

struct ObjSlot {
  Ptr p;
  uint64_t id = 0, seq = 0;
  uint32_t size = 0;
  bool live = false;
  bool uncertain = false;  // a write failed: it may still land (holds seq + 1)
};

struct RawSlot {
  RemoteRef ref;
  uint64_t length = 0;
  uint64_t id = 0, seq = 0;
  bool live = false;
  bool uncertain = false;
};

// Checks a read against the slot's last write (or the failed one that may have landed).
template <typename Slot>
bool CheckRead(Slot& s, std::span<const std::byte> got, LegitCounters& c, const char* what) {
  if (soak::PatternMatches(s.id, s.seq, got)) return true;
  if (s.uncertain && soak::PatternMatches(s.id, s.seq + 1, got)) {
    ++s.seq;
    s.uncertain = false;
    return true;
  }
  c.Wrong(fmt::format("{}: {}", what, soak::DescribeContent(got, s.id, s.seq)));
  return false;
}

uint32_t ObjSize(std::mt19937_64& rng, uint32_t max_size) {
  return std::uniform_int_distribution<uint32_t>(16, max_size)(rng);
}

Task<bool> ObjCreate(Scheduler& s, ObjectClient& oc, ObjSlot& sl, uint32_t size, uint64_t id,
                     LegitCounters& c, std::vector<std::byte>& buf) {
  auto p = co_await oc.alloc(s, size);
  if (!p.ok()) {
    c.Error("alloc: " + p.status().ToString());
    co_return false;
  }
  sl = ObjSlot{*p, id, 1, size, true, false};
  buf.resize(size);
  soak::FillPattern(id, 1, buf);
  Status st = co_await oc.write(s, sl.p, buf);
  if (!st.ok()) {
    c.Error("write after alloc: " + st.ToString());
    sl.uncertain = true;
    sl.seq = 0;  // zero-filled until the write lands: seq 0 is never checked, seq 1 is
  }
  co_return true;
}

Task<void> ObjWorker(Scheduler& s, ObjectClient& oc, std::vector<ObjSlot>& slots, LegitCounters& c,
                     uint64_t seed, std::atomic<uint64_t>& next_id, uint32_t max_size) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> buf;
  for (auto& sl : slots)
    co_await ObjCreate(s, oc, sl, ObjSize(rng, max_size), next_id.fetch_add(1), c, buf);
  c.ready.fetch_add(1);
  size_t i = 0;
  while (!c.stop.load(std::memory_order_relaxed)) {
    ObjSlot& sl = slots[i++ % slots.size()];
    const int op = static_cast<int>(rng() % 100);
    if (!sl.live) {
      if (co_await ObjCreate(s, oc, sl, ObjSize(rng, max_size), next_id.fetch_add(1), c, buf))
        c.obj_ops.fetch_add(2, std::memory_order_relaxed);
      continue;
    }
    buf.resize(sl.size);
    if (op < 70) {  // reads: one-sided (read_any, direct_read) and RPC
      Result<size_t> r = Status::Internal("no read");
      const char* how = op < 45 ? "read_any" : op < 60 ? "direct_read" : "read (RPC)";
      if (op < 45) {
        r = co_await oc.read_any(s, sl.p, buf);
      } else if (op < 60) {
        r = co_await oc.direct_read(s, sl.p, buf);
        if (!r.ok() && r.status().code() == Code::kMoved) r = co_await oc.read_any(s, sl.p, buf);
      } else {
        r = co_await oc.read(s, sl.p, buf);
      }
      if (!r.ok()) {
        c.Error(fmt::format("object {}: {}", how, r.status().ToString()));
        continue;
      }
      if (*r != sl.size) {
        c.Wrong(fmt::format("object {} returned {} bytes for a {} B object", how, *r, sl.size));
        continue;
      }
      if (sl.seq == 0 && sl.uncertain) {
        // The first write failed: the object reads as zeros or as seq 1.
        bool zero =
            std::all_of(buf.begin(), buf.end(), [](std::byte b) { return b == std::byte{0}; });
        if (zero) {
          c.obj_ops.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
      }
      if (CheckRead(sl, buf, c, how)) c.obj_ops.fetch_add(1, std::memory_order_relaxed);
    } else if (op < 95) {  // write the next version
      soak::FillPattern(sl.id, sl.seq + 1, buf);
      Status st = co_await oc.write(s, sl.p, buf);
      if (!st.ok()) {
        c.Error("object write: " + st.ToString());
        sl.uncertain = true;
        continue;
      }
      ++sl.seq;
      sl.uncertain = false;
      c.obj_ops.fetch_add(1, std::memory_order_relaxed);
    } else {  // free, then a new object in its place
      Status st = co_await oc.free(s, sl.p);
      sl.live = false;
      if (!st.ok()) {
        c.Error("object free: " + st.ToString());
        c.unfreed_objects.fetch_add(1);
        continue;
      }
      c.obj_ops.fetch_add(1, std::memory_order_relaxed);
    }
  }
  for (auto& sl : slots) {
    if (!sl.live) continue;
    Status st = co_await oc.free(s, sl.p);
    if (!st.ok()) {
      c.Error("object free at the end: " + st.ToString());
      c.unfreed_objects.fetch_add(1);
    }
    sl.live = false;
  }
}

// Live raw ranges of the raw thread, to catch an ALLOC_RAW that overlaps one it already holds.
using RangeMap = std::map<std::pair<uint64_t, uint64_t>, uint64_t>;  // (key, offset) -> length

bool Overlaps(const RangeMap& m, const RemoteRef& r, uint64_t len) {
  auto it = m.lower_bound({r.key, r.offset});
  if (it != m.end() && it->first.first == r.key && it->first.second < r.offset + len) return true;
  if (it != m.begin()) {
    --it;
    if (it->first.first == r.key && it->first.second + it->second > r.offset) return true;
  }
  return false;
}

Task<bool> RawCreate(Scheduler& s, RawClient& rc, RawSlot& sl, uint64_t length, uint64_t id,
                     LegitCounters& c, std::vector<std::byte>& buf, RangeMap& live) {
  auto a = co_await rc.alloc_raw(s, length);
  if (!a.ok()) {
    c.Error("alloc_raw: " + a.status().ToString());
    co_return false;
  }
  if (a->length < length) {
    c.Wrong(fmt::format("alloc_raw({}) granted {} bytes", length, a->length));
  }
  if (Overlaps(live, a->ref, a->length)) {
    c.Wrong(fmt::format("alloc_raw returned key {:#x} offset {} (+{}) overlapping a live range",
                        a->ref.key, a->ref.offset, a->length));
  }
  live[{a->ref.key, a->ref.offset}] = a->length;
  sl = RawSlot{a->ref, length, id, 1, true, false};
  buf.resize(length);
  soak::FillPattern(id, 1, buf);
  Status st = co_await s.write(sl.ref, buf.data(), length, /*delivery_complete=*/true);
  if (!st.ok()) {
    c.Error("raw write after alloc: " + st.ToString());
    sl.uncertain = true;
    sl.seq = 0;
  }
  co_return true;
}

Task<void> RawWorker(Scheduler& s, RawClient& rc, std::vector<RawSlot>& slots, LegitCounters& c,
                     uint64_t seed, std::atomic<uint64_t>& next_id, RangeMap& live) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> buf;
  auto length = [&] { return std::uniform_int_distribution<uint64_t>(64, 4096)(rng); };
  for (auto& sl : slots)
    co_await RawCreate(s, rc, sl, length(), next_id.fetch_add(1), c, buf, live);
  c.ready.fetch_add(1);
  size_t i = 0;
  while (!c.stop.load(std::memory_order_relaxed)) {
    RawSlot& sl = slots[i++ % slots.size()];
    const int op = static_cast<int>(rng() % 100);
    if (!sl.live) {
      if (co_await RawCreate(s, rc, sl, length(), next_id.fetch_add(1), c, buf, live))
        c.raw_ops.fetch_add(2, std::memory_order_relaxed);
      continue;
    }
    buf.resize(sl.length);
    if (op < 60) {
      Status st = co_await s.read(sl.ref, buf.data(), sl.length);
      if (!st.ok()) {
        c.Error("raw read: " + st.ToString());
        continue;
      }
      if (sl.seq == 0 && sl.uncertain) {
        // The first write failed: a fresh range holds whatever it held before, or seq 1.
        if (soak::PatternMatches(sl.id, 1, buf)) {
          sl.seq = 1;
          sl.uncertain = false;
        }
        c.raw_ops.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (CheckRead(sl, buf, c, "raw read")) c.raw_ops.fetch_add(1, std::memory_order_relaxed);
    } else if (op < 96) {
      soak::FillPattern(sl.id, sl.seq + 1, buf);
      Status st = co_await s.write(sl.ref, buf.data(), sl.length, /*delivery_complete=*/true);
      if (!st.ok()) {
        c.Error("raw write: " + st.ToString());
        sl.uncertain = true;
        continue;
      }
      ++sl.seq;
      sl.uncertain = false;
      c.raw_ops.fetch_add(1, std::memory_order_relaxed);
    } else {
      live.erase({sl.ref.key, sl.ref.offset});
      Status st = co_await rc.free_raw(s, sl.ref);
      sl.live = false;
      if (!st.ok()) {
        c.Error("free_raw: " + st.ToString());
        c.unfreed_raw.fetch_add(1);
        continue;
      }
      c.raw_ops.fetch_add(1, std::memory_order_relaxed);
    }
  }
  for (auto& sl : slots) {
    if (!sl.live) continue;
    live.erase({sl.ref.key, sl.ref.offset});
    Status st = co_await rc.free_raw(s, sl.ref);
    if (!st.ok()) {
      c.Error("free_raw at the end: " + st.ToString());
      c.unfreed_raw.fetch_add(1);
    }
    sl.live = false;
  }
}

// ---- Hostile clients ------------------------------------------------------------------------

struct HostileStats {
  uint64_t flood_opened = 0, flood_closed_by_server = 0, flood_connect_failed = 0;
  uint64_t garbage_sent = 0, garbage_closed_by_server = 0, garbage_left_open = 0;
  uint64_t slow_readers = 0, slow_read_requests = 0, slow_reader_errors = 0;
  uint64_t children_spawned = 0, children_killed = 0, children_exited_early = 0;
  uint64_t child_objects = 0, child_raw = 0;  // allocations the children reported
  std::vector<std::string> notes;

  void Add(const HostileStats& o) {
    flood_opened += o.flood_opened;
    flood_closed_by_server += o.flood_closed_by_server;
    flood_connect_failed += o.flood_connect_failed;
    garbage_sent += o.garbage_sent;
    garbage_closed_by_server += o.garbage_closed_by_server;
    garbage_left_open += o.garbage_left_open;
    slow_readers += o.slow_readers;
    slow_read_requests += o.slow_read_requests;
    slow_reader_errors += o.slow_reader_errors;
    children_spawned += o.children_spawned;
    children_killed += o.children_killed;
    children_exited_early += o.children_exited_early;
    child_objects += o.child_objects;
    child_raw += o.child_raw;
    for (const auto& n : o.notes)
      if (notes.size() < 8) notes.push_back(n);
  }
  nlohmann::json Json() const {
    return {{"flood_opened", flood_opened},
            {"flood_closed_by_server", flood_closed_by_server},
            {"flood_connect_failed", flood_connect_failed},
            {"garbage_sent", garbage_sent},
            {"garbage_closed_by_server", garbage_closed_by_server},
            {"garbage_left_open_at_deadline", garbage_left_open},
            {"slow_readers", slow_readers},
            {"slow_read_requests_1mib", slow_read_requests},
            {"slow_reader_errors", slow_reader_errors},
            {"children_spawned", children_spawned},
            {"children_killed", children_killed},
            {"children_exited_early", children_exited_early},
            {"child_objects_allocated", child_objects},
            {"child_raw_allocated", child_raw},
            {"notes", notes}};
  }
};

Result<sockaddr_in> ParseAddr(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return Status::InvalidArgument("bad address " + host_port);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::atoi(host_port.c_str() + colon + 1)));
  if (::inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &a.sin_addr) != 1)
    return Status::InvalidArgument("bad address " + host_port);
  return a;
}

// A non-blocking connection from `src_ip`; -1 on failure.
int ConnectFrom(const char* src_ip, const sockaddr_in& dst, int rcvbuf = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in src{};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, src_ip, &src.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0 ||
      (::connect(fd, reinterpret_cast<const sockaddr*>(&dst), sizeof(dst)) != 0 &&
       errno != EINPROGRESS)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// All hostile clients of one round, driven by one thread with poll().
class Hostile {
 public:
  Hostile(const SoakBenchOptions& o, std::string bootstrap, std::string data, std::string self)
      : o_(o), bootstrap_(std::move(bootstrap)), data_(std::move(data)), self_(std::move(self)) {}
  ~Hostile() { Stop(); }

  Status Start(uint64_t seed) {
    FARMEM_ASSIGN_OR_RETURN(boot_addr_, ParseAddr(bootstrap_));
    FARMEM_ASSIGN_OR_RETURN(data_addr_, ParseAddr(data_));
    seed_ = seed;
    stats_ = HostileStats{};
    stop_.store(false);
    thread_ = std::thread([this] { Loop(); });
    return Status::OK();
  }

  // Stops the round's hostile clients (closes every socket, kills and reaps every child) and
  // returns their counters; an empty set when no round was running.
  HostileStats Stop() {
    stop_.store(true);
    if (!thread_.joinable()) return HostileStats{};
    thread_.join();
    return stats_;
  }

 private:
  enum class Kind : uint8_t { kFlood, kGarbage, kSlow };
  struct Conn {
    int fd = -1;
    Kind kind = Kind::kFlood;
    soak::Port port = soak::Port::kBootstrap;
    bool connected = false;
    std::vector<uint8_t> out;
    size_t sent = 0;
    uint64_t requests = 0;  // slow reader: READs posted
    Clock::time_point opened, deadline;
  };
  struct Child {
    pid_t pid = -1;
    int out_fd = -1;
    Clock::time_point kill_at;
  };

  void Loop() {
    // This thread only (Linux nice is per thread); the killed clients fork from it and inherit it.
    if (o_.hostile_nice > 0 &&
        ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), o_.hostile_nice) != 0)
      stats_.notes.push_back(fmt::format("setpriority: {}", std::strerror(errno)));
    std::mt19937_64 rng(seed_);
    std::vector<Conn> conns;
    std::vector<Child> children;
    // Slow readers: learn the object region's key at the bootstrap, then flood it with READs.
    uint64_t region_key = 0;
    uint32_t read_len = kSlowReadBytes;
    if (o_.slow_readers > 0) {
      const size_t colon = bootstrap_.rfind(':');
      auto w = node::Handshake(bootstrap_.substr(0, colon),
                               static_cast<uint16_t>(std::atoi(bootstrap_.c_str() + colon + 1)),
                               {kToken, "soak-slow-reader", "127.0.0.1:1", "tcp"}, 2000ms);
      if (!w.ok()) {
        stats_.slow_reader_errors++;
        stats_.notes.push_back("slow reader handshake: " + w.status().ToString());
      } else {
        for (const auto& r : w->regions)
          if (r.name == "objects") {
            region_key = r.key;
            read_len = static_cast<uint32_t>(std::min<uint64_t>(kSlowReadBytes, r.length));
          }
        for (int i = 0; i < o_.slow_readers && region_key != 0; ++i) {
          Conn c;
          c.kind = Kind::kSlow;
          c.port = soak::Port::kData;
          c.fd = ConnectFrom(kSlowReaderIp, data_addr_, 4096);
          if (c.fd < 0) {
            stats_.slow_reader_errors++;
            continue;
          }
          tcpwire::ByteQueue q;
          tcpwire::EncodeHello(q, kToken);
          c.out.assign(q.data(), q.data() + q.size());
          c.opened = Clock::now();
          stats_.slow_readers++;
          conns.push_back(std::move(c));
        }
      }
    }
    uint64_t slow_seq = 1;
    auto flood_count = [&](soak::Port p) {
      return std::count_if(conns.begin(), conns.end(),
                           [&](const Conn& c) { return c.kind == Kind::kFlood && c.port == p; });
    };
    const auto garbage_every = o_.garbage_per_second > 0
                                   ? std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(1.0 / o_.garbage_per_second))
                                   : Clock::duration::max();
    auto next_garbage = Clock::now();
    auto next_churn = Clock::now() + 1s;
    uint64_t garbage_n = 0;
    double flood_tokens[2] = {static_cast<double>(o_.flood_connections),
                              static_cast<double>(o_.flood_connections)};
    auto last_refill = Clock::now();
    std::vector<pollfd> pfds;
    std::vector<int> who;  // pfds[i] -> conns index (>= 0) or child index (-1 - idx)
    char scratch[16384];

    while (!stop_.load()) {
      const auto now = Clock::now();
      // Floods: keep flood_connections open per port, replacing what the server closed; churn
      // a tenth of them every second.
      for (soak::Port p : {soak::Port::kBootstrap, soak::Port::kData}) {
        // At most flood_connections new connections per second and port (a token bucket): a
        // flood from other machines would not take this machine's CPUs, so the benchmark's own
        // share stays small.
        double& tokens = flood_tokens[p == soak::Port::kBootstrap ? 0 : 1];
        tokens =
            std::min<double>(o_.flood_connections,
                             tokens + std::chrono::duration<double>(now - last_refill).count() *
                                          o_.flood_connections);
        auto have = flood_count(p);
        for (; tokens >= 1 && have < o_.flood_connections; tokens -= 1, ++have) {
          Conn c;
          c.kind = Kind::kFlood;
          c.port = p;
          c.fd = ConnectFrom(kFloodIp, p == soak::Port::kBootstrap ? boot_addr_ : data_addr_);
          if (c.fd < 0) {
            stats_.flood_connect_failed++;
            break;
          }
          c.opened = now;
          stats_.flood_opened++;
          conns.push_back(std::move(c));
        }
      }
      last_refill = now;
      if (now >= next_churn) {
        next_churn = now + 1s;
        size_t closed = 0;
        const size_t tenth = static_cast<size_t>(o_.flood_connections) / 10;
        for (auto& c : conns)
          if (c.kind == Kind::kFlood && c.fd >= 0 && closed < tenth) {
            ::close(c.fd);
            c.fd = -1;
            ++closed;
          }
      }
      // Garbage: one connection per period, alternating ports and variants.
      while (o_.garbage_per_second > 0 && now >= next_garbage) {
        next_garbage += garbage_every;
        const soak::Port p = garbage_n % 2 ? soak::Port::kData : soak::Port::kBootstrap;
        const int variant = static_cast<int>((garbage_n / 2) % soak::kGarbageVariants);
        ++garbage_n;
        Conn c;
        c.kind = Kind::kGarbage;
        c.port = p;
        c.fd = ConnectFrom(kGarbageIp, p == soak::Port::kBootstrap ? boot_addr_ : data_addr_);
        if (c.fd < 0) continue;
        c.out = soak::GarbageFrame(p, variant, rng(), kToken);
        c.opened = now;
        c.deadline = now + 3s;
        stats_.garbage_sent++;
        conns.push_back(std::move(c));
      }
      // Killed clients: keep killed_clients children alive, each SIGKILLed 0.3-1.5 s after start.
      for (auto& ch : children) {
        int st = 0;
        if (ch.pid > 0 && now >= ch.kill_at) {
          ::kill(ch.pid, SIGKILL);
          ::waitpid(ch.pid, &st, 0);
          stats_.children_killed++;
          ch.pid = -1;
        } else if (ch.pid > 0 && ::waitpid(ch.pid, &st, WNOHANG) == ch.pid) {
          stats_.children_exited_early++;
          if (stats_.notes.size() < 8)
            stats_.notes.push_back(fmt::format("a child exited on its own (status {:#x})", st));
          ch.pid = -1;
        }
        if (ch.pid < 0 && ch.out_fd >= 0) {
          Drain(ch);
          ::close(ch.out_fd);
          ch.out_fd = -1;
        }
      }
      std::erase_if(children, [](const Child& c) { return c.pid < 0 && c.out_fd < 0; });
      while (static_cast<int>(children.size()) < o_.killed_clients) {
        int fds[2];
        if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) break;
        auto pid = Spawn(
            {self_, "bench", "soak-child", "--connect", bootstrap_, "--token", kToken, "--seed",
             std::to_string(rng()), "--ops-per-second", fmt::format("{}", o_.child_ops_per_second)},
            fds[1], -1);
        ::close(fds[1]);
        if (!pid.ok()) {
          ::close(fds[0]);
          if (stats_.notes.size() < 8) stats_.notes.push_back("spawn: " + pid.status().ToString());
          break;
        }
        stats_.children_spawned++;
        children.push_back({*pid, fds[0], now + std::chrono::milliseconds(300 + rng() % 1200)});
      }
      // Slow readers: keep posting 1 MiB READs; never read a reply.
      for (auto& c : conns) {
        if (c.kind != Kind::kSlow || c.fd < 0 || c.sent < c.out.size() ||
            c.requests >= kSlowReadsPerConnection)
          continue;
        tcpwire::ByteQueue q;
        for (int k = 0; k < 16; ++k) tcpwire::EncodeRead(q, slow_seq++, region_key, 0, read_len);
        c.out.assign(q.data(), q.data() + q.size());
        c.sent = 0;
        stats_.slow_read_requests += 16;
        c.requests += 16;
      }

      // Poll everything for 10 ms.
      pfds.clear();
      who.clear();
      for (size_t i = 0; i < conns.size(); ++i) {
        const Conn& c = conns[i];
        if (c.fd < 0) continue;
        short ev = 0;
        if (!c.connected || c.sent < c.out.size()) ev |= POLLOUT;
        if (c.kind != Kind::kSlow) ev |= POLLIN;
        pfds.push_back({c.fd, ev, 0});
        who.push_back(static_cast<int>(i));
      }
      for (size_t i = 0; i < children.size(); ++i) {
        if (children[i].out_fd < 0) continue;
        pfds.push_back({children[i].out_fd, POLLIN, 0});
        who.push_back(-1 - static_cast<int>(i));
      }
      ::poll(pfds.data(), pfds.size(), 10);
      for (size_t k = 0; k < pfds.size(); ++k) {
        if (who[k] < 0) {
          if (pfds[k].revents & (POLLIN | POLLHUP))
            Drain(children[static_cast<size_t>(-1 - who[k])]);
          continue;
        }
        Conn& c = conns[static_cast<size_t>(who[k])];
        const short re = pfds[k].revents;
        if (re & (POLLOUT | POLLERR | POLLHUP)) c.connected = true;
        if ((re & POLLOUT) && c.sent < c.out.size()) {
          const ssize_t n =
              ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
          if (n > 0) c.sent += static_cast<size_t>(n);
        }
        if (c.kind != Kind::kSlow && (re & (POLLIN | POLLHUP | POLLERR))) {
          const ssize_t n = ::recv(c.fd, scratch, sizeof(scratch), MSG_DONTWAIT);
          if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
            (c.kind == Kind::kFlood ? stats_.flood_closed_by_server
                                    : stats_.garbage_closed_by_server)++;
            ::close(c.fd);
            c.fd = -1;
          }
        }
        if (c.kind == Kind::kSlow && (re & (POLLERR | POLLHUP))) {
          stats_.slow_reader_errors++;
          ::close(c.fd);
          c.fd = -1;
        }
      }
      const auto after = Clock::now();
      for (auto& c : conns) {
        if (c.kind == Kind::kGarbage && c.fd >= 0 && after >= c.deadline) {
          stats_.garbage_left_open++;
          ::close(c.fd);
          c.fd = -1;
        }
      }
      std::erase_if(conns, [](const Conn& c) { return c.fd < 0; });
    }
    for (auto& c : conns) ::close(c.fd);
    for (auto& ch : children) {
      if (ch.pid > 0) {
        ::kill(ch.pid, SIGKILL);
        int st = 0;
        ::waitpid(ch.pid, &st, 0);
        stats_.children_killed++;
      }
      if (ch.out_fd >= 0) {
        Drain(ch);
        ::close(ch.out_fd);
      }
    }
  }

  void Drain(Child& ch) {
    char buf[4096];
    ssize_t n;
    while ((n = ::read(ch.out_fd, buf, sizeof(buf))) > 0) {
      for (ssize_t i = 0; i < n; ++i) (buf[i] == 'o' ? stats_.child_objects : stats_.child_raw)++;
    }
  }

  const SoakBenchOptions& o_;
  std::string bootstrap_, data_, self_;
  sockaddr_in boot_addr_{}, data_addr_{};
  uint64_t seed_ = 0;
  HostileStats stats_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ---- Helpers --------------------------------------------------------------------------------

Result<nlohmann::json> Stat(RawClient& rc) {
  FARMEM_ASSIGN_OR_RETURN(std::string text, rc.stats_json());
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Protocol("STAT is not a JSON object");
  return j;
}

struct RoundResult {
  double base_ops = 0, hostile_ops = 0;  // legitimate ops/s
  uint64_t base_rss = 0, hostile_rss = 0;
  uint64_t errors_base = 0, errors_hostile = 0, wrong = 0;
  double base_seconds = 0, hostile_seconds = 0;
  HostileStats hostile;
};

Status Validate(SoakBenchOptions& o) {
  if (o.quick) {
    o.minutes = 1.5;
    if (o.rounds == 0) o.rounds = 5;
  }
  if (o.rounds == 0) o.rounds = std::clamp(static_cast<int>(std::lround(o.minutes)), 5, 30);
  if (o.rounds < 5) return Status::InvalidArgument("--rounds must be at least 5");
  return Status::OK();
}

}  // namespace

int RunSoakBench(SoakBenchOptions o) {
  if (Status st = Validate(o); !st.ok()) {
    fmt::print(stderr, "{}: {}\n", kSoakProg, st.ToString());
    return 2;
  }
  bench::QuietBenchLogging();
  ::signal(SIGPIPE, SIG_IGN);
  const auto t_start = Clock::now();
  auto busy = bench::CpuBusyFraction(300ms);
  nlohmann::json machine = bench::MachineInfo();
  if (busy) machine["cpu_busy_before_run"] = *busy;

  // Fixed costs: start + load (~5 s), the leak check (up to TTL + margin), teardown.
  const double fixed = 5 + soak::kAssumedSessionTtlSeconds + soak::kLeakWaitMarginSeconds;
  const double per_round = std::max(2.0, (o.minutes * 60 - fixed) / (2.0 * o.rounds) -
                                             std::chrono::duration<double>(kSettle).count());
  const auto round_len =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(per_round));

  const std::string farmemd_bin = FindFarmemd(o.farmemd);
  if (farmemd_bin.empty()) {
    fmt::print(stderr, "{}: farmemd not found next to farmem nor on PATH (give --farmemd)\n",
               kSoakProg);
    return 1;
  }
  std::error_code ec;
  const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();

  Farmemd server;
  if (Status st = server.Start(farmemd_bin, 15000ms); !st.ok()) {
    fmt::print(stderr, "{}: cannot start farmemd: {}\n", kSoakProg, st.ToString());
    return 1;
  }
  fmt::print(
      "{}: farmemd (pid {}) with its default flags: {} (bootstrap {}, data {}; log {}, "
      "kept if the run fails)\n",
      kSoakProg, server.pid(), fmt::join(server.args(), " "), server.bootstrap(),
      server.data_address(), server.log_path());
  fmt::print(
      "{} rounds x (baseline {:.1f} s + hostile {:.1f} s), settle {} ms after each change; "
      "legitimate: {} objects + {} raw ranges, {} coroutines per thread; hostile: {} slow "
      "readers, {} flood connections per port, {} garbage connections/s, {} killed clients at "
      "once ({}); hostile generators at nice {}\n",
      o.rounds, per_round, per_round, kSettle.count(), o.objects, o.raw_ranges, o.inflight,
      o.slow_readers, o.flood_connections, o.garbage_per_second, o.killed_clients,
      o.child_ops_per_second > 0 ? fmt::format("{} loops/s each", o.child_ops_per_second)
                                 : std::string("unpaced"),
      o.hostile_nice);
  std::fflush(stdout);

  // Client node, object and raw clients.
  bench::ObjectsServerSetup setup;
  setup.token = kToken;
  auto node = bench::MakeObjectsClientNode(setup, "soak-legit");
  if (!node.ok()) {
    fmt::print(stderr, "{}: client node: {}\n", kSoakProg, node.status().ToString());
    return 1;
  }
  const std::vector<std::string> servers = {server.bootstrap()};
  auto oc = ObjectClient::Connect(**node, servers);
  auto rc = RawClient::Connect(**node, server.bootstrap());
  if (!oc.ok() || !rc.ok()) {
    fmt::print(stderr, "{}: connect: {}\n", kSoakProg,
               (!oc.ok() ? oc.status() : rc.status()).ToString());
    return 1;
  }
  auto stat0 = Stat(**rc);
  if (!stat0.ok()) {
    fmt::print(stderr, "{}: STAT: {}\n", kSoakProg, stat0.status().ToString());
    return 1;
  }
  const soak::StatCounts counts0 = soak::ParseStatCounts(*stat0);
  const uint32_t max_obj = std::min<uint32_t>(1024, (*oc)->server_info(0).max_object_size());

  RssMonitor rss(server, static_cast<size_t>(2 * o.rounds));
  LegitCounters legit;
  std::atomic<uint64_t> next_id{1};
  const int k = o.inflight;
  std::vector<std::vector<ObjSlot>> obj_slots(static_cast<size_t>(k));
  std::vector<std::vector<RawSlot>> raw_slots(static_cast<size_t>(k));
  for (int i = 0; i < o.objects; ++i) obj_slots[static_cast<size_t>(i % k)].emplace_back();
  for (int i = 0; i < o.raw_ranges; ++i) raw_slots[static_cast<size_t>(i % k)].emplace_back();
  std::erase_if(obj_slots, [](const auto& v) { return v.empty(); });
  std::erase_if(raw_slots, [](const auto& v) { return v.empty(); });
  const int workers = static_cast<int>(obj_slots.size() + raw_slots.size());
  const auto run_limit = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(o.minutes * 60 * 2 + 120));
  std::atomic<int> thread_failures{0};
  std::thread obj_thread([&] {
    auto s = (*node)->make_scheduler();
    if (!s.ok()) {
      legit.Error("scheduler: " + s.status().ToString());
      thread_failures++;
      return;
    }
    for (size_t i = 0; i < obj_slots.size(); ++i)
      (*s)->spawn(ObjWorker(**s, **oc, obj_slots[i], legit, 1000 + i, next_id, max_obj));
    if (Status st = (*s)->run(run_limit); !st.ok()) thread_failures++;
  });
  RangeMap live_ranges;
  std::thread raw_thread([&] {
    auto s = (*node)->make_scheduler();
    if (!s.ok()) {
      legit.Error("scheduler: " + s.status().ToString());
      thread_failures++;
      return;
    }
    for (size_t i = 0; i < raw_slots.size(); ++i)
      (*s)->spawn(RawWorker(**s, **rc, raw_slots[i], legit, 2000 + i, next_id, live_ranges));
    if (Status st = (*s)->run(run_limit); !st.ok()) thread_failures++;
  });
  auto stop_legit = [&] {
    legit.stop.store(true);
    if (obj_thread.joinable()) obj_thread.join();
    if (raw_thread.joinable()) raw_thread.join();
  };
  {
    const auto deadline = Clock::now() + 60s;
    while (legit.ready.load() < workers && Clock::now() < deadline && thread_failures.load() == 0)
      std::this_thread::sleep_for(20ms);
    if (legit.ready.load() < workers) {
      fmt::print(stderr, "{}: the legitimate clients did not finish loading within 60 s\n",
                 kSoakProg);
      stop_legit();
      return 1;
    }
  }
  fmt::print("loaded in {:.1f} s ({} errors so far)\n", SecondsSince(t_start), legit.errors.load());
  std::fflush(stdout);

  Hostile hostile(o, server.bootstrap(), server.data_address(), self);
  std::vector<RoundResult> rounds;
  HostileStats hostile_total;
  Status failure;
  // Measures one phase: settle, count ops over round_len, keep the RSS peak.
  auto measure = [&](int phase, double* ops_per_s, uint64_t* peak, double* secs, uint64_t* errs) {
    std::this_thread::sleep_for(kSettle);
    rss.SetPhase(phase);
    const uint64_t ops0 = legit.Ops(), err0 = legit.errors.load();
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < round_len) {
      std::this_thread::sleep_for(50ms);
      if (!server.Alive())
        return Status::Unavailable(fmt::format("farmemd exited (status {:#x}); log: {}",
                                               server.exit_status(), server.LogTail()));
    }
    *secs = SecondsSince(t0);
    *ops_per_s = static_cast<double>(legit.Ops() - ops0) / *secs;
    *errs = legit.errors.load() - err0;
    rss.SetPhase(-1);
    *peak = rss.Peak(static_cast<size_t>(phase));
    return Status::OK();
  };
  for (int r = 0; r < o.rounds && failure.ok(); ++r) {
    RoundResult rr;
    const uint64_t wrong0 = legit.wrong.load();
    failure = measure(2 * r, &rr.base_ops, &rr.base_rss, &rr.base_seconds, &rr.errors_base);
    if (!failure.ok()) break;
    if (Status st = hostile.Start(0x50a4 + static_cast<uint64_t>(r)); !st.ok()) {
      failure = st;
      break;
    }
    failure = measure(2 * r + 1, &rr.hostile_ops, &rr.hostile_rss, &rr.hostile_seconds,
                      &rr.errors_hostile);
    rr.hostile = hostile.Stop();
    hostile_total.Add(rr.hostile);
    rr.wrong = legit.wrong.load() - wrong0;
    if (!failure.ok()) break;
    const auto& h = rr.hostile;
    fmt::print(
        "round {}/{}: legit {} -> {} with hostile ({}); farmemd RSS {:.1f} -> {:.1f} MiB; "
        "errors {}/{}, wrong {}; hostile: {} flood conns ({} closed by farmemd), {} garbage ({} "
        "closed), {} slow readers ({} x 1 MiB READs), {} clients killed ({} obj + {} raw "
        "allocs reported){}\n",
        r + 1, o.rounds, bench::FormatRate(rr.base_ops), bench::FormatRate(rr.hostile_ops),
        bench::FormatRatio(bench::Ratio(rr.hostile_ops, rr.base_ops)), Mib(rr.base_rss),
        Mib(rr.hostile_rss), rr.errors_base, rr.errors_hostile, rr.wrong, h.flood_opened,
        h.flood_closed_by_server, h.garbage_sent, h.garbage_closed_by_server, h.slow_readers,
        h.slow_read_requests, h.children_killed, h.child_objects, h.child_raw,
        h.children_exited_early ? fmt::format(", {} exited early", h.children_exited_early)
                                : std::string());
    std::fflush(stdout);
    rounds.push_back(std::move(rr));
  }
  hostile_total.Add(hostile.Stop());
  stop_legit();
  if (!failure.ok()) {
    fmt::print(stderr, "{}: {}\n", kSoakProg, failure.ToString());
    return 1;
  }
  if (thread_failures.load() != 0)
    fmt::print(stderr, "{}: warning: a legitimate client thread did not finish cleanly\n",
               kSoakProg);

  // Leak check: every client is gone (the legitimate ones freed what they held; the killed ones
  // could not). Poll STAT until the counts are back to where they were before the run, for at
  // most the session TTL + margin.
  const int64_t unfreed_obj = legit.unfreed_objects.load(), unfreed_raw = legit.unfreed_raw.load();
  auto stat_now = Stat(**rc);
  soak::StatCounts counts = stat_now.ok() ? soak::ParseStatCounts(*stat_now) : soak::StatCounts{};
  const double wait_s = soak::LeakWaitSeconds(counts);
  const auto t_leak = Clock::now();
  auto leaked_obj = [&] {
    return std::max<int64_t>(0, counts.live_objects - counts0.live_objects - unfreed_obj);
  };
  auto leaked_raw = [&] {
    return std::max<int64_t>(0, counts.raw_allocations - counts0.raw_allocations - unfreed_raw);
  };
  fmt::print(
      "leak check: {} objects and {} raw allocations above the start; waiting up to {:.0f} s "
      "(session TTL {}{})\n",
      leaked_obj(), leaked_raw(), wait_s,
      counts.session_ttl_seconds ? fmt::format("{:.1f} s from STAT", *counts.session_ttl_seconds)
                                 : fmt::format("{:.0f} s assumed", soak::kAssumedSessionTtlSeconds),
      counts.has_sessions ? "" : "; STAT has no sessions section");
  std::fflush(stdout);
  while (stat_now.ok() && (leaked_obj() > 0 || leaked_raw() > 0) && SecondsSince(t_leak) < wait_s) {
    std::this_thread::sleep_for(500ms);
    stat_now = Stat(**rc);
    if (stat_now.ok()) counts = soak::ParseStatCounts(*stat_now);
  }
  const double leak_wait = SecondsSince(t_leak);
  if (!stat_now.ok()) {
    fmt::print(stderr, "{}: STAT after the run: {}\n", kSoakProg, stat_now.status().ToString());
  }
  const int64_t leaked = stat_now.ok() ? leaked_obj() + leaked_raw() : -1;

  // Targets.
  std::vector<double> base_ops, hostile_ops, base_rss, hostile_rss;
  uint64_t wrong_total = legit.wrong.load();
  for (const auto& r : rounds) {
    base_ops.push_back(r.base_ops);
    hostile_ops.push_back(r.hostile_ops);
    base_rss.push_back(static_cast<double>(r.base_rss));
    hostile_rss.push_back(static_cast<double>(r.hostile_rss));
  }
  std::vector<bench::TargetRecord> targets;
  targets.push_back(soak::JudgeThroughput(hostile_ops, base_ops, 0.8));
  targets.push_back(
      soak::JudgeRss(hostile_rss, base_rss, static_cast<double>(counts0.budget_bytes), 1.1));
  targets.push_back(soak::JudgeZero(
      "allocations leaked after all clients are gone", leaked < 0 ? std::nan("") : double(leaked),
      fmt::format("{} objects + {} raw allocations above the start after waiting {:.1f} s "
                  "(STAT {} sessions section); the killed clients reported {} objects and {} "
                  "raw ranges allocated",
                  leaked_obj(), leaked_raw(), leak_wait, counts.has_sessions ? "has a" : "has no",
                  hostile_total.child_objects, hostile_total.child_raw)));
  targets.push_back(soak::JudgeZero(
      "wrong results seen by the legitimate clients", static_cast<double>(wrong_total),
      wrong_total == 0 ? std::string("every read returned the bytes last written")
                       : legit.wrong_samples.front()));

  fmt::print("\nTargets\n");
  for (const auto& t : targets) {
    std::string ratio = t.ratio ? bench::FormatRatio(*t.ratio) : std::string("-");
    if (t.ratio_min && t.ratio_max)
      ratio += fmt::format(" (rounds {:.2f}-{:.2f}x)", *t.ratio_min, *t.ratio_max);
    fmt::print("  [{:<4}] {}: {:.4g} vs {:.4g}, ratio {}, limit {}\n         {}\n",
               bench::TargetResultName(t.result), t.name, t.value, t.baseline, ratio, t.limit,
               t.detail);
  }
  fmt::print("legitimate ops with an error: {} (first: {})\n", legit.errors.load(),
             legit.error_samples.empty() ? "none" : legit.error_samples.front());
  const double wall = SecondsSince(t_start);
  fmt::print("wall time {:.1f} s\n", wall);
  std::fflush(stdout);

  if (!o.json_path.empty()) {
    nlohmann::json j;
    j["benchmark"] = "farmem bench soak";
    if (double load[3]; ::getloadavg(load, 3) == 3)
      machine["loadavg_at_end"] = {load[0], load[1], load[2]};
    j["machine"] = machine;
    j["options"] = {{"minutes", o.minutes},
                    {"quick", o.quick},
                    {"rounds", o.rounds},
                    {"round_seconds", per_round},
                    {"settle_ms", kSettle.count()},
                    {"objects", o.objects},
                    {"raw_ranges", o.raw_ranges},
                    {"inflight", o.inflight},
                    {"slow_readers", o.slow_readers},
                    {"flood_connections", o.flood_connections},
                    {"garbage_per_second", o.garbage_per_second},
                    {"killed_clients", o.killed_clients},
                    {"child_ops_per_second", o.child_ops_per_second},
                    {"hostile_nice", o.hostile_nice}};
    j["server"] = {{"command", server.args()},
                   {"configuration", "farmemd default flags (only --listen port ephemeral)"}};
    nlohmann::json jr = nlohmann::json::array();
    for (const auto& r : rounds) {
      jr.push_back({{"baseline_ops_per_sec", r.base_ops},
                    {"hostile_ops_per_sec", r.hostile_ops},
                    {"baseline_peak_rss_bytes", r.base_rss},
                    {"hostile_peak_rss_bytes", r.hostile_rss},
                    {"baseline_seconds", r.base_seconds},
                    {"hostile_seconds", r.hostile_seconds},
                    {"errors_baseline", r.errors_base},
                    {"errors_hostile", r.errors_hostile},
                    {"wrong", r.wrong},
                    {"hostile", r.hostile.Json()}});
    }
    j["rounds"] = std::move(jr);
    j["hostile_total"] = hostile_total.Json();
    j["legit"] = {{"object_ops", legit.obj_ops.load()},
                  {"raw_ops", legit.raw_ops.load()},
                  {"errors", legit.errors.load()},
                  {"error_samples", legit.error_samples},
                  {"wrong", wrong_total},
                  {"wrong_samples", legit.wrong_samples},
                  {"unfreed_objects", unfreed_obj},
                  {"unfreed_raw", unfreed_raw}};
    j["leak_check"] = {{"objects_at_start", counts0.live_objects},
                       {"raw_allocations_at_start", counts0.raw_allocations},
                       {"objects_at_end", counts.live_objects},
                       {"raw_allocations_at_end", counts.raw_allocations},
                       {"leaked_objects", leaked_obj()},
                       {"leaked_raw", leaked_raw()},
                       {"waited_seconds", leak_wait},
                       {"wait_limit_seconds", wait_s},
                       {"session_ttl_seconds", counts.session_ttl_seconds
                                                   ? nlohmann::json(*counts.session_ttl_seconds)
                                                   : nlohmann::json(nullptr)},
                       {"sessions", counts.sessions}};
    j["peak_rss_bytes_whole_run"] = rss.Overall();
    if (stat_now.ok()) {
      for (const char* key : {"limits", "memory", "sessions", "rpc"})
        if (stat_now->contains(key)) j["stat_at_end"][key] = (*stat_now)[key];
    }
    j["wall_seconds"] = wall;
    j["targets"] = bench::TargetsJson(targets);
    if (Status st = bench::WriteJsonFile(o.json_path, j); !st.ok()) {
      fmt::print(stderr, "{}: {}\n", kSoakProg, st.message());
      return 1;
    }
    fmt::print("Results written to {}\n", o.json_path);
  }
  rc->reset();
  oc->reset();
  server.Stop();
  ::unlink(server.log_path().c_str());  // kept only when the run fails
  return 0;
}

int RunSoakChild(const SoakChildOptions& o) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  bench::QuietBenchLogging();
  spdlog::set_level(spdlog::level::off);
  const auto t0 = Clock::now();
  bench::ObjectsServerSetup setup;
  setup.token = o.token;
  auto node = bench::MakeObjectsClientNode(setup, "soak-child");
  if (!node.ok()) return 1;
  const std::vector<std::string> servers = {o.connect};
  auto oc = ObjectClient::Connect(**node, servers);
  auto rc = RawClient::Connect(**node, o.connect);
  if (!oc.ok() || !rc.ok()) return 1;
  std::mt19937_64 rng(o.seed);
  std::vector<Ptr> objs;
  std::vector<RemoteRef> ranges;
  auto sched = (*node)->make_scheduler();
  if (!sched.ok()) return 1;
  std::vector<std::byte> buf(16384);
  constexpr size_t kHeld = 32;
  for (uint64_t iteration = 0; SecondsSince(t0) < o.max_seconds; ++iteration) {
    if (o.ops_per_second > 0)
      std::this_thread::sleep_until(
          t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                   static_cast<double>(iteration) / o.ops_per_second)));
    if (objs.size() < kHeld || rng() % 4 == 0) {
      auto p = (*oc)->alloc(64 + rng() % 960);
      if (p.ok()) {
        (void)!::write(STDOUT_FILENO, "o", 1);
        soak::FillPattern(rng(), 1, std::span(buf).first(64));
        (void)(*oc)->write(*p, std::span(buf).first(64));
        objs.push_back(*p);
      }
    } else {
      const size_t i = rng() % objs.size();
      (void)(*oc)->free(objs[i]);
      objs.erase(objs.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (ranges.size() < kHeld || rng() % 4 == 0) {
      auto a = (*rc)->alloc_raw(4096 + rng() % 12288);
      if (a.ok()) {
        (void)!::write(STDOUT_FILENO, "r", 1);
        (void)(*sched)->block_on((*sched)->write(a->ref, buf.data(), 4096, true));
        ranges.push_back(a->ref);
      }
    } else {
      const size_t i = rng() % ranges.size();
      (void)(*rc)->free_raw(ranges[i]);
      ranges.erase(ranges.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  return 0;
}

}  // namespace farmem
