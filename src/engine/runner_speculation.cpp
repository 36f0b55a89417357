// ModelRunner's side of speculative decoding: proposals for the next step, right after sampling,
// and the start-up measurements --num-speculative-tokens auto decides from.
#include <algorithm>
#include <chrono>

#include "engine/model_runner.h"
#include "spec/pass_timing.h"

namespace vesper::engine {

int64_t ModelRunner::proposal_length(const sched::SchedulerOutput& plan,
                                     const sched::ModelRunnerOutput& out) {
  const spec::SpeculativeConfig& spec = config_.speculative;
  if (spec.disable_by_batch_size > 0 && plan.num_running_or_waiting > spec.disable_by_batch_size)
    return 0;
  if (!policy_) return spec.num_speculative_tokens;
  (void)out;
  // The next step's decoding sequences, and the prompt rows that will share it.
  int64_t decoding = 0, other = 0;
  for (const auto& [id, e] : mirror_.entries()) {
    if (!e.resident || e.stopped) continue;
    const int64_t uncomputed = static_cast<int64_t>(e.tokens.size()) - e.num_computed;
    if (uncomputed == 1 && e.num_computed >= e.num_prompt_tokens)
      ++decoding;
    else
      other += uncomputed;
  }
  other = std::min(other, config_.max_num_batched_tokens);
  return policy_->choose(decoding, other);
}

void ModelRunner::propose_next(const sched::SchedulerOutput& plan, sched::ModelRunnerOutput& out) {
  if (proposer_ == nullptr || out.sequences.empty()) return;
  const int64_t k = proposal_length(plan, out);
  if (k > 0) {
    proposal_requests_.clear();
    proposal_output_.clear();
    for (size_t i = 0; i < out.sequences.size(); ++i) {
      const sched::SampledSequence& r = out.sequences[i];
      if (r.finished) continue;
      const sched::SequenceMirror::Entry& e = *mirror_.find(r.id);
      // Never more than the sequence may still grow by (for a tree, a bound on its depth: its
      // proposals also need a KV slot each).
      const int64_t room = e.num_prompt_tokens + e.sampling.params->max_tokens -
                           static_cast<int64_t>(e.tokens.size());
      if (room <= 0) continue;
      proposal_requests_.push_back({r.id, std::min(k, room), hidden_rows_[i]});
      proposal_output_.push_back(i);
    }
    proposer_->propose(proposal_requests_, mirror_, model_.hidden_states(), proposals_);
    for (size_t j = 0; j < proposal_output_.size(); ++j) {
      sched::SampledSequence& r = out.sequences[proposal_output_[j]];
      r.proposals = std::move(proposals_[j].tokens);
      r.proposal_parents = std::move(proposals_[j].parents);
    }
  }
  for (sched::SampledSequence& r : out.sequences) r.companion_rows = proposer_->rows_written(r.id);
}

void ModelRunner::calibrate_speculation() {
  if (!policy_) return;
  const int64_t bs = layout_.block_size;
  const int64_t limit = std::min<int64_t>({128, config_.max_num_batched_tokens, num_blocks_ * bs});
  // What verifying a row costs besides the pass (the target's distribution over the vocabulary):
  // 8 rows of a sampled request, the best of three.
  const auto n_vocab = static_cast<size_t>(n_vocab_);
  std::vector<float> logits(n_vocab * 9);
  // Every row all but certain of token 0, the proposal, so that all nine rows are verified.
  for (size_t i = 0; i < logits.size(); ++i)
    logits[i] = i % n_vocab == 0 ? 50.0f : static_cast<float>(i % 97) * 0.01f;
  std::vector<std::span<const float>> rows;
  for (size_t r = 0; r < 9; ++r) rows.emplace_back(logits.data() + r * n_vocab, n_vocab);
  const std::vector<int32_t> proposals(8, 0), none;
  sample::SamplingParams sampled;
  sampled.temperature = 1.0f;
  std::mt19937_64 rng(0);
  auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  double per_row = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const double start = now();
    verifier_->verify(sampled, config_.speculative.acceptance, rng,
                      sample::TokenHistory{none, none}, rows, proposals, {}, none);
    per_row = std::min(per_row, (now() - start) / 9);
  }
  for (const int64_t r : spec::calibration_rows(limit))
    policy_->target_cost().add(
        r, spec::time_pass(model_, device_, r, bs) + per_row * static_cast<double>(r));
  if (proposer_->cost() == spec::Proposer::Cost::kFree) return;
  for (const int64_t r : spec::calibration_rows(std::min(limit, config_.max_num_seqs)))
    policy_->proposer_cost().add(r, proposer_->time_proposal(r));
}

}  // namespace vesper::engine
