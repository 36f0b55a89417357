// KvCacheSpec: how the paged KV cache stores a model's keys and values: the element types (keys
// and values may differ), the block geometry and the model's KV heads. The storage (KvCache, a
// backend's KV buffers) and the memory plan both take their sizes from here, so a new KV element
// type changes this file, the codec (kv_codec.h) and the kernels, and nothing that sizes the cache.
#pragma once

#include <algorithm>
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
  // KIVI (Liu et al., ICML 2024): quantized a group of G tokens at a time (G = the block size),
  // keys per channel over the group's tokens, values per token over groups of G channels, 2 or 4
  // bits with an f16 scale and zero point each (kv_codec.h); a token's rows stay f16 (its
  // "residual" rows) until its group is quantized as a whole.
  kKivi2,
  kKivi4,
};

// The types stored one row per token (the residual rows of every type, and all of a row type's
// rows).
inline constexpr KvDtype kRowKvDtypes[] = {KvDtype::kF32,     KvDtype::kF16,     KvDtype::kBF16,
                                           KvDtype::kFp8E4M3, KvDtype::kFp8E5M2, KvDtype::kInt8};
inline constexpr KvDtype kKiviKvDtypes[] = {KvDtype::kKivi2, KvDtype::kKivi4};

inline bool kv_is_kivi(KvDtype dtype) {
  return dtype == KvDtype::kKivi2 || dtype == KvDtype::kKivi4;
}
// Bits per quantized element of a KIVI type.
inline int kv_kivi_bits(KvDtype dtype) {
  return dtype == KvDtype::kKivi2 ? 2 : 4;
}
// The type a token's rows are written in: f16 for KIVI (until the group is quantized), else the
// type itself.
inline KvDtype kv_row_dtype(KvDtype dtype) {
  return kv_is_kivi(dtype) ? KvDtype::kF16 : dtype;
}

// The canonical name ("f16", "fp8_e4m3", ...), as --kv-cache-dtype takes it.
std::string_view kv_dtype_name(KvDtype dtype);
// Parses a --kv-cache-dtype value: the canonical names, "auto" (f16), "fp8" (fp8_e4m3), and the
// spellings vLLM and llama.cpp use for the same types (float32, fp32, float16, half, bfloat16,
// fp8_e4m3fn). nullopt for anything else.
std::optional<KvDtype> parse_kv_dtype(std::string_view name);
// Every accepted value with its bytes per element, for --help and error messages.
std::string kv_dtype_choices();

// Of a row type (kv_row_dtype of a KIVI type for its residual rows).
int64_t kv_element_bytes(KvDtype dtype);
// Bytes of metadata after each row's elements (scales, zero points); 0 for float types.
int64_t kv_row_metadata_bytes(KvDtype dtype);

// Bytes of one KIVI row's packed elements: head_dim elements of 2 or 4 bits, rounded up to bytes.
inline int64_t kivi_packed_row_bytes(KvDtype dtype, int64_t head_dim) {
  return (head_dim * kv_kivi_bits(dtype) + 7) / 8;
}
// A KIVI value row's channel groups: runs of `group` channels (the group size), the last cut at
// head_dim.
inline int64_t kivi_value_channel_groups(int64_t group, int64_t head_dim) {
  return (head_dim + group - 1) / group;
}

// Whether a group of `group` tokens of `dtype` holds keys (per-channel KIVI) or values (per-token).
enum class KvSide : uint8_t { kKey, kValue };

// The element types of keys and of values.
struct KvDtypes {
  KvDtype k = KvDtype::kF16;
  KvDtype v = KvDtype::kF16;
  // "f16", or "k int8, v fp8_e4m3" when they differ.
  std::string describe() const;
  bool operator==(const KvDtypes&) const = default;
};

// The block geometry. A physical block holds, per layer and KV head, one "unit" of bytes for
// keys and one for values, in one of two forms:
//  - a quantized group: block_size tokens in the final form of the type (a KIVI group; for row
//    types, block_size rows: the only form they have, so caches without KIVI always use it);
//  - residual rows: residual_rows_per_block() rows of kv_row_dtype (f16 for KIVI) as written,
//    for the newest tokens of a KIVI cache, whose group is not quantized yet.
// Without KIVI both forms are the same block_size rows, and residual_rows_per_block() ==
// block_size. With KIVI, block_size is the KIVI group size, and the rows of a group not yet
// quantized take residual_blocks_per_group() blocks (their tables are kv/'s business).
struct KvCacheSpec {
  KvDtypes dtypes;
  int64_t n_layers = 0;
  int64_t block_size = 16;  // tokens per block (per quantized group with KIVI)
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  // KIVI: a query at position p reads the groups wholly before p + 1 - kivi_residual_length
  // quantized, the rest as written (kivi_quantized_tokens).
  int64_t kivi_residual_length = 0;
  // KIVI: residual rows a block must hold (0: as many as a quantized group's bytes hold). A draft
  // model's cache follows the target's block tables, so it takes the target's count, and its
  // units grow to hold that many of its own rows where they need to.
  int64_t residual_rows = 0;
  // Quest (query-aware block selection): each block keeps, per layer and KV head, every key
  // channel's minimum and maximum over its written rows (f32), from which attention bounds q.k
  // (KvCache::key_bounds); with KIVI, a quantized group's bounds are those of its rows as written.
  bool key_bounds = false;

  bool kivi() const { return kv_is_kivi(dtypes.k) || kv_is_kivi(dtypes.v); }
  // Tokens a query at `position` reads in quantized form: whole groups before
  // position + 1 - kivi_residual_length (0 without KIVI).
  int64_t kivi_quantized_tokens(int64_t position) const {
    if (!kivi()) return 0;
    const int64_t before = position + 1 - kivi_residual_length;
    return before <= 0 ? 0 : before / block_size * block_size;
  }

  // Bytes of one head's row of one token as written (kv_row_dtype), metadata included.
  int64_t row_bytes(KvDtype dtype) const {
    const KvDtype r = kv_row_dtype(dtype);
    return head_dim * kv_element_bytes(r) + kv_row_metadata_bytes(r);
  }
  int64_t key_row_bytes() const { return row_bytes(dtypes.k); }
  int64_t value_row_bytes() const { return row_bytes(dtypes.v); }
  // Bytes of one head's quantized group of block_size tokens of `dtype` (kv_codec.h's layout).
  int64_t group_bytes(KvDtype dtype, KvSide side) const;
  // Bytes of one head's unit of one block: the larger of its two forms.
  int64_t key_unit_bytes() const {
    return std::max(group_bytes(dtypes.k, KvSide::kKey), residual_rows * key_row_bytes());
  }
  int64_t value_unit_bytes() const {
    return std::max(group_bytes(dtypes.v, KvSide::kValue), residual_rows * value_row_bytes());
  }
  // Residual rows a block holds (block_size without KIVI; at least 1).
  int64_t residual_rows_per_block() const;
  // Blocks the residual rows of one group take.
  int64_t residual_blocks_per_group() const {
    const int64_t r = residual_rows_per_block();
    return (block_size + r - 1) / r;
  }
  // Blocks one sequence holds at most as it decodes up to `tokens` tokens, a token a step.
  // Without KIVI, its groups of block_size rows. With KIVI, the most comes at the first token of
  // its last group, once the groups a query there reads quantized are compacted (KvCacheManager
  // does that at the start of each step): a block for each such group, residual_blocks_per_group()
  // for each later one. The residual groups are then the ones touching the newest
  // kivi_residual_length tokens, ceil((R - 1) / G) + 1 of them at most: 5 at R 128 and G 32, 4 at
  // R 96. (A prompt chunk holds its groups as residual rows until the next step compacts them.)
  int64_t peak_blocks(int64_t tokens) const {
    const int64_t groups = (tokens + block_size - 1) / block_size;
    if (!kivi() || groups == 0) return groups;
    const int64_t quantized = kivi_quantized_tokens((groups - 1) * block_size) / block_size;
    return quantized + (groups - quantized) * residual_blocks_per_group();
  }
  // Elements of one token's keys (or values) in one layer.
  int64_t token_elements() const { return n_kv_heads * head_dim; }
  // Bytes of one block's keys (values) in one layer.
  int64_t key_block_bytes_per_layer() const { return n_kv_heads * key_unit_bytes(); }
  int64_t value_block_bytes_per_layer() const { return n_kv_heads * value_unit_bytes(); }
  // Bytes of one block's key bounds in one layer (0 without them).
  int64_t key_bounds_bytes_per_layer() const {
    return key_bounds ? n_kv_heads * 2 * head_dim * static_cast<int64_t>(sizeof(float)) : 0;
  }
  // Bytes of one block, K and V (and key bounds), every layer.
  int64_t bytes_per_block() const {
    return n_layers * (key_block_bytes_per_layer() + value_block_bytes_per_layer() +
                       key_bounds_bytes_per_layer());
  }
  // Bytes per token of capacity: a block's bytes over its tokens (rounded up); for KIVI, of
  // quantized tokens (the residual rows of the newest tokens take more).
  int64_t bytes_per_token() const { return (bytes_per_block() + block_size - 1) / block_size; }
};

}  // namespace vesper::backend
