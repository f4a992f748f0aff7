// `farmem regions stat [--mount DIR]`: prints the introspection reports of a remote-regions mount
// (DIR/.regions/*, root only; docs/regions.md "Introspection"). Without --mount it finds every
// mount of type fuse.regions in /proc/self/mounts. Single-threaded.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace farmem::cli {

namespace {

// The report files, in the order they are printed (the FUSE daemon's .regions/ directory).
constexpr const char* kReports[] = {"daemon", "hosts", "memusage", "pools", "open", "files"};

// /proc/mounts escapes space, tab, newline and backslash as \ooo.
std::string UnescapeMountField(const std::string& f) {
  std::string out;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '\\' && i + 3 < f.size() && f[i + 1] >= '0' && f[i + 1] <= '3') {
      out += static_cast<char>((f[i + 1] - '0') * 64 + (f[i + 2] - '0') * 8 + (f[i + 3] - '0'));
      i += 3;
    } else {
      out += f[i];
    }
  }
  return out;
}

std::vector<std::string> RegionMounts() {
  std::vector<std::string> out;
  std::ifstream in("/proc/self/mounts");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string dev, dir, type;
    if (fields >> dev >> dir >> type && type == "fuse.regions")
      out.push_back(UnescapeMountField(dir));
  }
  return out;
}

}  // namespace

int RunRegionsStat(const std::string& mount) {
  std::vector<std::string> mounts;
  if (mount.empty()) {
    mounts = RegionMounts();
    if (mounts.empty()) {
      std::fprintf(stderr,
                   "farmem regions stat: no remote-regions mount (type fuse.regions) in "
                   "/proc/self/mounts; give --mount DIR\n");
      return 1;
    }
  } else {
    mounts.push_back(mount);
  }
  int rc = 0;
  for (const std::string& m : mounts) {
    std::printf("regions mount %s\n", m.c_str());
    for (const char* name : kReports) {
      std::string path = m + "/.regions/" + name;
      errno = 0;
      std::ifstream in(path);
      if (!in) {
        int e = errno;
        std::fprintf(stderr, "farmem regions stat: %s: %s%s\n", path.c_str(),
                     e ? std::strerror(e) : "cannot open",
                     e == EACCES ? " (.regions/ is root-only)"
                                 : (e == ENOENT ? " (a mount of an older farmem?)" : ""));
        rc = 1;  // and on to the next mount
        break;
      }
      std::ostringstream text;
      text << in.rdbuf();
      std::printf("== %s ==\n%s", name, text.str().c_str());
    }
  }
  return rc;
}

}  // namespace farmem::cli
