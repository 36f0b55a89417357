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

// A view of n_rows quantized rows of n_in elements each. Row r's element i is
// d[r * n_blocks + i / block] * qs[r * n_in + i].
struct Q8Rows {
  ActivationQuant format = ActivationQuant::kNone;
  int64_t n_in = 0;
  int64_t block = 0;           // 32 (Q8_0) or 256 (Q8_K)
  const int8_t* qs = nullptr;  // quants, |q| <= 127
  const float* d = nullptr;    // one scale per block; Q8_0 scales are fp16 values
  // Sums of quants: Q8_K of each 16 consecutive ones; Q8_0 of each block of 32 (the packed q4_0
  // kernels take unsigned nibbles and subtract 8 * sum).
  const int16_t* bsums = nullptr;
};

// Owns the storage behind a Q8Rows; grows to the largest shape seen, then stops allocating.
class Q8Buffer {
 public:
  // Sizes the storage for n_rows rows of n_in and returns the view the rows will be written to.
  Q8Rows prepare(ActivationQuant format, int64_t n_in, int64_t n_rows);

 private:
  std::vector<int8_t> qs_;
  std::vector<float> d_;
  std::vector<int16_t> bsums_;
};

// Quantizes rows [r_begin, r_end) of x (rows of rows.n_in floats) into `rows`, whose storage
// came from Q8Buffer::prepare. Rows are independent, so threads may fill disjoint ranges.
void quantize_rows(const Q8Rows& rows, const float* x, int64_t r_begin, int64_t r_end);

}  // namespace vesper::backend::cpu
