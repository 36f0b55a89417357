// The element-wise and normalisation ops a transformer forward pass needs, on the CPU.
// Every op is written row by row, so a row's result never depends on the other rows in the
// batch (batch invariance, ARCHITECTURE.md). Matmul lives in matmul.h, attention in
// paged_attention.h.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "tensor/ggml_type.h"

namespace vesper::backend {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for `rows` rows of n. The sum of squares
// is accumulated in double, as ggml does, in eight lanes combined by a fixed tree
// (cpu/ops_kernel.h), so the AVX2 and portable versions agree bit for bit. x and y may alias.
void rms_norm(const float* x, const float* weight, int64_t n, int64_t rows, float eps, float* y);

// Per-head RMSNorm (Qwen3's Q/K norm): x holds rows x heads vectors of head_dim, each
// normalised and scaled by weight[head_dim]; in place.
void rms_norm_heads(float* x, const float* weight, int64_t head_dim, int64_t rows, int64_t heads,
                    float eps);

// x[r] += b for each of `rows` rows of n.
void add_bias(float* x, const float* b, int64_t n, int64_t rows);

// y += x elementwise over n values.
void add_inplace(float* y, const float* x, int64_t n);

// gate = silu(gate) * up elementwise (SwiGLU), over n values. exp is cpu/vec_exp.h's
// (within 2 ulp, the same bits on every ISA), not the C library's.
void silu_mul(float* gate, const float* up, int64_t n);

// Copies row `ids[i]` of a [n_rows x n] weight matrix of `type` into out[i], dequantized.
void get_rows(tensor::GgmlType type, const void* weight, int64_t n, const int32_t* ids,
              int64_t count, float* out);

enum class RopeStyle {
  kNormal,  // llama: rotates adjacent pairs (x[2i], x[2i+1])
  kNeox,    // GPT-NeoX / qwen2: rotates halves (x[i], x[i + rope_dims/2])
};

struct RopeParams {
  RopeStyle style = RopeStyle::kNormal;
  int64_t rope_dims = 0;  // leading dims of each head that rotate (<= head_dim)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;  // linear scaling: positions are multiplied by this
  // Per-dimension-pair frequency divisors (llama3 rope scaling: rope_freqs); nullptr = none.
  const float* freq_factors = nullptr;
  // YaRN (ggml's rope_yarn): with ext_factor != 0, pair i's angle blends the interpolated angle
  // (times freq_scale) and the original one by a ramp that is 1 below pair corr_low and 0 above
  // corr_high, and cos/sin are scaled by attn_factor * (1 + 0.1 ln(1 / freq_scale)).
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float corr_low = 0.0f;
  float corr_high = 0.0f;
};

// Applies rotary position embedding in place to `rows` rows of `heads` x head_dim values,
// row r at position positions[r]. Angles are computed per row into per-thread scratch that is
// reused across calls, so steady-state calls do not allocate.
void rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, const int32_t* positions,
          const RopeParams& params);

// rope() of a row's queries (n_head heads) and keys (n_head_kv heads) in one pass, computing each
// row's angles once for both. Bit-identical to calling rope() on each.
void rope_qk(float* q, int64_t n_head, float* k, int64_t n_head_kv, int64_t rows, int64_t head_dim,
             const int32_t* positions, const RopeParams& params);

}  // namespace vesper::backend
