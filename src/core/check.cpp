#include "core/check.h"

#include <cstdarg>

namespace vesper::detail {

void check_failed(const char* file, int line, const char* cond, const char* fmt, ...) {
  std::fprintf(stderr, "vesper: internal error at %s:%d: check failed: %s: ", file, line, cond);
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fputc('\n', stderr);
  std::abort();
}

void check_failed(const char* file, int line, const char* cond) {
  std::fprintf(stderr, "vesper: internal error at %s:%d: check failed: %s\n", file, line, cond);
  std::abort();
}

}  // namespace vesper::detail
