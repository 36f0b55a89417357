// KvCacheSpec: how the paged KV cache stores a model's keys and values: the element type, the
// block geometry and the model's KV heads. The storage (KvCache, a backend's KV buffers) and
// the memory plan both take their sizes from here, so a new KV element type (f16, fp8, int8,
// KIVI) changes this file, the storage and the kernels, and nothing that sizes the cache.
#pragma once

#include <cstdint>
#include <string_view>

namespace vesper::backend {

enum class KvDtype : uint8_t {
  kF32,  // 4 bytes an element, no per-block metadata
};

std::string_view kv_dtype_name(KvDtype dtype);

struct KvCacheSpec {
  KvDtype dtype = KvDtype::kF32;
  int64_t n_layers = 0;
  int64_t block_size = 16;  // tokens per block
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;

  int64_t element_bytes() const;
  // Bytes of metadata (scales, zero points) one block keeps per layer for its keys, and as many
  // for its values; 0 for types without any.
  int64_t block_metadata_bytes() const;
  // Elements of one token's keys (or values) in one layer.
  int64_t token_elements() const { return n_kv_heads * head_dim; }
  // Bytes of one block's keys (or values) in one layer, metadata included.
  int64_t block_bytes_per_layer() const {
    return block_size * token_elements() * element_bytes() + block_metadata_bytes();
  }
  // Bytes of one block, K and V, every layer.
  int64_t bytes_per_block() const { return 2 * n_layers * block_bytes_per_layer(); }
  // Bytes per token of capacity: a block's bytes over its tokens (rounded up).
  int64_t bytes_per_token() const { return (bytes_per_block() + block_size - 1) / block_size; }
};

}  // namespace vesper::backend
