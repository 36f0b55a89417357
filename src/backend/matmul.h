// Matrix multiplication of activations by a weight matrix stored in any ggml type: the op behind
// every linear layer. Weights are used in place (mmap'd GGUF data) or, for q4_0 / q8_0 / k-quant,
// repacked once (backend/packed_weights.h, same results); activations and outputs are f32,
// row-major.
//
// Promises:
//  - Batch invariance: y[r][o] is bit-identical whatever n_rows is, whatever the other rows of x
//    contain and whatever the pool's thread count. One output element is reduced in a fixed order
//    that depends only on n_in and the weight type (never on tiling or threading), and activation
//    rows are quantized one by one.
//  - The result does not depend on the instruction set picked at start: every kernel reduces in
//    the same order, so the portable, AVX2 and AVX-512 VNNI kernels agree bit for bit.
//  - Accuracy, float activations (matmul_activation_quant(type) == kNone): weights are decoded
//    exactly (tensor/quant.h) and dotted in f32 with FMA, so
//      |y - exact| <= (n_in / 32 + 6 + n_in % 32) * 2^-24 * sum_i |W[o][i] * x[r][i]|.
//  - Accuracy, quantized activations (kQ8_0, kQ8_K): x[r] is first replaced by its Q8
//    quantization xa[r] (llama.cpp's, see ActivationQuant); against that, blocks are dotted
//    exactly in integers and only their scaling and accumulation round, so
//      |y - sum_i W[o][i] * xa[r][i]| <= (n_in / B + 6) * 2^-24 * M
//    with B the weight block size (32 or 256) and M = sum_i (|A[o][i]| + |N[o][i]|) * |xa[r][i]|
//    where W = A + N splits each weight into its scale part A (d * sc * q) and its min part N
//    (-dmin * m for q2_K / q4_K / q5_K; zero for other types).
//  - No allocation after the first call with a given shape on a given thread.
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

// How matmul treats the activations for a weight type, a promise the f64 test oracles mirror:
//  - kNone: activations stay f32 (f32, f16, bf16, q4_1, q5_1, q8_K weights).
//  - kQ8_0: each activation row is quantized to Q8_0 as llama.cpp's x86 quantize_row_q8_0 does
//    (per 32 elements: d = fp16(amax / 127), q = round-half-even(x * (127 / amax))), then
//    dotted in integers (q4_0, q5_0, q8_0 weights).
//  - kQ8_K: likewise to Q8_K as llama.cpp's quantize_row_q8_K (per 256 elements: iscale =
//    -127 / (the element of largest magnitude, first on ties), q = min(127, round(iscale * x)),
//    d = 1 / iscale in f32) (q2_K, q3_K, q4_K, q5_K, q6_K weights).
enum class ActivationQuant { kNone, kQ8_0, kQ8_K };
ActivationQuant matmul_activation_quant(tensor::GgmlType type);

class PackedWeights;  // backend/packed_weights.h

// One product of a group that shares its activations (matmul_group): weights repacked (`packed`
// not null) or used in place (`type`, `w`, `n_out` rows of the group's n_in), and the output y
// (n_rows rows of n_out).
struct MatmulTarget {
  const PackedWeights* packed = nullptr;
  tensor::GgmlType type = tensor::GgmlType::kF32;
  const void* w = nullptr;
  int64_t n_out = 0;
  float* y = nullptr;
};
inline constexpr int kMaxMatmulGroup = 4;

// The products of up to kMaxMatmulGroup weight matrices with the same activations x (n_rows rows
// of n_in): the bits that one matmul per target gives, computed in one job on the pool (each
// thread takes its share of every target) with x quantized once per activation format. For the
// projections that read one input (attention q, k, v; feed-forward gate, up), where per-call
// synchronisation is a visible share of single-sequence decode.
void matmul_group(const MatmulTarget* targets, int n_targets, int64_t n_in, const float* x,
                  int64_t n_rows, ThreadPool& pool);

// Whether matmul accepts `type` as weight type: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0,
// q2_K, q3_K, q4_K, q5_K, q6_K, q8_K.
bool matmul_supported(tensor::GgmlType type);

}  // namespace vesper::backend
