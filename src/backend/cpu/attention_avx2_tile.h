// The AVX2 + FMA tile of paged attention (Avx2Tile, the Tile contract of attention_walk_tiles.h):
// online softmax over tiles of 32 keys, vectorised over head_dim for the dot products and the V
// accumulation, and across keys (8 per vector) for the scores' reduction, max and exp. It follows
// attention_kernel.h's numeric contract exactly, so it matches paged_attention_scalar bit for bit.
// It supplies the per-tile arithmetic over f32 rows from attention_avx2_rows.h, over rows of the
// other row types read in place (EncodedRows, here), over KIVI groups from attention_avx2_kivi.h.
// A head's accumulators stay in registers across a tile's keys.
//
// Include only from kernel files built with AVX2, FMA, F16C and -ffp-contract=off:
// attention_avx2.cpp, and attention_avx512.cpp, whose tile builds on this one. As in vec_exp.h,
// everything sits in an unnamed namespace, so no other file can be handed a copy built for
// another instruction set.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "backend/cpu/attention_avx2_kivi.h"
#include "backend/cpu/attention_avx2_rows.h"
#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/vec_exp.h"
#include "backend/kv_codec.h"

namespace vesper::backend::cpu {
namespace {

// The row's f16 metadata word i (0: scale, 1: zero point) as f32, by F16C.
float row_meta(const unsigned char* meta, int i) {
  uint16_t h;
  std::memcpy(&h, meta + 2 * i, sizeof(h));
  return _cvtsh_ss(h);
}

// A tile's rows of kType read where they lie in the cache, each chunk of 8 elements decoded in
// registers to exactly the values decode_kv_row gives: no copy of the tile where a tile serves
// few query heads (tile_in_place), and the conversions decode_rows stores where it serves more.
template <KvDtype kType>
struct EncodedRows {
  const unsigned char* rows[kAttentionTile];
  // Per row: int8's scale and zero point; fp8's scale times kv_fp8_f16_factor.
  float scale[kAttentionTile];
  float zero[kAttentionTile];

  EncodedRows(const std::byte* const* src, int64_t n, int64_t head_dim) {
    const int64_t meta = head_dim * kv_element_bytes(kType);
    for (int64_t i = 0; i < n; ++i) {
      rows[i] = reinterpret_cast<const unsigned char*>(src[i]);
      if constexpr (kType == KvDtype::kInt8) {
        scale[i] = row_meta(rows[i] + meta, 0);
        zero[i] = row_meta(rows[i] + meta, 1);
      } else if constexpr (kType == KvDtype::kFp8E4M3 || kType == KvDtype::kFp8E5M2) {
        scale[i] = row_meta(rows[i] + meta, 0) * kv_fp8_f16_factor(kType);
      }
    }
  }

  __m256 load(int64_t i, int64_t c) const {
    const unsigned char* p = rows[i];
    if constexpr (kType == KvDtype::kF32) {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + c);
    } else if constexpr (kType == KvDtype::kF16) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * c)));
    } else if constexpr (kType == KvDtype::kBF16) {
      const __m256i w =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * c)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    } else if constexpr (kType == KvDtype::kFp8E4M3 || kType == KvDtype::kFp8E5M2) {
      const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + c)));
      // kv_fp8_to_f16_bits, 8 lanes at once.
      const __m128i h =
          kType == KvDtype::kFp8E5M2
              ? _mm_slli_epi16(b, 8)
              : _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                             _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7));
      return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_broadcast_ss(scale + i));
    } else {
      static_assert(kType == KvDtype::kInt8);
      const __m256 q = _mm256_cvtepi32_ps(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + c))));
      return _mm256_fmadd_ps(q, _mm256_broadcast_ss(scale + i), _mm256_broadcast_ss(zero + i));
    }
  }

  // Element d of row i (the tails of head sizes that are not multiples of 8), as decode_kv_row.
  float at(int64_t i, int64_t d) const {
    const unsigned char* p = rows[i];
    uint16_t h;
    if constexpr (kType == KvDtype::kF32) {
      float x;
      std::memcpy(&x, p + 4 * d, sizeof(x));
      return x;
    } else if constexpr (kType == KvDtype::kF16 || kType == KvDtype::kBF16) {
      std::memcpy(&h, p + 2 * d, sizeof(h));
      if constexpr (kType == KvDtype::kF16) return _cvtsh_ss(h);
      const uint32_t bits = uint32_t{h} << 16;
      float x;
      std::memcpy(&x, &bits, sizeof(x));
      return x;
    } else if constexpr (kType == KvDtype::kFp8E4M3 || kType == KvDtype::kFp8E5M2) {
      return _cvtsh_ss(kv_fp8_to_f16_bits(kType, p[d])) * scale[i];
    } else {
      return std::fma(static_cast<float>(p[d]), scale[i], zero[i]);
    }
  }
};

// `rows` KV rows decoded to f32, 8 elements a vector (EncodedRows' conversions, stored), one
// type's loop over the whole tile (no per-row dispatch): the same values as decode_kv_row (every
// conversion is exact or, for int8, the same single fma), which also decodes the tails of head
// sizes that are not multiples of 8.
template <KvDtype kType>
void decode_rows(const std::byte* const* rows, int64_t n, int64_t head_dim, float* out) {
  const EncodedRows<kType> encoded(rows, n, head_dim);
  const int64_t body = head_dim / kLanes * kLanes;
  for (int64_t r = 0; r < n; ++r, out += head_dim) {
    for (int64_t i = 0; i < body; i += kLanes) _mm256_storeu_ps(out + i, encoded.load(r, i));
    if (body < head_dim) decode_kv_row(kType, rows[r], head_dim, out, body);
  }
}

// Reads one byte of every 64-byte line of the n rows at src (the first `bytes` of each), in
// memory order. Why: the kernels read a tile in place column by column (a key chunk of 8 rows,
// then the next chunk; the values' 16 channels of every row, then the next 16), so at f16 and head
// size 64 a row's first line is demanded four chunks before its second, and the hardware
// prefetcher, seeing every other line, fetches half of each stream. Read once in order first, the
// tile's rows are one sequential stream that it follows. A loop with that column order read 8-10
// GB/s on one thread, 25-34 with these loads first, and a decode step of 32 sequences of 128
// tokens at the 110M model's shape from memory took about a quarter less time
// (`vesper_microbench`'s BM_PagedAttentionDecodeLockstep; AMD Zen 5; bench/RESULTS.md, 2026-12-07
// night). Plain loads, not prefetch instructions: prefetches in the same place gained less, and
// less reliably.
inline void read_lines_in_order(const std::byte* const* src, int64_t n, int64_t bytes) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t at = 0; at < bytes; at += 64)
      static_cast<void>(*reinterpret_cast<const volatile unsigned char*>(src[i] + at));
}

// Calls f with the tile's n rows of `dtype` as EncodedRows (a row type; KIVI groups never come
// here), read in place: so first reads their lines in memory order (read_lines_in_order).
template <class F>
void with_encoded_rows(KvDtype dtype, const std::byte* const* src, int64_t n, int64_t head_dim,
                       F&& f) {
  if (!kv_is_kivi(dtype)) read_lines_in_order(src, n, head_dim * kv_element_bytes(dtype));
  switch (dtype) {
    case KvDtype::kF32:
      return f(EncodedRows<KvDtype::kF32>(src, n, head_dim));
    case KvDtype::kF16:
      return f(EncodedRows<KvDtype::kF16>(src, n, head_dim));
    case KvDtype::kBF16:
      return f(EncodedRows<KvDtype::kBF16>(src, n, head_dim));
    case KvDtype::kFp8E4M3:
      return f(EncodedRows<KvDtype::kFp8E4M3>(src, n, head_dim));
    case KvDtype::kFp8E5M2:
      return f(EncodedRows<KvDtype::kFp8E5M2>(src, n, head_dim));
    case KvDtype::kInt8:
      return f(EncodedRows<KvDtype::kInt8>(src, n, head_dim));
    case KvDtype::kKivi2:
    case KvDtype::kKivi4:
      break;
  }
  VESPER_CHECK(false, "attention: %s rows are stored in groups",
               std::string(kv_dtype_name(dtype)).c_str());
}

struct Avx2Tile {
  static void decode(KvDtype dtype, const std::byte* const* rows, int64_t n, int64_t head_dim,
                     float* out) {
    switch (dtype) {
      case KvDtype::kF16:
        return decode_rows<KvDtype::kF16>(rows, n, head_dim, out);
      case KvDtype::kBF16:
        return decode_rows<KvDtype::kBF16>(rows, n, head_dim, out);
      case KvDtype::kFp8E4M3:
        return decode_rows<KvDtype::kFp8E4M3>(rows, n, head_dim, out);
      case KvDtype::kFp8E5M2:
        return decode_rows<KvDtype::kFp8E5M2>(rows, n, head_dim, out);
      case KvDtype::kInt8:
        return decode_rows<KvDtype::kInt8>(rows, n, head_dim, out);
      case KvDtype::kF32:
      case KvDtype::kKivi2:  // never a row type (the walk decodes groups)
      case KvDtype::kKivi4:
        break;
    }
    for (int64_t i = 0; i < n; ++i) decode_kv_row(dtype, rows[i], head_dim, out + i * head_dim);
  }

  // Rows [first, first + n) of a row type's group (its rows; KIVI groups go through
  // unpack_group and kivi_tile instead).
  static void decode_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
                           const std::byte* group, int64_t first, int64_t n, float* out) {
    if (kv_is_kivi(dtype)) return decode_kv_group_rows(spec, dtype, side, group, first, n, out);
    const std::byte* rows[kAttentionTile];
    const int64_t row = spec.row_bytes(dtype);
    for (int64_t i = 0; i < n; ++i) rows[i] = group + (first + i) * row;
    decode(dtype, rows, n, spec.head_dim, out);
  }

  static void tile(const float* q, const float* const* k_rows, const float* const* v_rows,
                   int64_t nt, int64_t head_dim, float scale, float* s, float* acc, float& run_max,
                   float& run_sum) {
    scores_from_rows(q, F32Rows{k_rows}, nt, head_dim, scale, s);
    const float alpha = fold(s, nt, run_max, run_sum);
    const float* e[1] = {s};
    accumulate_queries<1>(e, F32Rows{v_rows}, nt, head_dim, &alpha, &acc);
  }

  // tile() for two queries over the same keys: each key and value chunk is loaded once for both.
  static void tile2(const float* const* q, const float* const* k_rows, const float* const* v_rows,
                    int64_t nt, int64_t head_dim, float scale, float* const* acc,
                    float* const* run_max, float* const* run_sum) {
    alignas(32) float s0[kAttentionTile], s1[kAttentionTile];
    scores2_from_rows(q[0], q[1], F32Rows{k_rows}, nt, head_dim, scale, s0, s1);
    float alpha[2];
    fold2(s0, s1, nt, run_max, run_sum, alpha);
    const float* e[2] = {s0, s1};
    accumulate_queries<2>(e, F32Rows{v_rows}, nt, head_dim, alpha, acc);
  }

  // Conversions of one instruction (f16 by F16C, bf16 by a shift) cost less than a decoded
  // copy's store and reload up to 4 heads (4 x 8 KV heads at the 1B model's shape:
  // `vesper_microbench`'s BM_PagedAttentionDecode); int8's and fp8's take 3 to 6, so a copy pays
  // from the second head on.
  static int64_t in_place_heads(KvDtype dtype) {
    return dtype == KvDtype::kF32 || dtype == KvDtype::kF16 || dtype == KvDtype::kBF16 ? 4 : 1;
  }

  // tile() over rows read where they lie (EncodedRows), for a tile that serves few query heads.
  static void tile_in_place(KvDtypes rows, int64_t d, const float* q, const std::byte* const* k_src,
                            const std::byte* const* v_src, int64_t nt, float scale, float* s,
                            float* acc, float& run_max, float& run_sum) {
    with_encoded_rows(rows.k, k_src, nt, d,
                      [&](const auto& k) { scores_from_rows(q, k, nt, d, scale, s); });
    const float alpha = fold(s, nt, run_max, run_sum);
    with_encoded_rows(rows.v, v_src, nt, d,
                      [&](const auto& v) { accumulate_rows(s, v, nt, d, alpha, acc); });
  }

  // tile_in_place() for two query heads over the same rows (a grouped-query decode token): each
  // chunk read, and decoded, once for both.
  static void tile2_in_place(KvDtypes rows, int64_t d, const float* const* q,
                             const std::byte* const* k_src, const std::byte* const* v_src,
                             int64_t nt, float scale, float* const* acc, float* const* run_max,
                             float* const* run_sum) {
    alignas(32) float s0[kAttentionTile], s1[kAttentionTile];
    with_encoded_rows(rows.k, k_src, nt, d, [&](const auto& k) {
      scores2_from_rows(q[0], q[1], k, nt, d, scale, s0, s1);
    });
    float alpha[2];
    fold2(s0, s1, nt, run_max, run_sum, alpha);
    const float* e[2] = {s0, s1};
    with_encoded_rows(rows.v, v_src, nt, d,
                      [&](const auto& v) { accumulate_queries<2>(e, v, nt, d, alpha, acc); });
  }

  static void unpack_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
                           const std::byte* group, int64_t first, int64_t n, uint8_t* codes,
                           float* params) {
    unpack_kivi_group(spec, dtype, side, group, first, n, codes, params);
  }

  static void kivi_tile(const KiviTile& t, const float* q, int64_t nt, float scale, float* s,
                        float* acc, float& run_max, float& run_sum) {
    const int64_t d = t.spec->head_dim;
    if (t.k.codes != nullptr)
      kivi_scores<1>(t, &q, nt, scale, &s);
    else
      scores_from_rows(q, F32Rows{t.k.rows}, nt, d, scale, s);
    const float alpha = fold(s, nt, run_max, run_sum);
    if (t.v.codes == nullptr) return accumulate_rows(s, F32Rows{t.v.rows}, nt, d, alpha, acc);
    kivi_values(t, s, nt, alpha, acc);
  }

  // kivi_tile() for two queries over the same keys: each key's and value's codes widened once
  // for both.
  static void kivi_tile2(const KiviTile& t, const float* const* q, int64_t nt, float scale,
                         float* const* acc, float* const* run_max, float* const* run_sum) {
    const int64_t d = t.spec->head_dim;
    alignas(32) float s0[kAttentionTile], s1[kAttentionTile];
    float* s[2] = {s0, s1};
    if (t.k.codes != nullptr)
      kivi_scores<2>(t, q, nt, scale, s);
    else
      scores2_from_rows(q[0], q[1], F32Rows{t.k.rows}, nt, d, scale, s0, s1);
    float alpha[2];
    fold2(s0, s1, nt, run_max, run_sum, alpha);
    const float* e[2] = {s0, s1};
    if (t.v.codes == nullptr) return accumulate_queries<2>(e, F32Rows{t.v.rows}, nt, d, alpha, acc);
    kivi_values2(t, e, nt, alpha, acc);
  }

  static void finish(const float* acc, float run_sum, int64_t head_dim, float* out) {
    const float inv = 1.0f / run_sum;
    const __m256 vinv = _mm256_set1_ps(inv);
    int64_t d = 0;
    for (; d + kLanes <= head_dim; d += kLanes)
      _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), vinv));
    for (; d < head_dim; ++d) out[d] = acc[d] * inv;
  }
};

}  // namespace
}  // namespace vesper::backend::cpu
