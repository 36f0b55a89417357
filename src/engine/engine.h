// Engine: the continuous-batching inference engine (vLLM's LLMEngine). Requests come in with
// add_request(); each step() schedules one iteration (decodes and prefill chunks of many requests
// in one forward pass), samples, processes outputs and reports what changed. abort() removes a
// request in any state and frees its blocks at once.
//
// Single-threaded: the caller owns the loop (AsyncEngine wraps it in a thread for the server).
// Greedy output is identical however requests were batched, chunked, preempted or swapped: the
// forward pass is batch-invariant and every sequence has its own sampler state.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/result.h"
#include "core/thread_pool.h"
#include "engine/engine_config.h"
#include "engine/memory_plan.h"
#include "engine/model_runner.h"
#include "engine/request_output.h"
#include "engine/sequence_output.h"
#include "kv/kv_cache_manager.h"
#include "model/model.h"
#include "sample/logprobs.h"
#include "sample/sampler.h"
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
  int64_t prompt_tokens = 0;            // prompt tokens of all requests added
  int64_t prefill_tokens_computed = 0;  // tokens computed while prefilling (recomputation included)
  int64_t generation_tokens = 0;        // tokens sampled
  int64_t num_steps = 0;
  int64_t max_batched_tokens_seen = 0;
  int64_t num_chunked_prefill_steps = 0;  // steps that computed part of a prompt but not its end
  // Prefix cache: tokens looked up and found at admission (vLLM's prefix_cache_queries/hits),
  // blocks indexed (in use or evictable), unreferenced cached blocks, and evictions so far.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  int64_t kv_blocks_cached = 0;
  int64_t kv_blocks_evictable = 0;
  int64_t prefix_cache_evictions = 0;

  double kv_usage() const {
    return kv_blocks_total ? static_cast<double>(kv_blocks_used) / kv_blocks_total : 0;
  }
};

class Engine {
 public:
  // Loads the model and tokenizer, plans memory and allocates the KV cache. Errors name the
  // file or flag at fault.
  static Result<std::unique_ptr<Engine>> create(const EngineConfig& config);

  const model::ModelConfig& model_config() const { return model_->config(); }
  const model::Model& model() const { return *model_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const MemoryPlan& memory_plan() const { return plan_; }
  const sched::SchedulerConfig& scheduler_config() const { return scheduler_->config(); }

  // Queues a request. Errors (nothing queued) for invalid sampling parameters, a duplicate id,
  // an empty prompt, token ids outside the vocabulary, or a request that can never fit.
  Status add_request(const std::string& request_id, std::vector<int32_t> prompt_token_ids,
                     const sample::SamplingParams& params, int32_t priority = 0);

  // Runs one iteration and returns the outputs of the requests that changed.
  std::vector<RequestOutput> step();

  // Removes a request in any state; its blocks are free on return. False for an unknown id.
  // With `final_output`, also reports the request's last output there: what it generated since
  // its previous output, every sample that had not finished with finish_reason "abort", and
  // finished == true (what a client still streaming it must be told).
  bool abort(const std::string& request_id, RequestOutput* final_output = nullptr);

  // Requests queued, running, or finished at admission and not yet reported by step().
  bool has_unfinished() const { return !requests_.empty() || !finished_early_.empty(); }

  // Where a request's first sequence is: for tests and debugging.
  enum class Phase { kUnknown, kWaiting, kPrefilling, kDecoding, kSwapped };
  Phase phase(const std::string& request_id) const;
  EngineStats stats() const;

  // For tests: checks the scheduler's and KV manager's invariants (aborts when broken).
  void check_invariants() const;
  const sched::Scheduler& scheduler() const { return *scheduler_; }

 private:
  struct SequenceState {
    sched::SeqId seq_id = 0;
    std::unique_ptr<sample::Sampler> sampler;
    std::unique_ptr<SequenceOutput> output;
  };
  struct RequestState {
    std::string id;
    std::vector<int32_t> prompt;
    sample::SamplingParams params;
    int32_t priority = 0;
    std::vector<SequenceState> seqs;  // seqs[0] from the start; the others once forked
    RequestMetrics metrics;
    int64_t num_cached_tokens = 0;
    bool updated = false;
  };

  Engine() = default;
  void sample_sequence(RequestState& req, SequenceState& s, const float* logits, bool first_sample);
  void finish_sequence_if_done(RequestState& req, SequenceState& s);
  RequestOutput make_output(RequestState& req);
  sample::SamplingParams child_params(const sample::SamplingParams& params, int32_t index) const;

  EngineConfig config_;
  std::unique_ptr<model::Model> model_;
  std::optional<tokenizer::Tokenizer> tokenizer_;
  MemoryPlan plan_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<sched::Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;

  std::map<std::string, std::unique_ptr<RequestState>> requests_;
  std::map<sched::SeqId, std::pair<RequestState*, int32_t>> seq_owner_;  // seq -> (request, index)
  sched::SeqId next_seq_id_ = 1;
  int64_t next_arrival_ = 0;
  EngineStats totals_;
  std::vector<float> scratch_logits_;
  sample::LogprobScratch logprob_scratch_;
  std::vector<RequestOutput> finished_early_;  // requests done at admission (max_tokens == 0)
};

}  // namespace vesper::engine
