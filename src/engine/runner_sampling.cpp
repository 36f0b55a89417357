// ModelRunner's sampling: the step's rows drawn with one BatchSampler call, proposals verified,
// the tokens appended to the mirror and cut at the first token-level stop.
#include <algorithm>

#include "core/check.h"
#include "engine/model_runner.h"
#include "sample/stop_conditions.h"

namespace vesper::engine {

bool ModelRunner::stops(const sched::SequenceMirror::Entry& e, int32_t token,
                        int64_t num_new) const {
  const auto length = static_cast<int64_t>(e.tokens.size()) + num_new;
  return sample::token_stop(*e.sampling.params, token, length - e.num_prompt_tokens, length,
                            config_.max_model_len, config_.eog_ids) != sample::TokenStop::kNone;
}

void ModelRunner::sample_step(const sched::SchedulerOutput& plan, sched::ModelRunnerOutput& out) {
  rows_.clear();
  row_output_.clear();
  hidden_rows_.clear();
  entry_output_.assign(plan.scheduled.size(), -1);
  auto add_row = [&](sched::SeqId id, sched::SequenceMirror::Entry& e, int64_t row) {
    row_output_.push_back(out.sequences.size());
    out.sequences.emplace_back();
    out.sequences.back().id = id;
    hidden_rows_.push_back(row);
    rows_.push_back(sample::BatchSampler::Row{
        e.sampling.params.get(), &e.rng,
        sample::TokenHistory{e.prompt(), e.output(), &e.grammar_cursor}, logits_row(row)});
  };
  size_t next_fork = 0;
  for (size_t i = 0; i < plan.scheduled.size(); ++i) {
    const sched::ScheduledSequence& s = plan.scheduled[i];
    if (!s.samples()) continue;
    sched::SequenceMirror::Entry* found = mirror_.find(s.id);
    // Ended by a token of a step whose results the scheduler had not read when it made the plan,
    // or (pipelined plans) ended by a plan launched after this one: nothing to sample, its forks
    // included.
    if (found == nullptr || found->stopped) {
      while (next_fork < plan.forks.size() && plan.forks[next_fork].parent == s.id) ++next_fork;
      continue;
    }
    sched::SequenceMirror::Entry& e = *found;
    entry_output_[i] = static_cast<int64_t>(out.sequences.size());
    if (s.num_spec_tokens > 0) {
      int64_t hidden_row = -1;
      out.sequences.push_back(verify(e, s, first_logits_row_[i], hidden_row));
      hidden_rows_.push_back(hidden_row);
      continue;
    }
    // Without proposals the entry's one logits row predicts the next token; the n > 1 samples
    // forked from it in this step draw their first tokens from the same row.
    const int64_t row = first_logits_row_[i] + s.num_logits_rows - 1;
    add_row(s.id, e, row);
    for (; next_fork < plan.forks.size() && plan.forks[next_fork].parent == s.id; ++next_fork) {
      const sched::SeqId child = plan.forks[next_fork].child;
      if (sched::SequenceMirror::Entry* c = mirror_.find(child)) add_row(child, *c, row);
    }
  }
  VESPER_CHECK(next_fork == plan.forks.size(), "the plan forks %zu samples, %zu sampled",
               plan.forks.size(), next_fork);
  draw_rows(out);
}

void ModelRunner::draw_rows(sched::ModelRunnerOutput& out) {
  sampled_.resize(rows_.size());
  row_logprobs_.resize(rows_.size());
  for (size_t j = 0; j < rows_.size(); ++j)
    if (rows_[j].params->logprobs >= 0) rows_[j].logprob = &row_logprobs_[j];
  sampler_.sample(rows_, config_.eog_ids, sampled_);
  for (size_t j = 0; j < rows_.size(); ++j) {
    sched::SampledSequence& r = out.sequences[row_output_[j]];
    sched::SequenceMirror::Entry& e = *mirror_.find(r.id);
    r.token_ids.push_back(sampled_[j]);
    if (rows_[j].logprob != nullptr) r.logprobs.push_back(std::move(row_logprobs_[j]));
    r.finished = stops(e, sampled_[j], 1);
    // The mask this row was drawn with came from the cursor's state: a failed one allowed only
    // end-of-generation tokens, and says why.
    if (const auto& g = rows_[j].params->grammar; g != nullptr)
      if (std::optional<std::string> why = g->failure(e.grammar_cursor)) r.constraint_error = *why;
    e.tokens.push_back(sampled_[j]);
    e.stopped = r.finished;
    if (!e.stopped) prefetch_mask(e);
  }
}

void ModelRunner::prefetch_mask(sched::SequenceMirror::Entry& e) {
  const std::shared_ptr<const grammar::CompiledGrammar>& g = e.sampling.params->grammar;
  if (g == nullptr || mask_prefetcher_ == nullptr) return;
  // The transition is cheap (the token's bytes through the stacks) and the next step needs it
  // anyway: its cursor resumes from here.
  const grammar::StateId state = g->state_after(e.grammar_cursor, e.output());
  mask_prefetcher_->request(g, state);
}

void ModelRunner::run_further_passes(const sched::SchedulerOutput& plan,
                                     sched::ModelRunnerOutput& out, PhaseClock& clock) {
  int64_t passes = 1;
  for (const sched::ScheduledSequence& s : plan.scheduled) passes = std::max(passes, s.num_steps);
  for (int64_t pass = 1; pass < passes; ++pass) {
    batch_.clear();
    rows_.clear();
    row_output_.clear();
    for (size_t i = 0; i < plan.scheduled.size(); ++i) {
      const sched::ScheduledSequence& s = plan.scheduled[i];
      if (s.num_steps <= pass || entry_output_[i] < 0) continue;
      const auto index = static_cast<size_t>(entry_output_[i]);
      if (out.sequences[index].finished) continue;
      sched::SequenceMirror::Entry& e = *mirror_.find(s.id);
      // The token the pass before sampled, at the next position.
      const int64_t pos = s.start + pass;
      tokens_.assign(1, e.tokens[static_cast<size_t>(pos)]);
      batch_.add_sequence(tokens_, static_cast<int32_t>(pos), e.block_table,
                          layout_.with_quantized(e.quantized_groups), 1, e.adapter, {},
                          sparsity_of(e));
      e.num_computed = pos + 1;
      row_output_.push_back(index);
    }
    if (row_output_.empty()) break;
    // The hidden states that stay readable are this pass's: only its sequences can have Medusa
    // heads read them.
    std::fill(hidden_rows_.begin(), hidden_rows_.end(), -1);
    for (size_t j = 0; j < row_output_.size(); ++j)
      hidden_rows_[row_output_[j]] = static_cast<int64_t>(j);
    clock.lap(StepPhase::kBatchBuild);
    logits_ = model_.forward(batch_, device_);
    ++passes_;
    clock.lap(StepPhase::kForward);
    for (size_t j = 0; j < row_output_.size(); ++j) {
      sched::SequenceMirror::Entry& e = *mirror_.find(out.sequences[row_output_[j]].id);
      rows_.push_back(
          sample::BatchSampler::Row{e.sampling.params.get(), &e.rng,
                                    sample::TokenHistory{e.prompt(), e.output(), &e.grammar_cursor},
                                    logits_row(static_cast<int64_t>(j))});
    }
    draw_rows(out);
    clock.lap(StepPhase::kSample);
  }
}

sched::SampledSequence ModelRunner::verify(sched::SequenceMirror::Entry& e,
                                           const sched::ScheduledSequence& s, int32_t first_row,
                                           int64_t& hidden_row) {
  const sample::SamplingParams& p = *e.sampling.params;
  verify_rows_.clear();
  for (int64_t j = 0; j < s.num_logits_rows; ++j) verify_rows_.push_back(logits_row(first_row + j));
  const sample::TokenHistory history{e.prompt(), e.output(), &e.grammar_cursor};
  // The kept proposals (as indices into the entry's proposals) and the token after them. Row
  // 1 + j holds proposal j's logits; row 0 the last committed token's.
  const bool tree = !s.spec_tree_parents.empty();
  const spec::SpeculativeConfig& spec = config_.speculative;
  sample::TreeVerification v;
  if (tree) {
    v = verifier_->verify_tree(p, spec.acceptance, e.rng, history, verify_rows_, s.spec_token_ids,
                               s.spec_tree_parents, config_.eog_ids);
  } else {
    const sample::Verification chain = verifier_->verify(
        p, spec.acceptance, e.rng, history, verify_rows_, s.spec_token_ids, {}, config_.eog_ids);
    for (int32_t j = 0; j < chain.num_accepted; ++j) v.path.push_back(j);
    v.next_token = chain.next_token;
  }
  const auto num_accepted = static_cast<int64_t>(v.path.size());
  verified_tokens_.clear();
  for (const int32_t node : v.path) verified_tokens_.push_back(s.spec_token_ids[node]);
  verified_tokens_.push_back(v.next_token);
  if (policy_) policy_->record(s.num_spec_tokens, num_accepted);
  proposer_->on_verified(s.id, verified_tokens_, num_accepted);
  // A tree's kept nodes wrote their K/V in the slots of their indices (position of the first
  // proposal + index); they belong at (first proposal's position) + depth. Depth <= index and both
  // grow along the path, so copying in path order never overwrites a slot a later copy reads.
  // Moved now, before any later plan's memory traffic or forward reads them.
  const int64_t first = s.start + s.num_new_tokens - s.num_spec_tokens;
  slot_src_.clear();
  slot_dst_.clear();
  const model::KvTableLayout layout = layout_.with_quantized(e.quantized_groups);
  for (size_t i = 0; i < v.path.size(); ++i)
    if (v.path[i] != static_cast<int32_t>(i)) {
      slot_src_.push_back(layout.slot(e.block_table, first + v.path[i]));
      slot_dst_.push_back(layout.slot(e.block_table, first + static_cast<int64_t>(i)));
    }
  if (!slot_src_.empty()) {
    model_.copy_kv_slots(device_, slot_src_, slot_dst_);
    for (const auto& [device, host] : companions_)
      backend_.copy_kv_slots(device, slot_src_, slot_dst_);
  }
  e.num_computed += num_accepted;
  // The kept proposals, then the target's next token, one at a time as plain sampling would give
  // them: the first that ends the sequence (a stop token, EOS, max_tokens) ends it there. Token j
  // was predicted by the row of its parent: the last committed token's for the first, else the
  // previous kept proposal's.
  sched::SampledSequence r;
  r.id = s.id;
  r.num_proposals = s.num_spec_tokens;
  r.num_accepted = num_accepted;
  for (int64_t j = 0; j <= num_accepted; ++j) {
    const int32_t token = verified_tokens_[static_cast<size_t>(j)];
    const size_t row = j == 0 ? 0 : static_cast<size_t>(1 + v.path[static_cast<size_t>(j - 1)]);
    if (p.logprobs >= 0)
      r.logprobs.push_back(
          sample::compute_logprobs(verify_rows_[row], token, p.logprobs, logprob_scratch_));
    r.token_ids.push_back(token);
    if (stops(e, token, j + 1)) {
      r.finished = true;
      break;
    }
  }
  e.tokens.insert(e.tokens.end(), r.token_ids.begin(), r.token_ids.end());
  e.stopped = r.finished;
  if (!e.stopped) prefetch_mask(e);
  hidden_row = first_row + (num_accepted == 0 ? 0 : 1 + v.path.back());
  return r;
}

}  // namespace vesper::engine
