// JobThread: a thread that runs one job at a time for the engine, which goes on meanwhile: the
// output thread (asynchronous output processing: detokenizing and stop-matching a step's tokens,
// building and delivering the outputs while the next step computes) and the runner thread (async
// scheduling: the runner computes a step while the engine plans the next). launch() and wait() are
// the only synchronization: everything the job touches belongs to the job's thread from launch()
// until wait() returns, and to the engine thread otherwise.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace vesper::engine {

class JobThread {
 public:
  JobThread();
  ~JobThread();
  JobThread(const JobThread&) = delete;
  JobThread& operator=(const JobThread&) = delete;

  // Runs `job` on the output thread. At most one job at a time: the previous one must have been
  // waited for.
  void launch(std::function<void()> job);
  // Returns once the launched job (if any) has run.
  void wait();
  bool busy() const { return busy_; }  // launched and not yet waited for (engine thread only)

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::function<void()> job_;
  bool has_job_ = false;
  bool finished_ = false;
  bool stop_ = false;
  bool busy_ = false;
  std::thread thread_;
};

}  // namespace vesper::engine
