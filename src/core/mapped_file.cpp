#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

namespace vesper {

Result<MappedFile> MappedFile::open(const std::string& path) {
  // Non-blocking, so that a FIFO or a device opens at once (and is refused below) instead of
  // blocking until a writer appears; for a regular file the flag changes nothing.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return make_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return make_error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(path + ": not a regular file");
  }
  MappedFile file;
  file.path_ = path;
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int err = errno;
      ::close(fd);
      return make_error(path + ": cannot mmap: " + std::strerror(err));
    }
    file.data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
  }
  return *this;
}

MappedFile::~MappedFile() {
  reset();
}

void MappedFile::release_pages(const void* p, size_t n) const {
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + page - 1) / page * page;  // inward: never a neighbour's page
  const uintptr_t last = (begin + n) / page * page;
  const auto base = reinterpret_cast<uintptr_t>(data_);
  if (first >= last || first < base || last > base + size_) return;
  // The kernel may map file pages as 2 MiB huge pages (large folios); a later fault on a
  // neighbour in the same 2 MiB (a norm vector, the next tensor) would map them all back. So the
  // 2 MiB-aligned span around the range (within the mapping) is first marked for small pages.
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t span_begin = std::max(base / page * page, first / kHuge * kHuge);
  const uintptr_t span_end =
      std::min((base + size_ + page - 1) / page * page, (last + kHuge - 1) / kHuge * kHuge);
  // Advisory only: a failure leaves the pages resident, which costs memory, not correctness.
  ::madvise(reinterpret_cast<void*>(span_begin), span_end - span_begin, MADV_NOHUGEPAGE);
  ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void MappedFile::reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace vesper
