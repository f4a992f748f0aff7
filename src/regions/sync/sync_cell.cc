// Codecs of the regions sync name record and name checks (layouts in sync_cell.h). Pure functions,
// called on any thread.
#include "regions/sync/sync_cell.h"

#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <vector>

namespace farmem::regions::sync {

std::string_view KindName(Kind kind) {
  switch (kind) {
    case Kind::kBarrier:
      return "barrier";
    case Kind::kMutex:
      return "mutex";
    case Kind::kBell:
      return "bell";
  }
  return "unknown";
}

namespace {

bool ParseKind(std::string_view s, Kind* out) {
  for (Kind k : {Kind::kBarrier, Kind::kMutex, Kind::kBell}) {
    if (s == KindName(k)) {
      *out = k;
      return true;
    }
  }
  return false;
}

bool ParseU64(std::string_view s, int base, uint64_t* out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, base);
  return ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

std::string EncodeNameRecord(const NameRecord& r) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "farmem-sync 1 %s %" PRIu64 " %" PRIx64 " %" PRIx64 " %" PRIu64 " ",
                std::string(KindName(r.kind)).c_str(), r.parties, r.nonce, r.key, r.offset);
  return std::string(buf) + r.address;
}

Result<NameRecord> DecodeNameRecord(std::string_view text) {
  std::vector<std::string_view> f;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t sp = f.size() == 7 ? std::string_view::npos : text.find(' ', pos);
    const size_t end = sp == std::string_view::npos ? text.size() : sp;
    f.push_back(text.substr(pos, end - pos));
    if (sp == std::string_view::npos) break;
    pos = sp + 1;
  }
  auto bad = [&](const char* what) {
    return Status::Protocol(std::string("regions sync: malformed name record (") + what + ")");
  };
  if (f.size() != 8 || f[0] != "farmem-sync") return bad("not a farmem-sync record");
  if (f[1] != "1") return bad("unknown version");
  NameRecord r;
  if (!ParseKind(f[2], &r.kind)) return bad("unknown kind");
  if (!ParseU64(f[3], 10, &r.parties) || !ParseU64(f[4], 16, &r.nonce) ||
      !ParseU64(f[5], 16, &r.key) || !ParseU64(f[6], 10, &r.offset)) {
    return bad("bad number");
  }
  if (r.kind == Kind::kBarrier && (r.parties == 0 || r.parties > UINT32_MAX)) {
    return bad("barrier party count");
  }
  if (r.offset % 8 != 0) return bad("cell offset not 8-byte aligned");
  if (f[7].empty() || f[7].find(':') == std::string_view::npos ||
      f[7].find(' ') != std::string_view::npos) {
    return bad("address");
  }
  r.address = std::string(f[7]);
  return r;
}

Status ValidateSyncName(std::string_view name) {
  if (name.empty() || name.size() > 200) {
    return Status::InvalidArgument("regions sync: a name has 1 to 200 bytes");
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-' || c == '/';
    if (!ok) {
      return Status::InvalidArgument("regions sync: name '" + std::string(name) +
                                     "' has a byte outside [A-Za-z0-9_./-]");
    }
  }
  return Status::OK();
}

}  // namespace farmem::regions::sync
