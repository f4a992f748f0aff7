// Machine facts and CPU-busy sampling for the benchmarks' JSON output (see machine_info.h).

#include "machine_info.h"

#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

namespace farmem::bench {

nlohmann::json MachineInfo() {
  nlohmann::json m;
  m["nproc"] = ::sysconf(_SC_NPROCESSORS_ONLN);
  utsname u{};
  if (::uname(&u) == 0) {
    m["kernel"] = fmt::format("{} {} {}", u.sysname, u.release, u.version);
    m["arch"] = u.machine;
    m["hostname"] = u.nodename;
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      if (auto pos = line.find(':'); pos != std::string::npos) m["cpu"] = line.substr(pos + 2);
      break;
    }
  }
  if (double load[3]; ::getloadavg(load, 3) == 3) {
    m["loadavg_at_start"] = {load[0], load[1], load[2]};
  }
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  m["date"] = buf;
  return m;
}

std::optional<double> CpuBusyFraction(std::chrono::milliseconds window) {
  auto sample = []() -> std::optional<std::pair<uint64_t, uint64_t>> {
    std::ifstream stat("/proc/stat");
    std::string cpu;
    uint64_t v[8] = {};
    if (!(stat >> cpu) || cpu != "cpu") return std::nullopt;
    for (auto& x : v) {
      if (!(stat >> x)) return std::nullopt;
    }
    uint64_t total = 0;
    for (auto x : v) total += x;
    return std::make_pair(total, v[3] + v[4]);  // idle + iowait
  };
  auto a = sample();
  std::this_thread::sleep_for(window);
  auto b = sample();
  if (!a || !b || b->first <= a->first) return std::nullopt;
  const double total = static_cast<double>(b->first - a->first);
  const double idle = static_cast<double>(b->second - a->second);
  return std::clamp(1.0 - idle / total, 0.0, 1.0);
}

Status PinToCpus(const std::vector<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    if (c < 0 || c >= CPU_SETSIZE) return Status::InvalidArgument(fmt::format("no CPU {}", c));
    CPU_SET(c, &set);
  }
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return Status::FromErrno(fmt::format("sched_setaffinity({} CPUs)", cpus.size()), errno);
  }
  return Status::OK();
}

}  // namespace farmem::bench
