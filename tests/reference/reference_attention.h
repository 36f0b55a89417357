// Slow, obviously-correct f64 versions of the backend's attention and element-wise ops, straight
// from the equations, with no paging, batching, threading or SIMD: the oracles the fast CPU
// kernels in src/backend are checked against.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops.h"

namespace vesper::reference {

// Causal attention of one query token over keys 0..n_keys-1 of its sequence. q holds n_heads x
// head_dim; keys[j] and values[j] point to position j's n_kv_heads x head_dim row. Query head h
// reads KV head h / (n_heads / n_kv_heads). Returns n_heads x head_dim.
std::vector<double> attention(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                              const std::vector<const float*>& keys,
                              const std::vector<const float*>& values, double scale);

// y = x / sqrt(mean(x^2) + eps) * weight, one row of n.
std::vector<double> rms_norm(const float* x, const float* weight, int64_t n, double eps);

// silu(gate) * up, elementwise.
double silu_mul(double gate, double up);

// RoPE of `heads` vectors of head_dim at `position`, with angles from the closed form
// pos * freq_scale * base^(-2i/dims) / freq_factor_i in f64.
std::vector<double> rope(const float* x, int64_t heads, int64_t head_dim, int32_t position,
                         const backend::RopeParams& params);

}  // namespace vesper::reference
