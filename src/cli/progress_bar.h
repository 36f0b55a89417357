// A one-line progress bar on stderr, shown only when stderr is a terminal: requests done of
// total, and tokens per second. Redrawn at most ten times a second.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace vesper::cli {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total)
      : label_(std::move(label)),
        total_(total),
        enabled_(isatty(fileno(stderr)) != 0),
        start_(std::chrono::steady_clock::now()) {}

  void update(int64_t done, int64_t tokens) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const int width = 30;
    const int filled = total_ > 0 ? static_cast<int>(width * done / total_) : width;
    std::string bar(filled, '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r%s [%s] %lld/%lld requests, %.1f tokens/s\033[K", label_.c_str(),
                 bar.c_str(), static_cast<long long>(done), static_cast<long long>(total_),
                 secs > 0 ? tokens / secs : 0.0);
    if (done >= total_) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace vesper::cli
