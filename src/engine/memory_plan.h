// MemoryPlan: how memory is budgeted once at start: the weights, the activations of the largest
// step the scheduler can plan, and the KV cache, sized from the KV storage spec
// (backend/kv_cache_spec.h: bytes per token and block) and the cache flags. Stated in the startup
// log: bytes per token, per block, block count, tokens of capacity and how many max_model_len
// sequences fit at once.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "backend/kv_cache_spec.h"
#include "core/result.h"
#include "engine/engine_config.h"
#include "model/model.h"

namespace vesper::engine {

struct MemoryPlan {
  int64_t weight_bytes = 0;
  // Of weight_bytes: the adapters' pool (--lora merged adapters, and --max-cpu-loras copies of
  // the largest named adapter).
  int64_t adapter_bytes = 0;
  int64_t activation_bytes = 0;  // the forward pass's buffers for the largest step
  std::string kv_dtype;          // the KV cache's element type
  int64_t bytes_per_token = 0;   // KvCacheSpec::bytes_per_token
  int64_t block_size = 0;
  int64_t bytes_per_block = 0;
  int64_t num_blocks = 0;
  int64_t num_swap_blocks = 0;
  int64_t max_model_len = 0;
  // The most blocks one max_model_len sequence holds while it decodes (KvCacheSpec::peak_blocks:
  // with KIVI, its f16 residual window takes more blocks than its quantized groups).
  int64_t blocks_per_seq = 0;
  bool kivi = false;  // token_capacity() then counts quantized tokens
  // What set num_blocks, for messages about capacity: "--num-gpu-blocks-override",
  // "--kv-cache-memory", or "--kv-cache-memory auto" (from the machine's free memory).
  std::string capacity_source;

  int64_t token_capacity() const { return num_blocks * block_size; }
  // max_model_len sequences the cache holds at once (residual windows included).
  double max_concurrency() const {
    return static_cast<double>(num_blocks) / static_cast<double>(blocks_per_seq);
  }
  std::string describe() const;
};

// Parallel jobs: each rank sizes its KV cache from its own memory. Rank 0 sends what its plan was
// made from (its target KV spec, the cache flags, the limits and its activation bytes); each rank
// plans again with its own KV heads and layers (model.shard_config()) and its own free memory,
// and answers {num_blocks, num_swap_blocks, bytes_per_block}. The job runs the fewest blocks any
// rank can hold (engine_setup.cpp).
std::vector<uint8_t> rank_plan_request(const backend::KvCacheSpec& spec, const CacheConfig& cache,
                                       int64_t max_model_len, int64_t max_num_seqs,
                                       int64_t activation_bytes);
Result<std::vector<int64_t>> plan_rank_memory(const model::Model& model,
                                              std::span<const uint8_t> request);

// Bytes of memory the OS reports available (MemAvailable), or 0 when unknown.
int64_t available_memory_bytes();

// Errors name the flag at fault (a budget too small for one block, a block size not allowed...).
// `kv` holds the KV storage specs at cache.block_size of every model that keeps KV per block:
// the target's first, then a draft model's (whose storage uses the same blocks); a block costs
// their sum. `activation_bytes` is what the models' buffers take for the largest step.
Result<MemoryPlan> plan_memory(std::span<const backend::KvCacheSpec> kv, int64_t weight_bytes,
                               int64_t activation_bytes, const CacheConfig& cache,
                               int64_t max_model_len, int64_t max_num_seqs);

// Parses sizes like "512M", "4G", "1.5GiB", "1048576" into bytes.
Result<int64_t> parse_byte_size(const std::string& text);

}  // namespace vesper::engine
