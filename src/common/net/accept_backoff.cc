// AcceptBackoff (accept_backoff.h): classifies accept() errors, grows the pause and rate-limits
// the log line. Runs on the thread of the listener that owns it.
#include "common/net/accept_backoff.h"

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/log.h"

namespace farmem::net {
namespace {

// At most one log line per listener per interval, whatever the error rate.
constexpr auto kLogInterval = std::chrono::seconds(1);

}  // namespace

AcceptBackoff::AcceptBackoff(std::string what, std::chrono::milliseconds min,
                             std::chrono::milliseconds max)
    : what_(std::move(what)), min_(min), max_(max < min ? min : max), next_(min) {}

AcceptBackoff::Action AcceptBackoff::OnError(int err, Clock::time_point now) {
  switch (err) {
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
      return Action::kStop;
    // accept(2): errors already pending on the new connection are reported by accept itself and
    // are to be treated like EAGAIN by retrying; the listener is fine.
    case EINTR:
    case ECONNABORTED:
    case EPROTO:
    case ENETDOWN:
    case ENOPROTOOPT:
    case EHOSTDOWN:
    case ENONET:
    case EHOSTUNREACH:
    case EOPNOTSUPP:
    case ENETUNREACH:
    case EPERM:  // a firewall rule refused this connection
      return Action::kRetry;
    default:
      break;
  }
  // EMFILE, ENFILE, ENOBUFS, ENOMEM, or something unexpected: retrying at once would fail the
  // same way (level-triggered readiness stays set), so pause the listener.
  ++pauses_;
  const auto pause = next_;
  resume_at_ = now + pause;
  next_ = std::min(max_, next_ * 2);
  if (!logged_ || now - last_log_ >= kLogInterval) {
    if (suppressed_ > 0) {
      FARMEM_LOG_WARN("{}: accept: {}; not accepting for {} ms ({} more since the last report)",
                      what_, std::strerror(err), pause.count(), suppressed_);
    } else {
      FARMEM_LOG_WARN("{}: accept: {}; not accepting for {} ms", what_, std::strerror(err),
                      pause.count());
    }
    logged_ = true;
    last_log_ = now;
    suppressed_ = 0;
  } else {
    ++suppressed_;
  }
  return Action::kPause;
}

}  // namespace farmem::net
