// The per-type CPU matmul kernel interface, and the numeric contract every kernel follows.
//
// A kernel computes a range of output features for all activation rows. matmul_cpu.cpp picks
// one kernel per (instruction set, weight type) at start and splits output features across the
// thread pool; a kernel never sees threads.
//
// Numeric contract (what makes matmul batch-invariant and ISA-independent): the weight row is
// decoded exactly to f32 (as tensor::dequantize_row does), then for each output element
//   acc[j][l] = fma(w[32c + 8j + l], x[32c + 8j + l], acc[j][l])  for chunks c in order,
//                                                                  j < 4, l < 8, acc from +0
//   s[l]      = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l])
//   t[l]      = s[l] + s[l + 4]                                    for l < 4
//   sum       = (t[0] + t[1]) + (t[2] + t[3])
//   sum       = fma(w[i], x[i], sum)     for the n_in % 32 tail elements i in order (plain types)
// This is ggml's AVX2 f32 dot layout (4 accumulators of 8 lanes, the same reduction tree); a
// kernel may tile, fuse and reorder work freely across output elements but never within one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/ggml_type.h"

namespace vesper::backend::cpu {

struct MatmulArgs {
  const uint8_t* w;    // n_out rows of w_row_bytes each
  size_t w_row_bytes;  // tensor::row_size(type, n_in)
  int64_t n_in;
  int64_t n_out;
  const float* x;  // n_rows rows of n_in
  int64_t n_rows;
  float* y;  // n_rows rows of n_out
};

// Computes y[r * n_out + o] for every r < n_rows and o in [o_begin, o_end). `scratch` holds
// kernel_scratch_floats(n_in) floats private to the calling thread.
using MatmulKernel = void (*)(const MatmulArgs& args, int64_t o_begin, int64_t o_end,
                              float* scratch);

// Room for one decoded weight row plus one decoded super-block.
inline size_t kernel_scratch_floats(int64_t n_in) {
  return static_cast<size_t>(n_in) + 256 + 32;
}

// The portable kernel for `type` (matmul_scalar.cpp); nullptr if the type is not supported.
MatmulKernel scalar_kernel(tensor::GgmlType type);

// AVX2 + FMA + F16C kernels, one per weight type, each in its own matmul_<type>_avx2.cpp.
// Only callable on a CPU that has those extensions.
void matmul_f32_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_f16_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_bf16_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_q4_0_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_q4_1_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_q5_0_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_q5_1_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_q8_0_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_q2_k_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_q3_k_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_q4_k_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_q5_k_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_q6_k_avx2(const MatmulArgs&, int64_t, int64_t, float*);
void matmul_q8_k_avx2(const MatmulArgs&, int64_t, int64_t, float*);

}  // namespace vesper::backend::cpu
