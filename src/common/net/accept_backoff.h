// AcceptBackoff: what an accept loop does when accept() fails for lack of descriptors or memory
// (EMFILE, ENFILE, ENOBUFS, ENOMEM): stop polling the listener for a growing interval and log at
// most once per second, instead of spinning. Used by one listener thread each (not thread-safe).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace farmem::net {

class AcceptBackoff {
 public:
  using Clock = std::chrono::steady_clock;

  // `what` names the listener in log lines ("tcp NIC thread", "bootstrap").
  AcceptBackoff(std::string what, std::chrono::milliseconds min, std::chrono::milliseconds max);

  // What the caller does after accept() failed with `err`.
  enum class Action : uint8_t {
    kStop,   // EAGAIN: nothing more to accept now
    kRetry,  // a transient per-connection error (the peer reset it, EINTR...): accept again
    kPause,  // out of descriptors or memory (or an unexpected error): do not poll the listener
             // until resume_at()
  };
  Action OnError(int err, Clock::time_point now);
  // A connection was accepted: the next failure starts again from the shortest pause.
  void OnSuccess() { next_ = min_; }

  bool paused(Clock::time_point now) const { return now < resume_at_; }
  Clock::time_point resume_at() const { return resume_at_; }
  // Pauses so far (a counter for stats).
  uint64_t pauses() const { return pauses_; }

 private:
  const std::string what_;
  const std::chrono::milliseconds min_, max_;
  std::chrono::milliseconds next_;
  Clock::time_point resume_at_{};
  uint64_t pauses_ = 0;
  // Rate limit of the log line: one per kLogInterval, counting the failures not logged.
  Clock::time_point last_log_{};
  bool logged_ = false;
  uint64_t suppressed_ = 0;
};

}  // namespace farmem::net
