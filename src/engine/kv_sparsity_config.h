// The KV sparsity a cache configuration asks for (--kv-window / --kv-sink-tokens, or
// --kv-sparsity quest / --kv-sparse-budget), checked once for every front end: the engine's
// setup (which adds what speculation allows) and `vesper perplexity`.
#pragma once

#include "backend/kv_cache_spec.h"
#include "backend/kv_sparsity.h"
#include "core/result.h"
#include "engine/engine_config.h"

namespace vesper::engine {

// The sparsity `cache` asks for over blocks of `block_size` tokens of `dtypes`; dense_from 0 (a
// sequence's own comes from KvSparsity::for_sequence). An error names the flag: negative values,
// sinks without a window, a window below one block or a budget below two, both methods at once,
// a window with a KIVI cache (Quest takes every KV type).
Result<backend::KvSparsity> kv_sparsity_config(const CacheConfig& cache, int64_t block_size,
                                               backend::KvDtypes dtypes);

}  // namespace vesper::engine
