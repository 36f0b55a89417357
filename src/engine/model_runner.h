// ModelRunner: runs step plans (sched/scheduler_output.h) on the backend and returns what each
// step computed (sched/runner_output.h), as vLLM V1's model runner does. It owns the device KV
// storage and the host swap storage (allocated once at start), keeps a mirror of its sequences
// (sched/sequence_mirror.h) built from the plans and from what it samples, and owns what a step
// computes from the plan: sampling and speculative verification, and the proposer
// (spec/proposer.h) that proposes the next step's speculative tokens. It never asks the
// scheduler anything, so the plans it runs may come from a scheduler in another thread or
// process; the engine and the scheduler never sample or propose.
//
// execute(plan, out):
//  1. applies the plan to the mirror (the proposer forgets finished sequences, and what it held
//     of sequences preempted by recompute);
//  2. memory traffic: KIVI group quantizations, swap-outs, swap-ins, copy-on-write copies (in that
//     order: swap-outs read blocks the step may hand to others), in the target's storage and the
//     proposer's companion cache alike;
//  3. builds one ForwardBatch with the batch builder (ForwardBatch::add_sequence: prefill chunks,
//     decodes and verifications together, no padding) and runs one forward pass;
//  4. samples every entry that reached its sequence's end, and each fork's child from its
//     parent's row, with one BatchSampler call; verifies entries with proposals
//     (sample/speculative_acceptance.h) and moves a tree's kept path to its positions. Tokens are
//     appended to the mirror as drawn; a sequence ends at the first token that stops it
//     (sample/stop_conditions.h);
//  5. proposes for the sequences that sampled and go on (with --num-speculative-tokens auto, k
//     from spec::SpeculationPolicy).
// The K/V contract the scheduler relies on is model/model.h's.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "engine/step_phases.h"
#include "grammar/mask_prefetcher.h"
#include "model/model.h"
#include "sample/logprobs.h"
#include "sample/sampler.h"
#include "sample/speculative_acceptance.h"
#include "sched/runner_output.h"
#include "sched/scheduler_output.h"
#include "sched/sequence_mirror.h"
#include "spec/proposer.h"
#include "spec/speculation_policy.h"
#include "spec/speculative_config.h"

namespace vesper::engine {

// What the runner needs beyond the plans.
struct RunnerConfig {
  int64_t max_model_len = 1 << 30;
  int64_t max_num_batched_tokens = 1 << 30;  // caps the prompt rows the auto policy reckons with
  int64_t max_num_seqs = 1 << 30;
  std::vector<int32_t> eog_ids;  // the vocabulary's end-of-generation tokens
  spec::SpeculativeConfig speculative;
  // EngineConfig::prefetch_grammar_masks.
  bool prefetch_grammar_masks = true;
  // KV sparsity (sinks + window, or Quest) every sequence reads with from its prompt's end
  // (sched::SchedulerConfig::kv_sparsity), unless its request opted out.
  backend::KvSparsity kv_sparsity;
};

class ModelRunner {
 public:
  // Device and host (swap) KV storage of `spec` (the model's kv_spec), num_blocks and
  // num_swap_blocks blocks. With a proposer, its companion cache (if it keeps one) must be
  // allocated already.
  ModelRunner(model::Model& model, const backend::KvCacheSpec& spec, int64_t num_blocks,
              int64_t num_swap_blocks, RunnerConfig config = {},
              std::unique_ptr<spec::Proposer> proposer = nullptr);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  // Runs the plan and fills `out`. An error, with no memory moved and nothing computed, when the
  // plan does not fit the mirror, the storage or the vocabulary (a plan from another history, or
  // corrupt); the mirror and the proposer have then taken the plan up to the fault.
  Status execute(const sched::SchedulerOutput& plan, sched::ModelRunnerOutput& out);
  // execute() in two halves, for a pipeline with a plan in flight a stage (Model::begin_forward):
  // launch takes a plan up to its forward pass begun, finish waits for that pass's logits and
  // samples into `out`. Plans finish in the order they were launched, at most
  // Model::max_passes_in_flight() in flight, on disjoint sequences (the scheduler's virtual
  // engines). A sequence a later plan ended (an abort)
  // is not sampled. For plans of one pass without proposals: no speculation, no multi-step.
  Status launch(const sched::SchedulerOutput& plan);
  void finish(const sched::SchedulerOutput& plan, sched::ModelRunnerOutput& out);
  // Seconds per phase of the last execute (batch build, forward, sample, propose), and its
  // forward passes (a multi-step plan runs several).
  const StepPhaseTimes& phase_seconds() const { return phases_; }
  int64_t num_passes() const { return passes_; }
  // Grammar masks computed ahead on the prefetching thread (0 with prefetching off). Thread-safe.
  int64_t grammar_masks_prefetched() const {
    return mask_prefetcher_ ? mask_prefetcher_->num_computed() : 0;
  }

  // --num-speculative-tokens auto: measures what passes of the target (and proposing) cost, once
  // at start; the policy then picks each step's k. Null without it.
  void calibrate_speculation();
  const spec::SpeculationPolicy* policy() const { return policy_.get(); }
  const spec::Proposer* proposer() const { return proposer_.get(); }

  // The logits of the last execute: scheduled entry i's rows (num_logits_rows of them, the
  // last committed token's first) start at row first_logits_row()[i] (-1: none). After a
  // multi-step plan, the rows are the last pass's (test helpers read single-step plans).
  const std::vector<int32_t>& first_logits_row() const { return first_logits_row_; }
  std::span<const float> logits_row(int64_t row) const {
    return logits_.subspan(static_cast<size_t>(row * n_vocab_), static_cast<size_t>(n_vocab_));
  }

  const sched::SequenceMirror& mirror() const { return mirror_; }
  backend::KvHandle device_kv() const { return device_; }

 private:
  // Steps 1-3 of execute (and launch) short of the forward pass: the plan applied to the mirror
  // (and the proposer), checked, its memory moved, its batch built.
  Status prepare(const sched::SchedulerOutput& plan);
  // Whether every scheduled entry's positions lie in its table (a plan from elsewhere may lie).
  Status check_tables(const sched::SchedulerOutput& plan) const;
  void move_memory(const sched::SchedulerOutput& plan);
  void build_batch(const sched::SchedulerOutput& plan);
  // Samples (and verifies) the step's rows into out.sequences; hidden_rows_ gets each output's
  // row of the step's hidden states.
  void sample_step(const sched::SchedulerOutput& plan, sched::ModelRunnerOutput& out);
  // Draws rows_ with one BatchSampler call; each row's token (and logprobs) joins its output
  // (row_output_), the mirror, and is checked for a stop.
  void draw_rows(sched::ModelRunnerOutput& out);
  sched::SampledSequence verify(sched::SequenceMirror::Entry& e, const sched::ScheduledSequence& s,
                                int32_t first_row, int64_t& hidden_row);
  // Multi-step plans: the passes after the first, each computing the token the pass before
  // sampled, for the entries with passes left that did not stop.
  void run_further_passes(const sched::SchedulerOutput& plan, sched::ModelRunnerOutput& out,
                          PhaseClock& clock);
  // A constrained entry's cursor moved to the state after its output so far, and that state's
  // mask handed to the prefetcher (made on first use), to be ready when the next step samples.
  void prefetch_mask(sched::SequenceMirror::Entry& e);
  // The token-level stop check of `e` gaining `token` as its next output.
  bool stops(const sched::SequenceMirror::Entry& e, int32_t token, int64_t num_new) const;
  void propose_next(const sched::SchedulerOutput& plan, sched::ModelRunnerOutput& out);
  // The step's k for proposals (0: none).
  int64_t proposal_length(const sched::SchedulerOutput& plan, const sched::ModelRunnerOutput& out);

  model::Model& model_;
  backend::Backend& backend_;
  RunnerConfig config_;
  model::KvTableLayout layout_;  // how block tables map positions to slots
  // The KV sparsity a sequence's rows read with (RunnerConfig::kv_sparsity, from its prompt's
  // end; none for a request with SamplingParams::kv_dense).
  backend::KvSparsity sparsity_of(const sched::SequenceMirror::Entry& e) const;
  int64_t n_vocab_;
  int64_t num_blocks_;
  backend::KvHandle device_;
  backend::KvHandle host_;
  std::vector<std::pair<backend::KvHandle, backend::KvHandle>> companions_;  // (device, host)
  sched::SequenceMirror mirror_;
  sample::BatchSampler sampler_;
  std::unique_ptr<sample::SpeculativeVerifier> verifier_;  // with a proposer
  std::unique_ptr<spec::Proposer> proposer_;
  std::unique_ptr<spec::SpeculationPolicy> policy_;  // with --num-speculative-tokens auto
  std::unique_ptr<grammar::MaskPrefetcher> mask_prefetcher_;
  StepPhaseTimes phases_;
  int64_t passes_ = 0;
  // Plans launched and not finished, oldest first: each one's first logits rows, and whether it
  // began a forward pass.
  struct Launched {
    std::vector<int32_t> first_logits_row;
    bool forward = false;
  };
  std::vector<Launched> launched_;
  // Reused every step.
  model::ForwardBatch batch_;
  std::vector<int32_t> tokens_, parents_, copy_src_, copy_dst_, first_logits_row_;
  std::vector<int64_t> slot_src_, slot_dst_;
  std::span<const float> logits_;
  std::vector<sample::BatchSampler::Row> rows_;
  std::vector<size_t> row_output_;  // out.sequences index each row fills
  std::vector<int32_t> sampled_;
  std::vector<sample::LogprobEntry> row_logprobs_;
  std::vector<int64_t> hidden_rows_;   // per out.sequences entry
  std::vector<int64_t> entry_output_;  // per scheduled entry: its out.sequences index (-1: none)
  std::vector<std::span<const float>> verify_rows_;
  std::vector<int32_t> verified_tokens_;
  sample::LogprobScratch logprob_scratch_;
  std::vector<spec::ProposalRequest> proposal_requests_;
  std::vector<size_t> proposal_output_;
  std::vector<spec::Proposal> proposals_;
};

}  // namespace vesper::engine
