// EXL2 layers repacked at load into parts the CPU kernels run exactly (backend.h's composite
// weights): a run of groups of one bit width becomes one part of an integer type that holds its
// values exactly, and the act-order permutation becomes the order the part gathers its inputs in.
//
// Why exact: an EXL2 weight is (q - 2^(b-1)) * s, with one fp16 scale s per output column and
// group of input rows (a multiple of 32 rows). A 32-row block of one column is therefore one
// scale and 32 small integers: Q4_0 holds 2-, 3- and 4-bit codes (code + 8 - 2^(b-1)), Q5_0
// 5-bit ones, Q8_0 6- and 8-bit ones, each with d = s. exllamav2 rounds each product to fp16;
// these kernels use the exact product (they differ by at most 2^-11 relative per weight). Weights
// stay packed (4.5, 5.5 or 8.5 bits per weight), never expanded to f16.
//
// In the assembled GGUF a repacked layer is a composite weight (gguf/composite_weight.h), which
// Model::load binds as one weight.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/result.h"
#include "hf/exl2_format.h"
#include "tensor/ggml_type.h"

namespace vesper::hf {

struct Exl2Part {
  tensor::GgmlType type = tensor::GgmlType::kQ4_0;
  int64_t n_in = 0;           // gathered inputs (packed rows of its groups)
  std::vector<uint8_t> data;  // n_out rows of row_size(type, n_in) bytes
};

struct Exl2Repacked {
  std::vector<int32_t> input_order;  // the original input row of each gathered position
  std::vector<Exl2Part> parts;
};

// The repacked layer; output row o of the parts is the layer's column output_order[o] (identity
// when empty: the q/k permutation of llama rides here). Errors (a group of 16 rows, which no
// 32-row block type holds exactly) name the layer.
Result<Exl2Repacked> repack_exl2(const Exl2Layer& layer, std::span<const int32_t> output_order);

}  // namespace vesper::hf
