// EXL2 layers packed into their tensors exactly as exllamav2's conversion writes them
// (conversion/adaptivegptq.py pack(), with exllamav2_ext/cuda/pack_tensor.cu's pack_columns and
// pack_rows_4): the inverse of exl2_format.h, for writers and tests. The format is described in
// exl2_format.h. Inputs that break the format are bugs of the caller (checked, aborting).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/safetensors.h"

namespace vesper::hf {

struct Exl2PackGroup {
  int bits = 0;      // 8, 6, 5, 4, 3 or 2, never increasing from group to group
  int64_t rows = 0;  // a multiple of 32 (of 16 for 2 bits)
};

struct Exl2PackInput {
  int64_t k = 0;  // in_features: the groups' rows sum to k
  int64_t n = 0;  // out_features
  std::vector<Exl2PackGroup> groups;
  std::vector<uint8_t> codes;        // [k][n] in packed-row order, each < 2^bits of its group
  std::vector<uint8_t> scale_codes;  // [groups][n], each < 16: scale (c + 1)^2 * max / 256
  std::vector<float> scale_max;      // [groups], stored rounded to fp16
  // The act order: packed row j is input row perm[j]. Empty: the identity.
  std::vector<int32_t> perm;
};

// The tensors of one layer (see exl2_format.h for their meaning), in little-endian memory order.
struct Exl2PackedLayer {
  int64_t k = 0, n = 0, padded_n = 0, packed_rows = 0;
  std::vector<uint32_t> q_weight;     // I32 [packed_rows, padded_n]
  std::vector<int32_t> q_invperm;     // I32 [k]: argsort(perm)
  std::vector<uint32_t> q_scale;      // I32 [groups, padded_n / 8]
  std::vector<uint16_t> q_scale_max;  // F16 [groups]
  std::vector<int16_t> q_groups;      // I16 [2 * groups]

  // The five tensors, named `<prefix>.q_weight` and so on, for write_safetensors; they point
  // into this layer.
  std::vector<gguf::SafetensorsTensorData> tensors(const std::string& prefix) const;
};

// Packs a layer as exllamav2 does: the columns padded to a multiple of 32 with the code
// 2^(bits - 1) (a zero weight) and the scale code 15 (what pack_rows_4 makes of its zero
// padding), each group's codes one bit stream per column.
Exl2PackedLayer pack_exl2(const Exl2PackInput& input);

}  // namespace vesper::hf
