#include "backend/ops.h"

#include <cmath>
#include <vector>

#include "core/check.h"
#include "tensor/quant.h"

namespace vesper::backend {

void rms_norm(const float* x, const float* weight, int64_t n, int64_t rows, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

void rms_norm_heads(float* x, const float* weight, int64_t head_dim, int64_t rows, int64_t heads,
                    float eps) {
  rms_norm(x, weight, head_dim, rows * heads, eps, x);
}

void add_bias(float* x, const float* b, int64_t n, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) x[r * n + i] += b[i];
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void silu_mul(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void get_rows(tensor::GgmlType type, const void* weight, int64_t n, const int32_t* ids,
              int64_t count, float* out) {
  const size_t row_bytes = tensor::row_size(type, n);
  const auto* base = static_cast<const uint8_t*>(weight);
  for (int64_t i = 0; i < count; ++i)
    tensor::dequantize_row(type, base + static_cast<size_t>(ids[i]) * row_bytes, out + i * n, n);
}

void rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, const int32_t* positions,
          const RopeParams& params) {
  const int64_t dims = params.rope_dims;
  VESPER_CHECK(dims > 0 && dims <= head_dim && dims % 2 == 0, "bad rope dims %lld",
               static_cast<long long>(dims));
  // theta_i = pos * base^(-2i/dims), built by repeated multiplication in float as ggml does,
  // so angles agree with llama.cpp to the last bit where possible.
  const float theta_scale = std::pow(params.freq_base, -2.0f / static_cast<float>(dims));
  std::vector<float> cos_cache(dims / 2), sin_cache(dims / 2);
  for (int64_t r = 0; r < rows; ++r) {
    float theta = static_cast<float>(positions[r]) * params.freq_scale;
    for (int64_t i = 0; i < dims / 2; ++i) {
      float t = theta;
      if (params.freq_factors != nullptr) t /= params.freq_factors[i];
      cos_cache[i] = std::cos(t);
      sin_cache[i] = std::sin(t);
      theta *= theta_scale;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_dim;
      for (int64_t i = 0; i < dims / 2; ++i) {
        const int64_t a = params.style == RopeStyle::kNormal ? 2 * i : i;
        const int64_t b = params.style == RopeStyle::kNormal ? 2 * i + 1 : i + dims / 2;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * cos_cache[i] - x1 * sin_cache[i];
        v[b] = x0 * sin_cache[i] + x1 * cos_cache[i];
      }
    }
  }
}

}  // namespace vesper::backend
