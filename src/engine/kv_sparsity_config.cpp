#include "engine/kv_sparsity_config.h"

#include <string>

namespace vesper::engine {

Result<backend::KvSparsity> kv_sparsity_config(const CacheConfig& cache, int64_t block_size,
                                               backend::KvDtypes dtypes) {
  backend::KvSparsity s;
  if (cache.kv_window < 0 || cache.kv_sink_tokens < 0 || cache.kv_sparse_budget < 0)
    return make_error("--kv-window, --kv-sink-tokens and --kv-sparse-budget must not be negative");
  if (cache.kv_sink_tokens > 0 && cache.kv_window == 0)
    return make_error("--kv-sink-tokens " + std::to_string(cache.kv_sink_tokens) +
                      " needs --kv-window (the window of recent tokens kept beside the sinks)");
  const bool kivi = kv_is_kivi(dtypes.k) || kv_is_kivi(dtypes.v);
  const std::string kivi_name(backend::kv_dtype_name(kv_is_kivi(dtypes.k) ? dtypes.k : dtypes.v));
  if (cache.kv_window > 0) {
    if (cache.kv_window < block_size)
      return make_error("--kv-window " + std::to_string(cache.kv_window) +
                        " is below one KV block (--block-size " + std::to_string(block_size) + ")");
    // A KIVI group is quantized whole; the window frees blocks.
    if (kivi)
      return make_error("--kv-window: not with a KIVI cache (--kv-cache-dtype " + kivi_name +
                        "): a group is quantized whole, and the window frees blocks");
    s.window = cache.kv_window;
    s.sink_tokens = cache.kv_sink_tokens;
  }
  if (cache.kv_sparse_budget > 0) {
    if (s.windowed())
      return make_error("--kv-sparsity quest and --kv-window: one KV sparsity method at a time");
    if (cache.kv_sparse_budget < 2 * block_size)
      return make_error("--kv-sparse-budget " + std::to_string(cache.kv_sparse_budget) +
                        " is below two KV blocks (--block-size " + std::to_string(block_size) +
                        "): a query always reads its first block and its own");
    s.block_budget = cache.kv_sparse_budget;
  }
  return s;
}

}  // namespace vesper::engine
