//===- Status.h - Error values for the runtime's public API ---------------===//
//
// The runtime never throws across its public boundary: functions return a
// Status or an Expected<T> whose message says what went wrong and where.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace dlopt::rt {

/// Result of an operation that can fail. An empty message means success.
class [[nodiscard]] Status {
public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string msg) {
    Status s;
    s.failed_ = true;
    s.msg_ = std::move(msg);
    return s;
  }
  bool isOk() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string &message() const { return msg_; }
  /// Prefixes the message with context, e.g. "reading model.plan: ".
  Status withContext(const std::string &ctx) const {
    return failed_ ? error(ctx + msg_) : *this;
  }

private:
  bool failed_ = false;
  std::string msg_;
};

/// A value or an error.
template <typename T> class [[nodiscard]] Expected {
public:
  Expected(T value) : value_(std::move(value)) {}
  Expected(Status status) : status_(std::move(status)) {}
  bool isOk() const { return value_.has_value(); }
  explicit operator bool() const { return isOk(); }
  T &operator*() { return *value_; }
  const T &operator*() const { return *value_; }
  T *operator->() { return &*value_; }
  const T *operator->() const { return &*value_; }
  T take() { return std::move(*value_); }
  const Status &status() const { return status_; }

private:
  std::optional<T> value_;
  Status status_;
};

} // namespace dlopt::rt

/// Returns early from the enclosing function if `expr` yields an error Status.
#define DLOPT_RETURN_IF_ERROR(expr)                                            \
  do {                                                                         \
    ::dlopt::rt::Status dlopt_status_ = (expr);                                \
    if (!dlopt_status_.isOk())                                                 \
      return dlopt_status_;                                                    \
  } while (0)
