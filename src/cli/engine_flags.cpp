#include "cli/engine_flags.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dist/launch.h"
#include "engine/follower.h"
#include "engine/memory_plan.h"

namespace vesper::cli {

void add_kv_cache_dtype_flags(CLI::App* cmd, EngineFlags& f) {
  cmd->add_option(
         "--kv-cache-dtype", f.kv_cache_dtype,
         "Element type of the cached keys and values: " + backend::kv_dtype_choices() +
             ". Quantized types keep a scale per token and head, computed as each token is "
             "written (fp8: the row's largest magnitude maps near the format's largest "
             "value; int8: asymmetric, scale and zero point)")
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype-k,--cache-type-k", f.kv_cache_dtype_k,
                  "Element type of the cached keys alone (default: --kv-cache-dtype); "
                  "llama.cpp's -ctk");
  cmd->add_option("--kv-cache-dtype-v,--cache-type-v", f.kv_cache_dtype_v,
                  "Element type of the cached values alone (default: --kv-cache-dtype); "
                  "llama.cpp's -ctv");
  cmd->add_option("--kivi-group-size", f.kivi_group_size,
                  "KIVI (kivi2, kivi4): tokens per quantized group, which is also the KV block "
                  "size (keys are quantized per channel over a group, values per token over "
                  "runs of this many channels)")
      ->capture_default_str()
      ->check(CLI::IsMember({32, 64, 128}));
  cmd->add_flag("--calculate-kv-scales", f.calculate_kv_scales,
                "fp8 caches: fix each layer's and head's key and value scales from the first "
                "step's rows (vLLM's calibration) instead of a scale per token and head computed "
                "as each token is written (the default: it follows each token, and a sequence's "
                "rows then never depend on which requests came first)");
  cmd->add_option("--kivi-residual-length", f.kivi_residual_length,
                  "KIVI: the newest tokens a query reads unquantized (f16); older whole groups "
                  "are read quantized. A sequence keeps these rows and the rest of the group "
                  "they start in as f16, up to R + G - 1 tokens: at the default 96 and "
                  "--kivi-group-size 32, 96 to 127, within the KIVI paper's 128 f16 tokens")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-window", f.kv_window,
                  "KV sparsity, StreamingLLM: a generated token attends the --kv-sink-tokens "
                  "first tokens and the last W tokens up to its own, and the KV blocks between "
                  "them are freed as a sequence decodes, so its memory stays bounded and an "
                  "output longer than the cache keeps going (prompts are prefilled densely). At "
                  "least one block; 0: dense attention. Not with KIVI caches, Medusa or a draft "
                  "model. A request opts out with \"kv_sparsity\": \"none\"")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-sparsity", f.kv_sparsity,
                  "KV sparsity by query-aware block selection: quest (Tang et al., ICML 2024): a "
                  "generated token reads, per KV head, --kv-sparse-budget tokens' worth of KV "
                  "blocks: the first, its own, and those whose keys can give the largest q.k "
                  "(each block keeps its keys' per-channel minima and maxima). Nothing is freed; "
                  "prompts are prefilled densely. Every KV type, KIVI included; not with Medusa. A "
                  "request opts "
                  "out with \"kv_sparsity\": \"none\"")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "quest"}));
  cmd->add_option("--kv-sparse-budget", f.kv_sparse_budget,
                  "With --kv-sparsity quest: the tokens of KV a generated token reads (at least "
                  "two blocks)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-sink-tokens", f.kv_sink_tokens,
                  "With --kv-window: the first tokens every generated token keeps attending (the "
                  "attention sinks; StreamingLLM uses 4)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

Status check_kv_sparsity_flags(const EngineFlags& f) {
  if (f.kv_sparsity == "quest" && f.kv_sparse_budget == 0)
    return make_error(
        "--kv-sparsity quest needs --kv-sparse-budget (the tokens of KV a generated "
        "token reads)");
  if (f.kv_sparsity != "quest" && f.kv_sparse_budget > 0)
    return make_error("--kv-sparse-budget " + std::to_string(f.kv_sparse_budget) +
                      " needs --kv-sparsity quest");
  return {};
}

void add_engine_flags(CLI::App* cmd, EngineFlags& f) {
  cmd->add_option("model", f.model_path,
                  "Model: a GGUF file, or a Hugging Face checkpoint directory (config.json, "
                  "safetensors, tokenizer.json)")
      ->required();
  cmd->add_option("-t,--threads", f.threads, "Compute threads (default: all cores)")
      ->check(CLI::PositiveNumber);
  add_parallel_flags(cmd, f);
  cmd->add_option(
         "--max-model-len", f.max_model_len,
         "Most tokens (prompt + output) a sequence may hold (default: the model's context length)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-batched-tokens", f.max_num_batched_tokens,
                  "Token budget of one engine step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-num-seqs", f.max_num_seqs, "Most sequences in one engine step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--block-size", f.block_size, "Tokens per KV cache block")
      ->capture_default_str()
      ->check(CLI::IsMember({8, 16, 32, 64, 128}));
  cmd->add_option(
      "--kv-cache-memory", f.kv_cache_memory,
      "KV cache size, e.g. 512M or 2G (default: a quarter of available memory, at most 4G, "
      "no more than --max-num-seqs full-length sequences need)");
  add_kv_cache_dtype_flags(cmd, f);
  cmd->add_option("--num-gpu-blocks-override", f.num_gpu_blocks_override,
                  "Use exactly this many KV blocks (overrides --kv-cache-memory)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--swap-space", f.swap_space,
                  "Host memory (GiB) for sequences preempted by swapping")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option(
         "--preemption-mode", f.preemption_mode,
         "How to preempt when KV blocks run out: recompute (free, prefill again later) or swap "
         "(copy to the swap space; recompute when it is full)")
      ->capture_default_str()
      ->check(CLI::IsMember({"recompute", "swap"}));
  cmd->add_flag("--enable-chunked-prefill,!--no-enable-chunked-prefill", f.enable_chunked_prefill,
                "Split long prompts into chunks that share steps with decodes (default: on)");
  cmd->add_flag(
      "--enable-prefix-caching,!--no-enable-prefix-caching", f.enable_prefix_caching,
      "Reuse the KV of prompt prefixes already computed (system prompts, chat history); cached "
      "blocks stay in the KV budget until evicted, least recently used first (default: on)");
  cmd->add_flag(
      "--disable-async-output-proc", f.disable_async_output_proc,
      "Process outputs (detokenization, stop strings, each request's stream) on the engine's "
      "thread after each step, instead of on an output thread while the next step computes (the "
      "default; a sequence a stop string ends may then compute one more token, which is "
      "discarded)");
  cmd->add_option(
         "--num-scheduler-steps", f.num_scheduler_steps,
         "Multi-step scheduling: a step in which every sequence decodes (no prompt work, no "
         "proposals) runs this many forward passes at once, each feeding the token it samples to "
         "the next; scheduling and output processing happen once per N. Outputs are the same; a "
         "request arriving meanwhile waits up to N passes to start")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{64}));
  auto* async_on = cmd->add_flag(
      "--async-scheduling", f.async_scheduling,
      "Plan each step while the step before computes (on a runner thread), with the tokens it "
      "will sample as placeholders; a sequence that turns out to have ended computes one more "
      "token, which is discarded. Default: on where a core is left beside the compute threads, "
      "off with speculative decoding or adapters (refused with them)");
  cmd->add_flag("--no-async-scheduling", f.no_async_scheduling,
                "Plan each step after the step before has run")
      ->excludes(async_on);
  cmd->add_option(
      "--speculative-model", f.speculative_model,
      "Speculative decoding: \"[ngram]\" proposes the tokens that followed the latest earlier "
      "occurrence of the sequence's last n tokens in its prompt and output (prompt lookup); a GGUF "
      "file is a draft model (same vocabulary, smaller) that proposes by decoding ahead; a "
      "directory holds Medusa heads (config.json and their .safetensors) that propose a tree of "
      "candidates from the target's own hidden state. The target verifies the proposals in one "
      "pass, so the output is exactly what it alone would give");
  cmd->add_option(
      "--num-speculative-tokens", f.num_speculative_tokens,
      "Speculative tokens proposed per sequence and step, or the size of Medusa's candidate tree "
      "(required with --speculative-model); \"auto\": the engine measures what a target pass of "
      "1..K+1 rows costs and the running acceptance rate, and picks k in 0..8 each step (none "
      "where speculation does not pay: a small compute-bound model, a large batch)");
  cmd->add_option("--ngram-prompt-lookup-max", f.ngram_prompt_lookup_max,
                  "Longest n-gram matched by [ngram] (default 4)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--ngram-prompt-lookup-min", f.ngram_prompt_lookup_min,
                  "Shortest n-gram matched by [ngram] (default 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option(
         "--speculative-disable-by-batch-size", f.speculative_disable_by_batch_size,
         "Propose nothing while more than this many requests are running or waiting: at large "
         "batches a step is compute-bound and verifying proposals costs more than it saves "
         "(default: never)")
      ->check(CLI::PositiveNumber);
  cmd->add_option(
      "--speculative-config", f.speculative_config,
      "The speculative flags as vLLM's JSON: {\"method\": \"ngram\", \"draft_model\" or "
      "\"medusa\", \"model\": GGUF or heads directory, \"num_speculative_tokens\": K, "
      "\"prompt_lookup_max\": N, \"prompt_lookup_min\": N, \"disable_by_batch_size\": N}; "
      "beyond vLLM, \"medusa_tree\": false proposes each head's best token as a chain");
  cmd->add_option("--spec-decoding-acceptance-method", f.spec_decoding_acceptance_method,
                  "rejection_sampler: exact (the output distribution is the target's); "
                  "typical_acceptance_sampler: Medusa's typical acceptance, faster, approximately "
                  "the target's "
                  "(greedy requests are exact either way)")
      ->capture_default_str()
      ->check(CLI::IsMember({"rejection_sampler", "typical_acceptance_sampler"}));
  cmd->add_option(
         "--typical-acceptance-sampler-posterior-threshold",
         f.typical_acceptance_posterior_threshold,
         "Typical acceptance: a proposal is kept when its probability exceeds min(this, alpha * "
         "exp(-entropy))")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--typical-acceptance-sampler-posterior-alpha",
                  f.typical_acceptance_posterior_alpha, "Typical acceptance: the alpha above")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_flag("--enable-lora", f.enable_lora,
                "Serve LoRA / VeRA adapters: a request picks one by its \"model\" name");
  cmd->add_option(
      "--lora-modules", f.lora_modules,
      "Adapters by name: name=path (a llama.cpp GGUF LoRA, or a PEFT directory with "
      "adapter_config.json: LoRA or VeRA), or vLLM's JSON {\"name\": ..., \"path\": ..., "
      "\"base_model_name\": ...}; several may follow the flag");
  cmd->add_option("--max-loras", f.max_loras,
                  "Most distinct adapters among running requests; requests for others wait")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--max-lora-rank", f.max_lora_rank,
                  "Largest adapter rank accepted (an adapter of higher rank is refused)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{512}));
  cmd->add_option("--max-cpu-loras", f.max_cpu_loras,
                  "Adapters kept loaded in memory; the least recently used one no request holds is "
                  "dropped and read again from its path when next named (default: --max-loras)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  cmd->add_option("--lora", f.lora,
                  "llama.cpp's flag: an adapter (GGUF or PEFT) applied to every request at scale 1")
      ->check(CLI::ExistingPath);
  cmd->add_option("--lora-scaled", f.lora_scaled,
                  "llama.cpp's flag: FILE SCALE, an adapter applied to every request at SCALE");
}

namespace {

// One --lora-modules value: name=path or vLLM's JSON object.
Result<lora::LoraModuleSpec> parse_lora_module(const std::string& text) {
  lora::LoraModuleSpec m;
  if (!text.empty() && text.front() == '{') {
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return make_error("--lora-modules " + text + ": not a JSON object");
    for (const auto& [key, value] : j.items()) {
      if (!value.is_string())
        return make_error("--lora-modules " + text + ": \"" + key + "\" must be a string");
      if (key == "name")
        m.name = value.get<std::string>();
      else if (key == "path")
        m.path = value.get<std::string>();
      else if (key == "base_model_name")
        m.base_model_name = value.get<std::string>();
      else
        return make_error("--lora-modules " + text + ": unknown key \"" + key +
                          "\" (name, path, base_model_name)");
    }
  } else {
    const size_t eq = text.find('=');
    if (eq != std::string::npos) {
      m.name = text.substr(0, eq);
      m.path = text.substr(eq + 1);
    }
  }
  if (m.name.empty() || m.path.empty())
    return make_error("--lora-modules " + text +
                      ": expected name=path or {\"name\": ..., \"path\": ...}");
  return m;
}

Status lora_config(const EngineFlags& f, lora::LoraConfig& c) {
  c.enable_lora = f.enable_lora;
  c.max_loras = f.max_loras;
  c.max_lora_rank = f.max_lora_rank;
  c.max_cpu_loras = f.max_cpu_loras;
  c.runtime_updating = f.enable_lora_runtime_updating;
  c.allowed_dirs = f.lora_allowed_dirs;
  for (const std::string& text : f.lora_modules) {
    VESPER_ASSIGN_OR_RETURN(lora::LoraModuleSpec m, parse_lora_module(text));
    for (const lora::LoraModuleSpec& other : c.modules)
      if (other.name == m.name)
        return make_error("--lora-modules: the name '" + m.name + "' is given twice");
    c.modules.push_back(std::move(m));
  }
  if (!c.enable_lora && !c.modules.empty()) return make_error("--lora-modules needs --enable-lora");
  if (!c.enable_lora && c.runtime_updating)
    return make_error("--enable-lora-runtime-updating needs --enable-lora");
  for (const std::string& path : f.lora) c.merged.push_back(lora::MergedAdapterSpec{path, 1.0f});
  for (const auto& [path, scale_text] : f.lora_scaled) {
    char* end = nullptr;
    const double scale = std::strtod(scale_text.c_str(), &end);
    if (scale_text.empty() || *end != '\0' || !std::isfinite(scale))
      return make_error("--lora-scaled " + path + " " + scale_text +
                        ": the scale must be a number");
    c.merged.push_back(lora::MergedAdapterSpec{path, static_cast<float>(scale)});
  }
  return {};
}

}  // namespace

namespace {

// --speculative-model / --speculative-config into the engine's SpeculativeConfig.
Status speculative_config(const EngineFlags& f, engine::SpeculativeConfig& spec) {
  std::string method, model = f.speculative_model;
  int64_t k = 0, max_n = f.ngram_prompt_lookup_max, min_n = f.ngram_prompt_lookup_min;
  bool auto_k = false;
  // K, or "auto" (k_max 8: beyond it a chain's tail is rarely reached).
  auto parse_k = [&](const std::string& text, const std::string& where) -> Status {
    if (text == "auto") {
      auto_k = true;
      k = 8;
      return {};
    }
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v < 1 || v > 1024)
      return make_error(where + " must be a positive integer (at most 1024) or \"auto\", got \"" +
                        text + "\"");
    k = v;
    auto_k = false;
    return {};
  };
  if (!f.num_speculative_tokens.empty())
    VESPER_TRY(parse_k(f.num_speculative_tokens, "--num-speculative-tokens"));
  int64_t disable = f.speculative_disable_by_batch_size;
  bool medusa_tree = true;
  // "[ngram]", a draft model's GGUF file, or Medusa heads (a directory, or their safetensors).
  auto method_of = [](const std::string& m, const char* flag) -> Result<std::string> {
    if (m == "[ngram]") return std::string("ngram");
    std::error_code ec;
    if (std::filesystem::is_directory(m, ec) ||
        (std::filesystem::is_regular_file(m, ec) && m.ends_with(".safetensors")))
      return std::string("medusa");
    if (!std::filesystem::is_regular_file(m, ec))
      return make_error(std::string(flag) + " " + m +
                        ": no such file or directory (a draft model's GGUF, Medusa heads' "
                        "directory, or \"[ngram]\")");
    return std::string("draft_model");
  };
  if (!model.empty()) {
    VESPER_ASSIGN_OR_RETURN(method, method_of(model, "--speculative-model"));
  }
  if (!f.speculative_config.empty()) {
    const auto j = nlohmann::json::parse(f.speculative_config, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      return make_error("--speculative-config must be a JSON object");
    for (const auto& item : j.items()) {
      // Named copies, not structured bindings: lambdas capture these (clang 14 cannot capture a
      // structured binding).
      const std::string& key = item.key();
      const nlohmann::json& value = item.value();
      auto integer = [&](int64_t& out) -> Status {
        if (!value.is_number_integer() || value.get<int64_t>() < 1)
          return make_error("--speculative-config: \"" + key + "\" must be a positive integer");
        out = value.get<int64_t>();
        return {};
      };
      if (key == "method") {
        if (!value.is_string())
          return make_error("--speculative-config: \"method\" must be a string");
        method = value.get<std::string>();
        if (method != "ngram" && method != "draft_model" && method != "medusa")
          return make_error("--speculative-config: method \"" + method +
                            "\" is not supported (ngram, draft_model or medusa)");
      } else if (key == "model") {
        if (!value.is_string())
          return make_error("--speculative-config: \"model\" must be a string");
        model = value.get<std::string>();
        std::string from_model;
        VESPER_ASSIGN_OR_RETURN(from_model, method_of(model, "--speculative-config \"model\""));
        if (method.empty() || method == "ngram") method = from_model;
      } else if (key == "num_speculative_tokens") {
        if (value.is_string()) {
          VESPER_TRY(parse_k(value.get<std::string>(),
                             "--speculative-config: \"num_speculative_tokens\""));
        } else {
          VESPER_TRY(integer(k));
          auto_k = false;
        }
      } else if (key == "prompt_lookup_max") {
        VESPER_TRY(integer(max_n));
      } else if (key == "prompt_lookup_min") {
        VESPER_TRY(integer(min_n));
      } else if (key == "disable_by_batch_size") {
        VESPER_TRY(integer(disable));
      } else if (key == "medusa_tree") {
        if (!value.is_boolean())
          return make_error("--speculative-config: \"medusa_tree\" must be true or false");
        medusa_tree = value.get<bool>();
      } else {
        return make_error("--speculative-config: unknown key \"" + key + "\"");
      }
    }
  }
  if (method.empty()) {
    if (k > 0 || max_n > 0 || min_n > 0 || disable > 0)
      return make_error(std::string(k > 0       ? "--num-speculative-tokens"
                                    : max_n > 0 ? "--ngram-prompt-lookup-max"
                                    : min_n > 0 ? "--ngram-prompt-lookup-min"
                                                : "--speculative-disable-by-batch-size") +
                        " needs --speculative-model (or --speculative-config)");
    return {};
  }
  if (k <= 0) return make_error("--num-speculative-tokens is required with speculative decoding");
  spec.num_speculative_tokens = k;
  spec.auto_num_speculative_tokens = auto_k;
  spec.disable_by_batch_size = disable;
  auto acceptance = sample::parse_acceptance_method(f.spec_decoding_acceptance_method);
  if (!acceptance)
    return make_error("--spec-decoding-acceptance-method: " + acceptance.error().message);
  spec.acceptance.method = *acceptance;
  spec.acceptance.posterior_threshold =
      static_cast<float>(f.typical_acceptance_posterior_threshold);
  spec.acceptance.posterior_alpha = static_cast<float>(f.typical_acceptance_posterior_alpha);
  if (method == "medusa") {
    if (model.empty())
      return make_error(
          "--speculative-config: method medusa needs \"model\" (the heads' directory)");
    if (max_n > 0 || min_n > 0)
      return make_error(
          std::string(max_n > 0 ? "--ngram-prompt-lookup-max" : "--ngram-prompt-lookup-min") +
          " applies to \"[ngram]\", not to Medusa heads");
    spec.method = engine::SpeculativeConfig::Method::kMedusa;
    spec.model = model;
    spec.medusa_tree = medusa_tree;
    return {};
  }
  if (method == "draft_model") {
    if (model.empty())
      return make_error("--speculative-config: method draft_model needs \"model\" (a GGUF file)");
    if (max_n > 0 || min_n > 0)
      return make_error(
          std::string(max_n > 0 ? "--ngram-prompt-lookup-max" : "--ngram-prompt-lookup-min") +
          " applies to \"[ngram]\", not to a draft model");
    spec.method = engine::SpeculativeConfig::Method::kDraftModel;
    spec.model = model;
    return {};
  }
  if (max_n == 0) max_n = std::max<int64_t>(4, min_n);
  if (min_n == 0) min_n = 1;
  if (min_n > max_n)
    return make_error("--ngram-prompt-lookup-min " + std::to_string(min_n) +
                      " exceeds --ngram-prompt-lookup-max " + std::to_string(max_n));
  spec.method = engine::SpeculativeConfig::Method::kNgram;
  spec.ngram.min_n = static_cast<int32_t>(min_n);
  spec.ngram.max_n = static_cast<int32_t>(max_n);
  return {};
}

Result<backend::KvDtype> parse_kv_dtype_flag(const char* flag, const std::string& value) {
  const std::optional<backend::KvDtype> d = backend::parse_kv_dtype(value);
  if (!d)
    return make_error(std::string(flag) + " \"" + value + "\" is not a KV cache type; choose " +
                      backend::kv_dtype_choices());
  return *d;
}

}  // namespace

Result<backend::KvDtypes> parse_kv_dtypes(const EngineFlags& f) {
  backend::KvDtypes d;
  VESPER_ASSIGN_OR_RETURN(const backend::KvDtype both,
                          parse_kv_dtype_flag("--kv-cache-dtype", f.kv_cache_dtype));
  d.k = d.v = both;
  if (!f.kv_cache_dtype_k.empty()) {
    VESPER_ASSIGN_OR_RETURN(d.k, parse_kv_dtype_flag("--kv-cache-dtype-k", f.kv_cache_dtype_k));
  }
  if (!f.kv_cache_dtype_v.empty()) {
    VESPER_ASSIGN_OR_RETURN(d.v, parse_kv_dtype_flag("--kv-cache-dtype-v", f.kv_cache_dtype_v));
  }
  return d;
}

Status check_calculate_kv_scales(const EngineFlags& f, backend::KvDtypes dtypes) {
  auto fp8 = [](backend::KvDtype t) {
    return t == backend::KvDtype::kFp8E4M3 || t == backend::KvDtype::kFp8E5M2;
  };
  if (f.calculate_kv_scales && !fp8(dtypes.k) && !fp8(dtypes.v))
    return make_error(
        "--calculate-kv-scales applies to fp8 KV caches (--kv-cache-dtype fp8, "
        "fp8_e4m3 or fp8_e5m2), not to " +
        dtypes.describe());
  return {};
}

Result<engine::ParallelConfig> parallel_config(const EngineFlags& f) {
  engine::ParallelConfig p;
  p.tensor_parallel_size = f.tensor_parallel_size;
  p.pipeline_parallel_size = f.pipeline_parallel_size;
  p.pipeline_layer_split = f.pipeline_layer_split;
  const int64_t ranks = f.tensor_parallel_size * f.pipeline_parallel_size;
  const dist::LaunchInfo launch = dist::launch_info();
  if (ranks > 1) {
    VESPER_ASSIGN_OR_RETURN(p.group, dist::world(static_cast<int>(ranks)));
    if (f.tensor_parallel_size > 1)
      p.tensor_group = dist::stage_group(*p.group, static_cast<int>(f.pipeline_parallel_size));
  } else if (launch.size > 1) {
    return make_error("mpirun started " + std::to_string(launch.size) +
                      " processes: pass --tensor-parallel-size " + std::to_string(launch.size) +
                      " so that they share the model (or run one process without mpirun)");
  }
  return p;
}

void add_parallel_flags(CLI::App* cmd, EngineFlags& f) {
  cmd->add_option(
         "--tensor-parallel-size", f.tensor_parallel_size,
         "-tp: processes that each hold a part of every layer (1/N of the heads, the "
         "feed-forward width, o's and down's outputs and the vocabulary; outputs equal one "
         "process's bit for bit); run under `mpirun -n N`, N = this times "
         "--pipeline-parallel-size (README: Parallelism)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--pipeline-parallel-size", f.pipeline_parallel_size,
                  "-pp: processes that each hold a stage of consecutive layers (and their KV "
                  "cache), the activations passed stage to stage; with --tensor-parallel-size T, "
                  "each stage is T ranks")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--pipeline-layer-split", f.pipeline_layer_split,
                  "Layers per pipeline stage, comma-separated (e.g. 10,6; default: as even as they "
                  "go, earlier stages one more)")
      ->delimiter(',');
}

Result<engine::EngineConfig> to_engine_config(const EngineFlags& f) {
  engine::EngineConfig c;
  c.model_path = f.model_path;
  c.threads = f.threads;
  VESPER_ASSIGN_OR_RETURN(c.parallel, parallel_config(f));
  VESPER_TRY(engine::check_parallel_config(c));
  c.cache.block_size = f.block_size;
  c.cache.num_gpu_blocks_override = f.num_gpu_blocks_override;
  c.cache.swap_space_gib = f.swap_space;
  c.cache.enable_prefix_caching = f.enable_prefix_caching;
  c.async_output = !f.disable_async_output_proc;
  c.scheduler.num_scheduler_steps = f.num_scheduler_steps;
  c.async_scheduling = f.async_scheduling      ? engine::EngineConfig::AsyncScheduling::kOn
                       : f.no_async_scheduling ? engine::EngineConfig::AsyncScheduling::kOff
                                               : engine::EngineConfig::AsyncScheduling::kAuto;
  VESPER_ASSIGN_OR_RETURN(c.cache.kv_dtypes, parse_kv_dtypes(f));
  VESPER_TRY(check_calculate_kv_scales(f, c.cache.kv_dtypes));
  c.cache.calculate_kv_scales = f.calculate_kv_scales;
  c.cache.kv_sink_tokens = f.kv_sink_tokens;
  c.cache.kv_window = f.kv_window;
  VESPER_TRY(check_kv_sparsity_flags(f));
  c.cache.kv_sparse_budget = f.kv_sparse_budget;
  if (kv_is_kivi(c.cache.kv_dtypes.k) || kv_is_kivi(c.cache.kv_dtypes.v)) {
    // A KIVI block is one group.
    c.cache.block_size = f.kivi_group_size;
    c.cache.kivi_residual_length = f.kivi_residual_length;
  }
  if (!f.kv_cache_memory.empty()) {
    auto bytes = engine::parse_byte_size(f.kv_cache_memory);
    if (!bytes) return make_error("--kv-cache-memory: " + bytes.error().message);
    if (*bytes <= 0) return make_error("--kv-cache-memory must be positive");
    c.cache.kv_cache_memory = *bytes;
  }
  c.scheduler.max_model_len = f.max_model_len;
  c.scheduler.max_num_batched_tokens = f.max_num_batched_tokens;
  c.scheduler.max_num_seqs = f.max_num_seqs;
  c.scheduler.enable_chunked_prefill = f.enable_chunked_prefill;
  c.scheduler.preemption_mode = f.preemption_mode == "swap" ? sched::PreemptionMode::kSwap
                                                            : sched::PreemptionMode::kRecompute;
  VESPER_TRY(speculative_config(f, c.speculative));
  VESPER_TRY(lora_config(f, c.lora));
  return c;
}

std::optional<int> run_if_follower(const engine::EngineConfig& config) {
  if (!config.parallel.follower()) return std::nullopt;
  if (Status s = engine::run_follower(config); !s)
    config.parallel.group->abort(config.model_path + ": " + s.error().message);
  return 0;
}

}  // namespace vesper::cli
