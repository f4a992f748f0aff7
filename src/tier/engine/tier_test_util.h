// Helpers for the TeRM engine tests: a temporary directory on a real disk (never tmpfs: the store
// refuses it), store options for small regions, and a one-sided-reader style copy of the mapped
// range. Used by the test threads only.
#pragma once

#include <sys/statfs.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "tier/engine/tier_store.h"

namespace farmem::tier::testing {

// mkdtemp under /tmp, or /var/tmp when /tmp is tmpfs; removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char* root = "/tmp";
    struct statfs st;
    if (statfs(root, &st) == 0 && static_cast<unsigned long>(st.f_type) == 0x01021994) {
      root = "/var/tmp";
    }
    std::string tmpl = std::string(root) + "/farmem-tier-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) != nullptr) path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  bool ok() const { return !path_.empty(); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline TierOptions SmallOptions(const std::string& path, uint64_t units, uint64_t budget_units,
                                uint64_t unit = 16 * 1024) {
  TierOptions o;
  o.path = path;
  o.unit_size = unit;
  o.capacity = units * unit;
  o.dram_budget = budget_units * unit;
  o.fill_percent = 100;
  return o;
}

// Copies [off, off + out.size()) of the mapped range the way a one-sided reader does: aligned
// 8-byte seq_cst loads in ascending order (off and size multiples of 8).
inline void DirectCopy(const uint8_t* base, uint64_t off, std::span<uint8_t> out) {
  for (size_t i = 0; i < out.size(); i += 8) {
    const uint64_t w =
        __atomic_load_n(reinterpret_cast<const uint64_t*>(base + off + i), __ATOMIC_SEQ_CST);
    std::memcpy(out.data() + i, &w, 8);
  }
}

inline std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

}  // namespace farmem::tier::testing
