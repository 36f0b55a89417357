// Row conversion between f32 and the ggml tensor types: dequantize a row of any type Vesper can
// read into f32, and quantize f32 into the types Vesper can write. Byte layouts are exactly
// ggml's (tensor/quant_blocks.h), so GGUF files interoperate with llama.cpp.
//
// Promises:
//  - dequantize_row gives, for every element, the exact value its format describes (for example
//    d * sc * q - dmin * m) rounded once to f32. Every format is built so that the products are
//    exact in f32, so this is also what ggml's scalar dequantizers compute.
//  - quantize_row searches scales to minimise the (weighted) squared error, in the manner of
//    ggml's reference quantizers; its bytes need not equal ggml's, its layout does.
//  - Blocks are independent: converting a row equals converting its blocks one by one.
// n (elements) must be a multiple of the type's block size; src and dst must not overlap.
#pragma once

#include <cstdint>

#include "tensor/ggml_type.h"

namespace vesper::tensor {

// Types dequantize_row accepts: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K ... q8_K.
bool can_dequantize(GgmlType type);

// Types quantize_row accepts: the same set.
bool can_quantize(GgmlType type);

// dst[0, n) = the values of the n elements stored at src (row_size(type, n) bytes).
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// Writes row_size(type, n) bytes at dst encoding src[0, n). Inputs must be finite.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

}  // namespace vesper::tensor
