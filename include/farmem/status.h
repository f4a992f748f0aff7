// Status and Result<T>: how every farmem call reports success or a failure with a message.
// Modelled on LevelDB's Status: cheap when OK (no allocation), a code plus text otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace farmem {

enum class Code : uint8_t {
  kOk = 0,
  kInvalidArgument,     // caller passed something malformed
  kNotFound,            // unknown key, region, peer, object
  kOutOfRange,          // offset/length outside a registered region
  kPermissionDenied,    // wrong cluster token or key
  kTimedOut,            // a wait reached its deadline
  kUnavailable,         // peer gone / connection closed / not started
  kResourceExhausted,   // out of memory, queue full
  kProtocol,            // malformed frame or unexpected message
  kIoError,             // OS call failed
  kAborted,             // operation cancelled (shutdown)
  kInternal,            // a bug: an invariant did not hold
  kMoved,               // the object is no longer at the pointer's address: correct it, retry
  kFailedPrecondition,  // a compare-and-set found another revision, or a create found the key
};

std::string_view CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string_view msg);

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string_view m) { return Status(Code::kInvalidArgument, m); }
  static Status NotFound(std::string_view m) { return Status(Code::kNotFound, m); }
  static Status OutOfRange(std::string_view m) { return Status(Code::kOutOfRange, m); }
  static Status PermissionDenied(std::string_view m) { return Status(Code::kPermissionDenied, m); }
  static Status TimedOut(std::string_view m) { return Status(Code::kTimedOut, m); }
  static Status Unavailable(std::string_view m) { return Status(Code::kUnavailable, m); }
  static Status ResourceExhausted(std::string_view m) {
    return Status(Code::kResourceExhausted, m);
  }
  static Status Protocol(std::string_view m) { return Status(Code::kProtocol, m); }
  static Status IoError(std::string_view m) { return Status(Code::kIoError, m); }
  // IoError with strerror(err) appended.
  static Status FromErrno(std::string_view what, int err);
  static Status Aborted(std::string_view m) { return Status(Code::kAborted, m); }
  static Status Internal(std::string_view m) { return Status(Code::kInternal, m); }
  static Status Moved(std::string_view m) { return Status(Code::kMoved, m); }
  static Status FailedPrecondition(std::string_view m) {
    return Status(Code::kFailedPrecondition, m);
  }

  bool ok() const { return state_ == nullptr; }
  Code code() const { return state_ ? state_->code : Code::kOk; }
  // The message alone ("" when OK).
  std::string_view message() const { return state_ ? std::string_view(state_->msg) : ""; }
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;

  // Prefix the message with context, keeping the code ("reading region 3: out of range ...").
  Status WithContext(std::string_view context) const;

 private:
  struct State {
    Code code;
    std::string msg;
  };
  // shared_ptr keeps copies cheap; the state is immutable once built.
  std::shared_ptr<const State> state_;
};

namespace detail {
// Prints "farmem: Result value accessed on an error: <status>" to stderr and calls std::abort().
[[noreturn]] void ResultValueOnError(const Status& status);
}  // namespace detail

// A value or a non-OK Status.
// Accessing the value (value(), operator*, operator->) of a Result that holds an error is a
// checked failure in every build: it prints the status to stderr and calls std::abort(). Check
// ok() first.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit on purpose
  Result(Status status) : status_(std::move(status)) {
    if (status_.ok()) status_ = Status::Internal("Result constructed from OK status without value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & { return checked(); }
  const T& value() const& { return checked(); }
  T&& value() && { return std::move(checked()); }
  T* operator->() { return &checked(); }
  const T* operator->() const { return &checked(); }
  T& operator*() & { return checked(); }
  const T& operator*() const& { return checked(); }

 private:
  T& checked() {
    if (!value_.has_value()) [[unlikely]]
      detail::ResultValueOnError(status_);
    return *value_;
  }
  const T& checked() const {
    if (!value_.has_value()) [[unlikely]]
      detail::ResultValueOnError(status_);
    return *value_;
  }

  std::optional<T> value_;
  Status status_;
};

}  // namespace farmem

// Propagate a non-OK Status from an expression.
#define FARMEM_RETURN_IF_ERROR(expr) \
  do {                               \
    ::farmem::Status _st = (expr);   \
    if (!_st.ok()) return _st;       \
  } while (0)

#define FARMEM_CONCAT_INNER(a, b) a##b
#define FARMEM_CONCAT(a, b) FARMEM_CONCAT_INNER(a, b)
// `FARMEM_ASSIGN_OR_RETURN(auto x, MakeX());`
#define FARMEM_ASSIGN_OR_RETURN(lhs, expr)                                                  \
  auto FARMEM_CONCAT(_res_, __LINE__) = (expr);                                             \
  if (!FARMEM_CONCAT(_res_, __LINE__).ok()) return FARMEM_CONCAT(_res_, __LINE__).status(); \
  lhs = std::move(FARMEM_CONCAT(_res_, __LINE__)).value()
