// MappedFile: a read-only, private memory mapping of a whole file. Model weights are used in
// place from this mapping (zero-copy); the mapping lives as long as the MappedFile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/result.h"

namespace vesper {

class MappedFile {
 public:
  // Maps `path`. Errors name the path and the system reason.
  static Result<MappedFile> open(const std::string& path);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

  // Tells the OS that the pages wholly inside [p, p + n) (a range of this mapping) are not needed
  // now, so they stop counting as resident (madvise MADV_DONTNEED). The data is unchanged: a later
  // read faults the pages back in from the file. Used after weights were repacked into memory.
  void release_pages(const void* p, size_t n) const;

 private:
  void reset();

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

}  // namespace vesper
