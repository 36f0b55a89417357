// AVX2 kernels over 8-row packed q4_0 / q8_0 and k-quant (q2_K ... q6_K) weights
// (backend/packed_weights.h): each 32-byte slice of a chunk holds 4 weights of each of 8 rows (one
// 32-bit lane per row), so a broadcast of 4 activation bytes and one maddubs serve 8 output
// features, and the lanes of the integer sums end up as the 8 rows' block sums without a horizontal
// reduction. The 8 rows' fp16 scales convert as one vector and one FMA accumulates 8 outputs, in
// the block-sum / block-total order of matmul_kernel.h, so results equal the unpacked and portable
// kernels bit for bit. Tiling and cache blocking are the driver's (packed_gemm_avx2.h); the k-quant
// tiles are packed_kquant_tiles.h's, over this file's sub-block dot (MaddubsDot).
#include "backend/cpu/packed_gemm_avx2.h"
#include "backend/cpu/packed_kquant_tiles.h"

namespace vesper::backend::cpu {
namespace {

// q4_0: stored nibbles q (0..15, the weight is q - 8) are taken unsigned by maddubs, and 8 * (the
// block's activation sum) is subtracted after: sum (q - 8) x = sum q x - 8 sum x, exact. Per row,
// the int16 pair sums stay below 8 * 2 * 15 * 127 = 30480 over the block, so they are added in
// int16 and widened once.
struct PackedQ4_0 {
  static constexpr int64_t kBlock = 32, kChunkBytes = 128, kScaleCount = 8;
  // isum[r] lane j = output j's exact block dot with tile row r, whose block is at xq + 32 r and
  // whose quant sum is xs[r].
  template <int R>
  static inline void dot(const uint8_t* chunk, const int8_t* xq, const int16_t* xs,
                         __m256i (&isum)[R]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i s16[R];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i v = load_256(chunk + 32 * k);
      const __m256i lo = _mm256_and_si256(v, low4);                        // elements 8k + t
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);  // elements 8k + 4 + t
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* x = xq + 32 * r + 8 * k;
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast_4(x)),
                                           _mm256_maddubs_epi16(hi, broadcast_4(x + 4)));
        s16[r] = k == 0 ? p : _mm256_add_epi16(s16[r], p);
        keep_in_register(s16[r]);
      }
    }
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
      isum[r] = _mm256_sub_epi32(_mm256_madd_epi16(s16[r], ones), _mm256_set1_epi32(8 * xs[r]));
  }
};

// q8_0: signed weights against signed activations, ggml's sign trick (maddubs wants one unsigned
// operand); int16 pair sums reach 2 * 128 * 127, so each slice widens to int32 at once.
struct PackedQ8_0 {
  static constexpr int64_t kBlock = 32, kChunkBytes = 256, kScaleCount = 8;
  template <int R>
  static inline void dot(const uint8_t* chunk, const int8_t* xq, const int16_t*,
                         __m256i (&isum)[R]) {
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i w = load_256(chunk + 32 * k);  // elements 4k + t
      const __m256i abs_w = _mm256_sign_epi8(w, w);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_sign_epi8(broadcast_4(xq + 32 * r + 4 * k), w);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, x), ones);
        isum[r] = k == 0 ? p : _mm256_add_epi32(isum[r], p);
        keep_in_register(isum[r]);
      }
    }
  }
};

// The k-quant sub-block dot on AVX2 (packed_kquant_tiles.h): maddubs into int16 pair sums, then
// one madd with the 8 rows' scales (as int16 pairs) widens and scales them. (The q4_k nibble loop
// is PackedQ4_0::dot's, written out again: a shared helper taking a lambda made GCC keep the
// tiles' accumulators on the stack.)
struct MaddubsDot {
  // Per row, a q4_K sub-block's int16 pair sums stay below 8 * 2 * 15 * 128 = 30720, so it adds
  // in int16 and widens once.
  template <int R>
  static inline void q4_k(const uint8_t* chunk, const int8_t* x, const uint8_t* sc, bool first,
                          __m256i (&isum)[R]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    // Lane j: row j's scale in both int16 halves.
    __m256i scale = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
    scale = _mm256_or_si256(scale, _mm256_slli_epi32(scale, 16));
    __m256i s16[R];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i v = load_256(chunk + 32 * k);
      const __m256i lo = _mm256_and_si256(v, low4);                        // elements 8k + t
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);  // elements 8k + 4 + t
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* xr = x + 256 * r + 8 * k;
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast_4(xr)),
                                           _mm256_maddubs_epi16(hi, broadcast_4(xr + 4)));
        s16[r] = k == 0 ? p : _mm256_add_epi16(s16[r], p);
        keep_in_register(s16[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256i p = _mm256_madd_epi16(s16[r], scale);
      isum[r] = first ? p : _mm256_add_epi32(isum[r], p);
      keep_in_register(isum[r]);
    }
  }

  // A q5_K sub-block. Quants reach 31, so a row's int16 sums over 2 slices (4 maddubs of 2
  // products each) stay within 8 * 31 * 128 = 31744, but over 4 slices they could overflow: each
  // half (slices k0, k0 + 1) is widened and scaled by its own madd.
  template <int R>
  static inline void q5_k(const uint8_t* chunk, const int8_t* x, const uint8_t* sc, bool first,
                          __m256i (&isum)[R]) {
    __m256i scale = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
    scale = _mm256_or_si256(scale, _mm256_slli_epi32(scale, 16));
    const __m256i h = load_256(chunk + 128);
    q5_k_half<R, 0>(chunk, h, x, scale, first, isum);
    q5_k_half<R, 2>(chunk, h, x, scale, false, isum);
  }
  template <int R, int k0>
  static inline void q5_k_half(const uint8_t* chunk, __m256i h, const int8_t* x, __m256i scale,
                               bool first, __m256i (&isum)[R]) {
    __m256i lo0, hi0, lo1, hi1;
    q5_slice<k0>(load_256(chunk + 32 * k0), h, lo0, hi0);
    q5_slice<k0 + 1>(load_256(chunk + 32 * (k0 + 1)), h, lo1, hi1);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* xr = x + 256 * r + 8 * k0;
      const __m256i p =
          _mm256_add_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo0, broadcast_4(xr)),
                                            _mm256_maddubs_epi16(hi0, broadcast_4(xr + 4))),
                           _mm256_add_epi16(_mm256_maddubs_epi16(lo1, broadcast_4(xr + 8)),
                                            _mm256_maddubs_epi16(hi1, broadcast_4(xr + 12))));
      const __m256i scaled = _mm256_madd_epi16(p, scale);
      isum[r] = first ? scaled : _mm256_add_epi32(isum[r], scaled);
      keep_in_register(isum[r]);
    }
  }

  // A sub-block of 16 (q2_K, q3_K, q6_K): two slices' int16 pair sums stay below
  // 2 * 2 * 63 * 128 = 32256, so each pair of slices is widened and scaled by one madd.
  template <int R>
  static inline void sub16(const __m256i (&q)[4], const int8_t* x, __m128i scales16, int m,
                           bool first, __m256i (&isum)[R]) {
    // Byte 2j + m (row j's scale) in both int16 halves of lane j.
    const __m128i pick = m == 0
                             ? _mm_setr_epi8(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14)
                             : _mm_setr_epi8(1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15);
    const __m256i scale = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales16, pick));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* xr = x + 256 * r;
      const __m256i sa = _mm256_add_epi16(_mm256_maddubs_epi16(q[0], broadcast_4(xr)),
                                          _mm256_maddubs_epi16(q[1], broadcast_4(xr + 4)));
      const __m256i sb = _mm256_add_epi16(_mm256_maddubs_epi16(q[2], broadcast_4(xr + 8)),
                                          _mm256_maddubs_epi16(q[3], broadcast_4(xr + 12)));
      const __m256i p =
          _mm256_add_epi32(_mm256_madd_epi16(sa, scale), _mm256_madd_epi16(sb, scale));
      isum[r] = first ? p : _mm256_add_epi32(isum[r], p);
      keep_in_register(isum[r]);
    }
  }
};

}  // namespace

MatmulKernel avx2_packed_kernel(tensor::GgmlType type) {
  switch (type) {
    case tensor::GgmlType::kQ4_0:
      return run_packed<PackedQ4_0>;
    case tensor::GgmlType::kQ8_0:
      return run_packed<PackedQ8_0>;
    case tensor::GgmlType::kQ2_K:
      return run_packed<PackedQ2_K<MaddubsDot>>;
    case tensor::GgmlType::kQ3_K:
      return run_packed<PackedQ3_K<MaddubsDot>>;
    case tensor::GgmlType::kQ4_K:
      return run_packed<PackedQ4_K<MaddubsDot>>;
    case tensor::GgmlType::kQ5_K:
      return run_packed<PackedQ5_K<MaddubsDot>>;
    case tensor::GgmlType::kQ6_K:
      return run_packed<PackedQ6_K<MaddubsDot>>;
    default:
      return nullptr;
  }
}

}  // namespace vesper::backend::cpu
