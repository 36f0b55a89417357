// AsyncEngine: runs an Engine on its own thread so that I/O threads never block on it. Requests
// and aborts go in through a thread-safe queue; each request's outputs come back through its
// callback, called on the engine thread, or on the engine's output thread with asynchronous
// output processing (callbacks must be quick and must not block: the server posts them to the
// connection's executor). Callbacks never run concurrently with each other or with the engine
// thread's handling of requests: the output thread works only while a step computes.
//
// Admission control: num_waiting() counts requests that will have to wait for a sequence slot,
// so the server can refuse work (HTTP 503) beyond a bound instead of letting latency grow
// without limit.
//
// Locking: no callback is ever called with the queue's lock held, so a callback may call back
// into the AsyncEngine (an error handler that aborts its other requests, say).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"

namespace vesper::engine {

class AsyncEngine {
 public:
  // Called with each output of the request (the last one has finished == true).
  using OutputCallback = std::function<void(const RequestOutput&)>;
  // Why a request was refused: invalid for the engine (a client error), or the engine is shutting
  // down (retry elsewhere).
  struct RequestError {
    // kModelNotFound: the adapter the request names is not registered (unloaded since the
    // server looked): a 404 like any unknown model.
    enum class Kind { kInvalid, kShuttingDown, kModelNotFound } kind = Kind::kInvalid;
    std::string message;
  };
  // Called once if the request is refused: at once (shutting down), or when it reaches the
  // engine thread (invalid).
  using ErrorCallback = std::function<void(const RequestError& error)>;

  explicit AsyncEngine(std::unique_ptr<Engine> engine);
  ~AsyncEngine();
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  // Called once, on the engine thread, when the engine took the request (before its outputs).
  using AcceptCallback = std::function<void()>;

  // Thread-safe. The request is added on the engine thread before its next step.
  void add_request(EngineRequest request, OutputCallback on_output, ErrorCallback on_error,
                   AcceptCallback on_accepted = {});
  // Thread-safe. Removes the request (if still there) before the next step; its blocks are free
  // after that step. No further callbacks are made for it once the abort is processed.
  void abort(const std::string& request_id);

  // Thread-safe. Runs `task` on the engine thread, in order with requests and aborts, before the
  // next step (what must not race with a step: adapter loads and unloads). It must not block.
  void post(std::function<void(Engine&)> task);
  // The adapters registered, as of the last step or posted task (empty without adapters).
  std::vector<lora::AdapterRegistry::Info> adapters() const;
  // Whether `name` is among them (per request: no copy of the list).
  bool has_adapter(const std::string& name) const;

  // Requests submitted that will wait for a sequence slot: those queued here or waiting in the
  // scheduler, less the slots (--max-num-seqs) free at the last step. Requests the engine thread
  // has not picked up yet are not waiting in this sense when slots are free for them: under a
  // burst they would otherwise count against --max-num-waiting while the engine is busy with a
  // step, and be refused with most slots empty.
  int64_t num_waiting() const;
  // False once shutdown() began: add_request() refuses new work.
  bool accepting() const;
  // Requests accepted and not finished.
  int64_t num_unfinished() const { return unfinished_.load(); }

  // A snapshot of the engine's statistics, refreshed after every step.
  EngineStats stats() const;

  // The engine's immutable facts (safe from any thread).
  const tokenizer::Tokenizer& tokenizer() const { return engine_->tokenizer(); }
  const model::ModelConfig& model_config() const { return engine_->model_config(); }
  const sched::SchedulerConfig& scheduler_config() const { return engine_->scheduler_config(); }
  const MemoryPlan& memory_plan() const { return engine_->memory_plan(); }
  // The adapter settings (allowed directories resolved), or null without adapters.
  const lora::LoraConfig* lora_config() const {
    return engine_->adapters() != nullptr ? &engine_->adapters()->config() : nullptr;
  }

  // Stops taking requests, lets in-flight requests finish for up to `timeout_s` seconds, then
  // aborts the rest, each getting a last output (finish_reason "abort", finished), and stops
  // the thread.
  void shutdown(double timeout_s);
  // shutdown()'s first half, which does not wait: from its return on, accepting() is false and
  // add_request() refuses new work; in-flight requests drain for up to `timeout_s` seconds (0:
  // abort them now). A later shutdown() with a timeout keeps the drain's deadline and waits.
  void begin_shutdown(double timeout_s);
  // Whether the engine thread has ended (after a shutdown: drained, or its deadline passed).
  bool stopped() const { return stopped_.load(); }

  // Hooks for metrics: called on the engine thread after every step with the finished outputs.
  void set_step_observer(
      std::function<void(const std::vector<RequestOutput>&, const EngineStats&)> observer);

 private:
  struct Command {
    enum Kind { kAdd, kAbort, kTask } kind;
    EngineRequest request;  // kAbort: only request_id
    OutputCallback on_output;
    ErrorCallback on_error;
    std::function<void(Engine&)> task;  // kTask
    AcceptCallback on_accepted;
  };
  void snapshot_adapters();

  void loop();
  void apply(Command& cmd);
  // Delivers one output to its request's callback; a callback that throws has its request
  // aborted (logged, after the step), and the engine goes on with the others.
  void deliver(const RequestOutput& out);
  // Aborts every request still in the engine, telling each client (the shutdown deadline).
  void abort_all_with_outputs();

  std::unique_ptr<Engine> engine_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Command> commands_;
  bool stopping_ = false;
  bool draining_ = false;
  double drain_deadline_ = 0;
  // The engine thread's, and the output thread's while a step computes.
  std::unordered_map<std::string, OutputCallback> callbacks_;
  std::vector<std::string> failed_callbacks_;  // requests to abort after the step
  std::vector<RequestOutput> delivered_;       // the step's outputs, for the observer
  std::function<void(const std::vector<RequestOutput>&, const EngineStats&)> observer_;
  EngineStats stats_;                                  // under mutex_
  std::vector<lora::AdapterRegistry::Info> adapters_;  // under mutex_
  std::atomic<int64_t> pending_{0};
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> waiting_{0};
  std::atomic<int64_t> running_{0};
  std::atomic<int64_t> unfinished_{0};
  std::thread thread_;
};

}  // namespace vesper::engine
