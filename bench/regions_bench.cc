// `farmem bench regions`: a `farmem mount` (embedded farmemd, no flags) and a tmpfs, each in a
// temp dir, measured in interleaved rounds with sysbench fileio, fio and cp -a; and in-process
// (regions_inproc.h) rmmap faults and rmalloc against a one-sided read and a file create in the
// mount (docs/regions.md, issue 14). Main thread only; the mount and the tools are child processes.
#include "regions_bench.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "bench_json.h"
#include "bench_stats.h"
#include "child_process.h"
#include "machine_info.h"
#include "regions_inproc.h"

namespace farmem {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr const char* kRegionsProg = "farmem bench regions";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// First executable `name` on PATH (or /usr/bin, /usr/sbin), "" when there is none.
std::string FindTool(const std::string& name) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  path += ":/usr/bin:/usr/sbin:/bin";
  std::stringstream ss(path);
  for (std::string dir; std::getline(ss, dir, ':');) {
    if (dir.empty()) continue;
    const std::string p = dir + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// Runs `args` to completion with stdout+stderr into `out_path`, killing it after `timeout`.
// Returns its output; an error when it could not start, timed out or exited non-zero.
Result<std::string> RunTool(const std::vector<std::string>& args, const std::string& out_path,
                            std::chrono::seconds timeout) {
  const int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno("open " + out_path, errno);
  auto pid = bench::Spawn(args, fd, fd);
  ::close(fd);
  if (!pid.ok()) return pid.status();
  const auto deadline = Clock::now() + timeout;
  int st = 0;
  while (::waitpid(*pid, &st, WNOHANG) != *pid) {
    if (Clock::now() > deadline) {
      bench::KillAndReap(*pid, std::chrono::milliseconds(0));
      return Status::Internal(
          fmt::format("{} did not finish within {} s", args[0], timeout.count()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string out = ReadAll(out_path);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    return Status::Internal(fmt::format("{} failed (status {}): {}", args[0], st,
                                        out.substr(0, std::min<size_t>(out.size(), 2000))));
  }
  return out;
}

// `farmem mount DIR` as a child, up once its "mounted" line is out and the kernel lists it.
struct Mount {
  pid_t pid = -1;
  std::string dir;
  std::string out_path;

  Status Start(const std::string& mountpoint, const std::string& out, uint64_t memory_mib) {
    dir = mountpoint;
    out_path = out;
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    if (ec) return Status::Internal("cannot read /proc/self/exe");
    std::vector<std::string> args = {self.string(), "mount", mountpoint};
    if (memory_mib > 0) {  // only when the default budget (1 GiB) is too small for the files
      args.push_back("--memory-mib");
      args.push_back(std::to_string(memory_mib));
    }
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::FromErrno("open " + out, errno);
    auto p = bench::Spawn(args, fd, fd);
    ::close(fd);
    if (!p.ok()) return p.status();
    pid = *p;
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return Status::Internal("farmem mount exited: " + ReadAll(out));
      }
      if (ReadAll(out).find("regions: mounted at") != std::string::npos &&
          ReadAll("/proc/mounts").find(" " + mountpoint + " ") != std::string::npos)
        return Status::OK();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return Status::Internal("farmem mount not up within 30 s: " + ReadAll(out));
  }

  // SIGTERM unmounts cleanly (docs/regions.md); fusermount3 -uz if it is still listed.
  void Stop() {
    if (pid > 0) bench::KillAndReap(pid, std::chrono::seconds(10));
    pid = -1;
    if (!dir.empty() && ReadAll("/proc/mounts").find(" " + dir + " ") != std::string::npos) {
      const std::string fm = FindTool("fusermount3");
      if (!fm.empty())
        (void)RunTool({fm, "-uz", dir}, out_path + ".umount", std::chrono::seconds(10));
    }
  }
  ~Mount() { Stop(); }
};

// The small-file tree that cp -a copies: `files` files of 1..8 KiB random bytes in 50 dirs.
Status MakeTree(const fs::path& root, int files) {
  std::mt19937_64 rng(42);
  std::vector<char> buf(8192);
  for (int i = 0; i < files; ++i) {
    const fs::path d = root / fmt::format("d{:02}", i % 50);
    std::error_code ec;
    fs::create_directories(d, ec);
    if (ec) return Status::Internal("mkdir " + d.string() + ": " + ec.message());
    const size_t n = 1024 + rng() % 7169;
    for (size_t k = 0; k < n; ++k) buf[k] = static_cast<char>(rng());
    std::ofstream f(d / fmt::format("f{}", i), std::ios::binary);
    f.write(buf.data(), static_cast<std::streamsize>(n));
    if (!f) return Status::Internal("cannot write the cp -a tree under " + root.string());
  }
  return Status::OK();
}

// One target: subject A against baseline B, measured A B in every round; judged on the median of
// the per-round ratios A/B: >= factor (higher_is_better) or <= factor.
struct Target {
  std::string name;
  std::string unit;
  bool higher_is_better = true;
  double factor = 1.0;
  std::string a_label, b_label;
  std::function<Result<double>()> a, b;
  std::vector<double> av, bv;  // per round
};

struct Tools {
  std::string sysbench, fio, cp, rm;
};

// One sysbench fileio read run in `dir` (files prepared there): MiB/s.
Result<double> SysbenchRead(const Tools& t, const std::string& dir, const std::string& mode,
                            int file_mib, double seconds, const std::string& out) {
  auto r = RunTool({"/bin/sh", "-c",
                    fmt::format("cd '{}' && exec '{}' fileio --file-total-size={}M --file-num=1 "
                                "--file-block-size=16384 --file-test-mode={} --threads=1 "
                                "--time={} --events=0 run",
                                dir, t.sysbench, file_mib, mode, seconds)},
                   out, std::chrono::seconds(static_cast<int>(seconds) + 120));
  if (!r.ok()) return r.status();
  auto v = ParseSysbenchReadMiBps(*r);
  if (!v) return Status::Internal("no \"read, MiB/s\" in sysbench output: " + *r);
  return *v;
}

Status SysbenchPrepare(const Tools& t, const std::string& dir, int file_mib,
                       const std::string& out) {
  auto r = RunTool({"/bin/sh", "-c",
                    fmt::format("cd '{}' && exec '{}' fileio --file-total-size={}M --file-num=1 "
                                "prepare",
                                dir, t.sysbench, file_mib)},
                   out, std::chrono::seconds(600));
  return r.ok() ? Status::OK() : r.status();
}

// fio: one job, sequential 1 MiB writes of `mib` MiB, fsync at the end; MiB/s.
Result<double> FioWrite(const Tools& t, const std::string& dir, int mib, const std::string& out) {
  auto r = RunTool({t.fio, "--name=seqwrite", "--directory=" + dir, "--rw=write", "--bs=1M",
                    fmt::format("--size={}M", mib), "--end_fsync=1", "--ioengine=psync",
                    "--numjobs=1", "--output-format=json"},
                   out, std::chrono::seconds(600));
  if (!r.ok()) return r.status();
  auto v = ParseFioWriteBytesPerSec(*r);
  if (!v) return Status::Internal("no jobs[0].write.bw_bytes in fio output");
  std::error_code ec;
  fs::remove(fs::path(dir) / "seqwrite.0.0", ec);
  return *v / (1024.0 * 1024.0);
}

// Files created per second in `dir`: `n` open(O_CREAT|O_EXCL) + close (the unlinks afterwards
// are not timed).
Result<double> CreateFiles(const std::string& dir, int n) {
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    const std::string f = fmt::format("{}/c{}", dir, i);
    const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return Status::FromErrno("create " + f, errno);
    ::close(fd);
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int i = 0; i < n; ++i) {
    const std::string f = fmt::format("{}/c{}", dir, i);
    if (::unlink(f.c_str()) != 0) return Status::FromErrno("unlink " + f, errno);
  }
  return n / secs;
}

// cp -a of the tree into `dir`: seconds (the rm afterwards is not timed).
Result<double> CopyTree(const Tools& t, const std::string& tree, const std::string& dir,
                        const std::string& out) {
  const std::string dest = dir + "/tree-copy";
  const auto t0 = Clock::now();
  auto r = RunTool({t.cp, "-a", tree, dest}, out, std::chrono::seconds(600));
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!r.ok()) return r.status();
  if (auto rm = RunTool({t.rm, "-rf", dest}, out, std::chrono::seconds(600)); !rm.ok())
    return rm.status();
  return secs;
}

}  // namespace

std::optional<double> ParseSysbenchReadMiBps(std::string_view text) {
  constexpr std::string_view kKey = "read, MiB/s:";
  const size_t at = text.find(kKey);
  if (at == std::string_view::npos) return std::nullopt;
  const std::string rest(text.substr(at + kKey.size(), 64));
  char* end = nullptr;
  const double v = std::strtod(rest.c_str(), &end);
  if (end == rest.c_str() || !std::isfinite(v) || v < 0) return std::nullopt;
  return v;
}

std::optional<double> ParseFioWriteBytesPerSec(std::string_view text) {
  // fio may print warnings before the JSON object.
  const size_t brace = text.find('{');
  if (brace == std::string_view::npos) return std::nullopt;
  const auto j = nlohmann::json::parse(text.substr(brace), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("jobs") || !j["jobs"].is_array() || j["jobs"].empty())
    return std::nullopt;
  const auto& job = j["jobs"][0];
  if (!job.contains("write") || !job["write"].contains("bw_bytes") ||
      !job["write"]["bw_bytes"].is_number())
    return std::nullopt;
  const double v = job["write"]["bw_bytes"].get<double>();
  if (!std::isfinite(v) || v <= 0) return std::nullopt;
  return v;
}

int RunRegionsBench(RegionsBenchOptions o) {
  if (o.rounds < 5) {
    fmt::print(stderr, "{}: --rounds must be >= 5\n", kRegionsProg);
    return 2;
  }
  if (o.read_file_mib == 0) o.read_file_mib = o.quick ? 64 : 2048;
  if (o.read_seconds == 0) o.read_seconds = o.quick ? 2 : 10;
  if (o.write_file_mib == 0) o.write_file_mib = o.quick ? 64 : 2048;
  if (o.small_files == 0) o.small_files = o.quick ? 1000 : 5000;
  if (o.fault_pages == 0) o.fault_pages = o.quick ? 256 : 2048;
  if (o.rmalloc_calls == 0) o.rmalloc_calls = o.quick ? 2000 : 10000;
  if (o.creates == 0) o.creates = o.quick ? 200 : 1000;

  struct stat fuse_st {};
  if (::stat("/dev/fuse", &fuse_st) != 0 || !S_ISCHR(fuse_st.st_mode)) {
    fmt::print(stderr, "{}: /dev/fuse is missing (no FUSE in this kernel or container)\n",
               kRegionsProg);
    return 1;
  }
  Tools tools{FindTool("sysbench"), FindTool("fio"), FindTool("cp"), FindTool("rm")};
  for (const auto& [name, path] : {std::pair{"sysbench", tools.sysbench},
                                   {"fio", tools.fio},
                                   {"cp", tools.cp},
                                   {"rm", tools.rm}}) {
    if (path.empty()) {
      fmt::print(stderr, "{}: {} not found on PATH (apt install {}; scripts/bootstrap)\n",
                 kRegionsProg, name, name);
      return 1;
    }
  }

  // Work dir (mount point, logs) on the disk; the tmpfs and the source tree on /dev/shm.
  char work_tmpl[] = "/tmp/farmem-regbench.XXXXXX";
  char shm_tmpl[] = "/dev/shm/farmem-regbench.XXXXXX";
  if (!::mkdtemp(work_tmpl) || !::mkdtemp(shm_tmpl)) {
    fmt::print(stderr, "{}: mkdtemp: {}\n", kRegionsProg, std::strerror(errno));
    return 1;
  }
  const std::string work = work_tmpl, shm = shm_tmpl;
  const std::string mnt = work + "/mnt", ref = shm + "/fs", tree = shm + "/tree";
  struct Cleanup {
    std::string a, b;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(a, ec);
      fs::remove_all(b, ec);
    }
  } cleanup{work, shm};
  std::error_code ec;
  fs::create_directories(mnt, ec);
  fs::create_directories(ref, ec);

  // The default budget (1 GiB) holds the --quick files; bigger runs ask for what they need.
  const uint64_t need_mib =
      static_cast<uint64_t>(o.read_file_mib + o.write_file_mib) + o.small_files / 64 + 64;
  const uint64_t memory_mib = need_mib > 900 ? need_mib * 5 / 4 : 0;

  const auto busy = bench::CpuBusyFraction(std::chrono::milliseconds(500));
  const nlohmann::json machine = bench::MachineInfo();  // its date and load: the run's start
  Mount mount;
  if (Status s = mount.Start(mnt, work + "/mount.out", memory_mib); !s.ok()) {
    fmt::print(stderr, "{}: {}\n", kRegionsProg, s.message());
    return 1;
  }
  fmt::print("{}: farmem mount at {} (pid {}{}), tmpfs at {}\n", kRegionsProg, mnt, mount.pid,
             memory_mib ? fmt::format(", --memory-mib {}", memory_mib) : ", default flags", ref);
  if (o.quick)
    fmt::print("--quick: {} MiB sysbench file and {} MiB fio file (the issue's full run: 2 GiB)\n",
               o.read_file_mib, o.write_file_mib);

  const std::string log = work + "/tool.out";
  auto fail = [&](const Status& s) {
    fmt::print(stderr, "{}: {}\n", kRegionsProg, s.message());
    return 1;
  };
  if (Status s = MakeTree(tree, o.small_files); !s.ok()) return fail(s);
  for (const std::string& d : {mnt, ref})
    if (Status s = SysbenchPrepare(tools, d, o.read_file_mib, log); !s.ok()) return fail(s);
  const std::string creates_dir = mnt + "/creates";
  fs::create_directories(creates_dir, ec);
  if (ec) return fail(Status::Internal("mkdir " + creates_dir + ": " + ec.message()));

  // The rmmap and rmalloc targets run in this process against an embedded farmemd.
  auto inproc = bench::RegionsInproc::Start(static_cast<size_t>(o.fault_pages));
  if (!inproc.ok()) return fail(inproc.status());
  bench::RegionsInproc& ip = **inproc;

  const std::string kMount = "farmem mount", kTmpfs = "tmpfs";
  double paired_fault_us = 0;
  std::vector<Target> targets = {
      {"sysbench seqrd 16 KiB buffered, 1 thread", "MiB/s", true, 0.90, kMount, kTmpfs,
       [&] { return SysbenchRead(tools, mnt, "seqrd", o.read_file_mib, o.read_seconds, log); },
       [&] { return SysbenchRead(tools, ref, "seqrd", o.read_file_mib, o.read_seconds, log); }},
      {"sysbench rndrd 16 KiB buffered, 1 thread", "MiB/s", true, 0.88, kMount, kTmpfs,
       [&] { return SysbenchRead(tools, mnt, "rndrd", o.read_file_mib, o.read_seconds, log); },
       [&] { return SysbenchRead(tools, ref, "rndrd", o.read_file_mib, o.read_seconds, log); }},
      {"fio seq write 1 MiB, end_fsync", "MiB/s", true, 0.5, kMount, kTmpfs,
       [&] { return FioWrite(tools, mnt, o.write_file_mib, log); },
       [&] { return FioWrite(tools, ref, o.write_file_mib, log); }},
      {fmt::format("cp -a of {} small files", o.small_files), "s", false, 5.0, kMount, kTmpfs,
       [&] { return CopyTree(tools, tree, mnt, log); },
       [&] { return CopyTree(tools, tree, ref, log); }},
      // The paper's RDMA-to-regions ratio: a fault costs at most 1/0.41 one-sided reads.
      // Both series come from one pass (read page i, fault page i, ...): B returns A's partner.
      {"rmmap cold 4 KiB fault: one-sided read / fault latency", "us (median)", true, 0.41,
       "one-sided 4 KiB read", "rmmap cold read fault",
       [&]() -> Result<double> {
         auto r = ip.RawReadAndReadFaultMedianUs();
         if (!r.ok()) return r.status();
         paired_fault_us = r->second;
         return r->first;
       },
       [&]() -> Result<double> { return paired_fault_us; }},
      {"rmmap write with rmarkdirty(zero) / read fault", "us (median)", false, 1.1,
       "rmarkdirty(zero) + store", "rmmap cold read fault", [&] { return ip.ZeroWriteMedianUs(); },
       [&] { return ip.ReadFaultMedianUs(); }},
      {"rmalloc(64) / file create in the mount", "ops/s", true, 100, "rmalloc(64)",
       "create in farmem mount", [&] { return ip.RmallocPerSec(o.rmalloc_calls); },
       [&] { return CreateFiles(creates_dir, o.creates); }},
  };
  std::vector<double> store_read_us, write_fault_us;  // per round
  for (int round = 0; round < o.rounds; ++round) {
    for (auto& t : targets) {
      auto a = t.a();  // A: the subject
      if (!a.ok()) return fail(a.status());
      auto b = t.b();  // B: its baseline, right after
      if (!b.ok()) return fail(b.status());
      t.av.push_back(*a);
      t.bv.push_back(*b);
      fmt::print("round {} {}: {} {:.3f}, {} {:.3f} {}\n", round + 1, t.name, t.a_label, *a,
                 t.b_label, *b, t.unit);
    }
    // Not targets: the store read inside a fault, to split a fault's time, and a plain write
    // fault (without rmarkdirty) beside the rmarkdirty(zero) one (bench/README.md).
    auto sr = ip.StoreReadMedianUs();
    if (!sr.ok()) return fail(sr.status());
    auto wf = ip.WriteFaultMedianUs();
    if (!wf.ok()) return fail(wf.status());
    store_read_us.push_back(*sr);
    write_fault_us.push_back(*wf);
    fmt::print(
        "round {} RegionStore::read 4 KiB (a fault's fetch): {:.3f} us, plain cold write fault: "
        "{:.3f} us (medians)\n",
        round + 1, *sr, *wf);
  }
  if (ReadAll("/proc/mounts").find(" " + mnt + " ") == std::string::npos)
    return fail(Status::Internal("the farmem mount disappeared during the run"));
  mount.Stop();

  fmt::print("\n{:<56} {:>12} {:>12}  {}\n", "target", "A", "B", "ratio A/B (median, min-max)");
  std::vector<bench::TargetRecord> records;
  nlohmann::json rounds_json = nlohmann::json::object();
  for (const auto& t : targets) {
    const auto rr = bench::PerRoundRatios(t.av, t.bv);
    const double va = bench::MedianOf(t.av), vb = bench::MedianOf(t.bv);
    bench::TargetResult res = bench::TargetResult::kUnknown;
    if (!rr.ratios.empty())
      res = (t.higher_is_better ? rr.median >= t.factor : rr.median <= t.factor)
                ? bench::TargetResult::kPass
                : bench::TargetResult::kMiss;
    fmt::print("{:<56} {:>12.2f} {:>12.2f}  {} {}  ({}, A: {}, B: {})\n", t.name, va, vb,
               bench::FormatRoundRatios(rr), bench::TargetResultName(res), t.unit, t.a_label,
               t.b_label);
    bench::TargetRecord rec{
        .name = t.name,
        .value = va,
        .baseline = vb,
        .limit = fmt::format("{} {}x {}", t.higher_is_better ? ">=" : "<=", t.factor, t.b_label),
        .result = res,
        .detail = fmt::format("{} (median of rounds), {} vs {}", t.unit, t.a_label, t.b_label)};
    rec.SetRounds(rr);
    records.push_back(std::move(rec));
    rounds_json[t.name] = {
        {"unit", t.unit}, {"labels", {t.a_label, t.b_label}}, {"a", t.av}, {"b", t.bv}};
  }

  if (!o.json_path.empty()) {
    nlohmann::json j;
    j["benchmark"] = "regions";
    j["machine"] = machine;
    if (busy) j["cpu_busy_before"] = *busy;
    j["config"] = {{"quick", o.quick},
                   {"rounds", o.rounds},
                   {"read_file_mib", o.read_file_mib},
                   {"read_seconds", o.read_seconds},
                   {"write_file_mib", o.write_file_mib},
                   {"small_files", o.small_files},
                   {"fault_pages", o.fault_pages},
                   {"rmalloc_calls", o.rmalloc_calls},
                   {"creates", o.creates},
                   {"mount_memory_mib", memory_mib ? nlohmann::json(memory_mib) : "default"}};
    j["not_measured"] = {"O_DIRECT reads vs regionfs-local"};
    j["rounds"] = rounds_json;
    j["store_read_us"] = store_read_us;
    j["write_fault_us"] = write_fault_us;
    j["targets"] = bench::TargetsJson(records);
    if (Status s = bench::WriteJsonFile(o.json_path, j); !s.ok()) return fail(s);
    fmt::print("\nResults written to {}\n", o.json_path);
  }
  return 0;
}

}  // namespace farmem
