#include "core/large_buffer.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>

namespace vesper {
namespace {
constexpr size_t kCacheLine = 64;
constexpr size_t kSmallPage = 4096;
constexpr size_t kHugePage = size_t{2} << 20;

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}
}  // namespace

void LargeBufferFree::operator()(void* p) const {
  if (mapped > 0) {
    ::munmap(p, mapped);
  } else {
    std::free(p);
  }
}

std::unique_ptr<std::byte[], LargeBufferFree> allocate_large_buffer(size_t bytes) {
  using Buffer = std::unique_ptr<std::byte[], LargeBufferFree>;
  const size_t lines = round_up(bytes, kCacheLine);
  if (lines < kHugePage)
    return Buffer(static_cast<std::byte*>(std::aligned_alloc(kCacheLine, lines)));
  // Map 2 MiB more than needed, then unmap the head before the first 2 MiB boundary and the tail
  // after the buffer's last small page.
  const size_t length = round_up(bytes, kSmallPage);
  const size_t reserved = length + kHugePage;
  void* raw = ::mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return Buffer(nullptr);
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = round_up(base, kHugePage);
  if (start > base) ::munmap(raw, start - base);
  const uintptr_t end = start + length;
  if (base + reserved > end) ::munmap(reinterpret_cast<void*>(end), base + reserved - end);
  auto* p = reinterpret_cast<std::byte*>(start);
  // Advisory (see the header): a failure leaves small pages.
  ::madvise(p, length, MADV_HUGEPAGE);
  return Buffer(p, LargeBufferFree{length});
}

}  // namespace vesper
