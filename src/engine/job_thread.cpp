#include "engine/job_thread.h"

#include "core/check.h"

namespace vesper::engine {

JobThread::JobThread() : thread_([this] { loop(); }) {}

JobThread::~JobThread() {
  wait();
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void JobThread::launch(std::function<void()> job) {
  VESPER_CHECK(!busy_, "a job was launched before the previous one was waited for");
  {
    std::lock_guard lock(mutex_);
    job_ = std::move(job);
    has_job_ = true;
    finished_ = false;
  }
  busy_ = true;
  wake_.notify_one();
}

void JobThread::wait() {
  if (!busy_) return;
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return finished_; });
  busy_ = false;
}

void JobThread::loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return has_job_ || stop_; });
    if (has_job_) {
      std::function<void()> job = std::move(job_);
      has_job_ = false;
      lock.unlock();
      job();
      lock.lock();
      finished_ = true;
      done_.notify_one();
      continue;
    }
    if (stop_) return;
  }
}

}  // namespace vesper::engine
