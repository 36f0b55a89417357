#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "backend/cpu_backend.h"
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
  e->backend_ = std::make_unique<backend::CpuBackend>(config.threads);
  VESPER_ASSIGN_OR_RETURN(e->model_, model::Model::load(config.model_path, *e->backend_));
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
  if (config.lora.any()) {
    e->adapters_ = std::make_unique<lora::AdapterRegistry>(config.lora, mc, *e->backend_);
    VESPER_TRY(e->adapters_->init());
    e->model_->set_adapters(e->adapters_.get());
    sc.max_loras = config.lora.max_loras;
  }
  const SpeculativeConfig& spec_config = e->config_.speculative;
  if (spec_config.method == SpeculativeConfig::Method::kDraftModel) {
    VESPER_ASSIGN_OR_RETURN(
        e->draft_, spec::DraftModelProposer::load(spec_config.model, *e->backend_, *e->tokenizer_));
    for (const auto& t : e->draft_->model().file().tensors())
      weight_bytes += static_cast<int64_t>(t.size_bytes);
    // The tables cover the positions the draft writes its proposals at, past what the target
    // computes.
    sc.num_lookahead_slots = spec_config.num_speculative_tokens;
  }
  if (spec_config.method == SpeculativeConfig::Method::kMedusa) {
    // Sized per step, the proposals are chains (the policy models a chain's acceptance).
    if (spec_config.auto_num_speculative_tokens) e->config_.speculative.medusa_tree = false;
    VESPER_ASSIGN_OR_RETURN(e->medusa_,
                            spec::MedusaProposer::load(spec_config.model, *e->backend_, mc.n_embd,
                                                       mc.n_vocab, e->model_->weights().output.type,
                                                       e->config_.speculative.medusa_tree));
    weight_bytes += e->medusa_->heads().weight_bytes();
    // Auto-sized chains: at most one proposal per head.
    if (spec_config.auto_num_speculative_tokens)
      e->config_.speculative.num_speculative_tokens =
          std::min(spec_config.num_speculative_tokens, e->medusa_->heads().num_heads());
  }
  // The largest step the scheduler can plan: its token budget, a logits row for each sequence
  // it can seat (and for each token, with speculative rows), every seated sequence's whole table.
  const int64_t blocks_per_seq =
      (sc.max_model_len + config.cache.block_size - 1) / config.cache.block_size;
  const SpeculativeConfig& spec = e->config_.speculative;
  const backend::KvDtypes kv_dtypes = config.cache.kv_dtypes;
  const bool kivi = kv_is_kivi(kv_dtypes.k) || kv_is_kivi(kv_dtypes.v);
  // A tree row at depth d reads the groups older than its position + 1 - R quantized: none of its
  // own path when R exceeds the deepest row's depth (one level per head).
  if (kivi && e->medusa_) {
    const int64_t depth =
        std::min<int64_t>(spec.num_speculative_tokens, e->medusa_->heads().num_heads());
    if (config.cache.kivi_residual_length <= depth)
      return make_error("--kivi-residual-length " +
                        std::to_string(config.cache.kivi_residual_length) +
                        ": Medusa's candidate trees here are " + std::to_string(depth) +
                        " deep, and need a longer residual window");
  }
  if (spec.enabled()) {
    if (spec.num_speculative_tokens < 1)
      return make_error(
          "--num-speculative-tokens must be at least 1 with speculative decoding, got " +
          std::to_string(spec.num_speculative_tokens));
    if (spec.ngram.min_n < 1 || spec.ngram.max_n < spec.ngram.min_n)
      return make_error("--ngram-prompt-lookup-min " + std::to_string(spec.ngram.min_n) +
                        " and --ngram-prompt-lookup-max " + std::to_string(spec.ngram.max_n) +
                        ": need 1 <= min <= max");
  }
  model::StepCapacity capacity;
  capacity.tokens = sc.max_num_batched_tokens;
  capacity.seqs = std::min(sc.max_num_seqs, sc.max_num_batched_tokens);
  // A logits row per seated sequence, and one more per speculative token it verifies.
  const int64_t rows_per_seq = 1 + (spec.enabled() ? spec.num_speculative_tokens : 0);
  capacity.logits_rows = std::min(sc.max_num_batched_tokens, capacity.seqs * rows_per_seq);
  std::vector<backend::KvCacheSpec> kv_specs = {
      e->model_->kv_spec(config.cache.block_size, config.cache.kv_dtypes)};
  kv_specs[0].kivi_residual_length = config.cache.kivi_residual_length;
  // KIVI: a group's residual rows take several table entries.
  capacity.table_entries =
      capacity.seqs * (blocks_per_seq * kv_specs[0].residual_blocks_per_group() + 1);
  int64_t activation_bytes = model::Model::activation_bytes(mc, capacity);
  if (e->draft_) {
    kv_specs.push_back(e->draft_->kv_spec(config.cache.block_size, config.cache.kv_dtypes));
    // KIVI: the draft's cache follows the target's tables, so its blocks hold as many residual
    // rows as the target's.
    kv_specs[1].kivi_residual_length = kv_specs[0].kivi_residual_length;
    if (kivi) kv_specs[1].residual_rows = kv_specs[0].residual_rows_per_block();
    activation_bytes += model::Model::activation_bytes(e->draft_->model().config(), capacity);
  }
  const int64_t adapter_bytes = e->adapters_ ? e->adapters_->budget_bytes() : 0;
  VESPER_ASSIGN_OR_RETURN(
      e->plan_, plan_memory(kv_specs, weight_bytes + adapter_bytes, activation_bytes, config.cache,
                            sc.max_model_len, sc.max_num_seqs));
  e->plan_.adapter_bytes = adapter_bytes;
  e->model_->reserve(capacity);
  e->kv_ = std::make_unique<kv::KvCacheManager>(e->plan_.num_blocks, e->plan_.num_swap_blocks,
                                                e->plan_.block_size,
                                                e->config_.cache.enable_prefix_caching);
  if (kivi)
    e->kv_->enable_kivi(kv_specs[0].residual_rows_per_block(), config.cache.kivi_residual_length);
  e->scheduler_ = std::make_unique<sched::Scheduler>(sc, *e->kv_);
  // KIVI: the draft's rows of a group are quantized with the target's, so a group waits for them.
  if (kivi && e->draft_)
    e->scheduler_->set_companion_rows(
        [draft = e->draft_.get()](sched::SeqId id) { return draft->written(id); });
  e->runner_ = std::make_unique<ModelRunner>(*e->model_, kv_specs[0], e->plan_.num_blocks,
                                             e->plan_.num_swap_blocks);
  if (e->draft_) {
    e->draft_->allocate(kv_specs[1], e->plan_.num_blocks, e->plan_.num_swap_blocks, capacity.tokens,
                        capacity.seqs, capacity.table_entries);
    e->runner_->add_companion_storage(e->draft_->device_kv(), e->draft_->host_kv());
  }
  e->outputs_ = std::make_unique<OutputProcessor>(*e->tokenizer_, sc.max_model_len);
  e->sampler_ = std::make_unique<sample::BatchSampler>(static_cast<int32_t>(mc.n_vocab));
  if (spec.enabled()) {
    e->verifier_ = std::make_unique<sample::SpeculativeVerifier>(static_cast<int32_t>(mc.n_vocab));
    e->totals_.spec_accepted_per_pos.assign(static_cast<size_t>(spec.num_speculative_tokens), 0);
  }
  if (spec.enabled() && spec.auto_num_speculative_tokens) {
    using Cost = SpeculationPolicy::ProposerCost;
    e->policy_ = std::make_unique<SpeculationPolicy>(spec.num_speculative_tokens,
                                                     e->draft_    ? Cost::kPassPerToken
                                                     : e->medusa_ ? Cost::kOnePass
                                                                  : Cost::kFree);
    e->calibrate_speculation();
  }
  // After every warm-up pass (the speculation timing above writes synthetic rows): the first
  // requests' rows set the scales.
  if (config.cache.calculate_kv_scales) e->backend_->calibrate_kv_scales(e->runner_->device_kv());
  e->row_.resize(mc.n_vocab);
  log_info(
      "model %s: %s, %lld layers, n_embd %lld, %lld heads (%lld kv, head size %lld), vocab %lld, "
      "context %lld",
      config.model_path.c_str(), mc.arch.name.c_str(), static_cast<long long>(mc.n_layer),
      static_cast<long long>(mc.n_embd), static_cast<long long>(mc.n_head),
      static_cast<long long>(mc.n_head_kv), static_cast<long long>(mc.head_dim),
      static_cast<long long>(mc.n_vocab), static_cast<long long>(mc.context_length));
  log_info("%s", e->plan_.describe().c_str());
  if (config.cache.calculate_kv_scales)
    log_info(
        "KV cache: fp8 scales per layer and head, fixed from the first step's rows "
        "(--calculate-kv-scales)");
  log_info(
      "scheduler: max-num-batched-tokens %lld, max-num-seqs %lld, max-model-len %lld, chunked "
      "prefill %s, "
      "preemption mode %s, prefix caching %s; backend %s",
      static_cast<long long>(sc.max_num_batched_tokens), static_cast<long long>(sc.max_num_seqs),
      static_cast<long long>(sc.max_model_len), sc.enable_chunked_prefill ? "on" : "off",
      sc.preemption_mode == sched::PreemptionMode::kSwap ? "swap" : "recompute",
      e->config_.cache.enable_prefix_caching ? "on" : "off", e->backend_->describe().c_str());
  if (spec.enabled()) {
    std::string proposer;
    if (spec.method == SpeculativeConfig::Method::kNgram)
      proposer = "n-gram prompt lookup (n " + std::to_string(spec.ngram.min_n) + ".." +
                 std::to_string(spec.ngram.max_n) + ")";
    else if (e->draft_)
      proposer = "draft model " + spec.model + " (" +
                 std::to_string(e->draft_->model().config().n_layer) + " layers, n_embd " +
                 std::to_string(e->draft_->model().config().n_embd) + ")";
    else
      proposer = "Medusa heads " + e->medusa_->heads().path() + " (" +
                 std::to_string(e->medusa_->heads().num_heads()) + " heads in " +
                 std::string(tensor::type_name(e->medusa_->heads().weight_type())) + ", " +
                 (e->medusa_->tree() ? "a tree" : "a chain") + " of candidates)";
    const std::string off =
        spec.disable_by_batch_size > 0
            ? ", off above " + std::to_string(spec.disable_by_batch_size) + " requests"
            : "";
    std::string per_step = std::to_string(spec.num_speculative_tokens) + " tokens per step";
    if (e->policy_) {
      const double k1 = 1.0 + static_cast<double>(spec.num_speculative_tokens);
      char costs[160];
      std::snprintf(costs, sizeof costs,
                    " tokens per step (a target pass of 1 row %.2f ms, of %d rows %.2f ms)",
                    e->policy_->target_cost().at(1) * 1e3,
                    static_cast<int>(spec.num_speculative_tokens) + 1,
                    e->policy_->target_cost().at(k1) * 1e3);
      per_step = "auto: 0.." + std::to_string(spec.num_speculative_tokens) + costs;
    }
    log_info("speculative decoding: %s, %s, %s%s", proposer.c_str(), per_step.c_str(),
             std::string(sample::acceptance_method_name(spec.acceptance.method)).c_str(),
             off.c_str());
    if (e->policy_)
      log_info(
          "speculative decoding: measured target passes (rows: ms) %s; proposer (sequences: "
          "ms per token) %s",
          e->policy_->target_cost().describe().c_str(),
          e->policy_->proposer_cost().describe().c_str());
  }
  return e;
}

namespace {

// Seconds one pass of `rows` rows costs `m` (one sequence's prompt of that many tokens in the
// first blocks of `kv`, free at start): the best of two after a warm-up.
double time_pass(model::Model& m, backend::KvHandle kv, int64_t rows, int64_t block_size) {
  std::vector<int32_t> tokens(static_cast<size_t>(rows), 1), table;
  for (int64_t b = 0; b * block_size < rows; ++b) table.push_back(static_cast<int32_t>(b));
  model::ForwardBatch batch;
  batch.add_sequence(tokens, 0, table, block_size, 1);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const double start = now_seconds();
    m.forward(batch, kv);
    if (rep > 0) best = std::min(best, now_seconds() - start);
  }
  return best;
}

// Row counts the cost tables are measured at: every count up to 8 (where a step turns from
// memory- to compute-bound on these machines), then sparser, up to `limit`.
std::vector<int64_t> calibration_rows(int64_t limit) {
  std::vector<int64_t> rows;
  for (int64_t r : {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128})
    if (r <= limit) rows.push_back(r);
  return rows;
}

}  // namespace

void Engine::calibrate_speculation() {
  const int64_t bs = plan_.block_size;
  const int64_t limit =
      std::min<int64_t>({128, scheduler_->config().max_num_batched_tokens, plan_.num_blocks * bs});
  // What verifying a row costs besides the pass (the target's distribution over the vocabulary):
  // 8 rows of a sampled request, the best of three.
  const auto n_vocab = static_cast<size_t>(model_->config().n_vocab);
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
  double per_row = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const double start = now_seconds();
    verifier_->verify(sampled, config_.speculative.acceptance, rng,
                      sample::TokenHistory{none, none}, rows, proposals, {}, none);
    per_row = std::min(per_row, (now_seconds() - start) / 9);
  }
  for (const int64_t r : calibration_rows(limit))
    policy_->target_cost().add(
        r, time_pass(*model_, runner_->device_kv(), r, bs) + per_row * static_cast<double>(r));
  const int64_t seqs = std::min<int64_t>(limit, scheduler_->config().max_num_seqs);
  if (draft_) {
    for (const int64_t r : calibration_rows(seqs))
      policy_->proposer_cost().add(r,
                                   time_pass(draft_->mutable_model(), draft_->device_kv(), r, bs));
  } else if (medusa_) {
    std::vector<float> hidden;
    std::vector<int32_t> top;
    for (const int64_t r : calibration_rows(seqs)) {
      hidden.assign(static_cast<size_t>(r * model_->config().n_embd), 0.0f);
      double best = 1e30;
      for (int rep = 0; rep < 3; ++rep) {
        const double start = now_seconds();
        medusa_->heads().top_k(hidden, r, 1, top);
        if (rep > 0) best = std::min(best, now_seconds() - start);
      }
      policy_->proposer_cost().add(r, best);
    }
  }
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
  sched::Sequence seq;
  seq.id = next_seq_id_;
  seq.tokens = request.prompt_token_ids;
  seq.num_prompt_tokens = prompt_len;
  seq.max_total_tokens = prompt_len + params.max_tokens;
  seq.priority = request.priority;
  seq.arrival = next_arrival_;
  seq.cache_salt = params.cache_salt;
  seq.skip_prefix_cache_read = params.skip_reading_prefix_cache;
  if (!request.lora_name.empty()) {
    // Held, not loaded: a copy is read when the sequence first runs (bind_adapters).
    VESPER_ASSIGN_OR_RETURN(seq.adapter_id, adapters_->hold(request.lora_name));
  }
  const uint64_t adapter_id = seq.adapter_id;
  if (Status added = scheduler_->add(std::move(seq)); !added) {
    if (adapter_id != 0) adapters_->unhold(adapter_id);
    return added;
  }
  ++next_arrival_;
  outputs_->add(std::move(request), next_seq_id_++, now);
  totals_.prompt_tokens += prompt_len;
  return {};
}

void Engine::sample_one(OutputProcessor::RequestState& request, int32_t index,
                        std::span<const float> logits, double now) {
  OutputProcessor::SampleState& s = request.samples[index];
  const sample::SamplingParams& p = request.request.params;
  const sched::Sequence* seq = scheduler_->find(s.seq_id);
  std::copy(logits.begin(), logits.end(), row_.begin());
  sample::BatchSampler::Row row;
  row.params = &p;
  row.rng = &s.rng;
  row.history.prompt = std::span<const int32_t>(seq->tokens.data(), seq->num_prompt_tokens);
  row.history.output = std::span<const int32_t>(seq->tokens.data() + seq->num_prompt_tokens,
                                                seq->num_output_tokens());
  row.history.grammar_cursor = &s.grammar_cursor;
  row.logits = row_;
  const int32_t token = sampler_->sample_one(row, tokenizer_->eog_ids());
  std::optional<LogprobEntry> lp;
  if (p.logprobs >= 0) lp = sample::compute_logprobs(logits, token, p.logprobs, logprob_scratch_);
  scheduler_->append_token(s.seq_id, token);
  ++totals_.generation_tokens;
  const bool at_limit = seq->num_tokens() >= scheduler_->config().max_model_len;
  clock_->lap(StepPhase::kSample);
  const bool finished =
      outputs_->add_token(request, index, token, lp ? &*lp : nullptr, at_limit, now);
  clock_->lap(StepPhase::kOutput);
  if (finished) remove_sequence(s.seq_id);
}

void Engine::propose() {
  const SpeculativeConfig& spec = config_.speculative;
  if (!spec.enabled()) return;
  if (spec.disable_by_batch_size > 0) {
    const sched::SchedulerStats st = scheduler_->stats();
    if (st.num_running + st.num_waiting > spec.disable_by_batch_size) return;
  }
  int64_t k = spec.num_speculative_tokens;
  if (policy_) {
    // The step's decoding sequences, and the prompt rows that will share it.
    int64_t decoding = 0, other = 0;
    scheduler_->for_each_running([&](const sched::Sequence& seq) {
      if (seq.num_uncomputed() == 1 && !seq.in_prefill())
        ++decoding;
      else
        other += seq.num_uncomputed();
    });
    other = std::min(other, scheduler_->config().max_num_batched_tokens);
    k = policy_->choose(decoding, other);
    if (k == 0) return;
  }
  if (draft_) return propose_with_draft(k);
  if (medusa_) return propose_with_medusa(k);
  // Sequences whose next step computes the token they just sampled: proposals follow it.
  scheduler_->for_each_running([&](const sched::Sequence& seq) {
    if (seq.num_uncomputed() != 1 || seq.in_prefill()) return;
    spec::propose_ngram(seq.tokens, spec.ngram, k, proposal_);
    if (!proposal_.empty()) scheduler_->set_spec_tokens(seq.id, proposal_);
  });
}

void Engine::propose_with_draft(int64_t k_max) {
  const kv::KvCacheManager& kv = scheduler_->kv();
  draft_requests_.clear();
  scheduler_->for_each_running([&](const sched::Sequence& seq) {
    if (seq.num_uncomputed() != 1 || seq.in_prefill()) return;
    const int64_t length = seq.num_tokens();
    const int64_t k = std::min(k_max, seq.max_total_tokens - length);
    if (k <= 0) return;
    const std::vector<kv::BlockId>& table = kv.block_table(seq.id);
    // The draft writes positions length - 1 .. length + k - 2: they must be in the table, and in
    // blocks of this sequence's own (a block still shared after a fork holds a sibling's K/V
    // there).
    if (kv.entries_for(seq.id, length + k - 1) > static_cast<int64_t>(table.size())) return;
    for (int64_t pos = length - 1; pos <= length + k - 2; ++pos)
      if (kv.device_pool().ref_count(
              static_cast<kv::BlockId>(kv.slot(seq.id, pos) / kv.rows_per_block())) != 1)
        return;
    draft_requests_.push_back({seq.id, seq.tokens, table, k, kv.quantized_groups(seq.id)});
  });
  if (draft_requests_.empty()) return;
  draft_->propose(draft_requests_, draft_proposals_);
  for (size_t i = 0; i < draft_requests_.size(); ++i)
    if (!draft_proposals_[i].empty())
      scheduler_->set_spec_tokens(draft_requests_[i].id, draft_proposals_[i]);
}

void Engine::propose_with_medusa(int64_t k) {
  medusa_requests_.clear();
  scheduler_->for_each_running([&](const sched::Sequence& seq) {
    if (seq.num_uncomputed() != 1 || seq.in_prefill()) return;
    medusa_requests_.push_back({seq.id, seq.num_tokens(), k});
  });
  if (medusa_requests_.empty()) return;
  medusa_->propose(medusa_requests_, draft_proposals_, medusa_parents_);
  for (size_t i = 0; i < medusa_requests_.size(); ++i)
    if (!draft_proposals_[i].empty())
      scheduler_->set_spec_tokens(medusa_requests_[i].id, std::move(draft_proposals_[i]),
                                  std::move(medusa_parents_[i]));
}

void Engine::remove_sequence(sched::SeqId id) {
  if (adapters_)
    if (const sched::Sequence* seq = scheduler_->find(id); seq && seq->adapter_id != 0)
      adapters_->unhold(seq->adapter_id);
  scheduler_->remove(id);
  if (draft_) draft_->forget(id);
  if (medusa_) medusa_->forget(id);
}

void Engine::verify(OutputProcessor::RequestState& request, int32_t index,
                    const sched::ScheduledSequence& s, int32_t first_row, double now) {
  OutputProcessor::SampleState& smp = request.samples[index];
  const sample::SamplingParams& p = request.request.params;
  const sched::Sequence* seq = scheduler_->find(s.id);
  verify_rows_.clear();
  for (int64_t j = 0; j < s.num_logits_rows; ++j)
    verify_rows_.push_back(runner_->logits_row(first_row + j));
  const sample::TokenHistory history{
      std::span<const int32_t>(seq->tokens.data(), seq->num_prompt_tokens),
      std::span<const int32_t>(seq->tokens.data() + seq->num_prompt_tokens,
                               seq->num_output_tokens()),
      &smp.grammar_cursor};
  // The kept proposals (as indices into the entry's proposals) and the token after them. Row
  // 1 + j holds proposal j's logits; row 0 the last committed token's.
  const bool tree = !s.spec_tree_parents.empty();
  sample::TreeVerification v;
  if (tree) {
    v = verifier_->verify_tree(p, config_.speculative.acceptance, smp.rng, history, verify_rows_,
                               s.spec_token_ids, s.spec_tree_parents, tokenizer_->eog_ids());
  } else {
    const sample::Verification chain =
        verifier_->verify(p, config_.speculative.acceptance, smp.rng, history, verify_rows_,
                          s.spec_token_ids, {}, tokenizer_->eog_ids());
    for (int32_t j = 0; j < chain.num_accepted; ++j) v.path.push_back(j);
    v.next_token = chain.next_token;
  }
  const auto num_accepted = static_cast<int64_t>(v.path.size());
  if (draft_) draft_->on_verified(s.id, num_accepted);
  if (policy_) policy_->record(s.num_spec_tokens, num_accepted);
  ++totals_.spec_num_drafts;
  totals_.spec_num_draft_tokens += s.num_spec_tokens;
  totals_.spec_num_accepted_tokens += num_accepted;
  for (int64_t j = 0; j < num_accepted; ++j) ++totals_.spec_accepted_per_pos[j];
  verified_tokens_.clear();
  for (const int32_t node : v.path) verified_tokens_.push_back(s.spec_token_ids[node]);
  verified_tokens_.push_back(v.next_token);
  if (medusa_) medusa_->on_verified(s.id, verified_tokens_);
  // The kept proposals, then the target's next token, one at a time as plain sampling would give
  // them: the first that ends the sequence (a stop, EOS, max_tokens) ends it there. Token j was
  // predicted by the row of its parent: the last committed token's for the first, else the
  // previous kept proposal's.
  const int64_t base = seq->num_tokens();
  for (int64_t j = 0; j <= num_accepted; ++j) {
    const int32_t token = verified_tokens_[j];
    const size_t row = j == 0 ? 0 : static_cast<size_t>(1 + v.path[j - 1]);
    std::optional<LogprobEntry> lp;
    if (p.logprobs >= 0)
      lp = sample::compute_logprobs(verify_rows_[row], token, p.logprobs, logprob_scratch_);
    ++totals_.generation_tokens;
    const bool at_limit = base + j + 1 >= scheduler_->config().max_model_len;
    clock_->lap(StepPhase::kSample);
    const bool finished =
        outputs_->add_token(request, index, token, lp ? &*lp : nullptr, at_limit, now);
    clock_->lap(StepPhase::kOutput);
    if (finished) {
      remove_sequence(s.id);
      return;
    }
  }
  if (tree)
    scheduler_->accept_spec_path(s.id, v.path);
  else
    scheduler_->accept_spec_tokens(s.id, num_accepted);
  scheduler_->append_token(s.id, v.next_token);
  if (medusa_) {
    const int64_t row = num_accepted == 0 ? 0 : 1 + v.path.back();
    medusa_->set_hidden(s.id, seq->num_tokens(), runner_->hidden_row(first_row + row));
  }
}

void Engine::sample_step(const sched::SchedulerOutput& plan, double now) {
  const auto& first_row = runner_->first_logits_row();
  for (size_t i = 0; i < plan.scheduled.size(); ++i) {
    const sched::ScheduledSequence& s = plan.scheduled[i];
    if (!s.samples()) continue;
    int32_t index = 0;
    OutputProcessor::RequestState* request = outputs_->owner(s.id, &index);
    if (request == nullptr && failed_seqs_.count(s.id)) continue;  // aborted: adapter failed
    VESPER_CHECK(request != nullptr, "scheduled sequence %lld has no request",
                 static_cast<long long>(s.id));
    if (s.num_spec_tokens > 0) {
      verify(*request, index, s, first_row[i], now);
      continue;
    }
    // Without speculative tokens the entry's one logits row predicts the next token.
    const std::span<const float> logits = runner_->logits_row(first_row[i] + s.num_logits_rows - 1);
    // n > 1: the first sample of sequence 0 forks the other samples, which share the prompt's
    // blocks and draw their first tokens from the same logits.
    const int32_t n = request->request.params.n;
    const bool fork_now = index == 0 && static_cast<int32_t>(request->samples.size()) < n;
    if (fork_now) {
      child_ids_.clear();
      for (int32_t k = 1; k < n; ++k) {
        const sched::SeqId child = next_seq_id_++;
        scheduler_->fork(s.id, child);
        if (const uint64_t a = scheduler_->find(s.id)->adapter_id; a != 0) adapters_->hold_again(a);
        child_ids_.push_back(child);
      }
      outputs_->fork(*request, child_ids_);
    }
    sample_one(*request, index, logits, now);
    if (fork_now)
      for (int32_t k = 1; k < n; ++k) sample_one(*request, k, logits, now);
    // Medusa heads read the hidden state behind each sequence's newest token.
    if (medusa_) {
      const std::span<const float> hidden =
          runner_->hidden_row(first_row[i] + s.num_logits_rows - 1);
      auto record = [&](sched::SeqId id) {
        if (const sched::Sequence* seq = scheduler_->find(id))
          medusa_->set_hidden(id, seq->num_tokens(), hidden);
      };
      record(s.id);
      if (fork_now)
        for (const sched::SeqId child : child_ids_) record(child);
    }
  }
}

std::vector<RequestOutput> Engine::step() {
  StepPhaseTimes phases;
  PhaseClock clock(phases);
  clock_ = &clock;
  propose();
  clock.lap(StepPhase::kPropose);
  sched::SchedulerOutput plan = scheduler_->schedule();
  std::vector<RequestOutput> failed = bind_adapters(plan);
  clock.lap(StepPhase::kSchedule);
  const double now = now_seconds();
  if (plan.empty()) {
    // Nothing to compute, but what the runner forgets (and any memory move) still reaches it.
    const Status ran = runner_->execute(plan);
    VESPER_CHECK(ran.ok(), "the runner refused its scheduler's plan: %s",
                 ran.error().message.c_str());
    std::vector<RequestOutput> outs = outputs_->take_outputs(now);
    outs.insert(outs.end(), failed.begin(), failed.end());
    clock_ = nullptr;
    return outs;
  }
  ++totals_.num_steps;
  totals_.kivi_groups_quantized += static_cast<int64_t>(plan.group_quantizations.size());
  totals_.max_batched_tokens_seen =
      std::max(totals_.max_batched_tokens_seen, plan.num_batched_tokens);
  bool partial_prefill = false;
  for (const auto& s : plan.scheduled) {
    const sched::Sequence* seq = scheduler_->find(s.id);
    const bool decode = s.num_new_tokens == 1 && s.start >= seq->num_prompt_tokens && s.samples();
    if (!decode) totals_.prefill_tokens_computed += s.num_new_tokens;
    if (!s.samples()) partial_prefill = true;
    // Where the first step starts: the prefix-cache hit.
    if (OutputProcessor::RequestState* request = outputs_->owner(s.id, nullptr))
      outputs_->on_first_scheduled(*request, s.start, now);
  }
  if (partial_prefill) ++totals_.num_chunked_prefill_steps;
  for (sched::SeqId id : plan.preempted) {
    if (OutputProcessor::RequestState* request = outputs_->owner(id, nullptr))
      ++request->metrics.num_preemptions;
    // Preempted by recompute: its blocks are gone, the draft's K/V with them.
    const sched::Sequence* seq = scheduler_->find(id);
    if (draft_ && seq != nullptr && seq->status == sched::SeqStatus::kWaiting) draft_->reset(id);
  }

  clock.lap(StepPhase::kSchedule);
  const Status ran = runner_->execute(plan, &clock);
  VESPER_CHECK(ran.ok(), "the runner refused its scheduler's plan: %s",
               ran.error().message.c_str());
  sample_step(plan, now_seconds());
  clock.lap(StepPhase::kSample);
  std::vector<RequestOutput> outs = outputs_->take_outputs(now_seconds());
  outs.insert(outs.end(), failed.begin(), failed.end());
  clock.lap(StepPhase::kOutput);
  clock_ = nullptr;
  totals_.phase_seconds += phases;
  totals_.last_step_phase_seconds = phases;
  return outs;
}

std::vector<RequestOutput> Engine::bind_adapters(sched::SchedulerOutput& plan) {
  std::vector<RequestOutput> failed;
  if (!adapters_) return failed;
  // Sequences the runner forgets stop reading their copies first, so those may make room.
  for (const sched::SeqId id : plan.dropped)
    if (auto it = pinned_.find(id); it != pinned_.end()) {
      adapters_->unpin(it->second);
      pinned_.erase(it);
    }
  failed_seqs_.clear();
  for (sched::NewSequenceData& n : plan.new_sequences) {
    if (n.adapter_id == 0) continue;
    auto slot = adapters_->pin(n.adapter_id);
    if (slot) {
      n.adapter = *slot;
      pinned_[n.id] = *slot;
      continue;
    }
    // Its file no longer reads: the request ends now (the rows still run this step, without an
    // adapter, and are never sampled; the registration is broken, so no later sequence reads
    // the blocks they fill).
    log_error("%s; its requests are aborted", slot.error().message.c_str());
    failed_seqs_.insert(n.id);
  }
  for (const sched::SeqId id : failed_seqs_) {
    const OutputProcessor::RequestState* request = outputs_->owner(id, nullptr);
    if (request == nullptr) continue;  // a sibling already aborted it
    RequestOutput last;
    if (abort(request->request.request_id, &last)) failed.push_back(std::move(last));
  }
  return failed;
}

bool Engine::abort(const std::string& request_id, RequestOutput* final_output) {
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
