// The per-type CPU matmul kernel interface, and the numeric contracts every kernel follows.
//
// A kernel computes a range of output features for all activation rows. matmul_cpu.cpp picks
// one kernel per (instruction set, weight type) at start and splits output features across the
// thread pool; a kernel never sees threads.
//
// The contracts, by weight type (backend::matmul_activation_quant says which applies); they are
// what makes matmul batch-invariant and ISA-independent.
//
// Float contract (f32, f16, bf16, q4_1, q5_1, q8_K): the weight row is decoded
// exactly to f32 (as tensor::dequantize_row does), then for each output element
//   acc[j][l] = fma(w[32c + 8j + l], x[32c + 8j + l], acc[j][l])  for chunks c in order,
//                                                                  j < 4, l < 8, acc from +0
//   s[l]      = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l])
//   t[l]      = s[l] + s[l + 4]                                    for l < 4
//   sum       = (t[0] + t[1]) + (t[2] + t[3])
//   sum       = fma(w[i], x[i], sum)     for the n_in % 32 tail elements i in order (plain types)
// This is ggml's AVX2 f32 dot layout (4 accumulators of 8 lanes, the same reduction tree).
//
// Block-sum contract (q4_0, q5_0, q8_0 against Q8_0 activations, 32-element blocks): the
// activation row is quantized once per call (q8_activations.h), giving quants xq and one f32
// scale dx[b] per block; weight block b of output o is d[b] * wint[i] with integer wint. For each
// output element, blocks b in order, acc from +0:
//   isum = sum over the block's 32 elements of wint[i] * xq[i]                      (exact)
//   acc  = fma(float(isum), d[b] * dx[b], acc)
//   sum  = acc
// isum is exact in f32 (|isum| <= 32 * 128 * 127 < 2^24). This is the order of llama.cpp's
// repacked (q4_0 8x8) AVX2 kernels; it lets one vector hold 8 outputs of 8 interleaved weight rows
// (packed_weights.h) with the unpacked kernels giving the same bits.
//
// Block-total contract (the k-quants q2_K ... q6_K against Q8_K activations, 256-element
// super-blocks): the activation row is quantized once per call (q8_activations.h), giving quants
// xq, one f32 scale dx[b] per block and sums of each 16 quants bsums. Weight block b of output o
// is w[i] = d * wint[i] - dmin * m(i / 16) with integers wint (sub-block scale times quant, the
// offsets of q3_K's -4 and q6_K's -32 included) and m (the sub-block mins of q2_K / q4_K / q5_K;
// q3_K and q6_K have none). For each output element,
// blocks b in order, acc and accm from +0:
//   isum = sum over the block's 256 elements of wint[i] * xq[i]                      (exact)
//   imin = sum over the block's 16-groups g of m(g) * bsums[g]                         (exact)
//   acc  = fma(float(isum), d * dx[b], acc)
//   accm = fma(float(imin), dmin * dx[b], accm)                      (q2_K, q4_K, q5_K)
//   sum  = acc - accm                                                 (q3_K, q6_K: sum = acc)
// |isum| < 2^31, so the integer is exact; its conversion to f32 rounds once, the same way for
// every kernel. This is the order of llama.cpp's repacked q4_K (8x8) AVX2 kernels; like the
// block-sum contract it lets one vector hold 8 outputs of 8 interleaved weight rows. (ggml's
// unrepacked k-quant dots keep 8 lanes of partial sums per output instead, so their bits differ
// from these by f32 rounding.)
//
// Either way a kernel may tile, fuse and reorder work freely across output elements but never
// within one.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/q8_activations.h"
#include "tensor/ggml_type.h"

namespace vesper::backend::cpu {

struct MatmulArgs {
  const uint8_t* w;    // n_out rows of w_row_bytes each
  size_t w_row_bytes;  // tensor::row_size(type, n_in)
  int64_t n_in;
  int64_t n_out;
  const float* x;  // n_rows rows of n_in
  int64_t n_rows;
  float* y;                    // n_rows rows of n_out
  const Q8Rows* xq = nullptr;  // x quantized, for integer-dot kernels (else nullptr)
  // Packed weights (packed_weights.h) only: w holds the interleaved quants and w_scales the
  // scales (PackedWeights::chunk_scale_count per group of 8 rows and block); w_row_bytes is
  // unused.
  const uint16_t* w_scales = nullptr;
};

// Computes y[r * n_out + o] for every r < n_rows and o in [o_begin, o_end). `scratch` holds
// kernel_scratch_floats(n_in) floats private to the calling thread.
using MatmulKernel = void (*)(const MatmulArgs& args, int64_t o_begin, int64_t o_end,
                              float* scratch);

// Weight rows a float-contract kernel decodes at once (the AVX2 prefill GEMM's register tile).
inline constexpr int64_t kDecodedRows = 3;

// Room for kDecodedRows decoded weight rows plus one decoded super-block.
inline size_t kernel_scratch_floats(int64_t n_in) {
  return static_cast<size_t>(kDecodedRows * n_in) + 256 + 32;
}

// The portable kernel for `type` (matmul_scalar.cpp); nullptr if the type is not supported.
MatmulKernel scalar_kernel(tensor::GgmlType type);

// The portable integer-dot kernel for `type` (matmul_q8_scalar.cpp); nullptr for types on the
// float contract.
MatmulKernel scalar_q8_kernel(tensor::GgmlType type);

// Kernels over 8-row packed weights (packed_weights.h) for q4_0, q8_0 and q2_K ... q6_K,
// portable (matmul_packed_scalar.cpp) and AVX2 (matmul_packed_avx2.cpp); o_begin and o_end are
// multiples of 8. nullptr for other types. Bit-identical to the unpacked kernels (block-sum and
// block-total contracts). They read activations quantized in tiles of kPackedRowTile rows
// (Q8Rows::interleave).
inline constexpr int64_t kPackedRowTile = 4;
MatmulKernel scalar_packed_kernel(tensor::GgmlType type);
MatmulKernel avx2_packed_kernel(tensor::GgmlType type);
// AVX-512 VNNI kernels (matmul_packed_avx512_vnni.cpp): every packed type (q4_0, q8_0, q2_K ...
// q6_K); nullptr for any other.
MatmulKernel avx512_vnni_packed_kernel(tensor::GgmlType type);

// AVX2 + FMA + F16C kernels, one per weight type, each in its own matmul_<type>_avx2.cpp
// (integer-dot ones on gemm_q8_avx2.h, the others on gemm_avx2.h). Only callable on a CPU that
// has those extensions.
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
