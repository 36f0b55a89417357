// The portable integer-dot kernels: each weight block is decoded to integers (with its float
// scales kept apart), dotted exactly with the Q8 activation quants, and accumulated in f32 one
// block total at a time in matmul_kernel.h's block-sum / block-total order, so the result is
// bit-identical to the SIMD kernels. It is the fallback on CPUs without AVX2 and the reference the
// SIMD kernels are tested against; speed is not its job.
#include <cmath>
#include <cstring>

#include "backend/cpu/matmul_kernel.h"
#include "core/fp16.h"
#include "tensor/quant_blocks.h"

namespace vesper::backend::cpu {
namespace {

using tensor::GgmlType;

// One weight block as integers: w[i] = d * wint[i] - dmin * min16[i / 16].
struct IntBlock {
  int32_t wint[256];
  int32_t min16[16];  // k-quants with a min only
  float d = 0.0f;
  float dmin = 0.0f;
};

float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_f32(h);
}

// Element j < 16 in the low nibble of qs[j], j + 16 in its high nibble.
int nibble_32(const uint8_t* qs, int j) {
  return j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
}

struct DecodeQ4_0 {  // d@0, qs@2[16]
  static constexpr int kBlock = 32, kBytes = 18;
  static constexpr bool kHasMin = false;
  static void decode(const uint8_t* b, IntBlock& out) {
    out.d = half(b);
    for (int j = 0; j < 32; ++j) out.wint[j] = nibble_32(b + 2, j) - 8;
  }
};

struct DecodeQ5_0 {  // d@0, qh@2 (u32), qs@6[16]
  static constexpr int kBlock = 32, kBytes = 22;
  static constexpr bool kHasMin = false;
  static void decode(const uint8_t* b, IntBlock& out) {
    out.d = half(b);
    uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    for (int j = 0; j < 32; ++j)
      out.wint[j] = nibble_32(b + 6, j) + 16 * static_cast<int>((qh >> j) & 1) - 16;
  }
};

struct DecodeQ8_0 {  // d@0, qs@2[32] int8
  static constexpr int kBlock = 32, kBytes = 34;
  static constexpr bool kHasMin = false;
  static void decode(const uint8_t* b, IntBlock& out) {
    out.d = half(b);
    for (int j = 0; j < 32; ++j) out.wint[j] = static_cast<int8_t>(b[2 + j]);
  }
};

// q2_K: 16 sub-blocks of 16, element 128n + 32j + l (l < 32) in bits 2j, 2j + 1 of qs[32n + l];
// sub-block g's scale in the low nibble of scales[g], its min in the high nibble.
struct DecodeQ2_K {  // scales@0[16], qs@16[64], d@80, dmin@82
  static constexpr int kBlock = 256, kBytes = 84;
  static constexpr bool kHasMin = true;
  static void decode(const uint8_t* b, IntBlock& out) {
    out.d = half(b + 80);
    out.dmin = half(b + 82);
    for (int g = 0; g < 16; ++g) out.min16[g] = b[g] >> 4;
    for (int i = 0; i < 256; ++i) {
      const int n = i / 128, j = (i % 128) / 32, l = i % 32;
      out.wint[i] = (b[i / 16] & 0xF) * ((b[16 + 32 * n + l] >> (2 * j)) & 3);
    }
  }
};

// q3_K: 16 sub-blocks of 16 with signed 6-bit scales; element 128n + 32j + l has its low 2 bits in
// bits 2j, 2j + 1 of qs[32n + l] and its third bit in bit 4n + j of hmask[l]; the quant is
// low + 4 * high - 4 (-4 .. 3).
struct DecodeQ3_K {  // hmask@0[32], qs@32[64], scales@96[12], d@108
  static constexpr int kBlock = 256, kBytes = 110;
  static constexpr bool kHasMin = false;
  static void decode(const uint8_t* b, IntBlock& out) {
    out.d = half(b + 108);
    for (int i = 0; i < 256; ++i) {
      const int n = i / 128, j = (i % 128) / 32, l = i % 32;
      const int low = (b[32 + 32 * n + l] >> (2 * j)) & 3;
      const int high = (b[l] >> (4 * n + j)) & 1;
      out.wint[i] = tensor::unpack_scale_q3_k(i / 16, b + 96) * (low + 4 * high - 4);
    }
  }
};

// q4_K and q5_K: 8 sub-blocks of 32, element 64c + l in the low nibble of qs[32c + l] and
// 64c + 32 + l in its high nibble; q5_K adds bit (2c or 2c + 1) of qh[l] as the fifth bit.
template <bool kFifthBit>
struct DecodeK45 {
  static constexpr int kBlock = 256, kBytes = kFifthBit ? 176 : 144;
  static constexpr bool kHasMin = true;
  static void decode(const uint8_t* b, IntBlock& out) {
    out.d = half(b);
    out.dmin = half(b + 2);
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (kFifthBit ? 48 : 16);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      tensor::unpack_scale_min_k4(j, b + 4, &sc, &m);
      out.min16[2 * j] = out.min16[2 * j + 1] = m;
      for (int l = 0; l < 32; ++l) {
        const uint8_t byte = qs[32 * (j / 2) + l];
        int q = j % 2 == 0 ? byte & 0xF : byte >> 4;
        if (kFifthBit) q += 16 * ((qh[l] >> j) & 1);
        out.wint[32 * j + l] = sc * q;
      }
    }
  }
};

struct DecodeQ6_K {  // ql@0[128], qh@128[64], scales@192[16] int8, d@208
  static constexpr int kBlock = 256, kBytes = 210;
  static constexpr bool kHasMin = false;
  static void decode(const uint8_t* b, IntBlock& out) {
    out.d = half(b + 208);
    for (int i = 0; i < 256; ++i) {
      const int h = i / 128, s = (i % 128) / 32, l = i % 32;  // element 128h + 32s + l
      const uint8_t low = b[64 * h + 32 * (s % 2) + l];
      const int q = (s < 2 ? low & 0xF : low >> 4) | (((b[128 + 32 * h + l] >> (2 * s)) & 3) << 4);
      out.wint[i] = static_cast<int8_t>(b[192 + i / 16]) * (q - 32);
    }
  }
};

template <class D>
void matmul_q8_scalar(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float*) {
  const Q8Rows& x = *a.xq;
  const int64_t n_blocks = a.n_in / D::kBlock;
  IntBlock blk;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const uint8_t* wrow = a.w + static_cast<size_t>(o) * a.w_row_bytes;
    for (int64_t r = 0; r < a.n_rows; ++r) {
      float acc = 0.0f, accm = 0.0f;
      for (int64_t b = 0; b < n_blocks; ++b) {
        D::decode(wrow + b * D::kBytes, blk);
        const int64_t k = x.block_index(r, b);
        const int8_t* xb = x.qs + k * D::kBlock;
        // The block's whole integer sum, one FMA per block (the block-sum and block-total orders
        // of matmul_kernel.h, which 8-row packed kernels can keep too).
        int32_t total = 0;
        for (int i = 0; i < D::kBlock; ++i) total += blk.wint[i] * xb[i];
        acc = std::fma(static_cast<float>(total), blk.d * x.d[k], acc);
        if constexpr (D::kHasMin) {
          // Block totals of the mins (q2_K, q4_K, q5_K), one FMA per block.
          const int16_t* bsums = x.bsums + k * (D::kBlock / 16);
          int32_t imin = 0;
          for (int g = 0; g < D::kBlock / 16; ++g) imin += blk.min16[g] * bsums[g];
          accm = std::fma(static_cast<float>(imin), blk.dmin * x.d[k], accm);
        }
      }
      const float sum = D::kHasMin ? acc - accm : acc;
      a.y[r * a.n_out + o] = sum;
    }
  }
}

}  // namespace

MatmulKernel scalar_q8_kernel(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return matmul_q8_scalar<DecodeQ4_0>;
    case GgmlType::kQ5_0:
      return matmul_q8_scalar<DecodeQ5_0>;
    case GgmlType::kQ8_0:
      return matmul_q8_scalar<DecodeQ8_0>;
    case GgmlType::kQ2_K:
      return matmul_q8_scalar<DecodeQ2_K>;
    case GgmlType::kQ3_K:
      return matmul_q8_scalar<DecodeQ3_K>;
    case GgmlType::kQ4_K:
      return matmul_q8_scalar<DecodeK45<false>>;
    case GgmlType::kQ5_K:
      return matmul_q8_scalar<DecodeK45<true>>;
    case GgmlType::kQ6_K:
      return matmul_q8_scalar<DecodeQ6_K>;
    default:
      return nullptr;
  }
}

}  // namespace vesper::backend::cpu
