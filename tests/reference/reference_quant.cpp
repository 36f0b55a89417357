#include "reference/reference_quant.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace vesper::reference {
namespace {

using tensor::GgmlType;

// Little-endian field readers over a block's bytes.
unsigned u8(const uint8_t* b, int offset) {
  return b[offset];
}
int i8(const uint8_t* b, int offset) {
  return static_cast<int8_t>(b[offset]);
}
uint16_t u16(const uint8_t* b, int offset) {
  return static_cast<uint16_t>(b[offset] | (b[offset + 1] << 8));
}
uint32_t u32(const uint8_t* b, int offset) {
  return static_cast<uint32_t>(b[offset]) | (static_cast<uint32_t>(b[offset + 1]) << 8) |
         (static_cast<uint32_t>(b[offset + 2]) << 16) |
         (static_cast<uint32_t>(b[offset + 3]) << 24);
}
double half(const uint8_t* b, int offset) {
  return fp16_value(u16(b, offset));
}

double f32_value(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

double bf16_value(uint16_t h) {
  const int sign = h >> 15;
  const int exponent = (h >> 7) & 0xFF;
  const int mantissa = h & 0x7F;
  double v;
  if (exponent == 0xFF) {
    v = mantissa ? std::numeric_limits<double>::quiet_NaN()
                 : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    v = std::ldexp(mantissa, -126 - 7);
  } else {
    v = std::ldexp(128 + mantissa, exponent - 127 - 7);
  }
  return sign ? -v : v;
}

// Element i of one block, per format. Offsets are the ggml struct field offsets.

double q4_0(const uint8_t* b, int i) {  // d@0 (fp16), qs@2[16]
  const unsigned byte = u8(b, 2 + i % 16);
  const int q = i < 16 ? byte & 0xF : byte >> 4;
  return half(b, 0) * (q - 8);
}

double q4_1(const uint8_t* b, int i) {  // d@0, m@2, qs@4[16]
  const unsigned byte = u8(b, 4 + i % 16);
  const int q = i < 16 ? byte & 0xF : byte >> 4;
  return half(b, 0) * q + half(b, 2);
}

double q5_0(const uint8_t* b, int i) {  // d@0, qh@2 (u32), qs@6[16]
  const unsigned byte = u8(b, 6 + i % 16);
  const int low = i < 16 ? byte & 0xF : byte >> 4;
  const int high = (u32(b, 2) >> i) & 1;
  return half(b, 0) * (low + 16 * high - 16);
}

double q5_1(const uint8_t* b, int i) {  // d@0, m@2, qh@4 (u32), qs@8[16]
  const unsigned byte = u8(b, 8 + i % 16);
  const int low = i < 16 ? byte & 0xF : byte >> 4;
  const int high = (u32(b, 4) >> i) & 1;
  return half(b, 0) * (low + 16 * high) + half(b, 2);
}

double q8_0(const uint8_t* b, int i) {  // d@0, qs@2[32] int8
  return half(b, 0) * i8(b, 2 + i);
}

// 2-bit field of q2_K / q3_K: the four 32-element quarters of each 128-element half share 32
// bytes, quarter s in bits 2s..2s+1.
int two_bit_field(const uint8_t* qs, int i) {
  const int half_index = i / 128, quarter = (i % 128) / 32, lane = i % 32;
  return (qs[32 * half_index + lane] >> (2 * quarter)) & 3;
}

double q2_k(const uint8_t* b, int i) {  // scales@0[16], qs@16[64], d@80, dmin@82
  const unsigned packed = u8(b, i / 16);
  const int scale = packed & 0xF, min = packed >> 4;
  const int q = two_bit_field(b + 16, i);
  return half(b, 80) * scale * q - half(b, 82) * min;
}

double q3_k(const uint8_t* b, int i) {  // hmask@0[32], qs@32[64], scales@96[12], d@108
  // The 16 6-bit scales: bytes 0-7 hold the low nibbles (scales 0-7 in the low halves, 8-15 in
  // the high halves); bytes 8-11 hold the top two bits, scales 0-3 in bits 0-1, 4-7 in bits 2-3,
  // 8-11 in bits 4-5 and 12-15 in bits 6-7, scale j in byte 8 + j % 4.
  const uint8_t* s = b + 96;
  const int j = i / 16;
  int low4;
  if (j < 8) {
    low4 = s[j] & 0xF;
  } else {
    low4 = s[j - 8] >> 4;
  }
  const int group = j / 4;  // which bit pair of the high bytes
  const int high2 = (s[8 + (j - 4 * group)] >> (2 * group)) & 3;
  const int scale = low4 + 16 * high2 - 32;
  const int high_bit = (u8(b, i % 32) >> (i / 32)) & 1;  // hmask: bit plane i / 32
  const int q = two_bit_field(b + 32, i) + 4 * high_bit - 4;
  return half(b, 108) * scale * q;
}

// (scale, min) of sub-block j of q4_K / q5_K from their 12 packed bytes.
void scale_min_k4(const uint8_t* s, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = s[j] % 64;
    *min = s[j + 4] % 64;
  } else {
    *scale = s[j + 4] % 16 + 16 * (s[j - 4] / 64);
    *min = s[j + 4] / 16 + 16 * (s[j] / 64);
  }
}

// 4-bit field of q4_K / q5_K: 64-element chunks share 32 bytes, first 32 in the low nibbles.
int nibble_k(const uint8_t* qs, int i) {
  const unsigned byte = qs[32 * (i / 64) + i % 32];
  return (i % 64) < 32 ? static_cast<int>(byte % 16) : static_cast<int>(byte / 16);
}

double q4_k(const uint8_t* b, int i) {  // d@0, dmin@2, scales@4[12], qs@16[128]
  int scale, min;
  scale_min_k4(b + 4, i / 32, &scale, &min);
  return half(b, 0) * scale * nibble_k(b + 16, i) - half(b, 2) * min;
}

double q5_k(const uint8_t* b, int i) {  // d@0, dmin@2, scales@4[12], qh@16[32], qs@48[128]
  int scale, min;
  scale_min_k4(b + 4, i / 32, &scale, &min);
  const int high = (u8(b, 16 + i % 32) >> (i / 32)) & 1;
  return half(b, 0) * scale * (nibble_k(b + 48, i) + 16 * high) - half(b, 2) * min;
}

double q6_k(const uint8_t* b, int i) {  // ql@0[128], qh@128[64], scales@192[16] int8, d@208
  const int half_index = i / 128, quarter = (i % 128) / 32, lane = i % 32;
  // Quarters 0 and 2 share ql bytes 0-31 of the half (low, high nibble); 1 and 3 bytes 32-63.
  const unsigned low_byte = u8(b, 64 * half_index + 32 * (quarter % 2) + lane);
  const int low = quarter < 2 ? static_cast<int>(low_byte % 16) : static_cast<int>(low_byte / 16);
  const int high = (u8(b, 128 + 32 * half_index + lane) >> (2 * quarter)) & 3;
  return half(b, 208) * i8(b, 192 + i / 16) * (low + 16 * high - 32);
}

double q8_k(const uint8_t* b, int i) {  // d@0 (f32), qs@4[256] int8, bsums@260[16] int16
  return f32_value(u32(b, 0)) * i8(b, 4 + i);
}

}  // namespace

double fp16_value(uint16_t h) {
  const int sign = h >> 15;
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  double v;
  if (exponent == 0x1F) {
    v = mantissa ? std::numeric_limits<double>::quiet_NaN()
                 : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    v = std::ldexp(mantissa, -24);
  } else {
    v = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return sign ? -v : v;
}

std::vector<double> dequantize_row(GgmlType type, const void* src, int64_t n) {
  const auto* bytes = static_cast<const uint8_t*>(src);
  std::vector<double> out(static_cast<size_t>(n));
  // (block elements, block bytes, element function)
  int block = 0, size = 0;
  double (*element)(const uint8_t*, int) = nullptr;
  switch (type) {
    case GgmlType::kF32:
      for (int64_t i = 0; i < n; ++i) out[i] = f32_value(u32(bytes, static_cast<int>(4 * i)));
      return out;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = fp16_value(u16(bytes + 2 * i, 0));
      return out;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_value(u16(bytes + 2 * i, 0));
      return out;
    case GgmlType::kQ4_0:
      block = 32, size = 18, element = q4_0;
      break;
    case GgmlType::kQ4_1:
      block = 32, size = 20, element = q4_1;
      break;
    case GgmlType::kQ5_0:
      block = 32, size = 22, element = q5_0;
      break;
    case GgmlType::kQ5_1:
      block = 32, size = 24, element = q5_1;
      break;
    case GgmlType::kQ8_0:
      block = 32, size = 34, element = q8_0;
      break;
    case GgmlType::kQ2_K:
      block = 256, size = 84, element = q2_k;
      break;
    case GgmlType::kQ3_K:
      block = 256, size = 110, element = q3_k;
      break;
    case GgmlType::kQ4_K:
      block = 256, size = 144, element = q4_k;
      break;
    case GgmlType::kQ5_K:
      block = 256, size = 176, element = q5_k;
      break;
    case GgmlType::kQ6_K:
      block = 256, size = 210, element = q6_k;
      break;
    case GgmlType::kQ8_K:
      block = 256, size = 292, element = q8_k;
      break;
    default:
      std::fprintf(stderr, "reference::dequantize_row: unsupported type %u\n",
                   static_cast<unsigned>(type));
      std::abort();
  }
  if (n % block != 0) {
    std::fprintf(stderr, "reference::dequantize_row: %lld not a multiple of %d\n",
                 static_cast<long long>(n), block);
    std::abort();
  }
  for (int64_t i = 0; i < n; ++i)
    out[i] = element(bytes + (i / block) * size, static_cast<int>(i % block));
  return out;
}

std::vector<double> min_part(GgmlType type, const void* src, int64_t n) {
  size_t block_bytes = 0, dmin_at = 0;
  switch (type) {
    case GgmlType::kQ2_K:
      block_bytes = 84, dmin_at = 82;
      break;
    case GgmlType::kQ4_K:
      block_bytes = 144, dmin_at = 2;
      break;
    case GgmlType::kQ5_K:
      block_bytes = 176, dmin_at = 2;
      break;
    default:
      return std::vector<double>(n);
  }
  const size_t bytes = static_cast<size_t>(n / 256) * block_bytes;
  std::vector<uint8_t> no_min(static_cast<const uint8_t*>(src),
                              static_cast<const uint8_t*>(src) + bytes);
  for (size_t b = 0; b < bytes; b += block_bytes) no_min[b + dmin_at] = no_min[b + dmin_at + 1] = 0;
  const std::vector<double> all = dequantize_row(type, src, n);
  const std::vector<double> scale_part = dequantize_row(type, no_min.data(), n);
  std::vector<double> part(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) part[i] = all[i] - scale_part[i];
  return part;
}

}  // namespace vesper::reference
