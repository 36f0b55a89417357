// Weights repacked at load into the layout the matmul kernels stream best: 8 output rows
// interleaved, so one 32-byte load of quants feeds 8 output features and the 8 rows' scales
// convert as one vector (llama.cpp's block_q4_0x8 idea; the GGUF file itself is never modified).
//
// Packed: q4_0 and q8_0 matrices whose n_out is a multiple of 8 (packable() says so). Anything
// else stays on backend::matmul over the unpacked data.
//
// matmul over PackedWeights keeps every promise of backend/matmul.h and gives the same bits as
// backend::matmul on the unpacked data (both follow the block-sum contract of
// cpu/matmul_kernel.h), on every instruction set, for every batch size and thread count.
//
// Layout (one 64-byte-aligned allocation; G = n_out / 8 groups of rows 8g .. 8g + 7, B = n_in / 32
// blocks per row, chunk (g, b) = the 8 rows' block b):
//   quants: chunk (g, b) at offset (g * B + b) * Q, Q = 128 (q4_0) or 256 (q8_0) bytes
//     q4_0: 4 slices of 32 bytes; byte 4j + t of slice k holds row j's element 8k + t in its low
//           nibble and element 8k + 4 + t in its high nibble, as stored (q, the weight is q - 8)
//     q8_0: 8 slices of 32 bytes; byte 4j + t of slice k is row j's element 4k + t (int8)
//     so each 32-bit lane j of a slice is row j's, against 4 activation bytes broadcast
//   scales: after the quants, chunk (g, b)'s 8 fp16 scales (row j at j) at (g * B + b) * 8.
#pragma once

#include <cstdint>
#include <memory>

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

  // Bytes of one chunk's quants (8 rows x one 32-element block).
  static int64_t chunk_quant_bytes(tensor::GgmlType type);

 private:
  friend PackedWeights prepare_weights(tensor::GgmlType, const void*, int64_t, int64_t);
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t[], Free> data_;
  size_t bytes_ = 0;
  tensor::GgmlType type_ = tensor::GgmlType::kF32;
  int64_t n_in_ = 0;
  int64_t n_out_ = 0;
};

// Whether weights of `type` and this shape can be packed: q4_0 or q8_0, n_in a positive multiple
// of 32, n_out a positive multiple of 8.
bool packable(tensor::GgmlType type, int64_t n_in, int64_t n_out);

// Repacks n_out rows of n_in elements of `type` (rows as in backend::matmul) into a new buffer;
// `w` is only read. Returns an empty PackedWeights if !packable(type, n_in, n_out).
PackedWeights prepare_weights(tensor::GgmlType type, const void* w, int64_t n_in, int64_t n_out);

// backend::matmul on packed weights: y[r * n_out + o] = sum_i W[o][i] * x[r * n_in + i], with the
// same bits as backend::matmul on the data the weights were packed from. w must not be empty.
void matmul(const PackedWeights& w, const float* x, int64_t n_rows, float* y, ThreadPool& pool);

}  // namespace vesper::backend
