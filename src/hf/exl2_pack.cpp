#include "hf/exl2_pack.h"

#include <bit>
#include <limits>

#include "core/check.h"
#include "core/fp16.h"

namespace vesper::hf {

static_assert(std::endian::native == std::endian::little,
              "EXL2 tensors are written from memory as little-endian words");

std::vector<gguf::SafetensorsTensorData> Exl2PackedLayer::tensors(const std::string& prefix) const {
  using tensor::GgmlType;
  const auto groups = static_cast<int64_t>(q_scale_max.size());
  return {
      {prefix + ".q_weight", GgmlType::kI32, {packed_rows, padded_n}, q_weight.data()},
      {prefix + ".q_invperm", GgmlType::kI32, {k}, q_invperm.data()},
      {prefix + ".q_scale", GgmlType::kI32, {groups, padded_n / 8}, q_scale.data()},
      {prefix + ".q_scale_max", GgmlType::kF16, {groups}, q_scale_max.data()},
      {prefix + ".q_groups", GgmlType::kI16, {2 * groups}, q_groups.data()},
  };
}

Exl2PackedLayer pack_exl2(const Exl2PackInput& in) {
  const auto num_groups = static_cast<int64_t>(in.groups.size());
  VESPER_CHECK(in.k > 0 && in.n > 0 && num_groups > 0, "k %lld, n %lld, %lld groups",
               static_cast<long long>(in.k), static_cast<long long>(in.n),
               static_cast<long long>(num_groups));
  VESPER_CHECK(static_cast<int64_t>(in.codes.size()) == in.k * in.n, "%zu codes for %lld x %lld",
               in.codes.size(), static_cast<long long>(in.k), static_cast<long long>(in.n));
  VESPER_CHECK(static_cast<int64_t>(in.scale_codes.size()) == num_groups * in.n &&
                   static_cast<int64_t>(in.scale_max.size()) == num_groups,
               "%zu scale codes and %zu maxima for %lld groups of %lld columns",
               in.scale_codes.size(), in.scale_max.size(), static_cast<long long>(num_groups),
               static_cast<long long>(in.n));
  VESPER_CHECK(in.perm.empty() || static_cast<int64_t>(in.perm.size()) == in.k,
               "a permutation of %zu rows for %lld", in.perm.size(), static_cast<long long>(in.k));

  Exl2PackedLayer out;
  out.k = in.k;
  out.n = in.n;
  out.padded_n = (in.n + 31) / 32 * 32;
  const int64_t np = out.padded_n;

  // q_invperm = argsort(perm), and perm must be a permutation for that to exist.
  out.q_invperm.assign(static_cast<size_t>(in.k), -1);
  for (int64_t j = 0; j < in.k; ++j) {
    const int32_t row = in.perm.empty() ? static_cast<int32_t>(j) : in.perm[static_cast<size_t>(j)];
    VESPER_CHECK(row >= 0 && row < in.k && out.q_invperm[static_cast<size_t>(row)] == -1,
                 "perm[%lld] = %d is not part of a permutation", static_cast<long long>(j), row);
    out.q_invperm[static_cast<size_t>(row)] = static_cast<int32_t>(j);
  }

  // q_groups, and each group's codes as one bit stream per column.
  int64_t row = 0;
  for (int64_t g = 0; g < num_groups; ++g) {
    const Exl2PackGroup& group = in.groups[static_cast<size_t>(g)];
    const int bits = group.bits;
    VESPER_CHECK(bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8,
                 "group %lld has %d bits", static_cast<long long>(g), bits);
    VESPER_CHECK(g == 0 || bits <= in.groups[static_cast<size_t>(g - 1)].bits,
                 "group %lld has more bits (%d) than the one before", static_cast<long long>(g),
                 bits);
    VESPER_CHECK(group.rows > 0 && group.rows % (bits == 2 ? 16 : 32) == 0,
                 "group %lld has %lld rows", static_cast<long long>(g),
                 static_cast<long long>(group.rows));
    VESPER_CHECK(out.packed_rows <= std::numeric_limits<int16_t>::max(),
                 "packed row %lld does not fit q_groups' int16",
                 static_cast<long long>(out.packed_rows));
    out.q_groups.push_back(static_cast<int16_t>(bits));
    out.q_groups.push_back(static_cast<int16_t>(out.packed_rows));
    const int64_t words = group.rows * bits / 32;
    out.q_weight.resize(static_cast<size_t>((out.packed_rows + words) * np), 0);
    for (int64_t c = 0; c < np; ++c)
      for (int64_t r = 0; r < group.rows; ++r) {
        uint32_t q = 1u << (bits - 1);  // padding: a zero weight
        if (c < in.n) {
          q = in.codes[static_cast<size_t>((row + r) * in.n + c)];
          VESPER_CHECK(q < (1u << bits), "code %u in a %d-bit group", q, bits);
        }
        const int64_t bit = r * bits;
        uint32_t* w = &out.q_weight[static_cast<size_t>((out.packed_rows + bit / 32) * np + c)];
        w[0] |= q << (bit % 32);
        if (bit % 32 + bits > 32) w[np] |= q >> (32 - bit % 32);
      }
    out.packed_rows += words;
    row += group.rows;
  }
  VESPER_CHECK(row == in.k, "the groups cover %lld rows of %lld", static_cast<long long>(row),
               static_cast<long long>(in.k));

  // Scales: 8 codes a word, column n at bits 4 * (n % 8); padded columns get 15.
  out.q_scale.assign(static_cast<size_t>(num_groups * np / 8), 0);
  for (int64_t g = 0; g < num_groups; ++g) {
    for (int64_t c = 0; c < np; ++c) {
      uint32_t code = 15;
      if (c < in.n) {
        code = in.scale_codes[static_cast<size_t>(g * in.n + c)];
        VESPER_CHECK(code < 16, "scale code %u", code);
      }
      out.q_scale[static_cast<size_t>(g * (np / 8) + c / 8)] |= code << (4 * (c % 8));
    }
    out.q_scale_max.push_back(f32_to_fp16(in.scale_max[static_cast<size_t>(g)]));
  }
  return out;
}

}  // namespace vesper::hf
