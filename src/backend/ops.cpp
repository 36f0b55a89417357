#include "backend/ops.h"

#include <cmath>
#include <vector>

#include "backend/cpu/matmul_cpu.h"
#include "backend/cpu/ops_kernel.h"
#include "core/check.h"
#include "tensor/quant.h"

namespace vesper::backend {
namespace {

bool use_avx2() {
  static const bool avx2 = cpu::selected_isa() != cpu::Isa::kScalar;
  return avx2;
}

// Per-thread cos/sin table for one row's rotation angles. It grows to the
// largest rope_dims seen and is then reused, so steady-state calls do not
// allocate.
float* rope_scratch(int64_t pairs) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < 2 * pairs) scratch.resize(2 * pairs);
  return scratch.data();
}

// cos_sin[i], cos_sin[pairs + i] = cos, sin of pair i's angle at `position`.
// theta_i = pos * base^(-2i/dims), built by repeated multiplication in float as
// ggml does, so angles agree with llama.cpp to the last bit where possible.
void rope_angles(int32_t position, const RopeParams& params, float theta_scale, float* cos_sin) {
  const int64_t pairs = params.rope_dims / 2;
  if (params.ext_factor != 0.0f) {  // YaRN, in ggml's order of operations
    const float mscale = params.attn_factor * (1.0f + 0.1f * std::log(1.0f / params.freq_scale));
    float theta_base = static_cast<float>(position);
    for (int64_t i = 0; i < pairs; ++i) {
      float extrap = theta_base;
      if (params.freq_factors != nullptr) extrap /= params.freq_factors[i];
      const float interp = params.freq_scale * extrap;
      const float y = (static_cast<float>(i) - params.corr_low) /
                      std::max(0.001f, params.corr_high - params.corr_low);
      const float mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * params.ext_factor;
      const float t = interp * (1.0f - mix) + extrap * mix;
      cos_sin[i] = std::cos(t) * mscale;
      cos_sin[pairs + i] = std::sin(t) * mscale;
      theta_base *= theta_scale;
    }
    return;
  }
  float theta = static_cast<float>(position) * params.freq_scale;
  for (int64_t i = 0; i < pairs; ++i) {
    float t = theta;
    if (params.freq_factors != nullptr) t /= params.freq_factors[i];
    cos_sin[i] = std::cos(t);
    cos_sin[pairs + i] = std::sin(t);
    theta *= theta_scale;
  }
}

void rope_heads(float* x, int64_t heads, int64_t head_dim, const RopeParams& params,
                const float* cos_sin) {
  const int64_t pairs = params.rope_dims / 2;
  const float* c = cos_sin;
  const float* s = cos_sin + pairs;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    if (params.style == RopeStyle::kNormal) {
      for (int64_t i = 0; i < pairs; ++i) {
        const float x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * c[i] - x1 * s[i];
        v[2 * i + 1] = x0 * s[i] + x1 * c[i];
      }
    } else {
      for (int64_t i = 0; i < pairs; ++i) {
        const float x0 = v[i], x1 = v[i + pairs];
        v[i] = x0 * c[i] - x1 * s[i];
        v[i + pairs] = x0 * s[i] + x1 * c[i];
      }
    }
  }
}

float rope_theta_scale(const RopeParams& params, int64_t head_dim) {
  const int64_t dims = params.rope_dims;
  VESPER_CHECK(dims > 0 && dims <= head_dim && dims % 2 == 0, "bad rope dims %lld",
               static_cast<long long>(dims));
  return std::pow(params.freq_base, -2.0f / static_cast<float>(dims));
}

}  // namespace

void rms_norm(const float* x, const float* weight, int64_t n, int64_t rows, float eps, float* y) {
  if (use_avx2())
    cpu::rms_norm_avx2(x, weight, n, rows, eps, y);
  else
    cpu::rms_norm_scalar(x, weight, n, rows, eps, y);
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
  if (use_avx2())
    cpu::silu_mul_avx2(gate, up, n);
  else
    cpu::silu_mul_scalar(gate, up, n);
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
  const float theta_scale = rope_theta_scale(params, head_dim);
  float* cos_sin = rope_scratch(params.rope_dims / 2);
  for (int64_t r = 0; r < rows; ++r) {
    rope_angles(positions[r], params, theta_scale, cos_sin);
    rope_heads(x + r * heads * head_dim, heads, head_dim, params, cos_sin);
  }
}

void rope_qk(float* q, int64_t n_head, float* k, int64_t n_head_kv, int64_t rows, int64_t head_dim,
             const int32_t* positions, const RopeParams& params) {
  const float theta_scale = rope_theta_scale(params, head_dim);
  float* cos_sin = rope_scratch(params.rope_dims / 2);
  for (int64_t r = 0; r < rows; ++r) {
    rope_angles(positions[r], params, theta_scale, cos_sin);
    rope_heads(q + r * n_head * head_dim, n_head, head_dim, params, cos_sin);
    rope_heads(k + r * n_head_kv * head_dim, n_head_kv, head_dim, params, cos_sin);
  }
}

}  // namespace vesper::backend
