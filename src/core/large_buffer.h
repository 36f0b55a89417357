// Large, long-lived buffers that computation streams through (repacked weights, the KV cache).
//
// A matmul or an attention pass reads such a buffer from end to end (or in scattered runs of a
// few KiB, for the paged KV cache). On 4 KiB pages that costs a TLB miss every 4 KiB, so buffers
// of at least one 2 MiB huge page are mapped on their own, aligned to 2 MiB, and advised as
// transparent huge pages (madvise): Linux's default THP mode ("madvise") backs memory with huge
// pages only on request. The mapping ends at the buffer's last 4 KiB page, so a last, partial
// 2 MiB stays on small pages and is never made resident beyond what the buffer holds. The advice
// is best effort; without huge pages the buffer works the same, only slower. Pages are not
// touched here, so untouched parts of a buffer stay unbacked.
#pragma once

#include <cstddef>
#include <memory>

namespace vesper {

// Releases a buffer of allocate_large_buffer: `mapped` bytes of its own mapping, or (0) heap
// memory.
struct LargeBufferFree {
  size_t mapped = 0;
  void operator()(void* p) const;
};

// An uninitialised buffer of `bytes` (>= 1), aligned to 64 bytes at least. Null if memory ran out.
std::unique_ptr<std::byte[], LargeBufferFree> allocate_large_buffer(size_t bytes);

// Typed view of the above: `count` uninitialised elements of a trivial type T.
template <class T>
std::unique_ptr<T[], LargeBufferFree> allocate_large_array(size_t count) {
  auto bytes = allocate_large_buffer(count * sizeof(T));
  const LargeBufferFree free = bytes.get_deleter();
  return std::unique_ptr<T[], LargeBufferFree>(reinterpret_cast<T*>(bytes.release()), free);
}

}  // namespace vesper
