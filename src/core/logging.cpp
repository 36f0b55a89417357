#include "core/logging.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace vesper {
namespace {

LogLevel initial_level() {
  const char* env = std::getenv("VESPER_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(env, "warning") == 0) return LogLevel::kWarning;
  if (std::strcmp(env, "error") == 0) return LogLevel::kError;
  if (std::strcmp(env, "off") == 0) return LogLevel::kOff;
  return LogLevel::kInfo;
}

std::atomic<LogLevel> g_level{initial_level()};

void vlog(LogLevel level, const char* tag, const char* fmt, va_list args) {
  if (level < g_level.load(std::memory_order_relaxed)) return;
  char buf[4096];
  std::vsnprintf(buf, sizeof(buf), fmt, args);
  std::fprintf(stderr, "%s %s\n", tag, buf);
}

}  // namespace

void set_log_level(LogLevel level) { g_level.store(level); }
LogLevel log_level() { return g_level.load(); }

#define VESPER_DEFINE_LOG(fn, level, tag) \
  void fn(const char* fmt, ...) {         \
    va_list args;                         \
    va_start(args, fmt);                  \
    vlog(level, tag, fmt, args);          \
    va_end(args);                         \
  }
VESPER_DEFINE_LOG(log_debug, LogLevel::kDebug, "[debug]")
VESPER_DEFINE_LOG(log_info, LogLevel::kInfo, "[info]")
VESPER_DEFINE_LOG(log_warning, LogLevel::kWarning, "[warning]")
VESPER_DEFINE_LOG(log_error, LogLevel::kError, "[error]")
#undef VESPER_DEFINE_LOG

}  // namespace vesper
