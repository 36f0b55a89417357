// The engine flags shared by `generate`, `bench` and `serve`, with vLLM's names:
// --max-model-len, --max-num-batched-tokens, --max-num-seqs, --block-size, --kv-cache-memory,
// --kv-cache-dtype (and -k / -v, llama.cpp's -ctk / -ctv),
// --num-gpu-blocks-override, --swap-space, --preemption-mode, --(no-)enable-chunked-prefill,
// -t/--threads, -tp/--tensor-parallel-size, -pp/--pipeline-parallel-size,
// --disable-async-output-proc, --num-scheduler-steps, --(no-)async-scheduling,
// and speculative decoding: --speculative-model, --num-speculative-tokens,
// --ngram-prompt-lookup-min/-max, --speculative-disable-by-batch-size, --speculative-config,
// --spec-decoding-acceptance-method, --typical-acceptance-sampler-posterior-threshold/-alpha,
// and adapters: --enable-lora, --lora-modules, --max-loras, --max-lora-rank, --max-cpu-loras,
// llama.cpp's --lora and --lora-scaled.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/result.h"
#include "engine/engine_config.h"

namespace vesper::cli {

struct EngineFlags {
  std::string model_path;
  int threads = 0;
  int64_t tensor_parallel_size = 1;           // -tp, --tensor-parallel-size
  int64_t pipeline_parallel_size = 1;         // -pp, --pipeline-parallel-size
  std::vector<int64_t> pipeline_layer_split;  // --pipeline-layer-split
  int64_t max_model_len = 0;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 256;
  int64_t block_size = 16;
  std::string kv_cache_memory;  // empty = auto
  int64_t num_gpu_blocks_override = 0;
  double swap_space = 4.0;
  std::string kv_cache_dtype = "auto";  // --kv-cache-dtype
  std::string kv_cache_dtype_k;         // --kv-cache-dtype-k (-ctk); empty: --kv-cache-dtype
  std::string kv_cache_dtype_v;         // --kv-cache-dtype-v (-ctv); empty: --kv-cache-dtype
  int64_t kivi_group_size = 32;         // --kivi-group-size
  int64_t kivi_residual_length = 96;    // --kivi-residual-length
  bool calculate_kv_scales = false;     // --calculate-kv-scales
  int64_t kv_sink_tokens = 0;           // --kv-sink-tokens
  int64_t kv_window = 0;                // --kv-window (0: dense)
  std::string kv_sparsity = "none";     // --kv-sparsity none|quest
  int64_t kv_sparse_budget = 0;         // --kv-sparse-budget (Quest)
  std::string preemption_mode = "recompute";
  bool enable_chunked_prefill = true;
  bool enable_prefix_caching = true;
  bool disable_async_output_proc = false;  // --disable-async-output-proc
  int64_t num_scheduler_steps = 1;         // --num-scheduler-steps
  bool async_scheduling = false;           // --async-scheduling
  bool no_async_scheduling = false;        // --no-async-scheduling (neither: auto)
  // Speculative decoding.
  std::string speculative_model;        // "[ngram]"
  std::string num_speculative_tokens;   // K or "auto"; empty: not given
  int64_t ngram_prompt_lookup_max = 0;  // 0: not given
  int64_t ngram_prompt_lookup_min = 0;  // 0: not given
  int64_t speculative_disable_by_batch_size = 0;
  std::string speculative_config;  // vLLM's JSON form of the above
  std::string spec_decoding_acceptance_method = "rejection_sampler";
  double typical_acceptance_posterior_threshold = 0.09;
  double typical_acceptance_posterior_alpha = 0.3;
  // Adapters (LoRA, VeRA).
  bool enable_lora = false;
  std::vector<std::string> lora_modules;  // name=path, or vLLM's JSON object
  int64_t max_loras = 1;
  int64_t max_lora_rank = 16;
  int64_t max_cpu_loras = 0;                                     // 0: --max-loras
  std::vector<std::string> lora;                                 // --lora FILE
  std::vector<std::pair<std::string, std::string>> lora_scaled;  // --lora-scaled FILE SCALE
  bool enable_lora_runtime_updating = false;                     // serve only
  std::vector<std::string> lora_allowed_dirs;                    // serve only

  // Whether speculative decoding was asked for (the bench commands report it then, even when
  // `auto` proposed nothing).
  bool speculating() const { return !speculative_model.empty() || !speculative_config.empty(); }
};

// Adds the model positional argument and the engine flags to `cmd`.
void add_engine_flags(CLI::App* cmd, EngineFlags& flags);

// Checks the flags and builds the engine configuration; errors name the flag.
// Registers --kv-cache-dtype, --kv-cache-dtype-k and -v alone (add_engine_flags includes them;
// commands that run a model without the engine, such as perplexity, take just these).
void add_kv_cache_dtype_flags(CLI::App* cmd, EngineFlags& f);

// The KV element types of --kv-cache-dtype, --kv-cache-dtype-k and -v; an error names the flag
// and lists the choices.
Result<backend::KvDtypes> parse_kv_dtypes(const EngineFlags& f);
// --calculate-kv-scales against the types: an error unless keys or values are fp8.
Status check_calculate_kv_scales(const EngineFlags& f, backend::KvDtypes dtypes);
// --kv-sparsity quest and --kv-sparse-budget go together (their values are checked with the
// cache's, engine::kv_sparsity_config).
Status check_kv_sparsity_flags(const EngineFlags& f);

// -tp / --tensor-parallel-size and -pp / --pipeline-parallel-size alone (add_engine_flags
// includes them), and the job they ask for: the world group of an mpirun job when they ask for
// more than one process; errors say how to launch.
void add_parallel_flags(CLI::App* cmd, EngineFlags& f);
Result<engine::ParallelConfig> parallel_config(const EngineFlags& flags);

Result<engine::EngineConfig> to_engine_config(const EngineFlags& flags);

// A rank other than 0 of a parallel job (config.parallel.follower()) follows rank 0's model
// instead of running the command: the command's exit code then. Nothing for rank 0 or one process.
std::optional<int> run_if_follower(const engine::EngineConfig& config);

}  // namespace vesper::cli
