#include "hf/exl2_repack.h"

#include <cstring>

#include "core/fp16.h"
#include "tensor/quant_blocks.h"

namespace vesper::hf {
namespace {

using tensor::GgmlType;

GgmlType part_type(int bits) {
  if (bits <= 4) return GgmlType::kQ4_0;
  if (bits == 5) return GgmlType::kQ5_0;
  return GgmlType::kQ8_0;
}

// One 32-row block of one column: the codes' values (q - 2^(b-1)) and the scale, into `out`.
void write_block(GgmlType type, const int* values, float scale, uint8_t* out) {
  const uint16_t d = f32_to_fp16(scale);  // scale is an fp16 value: exact
  if (type == GgmlType::kQ4_0) {
    tensor::BlockQ4_0 b{};
    b.d = d;
    for (int j = 0; j < 16; ++j)
      b.qs[j] = static_cast<uint8_t>((values[j] + 8) | ((values[j + 16] + 8) << 4));
    std::memcpy(out, &b, sizeof(b));
  } else if (type == GgmlType::kQ5_0) {
    tensor::BlockQ5_0 b{};
    b.d = d;
    uint32_t high = 0;
    for (int j = 0; j < 32; ++j)
      if ((values[j] + 16) & 16) high |= uint32_t{1} << j;
    std::memcpy(b.qh, &high, sizeof(high));
    for (int j = 0; j < 16; ++j)
      b.qs[j] = static_cast<uint8_t>(((values[j] + 16) & 15) | (((values[j + 16] + 16) & 15) << 4));
    std::memcpy(out, &b, sizeof(b));
  } else {
    tensor::BlockQ8_0 b{};
    b.d = d;
    for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(values[j]);
    std::memcpy(out, &b, sizeof(b));
  }
}

}  // namespace

Result<Exl2Repacked> repack_exl2(const Exl2Layer& layer, std::span<const int32_t> output_order) {
  Exl2Repacked r;
  r.input_order.resize(static_cast<size_t>(layer.k));
  // Packed row j holds input row perm[j] (q_invperm's inverse).
  for (int64_t k = 0; k < layer.k; ++k)
    r.input_order[static_cast<size_t>(exl2_packed_row(layer, k))] = static_cast<int32_t>(k);
  std::vector<uint8_t> codes;
  size_t g = 0;
  while (g < layer.groups.size()) {
    // A run of groups of one bit width (widths never increase, so each width is one run).
    size_t end = g;
    int64_t rows = 0;
    while (end < layer.groups.size() && layer.groups[end].bits == layer.groups[g].bits) {
      if (layer.groups[end].rows % 32 != 0)
        return make_error(layer.name + ": group " + std::to_string(end) + " has " +
                          std::to_string(layer.groups[end].rows) +
                          " rows; Vesper runs EXL2 groups of multiples of 32 rows");
      rows += layer.groups[end].rows;
      ++end;
    }
    const int bits = layer.groups[g].bits;
    const int zero = 1 << (bits - 1);
    Exl2Part part;
    part.type = part_type(bits);
    part.n_in = rows;
    const size_t row_bytes = tensor::row_size(part.type, rows);
    const size_t block_bytes = tensor::traits(part.type).type_size;
    part.data.assign(row_bytes * static_cast<size_t>(layer.n), 0);
    int64_t block_in_part = 0;
    for (size_t gi = g; gi < end; ++gi) {
      const Exl2Group& group = layer.groups[gi];
      codes.resize(static_cast<size_t>(group.rows * layer.padded_n));
      exl2_decode_group(layer, static_cast<int64_t>(gi), 0, layer.padded_n, codes);
      for (int64_t o = 0; o < layer.n; ++o) {
        const int64_t n = output_order.empty() ? o : output_order[static_cast<size_t>(o)];
        const float scale = exl2_scale(layer, static_cast<int64_t>(gi), n);
        uint8_t* row = part.data.data() + static_cast<size_t>(o) * row_bytes;
        for (int64_t b = 0; b < group.rows / 32; ++b) {
          int values[32];
          for (int j = 0; j < 32; ++j)
            values[j] = codes[static_cast<size_t>((b * 32 + j) * layer.padded_n + n)] - zero;
          write_block(part.type, values, scale,
                      row + static_cast<size_t>(block_in_part + b) * block_bytes);
        }
      }
      block_in_part += group.rows / 32;
    }
    r.parts.push_back(std::move(part));
    g = end;
  }
  return r;
}

}  // namespace vesper::hf
