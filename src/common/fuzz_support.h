// Helpers shared by the libFuzzer targets (src/**/*_fuzz.cc), header-only and used by nothing
// else: FUZZ_CHECK for the invariants a target asserts beyond "no crash", and the signal-handler
// repair every target linking libfabric needs (see RestoreCrashSignals).
#pragma once

#include <dlfcn.h>
#include <signal.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

// Aborts with the failed condition and its place, so a finding names the broken invariant.
#define FUZZ_CHECK(cond)                                                                   \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s at %s:%d\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                        \
    }                                                                                      \
  } while (0)

namespace farmem::fuzz {

// libfabric pulls in libinfinipath (psm provider), whose constructor installs handlers for
// SIGILL, SIGABRT, SIGSEGV and SIGBUS that call exit(): a failed check, an ASan-unseen wild
// access or an abort then shows up only as "fuzz target exited", without the signal and stack.
// libFuzzer installs its own crash handlers after LLVMFuzzerInitialize, but never over an
// existing one, so a target calls this from LLVMFuzzerInitialize to put those back to default.
inline void RestoreCrashSignals() {
  for (int sig : {SIGILL, SIGABRT, SIGSEGV, SIGBUS, SIGFPE}) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    if (sigaction(sig, nullptr, &sa) != 0) continue;
    void* handler = (sa.sa_flags & SA_SIGINFO) ? reinterpret_cast<void*>(sa.sa_sigaction)
                                               : reinterpret_cast<void*>(sa.sa_handler);
    Dl_info info;
    std::memset(&info, 0, sizeof(info));
    if (handler == nullptr || dladdr(handler, &info) == 0 || info.dli_fname == nullptr) continue;
    if (std::strstr(info.dli_fname, "infinipath") == nullptr) continue;
    std::signal(sig, SIG_DFL);
  }
}

}  // namespace farmem::fuzz
