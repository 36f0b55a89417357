#include "core/thread_pool.h"

#include <algorithm>

#include "core/check.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define VESPER_CPU_RELAX() _mm_pause()
#else
#define VESPER_CPU_RELAX() ((void)0)
#endif

namespace vesper {
namespace {
// Spin iterations before a worker sleeps on the condition variable.
constexpr int kSpinIterations = 4000;

// Waits until done() holds: spinning briefly, then yielding, so that an oversubscribed machine
// still lets the threads waited on run.
template <class Done>
void spin_until(const Done& done) {
  for (int spin = 0; !done(); ++spin) {
    if (spin < kSpinIterations)
      VESPER_CPU_RELAX();
    else
      std::this_thread::yield();
  }
}
}  // namespace

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(std::max(1, num_threads)), shares_(static_cast<size_t>(num_threads_)) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::hardware_threads() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (num_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(num_threads_ - 1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  fn(0, num_threads_);
  // Workers usually finish together.
  spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; });
  job_ = nullptr;
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  run([&](int index, int count) {
    size_t chunk = (n + count - 1) / count;
    size_t begin = std::min(n, chunk * index);
    size_t end = std::min(n, begin + chunk);
    if (begin < end) fn(begin, end);
  });
}

void ThreadPool::for_each_piece(int64_t n_pieces, const std::function<void(int64_t)>& fn) {
  if (n_pieces <= 0) return;
  if (num_threads_ == 1 || n_pieces == 1) {
    for (int64_t p = 0; p < n_pieces; ++p) fn(p);
    return;
  }
  deal_shares(n_pieces);
  // run() publishes the shares to the workers (its generation store releases them).
  run([this, &fn](int index, int count) { take_pieces(index, count, fn); });
}

void ThreadPool::for_each_piece(int64_t n_first, const std::function<void(int64_t)>& first,
                                int64_t n_pieces, const std::function<void(int64_t)>& fn) {
  if (n_first <= 0) return for_each_piece(n_pieces, fn);
  if (num_threads_ == 1 || (n_first == 1 && n_pieces <= 1)) {
    for (int64_t i = 0; i < n_first; ++i) first(i);
    for (int64_t p = 0; p < n_pieces; ++p) fn(p);
    return;
  }
  deal_shares(std::max<int64_t>(n_pieces, 0));
  first_next_.store(0, std::memory_order_relaxed);
  first_done_.store(0, std::memory_order_relaxed);
  run([this, n_first, &first, &fn](int index, int count) {
    for (int64_t i = first_next_.fetch_add(1, std::memory_order_relaxed); i < n_first;
         i = first_next_.fetch_add(1, std::memory_order_relaxed)) {
      first(i);
      first_done_.fetch_add(1, std::memory_order_release);
    }
    // The acquire load that reads n_first synchronizes with every call's release.
    spin_until([this, n_first] { return first_done_.load(std::memory_order_acquire) >= n_first; });
    take_pieces(index, count, fn);
  });
}

void ThreadPool::deal_shares(int64_t n_pieces) {
  const int64_t n = num_threads_;
  for (int64_t t = 0; t < n; ++t) {
    shares_[static_cast<size_t>(t)].next.store(n_pieces * t / n, std::memory_order_relaxed);
    shares_[static_cast<size_t>(t)].end = n_pieces * (t + 1) / n;
  }
}

void ThreadPool::take_pieces(int index, int count, const std::function<void(int64_t)>& fn) {
  for (int k = 0; k < count; ++k) {
    Share& share = shares_[static_cast<size_t>((index + k) % count)];
    for (int64_t p = share.next.fetch_add(1, std::memory_order_relaxed); p < share.end;
         p = share.next.fetch_add(1, std::memory_order_relaxed))
      fn(p);
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
      if (spin < kSpinIterations / 2)
        VESPER_CPU_RELAX();
      else
        std::this_thread::yield();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    (*job_)(index, num_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace vesper
