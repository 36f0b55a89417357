#include <immintrin.h>

#include "backend/cpu/low_rank_kernel.h"
#include "backend/low_rank.h"
#include "core/fp16.h"

namespace vesper::backend::cpu {

void low_rank_dot_avx2(const void* w, bool f16, const float* x, int64_t x_stride, int64_t n,
                       int rows, float* out) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  const int64_t body = n - n % 8;
  const auto* wf = static_cast<const float*>(w);
  const auto* wh = static_cast<const uint16_t*>(w);
  for (int64_t i = 0; i < body; i += 8) {
    const __m256 wv =
        f16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wh + i)))
            : _mm256_loadu_ps(wf + i);
    for (int r = 0; r < rows; ++r)
      acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(wv, _mm256_loadu_ps(x + r * x_stride + i)));
  }
  for (int r = 0; r < rows; ++r) {
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc[r]);
    float sum = low_rank_fold(lanes);
    for (int64_t i = body; i < n; ++i) {
      const float wi = f16 ? fp16_to_f32(wh[i]) : wf[i];
      sum = sum + wi * x[r * x_stride + i];
    }
    out[r] = sum;
  }
}

void low_rank_expand_avx2(const void* b, bool f16, int64_t b_stride, int64_t rank, int64_t n_out,
                          int64_t permute_head_dim, const float* lambda_b, const float* t,
                          int64_t t_stride, int rows, float* y, int64_t y_stride) {
  const int64_t body = rank - rank % 8;
  const auto* bf = static_cast<const float*>(b);
  const auto* bh = static_cast<const uint16_t*>(b);
  for (int64_t g = 0; g < n_out; ++g) {
    const int64_t src = low_rank_source_row(g, permute_head_dim);
    const int64_t row = src * b_stride;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (int64_t j = 0; j < body; j += 8) {
      const __m256 wv =
          f16 ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bh + row + j)))
              : _mm256_loadu_ps(bf + row + j);
      for (int r = 0; r < rows; ++r)
        acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(wv, _mm256_loadu_ps(t + r * t_stride + j)));
    }
    for (int r = 0; r < rows; ++r) {
      // ((d0 + d1) + (d2 + d3)) + ((d4 + d5) + (d6 + d7)), the contract's tree.
      const __m256 h1 = _mm256_hadd_ps(acc[r], acc[r]);
      const __m256 h2 = _mm256_hadd_ps(h1, h1);
      float sum =
          _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(h2), _mm256_extractf128_ps(h2, 1)));
      for (int64_t j = body; j < rank; ++j) {
        const float w = f16 ? fp16_to_f32(bh[row + j]) : bf[row + j];
        sum = sum + w * t[r * t_stride + j];
      }
      if (lambda_b != nullptr) sum = sum * lambda_b[src];
      y[r * y_stride + g] = y[r * y_stride + g] + sum;
    }
  }
}

}  // namespace vesper::backend::cpu
