// Packed q4_0 / q8_0 / k-quant (q2_K ... q6_K) matmul kernels for AVX-512 VNNI (on 256-bit vectors,
// AVX512VL): the AVX2 kernels' layout and tiling (packed_gemm_avx2.h, packed_kquant_tiles.h), with
// each slice's 4-byte dot products accumulated straight into int32 lanes by one vpdpbusd
// (unsigned weight bytes x signed activation bytes) instead of maddubs + add + madd. Integer sums
// are exact either way, so results equal the AVX2 and portable kernels bit for bit (block-sum and
// block-total orders of matmul_kernel.h).
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
#include "backend/cpu/packed_kquant_tiles.h"

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

// The k-quant sub-block dot (packed_kquant_tiles.h): a sub-block's exact int32 dot per row from
// vpdpbusd, then one vpmulld by the 8 rows' scales. Totals stay far below 2^31 (q4_K:
// 8 x 63 x 32 x 15 x 128 per block; q5_K: 8 x 63 x 32 x 31 x 128; q2_K / q3_K / q6_K at most
// 16 x 128 x 16 x 63 x 128).
// (Its q4_k nibble loop is VnniQ4_0::dot's, written out again: a shared helper taking a lambda
// made GCC keep the tiles' accumulators on the stack.)
struct VnniDot {
  template <int R>
  static inline void q4_k(const uint8_t* chunk, const int8_t* x, const uint8_t* sc, bool first,
                          __m256i (&isum)[R]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i scale =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
    __m256i dot[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i v = load_256(chunk + 32 * k);
      const __m256i lo = _mm256_and_si256(v, low4);                        // elements 8k + t
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);  // elements 8k + 4 + t
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = x + 256 * r + 8 * k;
        dot[r] = dpbusd(dpbusd(dot[r], lo, broadcast_4(xr)), hi, broadcast_4(xr + 4));
        keep_in_register(dot[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i p = _mm256_mullo_epi32(dot[r], scale);
      isum[r] = first ? p : _mm256_add_epi32(isum[r], p);
      keep_in_register(isum[r]);
    }
  }

  template <int R>
  static inline void q5_k(const uint8_t* chunk, const int8_t* x, const uint8_t* sc, bool first,
                          __m256i (&isum)[R]) {
    const __m256i scale =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
    const __m256i h = load_256(chunk + 128);
    __m256i dot[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
    q5_k_slice<R, 0>(chunk, h, x, dot);
    q5_k_slice<R, 1>(chunk, h, x, dot);
    q5_k_slice<R, 2>(chunk, h, x, dot);
    q5_k_slice<R, 3>(chunk, h, x, dot);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i p = _mm256_mullo_epi32(dot[r], scale);
      isum[r] = first ? p : _mm256_add_epi32(isum[r], p);
      keep_in_register(isum[r]);
    }
  }
  template <int R, int k>
  static inline void q5_k_slice(const uint8_t* chunk, __m256i h, const int8_t* x,
                                __m256i (&dot)[R]) {
    __m256i lo, hi;
    q5_slice<k>(load_256(chunk + 32 * k), h, lo, hi);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* xr = x + 256 * r + 8 * k;
      dot[r] = dpbusd(dpbusd(dot[r], lo, broadcast_4(xr)), hi, broadcast_4(xr + 4));
      keep_in_register(dot[r]);
    }
  }

  template <int R>
  static inline void sub16(const __m256i (&q)[4], const int8_t* x, __m128i scales16, int m,
                           bool first, __m256i (&isum)[R]) {
    // Byte 2j + m (row j's scale), sign-extended to lane j.
    const __m128i pick =
        m == 0 ? _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1)
               : _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i scale = _mm256_cvtepi8_epi32(_mm_shuffle_epi8(scales16, pick));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* xr = x + 256 * r;
      __m256i dot = dpbusd(_mm256_setzero_si256(), q[0], broadcast_4(xr));
      dot = dpbusd(dot, q[1], broadcast_4(xr + 4));
      dot = dpbusd(dot, q[2], broadcast_4(xr + 8));
      dot = dpbusd(dot, q[3], broadcast_4(xr + 12));
      const __m256i p = _mm256_mullo_epi32(dot, scale);
      isum[r] = first ? p : _mm256_add_epi32(isum[r], p);
      keep_in_register(isum[r]);
    }
  }
};

MatmulKernel vnni_packed_kernel(tensor::GgmlType type) {
  switch (type) {
    case tensor::GgmlType::kQ4_0:
      return run_packed<VnniQ4_0>;
    case tensor::GgmlType::kQ8_0:
      return run_packed<VnniQ8_0>;
    case tensor::GgmlType::kQ2_K:
      return run_packed<PackedQ2_K<VnniDot>>;
    case tensor::GgmlType::kQ3_K:
      return run_packed<PackedQ3_K<VnniDot>>;
    case tensor::GgmlType::kQ4_K:
      return run_packed<PackedQ4_K<VnniDot>>;
    case tensor::GgmlType::kQ5_K:
      return run_packed<PackedQ5_K<VnniDot>>;
    case tensor::GgmlType::kQ6_K:
      return run_packed<PackedQ6_K<VnniDot>>;
    default:
      return nullptr;
  }
}

}  // namespace
}  // namespace vesper::backend::cpu
