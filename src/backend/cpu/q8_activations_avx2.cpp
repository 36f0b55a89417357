// The AVX2 activation quantizers: ggml's x86 quantize_row_q8_0, 32 floats per block in four
// vectors, and quantize_row_q8_K, 256 per block. Same values as the portable ones
// (q8_activations.cpp) bit for bit: the maximum is exact in any order, each scaled value is one
// rounding either way, _mm256_cvtps_epi32 rounds to nearest, ties to even, as round_nearest does,
// and the block sums are exact integer sums.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/q8_activations.h"
#include "core/fp16.h"

namespace vesper::backend::cpu {

void quantize_row_q8_0_avx2(const float* x, int64_t n, int64_t stride, int8_t* qs, float* d,
                            int16_t* bsums) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  // packs_epi32 / packs_epi16 interleave the 128-bit lanes; this puts the dwords back in order.
  const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < n / 32; ++b, x += 32, qs += 32 * stride, d += stride, bsums += stride) {
    __m256 v0 = _mm256_loadu_ps(x);
    __m256 v1 = _mm256_loadu_ps(x + 8);
    __m256 v2 = _mm256_loadu_ps(x + 16);
    __m256 v3 = _mm256_loadu_ps(x + 24);
    __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign_bit, v0), _mm256_andnot_ps(sign_bit, v1));
    m = _mm256_max_ps(
        m, _mm256_max_ps(_mm256_andnot_ps(sign_bit, v2), _mm256_andnot_ps(sign_bit, v3)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    *d = fp16_to_f32(f32_to_fp16(amax / 127.0f));
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, id));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, id));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, id));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, id));
    // The block's quant sum, exact in int32.
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
    *bsums = static_cast<int16_t>(_mm_cvtsi128_si32(s4));
    // |values| <= 127, so the saturating packs are exact.
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs), _mm256_permutevar8x32_epi32(p, unshuffle));
  }
}

void quantize_row_q8_k_avx2(const float* x, int64_t n, int64_t stride, int8_t* qs, float* d,
                            int16_t* bsums) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256i unshuffle = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i q_max = _mm256_set1_epi32(127);
  for (int64_t b = 0; b < n / 256;
       ++b, x += 256, qs += 256 * stride, d += stride, bsums += 16 * stride) {
    __m256 m = _mm256_setzero_ps();
    // max_ps returns its second operand where either is NaN: a NaN input is passed over, as the
    // portable scan's comparison passes it over.
    for (int i = 0; i < 256; i += 8)
      m = _mm256_max_ps(_mm256_andnot_ps(sign_bit, _mm256_loadu_ps(x + i)), m);
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    if (amax == 0.0f) {
      *d = 0.0f;
      std::memset(qs, 0, 256);
      std::memset(bsums, 0, 16 * sizeof(int16_t));
      continue;
    }
    // The signed value of the first element of largest magnitude, as the portable scan finds it.
    const __m256 vamax = _mm256_set1_ps(amax);
    float max = amax;
    for (int i = 0; i < 256; i += 8) {
      const __m256 v = _mm256_loadu_ps(x + i);
      const int hits =
          _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign_bit, v), vamax, _CMP_EQ_OQ));
      if (hits != 0) {
        max = x[i + __builtin_ctz(static_cast<unsigned>(hits))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m256 vs = _mm256_set1_ps(iscale);
    for (int i = 0; i < 256; i += 32) {
      const __m256i i0 =
          _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i))), q_max);
      const __m256i i1 = _mm256_min_epi32(
          _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + 8))), q_max);
      const __m256i i2 = _mm256_min_epi32(
          _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + 16))), q_max);
      const __m256i i3 = _mm256_min_epi32(
          _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + i + 24))), q_max);
      // The two 16-element sums: hadd pairs within 128-bit lanes, then the lanes added.
      const __m256i h = _mm256_hadd_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
      const __m256i h2 = _mm256_hadd_epi32(h, h);
      const __m128i sums =
          _mm_add_epi32(_mm256_castsi256_si128(h2), _mm256_extracti128_si256(h2, 1));
      bsums[i / 16] = static_cast<int16_t>(_mm_cvtsi128_si32(sums));
      bsums[i / 16 + 1] = static_cast<int16_t>(_mm_extract_epi32(sums, 1));
      // |values| <= 127, so the saturating packs are exact.
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + i),
                          _mm256_permutevar8x32_epi32(p, unshuffle));
    }
    *d = 1.0f / iscale;
  }
}

}  // namespace vesper::backend::cpu
