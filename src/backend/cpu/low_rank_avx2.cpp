#include <immintrin.h>

#include "backend/cpu/low_rank_kernel.h"
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

}  // namespace vesper::backend::cpu
