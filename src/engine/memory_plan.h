// MemoryPlan: how the KV cache is sized at start, from the model's geometry and the cache flags.
// Stated in the startup log: bytes per token, per block, block count, tokens of capacity and how
// many max_model_len sequences fit at once.
#pragma once

#include <cstdint>
#include <string>

#include "core/result.h"
#include "engine/engine_config.h"
#include "model/model_config.h"

namespace vesper::engine {

struct MemoryPlan {
  int64_t weight_bytes = 0;
  int64_t bytes_per_token = 0;  // 2 x layers x kv_heads x head_dim x sizeof(element)
  int64_t block_size = 0;
  int64_t bytes_per_block = 0;
  int64_t num_blocks = 0;
  int64_t num_swap_blocks = 0;
  int64_t max_model_len = 0;
  // What set num_blocks, for messages about capacity: "--num-gpu-blocks-override",
  // "--kv-cache-memory", or "--kv-cache-memory auto" (from the machine's free memory).
  std::string capacity_source;

  int64_t token_capacity() const { return num_blocks * block_size; }
  double max_concurrency() const {
    return static_cast<double>(token_capacity()) / static_cast<double>(max_model_len);
  }
  std::string describe() const;
};

// Bytes of memory the OS reports available (MemAvailable), or 0 when unknown.
int64_t available_memory_bytes();

// Errors name the flag at fault (a budget too small for one block, a block size not allowed...).
Result<MemoryPlan> plan_memory(const model::ModelConfig& model, int64_t weight_bytes,
                               const CacheConfig& cache, int64_t max_model_len,
                               int64_t max_num_seqs);

// Parses sizes like "512M", "4G", "1.5GiB", "1048576" into bytes.
Result<int64_t> parse_byte_size(const std::string& text);

}  // namespace vesper::engine
