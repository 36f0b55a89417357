// AVX2 RMSNorm and SwiGLU following ops_kernel.h's contract, bit-identical to ops_scalar.cpp.
#include <immintrin.h>

#include <cmath>

#include "backend/cpu/ops_kernel.h"
#include "backend/cpu/vec_exp.h"

namespace vesper::backend::cpu {

void rms_norm_avx2(const float* x, const float* weight, int64_t n, int64_t rows, float eps,
                   float* y) {
  constexpr int kLanes = 8;
  const int64_t body = n / kLanes * kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();  // lanes 0..3 and 4..7
    for (int64_t c = 0; c < body; c += kLanes) {
      const __m256 v = _mm256_loadu_ps(xr + c);
      const __m256 sq = _mm256_mul_ps(v, v);
      lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
      hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    // [d0 + d1, d4 + d5, d2 + d3, d6 + d7], then the halves added: ((d0+d1) + (d2+d3)) and
    // ((d4+d5) + (d6+d7)), then those two.
    const __m256d pairs = _mm256_hadd_pd(lo, hi);
    const __m128d quads =
        _mm_add_pd(_mm256_castpd256_pd128(pairs), _mm256_extractf128_pd(pairs, 1));
    double sum = _mm_cvtsd_f64(_mm_add_sd(quads, _mm_unpackhi_pd(quads, quads)));
    for (int64_t i = body; i < n; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    const __m256 vscale = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i < body; i += kLanes)
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), vscale),
                                             _mm256_loadu_ps(weight + i)));
    for (; i < n; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

void silu_mul_avx2(float* gate, const float* up, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_avx2(_mm256_xor_ps(g, sign));
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + exp_lane(-g)) * up[i];
  }
}

}  // namespace vesper::backend::cpu
