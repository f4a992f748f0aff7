// rsetdefaultattr / rcleardefaultattr / rgetdefaultattr (include/farmem/regionfs.h): the calling
// thread's attribute defaults, as xattrs "user.region.default.<attr>" of the mount's root, which
// the FUSE daemon (region_fs.cc) keeps per thread id. Any thread may call them (for itself).
#include <sys/vfs.h>
#include <sys/xattr.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "farmem/regionfs.h"
#include "regions/engine/region_store.h"

namespace farmem {
namespace {

std::string DefaultName(std::string_view attr) {
  return "user.region.default." + std::string(attr);
}

// The store's errno -> Status mapping (regions::ErrnoStatus), with strerror's words added.
Status FromErrno(int e, const std::string& what) {
  return regions::ErrnoStatus(e, what + ": " + std::strerror(e));
}

// A farmem mount's root: a FUSE file system that answers user.region.persistent. (Other file
// systems may well store a "user.region.default.*" xattr, silently meaning nothing.)
Status CheckMount(const std::string& mountpoint) {
  constexpr long kFuseSuperMagic = 0x65735546;
  struct statfs fs {};
  if (::statfs(mountpoint.c_str(), &fs) != 0) return FromErrno(errno, mountpoint);
  char v[8];
  if (fs.f_type != kFuseSuperMagic ||
      ::getxattr(mountpoint.c_str(), "user.region.persistent", v, sizeof(v)) < 0)
    return Status::InvalidArgument(mountpoint + " is not the root of a farmem mount");
  return Status::OK();
}

}  // namespace

Status rsetdefaultattr(const std::string& mountpoint, std::string_view attr,
                       std::string_view value) {
  FARMEM_RETURN_IF_ERROR(CheckMount(mountpoint));
  const std::string name = DefaultName(attr);
  if (::setxattr(mountpoint.c_str(), name.c_str(), value.data(), value.size(), 0) != 0)
    return FromErrno(errno, "rsetdefaultattr " + std::string(attr) + " on " + mountpoint);
  return Status::OK();
}

Status rcleardefaultattr(const std::string& mountpoint, std::string_view attr) {
  FARMEM_RETURN_IF_ERROR(CheckMount(mountpoint));
  const std::string name = DefaultName(attr);
  if (::removexattr(mountpoint.c_str(), name.c_str()) != 0)
    return FromErrno(errno, "rcleardefaultattr " + std::string(attr) + " on " + mountpoint);
  return Status::OK();
}

Result<std::string> rgetdefaultattr(const std::string& mountpoint, std::string_view attr) {
  FARMEM_RETURN_IF_ERROR(CheckMount(mountpoint));
  const std::string name = DefaultName(attr);
  char buf[4097];
  const ssize_t n = ::getxattr(mountpoint.c_str(), name.c_str(), buf, sizeof(buf));
  if (n < 0) return FromErrno(errno, "rgetdefaultattr " + std::string(attr) + " on " + mountpoint);
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace farmem
