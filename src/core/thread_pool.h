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
#include <cstdint>
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

  // Calls fn(piece) once for each piece of [0, n_pieces), on the pool's threads. Thread t of T
  // first takes the pieces of its own share, [t * n / T, (t + 1) * n / T), one at a time from the
  // front (a counter only it touches until its share runs low), then the pieces still left in the
  // other threads' shares. So the work is split as parallel_for splits it while the threads keep
  // pace, and a thread that starts late or is descheduled on a shared machine leaves the rest of
  // its share to the others instead of holding all of them at the end of the job. Which thread
  // runs a piece varies from call to call: fn must compute each piece the same way on any thread.
  void for_each_piece(int64_t n_pieces, const std::function<void(int64_t)>& fn);
  // for_each_piece with a first phase in the same job: calls first(i) once for each i of
  // [0, n_first), the threads claiming them one at a time as they come, then deals the pieces
  // as above once every first(i) has returned (fn may read what any of them wrote). A thread
  // that starts late finds the first phase done by the others: it waits only for calls already
  // running. One pool job costs less than the first phase on the calling thread alone (the
  // other threads idle) and then the pieces, or than two jobs.
  void for_each_piece(int64_t n_first, const std::function<void(int64_t)>& first, int64_t n_pieces,
                      const std::function<void(int64_t)>& fn);

  // The number of hardware threads, at least 1.
  static int hardware_threads();

 private:
  void worker_loop(int index);
  // for_each_piece's parts: each thread's share of [0, n_pieces) (before the job), and thread
  // `index`'s run through its own share, then the others' (in the job).
  void deal_shares(int64_t n_pieces);
  void take_pieces(int index, int count, const std::function<void(int64_t)>& fn);

  // One thread's share in for_each_piece: the next piece to claim and the end of the share, on a
  // cache line of its own so that claims from one's own share do not contend.
  struct alignas(64) Share {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };

  int num_threads_;
  std::vector<Share> shares_;  // for_each_piece's, one per thread (one job runs at a time)
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  // for_each_piece's first phase: the next call to claim and the calls done, each on a cache line
  // of its own (away from the job's fields, which the workers read as it starts; the class is
  // padded to whole lines after it).
  alignas(64) std::atomic<int64_t> first_next_{0};
  alignas(64) std::atomic<int64_t> first_done_{0};
};

}  // namespace vesper
