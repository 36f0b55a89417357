// Matrix multiplication of activations by a weight matrix stored in any ggml type: the op behind
// every linear layer. Weights are used in place (mmap'd GGUF data); activations and outputs are
// f32, row-major.
//
// Promises:
//  - Batch invariance: y[r][o] is bit-identical whatever n_rows is, whatever the other rows of x
//    contain and whatever the pool's thread count. One output element is reduced in a fixed order
//    that depends only on n_in and the weight type (never on tiling or threading).
//  - The result does not depend on the instruction set picked at start: every kernel reduces in
//    the same order, so the AVX2 and portable kernels agree bit for bit.
//  - Accuracy: weights are decoded exactly (tensor/quant.h) and dotted in f32 with FMA, so
//    |y - exact| <= (n_in / 32 + 6 + n_in % 32) * 2^-24 * sum_i |W[o][i] * x[r][i]|.
//  - No allocation after the first call with a given n_in on a given thread.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"
#include "tensor/ggml_type.h"

namespace vesper::backend {

// y[r*n_out + o] = sum_i W[o][i] * x[r*n_in + i]   for r < n_rows, o < n_out.
// W: n_out rows of n_in elements of `type`, row stride tensor::row_size(type, n_in), used in
// place. n_in must be a multiple of the type's block size; y must not overlap x or w.
void matmul(tensor::GgmlType type, const void* w, int64_t n_in, int64_t n_out, const float* x,
            int64_t n_rows, float* y, ThreadPool& pool);

// Whether matmul accepts `type` as weight type: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0,
// q2_K, q3_K, q4_K, q5_K, q6_K, q8_K.
bool matmul_supported(tensor::GgmlType type);

}  // namespace vesper::backend
