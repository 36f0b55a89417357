#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "core/check.h"
#include "core/logging.h"

namespace vesper::engine {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Engine::~Engine() {
  // The job threads go first: a job in flight reads the state below.
  runner_thread_.reset();
  output_thread_.reset();
}

bool Engine::has_unfinished() const {
  return outputs_->has_unfinished() || outputs_pending_ || !ready_.empty() ||
         std::any_of(in_flight_plans_.begin(), in_flight_plans_.end(),
                     [](const sched::SchedulerOutput& p) { return !p.empty(); });
}

// vLLM's rule: each bad word as it would be tokenized at the start of a text and, with a space
// before it, in the middle of one (the second only where that gives other tokens of the same
// count, i.e. a word-initial variant of the same word).
void Engine::tokenize_bad_words(sample::SamplingParams& params) const {
  params.bad_words_token_ids.clear();
  for (const std::string& word : params.bad_words) {
    const std::string bare = word.substr(std::min(word.find_first_not_of(' '), word.size()));
    if (bare.empty()) continue;
    std::vector<int32_t> first = tokenizer_->encode(bare, false, false);
    if (first.empty()) continue;
    std::vector<int32_t> spaced = tokenizer_->encode(" " + bare, false, false);
    params.bad_words_token_ids.push_back(first);
    if (!spaced.empty() && spaced.size() == first.size() && spaced[0] != first[0])
      params.bad_words_token_ids.push_back(std::move(spaced));
  }
}

Status Engine::add_request(EngineRequest request) {
  const sample::SamplingParams& params = request.params;
  VESPER_TRY(params.validate());
  if (outputs_->contains(request.request_id))
    return make_error("request id \"" + request.request_id + "\" is already in use");
  if (request.prompt_token_ids.empty()) return make_error("the prompt is empty");
  const std::string vocab_range = "(0.." + std::to_string(tokenizer_->n_vocab() - 1) + ")";
  for (int32_t t : request.prompt_token_ids)
    if (!tokenizer_->is_valid(t))
      return make_error("prompt token id " + std::to_string(t) + " is outside the vocabulary " +
                        vocab_range);
  for (const auto& [t, bias] : params.logit_bias)
    if (!tokenizer_->is_valid(t))
      return make_error("logit_bias token id " + std::to_string(t) + " is outside the vocabulary " +
                        vocab_range);
  for (int32_t t : params.allowed_token_ids)
    if (!tokenizer_->is_valid(t))
      return make_error("allowed_token_ids: token id " + std::to_string(t) +
                        " is outside the vocabulary " + vocab_range);
  if (!params.allowed_token_ids.empty() && params.min_tokens > 0) {
    // min_tokens bans what ends a sequence; if that is all the request allows, nothing is left
    // to draw from for its first tokens.
    const std::vector<int32_t>& eog = tokenizer_->eog_ids();
    auto ends = [&](int32_t t) {
      return std::find(eog.begin(), eog.end(), t) != eog.end() ||
             std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), t) !=
                 params.stop_token_ids.end();
    };
    if (std::all_of(params.allowed_token_ids.begin(), params.allowed_token_ids.end(), ends))
      return make_error(
          "allowed_token_ids allows only tokens that end the sequence (end of "
          "generation or stop_token_ids), which min_tokens " +
          std::to_string(params.min_tokens) + " forbids for the first " +
          std::to_string(params.min_tokens) + " tokens: nothing could be sampled");
  }
  tokenize_bad_words(request.params);
  if (!request.lora_name.empty() &&
      (adapters_ == nullptr || !adapters_->contains(request.lora_name)))
    return make_error(adapters_ == nullptr || !adapters_->config().enable_lora
                          ? "adapters are not enabled (--enable-lora); no adapter '" +
                                request.lora_name + "'"
                          : "no adapter named '" + request.lora_name + "'");
  const double now = now_seconds();
  const auto prompt_len = static_cast<int64_t>(request.prompt_token_ids.size());
  if (params.max_tokens == 0) {
    // Nothing to generate (e.g. echo-only completions): finished at once, never scheduled.
    if (prompt_len > scheduler_->config().max_model_len)
      return make_error("the prompt has " + std::to_string(prompt_len) +
                        " tokens, more than --max-model-len " +
                        std::to_string(scheduler_->config().max_model_len));
    outputs_->add_finished(request, now);
    totals_.prompt_tokens += prompt_len;
    return {};
  }
  // Each of the n samples draws from its own stream, derived from the request's seed (drawn here
  // when it has none, so that a runner in another process draws the same).
  const uint64_t base_seed = params.seed ? *params.seed : seeds_();
  auto sample_seed = [&](int32_t k) {
    return base_seed + static_cast<uint64_t>(k) * 0x9E3779B97F4A7C15ull;
  };
  sched::Sequence seq;
  seq.id = next_seq_id_;
  seq.tokens = request.prompt_token_ids;
  seq.num_prompt_tokens = prompt_len;
  seq.max_total_tokens = prompt_len + params.max_tokens;
  seq.priority = request.priority;
  seq.arrival = next_arrival_;
  seq.cache_salt = params.cache_salt;
  seq.skip_prefix_cache_read = params.skip_reading_prefix_cache;
  seq.sampling = {std::make_shared<const sample::SamplingParams>(request.params), sample_seed(0)};
  // Samples 1..n-1 are forked in the step that completes the prompt: their ids now.
  for (int32_t k = 1; k < params.n; ++k) seq.forks.push_back({seq.id, seq.id + k, sample_seed(k)});
  if (!request.lora_name.empty()) {
    // Held, not loaded: a copy is read when the sequence first runs (the scheduler pins it).
    VESPER_ASSIGN_OR_RETURN(seq.adapter_id, adapters_->hold(request.lora_name));
  }
  const uint64_t adapter_id = seq.adapter_id;
  if (Status added = scheduler_->add(std::move(seq)); !added) {
    if (adapter_id != 0) adapters_->unhold(adapter_id);
    return added;
  }
  ++next_arrival_;
  const int32_t n = params.n;
  outputs_->add(std::move(request), next_seq_id_, now);
  next_seq_id_ += n;
  totals_.prompt_tokens += prompt_len;
  return {};
}

void Engine::remove_sequence(sched::SeqId id, int64_t num_valid_tokens) {
  const sched::Sequence* seq = scheduler_->find(id);
  if (seq == nullptr) return;
  if (seq->adapter_id != 0) adapters_->unhold(seq->adapter_id);
  scheduler_->remove(id, num_valid_tokens);
}

void Engine::deliver(std::vector<RequestOutput> outputs) {
  if (outputs.empty()) return;
  if (sink_) {
    sink_(outputs);
    return;
  }
  if (ready_.empty()) {
    ready_ = std::move(outputs);
    return;
  }
  ready_.insert(ready_.end(), std::make_move_iterator(outputs.begin()),
                std::make_move_iterator(outputs.end()));
}

void Engine::process_pending_tokens() {
  job_tokens_ = outputs_->process(pending_output_, step_sampled_at_, text_finishes_);
}

void Engine::process_pending_outputs() {
  const auto start = std::chrono::steady_clock::now();
  process_pending_tokens();
  deliver(outputs_->take_outputs(now_seconds()));
  job_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void Engine::launch_output_work() {
  if (!outputs_pending_) return;
  output_thread_->launch([this] { process_pending_outputs(); });
}

void Engine::finish_output_work() {
  if (output_thread_) output_thread_->wait();
  if (!outputs_pending_) return;
  outputs_pending_ = false;
  totals_.generation_tokens += job_tokens_;
  // Sequences a stop string ended leave now, keeping nothing after the stop.
  for (const OutputProcessor::TextFinish& f : text_finishes_)
    remove_sequence(f.seq_id, f.num_tokens);
  text_finishes_.clear();
}

std::vector<RequestOutput> Engine::step() {
  std::vector<RequestOutput> outs = plans_ahead() ? step_ahead() : step_in_order();
  // Nothing could run while an adapter's copy is read on its own thread: idle a moment rather
  // than spin on empty plans.
  if (scheduler_->waited_on_adapter() && !last_step_computed_)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!ready_.empty()) {
    outs = std::move(ready_);
    ready_.clear();
  }
  return outs;
}

void Engine::hold_outputs(sched::ModelRunnerOutput& output, PhaseClock& clock) {
  std::swap(pending_output_, output);
  outputs_pending_ = true;
  step_sampled_at_ = now_seconds();
  if (output_thread_) return;
  process_pending_outputs();
  finish_output_work();
  clock.lap(StepPhase::kOutput);
}

void Engine::take_runner_result(const Status& ran, StepPhaseTimes& phases) {
  VESPER_CHECK(ran.ok(), "the runner refused its scheduler's plan: %s",
               ran.error().message.c_str());
  phases += runner_->phase_seconds();
  totals_.num_passes += runner_->num_passes();
}

void Engine::take_output_job(bool overlapped, StepPhaseTimes& phases, PhaseClock& clock) {
  clock.restart();
  if (!overlapped && outputs_pending_) process_pending_outputs();
  finish_output_work();
  phases[StepPhase::kOutput] += job_seconds_;
  clock.restart();
}

void Engine::end_step(bool computed, bool overlapped, StepPhaseTimes& phases, PhaseClock& clock) {
  clock.lap(StepPhase::kSchedule);
  last_step_computed_ = computed;
  if (computed) {
    hold_outputs(step_output_, clock);
    totals_.phase_seconds += phases;
    totals_.last_step_phase_seconds = phases;
  } else if (!overlapped) {
    // Nothing ran an output job this call: what finished otherwise (max_tokens 0, aborts at a
    // failed adapter) is reported now.
    deliver(outputs_->take_outputs(now_seconds()));
  }
}

std::vector<RequestOutput> Engine::step_in_order() {
  StepPhaseTimes phases;
  PhaseClock clock(phases);
  sched::SchedulerOutput plan = scheduler_->schedule();
  clock.lap(StepPhase::kSchedule);
  const double scheduled_at = now_seconds();
  // The previous step's outputs are processed on the output thread while this one computes; with
  // nothing to compute, here.
  const bool overlap = output_thread_ && outputs_pending_ && !plan.empty();
  job_seconds_ = 0;
  if (overlap) launch_output_work();
  take_runner_result(runner_->execute(plan, step_output_), phases);
  take_output_job(overlap, phases, clock);
  record_plan(plan, scheduled_at);
  apply_output(plan, step_output_);
  end_step(!plan.empty(), overlap, phases, clock);
  return {};
}

std::vector<RequestOutput> Engine::step_ahead() {
  StepPhaseTimes phases;
  PhaseClock clock(phases);
  // The next plan, made while the runner computes the ones in flight (the samples of its
  // sequences' last plan are placeholders the runner fills in itself). A pipeline's leader keeps
  // a plan in flight a stage, each of its own virtual engine's sequences.
  sched::SchedulerOutput plan = scheduler_->schedule();
  clock.lap(StepPhase::kSchedule);
  const double scheduled_at = now_seconds();
  const bool overlap = output_thread_ && outputs_pending_;
  job_seconds_ = 0;
  if (overlap) launch_output_work();
  sched::SchedulerOutput done;
  bool completed = false;
  if (in_flight_) {
    runner_thread_->wait();
    take_runner_result(runner_status_, phases);
    // Once as many plans are in flight as the pipeline is deep, each job finishes the oldest.
    if (static_cast<int>(in_flight_plans_.size()) == pipeline_depth_) {
      std::swap(step_output_, runner_output_);
      done = std::move(in_flight_plans_.front());
      in_flight_plans_.pop_front();
      completed = true;
    }
  }
  // The runner goes on with the next plan at once.
  in_flight_plans_.push_back(std::move(plan));
  in_flight_ = true;
  runner_thread_->launch([this] {
    if (pipeline_depth_ == 1) {
      runner_status_ = runner_->execute(in_flight_plans_.back(), runner_output_);
      return;
    }
    runner_status_ = runner_->launch(in_flight_plans_.back());
    if (runner_status_.ok() && static_cast<int>(in_flight_plans_.size()) == pipeline_depth_)
      runner_->finish(in_flight_plans_.front(), runner_output_);
  });
  take_output_job(overlap, phases, clock);
  record_plan(in_flight_plans_.back(), scheduled_at);
  if (completed) apply_output(done, step_output_);
  end_step(completed && !done.empty(), overlap, phases, clock);
  return {};
}

void Engine::record_plan(const sched::SchedulerOutput& plan, double scheduled_at) {
  // Admissions that failed for good (an adapter whose file no longer reads): their requests end
  // now (siblings included).
  for (const sched::FailedSequence& f : plan.failed) {
    log_error("%s; its requests are aborted", f.message.c_str());
    // The scheduler dropped it already: its registration is let go here, its siblings by abort.
    if (f.adapter_id != 0) adapters_->unhold(f.adapter_id);
    const OutputProcessor::RequestState* request = outputs_->owner(f.id, nullptr);
    if (request == nullptr) continue;  // a sibling already aborted it
    RequestOutput last;
    if (abort(request->request.request_id, &last)) deliver({std::move(last)});
  }
  for (const sched::SeqId id : plan.preempted) outputs_->on_preempted(id);
  for (const sched::ForkData& f : plan.forks) {
    outputs_->fork(f.parent, f.child);
    if (const sched::Sequence* child = scheduler_->find(f.child); child && child->adapter_id != 0)
      adapters_->hold_again(child->adapter_id);
  }
  if (plan.empty()) return;
  ++totals_.num_steps;
  totals_.kivi_groups_quantized +=
      kv::count_block_ops(plan.block_ops, kv::BlockOp::Kind::kQuantizeGroup);
  totals_.max_batched_tokens_seen =
      std::max(totals_.max_batched_tokens_seen, plan.num_batched_tokens);
  bool partial_prefill = false;
  for (const sched::ScheduledSequence& s : plan.scheduled) {
    const sched::Sequence* seq = scheduler_->find(s.id);
    const bool decode =
        seq != nullptr && s.num_new_tokens == 1 && s.start >= seq->num_prompt_tokens && s.samples();
    if (!decode) totals_.prefill_tokens_computed += s.num_new_tokens;
    if (!s.samples()) partial_prefill = true;
    // Where the first step starts: the prefix-cache hit.
    outputs_->on_first_scheduled(s.id, s.start, scheduled_at);
  }
  if (partial_prefill) ++totals_.num_chunked_prefill_steps;
}

void Engine::apply_output(const sched::SchedulerOutput& plan,
                          const sched::ModelRunnerOutput& output) {
  for (const sched::SampledSequence& r : output.sequences) {
    if (r.num_proposals == 0 || scheduler_->find(r.id) == nullptr) continue;
    ++totals_.spec_num_drafts;
    totals_.spec_num_draft_tokens += r.num_proposals;
    totals_.spec_num_accepted_tokens += r.num_accepted;
    for (int64_t j = 0; j < r.num_accepted; ++j) ++totals_.spec_accepted_per_pos[j];
  }
  // The scheduler removes the sequences a token ended; their adapter registrations go with them.
  std::vector<uint64_t> released;
  for (const sched::SampledSequence& r : output.sequences)
    if (r.finished)
      if (const sched::Sequence* seq = scheduler_->find(r.id); seq && seq->adapter_id != 0)
        released.push_back(seq->adapter_id);
  scheduler_->update(plan, output);
  for (const uint64_t adapter : released) adapters_->unhold(adapter);
}

bool Engine::abort(const std::string& request_id, RequestOutput* final_output) {
  // What the request generated so far reaches its last output (the other requests' new tokens
  // are reported by the next step, in order).
  if (outputs_pending_) {
    process_pending_tokens();
    finish_output_work();
  }
  auto seqs = outputs_->abort(request_id, final_output, now_seconds());
  if (!seqs) return false;
  for (sched::SeqId id : *seqs) remove_sequence(id);
  return true;
}

EngineStats Engine::stats() const {
  EngineStats s = totals_;
  const sched::SchedulerStats ss = scheduler_->stats();
  s.num_running = ss.num_running;
  s.num_waiting = ss.num_waiting;
  s.num_swapped = ss.num_swapped;
  s.num_preemptions = ss.num_preemptions;
  s.num_swap_outs = ss.num_swap_outs;
  s.num_recomputes = ss.num_recomputes;
  s.prefix_cache_queries = ss.prefix_cache_queries;
  s.prefix_cache_hits = ss.prefix_cache_hits;
  s.kv_blocks_cached = kv_->device_pool().num_cached();
  s.kv_blocks_evictable = kv_->device_pool().num_evictable();
  s.prefix_cache_evictions = kv_->device_pool().num_evictions();
  s.num_requests = outputs_->num_requests();
  s.kv_blocks_total = kv_->device_pool().num_blocks();
  s.kv_blocks_used = kv_->device_pool().num_used();
  s.swap_blocks_used = kv_->host_pool().num_used();
  s.grammar_masks_prefetched = runner_->grammar_masks_prefetched();
  if (adapters_) {
    s.lora_enabled = true;
    s.max_loras = adapters_->config().max_loras;
    s.adapter_loads = adapters_->num_loads();
    // Distinct ids first (a few), names after: no string work per sequence.
    std::vector<uint64_t> running, waiting;
    scheduler_->for_each_sequence([&](const sched::Sequence& seq) {
      if (seq.adapter_id == 0) return;
      auto& ids = seq.status == sched::SeqStatus::kRunning ? running : waiting;
      if (std::find(ids.begin(), ids.end(), seq.adapter_id) == ids.end())
        ids.push_back(seq.adapter_id);
    });
    for (const uint64_t id : running) s.running_adapters.push_back(adapters_->name_of(id));
    for (const uint64_t id : waiting) s.waiting_adapters.push_back(adapters_->name_of(id));
    std::sort(s.running_adapters.begin(), s.running_adapters.end());
    std::sort(s.waiting_adapters.begin(), s.waiting_adapters.end());
  }
  return s;
}

Engine::Phase Engine::phase(const std::string& request_id) const {
  const kv::SeqId first = outputs_->first_sequence(request_id);
  const sched::Sequence* seq = first == 0 ? nullptr : scheduler_->find(first);
  if (seq == nullptr) return Phase::kUnknown;
  switch (seq->status) {
    case sched::SeqStatus::kWaiting:
      return Phase::kWaiting;
    case sched::SeqStatus::kSwapped:
      return Phase::kSwapped;
    case sched::SeqStatus::kRunning:
      return seq->in_prefill() ? Phase::kPrefilling : Phase::kDecoding;
    default:
      return Phase::kUnknown;
  }
}

void Engine::check_invariants() const {
  scheduler_->check_invariants();
}

}  // namespace vesper::engine
