// Test oracle for tensor/quant.h: slow, obviously-correct dequantization in f64, written from the
// ggml format descriptions element by element (byte offsets and bit positions spelled out here,
// sharing no code with src/tensor/, not even the block structs or the fp16 conversion).
//
// Every supported format's element value is exactly representable in f64, so these values are
// exact; the fast dequantizer must return them rounded once to f32.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/ggml_type.h"

namespace vesper::reference {

// The exact value of IEEE half `h` (subnormals, infinities and NaN included).
double fp16_value(uint16_t h);

// The exact values of the n elements stored at src (n a multiple of the block size).
// Supports f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, q8_K.
std::vector<double> dequantize_row(tensor::GgmlType type, const void* src, int64_t n);

// The min part N of each of those values, for the error bounds of backend/matmul.h (W = A + N with
// A = d * sc * q and N = -dmin * m): for q2_K / q4_K / q5_K the values less what the row gives with
// dmin = 0; zeros for every other type.
std::vector<double> min_part(tensor::GgmlType type, const void* src, int64_t n);

}  // namespace vesper::reference
