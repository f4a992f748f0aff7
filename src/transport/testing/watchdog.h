// Test watchdog: turns a hang (a blocking call that never returns) into a failed test instead of a
// ctest run that blocks until its global timeout. Header-only so any test binary can use it.
// It uses alarm()/SIGALRM rather than a thread so that tests may fork() while it is armed.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string_view>

namespace farmem::testing {

class Watchdog {
 public:
  // Arms the watchdog for `limit`; when it fires the whole process exits with code 124 after
  // printing `what` (the test name) so the ctest log says which test hung. Re-arming replaces
  // the previous limit; only one Watchdog may be armed per process at a time.
  static void Arm(std::string_view what, std::chrono::seconds limit) {
    static constexpr std::string_view kPrefix =
        "\n*** WATCHDOG: test hung (no progress before deadline): ";
    size_t n = 0;
    for (char c : kPrefix) Buffer()[n++] = c;
    for (char c : what) {
      if (n + 2 >= kBufferSize) break;
      Buffer()[n++] = c;
    }
    Buffer()[n++] = '\n';
    Length() = n;
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = &Watchdog::OnAlarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, nullptr);
    alarm(static_cast<unsigned>(limit.count() > 0 ? limit.count() : 1));
  }

  static void Disarm() { alarm(0); }

  // In a fork()ed child: drop the inherited handler so a stray SIGALRM there uses the default
  // action (the child's own alarm then simply kills it).
  static void ResetInChild() {
    alarm(0);
    signal(SIGALRM, SIG_DFL);
  }

 private:
  static constexpr size_t kBufferSize = 512;
  // Preformatted so the handler only calls async-signal-safe functions.
  static char* Buffer() {
    static char buf[kBufferSize];
    return buf;
  }
  static size_t& Length() {
    static size_t len = 0;
    return len;
  }
  static void OnAlarm(int) {
    ssize_t ignored = write(STDERR_FILENO, Buffer(), Length());
    (void)ignored;
    _exit(124);
  }
};

// RAII form: armed for one scope (a test), disarmed when it ends.
class ScopedWatchdog {
 public:
  ScopedWatchdog(std::string_view what, std::chrono::seconds limit) { Watchdog::Arm(what, limit); }
  ~ScopedWatchdog() { Watchdog::Disarm(); }
  ScopedWatchdog(const ScopedWatchdog&) = delete;
  ScopedWatchdog& operator=(const ScopedWatchdog&) = delete;
};

}  // namespace farmem::testing
