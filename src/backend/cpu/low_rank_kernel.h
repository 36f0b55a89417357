// The inner products of the low-rank delta kernel (backend/low_rank.h), per ISA: a weight row w
// (f32, or fp16 when `f16`) against `rows` (1..4) activation rows x[r] (f32, x_stride apart),
// each by the contract's eight lanes, fixed tree and ordered tail, so both versions give the
// same bits. low_rank.cpp picks one at run time.
#pragma once

#include <cstdint>

namespace vesper::backend::cpu {

using LowRankDotFn = void (*)(const void* w, bool f16, const float* x, int64_t x_stride,
                              int64_t n, int rows, float* out);

void low_rank_dot_scalar(const void* w, bool f16, const float* x, int64_t x_stride, int64_t n,
                         int rows, float* out);
// AVX2 + F16C; only callable on a CPU that has them.
void low_rank_dot_avx2(const void* w, bool f16, const float* x, int64_t x_stride, int64_t n,
                       int rows, float* out);

// The eight lanes folded as the contract says.
inline float low_rank_fold(const float* d) {
  return ((d[0] + d[1]) + (d[2] + d[3])) + ((d[4] + d[5]) + (d[6] + d[7]));
}

}  // namespace vesper::backend::cpu
