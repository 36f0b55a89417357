// Portable RMSNorm and SwiGLU, written lane by lane to mirror ops_avx2.cpp (ops_kernel.h's
// contract): they are the fallback and the reference the AVX2 versions must match bit for bit.
#include <cmath>

#include "backend/cpu/ops_kernel.h"
#include "backend/cpu/vec_exp.h"

namespace vesper::backend::cpu {

void rms_norm_scalar(const float* x, const float* weight, int64_t n, int64_t rows, float eps,
                     float* y) {
  constexpr int kLanes = 8;
  const int64_t body = n / kLanes * kLanes;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double d[kLanes] = {};
    for (int64_t c = 0; c < body; c += kLanes)
      for (int l = 0; l < kLanes; ++l) d[l] += static_cast<double>(xr[c + l] * xr[c + l]);
    double sum = ((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7]));
    for (int64_t i = body; i < n; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

void silu_mul_scalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + exp_lane(-g)) * up[i];
  }
}

}  // namespace vesper::backend::cpu
