// EXL2, exllamav2's quantization format, as it lies on disk: one quantized linear layer's tensors
// found, validated and decoded (exl2_repack.h builds the CPU parts from it). An Exl2Layer owns
// only its group table; its pointers are into the mapped safetensors files, which must outlive it.
//
// The format, as exllamav2's conversion writes it (conversion/adaptivegptq.py, pack()) and its
// loader and kernels read it (module.py, ext.py, exllamav2_ext/cuda/q_matrix.cu, quant/qdq_*.cuh):
//
// A layer y = x W^T + b has K = in_features inputs and N = out_features outputs; N' is N rounded
// up to a multiple of 32 (pack() pads with -N % 32 columns, as linear.py's pad32 does). The input
// rows of W^T are quantized in an act-order permutation: packed row j is input row perm[j], and
// the file stores q_invperm = argsort(perm), so input row k is packed row q_invperm[k]. The packed
// rows form G groups in order; group g has a bit width b_g in {8, 6, 5, 4, 3, 2} (never
// increasing from one group to the next: the kernels take the rows of each width as one run, 8
// bits first) and R_g rows (a multiple of 32, or of 16 for 2 bits: the kernels step through a
// group in those units). Tensors, under the layer's prefix ("model.layers.0.mlp.down_proj"):
//   q_weight     I32 [sum of R_g * b_g / 32, N']  the codes, group after group
//   q_invperm    I32 [K]                          input row k is packed row q_invperm[k]
//   q_scale      I32 [G, N' / 8]                  4-bit scale codes: column n of group g at
//                                                 bits 4 * (n % 8) of word n / 8
//   q_scale_max  F16 [G]
//   q_groups     I16 [2G]                         per group: bits, first row of q_weight
//   bias         F16 [N] or [N']                  optional (exllamav2's loader takes [N'] only:
//                                                 make_q_matrix checks it against q_weight)
// exllamav2 never writes q_perm: its loader derives it, argsort(q_invperm). Group g's row count
// is not stored: it is (q_groups[2g + 3] - q_groups[2g + 1]) * 32 / b_g, and for the last group
// (q_weight's rows - q_groups[2G - 1]) * 32 / b_g (ext.py make_group_map; q_matrix.cu takes the
// last group as the rows left of K, the same count in a valid file).
//
// Codes. Within a group, the codes of one column form one little-endian bit stream, least
// significant bit first, across consecutive int32 rows of q_weight: the code of the group's row r
// is bits [r * b, r * b + b) of the stream (bit i: bit i % 32 of the group's row i / 32). So:
//   8 bits: 4 codes a word;  4 bits: 8 a word;  2 bits: 16 a word;
//   6 bits: 16 codes in 3 words (codes 5 and 10 straddle a word boundary);
//   5 bits: 32 codes in 5 words (codes 6, 12, 19 and 25 straddle);
//   3 bits: 32 codes in 3 words (codes 10 and 21 straddle).
// A code q means (q - 2^(b - 1)) * scale. Padded columns hold the code 2^(b - 1), a zero weight,
// and the scale code 15 (pack() pads the scales with 0, and pack_rows_4, which stores each scale
// minus one in 16-bit arithmetic, turns that into all ones). Nothing reads them back.
//
// Scales. A scale code c (0..15: the quantizer's 1..16, stored minus one) of group g means
// (c + 1)^2 * q_scale_max[g] / 256. exllamav2 computes it in fp16: max = fp16(q_scale_max[g] /
// 256) (ext.py scales the fp16 tensor, rounding back to fp16: exact unless the result is
// subnormal), then scale = fp16((c + 1)^2 * max) (qdq_util.cuh dq_scale); a weight is
// fp16((q - 2^(b - 1)) * scale). exl2_scale() and exl2_weight() round exactly so, each product
// of two fp16 values exact in f32 and rounded once to fp16, to nearest even.
// (A model-specific `prescale`, MiniCPM's scale_depth, multiplies q_scale_max at load in
// exllamav2: a property of the architecture, not of the file, and not applied here.)
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "gguf/safetensors.h"

namespace vesper::hf {

// A tensor looked up by name: the tensor and the file that holds it. When no file holds it,
// `tensor` is null and `file` names where it was looked for (the checkpoint, or the one file).
struct TensorRef {
  const gguf::SafetensorsTensor* tensor = nullptr;
  std::string file;
};
using TensorLookup = std::function<TensorRef(std::string_view name)>;

// A lookup over a checkpoint's files (its shards); a missing tensor is reported against `where`.
// The files must outlive the lookup.
TensorLookup lookup_in(std::span<const gguf::SafetensorsFile> files, std::string where);

struct Exl2Group {
  int bits = 0;
  int64_t rows = 0;              // packed rows (input rows, in act order) of the group
  int64_t first_row = 0;         // its first packed row: the rows of the groups before it
  int64_t first_packed_row = 0;  // its first int32 row of q_weight
};

struct Exl2Layer {
  std::string name;         // the tensors' prefix, for errors
  int64_t k = 0;            // in_features
  int64_t n = 0;            // out_features
  int64_t padded_n = 0;     // N': n rounded up to a multiple of 32
  int64_t packed_rows = 0;  // q_weight's int32 rows
  std::vector<Exl2Group> groups;
  // The tensors' little-endian data in the mapped files, not necessarily aligned.
  const uint8_t* q_weight = nullptr;     // int32 [packed_rows, padded_n]
  const uint8_t* q_invperm = nullptr;    // int32 [k]
  const uint8_t* q_scale = nullptr;      // int32 [groups, padded_n / 8]
  const uint8_t* q_scale_max = nullptr;  // fp16 [groups]
  const uint8_t* bias = nullptr;         // fp16 [n] (at least), null when the layer has none
};

// The layer `prefix` of `k` inputs and `n` outputs (from config.json: k, n > 0). Validates what
// exllamav2 takes on trust: every tensor present with its dtype and its shape against k and n,
// bit widths in {2, 3, 4, 5, 6, 8} and never increasing, each group's rows a whole number of
// int32 rows and a multiple of 32 (16 for 2 bits), the groups covering exactly k rows and
// q_weight's rows, q_invperm a permutation of [0, k), q_scale_max finite. Errors name the file
// and the tensor.
Result<Exl2Layer> read_exl2_layer(const TensorLookup& lookup, const std::string& prefix, int64_t k,
                                  int64_t n);

// The group that holds packed row `packed_row`.
int64_t exl2_group_of(const Exl2Layer& layer, int64_t packed_row);

// The packed row of input row `k` (q_invperm[k]).
int64_t exl2_packed_row(const Exl2Layer& layer, int64_t k);

// The codes of group `group`, columns [n_begin, n_end) (within padded_n):
// codes[r * (n_end - n_begin) + (n - n_begin)] for the group's row r.
void exl2_decode_group(const Exl2Layer& layer, int64_t group, int64_t n_begin, int64_t n_end,
                       std::span<uint8_t> codes);

// The code of packed row `packed_row`, column n (< padded_n).
int exl2_code(const Exl2Layer& layer, int64_t packed_row, int64_t n);

// The 4-bit scale code of group `group`, column n (< padded_n).
int exl2_scale_code(const Exl2Layer& layer, int64_t group, int64_t n);

// The scale of group `group`, column n, in fp16 as exllamav2 computes it (see above).
float exl2_scale(const Exl2Layer& layer, int64_t group, int64_t n);

// W[n][k]: the weight of input row k (original order) and output n, in fp16 as exllamav2's
// dequantization gives it.
float exl2_weight(const Exl2Layer& layer, int64_t k, int64_t n);

}  // namespace vesper::hf
