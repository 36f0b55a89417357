// The inner products of the low-rank delta kernel (backend/low_rank.h), per ISA: a weight row w
// (f32, or fp16 when `f16`) against `rows` (1..4) activation rows x[r] (f32, x_stride apart),
// each by the contract's eight lanes, fixed tree and ordered tail, so both versions give the
// same bits. low_rank.cpp picks one at run time.
#pragma once

#include <cstdint>

namespace vesper::backend::cpu {

using LowRankDotFn = void (*)(const void* w, bool f16, const float* x, int64_t x_stride, int64_t n,
                              int rows, float* out);

void low_rank_dot_scalar(const void* w, bool f16, const float* x, int64_t x_stride, int64_t n,
                         int rows, float* out);
// AVX2 + F16C; only callable on a CPU that has them.
void low_rank_dot_avx2(const void* w, bool f16, const float* x, int64_t x_stride, int64_t n,
                       int rows, float* out);

// The expand step for `rows` rows: y[r][g] += lambda_b[src(g)] * dot(B[src(g)], t[r]) (lambda_b
// optional; dot over `rank` by the same contract) for every output row g < n_out, src(g) the
// row permutation of backend/low_rank.h (low_rank_source_row; permute_head_dim 0: none). One call
// per delta and row group, so no per-row call overhead.
using LowRankExpandFn = void (*)(const void* b, bool f16, int64_t b_stride, int64_t rank,
                                 int64_t n_out, int64_t permute_head_dim, const float* lambda_b,
                                 const float* t, int64_t t_stride, int rows, float* y,
                                 int64_t y_stride);
void low_rank_expand_scalar(const void* b, bool f16, int64_t b_stride, int64_t rank, int64_t n_out,
                            int64_t permute_head_dim, const float* lambda_b, const float* t,
                            int64_t t_stride, int rows, float* y, int64_t y_stride);
void low_rank_expand_avx2(const void* b, bool f16, int64_t b_stride, int64_t rank, int64_t n_out,
                          int64_t permute_head_dim, const float* lambda_b, const float* t,
                          int64_t t_stride, int rows, float* y, int64_t y_stride);

// The eight lanes folded as the contract says.
inline float low_rank_fold(const float* d) {
  return ((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7]));
}

}  // namespace vesper::backend::cpu
