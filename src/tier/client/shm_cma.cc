// ShmServerPid / ShmUsesCma (shm_cma.h): parse the fabric address, probe ptrace read permission
// with a 1-byte process_vm_readv. Any thread.
#include "tier/client/shm_cma.h"

#include <sys/uio.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <string>

namespace farmem::tier {

int ShmServerPid(std::string_view address) {
  const size_t dot = address.find('.');
  if (dot == std::string_view::npos) return 0;
  const std::string_view rest = address.substr(dot + 1);
  int pid = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
  if (ec != std::errc() || end == rest.data() || pid <= 0) return 0;
  if (end != rest.data() + rest.size() && *end != '.') return 0;
  return pid;
}

bool ShmUsesCma(int server_pid, const char* disable_cma_env) {
  if (disable_cma_env != nullptr) {
    std::string v(disable_cma_env);
    for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (v == "1" || v == "yes" || v == "true" || v == "on") return false;
  }
  if (server_pid <= 0) return false;
  // Address 0 is never mapped: a permitted read fails with EFAULT; a refused one with EPERM
  // (ESRCH: the server is gone).
  char byte = 0;
  iovec local{&byte, 1};
  iovec remote{nullptr, 1};
  const ssize_t n = process_vm_readv(server_pid, &local, 1, &remote, 1, 0);
  return n == 1 || (n < 0 && errno == EFAULT);
}

}  // namespace farmem::tier
