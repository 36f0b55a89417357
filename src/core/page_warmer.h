// PageWarmer: makes large anonymous buffers resident in the background, at idle priority.
//
// Why: the KV cache is reserved, not touched (core/large_buffer.h), so a block's first write
// pays the kernel's page fault and page clearing, inside a forward pass. On some hosts that is
// slow: on the 2-core VMs the benchmarks run on, first touch ran at 0.44-0.55 GB/s (about 4 ms
// a 2 MiB huge page), against 25 GB/s for writing the same memory once resident. llama.cpp
// clears its whole KV buffer at start and vLLM allocates its pool up front; a PageWarmer pays
// the same cost off the request path instead: its thread runs at SCHED_IDLE (only on a core
// nothing else wants) and asks the kernel to populate the pages (MADV_POPULATE_WRITE, Linux
// 5.14), which never changes what a resident page holds, so it may run while the buffers are
// in use. Where the kernel lacks it, the warmer stops and pages fault in on first write as
// before.
//
// Order: `step` bytes of every region, then the next `step` of every region, and so on, so the
// first blocks of every layer's K and V (the ones a block pool hands out first) go first.
#pragma once

#include <atomic>
#include <cstddef>
#include <span>
#include <thread>
#include <vector>

namespace vesper {

class PageWarmer {
 public:
  // Starts warming `regions` (which must outlive the warmer) in steps of `step` bytes (> 0).
  PageWarmer(std::vector<std::span<std::byte>> regions, size_t step);
  // Stops the thread after its step in progress and joins it.
  ~PageWarmer();
  PageWarmer(const PageWarmer&) = delete;
  PageWarmer& operator=(const PageWarmer&) = delete;

  // Makes the rest resident now: stops the idle thread, then populates what it had not reached
  // on the calling thread. For a benchmark that must not time first touches (llama-bench's
  // context has its KV buffer cleared when created). Safe to call again.
  void wait();

  // Bytes made resident so far, and whether the kernel refused MADV_POPULATE_WRITE (or had no
  // memory left), after which nothing more is populated.
  size_t warmed_bytes() const { return warmed_.load(std::memory_order_relaxed); }
  bool unsupported() const { return unsupported_.load(std::memory_order_relaxed); }

 private:
  // Populates from step next_ on until the end, or until stop_.
  void populate();
  // Stops the thread after its step in progress (at normal priority where allowed) and joins it.
  void stop_and_join();

  std::vector<std::span<std::byte>> regions_;
  size_t step_;
  size_t steps_ = 0;  // steps of the longest region
  // Item i is step i / regions of region i % regions: a step of every region, then the next.
  std::atomic<size_t> next_{0};
  std::atomic<bool> stop_{false};
  std::atomic<size_t> warmed_{0};
  std::atomic<bool> unsupported_{false};
  std::thread thread_;
};

}  // namespace vesper
