// Packed q4_0 / q8_0 matmul kernels for AVX-512 VNNI (on 256-bit vectors, AVX512VL): the AVX2
// kernels' layout and tiling (packed_gemm_avx2.h), with each slice's 4-byte dot products
// accumulated straight into int32 lanes by one vpdpbusd (unsigned weight bytes x signed
// activation bytes) instead of maddubs + add + madd. Integer sums are exact either way, so results
// equal the AVX2 and portable kernels bit for bit (block-sum order of matmul_kernel.h).
//
// The includer defines, before including this header, inside vesper::backend::cpu's anonymous
// namespace:
//   __m256i dpbusd(__m256i acc, __m256i u8, __m256i s8);
//       // acc + (per 32-bit lane) the sum of the 4 products of unsigned bytes of u8 and signed
//       // bytes of s8, without saturation (_mm256_dpbusd_epi32)
// matmul_packed_avx512_vnni.cpp binds it to the instruction; a test binds it to SIMDe's portable
// implementation, so the kernels' logic is tested on machines without AVX-512.
#pragma once

#include "backend/cpu/packed_gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

// q4_0: nibbles q (0..15) are the unsigned operand; 8 * (the block's activation sum) is
// subtracted after (sum (q - 8) x = sum q x - 8 sum x, exact).
struct VnniQ4_0 {
  static constexpr int64_t kBlock = 32, kChunkBytes = 128, kScaleCount = 8;
  template <int R>
  static inline void dot(const uint8_t* chunk, const int8_t* xq, const int16_t* xs,
                         __m256i (&isum)[R]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) isum[r] = _mm256_set1_epi32(-8 * xs[r]);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i v = load_256(chunk + 32 * k);
      const __m256i lo = _mm256_and_si256(v, low4);                        // elements 8k + t
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);  // elements 8k + 4 + t
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* x = xq + 32 * r + 8 * k;
        isum[r] = dpbusd(dpbusd(isum[r], lo, broadcast_4(x)), hi, broadcast_4(x + 4));
        keep_in_register(isum[r]);
      }
    }
  }
};

// q8_0: signed weights w become the unsigned w + 128 (one xor per slice, shared by the tile's
// rows); 128 * (the block's activation sum) is subtracted after.
struct VnniQ8_0 {
  static constexpr int64_t kBlock = 32, kChunkBytes = 256, kScaleCount = 8;
  template <int R>
  static inline void dot(const uint8_t* chunk, const int8_t* xq, const int16_t* xs,
                         __m256i (&isum)[R]) {
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(0x80));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) isum[r] = _mm256_set1_epi32(-128 * xs[r]);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i w = _mm256_xor_si256(load_256(chunk + 32 * k), bias);  // elements 4k + t
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        isum[r] = dpbusd(isum[r], w, broadcast_4(xq + 32 * r + 4 * k));
        keep_in_register(isum[r]);
      }
    }
  }
};

MatmulKernel vnni_packed_kernel(tensor::GgmlType type) {
  switch (type) {
    case tensor::GgmlType::kQ4_0:
      return run_packed<VnniQ4_0>;
    case tensor::GgmlType::kQ8_0:
      return run_packed<VnniQ8_0>;
    default:
      return nullptr;
  }
}

}  // namespace
}  // namespace vesper::backend::cpu
