// Register tiles of the packed k-quant matmul kernels (backend/packed_weights.h),
// shared by the AVX2 and AVX-512 VNNI kernel files: the unpacking of a chunk's quants, the
// per-block corrections (the mins, the offsets of q3_K and q6_K) and the block-total
// accumulation of matmul_kernel.h. What differs between instruction sets is only how one
// sub-block's quants meet the activation bytes and are scaled: the integer-dot policy `Dot`, which
// must give the same exact int32 totals (so every policy's results are the same bits):
//
//   // q4_K sub-block: the 4 slices of 32 bytes at `chunk` (lane j: 4 bytes of row j; low nibbles
//   // elements 8k + t, high nibbles 8k + 4 + t of slice k), tile row r's 32 activations at
//   // x + 256 r, row j's 6-bit scale at sc[j]. Adds, per lane, scale x (quant . activation) to
//   // isum[r] (or sets it, when `first`).
//   template <int R> static void q4_k(const uint8_t* chunk, const int8_t* x, const uint8_t* sc,
//                                     bool first, __m256i (&isum)[R]);
//   // q5_K sub-block: as q4_k, with the vector of fifth bits after the 4 slices (q5_slice()
//   // gives a slice's quants).
//   template <int R> static void q5_k(const uint8_t* chunk, const int8_t* x, const uint8_t* sc,
//                                     bool first, __m256i (&isum)[R]);
//   // A sub-block of 16 (q2_K, q3_K, q6_K): unsigned quants q[0..3] (< 64; slice i: elements
//   // 4i + t), tile row r's 16 activations at x + 256 r; row j's int8 scale is byte 2j + m of
//   // scales16. Adds as above.
//   template <int R> static void sub16(const __m256i (&q)[4], const int8_t* x, __m128i scales16,
//                                      int m, bool first, __m256i (&isum)[R]);
//
// Include after packed_gemm_avx2.h, from files compiled with at least -mavx2 -mfma -mf16c.
#pragma once

#include "backend/cpu/packed_gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

// The byte operations of the k-quant unpackers (q5_slice, the groups' F::unpack) on one group's
// bytes at p, 256 bits at a time. packed_vnni_wide.h has the 512-bit twin, two groups side by side;
// every operation is lane-local (16-bit shifts whose carries the masks drop), so each half of it
// equals this.
struct Bytes256 {
  using V = __m256i;
  const uint8_t* p;
  V load(int64_t offset) const { return load_256(p + offset); }
  static V bytes(char c) { return _mm256_set1_epi8(c); }
  static V and_(V a, V b) { return _mm256_and_si256(a, b); }
  static V or_(V a, V b) { return _mm256_or_si256(a, b); }
  template <int kBits>
  static V shl16(V a) {
    return _mm256_slli_epi16(a, kBits);
  }
  template <int kBits>
  static V shr16(V a) {
    return _mm256_srli_epi16(a, kBits);
  }
};

// Moves bit `from` of every byte of x to bit 4 (other bits: garbage, masked by the caller). The
// 16-bit shifts move bits across bytes, but by at most 4 places, which cannot carry another byte's
// bit onto bit 4.
template <int from, class B = Bytes256>
inline typename B::V bit_to_4(typename B::V x) {
  if constexpr (from < 4) {
    return B::template shl16<4 - from>(x);
  } else if constexpr (from == 4) {
    return x;
  } else {
    return B::template shr16<from - 4>(x);
  }
}

// The unsigned quants (0..31) of slice k of a packed q5_K sub-block, from the slice's nibbles `v`
// and the sub-block's fifth-bit vector `h` (bits 2k and 2k + 1 of each byte, packed_weights.h):
// `lo` gets elements 8k + t, `hi` elements 8k + 4 + t.
template <int k, class B = Bytes256>
inline void q5_slice(typename B::V v, typename B::V h, typename B::V& lo, typename B::V& hi) {
  const auto low4 = B::bytes(0x0F);
  const auto bit4 = B::bytes(0x10);
  lo = B::or_(B::and_(v, low4), B::and_(bit_to_4<2 * k, B>(h), bit4));
  hi = B::or_(B::and_(B::template shr16<4>(v), low4), B::and_(bit_to_4<2 * k + 1, B>(h), bit4));
}

// q4_K / q5_K: a super-block's min total per row (lane j: sum over its 8 sub-blocks g of
// m(j, g) * bsum(g)) from the block's mins (packed_weights.h: 16 bytes per pair of sub-blocks, row
// j's two mins side by side) and one activation row's 16 sums of 16 quants.
inline __m256i scale_min_total(const uint8_t* mins, const int16_t* xs) {
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
  return _mm256_add_epi32(_mm256_add_epi32(min_pair(0, _mm256_shuffle_epi32(bs2, 0x00)),
                                           min_pair(1, _mm256_shuffle_epi32(bs2, 0x55))),
                          _mm256_add_epi32(min_pair(2, _mm256_shuffle_epi32(bs2, 0xAA)),
                                           min_pair(3, _mm256_shuffle_epi32(bs2, 0xFF))));
}

// q4_K and q5_K: 256-element super-blocks of 8 sub-blocks of 32, each laid out as a q4_0 chunk
// over unsigned quants q (0..15; q5_K's fifth bits follow in one vector per sub-block), with
// per-row 6-bit sub-block scales and mins (packed_weights.h). The super-block's integer total
// (< 2^31) takes one FMA with d * dx and the min total one with dmin * dx: the block-total order of
// matmul_kernel.h.
template <class Dot, bool kFifthBit>
struct PackedScaleMinK {
  static constexpr int64_t kSubBlockBytes = kFifthBit ? 160 : 128;
  static constexpr int64_t kBlock = 256, kChunkBytes = 8 * kSubBlockBytes, kScaleCount = 80;

  // Outputs 8g .. 8g + 7 of the R rows of one activation tile (as the driver's tile).
  template <int R>
  __attribute__((noinline)) static void tile(const uint8_t* chunk, const uint16_t* meta,
                                             int64_t n_blocks, const int8_t* xq, const float* xd,
                                             const int16_t* xs, float* y, int64_t y_stride,
                                             int64_t ahead) {
    __m256 acc[R], accm[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = accm[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      const auto* sc = reinterpret_cast<const uint8_t*>(meta + 16);
      const uint8_t* mins = sc + 64;
      __m256i isum[R];
      for (int s = 0; s < 8; ++s) {
        if (ahead != 0) prefetch_ahead(chunk, kSubBlockBytes, ahead);
        if constexpr (kFifthBit) {
          Dot::template q5_k<R>(chunk, xq + 32 * s, sc, s == 0, isum);
        } else {
          Dot::template q4_k<R>(chunk, xq + 32 * s, sc, s == 0, isum);
        }
        chunk += kSubBlockBytes;
        sc += 8;
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta)));
      const __m256 dmin =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta + 8)));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256i imin = scale_min_total(mins, xs);
        const __m256 dx = _mm256_broadcast_ss(xd + r);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(d, dx), acc[r]);
        accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin, dx), accm[r]);
        xs += 16;
      }
      xs += 16 * (kTile - R);
      meta += kScaleCount;
      xq += 256 * kTile;
      xd += kTile;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * y_stride, _mm256_sub_ps(acc[r], accm[r]));
  }
};

template <class Dot>
using PackedQ4_K = PackedScaleMinK<Dot, false>;
template <class Dot>
using PackedQ5_K = PackedScaleMinK<Dot, true>;

// The k-quants with 16-element sub-blocks (q2_K, q3_K, q6_K): 256-element super-blocks in 8
// groups of 32 (packed_weights.h), each group's quants unpacked by the format F into unsigned
// quants q (< 64) for the Dot policy, per sub-block of 16. An offset (q6_K's 32, q3_K's 4: the
// weight is sc * (q - offset)) is taken out once per block from the activation sums of 16 (which
// Q8_K keeps per sub-block): sum sc (q - o) x = sum sc q x - o sum sc bsum, exact. q2_K's mins
// take a second accumulator, as q4_K's.
//
// F supplies:
//   static constexpr int64_t kGroupBytes;  // bytes of one group's quants (8 rows x 32)
//   static constexpr int64_t kScaleCount;  // uint16 entries of a chunk's meta
//   static constexpr int kOffsetShift;     // log2 of the offset; -1 for none
//   static constexpr bool kHasMin;         // meta: d[8], dmin[8], scales[128], mins[128]; else
//                                          // d[8], scales[128]
//   static constexpr bool kKeepPanel;      // whether the 512-bit tile keeps the unpacked vectors
//                                          // for a panel's other row tiles (packed_vnni_wide.h)
//   template <class B>  // sub-block m (0, 1) of the group(s) B reads (Bytes256 here)
//   static void unpack(const B& group, int m, typename B::V (&q)[4]);

template <class Dot, class F>
struct PackedSub16K {
  static constexpr int64_t kBlock = 256, kChunkBytes = 8 * F::kGroupBytes;
  static constexpr int64_t kScaleCount = F::kScaleCount;

  // Lane j: sum over the block's 16 sub-blocks u of v(j, u) * bsums[u], for the 128 bytes v at
  // `bytes` (byte 16p + 2j + h: row j's sub-block 2p + h; signed or unsigned), pairs of
  // sub-blocks at a time.
  template <bool kSigned>
  static inline __m256i sub_block_sums(const uint8_t* bytes, const int16_t* xs) {
    __m256i sum = _mm256_setzero_si256();
    for (int p = 0; p < 8; ++p) {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes + 16 * p));
      const __m256i v16 = kSigned ? _mm256_cvtepi8_epi16(raw) : _mm256_cvtepu8_epi16(raw);
      int32_t pair;
      std::memcpy(&pair, xs + 2 * p, 4);
      sum = _mm256_add_epi32(sum, _mm256_madd_epi16(v16, _mm256_set1_epi32(pair)));
    }
    return sum;
  }

  template <int R>
  __attribute__((noinline)) static void tile(const uint8_t* chunk, const uint16_t* meta,
                                             int64_t n_blocks, const int8_t* xq, const float* xd,
                                             const int16_t* xs, float* y, int64_t y_stride,
                                             int64_t ahead) {
    constexpr int kScalesAt = F::kHasMin ? 16 : 8;  // uint16 entries before the scale bytes
    __m256 acc[R], accm[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = accm[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      const auto* sc = reinterpret_cast<const uint8_t*>(meta + kScalesAt);
      __m256i isum[R];
      for (int g = 0; g < 8; ++g) {
        if (ahead != 0) prefetch_ahead(chunk, F::kGroupBytes, ahead);
        const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16 * g));
#pragma GCC unroll 2
        for (int m = 0; m < 2; ++m) {
          __m256i q[4];
          F::unpack(Bytes256{chunk}, m, q);
          Dot::template sub16<R>(q, xq + 32 * g + 16 * m, sc8, m, g == 0 && m == 0, isum);
        }
        chunk += F::kGroupBytes;
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta)));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        __m256i total = isum[r];
        if constexpr (F::kOffsetShift >= 0) {
          // Signed scales (q3_K, q6_K).
          const __m256i corr = sub_block_sums<true>(sc, xs);
          total = _mm256_sub_epi32(total, _mm256_slli_epi32(corr, F::kOffsetShift));
        }
        const __m256 dx = _mm256_broadcast_ss(xd + r);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(d, dx), acc[r]);
        if constexpr (F::kHasMin) {
          const __m256 dmin =
              _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(meta + 8)));
          const __m256i imin = sub_block_sums<false>(sc + 128, xs);
          accm[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(dmin, dx), accm[r]);
        }
        xs += 16;
      }
      xs += 16 * (kTile - R);
      meta += kScaleCount;
      xq += 256 * kTile;
      xd += kTile;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(y + r * y_stride, F::kHasMin ? _mm256_sub_ps(acc[r], accm[r]) : acc[r]);
    }
  }
};

// q6_K groups: the low 4 bits of the quants laid out as a q4_0 chunk, then 2 vectors of their high
// 2 bits, each completing one 16-element sub-block.
struct Q6Groups {
  static constexpr int64_t kGroupBytes = 192, kScaleCount = 72;
  static constexpr int kOffsetShift = 5;  // q - 32
  static constexpr bool kHasMin = false;
  static constexpr bool kKeepPanel = true;  // packed_vnni_wide.h's Panel
  template <class B>
  static inline void unpack(const B& group, int m, typename B::V (&q)[4]) {
    const auto low4 = B::bytes(0x0F);
    const auto bits45 = B::bytes(0x30);
    const auto v0 = group.load(64 * m);
    const auto v1 = group.load(64 * m + 32);
    const auto h = group.load(128 + 32 * m);
    // 16-bit shifts move bits across bytes; the masks keep only each byte's own bits.
    q[0] = B::or_(B::and_(v0, low4), B::and_(B::template shl16<4>(h), bits45));
    q[1] =
        B::or_(B::and_(B::template shr16<4>(v0), low4), B::and_(B::template shl16<2>(h), bits45));
    q[2] = B::or_(B::and_(v1, low4), B::and_(h, bits45));
    q[3] =
        B::or_(B::and_(B::template shr16<4>(v1), low4), B::and_(B::template shr16<2>(h), bits45));
  }
};

// q3_K groups: 2 vectors of the quants' low 2 bits (one per sub-block, laid out as q6_K's high
// bits), then one vector of their third bits (bit 4m + i of byte 4j + t: row j's element
// 16m + 4i + t). The unsigned quant is low + 4 * third bit (0..7); the weight is sc * (q - 4).
struct Q3Groups {
  static constexpr int64_t kGroupBytes = 96, kScaleCount = 72;
  static constexpr int kOffsetShift = 2;  // q - 4
  static constexpr bool kHasMin = false;
  static constexpr bool kKeepPanel = true;  // packed_vnni_wide.h's Panel
  template <class B>
  static inline void unpack(const B& group, int m, typename B::V (&q)[4]) {
    const auto three = B::bytes(3);
    const auto bit2 = B::bytes(4);
    const auto low = group.load(32 * m);
    const auto high = group.load(64);
    // Third bit 4m + i moved to bit 2. 16-bit shifts of at most 5 places cannot carry another
    // byte's bit onto bit 0-1 or bit 2, which the masks keep.
    const auto h = m == 0 ? B::template shl16<2>(high) : B::template shr16<2>(high);
    q[0] = B::or_(B::and_(low, three), B::and_(h, bit2));
    q[1] =
        B::or_(B::and_(B::template shr16<2>(low), three), B::and_(B::template shr16<1>(h), bit2));
    q[2] =
        B::or_(B::and_(B::template shr16<4>(low), three), B::and_(B::template shr16<2>(h), bit2));
    q[3] =
        B::or_(B::and_(B::template shr16<6>(low), three), B::and_(B::template shr16<3>(h), bit2));
  }
};

// q2_K groups: 2 vectors of 2-bit quants (0..3), one per sub-block, laid out as q6_K's high bits;
// 4-bit sub-block scales and mins.
struct Q2Groups {
  static constexpr int64_t kGroupBytes = 64, kScaleCount = 144;
  static constexpr int kOffsetShift = -1;
  static constexpr bool kHasMin = true;
  static constexpr bool kKeepPanel = false;  // packed_vnni_wide.h's Panel
  template <class B>
  static inline void unpack(const B& group, int m, typename B::V (&q)[4]) {
    const auto three = B::bytes(3);
    const auto v = group.load(32 * m);
    q[0] = B::and_(v, three);
    q[1] = B::and_(B::template shr16<2>(v), three);
    q[2] = B::and_(B::template shr16<4>(v), three);
    q[3] = B::and_(B::template shr16<6>(v), three);
  }
};

template <class Dot>
using PackedQ2_K = PackedSub16K<Dot, Q2Groups>;
template <class Dot>
using PackedQ3_K = PackedSub16K<Dot, Q3Groups>;
template <class Dot>
using PackedQ6_K = PackedSub16K<Dot, Q6Groups>;

}  // namespace
}  // namespace vesper::backend::cpu
