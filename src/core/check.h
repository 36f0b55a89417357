// VESPER_CHECK: invariants that only a bug can break. On failure it prints the file, the line,
// the condition and a formatted message, then aborts. User errors use Result (core/result.h).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace vesper::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* cond, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
[[noreturn]] void check_failed(const char* file, int line, const char* cond);
}  // namespace vesper::detail

#define VESPER_CHECK(cond, ...)                                                      \
  do {                                                                               \
    if (__builtin_expect(!(cond), 0))                                                \
      ::vesper::detail::check_failed(__FILE__, __LINE__, #cond __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)
