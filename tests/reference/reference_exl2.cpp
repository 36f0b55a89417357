#include "reference/reference_exl2.h"

#include <cmath>

#include "core/check.h"

namespace vesper::reference {
namespace {

// Byte i of a span, checked.
uint8_t byte_at(std::span<const uint8_t> bytes, int64_t i) {
  VESPER_CHECK(i >= 0 && i < static_cast<int64_t>(bytes.size()), "byte %lld of %zu",
               static_cast<long long>(i), bytes.size());
  return bytes[static_cast<size_t>(i)];
}

// Element i of a little-endian array of `size`-byte unsigned integers.
uint64_t element(std::span<const uint8_t> bytes, int64_t i, int size) {
  uint64_t v = 0;
  for (int b = size - 1; b >= 0; --b) v = v * 256 + byte_at(bytes, i * size + b);
  return v;
}

int64_t int32_at(std::span<const uint8_t> bytes, int64_t i) {
  const auto v = static_cast<int64_t>(element(bytes, i, 4));
  return v >= (int64_t{1} << 31) ? v - (int64_t{1} << 32) : v;
}

int64_t int16_at(std::span<const uint8_t> bytes, int64_t i) {
  const auto v = static_cast<int64_t>(element(bytes, i, 2));
  return v >= (int64_t{1} << 15) ? v - (int64_t{1} << 16) : v;
}

// IEEE binary16: sign, 5 exponent bits (bias 15), 10 mantissa bits; exponent 0 is subnormal.
double fp16_value(uint64_t h) {
  const double sign = (h >> 15) ? -1.0 : 1.0;
  const int exponent = static_cast<int>((h >> 10) & 31);
  const double mantissa = static_cast<double>(h & 1023);
  if (exponent == 31) return mantissa == 0 ? sign * INFINITY : NAN;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// Bit `bit` of column `col` of the int32 matrix `words` with `cols` columns, counting its rows'
// bits as one stream: bit i is bit i % 32 of row i / 32.
int stream_bit(std::span<const uint8_t> words, int64_t cols, int64_t first_row, int64_t col,
               int64_t bit) {
  const int64_t row = first_row + bit / 32;
  const int64_t in_word = bit % 32;
  const uint8_t byte = byte_at(words, (row * cols + col) * 4 + in_word / 8);
  return (byte >> (in_word % 8)) & 1;
}

}  // namespace

Exl2Dequantized dequantize_exl2(const Exl2RawLayer& layer) {
  const int64_t k = layer.k, n = layer.n;
  const int64_t padded = (n + 31) / 32 * 32;
  const auto groups = static_cast<int64_t>(layer.q_groups.size() / 4);
  VESPER_CHECK(groups > 0 && layer.q_groups.size() == static_cast<size_t>(groups) * 4,
               "%zu bytes of q_groups", layer.q_groups.size());

  // Packed row j -> (bits, first int32 row of its group, its row within the group, group).
  struct RowPlace {
    int bits;
    int64_t first_word_row, row_in_group, group;
  };
  std::vector<RowPlace> place;
  for (int64_t g = 0; g < groups; ++g) {
    const int bits = static_cast<int>(int16_at(layer.q_groups, 2 * g));
    const int64_t first = int16_at(layer.q_groups, 2 * g + 1);
    // A group's rows: the int32 rows up to the next group's first, times 32 / bits; the last
    // group has the rows left of k.
    const int64_t rows = g + 1 < groups ? (int16_at(layer.q_groups, 2 * g + 3) - first) * 32 / bits
                                        : k - static_cast<int64_t>(place.size());
    for (int64_t r = 0; r < rows; ++r) place.push_back({bits, first, r, g});
  }
  VESPER_CHECK(static_cast<int64_t>(place.size()) == k, "groups cover %zu rows of %lld",
               place.size(), static_cast<long long>(k));

  Exl2Dequantized out;
  for (int64_t row = 0; row < k; ++row) {
    const int64_t j = int32_at(layer.q_invperm, row);  // input row `row` is packed row j
    VESPER_CHECK(j >= 0 && j < k, "q_invperm[%lld] = %lld", static_cast<long long>(row),
                 static_cast<long long>(j));
    const RowPlace& p = place[static_cast<size_t>(j)];
    const double max = fp16_value(element(layer.q_scale_max, p.group, 2));
    for (int64_t col = 0; col < n; ++col) {
      int q = 0;
      for (int b = 0; b < p.bits; ++b)
        q |= stream_bit(layer.q_weight, padded, p.first_word_row, col, p.row_in_group * p.bits + b)
             << b;
      const uint64_t scale_word = element(layer.q_scale, p.group * (padded / 8) + col / 8, 4);
      const int c = static_cast<int>((scale_word >> (4 * (col % 8))) & 15);
      const double scale = static_cast<double>((c + 1) * (c + 1)) * max / 256.0;
      out.code.push_back(q);
      out.bits.push_back(p.bits);
      out.scale_code.push_back(c);
      out.scale.push_back(scale);
      out.weight.push_back(static_cast<double>(q - (1 << (p.bits - 1))) * scale);
    }
  }
  return out;
}

}  // namespace vesper::reference
