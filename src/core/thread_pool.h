// ThreadPool: a fixed set of compute threads shared by all kernels. Threads are created once
// (never per op); the calling thread takes part in every job as worker 0.
//
// run(fn) calls fn(thread_index, num_threads) on every thread and returns when all are done.
// Workers spin briefly after a job before sleeping, so back-to-back ops (one per layer) do not
// pay a wake-up each. Not reentrant: one job at a time, issued from one thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace vesper {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(thread_index, num_threads) on each of the pool's threads; blocks until all finish.
  void run(const std::function<void(int, int)>& fn);

  // Splits [0, n) into contiguous chunks, one per thread, and calls fn(begin, end) for each
  // non-empty chunk. The split depends only on n and the thread count.
  void parallel_for(size_t n, const std::function<void(size_t, size_t)>& fn);

  // The number of hardware threads, at least 1.
  static int hardware_threads();

 private:
  void worker_loop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
};

}  // namespace vesper
