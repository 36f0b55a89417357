#include "tensor/quant.h"

#include <cstring>

#include "core/check.h"
#include "core/fp16.h"
#include "tensor/quant_rows.h"

namespace vesper::tensor {
namespace {

using RowDequantizer = void (*)(const uint8_t*, float*, int64_t);
using RowQuantizer = void (*)(const float*, uint8_t*, int64_t);

void dequantize_f32(const uint8_t* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void dequantize_f16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = fp16_to_f32(h);
  }
}
void dequantize_bf16(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = bf16_to_f32(h);
  }
}
void quantize_f32(const float* src, uint8_t* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void quantize_f16(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_fp16(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}
void quantize_bf16(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_bf16(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

struct Converters {
  RowDequantizer dequantize = nullptr;  // takes a count of blocks (elements for plain types)
  RowQuantizer quantize = nullptr;
};

Converters converters(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return {dequantize_f32, quantize_f32};
    case GgmlType::kF16:
      return {dequantize_f16, quantize_f16};
    case GgmlType::kBF16:
      return {dequantize_bf16, quantize_bf16};
    case GgmlType::kQ4_0:
      return {detail::dequantize_q4_0, detail::quantize_q4_0};
    case GgmlType::kQ4_1:
      return {detail::dequantize_q4_1, detail::quantize_q4_1};
    case GgmlType::kQ5_0:
      return {detail::dequantize_q5_0, detail::quantize_q5_0};
    case GgmlType::kQ5_1:
      return {detail::dequantize_q5_1, detail::quantize_q5_1};
    case GgmlType::kQ8_0:
      return {detail::dequantize_q8_0, detail::quantize_q8_0};
    case GgmlType::kQ2_K:
      return {detail::dequantize_q2_k, detail::quantize_q2_k};
    case GgmlType::kQ3_K:
      return {detail::dequantize_q3_k, detail::quantize_q3_k};
    case GgmlType::kQ4_K:
      return {detail::dequantize_q4_k, detail::quantize_q4_k};
    case GgmlType::kQ5_K:
      return {detail::dequantize_q5_k, detail::quantize_q5_k};
    case GgmlType::kQ6_K:
      return {detail::dequantize_q6_k, detail::quantize_q6_k};
    case GgmlType::kQ8_K:
      return {detail::dequantize_q8_k, detail::quantize_q8_k};
    default:
      return {};
  }
}

int64_t checked_blocks(GgmlType type, int64_t n) {
  const int64_t block = traits(type).block_size;
  VESPER_CHECK(n >= 0 && n % block == 0,
               "%s row of %lld elements: not a multiple of the block size %lld",
               type_name(type).data(), static_cast<long long>(n), static_cast<long long>(block));
  return n / block;
}

}  // namespace

bool can_dequantize(GgmlType type) {
  return converters(type).dequantize != nullptr;
}
bool can_quantize(GgmlType type) {
  return converters(type).quantize != nullptr;
}

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
  const RowDequantizer f = converters(type).dequantize;
  VESPER_CHECK(f != nullptr, "dequantize_row: unsupported type %s", type_name(type).data());
  f(static_cast<const uint8_t*>(src), dst, checked_blocks(type, n));
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
  const RowQuantizer f = converters(type).quantize;
  VESPER_CHECK(f != nullptr, "quantize_row: unsupported type %s", type_name(type).data());
  f(src, static_cast<uint8_t*>(dst), checked_blocks(type, n));
}

}  // namespace vesper::tensor
