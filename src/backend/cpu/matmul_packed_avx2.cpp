// AVX2 kernels over 8-row packed q4_0 / q8_0 / q4_K / q6_K weights (backend/packed_weights.h): each
// 32-byte slice of a chunk holds 4 weights of each of 8 rows (one 32-bit lane per row), so a
// broadcast of 4 activation bytes and one maddubs serve 8 output features, and the lanes of the
// integer sums end up as the 8 rows' block sums without a horizontal reduction. The 8 rows' fp16
// scales convert as one vector and one FMA accumulates 8 outputs, in the block-sum / block-total
// order of matmul_kernel.h, so results equal the unpacked and portable kernels bit for bit. Tiling
// and cache blocking are the driver's (packed_gemm_avx2.h).
#include "backend/cpu/packed_gemm_avx2.h"

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

// q4_K: 256-element super-blocks of 8 sub-blocks of 32, each laid out as a q4_0 chunk over
// unsigned quants q (0..15), with per-row 6-bit sub-block scales and mins (packed_weights.h). Per
// row and sub-block the int16 pair sums stay below 8 * 2 * 15 * 128 = 30720, so a sub-block adds
// in int16 and one madd with the 8 rows' scales (as int16 pairs) widens and scales it; the
// super-block's integer total (< 2^31) then takes one FMA with d * dx and the min total one with
// dmin * dx: the block-total order of matmul_kernel.h.
struct PackedQ4_K {
  static constexpr int64_t kBlock = 256, kChunkBytes = 1024, kScaleCount = 80;
  template <int R>
  static void tile(const uint8_t* chunk, const uint16_t* meta, int64_t n_blocks, const int8_t* xq,
                   const float* xd, const int16_t* xs, float* y, int64_t y_stride);
};

// Outputs 8g .. 8g + 7 of the R rows of one activation tile for q4_K (as the driver's tile).
template <int R>
__attribute__((noinline)) void PackedQ4_K::tile(const uint8_t* chunk, const uint16_t* meta,
                                                int64_t n_blocks, const int8_t* xq, const float* xd,
                                                const int16_t* xs, float* y, int64_t y_stride) {
  __m256 acc[R], accm[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = accm[r] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const auto* sc = reinterpret_cast<const uint8_t*>(meta + 16);
    const uint8_t* mins = sc + 64;
    __m256i isum[R];
    for (int s = 0; s < 8; ++s) {
      if constexpr (R == 1) prefetch_ahead(chunk, 128);
      // Lane j: row j's scale of sub-block s in both int16 halves.
      __m256i scale = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
      scale = _mm256_or_si256(scale, _mm256_slli_epi32(scale, 16));
      __m256i s16[R];
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m256i v = load_256(chunk + 32 * k);
        const __m256i lo = _mm256_and_si256(v, low4);                        // 32s + 8k + t
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);  // 32s + 8k + 4 + t
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const int8_t* x = xq + 256 * r + 32 * s + 8 * k;
          const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast_4(x)),
                                             _mm256_maddubs_epi16(hi, broadcast_4(x + 4)));
          s16[r] = k == 0 ? p : _mm256_add_epi16(s16[r], p);
          keep_in_register(s16[r]);
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256i p = _mm256_madd_epi16(s16[r], scale);
        isum[r] = s == 0 ? p : _mm256_add_epi32(isum[r], p);
        keep_in_register(isum[r]);
      }
      chunk += 128;
      sc += 8;
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta)));
    const __m256 dmin =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta + 8)));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      // The activation sums of the 8 sub-blocks (int16), in both halves.
      const __m128i bs = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xs)),
                                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(xs + 8)));
      const __m256i bs2 = _mm256_broadcastsi128_si256(bs);
      // Lane j of pair p: m(j, 2p) * bs[2p] + m(j, 2p + 1) * bs[2p + 1].
      auto min_pair = [&](int p, __m256i bcast) {
        const __m256i m =
            _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mins + 16 * p)));
        return _mm256_madd_epi16(m, bcast);
      };
      const __m256i imin =
          _mm256_add_epi32(_mm256_add_epi32(min_pair(0, _mm256_shuffle_epi32(bs2, 0x00)),
                                            min_pair(1, _mm256_shuffle_epi32(bs2, 0x55))),
                           _mm256_add_epi32(min_pair(2, _mm256_shuffle_epi32(bs2, 0xAA)),
                                            min_pair(3, _mm256_shuffle_epi32(bs2, 0xFF))));
      const __m256 dx = _mm256_broadcast_ss(xd + r);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, dx), acc[r]);
      accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin, dx), accm[r]);
      xs += 16;
    }
    xs += 16 * (kTile - R);
    meta += PackedQ4_K::kScaleCount;
    xq += 256 * kTile;
    xd += kTile;
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * y_stride, _mm256_sub_ps(acc[r], accm[r]));
}

// q6_K: 256-element super-blocks in 8 groups of 32 (packed_weights.h): low nibbles laid out as a
// q4_0 chunk, high 2-bit pairs in 2 vectors per group, each completing one 16-element sub-block.
// The unsigned quants q (0..63) go to maddubs; two slices' int16 pair sums stay below
// 2 * 2 * 63 * 128 = 32256, so each is widened and scaled by one madd with the 8 rows' sub-block
// scales. The -32 offset is taken out once per block from the activation sums of 16 (which Q8_K
// keeps per sub-block): sum sc (q - 32) x = sum sc q x - 32 sum sc bsum, exact.
struct PackedQ6_K {
  static constexpr int64_t kBlock = 256, kChunkBytes = 1536, kScaleCount = 72;
  template <int R>
  static void tile(const uint8_t* chunk, const uint16_t* meta, int64_t n_blocks, const int8_t* xq,
                   const float* xd, const int16_t* xs, float* y, int64_t y_stride);
};

template <int R>
__attribute__((noinline)) void PackedQ6_K::tile(const uint8_t* chunk, const uint16_t* meta,
                                                int64_t n_blocks, const int8_t* xq, const float* xd,
                                                const int16_t* xs, float* y, int64_t y_stride) {
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i bits45 = _mm256_set1_epi8(0x30);
  // Sub-block 2p's scale in both int16 halves of each lane (even bytes), 2p + 1's (odd bytes).
  const __m128i pick_even = _mm_setr_epi8(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14);
  const __m128i pick_odd = _mm_setr_epi8(1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15);
  for (int64_t b = 0; b < n_blocks; ++b) {
    const auto* sc = reinterpret_cast<const uint8_t*>(meta + 8);
    __m256i isum[R];
    for (int g = 0; g < 8; ++g) {
      if constexpr (R == 1) prefetch_ahead(chunk, 192);
      const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16 * g));
#pragma GCC unroll 2
      for (int m = 0; m < 2; ++m) {
        const __m256i scale =
            _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, m == 0 ? pick_even : pick_odd));
        const __m256i v0 = load_256(chunk + 64 * m);
        const __m256i v1 = load_256(chunk + 64 * m + 32);
        const __m256i h = load_256(chunk + 128 + 32 * m);
        // 16-bit shifts move bits across bytes; the masks keep only each byte's own bits.
        const __m256i qa = _mm256_or_si256(_mm256_and_si256(v0, low4),
                                           _mm256_and_si256(_mm256_slli_epi16(h, 4), bits45));
        const __m256i qb = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), low4),
                                           _mm256_and_si256(_mm256_slli_epi16(h, 2), bits45));
        const __m256i qc = _mm256_or_si256(_mm256_and_si256(v1, low4), _mm256_and_si256(h, bits45));
        const __m256i qd = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), low4),
                                           _mm256_and_si256(_mm256_srli_epi16(h, 2), bits45));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const int8_t* x = xq + 256 * r + 32 * g + 16 * m;
          const __m256i sa = _mm256_add_epi16(_mm256_maddubs_epi16(qa, broadcast_4(x)),
                                              _mm256_maddubs_epi16(qb, broadcast_4(x + 4)));
          const __m256i sb = _mm256_add_epi16(_mm256_maddubs_epi16(qc, broadcast_4(x + 8)),
                                              _mm256_maddubs_epi16(qd, broadcast_4(x + 12)));
          const __m256i p =
              _mm256_add_epi32(_mm256_madd_epi16(sa, scale), _mm256_madd_epi16(sb, scale));
          isum[r] = g == 0 && m == 0 ? p : _mm256_add_epi32(isum[r], p);
          keep_in_register(isum[r]);
        }
      }
      chunk += 192;
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta)));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      // Lane j: sum over sub-blocks u of sc(j, u) * bsums[u], pairs of sub-blocks at a time.
      __m256i corr = _mm256_setzero_si256();
      for (int p = 0; p < 8; ++p) {
        const __m256i sc16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16 * p)));
        int32_t pair;
        std::memcpy(&pair, xs + 2 * p, 4);
        corr = _mm256_add_epi32(corr, _mm256_madd_epi16(sc16, _mm256_set1_epi32(pair)));
      }
      const __m256i total = _mm256_sub_epi32(isum[r], _mm256_slli_epi32(corr, 5));
      const __m256 dx = _mm256_broadcast_ss(xd + r);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, dx), acc[r]);
      xs += 16;
    }
    xs += 16 * (kTile - R);
    meta += PackedQ6_K::kScaleCount;
    xq += 256 * kTile;
    xd += kTile;
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * y_stride, acc[r]);
}

}  // namespace

MatmulKernel avx2_packed_kernel(tensor::GgmlType type) {
  switch (type) {
    case tensor::GgmlType::kQ4_0:
      return run_packed<PackedQ4_0>;
    case tensor::GgmlType::kQ8_0:
      return run_packed<PackedQ8_0>;
    case tensor::GgmlType::kQ4_K:
      return run_packed<PackedQ4_K>;
    case tensor::GgmlType::kQ6_K:
      return run_packed<PackedQ6_K>;
    default:
      return nullptr;
  }
}

}  // namespace vesper::backend::cpu
