// Test oracle for the activation quantization of backend::matmul (backend/matmul.h,
// ActivationQuant): the values llama.cpp's Q8_0 and Q8_K quantizers give an f32 row, written
// from their definitions with explicit f32 steps and sharing no code with src/backend/ (rounding
// by std::nearbyint, fp16 rounding by exact scaling in f64).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/matmul.h"

namespace vesper::reference {

// Rounding decisions across many quantize_activations calls (a whole forward pass), numbered in
// call order. An oracle that computes activations in f64 sees values a few f32 ulps away from the
// fast path's, so where x * (1 / d) lies within a hair of a rounding tie the two may round
// differently; such elements are recorded, and one of them can be rounded the other way, so a
// test can tell a legitimate difference in one rounding decision from an error.
struct RoundingTrace {
  double window = 0.0;             // record elements within this (in quant steps) of a tie
  std::vector<int64_t> near_ties;  // recorded elements, by number
  int64_t flip = -1;               // the element, by number, rounded to its other neighbour
  int64_t next = 0;                // the number the next quantized element gets
};

// x[0, n) replaced by its quantization d * q, exactly, per block of 32 (kQ8_0) or 256 (kQ8_K);
// kNone returns x unchanged. n must be a multiple of the block size.
std::vector<double> quantize_activations(backend::ActivationQuant format, const float* x, int64_t n,
                                         RoundingTrace* trace = nullptr);

}  // namespace vesper::reference
