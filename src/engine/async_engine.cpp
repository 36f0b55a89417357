#include "engine/async_engine.h"

#include <algorithm>
#include <chrono>

#include "core/logging.h"

namespace vesper::engine {
namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine) : engine_(std::move(engine)) {
  engine_->set_output_sink([this](std::vector<RequestOutput>& outputs) {
    for (RequestOutput& out : outputs) {
      deliver(out);
      delivered_.push_back(std::move(out));
    }
  });
  stats_ = engine_->stats();
  snapshot_adapters();
  thread_ = std::thread([this] {
    loop();
    stopped_.store(true);
  });
}

AsyncEngine::~AsyncEngine() {
  shutdown(0);
}

void AsyncEngine::add_request(EngineRequest request, OutputCallback on_output,
                              ErrorCallback on_error, AcceptCallback on_accepted) {
  bool refused = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_ || draining_) {
      refused = true;
    } else {
      Command c{
          Command::kAdd,         std::move(request), std::move(on_output), std::move(on_error), {},
          std::move(on_accepted)};
      commands_.push_back(std::move(c));
      pending_.fetch_add(1);
    }
  }
  if (refused) {
    // Outside the lock: the handler may well call abort() for the request's siblings.
    if (on_error) on_error({RequestError::Kind::kShuttingDown, "the server is shutting down"});
    return;
  }
  wake_.notify_one();
}

bool AsyncEngine::accepting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !stopping_ && !draining_;
}

int64_t AsyncEngine::num_waiting() const {
  const int64_t free_seats =
      std::max<int64_t>(0, engine_->scheduler_config().max_num_seqs - running_.load());
  return std::max<int64_t>(0, pending_.load() + waiting_.load() - free_seats);
}

void AsyncEngine::abort(const std::string& request_id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Command c{Command::kAbort, EngineRequest{}, {}, {}, {}, {}};
    c.request.request_id = request_id;
    commands_.push_back(std::move(c));
  }
  wake_.notify_one();
}

void AsyncEngine::post(std::function<void(Engine&)> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    commands_.push_back(Command{Command::kTask, EngineRequest{}, {}, {}, std::move(task), {}});
  }
  wake_.notify_one();
}

std::vector<lora::AdapterRegistry::Info> AsyncEngine::adapters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return adapters_;
}

bool AsyncEngine::has_adapter(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  // The registry lists names in order.
  auto it = std::lower_bound(adapters_.begin(), adapters_.end(), name,
                             [](const auto& info, const std::string& n) { return info.name < n; });
  return it != adapters_.end() && it->name == name;
}

void AsyncEngine::snapshot_adapters() {
  std::vector<lora::AdapterRegistry::Info> list;
  if (const lora::AdapterRegistry* r = engine_->adapters()) list = r->list();
  std::lock_guard<std::mutex> lock(mutex_);
  adapters_ = std::move(list);
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
  if (cmd.kind == Command::kTask) {
    cmd.task(*engine_);
    snapshot_adapters();
    return;
  }
  const std::string id = cmd.request.request_id;
  if (cmd.kind == Command::kAbort) {
    if (engine_->abort(id)) unfinished_.fetch_sub(1);
    callbacks_.erase(id);
    return;
  }
  pending_.fetch_sub(1);
  const std::string& lora = cmd.request.lora_name;
  if (!lora.empty() && engine_->adapters() != nullptr &&
      engine_->adapters()->config().enable_lora && !engine_->adapters()->contains(lora)) {
    if (cmd.on_error)
      cmd.on_error({RequestError::Kind::kModelNotFound,
                    "The model `" + lora + "` does not exist (its adapter is not loaded)"});
    return;
  }
  auto st = engine_->add_request(std::move(cmd.request));
  if (!st) {
    if (cmd.on_error) cmd.on_error({RequestError::Kind::kInvalid, st.error().message});
    return;
  }
  unfinished_.fetch_add(1);
  callbacks_[id] = std::move(cmd.on_output);
  if (cmd.on_accepted) cmd.on_accepted();
}

void AsyncEngine::loop() {
  std::deque<Command> batch;
  for (;;) {
    bool draining = false;
    double deadline = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] {
        return stopping_ || !commands_.empty() || engine_->has_unfinished() || draining_;
      });
      batch.swap(commands_);
      if (stopping_ && batch.empty()) break;
      draining = draining_;
      deadline = drain_deadline_;
    }
    for (Command& c : batch) apply(c);
    batch.clear();
    if (draining && now_s() > deadline) abort_all_with_outputs();
    if (!engine_->has_unfinished()) {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_ = engine_->stats();
      waiting_.store(0);
      running_.store(0);
      if (draining_) stopping_ = true;
      continue;
    }
    engine_->step();  // outputs reach deliver() through the engine's sink
    // Requests whose callbacks failed are aborted here, on the engine thread.
    for (const std::string& id : failed_callbacks_) engine_->abort(id);
    failed_callbacks_.clear();
    const EngineStats st = engine_->stats();
    std::function<void(const std::vector<RequestOutput>&, const EngineStats&)> observer;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stats_ = st;
      observer = observer_;
    }
    waiting_.store(st.num_waiting);
    running_.store(st.num_running);
    if (observer) observer(delivered_, st);
    delivered_.clear();
  }
}

void AsyncEngine::deliver(const RequestOutput& out) {
  auto it = callbacks_.find(out.request_id);
  if (it == callbacks_.end()) return;
  bool failed = false;
  try {
    it->second(out);
  } catch (const std::exception& e) {
    log_error("request %s: output callback failed: %s; request aborted", out.request_id.c_str(),
              e.what());
    failed = true;
  } catch (...) {
    log_error("request %s: output callback failed; request aborted", out.request_id.c_str());
    failed = true;
  }
  if (out.finished || failed) {
    if (!out.finished) failed_callbacks_.push_back(out.request_id);
    callbacks_.erase(out.request_id);
    unfinished_.fetch_sub(1);
  }
}

void AsyncEngine::abort_all_with_outputs() {
  std::vector<std::string> ids;
  for (const auto& [id, cb] : callbacks_) ids.push_back(id);
  for (const auto& id : ids) {
    // Requests the engine no longer holds finished at admission (max_tokens 0): the next step
    // reports them.
    RequestOutput last;
    if (engine_->abort(id, &last)) deliver(last);  // finished: deliver unregisters it
  }
}

void AsyncEngine::begin_shutdown(double timeout_s) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // (stopped_, not thread_.joinable(): another thread may be joining thread_ meanwhile, as
    // when a parallel job's abort handler calls this during a shutdown)
    if (stopped_.load()) return;
    if (timeout_s <= 0) {
      stopping_ = true;
    } else if (!draining_) {
      draining_ = true;
      drain_deadline_ = now_s() + timeout_s;
    }
  }
  wake_.notify_one();
}

void AsyncEngine::shutdown(double timeout_s) {
  begin_shutdown(timeout_s);
  if (thread_.joinable()) thread_.join();
}

}  // namespace vesper::engine
