// Engine: the continuous-batching inference engine (vLLM's LLMEngine). Requests come in with
// add_request(); each step() schedules one iteration (a self-contained plan: decodes and prefill
// chunks of many requests), has the ModelRunner run it (one forward pass, sampling, proposals for
// the next step), hands what the runner returned to the scheduler, and turns the step's tokens
// into outputs. abort() removes a request in any state and frees its blocks at once.
//
// The engine keeps the requests, the loop and the outputs to clients: it names no proposer and
// samples nothing (the runner does both). With asynchronous output processing (on by default,
// EngineConfig::async_output) a step's detokenization, stop strings and outputs run on the output
// thread (engine/job_thread.h) while the next step computes: step() then returns the outputs
// of the step before, and a sequence a stop string ended has computed more (the next step's
// token; with async scheduling the next two plans'; with multi-step a plan's passes), which is
// discarded (nothing of it reaches a client, the prefix cache or the statistics).
//
// Single-threaded API: the caller owns the loop (AsyncEngine wraps it in a thread for the server).
// Greedy output is identical however requests were batched, chunked, preempted, swapped,
// speculated or served from the prefix cache, with output processing on the engine's thread or
// its own: the forward pass is batch-invariant and every sequence has its own random state.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "engine/engine_config.h"
#include "engine/engine_request.h"
#include "engine/job_thread.h"
#include "engine/memory_plan.h"
#include "engine/model_runner.h"
#include "engine/output_processor.h"
#include "engine/request_output.h"
#include "engine/step_phases.h"
#include "kv/kv_cache_manager.h"
#include "lora/adapter_registry.h"
#include "model/model.h"
#include "sched/adapter_binder.h"
#include "sched/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace vesper::engine {

struct EngineStats {
  int64_t num_running = 0;  // sequences
  int64_t num_waiting = 0;
  int64_t num_swapped = 0;
  int64_t num_requests = 0;  // unfinished requests
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_used = 0;
  int64_t swap_blocks_used = 0;
  int64_t num_preemptions = 0;
  int64_t num_swap_outs = 0;
  int64_t num_recomputes = 0;
  int64_t kivi_groups_quantized = 0;    // KIVI groups stored quantized so far
  int64_t prompt_tokens = 0;            // prompt tokens of all requests added
  int64_t prefill_tokens_computed = 0;  // tokens computed while prefilling (recomputation included)
  int64_t generation_tokens = 0;        // tokens sampled and kept
  int64_t num_steps = 0;
  int64_t num_passes = 0;  // forward passes (a multi-step plan runs several)
  int64_t max_batched_tokens_seen = 0;
  int64_t num_chunked_prefill_steps = 0;  // steps that computed part of a prompt but not its end
  // Prefix cache: tokens looked up and found at admission (vLLM's prefix_cache_queries/hits),
  // blocks indexed (in use or evictable), unreferenced cached blocks, and evictions so far.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t kv_blocks_cached = 0;
  int64_t kv_blocks_evictable = 0;
  int64_t prefix_cache_evictions = 0;
  // Speculative decoding (vLLM V1's spec_decode_* counters): verifications run (one sequence's
  // proposals checked in a step), tokens proposed and verified, tokens accepted, and accepted by
  // position among the proposals.
  int64_t spec_num_drafts = 0;
  int64_t spec_num_draft_tokens = 0;
  int64_t spec_num_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_pos;
  // Adapters (vLLM's lora_requests_info): whether they are enabled, --max-loras, the names
  // running and waiting sequences use (sorted, each once), and adapter files read so far.
  bool lora_enabled = false;
  int64_t max_loras = 0;
  std::vector<std::string> running_adapters;
  std::vector<std::string> waiting_adapters;
  int64_t adapter_loads = 0;
  // Structured output: grammar masks computed ahead of their step, off the step loop
  // (EngineConfig::prefetch_grammar_masks).
  int64_t grammar_masks_prefetched = 0;
  // Seconds per step phase (engine/step_phases.h): summed over every step that computed
  // something, and those of the last such step (num_steps counts them). With asynchronous output
  // processing, "output" is the output thread's work that ran during the step.
  StepPhaseTimes phase_seconds;
  StepPhaseTimes last_step_phase_seconds;

  double kv_usage() const {
    return kv_blocks_total ? static_cast<double>(kv_blocks_used) / kv_blocks_total : 0;
  }
};

class Engine {
 public:
  // Loads the model and tokenizer, plans memory and allocates the KV cache. Errors name the
  // file or flag at fault.
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config);
  ~Engine();

  const model::ModelConfig& model_config() const { return model_->config(); }
  const model::Model& model() const { return *model_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const MemoryPlan& memory_plan() const { return plan_; }
  const sched::SchedulerConfig& scheduler_config() const { return scheduler_->config(); }
  const EngineConfig& config() const { return config_; }

  // Blocks until the KV cache is resident: it is made so in the background from the start
  // (backend.h's create_kv), and a benchmark waits here so as not to time first touches, as
  // llama-bench does not (llama.cpp clears its whole KV buffer when it creates a context).
  void wait_kv_resident() { model_->backend().wait_kv_resident(); }

  // Queues a request. Errors (nothing queued) for invalid sampling parameters, a duplicate id,
  // an empty prompt, token ids outside the vocabulary, or a request that can never fit.
  Status add_request(EngineRequest request);

  // Runs one iteration and returns the outputs made since the last call (with asynchronous output
  // processing or async scheduling, those of earlier iterations): the requests that changed.
  std::vector<RequestOutput> step();

  // Where outputs go instead of step()'s result: each batch of outputs is handed to `sink` as soon
  // as it is made, on the thread that made it (the output thread with asynchronous output
  // processing). Set before the first step.
  using OutputSink = std::function<void(std::vector<RequestOutput>&)>;
  void set_output_sink(OutputSink sink) { sink_ = std::move(sink); }

  // Removes a request in any state; its blocks are free on return. False for an unknown id.
  // With `final_output`, also reports the request's last output there: what it generated since
  // its previous output, every sample that had not finished with finish_reason "abort", and
  // finished == true (what a client still streaming it must be told).
  bool abort(const std::string& request_id, RequestOutput* final_output = nullptr);

  // Requests queued, running, or finished and not yet reported by step() (or the sink).
  bool has_unfinished() const;

  // Where a request's first sequence is: for tests and debugging.
  enum class Phase { kUnknown, kWaiting, kPrefilling, kDecoding, kSwapped };
  Phase phase(const std::string& request_id) const;
  EngineStats stats() const;

  // Adapters (null unless --enable-lora or --lora): names, loads and unloads go through here,
  // on the engine's thread.
  lora::AdapterRegistry* adapters() { return adapters_.get(); }
  const lora::AdapterRegistry* adapters() const { return adapters_.get(); }

  // For tests: checks the scheduler's and KV manager's invariants (aborts when broken).
  void check_invariants() const;
  const sched::Scheduler& scheduler() const { return *scheduler_; }

 private:
  Engine() = default;
  // Fills params.bad_words_token_ids from params.bad_words.
  void tokenize_bad_words(sample::SamplingParams& params) const;
  // A sequence leaves the scheduler (finished, aborted): its adapter registration goes too.
  // `num_valid_tokens`: as Scheduler::remove.
  void remove_sequence(sched::SeqId id, int64_t num_valid_tokens = -1);
  // One step with the runner on this thread, and with the runner a step behind on its own. On a
  // pipeline's leader step_ahead keeps a plan in flight a stage (pipeline_depth_), of the
  // scheduler's virtual engines in turn: each job on the runner thread launches the newest plan
  // and finishes the oldest, so every stage computes one plan while the others compute theirs.
  std::vector<RequestOutput> step_in_order();
  std::vector<RequestOutput> step_ahead();
  // What a new plan means for the requests: failed admissions aborted, forks, preemptions and
  // first steps recorded, statistics.
  void record_plan(const sched::SchedulerOutput& plan, double scheduled_at);
  // What the runner returned for `plan`: speculation's statistics, and the scheduler updated.
  void apply_output(const sched::SchedulerOutput& plan, const sched::ModelRunnerOutput& output);
  // The step's tokens wait for output processing: now, or on the output thread next step.
  void hold_outputs(sched::ModelRunnerOutput& output, PhaseClock& clock);
  // A step's parts shared by both loops: the runner's result taken (its phases and passes), the
  // output job taken back (run here when it did not overlap the step), and the step's end (its
  // tokens held for output processing, or the outputs made otherwise delivered).
  void take_runner_result(const Status& ran, StepPhaseTimes& phases);
  void take_output_job(bool overlapped, StepPhaseTimes& phases, PhaseClock& clock);
  void end_step(bool computed, bool overlapped, StepPhaseTimes& phases, PhaseClock& clock);
  // Whether this engine plans ahead (async scheduling), as EngineConfig::async_scheduling decided.
  bool plans_ahead() const { return runner_thread_ != nullptr; }
  // Output processing of the pending step (the last one run): on the calling thread, or launched
  // on the output thread; finish_output_work() takes the result back (sequences a stop string
  // ended leave the scheduler).
  void process_pending_outputs();
  // The pending step's tokens alone (an abort's final output then includes them).
  void process_pending_tokens();
  void launch_output_work();
  void finish_output_work();
  void deliver(std::vector<RequestOutput> outputs);

  EngineConfig config_;
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<lora::AdapterRegistry> adapters_;  // with adapters
  std::unique_ptr<sched::AdapterBinder> adapter_binder_;
  std::optional<tokenizer::Tokenizer> tokenizer_;
  MemoryPlan plan_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<sched::Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<OutputProcessor> outputs_;
  std::unique_ptr<JobThread> output_thread_;  // with asynchronous output processing
  std::unique_ptr<JobThread> runner_thread_;  // with async scheduling
  OutputSink sink_;

  sched::SeqId next_seq_id_ = 1;
  int64_t next_arrival_ = 0;
  std::mt19937_64 seeds_{std::random_device{}()};  // for requests without a seed
  EngineStats totals_;
  sched::ModelRunnerOutput step_output_;     // what the runner returned for the step at hand
  sched::ModelRunnerOutput pending_output_;  // the last step's, until its outputs are processed
  // Async scheduling: the plans the runner thread computes or holds (oldest first, at most
  // pipeline_depth_: a pipeline's stages where its plans are launched and finished apart, else 1),
  // and what it writes.
  std::deque<sched::SchedulerOutput> in_flight_plans_;
  bool in_flight_ = false;
  int pipeline_depth_ = 1;
  bool last_step_computed_ = false;  // the last step ran a plan (end_step)
  sched::ModelRunnerOutput runner_output_;
  Status runner_status_;
  bool outputs_pending_ = false;
  double step_sampled_at_ = 0;
  // Results of an output job (the output thread's until finish_output_work).
  std::vector<OutputProcessor::TextFinish> text_finishes_;
  int64_t job_tokens_ = 0;
  double job_seconds_ = 0;
  std::vector<RequestOutput> ready_;  // outputs made, for step() to return (no sink)
};

}  // namespace vesper::engine
