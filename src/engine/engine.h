// Engine: the continuous-batching inference engine (vLLM's LLMEngine). Requests come in with
// add_request(); each step() schedules one iteration (a self-contained plan: decodes and prefill
// chunks of many requests), has the ModelRunner run it as one forward pass on the backend,
// samples every sequence that reached its end with one batched sampler, reports the tokens to
// the scheduler and the OutputProcessor, and returns what changed. abort() removes a request in
// any state and frees its blocks at once.
//
// Single-threaded: the caller owns the loop (AsyncEngine wraps it in a thread for the server).
// Greedy output is identical however requests were batched, chunked, preempted or swapped: the
// forward pass is batch-invariant and every sequence has its own random state.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "engine/engine_config.h"
#include "engine/engine_request.h"
#include "engine/memory_plan.h"
#include "engine/model_runner.h"
#include "engine/output_processor.h"
#include "engine/request_output.h"
#include "engine/speculation_policy.h"
#include "engine/step_phases.h"
#include "kv/kv_cache_manager.h"
#include "lora/adapter_registry.h"
#include "model/model.h"
#include "sample/logprobs.h"
#include "sample/sampler.h"
#include "sample/speculative_acceptance.h"
#include "sched/scheduler.h"
#include "spec/draft_model_proposer.h"
#include "spec/medusa_proposer.h"
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
  // Seconds per step phase (engine/step_phases.h): summed over every step that computed
  // something, and those of the last such step (num_steps counts them).
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

  const model::ModelConfig& model_config() const { return model_->config(); }
  const model::Model& model() const { return *model_; }
  const tokenizer::Tokenizer& tokenizer() const { return *tokenizer_; }
  const MemoryPlan& memory_plan() const { return plan_; }
  const sched::SchedulerConfig& scheduler_config() const { return scheduler_->config(); }

  // Queues a request. Errors (nothing queued) for invalid sampling parameters, a duplicate id,
  // an empty prompt, token ids outside the vocabulary, or a request that can never fit.
  Status add_request(EngineRequest request);

  // Runs one iteration and returns the outputs of the requests that changed.
  std::vector<RequestOutput> step();

  // Removes a request in any state; its blocks are free on return. False for an unknown id.
  // With `final_output`, also reports the request's last output there: what it generated since
  // its previous output, every sample that had not finished with finish_reason "abort", and
  // finished == true (what a client still streaming it must be told).
  bool abort(const std::string& request_id, RequestOutput* final_output = nullptr);

  // Requests queued, running, or finished at admission and not yet reported by step().
  bool has_unfinished() const { return outputs_->has_unfinished(); }

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
  // Speculative decoding: proposals for the sequences about to compute one token (set on the
  // scheduler before it plans), and the verification of a scheduled entry's proposals.
  void propose();
  void propose_with_draft(int64_t k);
  void propose_with_medusa(int64_t k);
  // --num-speculative-tokens auto: measures what passes of the target (and the proposer) cost.
  void calibrate_speculation();
  // Removes a finished sequence from the scheduler (and the draft's bookkeeping).
  // Fills params.bad_words_token_ids from params.bad_words.
  void tokenize_bad_words(sample::SamplingParams& params) const;
  void remove_sequence(sched::SeqId id);
  // Adapters: releases the copies of the sequences the plan drops and pins those of its new
  // sequences (their slots go into the plan). Requests whose adapter no longer loads are
  // aborted; their final outputs are returned.
  std::vector<RequestOutput> bind_adapters(sched::SchedulerOutput& plan);
  void verify(OutputProcessor::RequestState& request, int32_t index,
              const sched::ScheduledSequence& s, int32_t first_row, double now);
  // Samples the scheduled entries of the step just run, reports their tokens.
  void sample_step(const sched::SchedulerOutput& plan, double now);
  // Draws sample `index`'s token from `logits` (copied: processors work on the copy) and reports
  // it.
  void sample_one(OutputProcessor::RequestState& request, int32_t index,
                  std::span<const float> logits, double now);

  EngineConfig config_;
  std::unique_ptr<backend::Backend> backend_;
  std::unique_ptr<model::Model> model_;
  std::unique_ptr<lora::AdapterRegistry> adapters_;  // with adapters
  std::optional<tokenizer::Tokenizer> tokenizer_;
  MemoryPlan plan_;
  std::unique_ptr<kv::KvCacheManager> kv_;
  std::unique_ptr<sched::Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<OutputProcessor> outputs_;
  std::unique_ptr<sample::BatchSampler> sampler_;
  std::unique_ptr<sample::SpeculativeVerifier> verifier_;  // with speculative decoding
  std::unique_ptr<spec::DraftModelProposer> draft_;        // with a draft model
  std::unique_ptr<spec::MedusaProposer> medusa_;           // with Medusa heads
  std::unique_ptr<SpeculationPolicy> policy_;              // with --num-speculative-tokens auto

  sched::SeqId next_seq_id_ = 1;
  int64_t next_arrival_ = 0;
  EngineStats totals_;
  // Reused every step: a row of logits the processors may change, logprob scratch, fork ids.
  std::vector<float> row_;
  sample::LogprobScratch logprob_scratch_;
  std::vector<kv::SeqId> child_ids_;
  std::vector<int32_t> proposal_;
  std::vector<spec::DraftModelProposer::Request> draft_requests_;
  std::vector<std::vector<int32_t>> draft_proposals_;
  std::vector<spec::MedusaProposer::Request> medusa_requests_;
  std::vector<std::vector<int32_t>> medusa_parents_;
  std::vector<int32_t> verified_tokens_;  // a verification's committed tokens, in order
  std::vector<std::span<const float>> verify_rows_;
  std::unordered_map<sched::SeqId, int32_t> pinned_;  // runner-held sequences' adapter slots
  std::unordered_set<sched::SeqId> failed_seqs_;      // this step's sequences whose pin failed
  PhaseClock* clock_ = nullptr;                       // the step's phase clock, during step()
};

}  // namespace vesper::engine
