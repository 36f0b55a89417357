#include "engine/async_engine.h"

#include <chrono>

namespace vesper::engine {
namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {
  stats_ = engine_->stats();
  thread_ = std::thread([this] { loop(); });
}

AsyncEngine::~AsyncEngine() { shutdown(0); }

void AsyncEngine::add_request(std::string request_id, std::vector<int32_t> prompt, sample::SamplingParams params,
                              int32_t priority, OutputCallback on_output, ErrorCallback on_error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || draining_) {
      if (on_error) on_error("the server is shutting down");
      return;
    }
    Command c{Command::kAdd, std::move(request_id), std::move(prompt), std::move(params), priority,
              std::move(on_output), std::move(on_error)};
    commands_.push_back(std::move(c));
    pending_.fetch_add(1);
  }
  wake_.notify_one();
}

void AsyncEngine::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Command c{Command::kAbort, request_id, {}, {}, 0, {}, {}};
    commands_.push_back(std::move(c));
  }
  wake_.notify_one();
}

EngineStats AsyncEngine::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void AsyncEngine::set_step_observer(
    std::function<void(const std::vector<RequestOutput>&, const EngineStats&)> observer) {
  std::lock_guard<std::mutex> lock(mutex_);
  observer_ = std::move(observer);
}

void AsyncEngine::apply(Command& cmd) {
  if (cmd.kind == Command::kAbort) {
    if (engine_->abort(cmd.request_id)) unfinished_.fetch_sub(1);
    callbacks_.erase(cmd.request_id);
    return;
  }
  pending_.fetch_sub(1);
  auto st = engine_->add_request(cmd.request_id, std::move(cmd.prompt), cmd.params, cmd.priority);
  if (!st) {
    if (cmd.on_error) cmd.on_error(st.error().message);
    return;
  }
  unfinished_.fetch_add(1);
  callbacks_[cmd.request_id] = std::move(cmd.on_output);
}

void AsyncEngine::loop() {
  std::deque<Command> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !commands_.empty() || engine_->has_unfinished() || draining_; });
      batch.swap(commands_);
      if (stopping_ && batch.empty()) break;
    }
    for (Command& c : batch) apply(c);
    batch.clear();
    if (draining_ && now_s() > drain_deadline_) {
      // Out of time: abort what is left.
      std::vector<std::string> ids;
      for (const auto& [id, cb] : callbacks_) ids.push_back(id);
      for (const auto& id : ids) {
        if (engine_->abort(id)) unfinished_.fetch_sub(1);
        callbacks_.erase(id);
      }
    }
    if (!engine_->has_unfinished()) {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_ = engine_->stats();
      waiting_.store(0);
      if (draining_) stopping_ = true;
      continue;
    }
    std::vector<RequestOutput> outputs = engine_->step();
    const EngineStats st = engine_->stats();
    std::function<void(const std::vector<RequestOutput>&, const EngineStats&)> observer;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_ = st;
      observer = observer_;
    }
    waiting_.store(st.num_waiting);
    for (const RequestOutput& out : outputs) {
      auto it = callbacks_.find(out.request_id);
      if (it == callbacks_.end()) continue;
      it->second(out);
      if (out.finished) {
        callbacks_.erase(it);
        unfinished_.fetch_sub(1);
      }
    }
    if (observer) observer(outputs, st);
  }
}

void AsyncEngine::shutdown(double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) return;
    if (timeout_s > 0 && !draining_) {
      draining_ = true;
      drain_deadline_ = now_s() + timeout_s;
    } else {
      stopping_ = true;
    }
  }
  wake_.notify_one();
  thread_.join();
}

}  // namespace vesper::engine
