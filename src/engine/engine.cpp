#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/logging.h"

namespace vesper::engine {
namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  std::unique_ptr<Engine> e(new Engine());
  e->config_ = config;
  VESPER_ASSIGN_OR_RETURN(e->model_, model::Model::load(config.model_path));
  VESPER_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok,
                          tokenizer::Tokenizer::from_gguf(e->model_->file()));
  e->tokenizer_.emplace(std::move(tok));
  const model::ModelConfig& mc = e->model_->config();
  sched::SchedulerConfig& sc = e->config_.scheduler;
  if (sc.max_model_len <= 0) sc.max_model_len = mc.context_length;
  if (sc.max_model_len > mc.context_length)
    return make_error("--max-model-len " + std::to_string(sc.max_model_len) +
                      " exceeds the model's context length " + std::to_string(mc.context_length) +
                      " (" + config.model_path + ")");
  if (sc.max_num_batched_tokens <= 0)
    return make_error("--max-num-batched-tokens must be positive");
  if (sc.max_num_seqs <= 0) return make_error("--max-num-seqs must be positive");
  int64_t weight_bytes = 0;
  for (const auto& t : e->model_->file().tensors())
    weight_bytes += static_cast<int64_t>(t.size_bytes);
  VESPER_ASSIGN_OR_RETURN(
      e->plan_, plan_memory(mc, weight_bytes, config.cache, sc.max_model_len, sc.max_num_seqs));
  const int threads = config.threads > 0 ? config.threads : ThreadPool::hardware_threads();
  e->pool_ = std::make_unique<ThreadPool>(threads);
  e->kv_ =
      std::make_unique<kv::KvCacheManager>(e->plan_.num_blocks, e->plan_.num_swap_blocks,
                                           e->plan_.block_size, config.cache.enable_prefix_caching);
  e->scheduler_ = std::make_unique<sched::Scheduler>(sc, *e->kv_);
  e->runner_ = std::make_unique<ModelRunner>(
      *e->model_, e->plan_.num_blocks, e->plan_.num_swap_blocks, e->plan_.block_size, *e->pool_);
  log_info(
      "model %s: %s, %lld layers, n_embd %lld, %lld heads (%lld kv, head size %lld), vocab %lld, "
      "context %lld",
      config.model_path.c_str(), mc.arch.name.c_str(), static_cast<long long>(mc.n_layer),
      static_cast<long long>(mc.n_embd), static_cast<long long>(mc.n_head),
      static_cast<long long>(mc.n_head_kv), static_cast<long long>(mc.head_dim),
      static_cast<long long>(mc.n_vocab), static_cast<long long>(mc.context_length));
  log_info("%s", e->plan_.describe().c_str());
  log_info(
      "scheduler: max-num-batched-tokens %lld, max-num-seqs %lld, max-model-len %lld, chunked "
      "prefill %s, "
      "preemption mode %s, prefix caching %s; %d threads",
      static_cast<long long>(sc.max_num_batched_tokens), static_cast<long long>(sc.max_num_seqs),
      static_cast<long long>(sc.max_model_len), sc.enable_chunked_prefill ? "on" : "off",
      sc.preemption_mode == sched::PreemptionMode::kSwap ? "swap" : "recompute",
      config.cache.enable_prefix_caching ? "on" : "off", threads);
  return e;
}

sample::SamplingParams Engine::child_params(const sample::SamplingParams& params,
                                            int32_t index) const {
  sample::SamplingParams p = params;
  // Each parallel sample draws from its own stream, derived from the request's seed.
  if (p.seed) p.seed = *p.seed + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull;
  return p;
}

Status Engine::add_request(const std::string& request_id, std::vector<int32_t> prompt,
                           const sample::SamplingParams& params, int32_t priority) {
  VESPER_TRY(params.validate());
  if (requests_.count(request_id) != 0)
    return make_error("request id \"" + request_id + "\" is already in use");
  if (prompt.empty()) return make_error("the prompt is empty");
  for (int32_t t : prompt)
    if (!tokenizer_->is_valid(t))
      return make_error("prompt token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                        std::to_string(tokenizer_->n_vocab() - 1) + ")");
  auto req = std::make_unique<RequestState>();
  req->id = request_id;
  req->prompt = prompt;
  req->params = params;
  req->priority = priority;
  req->metrics.arrival_time = now_seconds();

  sched::Sequence seq;
  seq.id = next_seq_id_;
  seq.tokens = std::move(prompt);
  seq.num_prompt_tokens = seq.num_tokens();
  seq.max_total_tokens = seq.num_tokens() + params.max_tokens;
  seq.priority = priority;
  seq.arrival = next_arrival_;
  seq.cache_salt = params.cache_salt;
  seq.skip_prefix_cache_read = params.skip_reading_prefix_cache;
  if (params.max_tokens == 0) {
    // Nothing to generate (e.g. echo-only completions): finished at once, never scheduled.
    if (seq.num_tokens() > scheduler_->config().max_model_len)
      return make_error("the prompt has " + std::to_string(seq.num_tokens()) +
                        " tokens, more than --max-model-len " +
                        std::to_string(scheduler_->config().max_model_len));
    RequestOutput out;
    out.request_id = request_id;
    out.prompt_token_ids = req->prompt;
    out.finished = true;
    out.metrics = req->metrics;
    out.metrics.finished_time = out.metrics.arrival_time;
    for (int32_t i = 0; i < params.n; ++i) {
      CompletionOutput c;
      c.index = i;
      c.finish_reason = "length";
      out.outputs.push_back(std::move(c));
    }
    finished_early_.push_back(std::move(out));
    totals_.prompt_tokens += static_cast<int64_t>(req->prompt.size());
    return {};
  }
  VESPER_TRY(scheduler_->add(std::move(seq)));
  ++next_seq_id_;
  ++next_arrival_;
  SequenceState s;
  s.seq_id = next_seq_id_ - 1;
  s.sampler = std::make_unique<sample::Sampler>(child_params(req->params, 0));
  s.output = std::make_unique<SequenceOutput>(*tokenizer_, req->params, 0);
  req->seqs.push_back(std::move(s));
  seq_owner_[next_seq_id_ - 1] = {req.get(), 0};
  totals_.prompt_tokens += static_cast<int64_t>(req->prompt.size());
  requests_.emplace(request_id, std::move(req));
  return {};
}

void Engine::sample_sequence(RequestState& req, SequenceState& s, const float* logits,
                             bool /*first_sample*/) {
  const int64_t n_vocab = model_->config().n_vocab;
  scratch_logits_.assign(logits, logits + n_vocab);
  std::span<float> row(scratch_logits_);
  const sample::SamplingParams& p = req.params;
  if (s.output->num_generated() < p.min_tokens) {
    for (int32_t id : tokenizer_->eog_ids()) row[id] = -INFINITY;
    for (int32_t id : p.stop_token_ids)
      if (id >= 0 && id < n_vocab) row[id] = -INFINITY;
  }
  const sched::Sequence* seq = scheduler_->find(s.seq_id);
  std::span<const int32_t> prompt(seq->tokens.data(), seq->num_prompt_tokens);
  std::span<const int32_t> output(seq->tokens.data() + seq->num_prompt_tokens,
                                  seq->num_tokens() - seq->num_prompt_tokens);
  const int32_t token = s.sampler->sample(row, prompt, output);
  std::optional<LogprobEntry> lp;
  if (p.logprobs >= 0) {
    lp = sample::compute_logprobs(std::span<const float>(logits, n_vocab), token, p.logprobs,
                                  logprob_scratch_);
  }
  scheduler_->append_token(s.seq_id, token);
  ++totals_.generation_tokens;
  const bool at_limit =
      scheduler_->find(s.seq_id)->num_tokens() >= scheduler_->config().max_model_len;
  s.output->add_token(token, lp ? &*lp : nullptr, at_limit);
  req.updated = true;
  const double t = now_seconds();
  if (req.metrics.first_token_time == 0) req.metrics.first_token_time = t;
  req.metrics.last_token_time = t;
}

void Engine::finish_sequence_if_done(RequestState&, SequenceState& s) {
  if (!s.output->finished()) return;
  if (scheduler_->find(s.seq_id) != nullptr) {
    scheduler_->remove(s.seq_id);
    seq_owner_.erase(s.seq_id);
  }
}

RequestOutput Engine::make_output(RequestState& req) {
  RequestOutput out;
  out.request_id = req.id;
  out.prompt_token_ids = req.prompt;
  out.num_cached_tokens = req.num_cached_tokens;
  out.finished = static_cast<int32_t>(req.seqs.size()) == req.params.n;
  for (auto& s : req.seqs) {
    out.outputs.push_back(s.output->take_output());
    out.finished = out.finished && s.output->finished();
  }
  if (out.finished) req.metrics.finished_time = now_seconds();
  out.metrics = req.metrics;
  return out;
}

std::vector<RequestOutput> Engine::step() {
  std::vector<RequestOutput> outputs = std::move(finished_early_);
  finished_early_.clear();
  sched::SchedulerOutput plan = scheduler_->schedule();
  if (plan.empty()) return outputs;
  ++totals_.num_steps;
  totals_.max_batched_tokens_seen =
      std::max(totals_.max_batched_tokens_seen, plan.num_batched_tokens);
  bool partial_prefill = false;
  const double t = now_seconds();
  for (const auto& s : plan.scheduled) {
    const sched::Sequence* seq = scheduler_->find(s.id);
    const bool decode = s.num_new_tokens == 1 && s.start >= seq->num_prompt_tokens && s.samples;
    if (!decode) totals_.prefill_tokens_computed += s.num_new_tokens;
    if (!s.samples) partial_prefill = true;
    RequestState* req = seq_owner_.at(s.id).first;
    if (req->metrics.first_scheduled_time == 0) {
      req->metrics.first_scheduled_time = t;
      req->num_cached_tokens = s.start;  // where the first step starts: the prefix-cache hit
    }
  }
  if (partial_prefill) ++totals_.num_chunked_prefill_steps;
  for (sched::SeqId id : plan.preempted)
    if (auto it = seq_owner_.find(id); it != seq_owner_.end())
      ++it->second.first->metrics.num_preemptions;

  runner_->execute(plan, *scheduler_);

  std::vector<RequestState*> touched;
  const auto& sampled = runner_->sampled_ids();
  for (size_t i = 0; i < sampled.size(); ++i) {
    auto [req, index] = seq_owner_.at(sampled[i]);
    const float* logits = runner_->logits_row(i);
    const sched::SeqId parent_id = req->seqs[index].seq_id;
    // n > 1: the first sample of sequence 0 forks the other samples, which share the prompt's
    // blocks and draw their first tokens from the same logits.
    const bool fork_now = index == 0 && static_cast<int32_t>(req->seqs.size()) < req->params.n;
    if (fork_now) {
      for (int32_t k = 1; k < req->params.n; ++k) {
        SequenceState child;
        child.seq_id = next_seq_id_++;
        child.sampler = std::make_unique<sample::Sampler>(child_params(req->params, k));
        child.output = std::make_unique<SequenceOutput>(*tokenizer_, req->params, k);
        scheduler_->fork(parent_id, child.seq_id);
        seq_owner_[child.seq_id] = {req, k};
        req->seqs.push_back(std::move(child));
      }
    }
    sample_sequence(*req, req->seqs[index], logits, fork_now);
    if (fork_now)
      for (int32_t k = 1; k < req->params.n; ++k) sample_sequence(*req, req->seqs[k], logits, true);
    for (auto& seq_state : req->seqs) finish_sequence_if_done(*req, seq_state);
    if (std::find(touched.begin(), touched.end(), req) == touched.end()) touched.push_back(req);
  }
  for (RequestState* req : touched) {
    RequestOutput out = make_output(*req);
    const bool done = out.finished;
    const std::string id = req->id;
    outputs.push_back(std::move(out));
    if (done) requests_.erase(id);
  }
  return outputs;
}

bool Engine::abort(const std::string& request_id, RequestOutput* final_output) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return false;
  RequestState& req = *it->second;
  for (auto& s : req.seqs) {
    scheduler_->remove(s.seq_id);
    seq_owner_.erase(s.seq_id);
    if (!s.output->finished()) s.output->abort();
  }
  if (final_output != nullptr) {
    // Samples not forked yet (n > 1 before the prompt's first token) end with nothing generated.
    for (auto k = static_cast<int32_t>(req.seqs.size()); k < req.params.n; ++k) {
      SequenceState unborn;
      unborn.output = std::make_unique<SequenceOutput>(*tokenizer_, req.params, k);
      unborn.output->abort();
      req.seqs.push_back(std::move(unborn));
    }
    *final_output = make_output(req);
  }
  requests_.erase(it);
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
  s.num_requests = static_cast<int64_t>(requests_.size());
  s.kv_blocks_total = kv_->device_pool().num_blocks();
  s.kv_blocks_used = kv_->device_pool().num_used();
  s.swap_blocks_used = kv_->host_pool().num_used();
  return s;
}

Engine::Phase Engine::phase(const std::string& request_id) const {
  auto it = requests_.find(request_id);
  if (it == requests_.end() || it->second->seqs.empty()) return Phase::kUnknown;
  const sched::Sequence* seq = scheduler_->find(it->second->seqs[0].seq_id);
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
