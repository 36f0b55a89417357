// Configuration of an Engine, one struct per layer, filled from CLI flags that use vLLM's names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/kv_cache_spec.h"
#include "dist/communicator.h"
#include "lora/adapter_registry.h"
#include "sched/scheduler.h"
#include "spec/speculative_config.h"

namespace vesper::engine {

struct CacheConfig {
  int64_t block_size = 16;  // --block-size: tokens per KV block (8, 16, 32, 64, 128)
  // --kv-cache-memory: bytes of KV storage. 0 = auto: a quarter of the machine's available memory,
  // at most 4 GiB (vLLM's CPU backend default KV space), and never more than
  // max_num_seqs sequences of max_model_len tokens need.
  int64_t kv_cache_memory = 0;
  int64_t num_gpu_blocks_override = 0;  // --num-gpu-blocks-override: force the block count
  double swap_space_gib = 4.0;          // --swap-space: host pool for preempted sequences (GiB)
  // --kv-cache-dtype (--kv-cache-dtype-k / -v): element types of the cached keys and values.
  backend::KvDtypes kv_dtypes;
  // --kivi-residual-length: KIVI caches (kivi2 / kivi4): a query reads the whole groups older
  // than this many tokens quantized. The KIVI group size is block_size. 96 by default: with
  // groups of 32 a sequence then keeps 96 to 127 tokens in f16, under the 128 that the KIVI
  // paper's default R 128 allows (its key residual holds up to 127 tokens).
  int64_t kivi_residual_length = 96;
  // --calculate-kv-scales: the target's fp8 cache fixes each layer's and head's scales from the
  // first step's rows instead of each row carrying its own
  // (backend::KvCache::calibrate_fp8_scales; a draft model's cache keeps per-row scales).
  bool calculate_kv_scales = false;
  // --[no-]enable-prefix-caching: reuse the KV of full blocks whose token prefix was already
  // computed; unreferenced cached blocks live in the block budget, evicted least recently used.
  bool enable_prefix_caching = true;
  // --kv-window / --kv-sink-tokens: StreamingLLM's KV sparsity (backend::KvSparsity): a
  // generated token attends the first kv_sink_tokens tokens and the last kv_window ones; the
  // blocks between are freed as a sequence decodes. 0: dense.
  int64_t kv_window = 0;
  int64_t kv_sink_tokens = 0;
  // --kv-sparsity quest --kv-sparse-budget N: Quest's query-aware block selection
  // (backend::KvSparsity): a generated token reads N tokens' worth of blocks. 0: off.
  int64_t kv_sparse_budget = 0;
};

// --tensor-parallel-size / --pipeline-parallel-size (vLLM's): how many processes (mpirun ranks)
// share the model. With tensor parallelism every rank holds 1/T of each layer (model.h); rank 0
// runs the engine, the others follow its model (engine/follower.h). With pipeline parallelism each
// rank holds a stage of consecutive layers (model.h).
struct ParallelConfig {
  int64_t tensor_parallel_size = 1;
  int64_t pipeline_parallel_size = 1;
  // --pipeline-layer-split: layers per pipeline stage (empty: as even as they go).
  std::vector<int64_t> pipeline_layer_split;
  // The job's ranks when there are several (dist::world), or none; and, with tensor parallelism,
  // the ranks of this rank's pipeline stage (the world itself with one stage).
  dist::Communicator* group = nullptr;
  dist::Communicator* tensor_group = nullptr;
  bool follower() const { return group != nullptr && group->rank() != 0; }
};

// Speculative decoding's settings (spec/speculative_config.h).
using SpeculativeConfig = spec::SpeculativeConfig;

struct EngineConfig {
  std::string model_path;
  int threads = 0;  // 0 = all cores
  // Asynchronous output processing (vLLM's; --disable-async-output-proc turns it off):
  // detokenization, stop strings and the per-request outputs of a step run on the engine's output
  // thread while the next step computes. A sequence a stop string ends may then have computed one
  // more token, which is discarded.
  bool async_output = true;
  // Async scheduling (vLLM V1's --async-scheduling): the scheduler plans step n + 1 while the
  // runner computes step n, on a runner thread; the tokens step n samples are placeholders in the
  // plan, which the runner fills from its own output. Auto: on where a core is left for the
  // engine thread beside the compute threads, and never with speculative decoding (proposals
  // come from each step's samples) or adapters (their copies are loaded as plans are made).
  enum class AsyncScheduling { kAuto, kOn, kOff };
  AsyncScheduling async_scheduling = AsyncScheduling::kAuto;
  // Structured output: the grammar mask of a constrained sequence's next state is computed on a
  // thread of its own while the next forward pass runs (grammar/mask_prefetcher.h), instead of
  // on the step loop when the next step samples. Off: the step computes it (for tests, which
  // check that outputs do not depend on it).
  bool prefetch_grammar_masks = true;
  CacheConfig cache;
  ParallelConfig parallel;
  sched::SchedulerConfig scheduler;  // scheduler.max_model_len 0 = the model's context length
  SpeculativeConfig speculative;
  lora::LoraConfig lora;
};

}  // namespace vesper::engine
