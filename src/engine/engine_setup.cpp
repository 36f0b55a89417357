// Engine::create: the backend, the model and its tokenizer, adapters, the proposer, the memory
// plan, and the parts wired together; the startup log states what was built.
#include <algorithm>
#include <cstdio>

#include "backend/backend_factory.h"
#include "core/logging.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/follower.h"
#include "engine/kv_sparsity_config.h"
#include "spec/make_proposer.h"

namespace vesper::engine {
namespace {

// Pins adapters for the scheduler in the engine's registry.
class RegistryBinder final : public sched::AdapterBinder {
 public:
  explicit RegistryBinder(lora::AdapterRegistry& registry) : registry_(registry) {}
  Result<int32_t> pin(uint64_t adapter_id) override { return registry_.pin(adapter_id); }
  bool ready(uint64_t adapter_id) override { return registry_.ready(adapter_id); }
  void unpin(int32_t slot) override { registry_.unpin(slot); }

 private:
  lora::AdapterRegistry& registry_;
};

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(const EngineConfig& config) {
  std::unique_ptr<Engine> e(new Engine());
  e->config_ = config;
  VESPER_TRY(check_parallel_config(config));
  VESPER_ASSIGN_OR_RETURN(e->backend_, backend::create_backend(backend_options(config)));
  VESPER_ASSIGN_OR_RETURN(e->model_, load_model_part(config, *e->backend_));
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
    e->adapter_binder_ = std::make_unique<RegistryBinder>(*e->adapters_);
    sc.max_loras = config.lora.max_loras;
  }
  SpeculativeConfig& spec = e->config_.speculative;
  VESPER_ASSIGN_OR_RETURN(std::unique_ptr<spec::Proposer> proposer,
                          spec::make_proposer(spec, *e->backend_, *e->model_, *e->tokenizer_));
  if (proposer) {
    weight_bytes += proposer->weight_bytes();
    // The tables cover the positions a proposer's own cache writes, past what the target computes.
    sc.num_lookahead_slots = proposer->lookahead_slots(spec.num_speculative_tokens);
  }
  // The largest step the scheduler can plan: its token budget, a logits row for each sequence
  // it can seat (and for each token, with speculative rows), every seated sequence's whole table.
  const int64_t blocks_per_seq =
      (sc.max_model_len + config.cache.block_size - 1) / config.cache.block_size;
  const backend::KvDtypes kv_dtypes = config.cache.kv_dtypes;
  const bool kivi = kv_is_kivi(kv_dtypes.k) || kv_is_kivi(kv_dtypes.v);
  // A tree row at depth d reads the groups older than its position + 1 - R quantized: none of its
  // own path when R exceeds the deepest row's depth.
  if (kivi && proposer) {
    const int64_t depth = proposer->max_tree_depth(spec.num_speculative_tokens);
    if (depth > 0 && config.cache.kivi_residual_length <= depth)
      return make_error("--kivi-residual-length " +
                        std::to_string(config.cache.kivi_residual_length) +
                        ": Medusa's candidate trees here are " + std::to_string(depth) +
                        " deep, and need a longer residual window");
  }
  // KV sparsity: a draft model's cache (which follows the target's blocks) cannot lose blocks to a
  // window, and Medusa's trees would read past a window's edge or beside a selection.
  VESPER_ASSIGN_OR_RETURN(sc.kv_sparsity,
                          kv_sparsity_config(config.cache, config.cache.block_size, kv_dtypes));
  if (sc.kv_sparsity.enabled() && spec.method == SpeculativeConfig::Method::kMedusa)
    return make_error(
        std::string(sc.kv_sparsity.windowed() ? "--kv-window" : "--kv-sparsity quest") +
        ": not with Medusa heads (their candidate trees); n-gram speculation works "
        "with it");
  if (sc.kv_sparsity.windowed() && spec.method == SpeculativeConfig::Method::kDraftModel)
    return make_error(
        "--kv-window: not with a draft model (--speculative-model: its cache follows "
        "the target's blocks); n-gram speculation works with it");
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
  int64_t activation_bytes =
      model::Model::activation_bytes(mc, capacity, e->model_->max_passes_in_flight());
  const std::optional<backend::KvCacheSpec> companion =
      proposer ? proposer->companion_spec(kv_specs[0]) : std::nullopt;
  if (companion) {
    kv_specs.push_back(*companion);
    // KIVI: a group is quantized only once the companion holds its rows.
    sc.compaction_waits_for_companion = kivi;
  }
  if (proposer) activation_bytes += proposer->activation_bytes(capacity);
  // Quest's key bounds live beside the target's blocks (the draft's cache needs none).
  kv_specs[0].key_bounds = sc.kv_sparsity.quest();
  const int64_t adapter_bytes = e->adapters_ ? e->adapters_->budget_bytes() : 0;
  VESPER_ASSIGN_OR_RETURN(
      e->plan_, plan_memory(kv_specs, weight_bytes + adapter_bytes, activation_bytes, config.cache,
                            sc.max_model_len, sc.max_num_seqs));
  e->plan_.adapter_bytes = adapter_bytes;
  // A parallel job: every rank plans its own share from its own memory; all run the fewest
  // blocks (and swap blocks) any rank holds.
  std::string rank_plans;
  if (config.parallel.group != nullptr) {
    const int64_t own[] = {e->plan_.num_blocks, e->plan_.num_swap_blocks, e->plan_.bytes_per_block};
    const auto per_rank =
        e->model_->ask_followers(rank_plan_request(kv_specs[0], config.cache, sc.max_model_len,
                                                   sc.max_num_seqs, activation_bytes),
                                 own);
    for (size_t r = 0; r < per_rank.size(); ++r) {
      e->plan_.num_blocks = std::min(e->plan_.num_blocks, per_rank[r][0]);
      e->plan_.num_swap_blocks = std::min(e->plan_.num_swap_blocks, per_rank[r][1]);
      rank_plans += (r ? "; " : "") + std::string("rank ") + std::to_string(r) + ": " +
                    std::to_string(per_rank[r][0]) + " blocks of " +
                    std::to_string(per_rank[r][2]) + " bytes (" + std::to_string(per_rank[r][1]) +
                    " swap)";
    }
  }
  e->model_->reserve(capacity);
  e->kv_ = std::make_unique<kv::KvCacheManager>(e->plan_.num_blocks, e->plan_.num_swap_blocks,
                                                e->plan_.block_size,
                                                e->config_.cache.enable_prefix_caching);
  if (kivi)
    e->kv_->enable_kivi(kv_specs[0].residual_rows_per_block(), config.cache.kivi_residual_length);
  // Async scheduling needs what a plan decides to be fixed when it is made: proposals come from
  // the previous step's samples, and adapter copies are loaded (and dropped) as plans are made.
  using AsyncScheduling = EngineConfig::AsyncScheduling;
  const char* no_planning_ahead = proposer       ? "speculative decoding proposes from each step's "
                                                   "samples, which a plan made ahead cannot have"
                                  : e->adapters_ ? "adapter copies are loaded and dropped as plans "
                                                   "are made, while the step before computes"
                                                 : nullptr;
  if (config.async_scheduling == AsyncScheduling::kOn && no_planning_ahead != nullptr)
    return make_error(std::string("--async-scheduling: ") + no_planning_ahead);
  const int compute_threads =
      e->backend_->host_pool() != nullptr ? e->backend_->host_pool()->num_threads() : 1;
  // Planning overlaps the forward pass only where a core is left for it; on a machine whose
  // cores all compute, the engine thread would take one from the pass.
  const bool spare_core = ThreadPool::hardware_threads() > compute_threads;
  // A pipeline's leader plans ahead whether or not a core is spare: without it the stages take
  // turns, each idle while the others compute.
  const bool pipeline = e->model_->max_passes_in_flight() > 1;
  const bool plans_ahead = config.async_scheduling == AsyncScheduling::kOn ||
                           (config.async_scheduling == AsyncScheduling::kAuto &&
                            no_planning_ahead == nullptr && (spare_core || pipeline));
  if (plans_ahead) sc.max_plans_in_flight = 2;
  // A plan in flight a stage, on disjoint sequences (vLLM's virtual engines), where each plan is
  // one pass without proposals.
  if (plans_ahead && pipeline && proposer == nullptr && sc.num_scheduler_steps == 1) {
    e->pipeline_depth_ = e->model_->max_passes_in_flight();
    sc.virtual_engines = e->pipeline_depth_;
    sc.max_plans_in_flight = e->pipeline_depth_ + 1;
  }
  e->scheduler_ = std::make_unique<sched::Scheduler>(sc, *e->kv_);
  e->scheduler_->set_adapter_binder(e->adapter_binder_.get());
  if (companion)
    proposer->allocate(kv_specs[1], e->plan_.num_blocks, e->plan_.num_swap_blocks, capacity);
  const std::string proposer_name = proposer ? proposer->describe() : "";
  RunnerConfig rc;
  rc.max_model_len = sc.max_model_len;
  rc.max_num_batched_tokens = sc.max_num_batched_tokens;
  rc.max_num_seqs = sc.max_num_seqs;
  rc.eog_ids = e->tokenizer_->eog_ids();
  rc.speculative = spec;
  rc.prefetch_grammar_masks = config.prefetch_grammar_masks;
  rc.kv_sparsity = sc.kv_sparsity;
  e->runner_ =
      std::make_unique<ModelRunner>(*e->model_, kv_specs[0], e->plan_.num_blocks,
                                    e->plan_.num_swap_blocks, std::move(rc), std::move(proposer));
  e->outputs_ = std::make_unique<OutputProcessor>(*e->tokenizer_, sc.max_model_len);
  if (e->config_.async_output) e->output_thread_ = std::make_unique<JobThread>();
  if (plans_ahead) e->runner_thread_ = std::make_unique<JobThread>();
  if (spec.enabled())
    e->totals_.spec_accepted_per_pos.assign(static_cast<size_t>(spec.num_speculative_tokens), 0);
  e->runner_->calibrate_speculation();
  // After every warm-up pass (the speculation timing above writes synthetic rows): the first
  // requests' rows set the scales.
  if (config.cache.calculate_kv_scales) e->model_->calibrate_kv_scales(e->runner_->device_kv());
  log_info(
      "model %s: %s, %lld layers, n_embd %lld, %lld heads (%lld kv, head size %lld), vocab %lld, "
      "context %lld",
      config.model_path.c_str(), mc.arch.name.c_str(), static_cast<long long>(mc.n_layer),
      static_cast<long long>(mc.n_embd), static_cast<long long>(mc.n_head),
      static_cast<long long>(mc.n_head_kv), static_cast<long long>(mc.head_dim),
      static_cast<long long>(mc.n_vocab), static_cast<long long>(mc.context_length));
  log_info("%s", e->plan_.describe().c_str());
  if (!rank_plans.empty())
    log_info("memory plan per rank (each from its own memory; the job runs the fewest): %s",
             rank_plans.c_str());
  const dist::Communicator* group = config.parallel.group;
  const int stages = e->model_->pipeline_parallel_size();
  const int tensor_ranks = e->model_->tensor_parallel_size();
  if (group != nullptr)
    log_info("parallel job: %s; %d pipeline stage%s of %d tensor-parallel rank%s",
             group->describe().c_str(), stages, stages == 1 ? "" : "s", tensor_ranks,
             tensor_ranks == 1 ? "" : "s");
  if (stages > 1) {
    std::string layers_text;
    const auto layers =
        model::pipeline_stage_layers(mc.n_layer, stages, config.parallel.pipeline_layer_split);
    for (size_t s = 0; layers && s < layers->size(); ++s)
      layers_text += (s ? ", " : "") + std::to_string((*layers)[s]);
    const std::string in_flight =
        e->pipeline_depth_ > 1 ? std::to_string(e->pipeline_depth_) +
                                     " plans in flight on disjoint sequences (virtual engines)"
                               : "1 plan in flight (speculative decoding, multi-step, adapters or "
                                 "--no-async-scheduling: the stages take turns)";
    log_info(
        "pipeline parallel: %d stages, layers per stage %s; each stage holds its layers' KV "
        "cache, the same block count; %s",
        stages, layers_text.c_str(), in_flight.c_str());
  }
  if (tensor_ranks > 1)
    log_info(
        "tensor parallel: %d ranks a stage; each holds 1/%d of the attention heads, feed-forward "
        "width and vocabulary, its own KV heads (%lld of %lld), and the same block count",
        tensor_ranks, tensor_ranks, static_cast<long long>(e->model_->shard_config().n_head_kv),
        static_cast<long long>(mc.n_head_kv));
  if (config.cache.calculate_kv_scales)
    log_info(
        "KV cache: fp8 scales per layer and head, fixed from the first step's rows "
        "(--calculate-kv-scales)");
  log_info(
      "scheduler: max-num-batched-tokens %lld, max-num-seqs %lld, max-model-len %lld, chunked "
      "prefill %s, preemption mode %s, prefix caching %s; backend %s",
      static_cast<long long>(sc.max_num_batched_tokens), static_cast<long long>(sc.max_num_seqs),
      static_cast<long long>(sc.max_model_len), sc.enable_chunked_prefill ? "on" : "off",
      sc.preemption_mode == sched::PreemptionMode::kSwap ? "swap" : "recompute",
      e->config_.cache.enable_prefix_caching ? "on" : "off", e->backend_->describe().c_str());
  std::string async_scheduling =
      plans_ahead ? "on (the next step is planned while one computes)" : "off";
  if (!plans_ahead)
    async_scheduling +=
        config.async_scheduling == AsyncScheduling::kOff ? " (--no-async-scheduling)"
        : no_planning_ahead != nullptr ? std::string(" (") + no_planning_ahead + ")"
                                       : " (every core computes: --async-scheduling turns it on)";
  log_info("engine loop: output processing %s; async scheduling %s; %lld pass%s per decode step%s",
           e->config_.async_output
               ? "asynchronous (an output thread detokenizes while the next step computes)"
               : "synchronous (--disable-async-output-proc)",
           async_scheduling.c_str(), static_cast<long long>(sc.num_scheduler_steps),
           sc.num_scheduler_steps == 1 ? "" : "es",
           sc.num_scheduler_steps == 1 ? "" : " (--num-scheduler-steps)");
  if (spec.enabled()) {
    const std::string off =
        spec.disable_by_batch_size > 0
            ? ", off above " + std::to_string(spec.disable_by_batch_size) + " requests"
            : "";
    std::string per_step = std::to_string(spec.num_speculative_tokens) + " tokens per step";
    if (const spec::SpeculationPolicy* policy = e->runner_->policy()) {
      const double k1 = 1.0 + static_cast<double>(spec.num_speculative_tokens);
      char costs[160];
      std::snprintf(costs, sizeof costs,
                    " tokens per step (a target pass of 1 row %.2f ms, of %d rows %.2f ms)",
                    policy->target_cost().at(1) * 1e3,
                    static_cast<int>(spec.num_speculative_tokens) + 1,
                    policy->target_cost().at(k1) * 1e3);
      per_step = "auto: 0.." + std::to_string(spec.num_speculative_tokens) + costs;
    }
    log_info("speculative decoding: %s, %s, %s%s", proposer_name.c_str(), per_step.c_str(),
             std::string(sample::acceptance_method_name(spec.acceptance.method)).c_str(),
             off.c_str());
    if (const spec::SpeculationPolicy* policy = e->runner_->policy())
      log_info(
          "speculative decoding: measured target passes (rows: ms) %s; proposer (sequences: "
          "ms per token) %s",
          policy->target_cost().describe().c_str(), policy->proposer_cost().describe().c_str());
  }
  return e;
}

}  // namespace vesper::engine
