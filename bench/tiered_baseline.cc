// The servers, cgroups, data files and fio figure of `farmem bench tiered` (tiered_baseline.h).
// Roles run in forked children; the rest on the benchmark's main thread.
#include "tiered_baseline.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "farmem/node.h"
#include "objects_throughput_internal.h"

namespace farmem::bench {
namespace {

constexpr long kTmpfsMagic = 0x01021994;

bool IsTmpfs(const std::string& dir) {
  struct statfs st;
  return ::statfs(dir.c_str(), &st) == 0 && static_cast<long>(st.f_type) == kTmpfsMagic;
}

Status WriteText(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno("open " + path, errno);
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size()))
    return Status::FromErrno("write '" + text + "' to " + path, err);
  return Status::OK();
}

uint64_t ReadNumber(const std::string& path) {
  std::ifstream in(path);
  uint64_t v = 0;
  if (in >> v) return v;
  return 0;
}

bool HasWord(const std::string& path, const std::string& word) {
  std::ifstream in(path);
  std::string w;
  while (in >> w)
    if (w == word) return true;
  return false;
}

}  // namespace

TargetRole TierServerRole(TierConfig tier) {
  return [tier](int report_fd, int control_fd) {
    auto fail = [&](const Status& st) { (void)WriteMessage(report_fd, false, st.ToString()); };
    QuietBenchLogging();
    ServerConfig config;  // farmemd's defaults for everything but the tier settings
    config.node.name = "farmemd-tier";
    config.node.bootstrap_host = "127.0.0.1";
    config.node.bootstrap_port = 0;
    config.node.transport.listen_host = "127.0.0.1";
    config.tier = tier;
    auto server = MemoryServer::Create(config);
    if (!server.ok()) return fail(server.status().WithContext("creating the tier server"));
    if (Status st = (*server)->start(); !st.ok())
      return fail(st.WithContext("starting the tier server"));
    if (WriteMessage(report_fd, true, (*server)->node().bootstrap_address()).ok())
      WaitForStop(control_fd, std::chrono::hours(2));
    (*server)->stop();
  };
}

TargetRole MmapServerRole(std::string file, uint64_t capacity, bool random) {
  return [file, capacity, random](int report_fd, int control_fd) {
    auto fail = [&](const Status& st) { (void)WriteMessage(report_fd, false, st.ToString()); };
    QuietBenchLogging();
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fail(Status::FromErrno("open " + file, errno));
    void* map = ::mmap(nullptr, capacity, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) return fail(Status::FromErrno("mmap " + file, errno));
    // Random access: without this every fault reads ahead (fault-around, readahead window) and
    // the cgroup evicts pages it was about to use.
    if (random && ::madvise(map, capacity, MADV_RANDOM) != 0)
      return fail(Status::FromErrno("madvise(MADV_RANDOM) " + file, errno));
    const auto* base = static_cast<const std::byte*>(map);
    NodeConfig nc;  // default node settings, as farmemd's
    nc.name = "mmap-baseline";
    nc.bootstrap_host = "127.0.0.1";
    nc.transport.listen_host = "127.0.0.1";
    auto node = Node::Create(nc);
    if (!node.ok()) return fail(node.status());
    Status st = (*node)->register_rpc(
        kOpMmapRead, [base, capacity](const RpcCall& call, std::vector<std::byte>& reply) {
          MmapReadRequest r;
          if (call.request.size() != sizeof(r))
            return Status::Protocol("MMAP_READ: request of " + std::to_string(call.request.size()) +
                                    " bytes, want 16");
          std::memcpy(&r, call.request.data(), sizeof(r));
          if (r.reserved != 0) return Status::Protocol("MMAP_READ: reserved field not 0");
          if (r.length == 0 || r.length > kMmapMaxRead)
            return Status::InvalidArgument("MMAP_READ: length must be 1..1 MiB");
          if (r.offset > capacity || r.length > capacity - r.offset)
            return Status::OutOfRange("MMAP_READ: range outside the file");
          reply.assign(base + r.offset, base + r.offset + r.length);
          return Status::OK();
        });
    if (!st.ok()) return fail(st);
    auto region = (*node)->export_region(kMmapRegionName, map, capacity, Access::kReadOnly);
    if (!region.ok()) return fail(region.status().WithContext("exporting the file mapping"));
    if (st = (*node)->start(); !st.ok()) return fail(st);
    if (WriteMessage(report_fd, true, (*node)->bootstrap_address()).ok())
      WaitForStop(control_fd, std::chrono::hours(2));
    (*node)->stop();
    ::munmap(map, capacity);
  };
}

Result<std::unique_ptr<MemoryCgroup>> MemoryCgroup::Create(const std::string& name,
                                                           uint64_t limit) {
  namespace fs = std::filesystem;
  const std::string root = "/sys/fs/cgroup";
  std::string why;
  // cgroup v2 mounted at /sys/fs/cgroup with the memory controller.
  if (HasWord(root + "/cgroup.controllers", "memory")) {
    if (!HasWord(root + "/cgroup.subtree_control", "memory")) {
      if (Status st = WriteText(root + "/cgroup.subtree_control", "+memory"); !st.ok())
        why = "cgroup v2: cannot enable the memory controller for children: " + st.ToString();
    }
    if (why.empty()) {
      const std::string path = root + "/" + name;
      if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
        why = "cgroup v2: " + Status::FromErrno("mkdir " + path, errno).ToString();
      } else if (Status st = WriteText(path + "/memory.max", std::to_string(limit)); !st.ok()) {
        ::rmdir(path.c_str());
        why = "cgroup v2: " + st.ToString();
      } else {
        (void)WriteText(path + "/memory.swap.max", "0");
        return std::unique_ptr<MemoryCgroup>(new MemoryCgroup(path, "v2", limit));
      }
    }
  } else {
    why = "no cgroup v2 memory controller at /sys/fs/cgroup";
  }
  // cgroup v1 memory hierarchy (hybrid mounts).
  const std::string v1 = root + "/memory";
  if (fs::exists(v1 + "/memory.limit_in_bytes")) {
    const std::string path = v1 + "/" + name;
    if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::Unavailable(
          why + "; cgroup v1: " + Status::FromErrno("mkdir " + path, errno).ToString());
    if (Status st = WriteText(path + "/memory.limit_in_bytes", std::to_string(limit)); !st.ok()) {
      ::rmdir(path.c_str());
      return Status::Unavailable(why + "; cgroup v1: " + st.ToString());
    }
    return std::unique_ptr<MemoryCgroup>(new MemoryCgroup(path, "v1", limit));
  }
  return Status::Unavailable(why + "; no cgroup v1 memory hierarchy at " + v1);
}

MemoryCgroup::~MemoryCgroup() {
  // The processes were stopped before; the kernel may take a moment to let the group go.
  for (int i = 0; i < 50; ++i) {
    if (::rmdir(path_.c_str()) == 0 || errno == ENOENT) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  fmt::print(stderr, "farmem bench tiered: could not remove cgroup {}: {}\n", path_,
             std::strerror(errno));
}

Status MemoryCgroup::Add(pid_t pid) {
  return WriteText(path_ + "/cgroup.procs", std::to_string(pid));
}

uint64_t MemoryCgroup::Usage() const {
  return ReadNumber(path_ + (kind_ == "v2" ? "/memory.current" : "/memory.usage_in_bytes"));
}

uint64_t MemoryCgroup::PeakUsage() const {
  return ReadNumber(path_ + (kind_ == "v2" ? "/memory.peak" : "/memory.max_usage_in_bytes"));
}

Result<std::string> PickDataDir(const std::string& given) {
  std::string dir = given;
  if (dir.empty()) dir = IsTmpfs("/tmp") ? "/var/tmp" : "/tmp";
  if (IsTmpfs(dir))
    return Status::InvalidArgument(dir + " is tmpfs: the tier file must be on a real disk");
  std::string tmpl = dir + "/farmem-tiered-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return Status::FromErrno("mkdtemp " + tmpl, errno);
  return std::string(buf.data());
}

Status WriteDataFile(const std::string& path, uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno("create " + path, errno);
  constexpr size_t kChunk = 1 << 20;
  std::vector<uint64_t> buf(kChunk / 8);
  Status st;
  for (uint64_t off = 0; off < bytes && st.ok(); off += kChunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, bytes - off));
    for (size_t i = 0; i < n / 8; ++i) buf[i] = DataWord(off + i * 8);
    if (::pwrite(fd, buf.data(), n, static_cast<off_t>(off)) != static_cast<ssize_t>(n))
      st = Status::FromErrno("write " + path, errno);
  }
  if (st.ok() && ::fsync(fd) != 0) st = Status::FromErrno("fsync " + path, errno);
  if (st.ok()) (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  return st;
}

Result<double> FioRandomReadIops(const std::string& dir, double seconds, int iodepth) {
  if (std::system("command -v fio >/dev/null 2>&1") != 0)
    return Status::Unavailable("fio not found on PATH (Debian: apt-get install fio)");
  const std::string file = dir + "/fio.dat";
  const std::string cmd = fmt::format(
      "fio --name=randread --filename={} --size=256M --rw=randread --bs=4k --direct=1 "
      "--ioengine=io_uring --iodepth={} --runtime={:.0f} --time_based --output-format=json "
      "2>/dev/null",
      file, iodepth, std::max(1.0, seconds));
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return Status::FromErrno("popen fio", errno);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  if (rc != 0) return Status::Unavailable(fmt::format("fio exited with status {}", rc));
  // fio may print notes before the JSON document.
  const size_t brace = out.find('{');
  auto j =
      nlohmann::json::parse(brace == std::string::npos ? out : out.substr(brace), nullptr, false);
  if (j.is_discarded() || !j.contains("jobs") || j["jobs"].empty())
    return Status::Protocol("fio: no JSON result");
  return j["jobs"][0]["read"].value("iops", 0.0);
}

}  // namespace farmem::bench
