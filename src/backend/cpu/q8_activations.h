// Activation rows quantized to 8 bits once per matmul call, in llama.cpp's formats, for the
// integer-dot kernels: Q8_0 (32-element blocks, fp16 scale; ggml's quantize_row_q8_0 on AVX2) for
// the legacy weight types and Q8_K (256-element blocks, f32 scale, sums of 16; ggml's
// quantize_row_q8_K) for the k-quants.
//
// The layout is Vesper's own (structure of arrays: all quants of a row contiguous, scales as
// f32 values, block sums apart) since no file ever holds it; the values are ggml's. One portable
// implementation serves every instruction set, so the quantized activations cannot differ between
// ISAs.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/matmul.h"

namespace vesper::backend::cpu {

// A view of n_rows quantized rows of n_in elements each (n_blocks = n_in / block per row).
// Row r's element i is d[k] * qs[k * block + i % block] with k = block_index(r, i / block).
//
// Rows are stored in tiles of `interleave` consecutive rows, and within a tile the rows' blocks
// alternate: block b of the tile's rows 0 .. interleave - 1, then block b + 1, and so on. With
// interleave 1 (the default) that is plain row-major order: row r's quants at qs + r * n_in. The
// packed-weight kernels ask for 4, so that the 4 rows of a register tile sit in one stream
// (llama.cpp's block_q8_0x4 / block_q8_Kx4) and need one pointer, not four.
struct Q8Rows {
  ActivationQuant format = ActivationQuant::kNone;
  int64_t n_in = 0;
  int64_t block = 0;           // 32 (Q8_0) or 256 (Q8_K)
  int64_t interleave = 1;      // rows per tile (above); 1 or 4
  const int8_t* qs = nullptr;  // quants, |q| <= 127
  const float* d = nullptr;    // one scale per block; Q8_0 scales are fp16 values
  // Sums of quants: Q8_K of each 16 consecutive ones (16 per block, at 16 * block_index); Q8_0 of
  // each block of 32 (one per block, at block_index; the packed q4_0 kernels take unsigned nibbles
  // and subtract 8 * sum).
  const int16_t* bsums = nullptr;

  // The storage index of row r's block b: its scale is d[block_index(r, b)] and its quants start
  // at qs + block_index(r, b) * block.
  int64_t block_index(int64_t r, int64_t b) const {
    const int64_t n_blocks = n_in / block;
    return ((r / interleave) * n_blocks + b) * interleave + r % interleave;
  }
};

// Owns the storage behind a Q8Rows; grows to the largest shape seen, then stops allocating.
class Q8Buffer {
 public:
  // Sizes the storage for n_rows rows of n_in, stored in tiles of `interleave` rows (Q8Rows), and
  // returns the view the rows will be written to.
  Q8Rows prepare(ActivationQuant format, int64_t n_in, int64_t n_rows, int64_t interleave = 1);

 private:
  std::vector<int8_t> qs_;
  std::vector<float> d_;
  std::vector<int16_t> bsums_;
};

// Quantizes rows [r_begin, r_end) of x (rows of rows.n_in floats) into `rows`, whose storage
// came from Q8Buffer::prepare. Rows are independent, so threads may fill disjoint ranges. With
// use_avx2 (only on a CPU that has AVX2 + F16C) rows take the AVX2 quantizers, which give the same
// bits as the portable ones.
void quantize_rows(const Q8Rows& rows, const float* x, int64_t r_begin, int64_t r_end,
                   bool use_avx2);

// One row of Q8_0 on AVX2 (q8_activations_avx2.cpp): blocks of x[0, n) to qs, d and bsums, block
// b at qs + 32 * stride * b, d[stride * b] and bsums[stride * b].
void quantize_row_q8_0_avx2(const float* x, int64_t n, int64_t stride, int8_t* qs, float* d,
                            int16_t* bsums);

// One row of Q8_K on AVX2: blocks of 256 to qs + 256 * stride * b, d[stride * b] and the 16 sums
// at bsums + 16 * stride * b.
void quantize_row_q8_k_avx2(const float* x, int64_t n, int64_t stride, int8_t* qs, float* d,
                            int16_t* bsums);

}  // namespace vesper::backend::cpu
