// Status implementation: code names and message formatting.
#include "farmem/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace farmem {

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "InvalidArgument";
    case Code::kNotFound:
      return "NotFound";
    case Code::kOutOfRange:
      return "OutOfRange";
    case Code::kPermissionDenied:
      return "PermissionDenied";
    case Code::kTimedOut:
      return "TimedOut";
    case Code::kUnavailable:
      return "Unavailable";
    case Code::kResourceExhausted:
      return "ResourceExhausted";
    case Code::kProtocol:
      return "Protocol";
    case Code::kIoError:
      return "IoError";
    case Code::kAborted:
      return "Aborted";
    case Code::kInternal:
      return "Internal";
    case Code::kMoved:
      return "Moved";
    case Code::kFailedPrecondition:
      return "FailedPrecondition";
  }
  return "Unknown";
}

Status::Status(Code code, std::string_view msg) {
  if (code != Code::kOk) state_ = std::make_shared<const State>(State{code, std::string(msg)});
}

Status Status::FromErrno(std::string_view what, int err) {
  std::string m(what);
  m += ": ";
  m += std::strerror(err);
  return Status(Code::kIoError, m);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(CodeName(state_->code));
  s += ": ";
  s += state_->msg;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += state_->msg;
  return Status(state_->code, m);
}

namespace detail {

void ResultValueOnError(const Status& status) {
  std::fprintf(stderr, "farmem: Result value accessed on an error: %s\n",
               status.ToString().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace detail

}  // namespace farmem
