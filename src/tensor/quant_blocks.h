// Quantized block layouts, byte for byte as ggml defines them (ggml-common.h), so rows read from
// or written to GGUF files interoperate with llama.cpp. Each struct is one block; a row of n
// elements is n / block_size blocks laid end to end with no padding. All multi-byte fields are
// little-endian (the only byte order GGUF data uses on the hosts Vesper runs on).
//
// The packed 6-bit scale helpers are shared by the dequantizers, the quantizers and the backend
// kernels, so that there is one definition of each packing in the fast code. (The test oracle in
// tests/reference/ decodes the same bits independently, from the format description.)
#pragma once

#include <cstdint>

namespace vesper::tensor {

inline constexpr int kQK = 32;     // elements per block of the legacy types (ggml QK4_0 ... QK8_0)
inline constexpr int kQK_K = 256;  // elements per super-block of the k-quants (ggml QK_K)
inline constexpr int kScaleBytesK = 12;  // packed 6-bit scales of q3_K / q4_K / q5_K

// Legacy types: one fp16 scale d (and for _1 types an fp16 offset m) per 32 elements.
// Element j < 16 lives in the low nibble of qs[j], element j + 16 in its high nibble.
struct BlockQ4_0 {
  uint16_t d;  // fp16; x = d * (q - 8)
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {
  uint16_t d;  // fp16; x = d * q + m
  uint16_t m;  // fp16
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;     // fp16; x = d * (q - 16)
  uint8_t qh[4];  // bit j of this little-endian u32 is the 5th bit of element j
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d;  // fp16; x = d * q + m
  uint16_t m;  // fp16
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;  // fp16; x = d * q
  int8_t qs[kQK];
};

// K-quants: 256-element super-blocks split into sub-blocks of 16 or 32 with quantized scales.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // per 16 elements: scale in the low nibble, min in the high nibble
  uint8_t qs[kQK_K / 4];       // 2-bit quants
  uint16_t d;                  // fp16 super-scale of the scales
  uint16_t dmin;               // fp16 super-scale of the mins; x = d*sc*q - dmin*m
};
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];      // high (3rd) bit of each quant
  uint8_t qs[kQK_K / 4];         // low 2 bits
  uint8_t scales[kScaleBytesK];  // 16 signed 6-bit scales, biased by 32
  uint16_t d;                    // fp16; x = d * (sc - 32) * (q - 4)
};
struct BlockQ4_K {
  uint16_t d;                    // fp16; x = d*sc*q - dmin*m
  uint16_t dmin;                 // fp16
  uint8_t scales[kScaleBytesK];  // 8 (scale, min) pairs of 6 bits each
  uint8_t qs[kQK_K / 2];         // 4-bit quants
};
struct BlockQ5_K {
  uint16_t d;     // fp16; x = d*sc*q - dmin*m
  uint16_t dmin;  // fp16
  uint8_t scales[kScaleBytesK];
  uint8_t qh[kQK_K / 8];  // 5th bit of each quant
  uint8_t qs[kQK_K / 2];  // low 4 bits
};
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];      // low 4 bits
  uint8_t qh[kQK_K / 4];      // high 2 bits
  int8_t scales[kQK_K / 16];  // one signed 8-bit scale per 16 elements
  uint16_t d;                 // fp16; x = d * sc * (q - 32)
};
struct BlockQ8_K {
  float d;  // f32 (not fp16); x = d * q
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];  // sum of each 16 quants, used by ggml's integer dot products
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);

// q4_K / q5_K: sub-block j's 6-bit scale and min. Pairs 0-3 sit in the low 6 bits of bytes 0-3
// (scales) and 4-7 (mins); pairs 4-7 keep their low 4 bits in bytes 8-11 and their top 2 bits in
// the spare top bits of bytes 0-7.
inline void unpack_scale_min_k4(int j, const uint8_t* packed, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((packed[j + 4] & 0xF) | ((packed[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((packed[j + 4] >> 4) | ((packed[j] >> 6) << 4));
  }
}

// Inverse of unpack_scale_min_k4; `packed` must start zeroed. scale, min < 64.
inline void pack_scale_min_k4(int j, uint8_t scale, uint8_t min, uint8_t* packed) {
  if (j < 4) {
    packed[j] |= scale;
    packed[j + 4] |= min;
  } else {
    packed[j + 4] |= static_cast<uint8_t>((scale & 0xF) | ((min & 0xF) << 4));
    packed[j - 4] |= static_cast<uint8_t>((scale >> 4) << 6);
    packed[j] |= static_cast<uint8_t>((min >> 4) << 6);
  }
}

// q3_K: sub-block j's scale, unbiased (-32 .. 31). Low 4 bits: nibble (j / 8) of byte j % 8;
// high 2 bits: bits 2*(j/4) .. +1 of byte 8 + j % 4.
inline int unpack_scale_q3_k(int j, const uint8_t* packed) {
  const int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
  const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// Inverse of unpack_scale_q3_k; `packed` must start zeroed. scale in [-32, 31].
inline void pack_scale_q3_k(int j, int scale, uint8_t* packed) {
  const int biased = scale + 32;
  if (j < 8) {
    packed[j] |= static_cast<uint8_t>(biased & 0xF);
  } else {
    packed[j - 8] |= static_cast<uint8_t>((biased & 0xF) << 4);
  }
  packed[8 + j % 4] |= static_cast<uint8_t>((biased >> 4) << (2 * (j / 4)));
}

}  // namespace vesper::tensor
