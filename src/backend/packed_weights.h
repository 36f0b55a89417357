// Weights repacked at load into the layout the matmul kernels stream best: 8 output rows
// interleaved, so one 32-byte load of quants feeds 8 output features and the 8 rows' scales
// convert as one vector (llama.cpp's block_q4_0x8 idea; the GGUF file itself is never modified).
//
// Packed: q4_0, q8_0 and k-quant (q2_K, q3_K, q4_K, q5_K, q6_K) matrices whose n_out is a multiple
// of 8 (packable() says so). Anything else stays on backend::matmul over the unpacked data.
//
// matmul over PackedWeights keeps every promise of backend/matmul.h and gives the same bits as
// backend::matmul on the unpacked data (both follow the block-sum or block-total contract of
// cpu/matmul_kernel.h), on every instruction set, for every batch size and thread count.
//
// Layout (one allocation, 64-byte aligned by core/large_buffer.h so no slice straddles a cache
// line; G = n_out / 8 groups of rows 8g .. 8g + 7, B = n_in / K blocks per row with
// K = chunk_block(type) (32, or 256 for the k-quants), chunk (g, b) = the 8 rows' block b):
//   quants: chunk (g, b) at offset (g * B + b) * Q, Q = chunk_quant_bytes(type): 128 (q4_0),
//           256 (q8_0), 512 (q2_K), 768 (q3_K), 1024 (q4_K), 1280 (q5_K), 1536 (q6_K)
//     q4_0: 4 slices of 32 bytes; byte 4j + t of slice k holds row j's element 8k + t in its low
//           nibble and element 8k + 4 + t in its high nibble, as stored (q, the weight is q - 8)
//     q8_0: 8 slices of 32 bytes; byte 4j + t of slice k is row j's element 4k + t (int8)
//     q4_K: 8 sub-blocks of 128 bytes, each laid out as a q4_0 chunk over its 32 elements
//           (element 32s + 8k + t in slice k of sub-block s), the unsigned quants q (0..15)
//     q5_K: 8 sub-blocks of 160 bytes: q4_K's 128 bytes of low nibbles, then one vector of fifth
//           bits: byte 4j + t holds, in bits 2k and 2k + 1, those of row j's elements 8k + t and
//           8k + 4 + t of the sub-block (the nibbles of byte 4j + t of slice k), so q (0..31) =
//           nibble + 16 * bit
//     q6_K: 8 groups of 32 elements, 192 bytes each: the low 4 bits of the quants q (0..63, the
//           weight is q - 32) laid out as a q4_0 chunk over the group, then 2 vectors of their
//           high 2 bits: byte 4j + t of vector m holds row j's group elements 16m + t, 16m + 4 + t,
//           16m + 8 + t and 16m + 12 + t in bits 0-1, 2-3, 4-5 and 6-7 (the bits that complete
//           slices 2m and 2m + 1)
//     q3_K: 8 groups of 32 elements, 96 bytes each: 2 vectors of the low 2 bits of the unsigned
//           quants q (0..7, the weight is q - 4) laid out as q6_K's high bits, then one vector of
//           their third bits: bit 4m + i of byte 4j + t for row j's group element 16m + 4i + t
//     q2_K: 8 groups of 32 elements, 64 bytes each: 2 vectors of the quants (0..3) laid out as
//           q6_K's high bits
//     so each 32-bit lane j of a slice is row j's, against 4 activation bytes broadcast
//   scales: after the quants, S = chunk_scale_count(type) uint16 per chunk, at (g * B + b) * S:
//     q4_0, q8_0: the 8 rows' fp16 scales d (row j at j)
//     q4_K, q5_K: fp16 d of rows 0-7, fp16 dmin of rows 0-7, then 64 bytes of 6-bit sub-block
//           scales (byte 8s + j: row j's sub-block s) and 64 bytes of mins (byte 16p + 2j + h:
//           row j's sub-block 2p + h), so that mins widen into int16 pairs for _mm256_madd_epi16
//     q3_K, q6_K: fp16 d of rows 0-7, then 128 bytes of int8 16-element sub-block scales (byte
//           16p + 2j + h: row j's sub-block 2p + h)
//     q2_K: fp16 d of rows 0-7, fp16 dmin of rows 0-7, then 128 bytes of 4-bit sub-block scales
//           and 128 bytes of 4-bit mins, one byte each, in q6_K's scale order
#pragma once

#include <cstdint>
#include <memory>

#include "core/large_buffer.h"
#include "core/thread_pool.h"
#include "tensor/ggml_type.h"

namespace vesper::backend {

class PackedWeights {
 public:
  PackedWeights() = default;  // empty: nothing packed
  PackedWeights(PackedWeights&&) noexcept = default;
  PackedWeights& operator=(PackedWeights&&) noexcept = default;

  bool empty() const { return data_ == nullptr; }
  tensor::GgmlType type() const { return type_; }
  int64_t n_in() const { return n_in_; }
  int64_t n_out() const { return n_out_; }
  const uint8_t* quants() const { return data_.get(); }
  const uint16_t* scales() const;
  size_t bytes() const { return bytes_; }

  // Elements of a row per chunk (32, or 256 for the k-quants), bytes of one chunk's quants (8 rows
  // x one such block) and uint16 scale entries per chunk (layout above), for a packed type
  // (q4_0, q8_0, q2_K ... q6_K; any other type is a programming error and aborts).
  static int64_t chunk_block(tensor::GgmlType type);
  static int64_t chunk_quant_bytes(tensor::GgmlType type);
  static int64_t chunk_scale_count(tensor::GgmlType type);

 private:
  friend PackedWeights prepare_weights(tensor::GgmlType, const void*, int64_t, int64_t);
  std::unique_ptr<uint8_t[], LargeBufferFree> data_;
  size_t bytes_ = 0;
  tensor::GgmlType type_ = tensor::GgmlType::kF32;
  int64_t n_in_ = 0;
  int64_t n_out_ = 0;
};

// Whether weights of `type` and this shape can be packed: q4_0, q8_0 or q2_K ... q6_K, n_in a
// positive multiple of the type's block size, n_out a positive multiple of 8.
bool packable(tensor::GgmlType type, int64_t n_in, int64_t n_out);

// Repacks n_out rows of n_in elements of `type` (rows as in backend::matmul) into a new buffer;
// `w` is only read. Returns an empty PackedWeights if !packable(type, n_in, n_out).
PackedWeights prepare_weights(tensor::GgmlType type, const void* w, int64_t n_in, int64_t n_out);

// backend::matmul on packed weights: y[r * n_out + o] = sum_i W[o][i] * x[r * n_in + i], with the
// same bits as backend::matmul on the data the weights were packed from. w must not be empty.
void matmul(const PackedWeights& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool);

}  // namespace vesper::backend
