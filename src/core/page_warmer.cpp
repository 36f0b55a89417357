#include "core/page_warmer.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>

#include "core/check.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14's value, for headers older than the kernel
#endif

namespace vesper {

PageWarmer::PageWarmer(std::vector<std::span<std::byte>> regions, size_t step)
    : regions_(std::move(regions)), step_(step) {
  VESPER_CHECK(step_ > 0, "PageWarmer: a step of 0 bytes");
  for (const auto& r : regions_) steps_ = std::max(steps_, (r.size() + step_ - 1) / step_);
  thread_ = std::thread([this] {
    sched_param idle{};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
    populate();
  });
}

PageWarmer::~PageWarmer() {
  stop_and_join();
}

void PageWarmer::stop_and_join() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_relaxed);
  // Back to normal priority for its last step, where the process may (root, or RLIMIT_NICE):
  // at idle priority a busy machine would keep it, and so the caller, waiting.
  sched_param normal{};
  pthread_setschedparam(thread_.native_handle(), SCHED_OTHER, &normal);
  thread_.join();
}

void PageWarmer::wait() {
  stop_and_join();
  // The rest on this thread, at its priority (the idle thread may not be raised without
  // privilege).
  stop_.store(false, std::memory_order_relaxed);
  populate();
}

void PageWarmer::populate() {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const size_t items = steps_ * regions_.size();
  for (size_t i = next_.load(std::memory_order_relaxed); i < items && !unsupported_.load();
       next_.store(++i, std::memory_order_relaxed)) {
    if (stop_.load(std::memory_order_relaxed)) return;
    const std::span<std::byte> r = regions_[i % regions_.size()];
    const size_t offset = i / regions_.size() * step_;
    if (offset >= r.size()) continue;
    const size_t end_offset = std::min(r.size(), offset + step_);
    // madvise wants a page-aligned start: round this step's range out to whole pages.
    const uintptr_t begin = reinterpret_cast<uintptr_t>(r.data() + offset) / page * page;
    const auto end = reinterpret_cast<uintptr_t>(r.data() + end_offset);
    int rc;
    do {
      rc = ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
    } while (rc != 0 && (errno == EINTR || errno == EAGAIN) && !stop_.load());
    if (rc != 0 && stop_.load()) return;
    if (rc != 0) {
      // EINVAL: a kernel without MADV_POPULATE_WRITE; ENOMEM: no memory left for the rest.
      // Either way the remaining pages fault in on first write, as without a warmer.
      unsupported_.store(true, std::memory_order_relaxed);
      return;
    }
    warmed_.fetch_add(end_offset - offset, std::memory_order_relaxed);
  }
}

}  // namespace vesper
