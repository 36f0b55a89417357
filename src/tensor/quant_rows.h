// Internal to tensor/: the per-type row converters behind quant.h's dispatch. Each works on whole
// blocks (n_blocks of them); the dispatcher checks sizes. Legacy types live in quant_legacy.cpp,
// k-quants in quant_k.cpp, the scale searches they share in quant_search.h.
#pragma once

#include <cstdint>
#include <cstring>

namespace vesper::tensor::detail {

// Blocks are read and written through memcpy: GGUF data is only byte-addressable as far as the
// language is concerned, and a block copy costs nothing next to the conversion itself.
template <class Block>
inline Block load_block(const uint8_t* src, int64_t index) {
  Block b;
  std::memcpy(&b, src + index * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
  return b;
}
template <class Block>
inline void store_block(const Block& b, uint8_t* dst, int64_t index) {
  std::memcpy(dst + index * static_cast<int64_t>(sizeof(Block)), &b, sizeof(Block));
}

void dequantize_q4_0(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q4_1(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q5_0(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q5_1(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q8_0(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q2_k(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q3_k(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q4_k(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q5_k(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q6_k(const uint8_t* src, float* dst, int64_t n_blocks);
void dequantize_q8_k(const uint8_t* src, float* dst, int64_t n_blocks);

void quantize_q4_0(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q4_1(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q5_0(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q5_1(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q8_0(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q2_k(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q3_k(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q4_k(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q5_k(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q6_k(const float* src, uint8_t* dst, int64_t n_blocks);
void quantize_q8_k(const float* src, uint8_t* dst, int64_t n_blocks);

}  // namespace vesper::tensor::detail
