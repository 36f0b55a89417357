// The legacy 32-element block types: q4_0, q4_1, q5_0, q5_1, q8_0. Quantizers follow ggml's
// reference ones (scale from the block's extreme value), except that levels are rounded against
// the fp16 scale actually stored, which is what dequantization will use.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "tensor/quant_blocks.h"
#include "tensor/quant_rows.h"
#include "tensor/quant_search.h"

namespace vesper::tensor::detail {
namespace {

// The element of largest magnitude, with its sign.
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void store_u32(uint32_t v, uint8_t* p) {
  std::memcpy(p, &v, 4);
}

// Symmetric 2^bits-level block: x = d * (q - 2^(bits-1)), the extreme value maps to q = 0.
template <int kBits>
void quantize_symmetric_levels(const float* x, uint16_t* d_out, int* q) {
  constexpr int kHalf = 1 << (kBits - 1);
  const float max = signed_absmax(x, kQK);
  *d_out = f32_to_fp16(max / -static_cast<float>(kHalf));
  const float d = fp16_to_f32(*d_out);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < kQK; ++j) q[j] = std::clamp(nearest_int(x[j] * id) + kHalf, 0, 2 * kHalf - 1);
}

// Affine 2^bits-level block: x = d * q + m with m the block minimum.
template <int kBits>
void quantize_affine_levels(const float* x, uint16_t* d_out, uint16_t* m_out, int* q) {
  constexpr int kLevels = (1 << kBits) - 1;
  float lo = x[0], hi = x[0];
  for (int j = 1; j < kQK; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  *d_out = f32_to_fp16((hi - lo) / kLevels);
  *m_out = f32_to_fp16(lo);
  const float d = fp16_to_f32(*d_out);
  const float m = fp16_to_f32(*m_out);
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < kQK; ++j) q[j] = std::clamp(nearest_int((x[j] - m) * id), 0, kLevels);
}

}  // namespace

void dequantize_q4_0(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK) {
    const auto blk = load_block<BlockQ4_0>(src, b);
    const float d = fp16_to_f32(blk.d);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>((blk.qs[j] & 0xF) - 8) * d;
      dst[j + kQK / 2] = static_cast<float>((blk.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK) {
    const auto blk = load_block<BlockQ4_1>(src, b);
    const float d = fp16_to_f32(blk.d);
    const float m = fp16_to_f32(blk.m);
    for (int j = 0; j < kQK / 2; ++j) {
      dst[j] = static_cast<float>(blk.qs[j] & 0xF) * d + m;
      dst[j + kQK / 2] = static_cast<float>(blk.qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q5_0(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK) {
    const auto blk = load_block<BlockQ5_0>(src, b);
    const float d = fp16_to_f32(blk.d);
    const uint32_t qh = load_u32(blk.qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (blk.qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
      const int q1 = (blk.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      dst[j] = static_cast<float>(q0 - 16) * d;
      dst[j + kQK / 2] = static_cast<float>(q1 - 16) * d;
    }
  }
}

void dequantize_q5_1(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK) {
    const auto blk = load_block<BlockQ5_1>(src, b);
    const float d = fp16_to_f32(blk.d);
    const float m = fp16_to_f32(blk.m);
    const uint32_t qh = load_u32(blk.qh);
    for (int j = 0; j < kQK / 2; ++j) {
      const int q0 = (blk.qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
      const int q1 = (blk.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
      dst[j] = static_cast<float>(q0) * d + m;
      dst[j + kQK / 2] = static_cast<float>(q1) * d + m;
    }
  }
}

void dequantize_q8_0(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK) {
    const auto blk = load_block<BlockQ8_0>(src, b);
    const float d = fp16_to_f32(blk.d);
    for (int j = 0; j < kQK; ++j) dst[j] = static_cast<float>(blk.qs[j]) * d;
  }
}

void quantize_q4_0(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQK) {
    BlockQ4_0 blk{};
    int q[kQK];
    quantize_symmetric_levels<4>(src, &blk.d, q);
    for (int j = 0; j < kQK / 2; ++j)
      blk.qs[j] = static_cast<uint8_t>(q[j] | (q[j + kQK / 2] << 4));
    store_block(blk, dst, b);
  }
}

void quantize_q5_0(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQK) {
    BlockQ5_0 blk{};
    int q[kQK];
    quantize_symmetric_levels<5>(src, &blk.d, q);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      blk.qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + kQK / 2] & 0xF) << 4));
    }
    for (int j = 0; j < kQK; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
    store_u32(qh, blk.qh);
    store_block(blk, dst, b);
  }
}

void quantize_q4_1(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQK) {
    BlockQ4_1 blk{};
    int q[kQK];
    quantize_affine_levels<4>(src, &blk.d, &blk.m, q);
    for (int j = 0; j < kQK / 2; ++j)
      blk.qs[j] = static_cast<uint8_t>(q[j] | (q[j + kQK / 2] << 4));
    store_block(blk, dst, b);
  }
}

void quantize_q5_1(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQK) {
    BlockQ5_1 blk{};
    int q[kQK];
    quantize_affine_levels<5>(src, &blk.d, &blk.m, q);
    uint32_t qh = 0;
    for (int j = 0; j < kQK / 2; ++j) {
      blk.qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + kQK / 2] & 0xF) << 4));
    }
    for (int j = 0; j < kQK; ++j) qh |= static_cast<uint32_t>(q[j] >> 4) << j;
    store_u32(qh, blk.qh);
    store_block(blk, dst, b);
  }
}

void quantize_q8_0(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQK) {
    BlockQ8_0 blk{};
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(src[j]));
    blk.d = f32_to_fp16(amax / 127.0f);
    const float d = fp16_to_f32(blk.d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQK; ++j)
      blk.qs[j] = static_cast<int8_t>(std::clamp(nearest_int(src[j] * id), -127, 127));
    store_block(blk, dst, b);
  }
}

}  // namespace vesper::tensor::detail
