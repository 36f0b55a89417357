#include "backend/kv_cache_spec.h"

#include <algorithm>

namespace vesper::backend {

std::string_view kv_dtype_name(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kF16:
      return "f16";
    case KvDtype::kBF16:
      return "bf16";
    case KvDtype::kFp8E4M3:
      return "fp8_e4m3";
    case KvDtype::kFp8E5M2:
      return "fp8_e5m2";
    case KvDtype::kInt8:
      return "int8";
    case KvDtype::kKivi2:
      return "kivi2";
    case KvDtype::kKivi4:
      return "kivi4";
  }
  return "?";
}

std::optional<KvDtype> parse_kv_dtype(std::string_view name) {
  for (KvDtype d : kRowKvDtypes)
    if (name == kv_dtype_name(d)) return d;
  for (KvDtype d : kKiviKvDtypes)
    if (name == kv_dtype_name(d)) return d;
  struct Alias {
    std::string_view name;
    KvDtype dtype;
  };
  static constexpr Alias kAliases[] = {
      {"auto", KvDtype::kF16},      {"float32", KvDtype::kF32}, {"fp32", KvDtype::kF32},
      {"float16", KvDtype::kF16},   {"half", KvDtype::kF16},    {"fp16", KvDtype::kF16},
      {"bfloat16", KvDtype::kBF16}, {"fp8", KvDtype::kFp8E4M3}, {"fp8_e4m3fn", KvDtype::kFp8E4M3}};
  for (const Alias& a : kAliases)
    if (name == a.name) return a.dtype;
  return std::nullopt;
}

std::string kv_dtype_choices() {
  std::string s = "auto (= f16)";
  for (KvDtype d : kRowKvDtypes) {
    s += ", ";
    s += kv_dtype_name(d);
    const int64_t meta = kv_row_metadata_bytes(d);
    s += " (" + std::to_string(kv_element_bytes(d)) + " B/element";
    if (meta > 0) s += " + " + std::to_string(meta) + " B per token and head";
    s += ")";
  }
  for (KvDtype d : kKiviKvDtypes)
    s += ", " + std::string(kv_dtype_name(d)) + " (" + std::to_string(kv_kivi_bits(d)) +
         " bits/element + f16 scale and zero per channel (keys) or per token and channel run "
         "(values) of a group; the newest --kivi-residual-length tokens in f16)";
  s += ", fp8 (= fp8_e4m3)";
  return s;
}

int64_t kv_element_bytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return 4;
    case KvDtype::kF16:
    case KvDtype::kBF16:
      return 2;
    case KvDtype::kFp8E4M3:
    case KvDtype::kFp8E5M2:
    case KvDtype::kInt8:
      return 1;
    case KvDtype::kKivi2:
    case KvDtype::kKivi4:
      break;
  }
  return 0;
}

int64_t kv_row_metadata_bytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
    case KvDtype::kF16:
    case KvDtype::kBF16:
      return 0;
    case KvDtype::kFp8E4M3:
    case KvDtype::kFp8E5M2:
      return 2;  // f16 scale
    case KvDtype::kInt8:
      return 4;  // f16 scale, f16 zero point
    case KvDtype::kKivi2:
    case KvDtype::kKivi4:
      break;
  }
  return 0;
}

int64_t KvCacheSpec::group_bytes(KvDtype dtype, KvSide side) const {
  if (!kv_is_kivi(dtype)) return block_size * row_bytes(dtype);
  const int64_t packed = kivi_packed_row_bytes(dtype, head_dim);
  if (side == KvSide::kKey) return head_dim * 4 + block_size * packed;
  return block_size * (packed + 4 * kivi_value_channel_groups(block_size, head_dim));
}

int64_t KvCacheSpec::residual_rows_per_block() const {
  if (!kivi()) return block_size;
  if (residual_rows > 0) return std::min(residual_rows, block_size);
  const int64_t rows =
      std::min(key_unit_bytes() / key_row_bytes(), value_unit_bytes() / value_row_bytes());
  return std::clamp<int64_t>(rows, 1, block_size);
}

std::string KvDtypes::describe() const {
  if (k == v) return std::string(kv_dtype_name(k));
  return "k " + std::string(kv_dtype_name(k)) + ", v " + std::string(kv_dtype_name(v));
}

}  // namespace vesper::backend
