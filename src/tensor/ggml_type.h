// Tensor element types, numbered exactly as ggml / GGUF number them, with their block layout
// traits. A row of n elements of a block type occupies (n / block_size) * type_size bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace vesper::tensor {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  // 4 and 5 (Q4_2, Q4_3) were removed from ggml.
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
};

struct TypeTraits {
  std::string_view name;  // ggml's lower-case name: "f32", "q4_0", "q4_K", ...
  int64_t block_size;     // elements per block (1 for plain types)
  size_t type_size;       // bytes per block
  bool supported;         // Vesper can dequantize it (and so load models that use it)
};

// Traits of a known type; nullopt for a number ggml does not define.
std::optional<TypeTraits> type_traits(uint32_t type);
const TypeTraits& traits(GgmlType type);  // type must be known (checked)

inline std::string_view type_name(GgmlType type) { return traits(type).name; }

// Bytes of a row of `n` elements; n must be a multiple of the block size (checked by callers).
inline size_t row_size(GgmlType type, int64_t n) {
  const TypeTraits& t = traits(type);
  return static_cast<size_t>(n / t.block_size) * t.type_size;
}

// Parses a user-facing type name, case-insensitive ("q4_0", "Q4_K", "f16", "bf16", ...).
std::optional<GgmlType> parse_type_name(std::string_view name);

}  // namespace vesper::tensor
