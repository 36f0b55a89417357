// Slow, obviously-correct f64 versions of the backend's attention and element-wise ops, straight
// from the equations, with no paging, batching, threading or SIMD: the oracles the fast CPU
// kernels in src/backend are checked against.
#pragma once

#include <cstdint>
#include <vector>

#include <functional>

#include "backend/ops.h"
#include "model/forward_batch.h"

namespace vesper::reference {

// Causal attention of one query token over keys 0..n_keys-1 of its sequence. q holds n_heads x
// head_dim; keys[j] and values[j] point to position j's n_kv_heads x head_dim row. Query head h
// reads KV head h / (n_heads / n_kv_heads). Returns n_heads x head_dim.
std::vector<double> attention(const float* q, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                              const std::vector<const float*>& keys,
                              const std::vector<const float*>& values, double scale);

// Attention of every row of a ForwardBatch over K/V kept per cache slot (`key(slot)`,
// `value(slot)`: n_kv_heads x head_dim floats each), as the batch describes it: a row attends to
// its sequence's positions 0..its own (through the block table), or, for a sequence with a tree
// description, to the positions before the sequence's first row and to the rows on its path from
// the root (through their own slots). q holds each row's n_heads x head_dim values. Returns one
// n_heads x head_dim vector per row.
std::vector<std::vector<double>> batch_attention(const model::ForwardBatch& batch, int64_t block_size,
                                                 const std::function<const float*(int64_t)>& key,
                                                 const std::function<const float*(int64_t)>& value,
                                                 const float* q, int64_t n_heads, int64_t n_kv_heads,
                                                 int64_t head_dim, double scale);

// y = x / sqrt(mean(x^2) + eps) * weight, one row of n.
std::vector<double> rms_norm(const float* x, const float* weight, int64_t n, double eps);

// silu(gate) * up, elementwise.
double silu_mul(double gate, double up);

// RoPE of `heads` vectors of head_dim at `position`, with angles from the closed form
// pos * freq_scale * base^(-2i/dims) / freq_factor_i in f64.
std::vector<double> rope(const float* x, int64_t heads, int64_t head_dim, int32_t position,
                         const backend::RopeParams& params);

}  // namespace vesper::reference
