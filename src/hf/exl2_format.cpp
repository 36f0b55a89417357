#include "hf/exl2_format.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/error_text.h"
#include "core/fp16.h"

namespace vesper::hf {
namespace {

static_assert(std::endian::native == std::endian::little,
              "EXL2 tensors are read in place as little-endian words");

using tensor::GgmlType;

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

bool valid_bits(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}

// Finds `<prefix>.<part>` and checks its dtype; the tensor is null only when it is absent and
// not `required`.
struct Found {
  const gguf::SafetensorsTensor* tensor = nullptr;
  std::string where;  // "<file>: tensor <prefix>.<part>"
};
Result<Found> find(const TensorLookup& lookup, const std::string& prefix, const char* part,
                   GgmlType type, bool required, int64_t k, int64_t n) {
  const std::string name = prefix + "." + part;
  TensorRef ref = lookup(name);
  if (ref.tensor == nullptr) {
    if (!required) return Found{};
    return make_error(ref.file + ": missing tensor " + name + " (an EXL2 layer of " +
                      std::to_string(k) + " inputs and " + std::to_string(n) +
                      " outputs needs it)");
  }
  Found f{ref.tensor, ref.file + ": tensor " + name};
  if (ref.tensor->type != type)
    return make_error(f.where + " has dtype " +
                      std::string(gguf::safetensors_dtype_name(ref.tensor->type)) + ", expected " +
                      std::string(gguf::safetensors_dtype_name(type)));
  return f;
}

Status expect_shape(const Found& f, const std::vector<int64_t>& want, const std::string& why) {
  if (f.tensor->shape != want)
    return make_error(f.where + " has shape " + shape_string(f.tensor->shape) + ", expected " +
                      shape_string(want) + " (" + why + ")");
  return {};
}

// Bits [bit, bit + bits) of the little-endian stream of 32-bit words at `words`, `stride` bytes
// apart.
int read_bits(const uint8_t* words, size_t stride, int64_t bit, int bits) {
  const uint8_t* w = words + static_cast<size_t>(bit / 32) * stride;
  const int shift = static_cast<int>(bit % 32);
  uint64_t v = load_u32(w) >> shift;
  if (shift + bits > 32) v |= static_cast<uint64_t>(load_u32(w + stride)) << (32 - shift);
  return static_cast<int>(v & ((1u << bits) - 1));
}

}  // namespace

TensorLookup lookup_in(std::span<const gguf::SafetensorsFile> files, std::string where) {
  return [files, where = std::move(where)](std::string_view name) {
    for (const gguf::SafetensorsFile& f : files)
      if (const gguf::SafetensorsTensor* t = f.find(name)) return TensorRef{t, f.path()};
    return TensorRef{nullptr, where};
  };
}

Result<Exl2Layer> read_exl2_layer(const TensorLookup& lookup, const std::string& prefix, int64_t k,
                                  int64_t n) {
  VESPER_CHECK(k > 0 && n > 0, "an EXL2 layer of %lld x %lld", static_cast<long long>(k),
               static_cast<long long>(n));
  Exl2Layer layer;
  layer.name = prefix;
  layer.k = k;
  layer.n = n;
  layer.padded_n = (n + 31) / 32 * 32;
  const int64_t np = layer.padded_n;
  const std::string dims = "in_features " + std::to_string(k) + ", out_features " +
                           std::to_string(n) + " padded to " + std::to_string(np);

  VESPER_ASSIGN_OR_RETURN(const Found q_weight,
                          find(lookup, prefix, "q_weight", GgmlType::kI32, true, k, n));
  VESPER_ASSIGN_OR_RETURN(const Found q_invperm,
                          find(lookup, prefix, "q_invperm", GgmlType::kI32, true, k, n));
  VESPER_ASSIGN_OR_RETURN(const Found q_scale,
                          find(lookup, prefix, "q_scale", GgmlType::kI32, true, k, n));
  VESPER_ASSIGN_OR_RETURN(const Found q_scale_max,
                          find(lookup, prefix, "q_scale_max", GgmlType::kF16, true, k, n));
  VESPER_ASSIGN_OR_RETURN(const Found q_groups,
                          find(lookup, prefix, "q_groups", GgmlType::kI16, true, k, n));
  VESPER_ASSIGN_OR_RETURN(const Found bias,
                          find(lookup, prefix, "bias", GgmlType::kF16, false, k, n));

  // Shapes. q_groups sets G; q_weight's row count is checked against the groups below.
  const auto& gs = q_groups.tensor->shape;
  if (gs.size() != 1 || gs[0] == 0 || gs[0] % 2 != 0)
    return make_error(q_groups.where + " has shape " + shape_string(gs) +
                      ", expected [2 * groups] (a bit width and a first row per group)");
  const int64_t num_groups = gs[0] / 2;
  const std::string groups_text = std::to_string(num_groups) + " groups in q_groups";
  VESPER_TRY(expect_shape(q_scale_max, {num_groups}, groups_text));
  VESPER_TRY(expect_shape(q_scale, {num_groups, np / 8}, groups_text + ", " + dims));
  VESPER_TRY(expect_shape(q_invperm, {k}, dims));
  const auto& ws = q_weight.tensor->shape;
  if (ws.size() != 2 || ws[0] == 0 || ws[1] != np)
    return make_error(q_weight.where + " has shape " + shape_string(ws) +
                      ", expected [packed rows, " + std::to_string(np) + "] (" + dims + ")");
  layer.packed_rows = ws[0];
  if (bias.tensor != nullptr && bias.tensor->shape != std::vector<int64_t>{n} &&
      bias.tensor->shape != std::vector<int64_t>{np})
    return make_error(bias.where + " has shape " + shape_string(bias.tensor->shape) +
                      ", expected [" + std::to_string(n) + "] or, padded, [" + std::to_string(np) +
                      "] (" + dims + ")");

  // Groups: each one's rows follow from where the next starts (the last: from q_weight's end).
  const uint8_t* qg = q_groups.tensor->data;
  int64_t row = 0;
  for (int64_t g = 0; g < num_groups; ++g) {
    const std::string at = q_groups.where + ": group " + std::to_string(g);
    Exl2Group group;
    group.bits = static_cast<int16_t>(load_u16(qg + 4 * g));
    group.first_packed_row = static_cast<int16_t>(load_u16(qg + 4 * g + 2));
    group.first_row = row;
    if (!valid_bits(group.bits))
      return make_error(at + " has bits " + std::to_string(group.bits) +
                        ", expected 2, 3, 4, 5, 6 or 8");
    if (g > 0 && group.bits > layer.groups.back().bits)
      return make_error(at + " has bits " + std::to_string(group.bits) + " after a group of " +
                        std::to_string(layer.groups.back().bits) +
                        " (EXL2 orders groups from the widest to the narrowest)");
    if (g == 0 && group.first_packed_row != 0)
      return make_error(at + " starts at packed row " + std::to_string(group.first_packed_row) +
                        ", expected 0");
    const int64_t end =
        g + 1 < num_groups ? static_cast<int16_t>(load_u16(qg + 4 * g + 6)) : layer.packed_rows;
    const std::string end_text = g + 1 < num_groups
                                     ? "where group " + std::to_string(g + 1) + " starts"
                                     : "the end of " + prefix + ".q_weight";
    const int64_t words = end - group.first_packed_row;
    if (words <= 0)
      return make_error(at + " starts at packed row " + std::to_string(group.first_packed_row) +
                        ", not before " + end_text + " (" + std::to_string(end) + ")");
    if (words * 32 % group.bits != 0)
      return make_error(at + " spans " + std::to_string(words) + " packed rows (to " + end_text +
                        "), not a whole number of " + std::to_string(group.bits) + "-bit rows");
    group.rows = words * 32 / group.bits;
    const int64_t unit = group.bits == 2 ? 16 : 32;
    if (group.rows % unit != 0)
      return make_error(at + " has " + std::to_string(group.rows) + " rows of " +
                        std::to_string(group.bits) + " bits, not a multiple of " +
                        std::to_string(unit));
    row += group.rows;
    layer.groups.push_back(group);
  }
  if (row != k)
    return make_error(q_groups.where + ": the groups cover " + std::to_string(row) +
                      " input rows (the last one to the end of " + prefix + ".q_weight's " +
                      std::to_string(layer.packed_rows) + " packed rows), but the layer has " +
                      std::to_string(k) + " (in_features)");

  // q_invperm: a permutation of [0, k).
  std::vector<bool> seen(static_cast<size_t>(k), false);
  for (int64_t i = 0; i < k; ++i) {
    const auto p = static_cast<int32_t>(load_u32(q_invperm.tensor->data + 4 * i));
    if (p < 0 || p >= k)
      return make_error(q_invperm.where + ": entry " + std::to_string(i) + " is " +
                        std::to_string(p) + ", outside [0, " + std::to_string(k) + ")");
    if (seen[static_cast<size_t>(p)])
      return make_error(q_invperm.where + ": " + std::to_string(p) +
                        " appears twice (it must be a permutation of [0, " + std::to_string(k) +
                        "))");
    seen[static_cast<size_t>(p)] = true;
  }
  for (int64_t g = 0; g < num_groups; ++g)
    if (!std::isfinite(fp16_to_f32(load_u16(q_scale_max.tensor->data + 2 * g))))
      return make_error(q_scale_max.where + ": the value of group " + std::to_string(g) +
                        " is not finite");

  layer.q_weight = q_weight.tensor->data;
  layer.q_invperm = q_invperm.tensor->data;
  layer.q_scale = q_scale.tensor->data;
  layer.q_scale_max = q_scale_max.tensor->data;
  layer.bias = bias.tensor != nullptr ? bias.tensor->data : nullptr;
  return layer;
}

int64_t exl2_group_of(const Exl2Layer& layer, int64_t packed_row) {
  VESPER_CHECK(packed_row >= 0 && packed_row < layer.k, "packed row %lld of %lld",
               static_cast<long long>(packed_row), static_cast<long long>(layer.k));
  const auto it = std::upper_bound(layer.groups.begin(), layer.groups.end(), packed_row,
                                   [](int64_t r, const Exl2Group& g) { return r < g.first_row; });
  return static_cast<int64_t>(it - layer.groups.begin()) - 1;
}

int64_t exl2_packed_row(const Exl2Layer& layer, int64_t k) {
  VESPER_CHECK(k >= 0 && k < layer.k, "input row %lld of %lld", static_cast<long long>(k),
               static_cast<long long>(layer.k));
  return static_cast<int32_t>(load_u32(layer.q_invperm + 4 * k));
}

void exl2_decode_group(const Exl2Layer& layer, int64_t group, int64_t n_begin, int64_t n_end,
                       std::span<uint8_t> codes) {
  VESPER_CHECK(group >= 0 && group < static_cast<int64_t>(layer.groups.size()), "group %lld",
               static_cast<long long>(group));
  VESPER_CHECK(0 <= n_begin && n_begin <= n_end && n_end <= layer.padded_n, "columns [%lld, %lld)",
               static_cast<long long>(n_begin), static_cast<long long>(n_end));
  const Exl2Group& g = layer.groups[static_cast<size_t>(group)];
  const int64_t width = n_end - n_begin;
  VESPER_CHECK(static_cast<int64_t>(codes.size()) == g.rows * width, "%zu codes for %lld x %lld",
               codes.size(), static_cast<long long>(g.rows), static_cast<long long>(width));
  const size_t stride = static_cast<size_t>(layer.padded_n) * 4;
  for (int64_t c = 0; c < width; ++c) {
    const uint8_t* column = layer.q_weight + static_cast<size_t>(g.first_packed_row) * stride +
                            static_cast<size_t>(n_begin + c) * 4;
    for (int64_t r = 0; r < g.rows; ++r)
      codes[static_cast<size_t>(r * width + c)] =
          static_cast<uint8_t>(read_bits(column, stride, r * g.bits, g.bits));
  }
}

int exl2_code(const Exl2Layer& layer, int64_t packed_row, int64_t n) {
  VESPER_CHECK(n >= 0 && n < layer.padded_n, "column %lld of %lld", static_cast<long long>(n),
               static_cast<long long>(layer.padded_n));
  const Exl2Group& g = layer.groups[static_cast<size_t>(exl2_group_of(layer, packed_row))];
  const size_t stride = static_cast<size_t>(layer.padded_n) * 4;
  const uint8_t* column = layer.q_weight + static_cast<size_t>(g.first_packed_row) * stride +
                          static_cast<size_t>(n) * 4;
  return read_bits(column, stride, (packed_row - g.first_row) * g.bits, g.bits);
}

int exl2_scale_code(const Exl2Layer& layer, int64_t group, int64_t n) {
  VESPER_CHECK(group >= 0 && group < static_cast<int64_t>(layer.groups.size()), "group %lld",
               static_cast<long long>(group));
  VESPER_CHECK(n >= 0 && n < layer.padded_n, "column %lld of %lld", static_cast<long long>(n),
               static_cast<long long>(layer.padded_n));
  const uint32_t word =
      load_u32(layer.q_scale + static_cast<size_t>(group * (layer.padded_n / 8) + n / 8) * 4);
  return static_cast<int>((word >> (4 * (n % 8))) & 15);
}

float exl2_scale(const Exl2Layer& layer, int64_t group, int64_t n) {
  const int c = exl2_scale_code(layer, group, n);
  // Each product of two fp16 values is exact in f32, so one f32_to_fp16 rounds it as an fp16
  // multiply does.
  const float max = fp16_to_f32(
      f32_to_fp16(fp16_to_f32(load_u16(layer.q_scale_max + 2 * group)) * (1.0f / 256.0f)));
  return fp16_to_f32(f32_to_fp16(static_cast<float>((c + 1) * (c + 1)) * max));
}

float exl2_weight(const Exl2Layer& layer, int64_t k, int64_t n) {
  VESPER_CHECK(n >= 0 && n < layer.n, "column %lld of %lld", static_cast<long long>(n),
               static_cast<long long>(layer.n));
  const int64_t packed_row = exl2_packed_row(layer, k);
  const int64_t group = exl2_group_of(layer, packed_row);
  const int zero = 1 << (layer.groups[static_cast<size_t>(group)].bits - 1);
  const int q = exl2_code(layer, packed_row, n) - zero;
  return fp16_to_f32(f32_to_fp16(static_cast<float>(q) * exl2_scale(layer, group, n)));
}

}  // namespace vesper::hf
