// KvCacheSpec: how the paged KV cache stores a model's keys and values: the element types (keys
// and values may differ), the block geometry and the model's KV heads. The storage (KvCache, a
// backend's KV buffers) and the memory plan both take their sizes from here, so a new KV element
// type changes this file, the codec (kv_codec.h) and the kernels, and nothing that sizes the cache.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace vesper::backend {

// How one head's key (or value) row of one token is stored: head_dim elements, then the row's
// metadata. Quantized types keep their scales per token and head, so every row is self-contained:
// a row is written once, by one token, whatever the chunking or batch, and copies of slots and
// blocks move its metadata with it.
enum class KvDtype : uint8_t {
  kF32,      // 4 bytes an element
  kF16,      // 2 bytes, IEEE half (round to nearest even); the default ("auto")
  kBF16,     // 2 bytes, bfloat16 (round to nearest even)
  kFp8E4M3,  // 1 byte (OCP e4m3fn, saturating) + an f16 scale per row (amax to 448 or 448/√2)
  kFp8E5M2,  // 1 byte (e5m2, saturating) + an f16 scale per row (amax to 57344 or 57344/√2)
  kInt8,     // 1 byte, asymmetric: x = q * scale + zero, q in 0..255; f16 scale and zero per row
};

inline constexpr KvDtype kAllKvDtypes[] = {KvDtype::kF32,     KvDtype::kF16,     KvDtype::kBF16,
                                           KvDtype::kFp8E4M3, KvDtype::kFp8E5M2, KvDtype::kInt8};

// The canonical name ("f16", "fp8_e4m3", ...), as --kv-cache-dtype takes it.
std::string_view kv_dtype_name(KvDtype dtype);
// Parses a --kv-cache-dtype value: the canonical names, "auto" (f16), "fp8" (fp8_e4m3), and the
// spellings vLLM and llama.cpp use for the same types (float32, fp32, float16, half, bfloat16,
// fp8_e4m3fn). nullopt for anything else.
std::optional<KvDtype> parse_kv_dtype(std::string_view name);
// Every accepted value with its bytes per element, for --help and error messages.
std::string kv_dtype_choices();

int64_t kv_element_bytes(KvDtype dtype);
// Bytes of metadata after each row's elements (scales, zero points); 0 for float types.
int64_t kv_row_metadata_bytes(KvDtype dtype);

// The element types of keys and of values.
struct KvDtypes {
  KvDtype k = KvDtype::kF16;
  KvDtype v = KvDtype::kF16;
  // "f16", or "k int8, v fp8_e4m3" when they differ.
  std::string describe() const;
  bool operator==(const KvDtypes&) const = default;
};

struct KvCacheSpec {
  KvDtypes dtypes;
  int64_t n_layers = 0;
  int64_t block_size = 16;  // tokens per block
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;

  // Bytes of one head's row of one token, metadata included.
  int64_t row_bytes(KvDtype dtype) const {
    return head_dim * kv_element_bytes(dtype) + kv_row_metadata_bytes(dtype);
  }
  int64_t key_row_bytes() const { return row_bytes(dtypes.k); }
  int64_t value_row_bytes() const { return row_bytes(dtypes.v); }
  // Elements of one token's keys (or values) in one layer.
  int64_t token_elements() const { return n_kv_heads * head_dim; }
  // Bytes of one block's keys (values) in one layer.
  int64_t key_block_bytes_per_layer() const { return block_size * n_kv_heads * key_row_bytes(); }
  int64_t value_block_bytes_per_layer() const {
    return block_size * n_kv_heads * value_row_bytes();
  }
  // Bytes of one block, K and V, every layer.
  int64_t bytes_per_block() const {
    return n_layers * (key_block_bytes_per_layer() + value_block_bytes_per_layer());
  }
  // Bytes per token of capacity: a block's bytes over its tokens (rounded up).
  int64_t bytes_per_token() const { return (bytes_per_block() + block_size - 1) / block_size; }
};

}  // namespace vesper::backend
