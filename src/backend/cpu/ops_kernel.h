// Per-ISA CPU kernels for the element-wise ops of backend/ops.h that are worth vectorising
// (RMSNorm, SwiGLU), and the numeric contract both versions follow so that they agree bit for
// bit: ops.cpp picks one once, by the same runtime CPU detection as matmul.
//
// rms_norm, per row of n: sq_i = x_i * x_i in f32; eight f64 lanes d[l] = sum over chunks c in
// order of double(sq_{8c+l}), from +0; sum = ((d0 + d1) + (d2 + d3)) + ((d4 + d5) + (d6 + d7));
// then sum += double(sq_i) for the n % 8 tail in order; mean = float(sum / n);
// scale = 1 / sqrt(mean + eps) in f32; y_i = (x_i * scale) * weight_i. The f64 accumulation keeps
// ggml's accuracy (its sum is in double too); the fixed lanes and tree make it vectorisable.
//
// silu_mul, elementwise: gate_i = (g / (1 + exp(-g))) * up_i, with exp from cpu/vec_exp.h.
#pragma once

#include <cstdint>

namespace vesper::backend::cpu {

// Portable (ops_scalar.cpp).
void rms_norm_scalar(const float* x, const float* weight, int64_t n, int64_t rows, float eps,
                     float* y);
void silu_mul_scalar(float* gate, const float* up, int64_t n);

// AVX2 + FMA (ops_avx2.cpp); only callable on a CPU that has them.
void rms_norm_avx2(const float* x, const float* weight, int64_t n, int64_t rows, float eps,
                   float* y);
void silu_mul_avx2(float* gate, const float* up, int64_t n);

}  // namespace vesper::backend::cpu
