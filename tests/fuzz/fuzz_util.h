// Helpers shared by the fuzz targets: where the test data lives, and a file descriptor-backed
// "file" that holds one fuzz input at a time.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/check.h"

#ifndef VESPER_SOURCE_DIR
#define VESPER_SOURCE_DIR "."
#endif

namespace vesper::fuzz {

// `relative` (a path from the repository root, such as "../shared/models/x.gguf") as found from
// the working directory when that is the repository root (how run-fuzzers runs the targets),
// else from the source directory the target was built from.
inline std::string repo_path(const std::string& relative) {
  if (std::filesystem::exists(relative)) return relative;
  std::string from_source = std::string(VESPER_SOURCE_DIR) + "/" + relative;
  if (std::filesystem::exists(from_source)) return from_source;
  std::fprintf(stderr, "fuzz: test data %s not found (run from the repository root)\n",
               relative.c_str());
  std::abort();
}

// An in-memory file (memfd) that each input is written to, so the code under test opens it by
// path exactly as it opens a model; /proc/self/fd/N names it.
class MemFile {
 public:
  explicit MemFile(const char* name) : fd_(::memfd_create(name, MFD_CLOEXEC)) {
    VESPER_CHECK(fd_ >= 0, "memfd_create failed");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  ~MemFile() { ::close(fd_); }

  // Replaces the contents with [data, data + size).
  void write(const uint8_t* data, size_t size) {
    VESPER_CHECK(::ftruncate(fd_, 0) == 0, "ftruncate failed");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      VESPER_CHECK(n > 0, "pwrite failed");
      done += static_cast<size_t>(n);
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

}  // namespace vesper::fuzz
