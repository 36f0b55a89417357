#include "lora/adapter_read.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace vesper::lora {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

struct AdapterRead::Shared {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  bool recognized = false;
  Result<HostAdapter> result = make_error("not read yet");
};

AdapterRead::AdapterRead(const std::string& path, const model::ModelConfig& config,
                         int64_t max_rank)
    : shared_(std::make_shared<Shared>()), started_(now_seconds()) {
  std::thread([shared = shared_, path, config, max_rank] {
    bool recognized = false;
    Result<HostAdapter> result = read_adapter(path, config, max_rank, 1.0f, &recognized);
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->result = std::move(result);
    shared->recognized = recognized;
    shared->done = true;
    shared->done_cv.notify_all();
  }).detach();
}

bool AdapterRead::done() const {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->done;
}

bool AdapterRead::wait_for(double seconds) const {
  std::unique_lock<std::mutex> lock(shared_->mutex);
  return shared_->done_cv.wait_for(lock, std::chrono::duration<double>(seconds),
                                   [&] { return shared_->done; });
}

double AdapterRead::elapsed() const {
  return now_seconds() - started_;
}

Result<HostAdapter> AdapterRead::take(bool* recognized) {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  if (recognized != nullptr) *recognized = shared_->recognized;
  return std::move(shared_->result);
}

}  // namespace vesper::lora
