// The KV cache's element codecs: how write_kv turns a token's f32 key or value row into the
// cache's type (kv_cache_spec.h), and how attention reads it back. Attention kernels decode rows
// tile by tile into L1 as they go (cpu/attention_walk.h), to exactly the values decode_kv_row
// gives, so every kernel computes on the same numbers and a reference can recompute them.
//
// Encodings (one head's row of head_dim elements; metadata after the elements, little endian):
//   f32, f16, bf16: the value rounded to nearest even (f16 overflows to infinity, as F16C does).
//   fp8_e4m3 / fp8_e5m2: element = x / scale rounded to nearest even in the fp8 format
//     (saturating at its largest finite value, NaN stored as 0), for the scale among
//     amax / 448 (57344) * kFp8ScaleSteps[i], each rounded up to f16 (so no element saturates),
//     whose row decodes with the least squared error (summed in f64 in element order over the
//     finite elements; the first candidate on ties). With 3 (2) mantissa bits an element's error
//     depends on where it falls between two codes, and shifting the grid by half a binade lowers
//     the row's error: on stories260K, fp8_e4m3's perplexity is +1.05% of f32's with the first
//     candidate alone, +0.79% with these two, +0.78% with four (bench/RESULTS.md). Decoding is
//     exact: an fp8 value times an f16 scale fits in an f32 significand.
//   int8: zero = min rounded down to f16, scale = (max - min) / 255 rounded up to f16,
//     q = round((x - zero) / scale) clamped to 0..255; decoded as fma(q, scale, zero).
// Scales are per token and head, so a row's encoding depends on that row alone: the same token
// gives the same bytes however it was batched or chunked (batch invariance) and wherever its
// slot is (copies move rows whole).
//
// KIVI groups (kivi2 / kivi4, b = 2 / 4 bits, L = 2^b - 1 levels; one head's G tokens, G = the
// block size, D = head_dim). Each run of elements sharing parameters is quantized as int8 is:
// zero = its minimum rounded down to f16, scale = (max - zero) / L rounded up to f16,
// q = round((x - zero) / scale) clamped to 0..L, decoded as fma(q, scale, zero). The inputs are
// the group's residual rows as stored (f16), so quantizing a group is a function of its stored
// rows alone: the engine's compaction and attention's on-the-fly quantization of the same group
// give the same bytes.
//   keys (per channel): D f16 scales, D f16 zero points, then G rows of D packed elements.
//   values (per token, channel groups of min(G, D) channels): G rows, each D packed elements
//     then an f16 scale and zero point per channel group.
// Packed elements: element c of a row at bit c * b of the row's bytes (little endian within a
// byte), the row padded to whole bytes (kivi_packed_row_bytes).
// Row types' "groups" are their G rows, back to back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backend/kv_cache_spec.h"
#include "core/fp16.h"

namespace vesper::backend {

// The fp8 scale candidates' factors: 1 and 2^(1/2), as f32.
inline constexpr float kFp8ScaleSteps[] = {1.0f, 1.41421356f};

// Writes x[0..n) as one row of `dtype` (kv_row_metadata_bytes(dtype) bytes of metadata follow
// the n elements).
void encode_kv_row(KvDtype dtype, const float* x, int64_t n, std::byte* row);

// fp8 with a scale fixed beforehand (--calculate-kv-scales): x[0..n) coded against the f16 scale
// `scale_bits` (saturating at the format's largest value; a zero scale codes every element 0),
// the row's metadata that same scale, so it decodes as any fp8 row does.
void encode_fp8_row_scaled(KvDtype dtype, const float* x, int64_t n, uint16_t scale_bits,
                           std::byte* row);
// The f16 scale bits that map a magnitude of `amax` to the fp8 format's largest value (rounded
// up; 0 for an amax of 0): a calibrated scale.
uint16_t fp8_scale_bits(KvDtype dtype, float amax);

// The portable decoder: out[i] = the value of the row's element i for i in [begin, n) (a row of n
// elements); the reference for every kernel's decoder, and their tail.
void decode_kv_row(KvDtype dtype, const std::byte* row, int64_t n, float* out, int64_t begin = 0);

// One KIVI run's parameters (the rule above) from the smallest and largest of its finite values
// (lo > hi: none): zero = lo rounded down to f16, scale = (hi - zero) / levels rounded up to f16;
// a value x is coded clamp(round((x - zero) / scale), 0, levels), round to nearest even, a NaN
// quotient as 0, and every code 0 when scale is 0. Shared by every encoder of the rule.
struct KiviRunParams {
  uint16_t scale_bits = 0, zero_bits = 0;
  float scale = 0, zero = 0;
};
KiviRunParams kivi_run_params(float lo, float hi, int levels);
// The smallest and largest finite value of x[i * stride], i < n, taken in order as std::min /
// std::max keep them (the first of equal values: a -0 before a +0 stays); +inf / -inf when none.
void kivi_finite_range(const float* x, int64_t n, int64_t stride, float& lo, float& hi);
// The code of one value under a run's parameters (the rule above).
uint8_t kivi_code(float x, const KiviRunParams& p, int levels);
// Packs codes[begin, n) of `bits` bits each into a row (element c at bit c * bits), OR-ing them
// into its bytes (a zeroed row, or one whose elements before `begin` are packed already).
void kivi_pack_codes(const uint8_t* codes, int64_t begin, int64_t n, int bits, std::byte* row);
// Element c's code in a packed row.
inline uint8_t kivi_unpack_code(const std::byte* row, int64_t c, int bits) {
  const int64_t bit = c * bits;
  return static_cast<uint8_t>((static_cast<unsigned>(row[bit / 8]) >> (bit % 8)) &
                              ((1u << bits) - 1));
}

// Encodes G = spec.block_size rows x[G][head_dim] as one head's group of `dtype` (keys or values)
// into group[spec.group_bytes(dtype, side)]. Row types encode each row.
void encode_kv_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side, const float* x,
                     std::byte* group);

// The portable group decoder: out[i][d] = the value of rows [first, first + n) of a group,
// out[i * head_dim + d].
void decode_kv_group_rows(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
                          const std::byte* group, int64_t first, int64_t n, float* out);

// The row's f16 metadata word `i` (0: scale; 1: zero point), as f32.
inline float kv_row_meta(KvDtype dtype, const std::byte* row, int64_t n, int i) {
  uint16_t h;
  std::memcpy(&h, row + n * kv_element_bytes(dtype) + 2 * i, sizeof(h));
  return fp16_to_f32(h);
}

// fp8 element bits as the f16 bits whose value, times kv_fp8_f16_factor, is the fp8 value: e5m2
// is the top byte of an f16; e4m3's exponent and mantissa sit 7 bits up in an f16, which
// rebiases the exponent by 2^-8 (normal and subnormal values alike).
inline uint16_t kv_fp8_to_f16_bits(KvDtype dtype, uint8_t b) {
  if (dtype == KvDtype::kFp8E5M2) return static_cast<uint16_t>(b << 8);
  return static_cast<uint16_t>(((b & 0x80u) << 8) | ((b & 0x7Fu) << 7));
}
inline float kv_fp8_f16_factor(KvDtype dtype) {
  return dtype == KvDtype::kFp8E5M2 ? 1.0f : 256.0f;
}

}  // namespace vesper::backend
