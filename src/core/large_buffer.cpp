#include "core/large_buffer.h"

#include <sys/mman.h>

#include <cstdlib>

namespace vesper {
namespace {
constexpr size_t kCacheLine = 64;
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

void LargeBufferFree::operator()(void* p) const {
  std::free(p);
}

std::unique_ptr<std::byte[], LargeBufferFree> allocate_large_buffer(size_t bytes) {
  const size_t lines = (bytes + kCacheLine - 1) / kCacheLine * kCacheLine;
  if (lines < kHugePage)
    return std::unique_ptr<std::byte[], LargeBufferFree>(
        static_cast<std::byte*>(std::aligned_alloc(kCacheLine, lines)));
  const size_t huge = (lines + kHugePage - 1) / kHugePage * kHugePage;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kHugePage, huge));
  // Advisory (see the header): a failure leaves small pages.
  if (p != nullptr) ::madvise(p, huge, MADV_HUGEPAGE);
  return std::unique_ptr<std::byte[], LargeBufferFree>(p);
}

}  // namespace vesper
