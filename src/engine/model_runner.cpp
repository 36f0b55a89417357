#include "engine/model_runner.h"

#include <string>

#include "core/check.h"

namespace vesper::engine {

ModelRunner::ModelRunner(model::Model& model, const backend::KvCacheSpec& spec, int64_t num_blocks,
                         int64_t num_swap_blocks, RunnerConfig config,
                         std::unique_ptr<spec::Proposer> proposer)
    : model_(model),
      backend_(model.backend()),
      config_(std::move(config)),
      layout_(spec),
      n_vocab_(model.config().n_vocab),
      num_blocks_(num_blocks),
      device_(model.create_kv(spec, num_blocks, backend::MemoryKind::kDevice)),
      host_(model.create_kv(spec, num_swap_blocks, backend::MemoryKind::kHostVisible)),
      sampler_(static_cast<int32_t>(model.config().n_vocab), backend_.host_pool()),
      proposer_(std::move(proposer)) {
  mirror_.set_bounds(num_blocks, static_cast<int32_t>(n_vocab_));
  // Made here, not on first use: the engine thread reads its counter while the runner works.
  if (config_.prefetch_grammar_masks)
    mask_prefetcher_ = std::make_unique<grammar::MaskPrefetcher>();
  if (proposer_ != nullptr) {
    verifier_ = std::make_unique<sample::SpeculativeVerifier>(static_cast<int32_t>(n_vocab_));
    if (auto storage = proposer_->companion_storage()) companions_.push_back(*storage);
    if (config_.speculative.auto_num_speculative_tokens) {
      using Cost = spec::SpeculationPolicy::ProposerCost;
      const Cost cost = proposer_->cost() == spec::Proposer::Cost::kPassPerToken
                            ? Cost::kPassPerToken
                        : proposer_->cost() == spec::Proposer::Cost::kOnePass ? Cost::kOnePass
                                                                              : Cost::kFree;
      policy_ = std::make_unique<spec::SpeculationPolicy>(
          config_.speculative.num_speculative_tokens, cost);
    }
  }
}

ModelRunner::~ModelRunner() {
  model_.release_kv(device_);
  model_.release_kv(host_);
}

Status ModelRunner::execute(const sched::SchedulerOutput& plan, sched::ModelRunnerOutput& out) {
  phases_ = {};
  PhaseClock clock(phases_);
  out.sequences.clear();
  VESPER_TRY(prepare(plan));
  clock.lap(StepPhase::kBatchBuild);
  passes_ = 0;
  if (batch_.num_tokens() == 0) return {};
  logits_ = model_.forward(batch_, device_);
  ++passes_;
  clock.lap(StepPhase::kForward);
  sample_step(plan, out);
  clock.lap(StepPhase::kSample);
  run_further_passes(plan, out, clock);
  propose_next(plan, out);
  clock.lap(StepPhase::kPropose);
  return {};
}

Status ModelRunner::launch(const sched::SchedulerOutput& plan) {
  VESPER_CHECK(
      proposer_ == nullptr && static_cast<int>(launched_.size()) < model_.max_passes_in_flight(),
      "launch: at most one plan in flight a pipeline stage, without speculation");
  // A job launches one plan and finishes the one before: its phases start here.
  phases_ = {};
  passes_ = 0;
  PhaseClock clock(phases_);
  VESPER_TRY(prepare(plan));
  clock.lap(StepPhase::kBatchBuild);
  Launched& l = launched_.emplace_back();
  l.first_logits_row = first_logits_row_;
  l.forward = batch_.num_tokens() > 0;
  if (l.forward) model_.begin_forward(batch_, device_);
  clock.lap(StepPhase::kForward);
  return {};
}

void ModelRunner::finish(const sched::SchedulerOutput& plan, sched::ModelRunnerOutput& out) {
  VESPER_CHECK(!launched_.empty(), "finish: no plan launched");
  PhaseClock clock(phases_);
  out.sequences.clear();
  Launched l = std::move(launched_.front());
  launched_.erase(launched_.begin());
  if (!l.forward) return;
  logits_ = model_.finish_forward();
  ++passes_;
  clock.lap(StepPhase::kForward);
  first_logits_row_ = std::move(l.first_logits_row);
  sample_step(plan, out);
  clock.lap(StepPhase::kSample);
}

Status ModelRunner::prepare(const sched::SchedulerOutput& plan) {
  if (proposer_ != nullptr) {
    for (const sched::SeqId id : plan.finished) proposer_->forget(id);
    // Preempted by recompute: the blocks are gone, a companion cache's rows with them.
    for (const sched::SeqId id : plan.recomputed) proposer_->on_kv_lost(id);
  }
  VESPER_TRY(mirror_.apply(plan));
  VESPER_TRY(check_tables(plan));
  move_memory(plan);
  build_batch(plan);
  return {};
}

Status ModelRunner::check_tables(const sched::SchedulerOutput& plan) const {
  for (const sched::ScheduledSequence& s : plan.scheduled) {
    const sched::SequenceMirror::Entry& e = *mirror_.find(s.id);
    if (e.stopped) continue;
    const model::KvTableLayout layout = layout_.with_quantized(e.quantized_groups);
    // Every position the entry writes, its further passes' included.
    const int64_t end = s.start + s.num_new_tokens + s.num_steps - 1;
    if (layout.entries_for(end) > static_cast<int64_t>(e.block_table.size()) ||
        e.quantized_groups > static_cast<int64_t>(e.block_table.size()) ||
        !layout.written_row(s.start))
      return make_error("the plan computes positions " + std::to_string(s.start) + ".." +
                        std::to_string(end - 1) + " of sequence " + std::to_string(s.id) +
                        ", which its table of " + std::to_string(e.block_table.size()) +
                        " entries does not hold");
  }
  return {};
}

void ModelRunner::move_memory(const sched::SchedulerOutput& plan) {
  // The ops run in the plan's order (each may read what an earlier one wrote), the same list on
  // the target's storage and on each companion's; a run of ops of one kind between the same
  // two storages goes to the backend as one call.
  using Kind = kv::BlockOp::Kind;
  // The target's storage moves through its model (every tensor-parallel rank moves its part);
  // a companion's is the proposer's own.
  auto run_ops = [&](backend::KvHandle device, backend::KvHandle host, bool target) {
    const std::vector<kv::BlockOp>& ops = plan.block_ops;
    for (size_t i = 0; i < ops.size();) {
      const Kind kind = ops[i].kind;
      if (kind == Kind::kQuantizeGroup) {
        if (target)
          model_.quantize_kv_group(device, ops[i].rows, ops[i].dst);
        else
          backend_.quantize_kv_group(device, ops[i].rows, ops[i].dst);
        ++i;
        continue;
      }
      copy_src_.clear();
      copy_dst_.clear();
      for (; i < ops.size() && ops[i].kind == kind; ++i) {
        copy_src_.push_back(ops[i].src);
        copy_dst_.push_back(ops[i].dst);
      }
      const backend::KvHandle to = kind == Kind::kSwapOut ? host : device;
      const backend::KvHandle from = kind == Kind::kSwapIn ? host : device;
      if (target)
        model_.copy_kv_blocks(to, from, copy_src_, copy_dst_);
      else
        backend_.copy_kv_blocks(to, from, copy_src_, copy_dst_);
    }
  };
  run_ops(device_, host_, true);
  for (const auto& [device, host] : companions_) run_ops(device, host, false);
}

backend::KvSparsity ModelRunner::sparsity_of(const sched::SequenceMirror::Entry& e) const {
  return config_.kv_sparsity.for_sequence(e.num_prompt_tokens,
                                          e.sampling.params && e.sampling.params->kv_dense);
}

void ModelRunner::build_batch(const sched::SchedulerOutput& plan) {
  batch_.clear();
  first_logits_row_.clear();
  int32_t logits_rows = 0;
  for (const sched::ScheduledSequence& s : plan.scheduled) {
    const sched::SequenceMirror::Entry& e = *mirror_.find(s.id);
    // Ended by a token of a step the scheduler had not read when it made the plan (async
    // scheduling): nothing of it is computed.
    if (e.stopped) {
      first_logits_row_.push_back(-1);
      continue;
    }
    const int64_t committed = s.num_new_tokens - s.num_spec_tokens;
    tokens_.assign(e.tokens.begin() + s.start, e.tokens.begin() + s.start + committed);
    tokens_.insert(tokens_.end(), s.spec_token_ids.begin(), s.spec_token_ids.end());
    parents_.clear();
    if (!s.spec_tree_parents.empty()) {
      // The committed rows are a chain; each proposal hangs off its parent, or off the last
      // committed row.
      for (int64_t r = 0; r < committed; ++r) parents_.push_back(static_cast<int32_t>(r) - 1);
      for (const int32_t p : s.spec_tree_parents)
        parents_.push_back(p < 0 ? static_cast<int32_t>(committed) - 1
                                 : static_cast<int32_t>(committed) + p);
    }
    batch_.add_sequence(tokens_, static_cast<int32_t>(s.start), e.block_table,
                        layout_.with_quantized(e.quantized_groups), s.num_logits_rows, e.adapter,
                        parents_, sparsity_of(e));
    first_logits_row_.push_back(s.num_logits_rows > 0 ? logits_rows : -1);
    logits_rows += static_cast<int32_t>(s.num_logits_rows);
  }
}

}  // namespace vesper::engine
