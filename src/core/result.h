// Result<T>: the value-or-error type for failures caused by users (files, flags, requests).
//
// Errors carry a human-readable message that names the thing at fault, e.g.
// "model.gguf: tensor blk.3.attn_q.weight: data ends past end of file". Programming errors
// are not Results: they are VESPER_CHECK failures (core/check.h).
#pragma once

#include <string>
#include <utility>
#include <variant>

#include "core/check.h"

namespace vesper {

struct Error {
  std::string message;
};

// Builds an Error from a message; reads well at return sites: `return make_error("...")`.
inline Error make_error(std::string message) { return Error{std::move(message)}; }

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    VESPER_CHECK(ok(), "Result::value() on an error: %s", error().message.c_str());
    return std::get<0>(v_);
  }
  const T& value() const& {
    VESPER_CHECK(ok(), "Result::value() on an error: %s", error().message.c_str());
    return std::get<0>(v_);
  }
  T&& value() && {
    VESPER_CHECK(ok(), "Result::value() on an error: %s", error().message.c_str());
    return std::get<0>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }
  const T& operator*() const { return value(); }

  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

// Result for operations that return nothing but may fail.
template <>
class [[nodiscard]] Result<void> {
 public:
  Result() = default;
  Result(Error error) : error_(std::move(error)), ok_(false) {}  // NOLINT: implicit by design
  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool ok_ = true;
};

using Status = Result<void>;

}  // namespace vesper

// Propagates an error from an expression yielding Result<...>.
#define VESPER_TRY(expr)                                    \
  do {                                                      \
    auto&& vesper_try_result_ = (expr);                     \
    if (!vesper_try_result_.ok()) return vesper_try_result_.error(); \
  } while (0)

// Evaluates a Result<T> expression, returns its error, or binds its value to `lhs`.
#define VESPER_ASSIGN_OR_RETURN(lhs, expr) VESPER_ASSIGN_OR_RETURN_IMPL_(VESPER_CONCAT_(r_, __LINE__), lhs, expr)
#define VESPER_CONCAT_INNER_(a, b) a##b
#define VESPER_CONCAT_(a, b) VESPER_CONCAT_INNER_(a, b)
#define VESPER_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.error();                  \
  lhs = std::move(tmp).value()
