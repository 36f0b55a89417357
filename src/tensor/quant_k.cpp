// The k-quants: 256-element super-blocks (q2_K .. q6_K, and q8_K, the activation format of ggml's
// integer dot products). Quantizers fit each sub-block with a scale search (quant_search.h),
// quantize the sub-block scales against one fp16 super-scale, then requantize every element
// against the scales actually stored.
//
// Element i of a super-block, as the formats place it (h = i / 128, s = (i % 128) / 32, l = i %
// 32):
//   q2_K / q3_K low bits: bits 2s of qs[32h + l]; q3_K high bit: bit i / 32 of hmask[l]
//   q4_K / q5_K nibble:   qs[32 * (i / 64) + l], high nibble when i % 64 >= 32;
//   q5_K 5th bit:         bit i / 32 of qh[l]
//   q6_K low 4 bits:      ql[64h + 32 * (s & 1) + l], high nibble when s >= 2;
//   q6_K high 2 bits:     bits 2s of qh[32h + l]
#include <algorithm>
#include <cmath>

#include "core/fp16.h"
#include "tensor/quant_blocks.h"
#include "tensor/quant_rows.h"
#include "tensor/quant_search.h"

namespace vesper::tensor::detail {
namespace {

// Packs 2-bit levels (q2_K, and the low bits of q3_K) into qs.
void pack_2bit(const uint8_t* levels, uint8_t* qs) {
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* x = levels + 128 * h + l;
      qs[32 * h + l] = static_cast<uint8_t>(x[0] | (x[32] << 2) | (x[64] << 4) | (x[96] << 6));
    }
}

// Packs the low nibbles of q4_K / q5_K levels into qs.
void pack_nibbles_k(const uint8_t* levels, uint8_t* qs) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      qs[32 * c + l] =
          static_cast<uint8_t>((levels[64 * c + l] & 0xF) | ((levels[64 * c + 32 + l] & 0xF) << 4));
}

// Weights of the affine fits: ggml's choice for files made without an importance matrix
// (favours large-magnitude elements, which matter most to a dot product).
void magnitude_weights(const float* x, int n, float* w) {
  float sum_x2 = 0.0f;
  for (int i = 0; i < n; ++i) sum_x2 += x[i] * x[i];
  const float av_x = std::sqrt(sum_x2 / static_cast<float>(n));
  for (int i = 0; i < n; ++i) w[i] = av_x + std::fabs(x[i]);
}

// q4_K and q5_K share everything but the level count and the 5th-bit plane.
template <int kNmax>
void quantize_k_affine32(const float* x, uint16_t* d_out, uint16_t* dmin_out, uint8_t* scales,
                         uint8_t* levels, float rmin, int nstep) {
  float sub_scale[8], sub_min[8], w[32];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    magnitude_weights(x + 32 * j, 32, w);
    const AffineFit fit =
        fit_affine({x + 32 * j, 32}, {w, 32}, kNmax, levels + 32 * j, rmin, 0.1f, nstep);
    sub_scale[j] = fit.scale;
    sub_min[j] = fit.min;
    max_scale = std::max(max_scale, fit.scale);
    max_min = std::max(max_min, fit.min);
  }
  const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
  std::fill_n(scales, kScaleBytesK, uint8_t{0});
  for (int j = 0; j < 8; ++j) {
    const auto ls = static_cast<uint8_t>(std::clamp(nearest_int(inv_scale * sub_scale[j]), 0, 63));
    const auto lm = static_cast<uint8_t>(std::clamp(nearest_int(inv_min * sub_min[j]), 0, 63));
    pack_scale_min_k4(j, ls, lm, scales);
  }
  *d_out = f32_to_fp16(max_scale / 63.0f);
  *dmin_out = f32_to_fp16(max_min / 63.0f);
  const float d = fp16_to_f32(*d_out);
  const float dmin = fp16_to_f32(*dmin_out);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(j, scales, &sc, &m);
    const float ds = d * sc;
    const float dm = dmin * m;
    for (int i = 32 * j; i < 32 * j + 32; ++i) {
      levels[i] = ds == 0.0f
                      ? 0
                      : static_cast<uint8_t>(std::clamp(nearest_int((x[i] + dm) / ds), 0, kNmax));
    }
  }
}

}  // namespace

// ---- dequantization ----------------------------------------------------------------------------
// Each product below is exact in f32 (an fp16 times small integers), so every element is its
// format's exact value rounded once.

void dequantize_q2_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK_K) {
    const auto blk = load_block<BlockQ2_K>(src, b);
    const float d = fp16_to_f32(blk.d);
    const float dmin = fp16_to_f32(blk.dmin);
    for (int sub = 0; sub < 16; ++sub) {
      const float dl = d * static_cast<float>(blk.scales[sub] & 0xF);
      const float ml = dmin * static_cast<float>(blk.scales[sub] >> 4);
      const int h = sub / 8, s = (sub % 8) / 2, l0 = 16 * (sub % 2);
      for (int l = l0; l < l0 + 16; ++l) {
        const int q = (blk.qs[32 * h + l] >> (2 * s)) & 3;
        dst[128 * h + 32 * s + l] = dl * static_cast<float>(q) - ml;
      }
    }
  }
}

void dequantize_q3_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK_K) {
    const auto blk = load_block<BlockQ3_K>(src, b);
    const float d = fp16_to_f32(blk.d);
    for (int sub = 0; sub < 16; ++sub) {
      const float dl = d * static_cast<float>(unpack_scale_q3_k(sub, blk.scales));
      const int h = sub / 8, s = (sub % 8) / 2, l0 = 16 * (sub % 2);
      const int plane = 4 * h + s;  // == i / 32
      for (int l = l0; l < l0 + 16; ++l) {
        const int low = (blk.qs[32 * h + l] >> (2 * s)) & 3;
        const int high = (blk.hmask[l] >> plane) & 1;
        dst[128 * h + 32 * s + l] = dl * static_cast<float>(low + 4 * high - 4);
      }
    }
  }
}

void dequantize_q4_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK_K) {
    const auto blk = load_block<BlockQ4_K>(src, b);
    const float d = fp16_to_f32(blk.d);
    const float dmin = fp16_to_f32(blk.dmin);
    for (int c = 0; c < 4; ++c) {
      uint8_t sc, m;
      unpack_scale_min_k4(2 * c, blk.scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      unpack_scale_min_k4(2 * c + 1, blk.scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) {
        dst[64 * c + l] = d1 * static_cast<float>(blk.qs[32 * c + l] & 0xF) - m1;
        dst[64 * c + 32 + l] = d2 * static_cast<float>(blk.qs[32 * c + l] >> 4) - m2;
      }
    }
  }
}

void dequantize_q5_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK_K) {
    const auto blk = load_block<BlockQ5_K>(src, b);
    const float d = fp16_to_f32(blk.d);
    const float dmin = fp16_to_f32(blk.dmin);
    for (int c = 0; c < 4; ++c) {
      uint8_t sc, m;
      unpack_scale_min_k4(2 * c, blk.scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      unpack_scale_min_k4(2 * c + 1, blk.scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) {
        const int q1 = (blk.qs[32 * c + l] & 0xF) | (((blk.qh[l] >> (2 * c)) & 1) << 4);
        const int q2 = (blk.qs[32 * c + l] >> 4) | (((blk.qh[l] >> (2 * c + 1)) & 1) << 4);
        dst[64 * c + l] = d1 * static_cast<float>(q1) - m1;
        dst[64 * c + 32 + l] = d2 * static_cast<float>(q2) - m2;
      }
    }
  }
}

void dequantize_q6_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK_K) {
    const auto blk = load_block<BlockQ6_K>(src, b);
    const float d = fp16_to_f32(blk.d);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = blk.ql + 64 * h;
      const uint8_t* qh = blk.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        const int q[4] = {
            (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4),
            (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4),
            (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
            (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
        };
        for (int s = 0; s < 4; ++s) {
          // d * sc is exact; the one rounding is the multiply by the level.
          const float ds = d * static_cast<float>(blk.scales[8 * h + 2 * s + l / 16]);
          dst[128 * h + 32 * s + l] = ds * static_cast<float>(q[s] - 32);
        }
      }
    }
  }
}

void dequantize_q8_k(const uint8_t* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK_K) {
    const auto blk = load_block<BlockQ8_K>(src, b);
    for (int i = 0; i < kQK_K; ++i) dst[i] = blk.d * static_cast<float>(blk.qs[i]);
  }
}

// ---- quantization ------------------------------------------------------------------------------

void quantize_q2_k(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQK_K) {
    BlockQ2_K blk{};
    uint8_t levels[kQK_K];
    float sub_scale[16], sub_min[16], w[16];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 16; ++j) {
      const float* x = src + 16 * j;
      for (int i = 0; i < 16; ++i) w[i] = std::fabs(x[i]);
      const AffineFit fit = fit_affine({x, 16}, {w, 16}, 3, levels + 16 * j, -0.5f, 0.1f, 15);
      sub_scale[j] = fit.scale;
      sub_min[j] = fit.min;
      max_scale = std::max(max_scale, fit.scale);
      max_min = std::max(max_min, fit.min);
    }
    const float inv_scale = max_scale > 0 ? 15.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 15.0f / max_min : 0.0f;
    for (int j = 0; j < 16; ++j) {
      const int ls = std::clamp(nearest_int(inv_scale * sub_scale[j]), 0, 15);
      const int lm = std::clamp(nearest_int(inv_min * sub_min[j]), 0, 15);
      blk.scales[j] = static_cast<uint8_t>(ls | (lm << 4));
    }
    blk.d = f32_to_fp16(max_scale / 15.0f);
    blk.dmin = f32_to_fp16(max_min / 15.0f);
    const float d = fp16_to_f32(blk.d);
    const float dmin = fp16_to_f32(blk.dmin);
    for (int j = 0; j < 16; ++j) {
      const float ds = d * static_cast<float>(blk.scales[j] & 0xF);
      const float dm = dmin * static_cast<float>(blk.scales[j] >> 4);
      for (int i = 16 * j; i < 16 * j + 16; ++i)
        levels[i] = ds == 0.0f
                        ? 0
                        : static_cast<uint8_t>(std::clamp(nearest_int((src[i] + dm) / ds), 0, 3));
    }
    pack_2bit(levels, blk.qs);
    store_block(blk, dst, b);
  }
}

void quantize_q3_k(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQK_K) {
    BlockQ3_K blk{};
    int8_t fit_levels[16];
    float sub_scale[16], w[16];
    float max_scale = 0.0f, amax = 0.0f;
    for (int j = 0; j < 16; ++j) {
      const float* x = src + 16 * j;
      for (int i = 0; i < 16; ++i) w[i] = x[i] * x[i];
      sub_scale[j] = fit_symmetric({x, 16}, {w, 16}, 4, fit_levels, 5);
      if (std::fabs(sub_scale[j]) > amax) {
        amax = std::fabs(sub_scale[j]);
        max_scale = sub_scale[j];
      }
    }
    uint8_t levels[kQK_K] = {};
    if (max_scale != 0.0f) {
      const float iscale = -32.0f / max_scale;
      for (int j = 0; j < 16; ++j)
        pack_scale_q3_k(j, std::clamp(nearest_int(iscale * sub_scale[j]), -32, 31), blk.scales);
      blk.d = f32_to_fp16(1.0f / iscale);
    }
    const float d = fp16_to_f32(blk.d);
    for (int j = 0; j < 16; ++j) {
      const float ds = d * static_cast<float>(unpack_scale_q3_k(j, blk.scales));
      for (int i = 16 * j; i < 16 * j + 16; ++i)
        levels[i] =
            ds == 0.0f ? 4 : static_cast<uint8_t>(std::clamp(nearest_int(src[i] / ds), -4, 3) + 4);
    }
    for (int i = 0; i < kQK_K; ++i) {
      if (levels[i] > 3) {
        blk.hmask[i % 32] = static_cast<uint8_t>(blk.hmask[i % 32] | (1 << (i / 32)));
        levels[i] = static_cast<uint8_t>(levels[i] - 4);
      }
    }
    pack_2bit(levels, blk.qs);
    store_block(blk, dst, b);
  }
}

void quantize_q4_k(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQK_K) {
    BlockQ4_K blk{};
    uint8_t levels[kQK_K];
    quantize_k_affine32<15>(src, &blk.d, &blk.dmin, blk.scales, levels, -1.0f, 20);
    pack_nibbles_k(levels, blk.qs);
    store_block(blk, dst, b);
  }
}

void quantize_q5_k(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQK_K) {
    BlockQ5_K blk{};
    uint8_t levels[kQK_K];
    quantize_k_affine32<31>(src, &blk.d, &blk.dmin, blk.scales, levels, -0.5f, 15);
    pack_nibbles_k(levels, blk.qs);
    for (int i = 0; i < kQK_K; ++i)
      blk.qh[i % 32] = static_cast<uint8_t>(blk.qh[i % 32] | ((levels[i] >> 4) << (i / 32)));
    store_block(blk, dst, b);
  }
}

void quantize_q6_k(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQK_K) {
    BlockQ6_K blk{};
    int8_t fit_levels[16];
    float sub_scale[16], w[16];
    float max_scale = 0.0f, amax = 0.0f;
    for (int j = 0; j < 16; ++j) {
      const float* x = src + 16 * j;
      for (int i = 0; i < 16; ++i) w[i] = x[i] * x[i];
      sub_scale[j] = fit_symmetric({x, 16}, {w, 16}, 32, fit_levels, 2);
      if (std::fabs(sub_scale[j]) > amax) {
        amax = std::fabs(sub_scale[j]);
        max_scale = sub_scale[j];
      }
    }
    uint8_t levels[kQK_K];
    if (max_scale != 0.0f) {
      const float iscale = -128.0f / max_scale;
      for (int j = 0; j < 16; ++j)
        blk.scales[j] =
            static_cast<int8_t>(std::clamp(nearest_int(iscale * sub_scale[j]), -128, 127));
      blk.d = f32_to_fp16(1.0f / iscale);
    }
    const float d = fp16_to_f32(blk.d);
    for (int j = 0; j < 16; ++j) {
      const float ds = d * static_cast<float>(blk.scales[j]);
      for (int i = 16 * j; i < 16 * j + 16; ++i)
        levels[i] = ds == 0.0f
                        ? 32
                        : static_cast<uint8_t>(std::clamp(nearest_int(src[i] / ds), -32, 31) + 32);
    }
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const uint8_t* q = levels + 128 * h + l;
        blk.ql[64 * h + l] = static_cast<uint8_t>((q[0] & 0xF) | ((q[64] & 0xF) << 4));
        blk.ql[64 * h + 32 + l] = static_cast<uint8_t>((q[32] & 0xF) | ((q[96] & 0xF) << 4));
        blk.qh[32 * h + l] = static_cast<uint8_t>((q[0] >> 4) | ((q[32] >> 4) << 2) |
                                                  ((q[64] >> 4) << 4) | ((q[96] >> 4) << 6));
      }
    store_block(blk, dst, b);
  }
}

void quantize_q8_k(const float* src, uint8_t* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, src += kQK_K) {
    BlockQ8_K blk{};
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < kQK_K; ++i) {
      if (std::fabs(src[i]) > amax) {
        amax = std::fabs(src[i]);
        max = src[i];
      }
    }
    if (amax != 0.0f) {
      // As ggml: the extreme value maps to -127 (not -128), so |q| <= 127 and the integer dot
      // products' pairwise sums cannot overflow int16.
      const float iscale = -127.0f / max;
      for (int i = 0; i < kQK_K; ++i)
        blk.qs[i] = static_cast<int8_t>(std::clamp(nearest_int(iscale * src[i]), -127, 127));
      blk.d = 1.0f / iscale;
    }
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int i = 16 * j; i < 16 * j + 16; ++i) sum += blk.qs[i];
      blk.bsums[j] = static_cast<int16_t>(sum);
    }
    store_block(blk, dst, b);
  }
}

}  // namespace vesper::tensor::detail
