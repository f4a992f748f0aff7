// `farmem demo`: a guided tour of the raw memory service — alloc, one-sided write/read, CAS,
// 16 FAAs in flight on coroutines, STAT, free, double free — then of the object store (alloc,
// write, direct_read, free 75 %, compact, read_any with pointer correction), then of a tiered
// region twice its DRAM budget (write it all, read it back, read a hot part until it is promoted),
// then of Storm transactions (transfers, an audit, forced conflicts shown as aborts), then of
// channels across 3 embedded nodes (barrier, ticket lock, atomic counter), then of remote regions
// (a FUSE mount read back by a forked child after a RegionSync barrier), each step checked and
// timed. Runs against an embedded in-process farmemd — which first joins an in-process control
// plane (memory://demo) where the client finds it — or running ones given with
// --connect or found in a cluster with --cluster.
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/demo_regions.h"
#include "cli/demo_steps.h"
#include "common/log.h"
#include "farmem/channels.h"
#include "farmem/client.h"
#include "farmem/cluster.h"
#include "farmem/objects.h"
#include "farmem/server.h"
#include "farmem/tier.h"
#include "farmem/tx.h"

namespace farmem::cli {
namespace {

RemoteRef At(RemoteRef ref, uint64_t delta) {
  ref.offset += delta;
  return ref;
}

struct FaaResult {
  Status status;
  uint64_t old = 0;
};

Task<void> FetchAddOne(Scheduler* sched, RemoteRef ref, FaaResult* out) {
  Result<uint64_t> r = co_await sched->fetch_add(ref, 1);
  out->status = r.status();
  if (r.ok()) out->old = *r;
}

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%#" PRIx64, v);
  return buf;
}

// Runs every step against the farmemd at `address`; returns false if any check failed.
bool RunSteps(Node& node, const std::string& address) {
  constexpr size_t kLen = 4096;
  constexpr size_t kWords = kLen / sizeof(uint64_t);
  StepLog log;

  auto t0 = Clock::now();
  auto client = RawClient::Connect(node, address);
  if (!log.Report("connect", client.ok(), MicrosSince(t0),
                  client.ok() ? "server '" + (*client)->server().name + "' transport " +
                                    (*client)->server().transport_address
                              : client.status().ToString())) {
    return false;
  }
  RawClient& rc = **client;
  auto made = node.make_scheduler();
  if (!made.ok()) {
    log.Report("scheduler", false, 0, made.status().ToString());
    return false;
  }
  Scheduler& sched = **made;

  t0 = Clock::now();
  Result<RawAllocation> a = sched.block_on(rc.alloc_raw(sched, kLen));
  if (!log.Report("alloc 4 KiB", a.ok(), MicrosSince(t0),
                  a.ok()
                      ? "pool key " + Hex(a->ref.key) + " offset " + std::to_string(a->ref.offset) +
                            " length " + std::to_string(a->length)
                      : a.status().ToString())) {
    return false;
  }
  const RemoteRef ref = a->ref;

  std::vector<uint64_t> pattern(kWords);
  for (size_t i = 0; i < kWords; ++i) pattern[i] = 0x9e3779b97f4a7c15ull * (i + 1) ^ ref.offset;
  t0 = Clock::now();
  Status w = sched.block_on(sched.write(ref, pattern.data(), kLen, /*delivery_complete=*/true));
  log.Report("write 4 KiB pattern", w.ok(), MicrosSince(t0), w.ok() ? "" : w.ToString());

  std::vector<uint64_t> back(kWords, 0);
  t0 = Clock::now();
  Status r = sched.block_on(sched.read(ref, back.data(), kLen));
  const double read_us = MicrosSince(t0);
  std::string detail = r.ok() ? "pattern verified" : r.ToString();
  bool same = r.ok() && back == pattern;
  if (r.ok() && !same) {
    size_t i = std::mismatch(back.begin(), back.end(), pattern.begin()).first - back.begin();
    detail = "mismatch at word " + std::to_string(i);
  }
  log.Report("read 4 KiB + verify", same, read_us, detail);

  t0 = Clock::now();
  Result<uint64_t> cas = sched.block_on(sched.compare_swap(ref, pattern[0], 42));
  log.Report("CAS (expect swap)", cas.ok() && *cas == pattern[0], MicrosSince(t0),
             cas.ok() ? "old " + Hex(*cas) + " -> 42" : cas.status().ToString());
  t0 = Clock::now();
  Result<uint64_t> cas2 = sched.block_on(sched.compare_swap(ref, pattern[0], 7));
  log.Report(
      "CAS (expect no swap)", cas2.ok() && *cas2 == 42, MicrosSince(t0),
      cas2.ok() ? "word is " + std::to_string(*cas2) + ", unchanged" : cas2.status().ToString());

  // 16 fetch-and-adds in flight at once on one word: every old value must be distinct and the
  // final value must be the start + 16 (atomicity across concurrent operations).
  constexpr int kFaa = 16;
  const RemoteRef counter = At(ref, 64);
  const uint64_t start = pattern[64 / sizeof(uint64_t)];
  std::vector<FaaResult> faa(kFaa);
  t0 = Clock::now();
  for (int i = 0; i < kFaa; ++i) sched.spawn(FetchAddOne(&sched, counter, &faa[i]));
  Status ran = sched.run(std::chrono::seconds(30));
  const double faa_us = MicrosSince(t0);
  uint64_t final_value = 0;
  Status fr =
      ran.ok() ? sched.block_on(sched.read(counter, &final_value, sizeof(final_value))) : ran;
  std::vector<uint64_t> olds;
  Status first_error = fr;
  for (const auto& f : faa) {
    if (!f.status.ok() && first_error.ok()) first_error = f.status;
    olds.push_back(f.old);
  }
  std::sort(olds.begin(), olds.end());
  bool faa_ok = first_error.ok() && final_value == start + kFaa;
  for (int i = 0; faa_ok && i < kFaa; ++i) faa_ok = olds[i] == start + i;
  log.Report("FAA x16 in flight", faa_ok, faa_us,
             first_error.ok() ? "counter +" + std::to_string(final_value - start) +
                                    ", olds distinct: " + (faa_ok ? "yes" : "NO")
                              : first_error.ToString());

  t0 = Clock::now();
  Result<std::string> st_text = sched.block_on(rc.stats_json(sched));
  bool stat_ok = false;
  std::string stat_detail = st_text.ok() ? "" : st_text.status().ToString();
  if (st_text.ok()) {
    const nlohmann::json st = nlohmann::json::parse(*st_text);  // validated by stats_json()
    const auto& mem = st["memory"];
    const uint64_t allocs = mem.value("allocations", uint64_t{0});
    stat_ok = allocs >= 1 && st.contains("node");
    stat_detail = "node '" + st.value("node", std::string("?")) + "', " + std::to_string(allocs) +
                  " allocation(s), " + FormatBytes(mem.value("allocated_bytes", uint64_t{0})) +
                  " allocated in " + std::to_string(mem.value("pools", uint64_t{0})) + " pool(s)";
  }
  log.Report("STAT", stat_ok, MicrosSince(t0), stat_detail);

  t0 = Clock::now();
  Status fs = sched.block_on(rc.free_raw(sched, ref));
  log.Report("free", fs.ok(), MicrosSince(t0), fs.ok() ? "" : fs.ToString());

  t0 = Clock::now();
  Status again = sched.block_on(rc.free_raw(sched, ref));
  log.Report(
      "double free (rejected)", again.code() == Code::kInvalidArgument, MicrosSince(t0),
      again.ok() ? "the server accepted a double free!" : "server said: " + again.ToString());

  std::printf("  %d/%d checks passed\n", log.passed(), log.passed() + log.failed());
  return log.failed() == 0;
}

// The objects (CoRM) part: allocate two blocks' worth of objects, write and direct_read them,
// free 75 % so both blocks are fragmented, compact, then read_any every survivor — each pointer
// whose object moved is corrected in place (scan correction) — and free the rest.
bool RunObjectSteps(Node& node, const std::string& address) {
  constexpr size_t kSize = 100;
  StepLog log;
  std::printf("objects against %s\n", address.c_str());

  auto t0 = Clock::now();
  std::vector<std::string> servers{address};
  ObjectClientOptions opts;
  opts.correction = Correction::kScan;
  auto connected = ObjectClient::Connect(node, servers, opts);
  if (!log.Report(
          "objects connect", connected.ok(), MicrosSince(t0),
          connected.ok()
              ? std::to_string((*connected)->server_info(0).classes.size()) +
                    " size classes, block " + FormatBytes((*connected)->server_info(0).block_size) +
                    ", objects up to " + FormatBytes((*connected)->server_info(0).max_object_size())
              : connected.status().ToString())) {
    return false;
  }
  ObjectClient& oc = **connected;

  // Two blocks of the class that holds kSize bytes, so the freed ones leave two sparse blocks.
  t0 = Clock::now();
  Result<Ptr> first = oc.alloc(kSize, 0);
  if (!first.ok()) {
    log.Report("alloc objects", false, MicrosSince(t0), first.status().ToString());
    return false;
  }
  const auto& info = oc.server_info(0);
  const uint32_t slot = info.classes[first->size_class].slot_size;
  const size_t count = std::max<size_t>(8, 2 * (info.block_size / slot));
  std::vector<Ptr> ptrs{*first};
  Status alloc_error;
  while (ptrs.size() < count) {
    Result<Ptr> a = oc.alloc(kSize, 0);
    if (!a.ok()) {
      alloc_error = a.status();
      break;
    }
    ptrs.push_back(*a);
  }
  if (!log.Report("alloc " + std::to_string(count) + " x " + std::to_string(kSize) + " B",
                  alloc_error.ok(), MicrosSince(t0),
                  alloc_error.ok() ? "class " + std::to_string(first->size_class) + " (slot " +
                                         std::to_string(slot) + " B), first at offset " +
                                         Hex(first->offset) + " id " + Hex(first->id)
                                   : alloc_error.ToString())) {
    return false;
  }

  auto value_of = [&](size_t i) {
    std::vector<std::byte> v(kSize);
    for (size_t b = 0; b < kSize; ++b) v[b] = static_cast<std::byte>((i * 131 + b * 7 + 1) & 0xff);
    return v;
  };
  t0 = Clock::now();
  Status write_error;
  for (size_t i = 0; i < ptrs.size() && write_error.ok(); ++i)
    write_error = oc.write(ptrs[i], value_of(i));
  log.Report("write (RPC)", write_error.ok(), MicrosSince(t0) / count,
             write_error.ok() ? "per object; " + std::to_string(count) + " objects"
                              : write_error.ToString());

  std::vector<std::byte> out(kSize);
  t0 = Clock::now();
  size_t good = 0;
  std::string read_error;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    Result<size_t> r = oc.direct_read(ptrs[i], out);
    if (r.ok() && out == value_of(i)) {
      ++good;
    } else if (read_error.empty()) {
      read_error =
          r.ok() ? "object " + std::to_string(i) + " has wrong bytes" : r.status().ToString();
    }
  }
  log.Report("direct_read + verify", good == count, MicrosSince(t0) / count,
             good == count ? "per object (one-sided); all " + std::to_string(count) + " intact"
                           : read_error);

  // Free three of every four objects.
  t0 = Clock::now();
  std::vector<size_t> survivors;
  Status free_error;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    if (i % 4 == 0) {
      survivors.push_back(i);
      continue;
    }
    Status st = oc.free(ptrs[i]);
    if (!st.ok() && free_error.ok()) free_error = st;
  }
  log.Report("free 75 %", free_error.ok(), MicrosSince(t0),
             free_error.ok() ? std::to_string(count - survivors.size()) + " freed, " +
                                   std::to_string(survivors.size()) + " left"
                             : free_error.ToString());

  t0 = Clock::now();
  Result<CompactResult> c = oc.compact(0, first->size_class);
  const nlohmann::json cstats =
      c.ok() ? nlohmann::json::parse(c->stats_json, nullptr, false) : nlohmann::json::object();
  log.Report("compact class " + std::to_string(first->size_class), c.ok(), MicrosSince(t0),
             c.ok() ? std::to_string(c->merges) + " merge(s); server total " +
                          std::to_string(cstats.value("compactions", uint64_t{0})) + " merge(s), " +
                          std::to_string(cstats.value("objects_relocated", uint64_t{0})) +
                          " object(s) relocated"
                    : c.status().ToString());

  const ObjectClientStats before = oc.stats();
  t0 = Clock::now();
  size_t intact = 0, corrected = 0;
  std::string examples, any_error;
  for (size_t i : survivors) {
    const Ptr old = ptrs[i];
    Result<size_t> r = oc.read_any(ptrs[i], out);
    if (!r.ok() || out != value_of(i)) {
      if (any_error.empty()) {
        any_error = "object " + std::to_string(i) + ": " +
                    (r.ok() ? std::string("wrong bytes") : r.status().ToString());
      }
      continue;
    }
    ++intact;
    if (ptrs[i].offset != old.offset) {
      ++corrected;
      if (corrected <= 3) {
        examples +=
            "; #" + std::to_string(i) + " " + Hex(old.offset) + " -> " + Hex(ptrs[i].offset);
      }
    }
  }
  const ObjectClientStats after = oc.stats();
  log.Report("read_any survivors", intact == survivors.size(), MicrosSince(t0),
             intact == survivors.size()
                 ? std::to_string(intact) + " intact, " + std::to_string(corrected) +
                       " pointer(s) corrected in place (" +
                       std::to_string(after.scans - before.scans) + " block scan(s)), " +
                       std::to_string(intact - corrected) + " still direct" + examples
                 : any_error);

  t0 = Clock::now();
  Ptr stale = ptrs[survivors.front()];
  Status fs;
  for (size_t i : survivors) {
    Status st = oc.free(ptrs[i]);
    if (!st.ok() && fs.ok()) fs = st;
  }
  log.Report("free survivors", fs.ok(), MicrosSince(t0), fs.ok() ? "" : fs.ToString());
  t0 = Clock::now();
  Result<size_t> gone = oc.read_any(stale, out);
  log.Report("read freed (rejected)", gone.status().code() == Code::kNotFound, MicrosSince(t0),
             gone.ok() ? "a freed object was readable!" : "said: " + gone.status().ToString());

  std::printf("  objects: %d/%d checks passed\n", log.passed(), log.passed() + log.failed());
  return log.failed() == 0;
}

// The control-plane part of the embedded demo: the embedded server joins memory://demo and the
// client finds it there (members() and the join event of watch_members) instead of being told
// its address. Keeps its handles so that the end of the demo can show the leave.
class ClusterDemo {
 public:
  // Returns the address the client found, or "" when a check failed.
  std::string Start(MemoryServer& server) {
    std::printf("cluster (memory://demo)\n");
    auto t0 = Clock::now();
    ClusterOptions so;
    so.url = "memory://demo";
    so.create_if_missing = true;  // the server side creates the cluster, as farmemd does
    auto opened = Cluster::Open(so);
    if (!log_.Report("open control plane", opened.ok(), MicrosSince(t0),
                     opened.ok() ? "memory://demo, cluster 'default' (server side creates it)"
                                 : opened.status().ToString())) {
      return "";
    }
    server_side_ = std::move(*opened);

    // The client's own handle, as a separate process would have; read-only tools do not create.
    t0 = Clock::now();
    ClusterOptions co = so;
    co.create_if_missing = false;
    auto client = Cluster::Open(co);
    Result<std::unique_ptr<ClusterWatch>> watch =
        client.ok() ? (*client)->watch_members([this](const ClusterMemberEvent& e) { OnEvent(e); })
                    : Result<std::unique_ptr<ClusterWatch>>(client.status());
    if (!log_.Report("client watch_members", watch.ok(), MicrosSince(t0),
                     watch.ok() ? "client opened the cluster and watches its members"
                                : watch.status().ToString())) {
      return "";
    }
    client_ = std::move(*client);
    watch_ = std::move(*watch);

    ClusterMember self;
    self.name = server.config().node.name;
    self.address = server.node().bootstrap_address();
    self.roles = {"memory"};
    self.capacity_bytes = server.config().memory_bytes;
    t0 = Clock::now();
    Status joined = server_side_->join(self);
    self_name_ = self.name;
    if (!log_.Report("server join", joined.ok(), MicrosSince(t0),
                     joined.ok() ? "'" + self.name + "' at " + self.address + ", roles memory, " +
                                       FormatBytes(self.capacity_bytes)
                                 : joined.ToString())) {
      return "";
    }

    t0 = Clock::now();
    auto event = WaitFor(ClusterMemberEvent::Type::kJoin, self.name);
    log_.Report("join event", event.has_value(), MicrosSince(t0),
                event ? FormatMemberEvent(*event) : "no join event within 5 s");

    t0 = Clock::now();
    auto members = MemoryMembers(*client_, "");
    std::string found;
    if (members.ok()) {
      for (const auto& m : *members) {
        if (m.name == self.name) found = m.address;
      }
    }
    log_.Report("members() -> address", members.ok() && found == self.address, MicrosSince(t0),
                members.ok() ? std::to_string(members->size()) + " memory member(s); '" +
                                   self.name + "' at " + (found.empty() ? "?" : found) +
                                   (members->empty() || members->front().lease_left.count() < 0
                                        ? std::string()
                                        : fmt::format(", lease {:.1f} s left",
                                                      members->front().lease_left.count() / 1000.0))
                             : members.status().ToString());
    return found == self.address ? found : "";
  }

  // The server leaves; the client must see a leave (not an expiry). Prints the part's tally.
  bool Finish() {
    if (server_side_ && server_side_->joined()) {
      const std::string name = self_name_;
      auto t0 = Clock::now();
      Status left = server_side_->leave();
      log_.Report("server leave", left.ok(), MicrosSince(t0), left.ok() ? "" : left.ToString());
      t0 = Clock::now();
      auto event = WaitFor(ClusterMemberEvent::Type::kLeave, name);
      log_.Report("leave event", event.has_value(), MicrosSince(t0),
                  event ? FormatMemberEvent(*event) : "no leave event within 5 s");
    }
    if (watch_) watch_->cancel();
    std::printf("  cluster: %d/%d checks passed\n", log_.passed(), log_.passed() + log_.failed());
    return log_.failed() == 0;
  }

 private:
  void OnEvent(const ClusterMemberEvent& e) {
    std::lock_guard lock(mu_);
    events_.push_back(e);
    cv_.notify_all();
  }
  std::optional<ClusterMemberEvent> WaitFor(ClusterMemberEvent::Type type,
                                            const std::string& name) {
    std::unique_lock lock(mu_);
    std::optional<ClusterMemberEvent> found;
    cv_.wait_for(lock, std::chrono::seconds(5), [&] {
      for (const auto& e : events_) {
        if (e.type == type && e.member.name == name) found = e;
      }
      return found.has_value();
    });
    return found;
  }

  StepLog log_;
  std::string self_name_;
  std::unique_ptr<Cluster> server_side_;
  std::unique_ptr<Cluster> client_;
  std::unique_ptr<ClusterWatch> watch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ClusterMemberEvent> events_;
};

}  // namespace

// The tiered part (TeRM): an 8 MiB region with a 4 MiB DRAM budget. Writes it all and reads it
// back (most of it comes from the file), then reads the first 2 MiB for a few periods until the
// hotspot periods promote it and the reads turn into one-sided hits. A server without a tiered
// region (no --tier-file) is reported and skipped.
bool RunTierSteps(Node& node, const std::string& address) {
  StepLog log;
  std::printf("tier against %s\n", address.c_str());
  auto t0 = Clock::now();
  auto connected = TieredClient::Connect(node, address);
  if (!connected.ok()) {
    std::printf("  tier: not served here (%s)\n", connected.status().ToString().c_str());
    return true;
  }
  TieredClient& tc = **connected;
  const TierRegionInfo& info = tc.info();
  log.Report("tier connect", true, MicrosSince(t0),
             FormatBytes(info.capacity) + " in " + std::to_string(info.unit_count) + " units of " +
                 FormatBytes(info.unit_size) + ", mode " + info.mode +
                 (info.one_sided ? ", one-sided reads" : ", RPC reads"));
  const uint64_t size = std::min<uint64_t>(info.capacity, 8ull << 20);
  const auto word_at = [](uint64_t off) { return off * 0x9E3779B97F4A7C15ull + 1; };
  std::vector<uint64_t> chunk(TieredClient::kMaxIoBytes / 8);
  t0 = Clock::now();
  Status st;
  for (uint64_t at = 0; at < size && st.ok(); at += TieredClient::kMaxIoBytes) {
    const uint64_t n = std::min<uint64_t>(TieredClient::kMaxIoBytes, size - at);
    for (uint64_t i = 0; i < n / 8; ++i) chunk[i] = word_at(at + i * 8);
    st = tc.write(at, std::as_bytes(std::span(chunk).first(n / 8)));
  }
  log.Report("tier write", st.ok(), MicrosSince(t0),
             st.ok() ? FormatBytes(size) + " in 1 MiB writes" : st.ToString());
  t0 = Clock::now();
  uint64_t bad = 0;
  for (uint64_t at = 0; at < size && st.ok(); at += TieredClient::kMaxIoBytes) {
    const uint64_t n = std::min<uint64_t>(TieredClient::kMaxIoBytes, size - at);
    st = tc.read(at, std::as_writable_bytes(std::span(chunk).first(n / 8)));
    for (uint64_t i = 0; st.ok() && i < n / 8; ++i) bad += chunk[i] != word_at(at + i * 8);
  }
  log.Report("tier read back", st.ok() && bad == 0, MicrosSince(t0),
             st.ok() ? std::to_string(bad) + " wrong words" : st.ToString());
  // Hot part: the first quarter of the region (or 2 MiB), read again and again.
  const uint64_t hot = std::min<uint64_t>(size / 4, 2ull << 20);
  const TieredClientStats before = tc.stats();
  t0 = Clock::now();
  const auto period = std::chrono::milliseconds(std::max<uint32_t>(info.period_ms, 1));
  const auto until = Clock::now() + 4 * period + std::chrono::milliseconds(200);
  uint64_t rounds = 0;
  while (st.ok() && bad == 0 && Clock::now() < until) {
    for (uint64_t at = 0; at < hot && st.ok(); at += 64 << 10) {
      st = tc.read(at, std::as_writable_bytes(std::span(chunk).first((64 << 10) / 8)));
      for (uint64_t i = 0; st.ok() && i < (64 << 10) / 8; ++i)
        bad += chunk[i] != word_at(at + i * 8);
    }
    ++rounds;
  }
  const TieredClientStats after = tc.stats();
  log.Report("tier hot reads", st.ok() && bad == 0, MicrosSince(t0),
             std::to_string(rounds) + " passes over " + FormatBytes(hot) + ": " +
                 std::to_string(after.one_sided_hits - before.one_sided_hits) +
                 " one-sided page hits, " + std::to_string(after.rpc_reads - before.rpc_reads) +
                 " TIER_READs, " + std::to_string(bad) + " wrong words");
  auto raw = RawClient::Connect(node, address);
  if (raw.ok()) {
    auto json = (*raw)->stats_json();
    if (json.ok()) {
      auto doc = nlohmann::json::parse(*json, nullptr, false);
      if (doc.is_object() && doc.contains("tier") && doc["tier"].is_object()) {
        const auto& t = doc["tier"];
        std::printf(
            "  tier STAT: %s resident of %s budget, %s promotions, %s demotions, "
            "%s write-backs, file read %s written %s\n",
            t.value("resident_units", nlohmann::json(0)).dump().c_str(),
            t.value("budget_units", nlohmann::json(0)).dump().c_str(),
            t.value("promotions", nlohmann::json(0)).dump().c_str(),
            t.value("demotions", nlohmann::json(0)).dump().c_str(),
            t.value("writebacks", nlohmann::json(0)).dump().c_str(),
            FormatBytes(t.value("io_read_bytes", uint64_t{0})).c_str(),
            FormatBytes(t.value("io_write_bytes", uint64_t{0})).c_str());
      }
    }
  }
  std::printf("  tier: %d/%d checks passed\n", log.passed(), log.passed() + log.failed());
  return log.failed() == 0;
}

// The transactions part (Storm): four accounts in the tx table "demo_accounts" (the embedded
// server has it; a --connect server without it is reported and skipped). A few transfers, an
// audit that must see the exact total, then two forced conflicts shown as aborts: a write of an
// account another transaction holds ("locked", NO_WAIT), and an audit whose read was overwritten
// by a committed transfer before it committed ("validation").
constexpr const char* kDemoTxTable = "demo_accounts";
constexpr uint64_t kDemoAccounts = 4;
constexpr uint64_t kDemoBalance = 1000;

std::array<std::byte, 8> DemoAccountKey(uint64_t a) {
  std::array<std::byte, 8> k;
  std::memcpy(k.data(), &a, 8);
  return k;
}
uint64_t DemoU64(std::span<const std::byte> v) {
  uint64_t x = 0;
  std::memcpy(&x, v.data(), std::min<size_t>(8, v.size()));
  return x;
}

// Moves `amount` from account a to b in one transaction (both locked, then one commit).
Status DemoTransfer(BlockingTx& tx, uint16_t table, uint64_t a, uint64_t b, uint64_t amount) {
  tx.start();
  auto from = tx.write(table, DemoAccountKey(a));
  if (!from.ok()) return from.status();
  auto to = tx.write(table, DemoAccountKey(b));
  if (!to.ok()) return to.status();
  const uint64_t fa = DemoU64(*from), tb = DemoU64(*to);
  if (fa < amount) {
    (void)tx.abort();
    return Status::FailedPrecondition("insufficient funds");
  }
  const uint64_t na = fa - amount, nb = tb + amount;
  std::memcpy(from->data(), &na, 8);
  std::memcpy(to->data(), &nb, 8);
  return tx.commit();
}

// Reads every account in one read-only transaction; the sum, or the commit's abort.
Result<uint64_t> DemoAudit(BlockingTx& tx, uint16_t table) {
  tx.start();
  uint64_t sum = 0;
  for (uint64_t a = 0; a < kDemoAccounts; ++a) {
    auto v = tx.read(table, DemoAccountKey(a));
    if (!v.ok()) return v.status();
    sum += DemoU64(*v);
  }
  FARMEM_RETURN_IF_ERROR(tx.commit());
  return sum;
}

bool RunTxSteps(Node& node, const std::string& address) {
  StepLog log;
  std::printf("transactions against %s\n", address.c_str());
  auto t0 = Clock::now();
  auto connected = TxClient::Connect(node, {address});
  Result<uint16_t> table =
      connected.ok() ? (*connected)->table(kDemoTxTable) : Result<uint16_t>(connected.status());
  if (!table.ok()) {
    std::printf("  tx: not served here (%s)\n", table.status().ToString().c_str());
    return true;
  }
  TxClient& client = **connected;
  auto tx1 = BlockingTx::Create(client, node);
  auto tx2 = BlockingTx::Create(client, node);
  if (!tx1.ok() || !tx2.ok()) {
    return log.Report("tx connect", false, MicrosSince(t0),
                      (tx1.ok() ? tx2.status() : tx1.status()).ToString());
  }
  BlockingTx& a = **tx1;
  BlockingTx& b = **tx2;
  log.Report("tx connect", true, MicrosSince(t0),
             std::string("table ") + kDemoTxTable + " (" + std::to_string(client.key_size(*table)) +
                 " B keys, " + std::to_string(client.value_size(*table)) + " B values)");
  // Open the accounts that do not exist yet (a server that has them from an earlier run keeps
  // its balances), in one transaction.
  t0 = Clock::now();
  std::vector<uint64_t> missing;
  Status st;
  for (uint64_t i = 0; i < kDemoAccounts && st.ok(); ++i) {
    a.start();
    auto v = a.read(*table, DemoAccountKey(i));
    if (v.ok()) {
      st = a.commit();
    } else if (v.status().code() == Code::kNotFound) {
      (void)a.abort();
      missing.push_back(i);
    } else {
      st = v.status();
    }
  }
  a.start();
  for (uint64_t i : missing) {
    if (!st.ok()) break;
    const auto v = DemoAccountKey(kDemoBalance);
    st = a.insert(*table, DemoAccountKey(i), v);
  }
  if (st.ok()) st = a.commit();
  log.Report("tx open accounts", st.ok(), MicrosSince(t0),
             st.ok() ? std::to_string(missing.size()) + " inserted in one transaction, " +
                           std::to_string(kDemoAccounts - missing.size()) + " already there"
                     : st.ToString());
  auto before = DemoAudit(a, *table);
  const uint64_t total = before.ok() ? *before : 0;
  // A few transfers.
  t0 = Clock::now();
  int done = 0;
  const uint64_t moves[][3] = {{0, 1, 100}, {1, 2, 250}, {3, 0, 75}};
  for (const auto& m : moves) {
    st = DemoTransfer(a, *table, m[0], m[1], m[2]);
    if (!st.ok()) break;
    ++done;
  }
  log.Report(
      "tx transfers", st.ok(), MicrosSince(t0),
      st.ok() ? std::to_string(done) + " transfers (0->1 100, 1->2 250, 3->0 75)" : st.ToString());
  t0 = Clock::now();
  auto audit = DemoAudit(a, *table);
  log.Report("tx audit", audit.ok() && before.ok() && *audit == total, MicrosSince(t0),
             audit.ok() ? "total " + std::to_string(*audit) + ", expected " + std::to_string(total)
                        : audit.status().ToString());
  // Forced conflict 1: b wants an account a holds.
  t0 = Clock::now();
  a.start();
  auto held = a.write(*table, DemoAccountKey(0));
  b.start();
  auto wanted = b.write(*table, DemoAccountKey(0));
  const bool locked =
      held.ok() && !wanted.ok() && TxAbortReasonOf(wanted.status()) == TxAbortReason::kLocked;
  (void)a.abort();
  log.Report("tx conflict: lock", locked, MicrosSince(t0),
             wanted.ok() ? "second writer was not refused"
                         : "second writer aborted: " + wanted.status().ToString());
  // Forced conflict 2: b audits, a transfer commits in the middle, b's commit must not pass.
  t0 = Clock::now();
  b.start();
  uint64_t partial = 0;
  auto r0 = b.read(*table, DemoAccountKey(0));
  if (r0.ok()) partial += DemoU64(*r0);
  st = DemoTransfer(a, *table, 0, 1, 10);
  Status audit_st = st;
  if (st.ok()) {
    for (uint64_t i = 1; i < kDemoAccounts && audit_st.ok(); ++i) {
      auto v = b.read(*table, DemoAccountKey(i));
      audit_st = v.status();
      if (v.ok()) partial += DemoU64(*v);
    }
    if (audit_st.ok()) audit_st = b.commit();
  }
  const bool validated = st.ok() && TxAbortReasonOf(audit_st) == TxAbortReason::kValidation;
  log.Report("tx conflict: validate", validated, MicrosSince(t0),
             validated
                 ? "audit saw " + std::to_string(partial) +
                       " (a transfer committed between its reads), aborted: " + audit_st.ToString()
                 : "audit was not aborted: " + audit_st.ToString());
  t0 = Clock::now();
  audit = DemoAudit(a, *table);
  log.Report("tx audit again", audit.ok() && *audit == total, MicrosSince(t0),
             audit.ok() ? "total " + std::to_string(*audit) : audit.status().ToString());
  const TxClientStats s = client.stats();
  std::printf(
      "  tx stats: %llu commits, %llu one-sided reads, %llu TX_LOOKUPs, aborts locked %llu "
      "validation %llu\n",
      static_cast<unsigned long long>(s.commits), static_cast<unsigned long long>(s.one_sided_hits),
      static_cast<unsigned long long>(s.rpc_lookups),
      static_cast<unsigned long long>(s.aborts[static_cast<size_t>(TxAbortReason::kLocked)]),
      static_cast<unsigned long long>(s.aborts[static_cast<size_t>(TxAbortReason::kValidation)]));
  std::printf("  tx: %d/%d checks passed\n", log.passed(), log.passed() + log.failed());
  return log.failed() == 0;
}

// A directory for the embedded server's tier file: /var/tmp when /tmp is tmpfs (refused).
// The channels part (LOCO, docs/channels.md): three nodes embedded in this process, each with a
// channels Manager over the same static participant list and one thread of its own. They pass a
// barrier, take a ticket lock (homed at node 1) around a non-atomic increment of a word at node
// 3, and fetch-and-add an atomic_var at node 2; node 1 checks the totals. The node threads
// record their steps; the main thread prints them after the threads joined.
namespace {

struct ChannelStep {
  std::string step;
  bool ok = false;
  double micros = 0;
  std::string detail;
};

bool RunChannelSteps(const ClientOptions& client) {
  namespace ch = farmem::channels;
  constexpr int kNodes = 3;
  constexpr uint64_t kLocked = 50, kAdds = 100, kEpisodes = 10;
  constexpr auto kWait = std::chrono::seconds(10);
  std::printf("channels (%d embedded nodes, one thread each)\n", kNodes);
  StepLog log;
  std::vector<ch::Participant> participants;
  std::vector<uint16_t> ports;
  for (int i = 1; i <= kNodes; i++) {
    const int port = FreeLoopbackPort();
    if (port <= 0) return log.Report("pick ports", false, 0, "no free loopback port");
    ports.push_back(static_cast<uint16_t>(port));
    participants.push_back({static_cast<ch::NodeId>(i), fmt::format("127.0.0.1:{}", port)});
  }
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<std::unique_ptr<ch::Manager>> managers;
  auto t0 = Clock::now();
  for (int i = 1; i <= kNodes; i++) {
    NodeConfig nc;
    nc.name = fmt::format("channels-demo-{}", i);
    nc.bootstrap_port = ports[i - 1];
    // Channels are tested on native TCP and fabric shm: other providers use native TCP here.
    const bool shm = client.backend == "fabric" && client.provider == "shm";
    nc.transport.backend = shm ? "fabric" : "tcp";
    nc.transport.provider = "shm";
    nc.transport.cluster_token = client.token;
    auto node = Node::Create(nc);
    if (!node.ok()) return log.Report("start nodes", false, 0, node.status().ToString());
    ch::ManagerConfig mc;
    mc.self = static_cast<ch::NodeId>(i);
    mc.participants = participants;
    auto mgr = ch::Manager::Create(**node, mc);
    Status st = mgr.ok() ? (*node)->start() : mgr.status();
    if (!st.ok()) return log.Report("start nodes", false, 0, st.ToString());
    nodes.push_back(std::move(*node));
    managers.push_back(std::move(*mgr));
  }
  log.Report("start nodes", true, MicrosSince(t0),
             fmt::format("{} nodes on {}, each a Manager with a 1 MiB channel region", kNodes,
                         nodes[0]->transport().name()));

  // Each node thread's steps (only node 1 records the timed ones); errors from every node.
  std::vector<std::vector<ChannelStep>> steps(kNodes);
  auto body = [&](ch::NodeId id) {
    auto& out = steps[id - 1];
    auto fail = [&](const std::string& step, const Status& st) {
      out.push_back({step, false, 0, fmt::format("node {}: {}", id, st.ToString())});
    };
    auto t = Clock::now();
    ch::Manager& m = *managers[id - 1];
    if (Status st = m.connect(kWait); !st.ok()) return fail("connect", st);
    auto thr = m.make_thread();
    if (!thr.ok()) return fail("connect", thr.status());
    ch::ChannelThread& th = **thr;
    const std::vector<ch::NodeId> all = {1, 2, 3};
    auto bar = ch::Barrier::Open(th, "demo/bar", all);
    auto lock = ch::TicketLock::Open(th, "demo/lock", 1, all);
    auto word = ch::Channel::Open(th, "demo/word", all, 8);
    auto count = ch::AtomicVar::Open(th, "demo/count", 2, all);
    for (const Status& st : {bar.status(), lock.status(), word.status(), count.status()})
      if (!st.ok()) return fail("open channels", st);
    for (const Status& st : {bar->wait_ready(kWait), lock->wait_ready(kWait),
                             word->wait_ready(kWait), count->wait_ready(kWait)})
      if (!st.ok()) return fail("open channels", st);
    if (id == 1)
      out.push_back({"connect + join", true, MicrosSince(t),
                     "barrier, ticket lock, word, atomic_var on all 3"});

    t = Clock::now();
    for (uint64_t e = 0; e < kEpisodes; e++)
      if (Status st = bar->arrive_and_wait(th, kWait); !st.ok()) return fail("barrier", st);
    if (id == 1)
      out.push_back({"barrier", true, MicrosSince(t) / kEpisodes,
                     fmt::format("{} episodes (time per episode)", kEpisodes)});

    t = Clock::now();
    const uint64_t at3 = *word->slice_offset(3);
    for (uint64_t i = 0; i < kLocked; i++) {
      if (Status st = lock->lock(th, kWait); !st.ok()) return fail("ticket lock", st);
      uint64_t v = 0;
      if (Status st = th.read_sync(3, at3, &v, 8); !st.ok()) return fail("ticket lock", st);
      v++;
      if (auto w = th.write(3, at3, &v, 8); !w.ok()) return fail("ticket lock", w.status());
      if (Status st = lock->unlock(th, kWait); !st.ok()) return fail("ticket lock", st);
    }
    if (Status st = bar->arrive_and_wait(th, kWait); !st.ok()) return fail("ticket lock", st);
    if (id == 1) {
      uint64_t v = 0;
      Status st = th.read_sync(3, at3, &v, 8);
      out.push_back({"ticket lock", st.ok() && v == kNodes * kLocked,
                     MicrosSince(t) / (kNodes * kLocked),
                     st.ok() ? fmt::format("{} x {} non-atomic increments under the lock: {} "
                                           "(expect {}; time per acquisition)",
                                           kNodes, kLocked, v, kNodes * kLocked)
                             : st.ToString()});
    }

    t = Clock::now();
    for (uint64_t i = 0; i < kAdds; i++)
      if (auto r = count->fetch_add(th, 1); !r.ok()) return fail("atomic counter", r.status());
    if (Status st = bar->arrive_and_wait(th, kWait); !st.ok()) return fail("atomic counter", st);
    if (id == 1) {
      auto v = count->load(th);
      out.push_back({"atomic counter", v.ok() && *v == kNodes * kAdds,
                     MicrosSince(t) / (kNodes * kAdds),
                     v.ok() ? fmt::format("{} x {} fetch_add at node 2: {} (expect {})", kNodes,
                                          kAdds, *v, kNodes * kAdds)
                            : v.status().ToString()});
    }
    // Nobody stops while another still reads its memory.
    if (Status st = bar->arrive_and_wait(th, kWait); !st.ok()) return fail("final barrier", st);
  };
  std::vector<std::thread> threads;
  for (int i = 1; i <= kNodes; i++) threads.emplace_back(body, static_cast<ch::NodeId>(i));
  for (auto& th : threads) th.join();
  for (auto& node : nodes) node->stop();
  managers.clear();
  nodes.clear();
  for (const auto& node_steps : steps)
    for (const auto& s : node_steps) log.Report(s.step, s.ok, s.micros, s.detail);
  std::printf("  channels: %d/%d checks passed\n", log.passed(), log.passed() + log.failed());
  return log.failed() == 0;
}

}  // namespace

std::string TierDemoFile() {
  const char* root = "/tmp";
  struct statfs st;
  if (statfs(root, &st) == 0 && static_cast<unsigned long>(st.f_type) == 0x01021994) {
    root = "/var/tmp";
  }
  return std::string(root) + "/farmem-demo-tier-" + std::to_string(getpid()) + ".data";
}

int RunDemo(const DemoOptions& options) {
  InitLogging();
  std::unique_ptr<MemoryServer> server;
  std::string tier_file;
  ClusterDemo cluster_demo;
  bool all_ok = true;
  std::vector<std::string> targets = options.connect;
  if (!options.cluster.url.empty()) {
    // The servers of a running cluster: every member with role "memory".
    int code = 0;
    auto cluster = OpenClusterForCli(options.cluster, "farmem demo", &code);
    if (!cluster.ok()) return code;
    auto members = MemoryMembers(**cluster, "");
    if (!members.ok()) {
      std::fprintf(stderr, "farmem demo: error: %s\n", members.status().ToString().c_str());
      return 1;
    }
    std::printf("cluster '%s' at %s: %zu memory member(s)\n", options.cluster.name.c_str(),
                options.cluster.url.c_str(), members->size());
    for (const auto& m : *members) {
      std::printf("  %-16s %s\n", m.name.c_str(), m.address.c_str());
      targets.push_back(m.address);
    }
  } else if (targets.empty()) {
    ServerConfig sc;
    sc.memory_bytes = 64ull << 20;
    sc.pool_bytes = 16ull << 20;
    sc.node.name = "farmemd-demo";
    sc.node.bootstrap_host = "127.0.0.1";
    sc.node.transport.backend = options.client.backend;
    sc.node.transport.provider = options.client.provider;
    sc.node.transport.listen_host = "127.0.0.1";
    sc.node.transport.cluster_token = options.client.token;
    // A tiered region twice its DRAM budget (the tier part); the file is removed at the end.
    tier_file = TierDemoFile();
    sc.tier.file = tier_file;
    sc.tier.capacity_bytes = 8ull << 20;
    sc.tier.dram_bytes = 4ull << 20;
    sc.tier.period_ms = 200;
    // The transactions part's table: 64 buckets of 4 accounts (8-byte keys and balances).
    sc.tx.tables = {std::string(kDemoTxTable) + ":8:8:64:4"};
    auto created = MemoryServer::Create(sc);
    Status st = created.ok() ? (*created)->start() : created.status();
    if (!st.ok()) {
      std::fprintf(stderr, "farmem demo: error: embedded server: %s\n", st.ToString().c_str());
      unlink(tier_file.c_str());
      return 1;
    }
    server = std::move(*created);
    std::printf("embedded farmemd: bootstrap=%s transport=%s address=%s\n",
                server->node().bootstrap_address().c_str(),
                server->node().transport().name().c_str(),
                server->node().transport().local_address().c_str());
    // The client learns the server's address from the control plane, as it would in a cluster.
    std::string found = cluster_demo.Start(*server);
    if (found.empty()) {
      all_ok = false;
      found = server->node().bootstrap_address();  // the other parts still run
    }
    targets.push_back(found);
  }

  ClientOptions client = options.client;
  auto node = MakeClientNode(client, "farmem-demo-client");
  if (!node.ok()) {
    std::fprintf(stderr, "farmem demo: error: %s\n", node.status().ToString().c_str());
    return 1;
  }
  for (const std::string& target : targets) {
    std::printf("demo against %s (backend %s)\n", target.c_str(),
                (*node)->transport().name().c_str());
    all_ok = RunSteps(**node, target) && all_ok;
    all_ok = RunObjectSteps(**node, target) && all_ok;
    all_ok = RunTierSteps(**node, target) && all_ok;
    all_ok = RunTxSteps(**node, target) && all_ok;
  }
  // The channels part runs on its own embedded nodes, so only with the embedded server (a demo
  // against remote servers leaves this host's loopback alone).
  if (server) all_ok = RunChannelSteps(client) && all_ok;
  // The regions part mounts its own file system (with its own embedded farmemd) and keeps its
  // barrier's cell on the embedded demo server.
  if (server) all_ok = RunRegionSteps(**node, targets.front(), client) && all_ok;
  if (server) {
    std::printf("cluster (memory://demo), continued\n");
    all_ok = cluster_demo.Finish() && all_ok;
  }
  (*node)->stop();
  if (server) server->stop();
  server.reset();
  if (!tier_file.empty()) unlink(tier_file.c_str());
  std::printf("demo %s\n", all_ok ? "passed" : "FAILED");
  return all_ok ? 0 : 1;
}

}  // namespace farmem::cli
