// Test oracle for EXL2 layers (hf/exl2_format.h, hf/exl2_pack.h): the weights of a layer in f64
// from the raw little-endian bytes of its tensors, written from the format's description alone
// and sharing no code with src/hf/: bits read one at a time, fp16 decoded from its definition,
// the scale (c + 1)^2 * max / 256 and the weight (q - 2^(bits - 1)) * scale computed exactly.
// Slow on purpose. The tensors are assumed valid (exl2_format.h validates); sizes are checked.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace vesper::reference {

struct Exl2RawLayer {
  int64_t k = 0;                         // in_features
  int64_t n = 0;                         // out_features
  std::span<const uint8_t> q_weight;     // int32 [packed rows, n rounded up to 32]
  std::span<const uint8_t> q_invperm;    // int32 [k]
  std::span<const uint8_t> q_scale;      // int32 [groups, padded n / 8]
  std::span<const uint8_t> q_scale_max;  // fp16 [groups]
  std::span<const uint8_t> q_groups;     // int16 [2 * groups]
};

// Everything about W[k][n], for input row k in the original order and output column n:
// element k * n_cols + n of each vector.
struct Exl2Dequantized {
  std::vector<int> code;        // the stored code q
  std::vector<int> bits;        // the bit width of its group
  std::vector<int> scale_code;  // the 4-bit scale code c
  std::vector<double> scale;    // (c + 1)^2 * q_scale_max / 256
  std::vector<double> weight;   // (q - 2^(bits - 1)) * scale
};

Exl2Dequantized dequantize_exl2(const Exl2RawLayer& layer);

}  // namespace vesper::reference
