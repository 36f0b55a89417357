// Packed kernels on 512-bit vectors (q4_0, q8_0 and the k-quants q2_K ... q6_K): two neighbouring
// groups of 8 outputs side by side in one zmm register (group g in lanes 0-7, group g + 1 in lanes
// 8-15).
//
// Why: packed_vnni_kernels.h runs vpdpbusd on 256-bit vectors, and a core that executes 512-bit
// vpdpbusd at full width (AMD Zen 5; Intel's server cores with two 512-bit ports) does twice the
// multiply-adds per instruction on zmm. The two groups' weights are separate streams of the packed
// layout (packed_weights.h), so nothing about the packing changes: a slice is the two groups'
// 32-byte slices joined, and each activation broadcast serves 16 outputs instead of 8.
//
// Bits: every lane does exactly what the 256-bit tile does for its output (the same exact integer
// block dot, the same d[b] * dx[b] product, the same FMA into its accumulator, blocks in order), so
// the results equal the other kernels' bit for bit (matmul_kernel.h's block-sum and block-total
// contracts).
//
// The includer defines, before including this header and after packed_vnni_kernels.h, inside
// vesper::backend::cpu's anonymous namespace:
//   // _mm512_dpbusd_epi32 against the 4 bytes at s8 in every lane: vpdpbusd's embedded
//   // broadcast (one instruction where a broadcast and a vpdpbusd took two)
//   __m512i dpbusd_bcast_512(__m512i acc, __m512i u8, const int8_t* s8);
//   // _mm512_dpwssd_epi32 against the int16 pair at b in every lane (vpdpwssd's embedded
//   // broadcast)
//   __m512i dpwssd_bcast_512(__m512i acc, __m512i a, const int16_t* b);
//   __m512 cvtepi32_ps_512(__m512i v);                          // _mm512_cvtepi32_ps
//   __m512 cvtph_ps_512(__m256i halves);                        // _mm512_cvtph_ps
//   void keep_in_register_512(__m512i& v);  // an optimization barrier, or nothing
// matmul_packed_avx512_vnni.cpp binds them to the instruction; a test builds this header on
// SIMDe's AVX-512 (its native aliases), so the logic is tested on machines without AVX-512.
#pragma once

#include <vector>

#include "backend/cpu/packed_gemm_avx2.h"
#include "backend/cpu/packed_kquant_tiles.h"

namespace vesper::backend::cpu {
namespace {

// 256-bit vectors a (group g) and b (group g + 1) as one zmm.
inline __m512i join(__m256i a, __m256i b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

// Group g's 32 bytes at a in the low half, group g + 1's at b in the high half.
inline __m512i load_pair(const uint8_t* a, const uint8_t* b) {
  return join(load_256(a), load_256(b));
}

// Group g's 8 fp16 values at a in the low half, group g + 1's at b in the high half.
inline __m256i load_half_pair(const uint16_t* a, const uint16_t* b) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
}

// Bytes256 (packed_kquant_tiles.h) on groups g (bytes at p0, low half) and g + 1 (p1, high half):
// the k-quant groups' unpackers run on both at once, each half exactly as on its own group.
struct Bytes512 {
  using V = __m512i;
  const uint8_t* p0;
  const uint8_t* p1;
  V load(int64_t offset) const { return load_pair(p0 + offset, p1 + offset); }
  static V bytes(char c) { return _mm512_set1_epi8(c); }
  static V and_(V a, V b) { return _mm512_and_si512(a, b); }
  static V or_(V a, V b) { return _mm512_or_si512(a, b); }
  template <int kBits>
  static V shl16(V a) {
    return _mm512_slli_epi16(a, kBits);
  }
  template <int kBits>
  static V shr16(V a) {
    return _mm512_srli_epi16(a, kBits);
  }
};

// acc + float(total) * (d * dx): a block's exact integer total into a row's float accumulator, in
// matmul_kernel.h's block-total order (d: the two groups' block scales, dx: the row's).
inline __m512 add_block_total(__m512 acc, __m512i total, __m512 d, float dx) {
  return _mm512_fmadd_ps(cvtepi32_ps_512(total), _mm512_mul_ps(d, _mm512_set1_ps(dx)), acc);
}

// vpdpbusd's latency is several cycles and a core may start two a cycle: a tile of 4 rows with one
// running sum per row would wait on its own results. Each row keeps two chains (integer sums, so
// the split changes no bit) and they are added once per block.

// The 4 slices of 32 bytes of nibbles of a q4_0 chunk or q4_K sub-block in each group (slice k:
// low nibbles elements 8k + t, high nibbles 8k + 4 + t) against each row's 32 activations at
// x + row_stride * r: adds the low nibbles' dots to low[r] and the high ones' to high[r], two
// chains per row.
template <int R>
inline void nibble_dots(const uint8_t* c0, const uint8_t* c1, const int8_t* x, int64_t row_stride,
                        __m512i (&low)[R], __m512i (&high)[R]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m512i v = load_pair(c0 + 32 * k, c1 + 32 * k);
    const __m512i lo = _mm512_and_si512(v, low4);
    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const int8_t* xr = x + row_stride * r + 8 * k;
      low[r] = dpbusd_bcast_512(low[r], lo, xr);
      high[r] = dpbusd_bcast_512(high[r], hi, xr + 4);
      keep_in_register_512(low[r]);
      keep_in_register_512(high[r]);
    }
  }
}

// A wide tile's activation terms (activation_terms below) where they are kFactor times each
// row's block sum: the offset of q4_0's nibbles (-8) or of q8_0's biased bytes (-128), with which
// a block's integer sum starts.
template <int32_t kFactor>
struct SumCorrection {
  static constexpr int64_t kTermsPerBlock = 1;
  static void make_terms(const int16_t* block_sums, int32_t* terms) {
    terms[0] = kFactor * int32_t{block_sums[0]};
  }
};

// VnniQ4_0::dot on two groups; xt: each row's -8 * sum of the block's activations (its activation
// terms).
struct WideQ4_0 : SumCorrection<-8> {
  using Narrow = VnniQ4_0;
  template <int R>
  static inline void dot(const uint8_t* c0, const uint8_t* c1, const int8_t* xq, const int32_t* xt,
                         __m512i (&isum)[R]) {
    __m512i high[R];  // the high nibbles' sums: a second chain per row
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      isum[r] = _mm512_set1_epi32(xt[r]);
      high[r] = _mm512_setzero_si512();
    }
    nibble_dots<R>(c0, c1, xq, 32, isum, high);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) isum[r] = _mm512_add_epi32(isum[r], high[r]);
  }
};

// VnniQ8_0::dot on two groups; xt: each row's -128 * sum of the block's activations (its
// activation terms).
struct WideQ8_0 : SumCorrection<-128> {
  using Narrow = VnniQ8_0;
  template <int R>
  static inline void dot(const uint8_t* c0, const uint8_t* c1, const int8_t* xq, const int32_t* xt,
                         __m512i (&isum)[R]) {
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i odd[R];  // the odd slices' sums: a second chain per row
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      isum[r] = _mm512_set1_epi32(xt[r]);
      odd[r] = _mm512_setzero_si512();
    }
#pragma GCC unroll 4
    for (int k = 0; k < 8; k += 2) {
      const __m512i w0 = _mm512_xor_si512(load_pair(c0 + 32 * k, c1 + 32 * k), bias);
      const __m512i w1 = _mm512_xor_si512(load_pair(c0 + 32 * k + 32, c1 + 32 * k + 32), bias);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        isum[r] = dpbusd_bcast_512(isum[r], w0, xq + 32 * r + 4 * k);
        odd[r] = dpbusd_bcast_512(odd[r], w1, xq + 32 * r + 4 * k + 4);
        keep_in_register_512(isum[r]);
        keep_in_register_512(odd[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) isum[r] = _mm512_add_epi32(isum[r], odd[r]);
  }
};

// tile<K::Narrow, R> of packed_gemm_avx2.h on outputs 8g .. 8g + 15: groups g and g + 1, whose
// chunks and scales start at c0 / s0 and c1 / s1. With 32 vector registers a tile of 4 rows keeps
// its 4 integer and 4 float accumulators, the two unpacked slices and the broadcasts in registers.
//
// What bounds it: on AMD Zen 5, vpdpbusd, vfmadd and vmulps issue to the same pipes (8 vpdpbusd
// with 4 FMAs or 4 multiplies beside them ran at 2/3 of the rate of 8 alone; ands, shifts, adds,
// inserts and int-to-float conversions beside them cost nothing). A block's 8 vpdpbusd a row come
// with the scale product and the FMA of the block-total order, so no tile of 32-element blocks
// gets past 8 / 10 of the vpdpbusd peak; this one runs at about 70%. A tile of 8 rows with one
// chain each (half the unpacking and adds per row) measured the same, as that predicts.
template <class K, int R>
__attribute__((noinline)) void wide_tile(const uint8_t* c0, const uint8_t* c1, const uint16_t* s0,
                                         const uint16_t* s1, int64_t n_blocks, const int8_t* xq,
                                         const float* xd, const int32_t* xt, float* y,
                                         int64_t y_stride, int64_t ahead) {
  constexpr int64_t kChunk = K::Narrow::kChunkBytes;
  __m512 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    __m512i isum[R];
    if (ahead != 0) {
      prefetch_ahead(c0, kChunk, ahead);
      prefetch_ahead(c1, kChunk, ahead);
    }
    K::template dot<R>(c0, c1, xq, xt, isum);
    const __m512 d = cvtph_ps_512(load_half_pair(s0, s1));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = add_block_total(acc[r], isum[r], d, xd[r]);
    c0 += kChunk;
    c1 += kChunk;
    s0 += 8;
    s1 += 8;
    xq += 32 * kTile;
    xd += kTile;
    xt += K::kTermsPerBlock * kTile;
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * y_stride, acc[r]);
}

// Slice k of a q5_K sub-block in each group (q5_slice: nibbles and fifth bits, both groups'
// unpacked at once, h their fifth-bit vectors side by side) against each row's activations at
// x + row_stride * r, as nibble_dots.
template <int R, int k>
inline void q5_slice_dots(const uint8_t* c0, const uint8_t* c1, __m512i h, const int8_t* x,
                          int64_t row_stride, __m512i (&low)[R], __m512i (&high)[R]) {
  __m512i lo, hi;
  q5_slice<k, Bytes512>(load_pair(c0 + 32 * k, c1 + 32 * k), h, lo, hi);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const int8_t* xr = x + row_stride * r + 8 * k;
    low[r] = dpbusd_bcast_512(low[r], lo, xr);
    high[r] = dpbusd_bcast_512(high[r], hi, xr + 4);
    keep_in_register_512(low[r]);
    keep_in_register_512(high[r]);
  }
}

// PackedScaleMinK's tile (q4_K, q5_K; packed_kquant_tiles.h) on two groups: per sub-block, the
// exact dot of each lane's row (two chains, as WideQ4_0) times its 6-bit scale; per super-block the
// min totals (scale_min_total's integers) of both groups by vpdpwssd on the mins as int16 pairs;
// the same block-total order lane by lane.
template <bool kFifthBit>
struct WideScaleMinK {
  using Narrow = PackedScaleMinK<VnniDot, kFifthBit>;
  static constexpr int64_t kSubBlockBytes = Narrow::kSubBlockBytes;

  // Activation terms: a row's 8 sub-block sums (its 16 sums of 16 added in pairs) as 4 int16
  // pairs, which the tile's vpdpwssd broadcast from memory. Made in the tile, each row and
  // super-block took an add of pairs, three shuffles and four register broadcasts, about as many
  // vector instructions as the min totals' vpdpwssd they fed. Median of 5 on one thread, AMD Zen
  // 5, 2048 x 2048, three alternations: q4_K 3-4% faster at 32 rows, 5-8% at 512; q5_K 2-5%.
  static constexpr int64_t kTermsPerBlock = 4;
  static void make_terms(const int16_t* block_sums, int32_t* terms) {
    for (int p = 0; p < 4; ++p) {
      // A sum of 32 int8 fits int16.
      const auto low = static_cast<uint16_t>(block_sums[4 * p] + block_sums[4 * p + 1]);
      const auto high = static_cast<uint16_t>(block_sums[4 * p + 2] + block_sums[4 * p + 3]);
      terms[p] = static_cast<int32_t>(uint32_t{low} | (uint32_t{high} << 16));
    }
  }

  template <int R>
  __attribute__((noinline)) static void tile(const uint8_t* c0, const uint8_t* c1,
                                             const uint16_t* m0, const uint16_t* m1,
                                             int64_t n_blocks, const int8_t* xq, const float* xd,
                                             const int32_t* xt, float* y, int64_t y_stride,
                                             int64_t ahead) {
    __m512 acc[R], accm[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = accm[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      const auto* sc0 = reinterpret_cast<const uint8_t*>(m0 + 16);
      const auto* sc1 = reinterpret_cast<const uint8_t*>(m1 + 16);
      __m512i isum[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
      for (int s = 0; s < 8; ++s) {
        if (ahead != 0) {
          prefetch_ahead(c0, kSubBlockBytes, ahead);
          prefetch_ahead(c1, kSubBlockBytes, ahead);
        }
        const __m512i scale = join(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc0 + 8 * s))),
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc1 + 8 * s))));
        __m512i low[R], high[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) low[r] = high[r] = _mm512_setzero_si512();
        const int8_t* x = xq + 32 * s;
        if constexpr (kFifthBit) {
          const __m512i h = load_pair(c0 + 128, c1 + 128);
          q5_slice_dots<R, 0>(c0, c1, h, x, 256, low, high);
          q5_slice_dots<R, 1>(c0, c1, h, x, 256, low, high);
          q5_slice_dots<R, 2>(c0, c1, h, x, 256, low, high);
          q5_slice_dots<R, 3>(c0, c1, h, x, 256, low, high);
        } else {
          nibble_dots<R>(c0, c1, x, 256, low, high);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m512i p = _mm512_mullo_epi32(_mm512_add_epi32(low[r], high[r]), scale);
          isum[r] = _mm512_add_epi32(isum[r], p);
          keep_in_register_512(isum[r]);
        }
        c0 += kSubBlockBytes;
        c1 += kSubBlockBytes;
      }
      const __m512 d = cvtph_ps_512(load_half_pair(m0, m1));
      const __m512 dmin = cvtph_ps_512(load_half_pair(m0 + 8, m1 + 8));
      // scale_min_total on both groups at once: pair p's mins of each output (16 bytes a group,
      // an output's two side by side) as int16 pairs, shared by the rows; each row's 8 sub-block
      // sums (its activation terms xt) times them by one vpdpwssd a pair. The same exact integer
      // total.
      __m512i mins[4];
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p)
        mins[p] = join(_mm256_cvtepu8_epi16(
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc0 + 64 + 16 * p))),
                       _mm256_cvtepu8_epi16(
                           _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc1 + 64 + 16 * p))));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const auto* pairs = reinterpret_cast<const int16_t*>(xt + kTermsPerBlock * r);
        __m512i imin = dpwssd_bcast_512(_mm512_setzero_si512(), mins[0], pairs);
        imin = dpwssd_bcast_512(imin, mins[1], pairs + 2);
        imin = dpwssd_bcast_512(imin, mins[2], pairs + 4);
        imin = dpwssd_bcast_512(imin, mins[3], pairs + 6);
        acc[r] = add_block_total(acc[r], isum[r], d, xd[r]);
        accm[r] = add_block_total(accm[r], imin, dmin, xd[r]);
      }
      xt += kTermsPerBlock * kTile;
      m0 += Narrow::kScaleCount;
      m1 += Narrow::kScaleCount;
      xq += 256 * kTile;
      xd += kTile;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * y_stride, _mm512_sub_ps(acc[r], accm[r]));
  }
};

// Where a WideSub16K row tile's weight vectors (each group's unpacked quants, sub-block scales and
// offset or min factors, as the tile uses them) come from. A panel's row tiles all read the same
// weights (run_packed_wide), and unpacking q6_K's took about 55 vector instructions a group of 32
// against 32 vpdpbusd at 4 rows, on the ports vpdpbusd needs. So in a panel of 3 row tiles or
// more, the first unpacks them and keeps every vector, in the order it makes them, in a per-thread
// buffer (kUnpackAndKeep), and the others load them back in the same order (kReuse): one
// unpacking per panel instead of one per row tile, the same integers. Other tiles unpack in place
// (kUnpack). Best of 7 on one thread, AMD Zen 5, 2048 x 2048: q6_K and q3_K 10-14% faster at 32,
// 64 and 512 rows. q2_K unpacks in few enough instructions that keeping its vectors was 10% slower
// (F::kKeepPanel), and q4_0 and q4_K (16 a slice of 32 vpdpbusd), tried the same way, gained
// nothing measurable.
enum class Panel { kUnpack, kUnpackAndKeep, kReuse };

// A row tile's walk through the panel buffer: each vector it makes is kept (kUnpackAndKeep) or
// read back (kReuse) in turn; with kUnpack the buffer is not touched.
template <Panel M>
struct PanelCursor {
  __m512i* at;
  // v: made by the caller unless M is kReuse, then read from the buffer.
  void pass(__m512i& v) {
    if constexpr (M == Panel::kReuse) v = _mm512_load_si512(at);
    if constexpr (M == Panel::kUnpackAndKeep) _mm512_store_si512(at, v);
    if constexpr (M != Panel::kUnpack) ++at;
  }
  static constexpr bool kMakes = M != Panel::kReuse;  // whether the caller makes the vectors
};

// PackedSub16K's tile (q2_K, q3_K, q6_K; packed_kquant_tiles.h) on two groups: both groups'
// quants unpacked by F at once on zmm (Bytes512), the sub-block dots on zmm (one per row and
// sub-block of 16, times the rows' int8 scales), and both groups' corrections (the offsets of
// q3_K and q6_K, into the same integer sums; the mins of q2_K) by vpdpwssd per pair of sub-blocks,
// the scale or min bytes as int16 pairs against each row's activation sums; the same exact integer
// totals and block-total order lane by lane. The unpacked vectors come from the weights or the
// panel buffer as M says (Panel).
template <class F>
struct WideSub16K {
  using Narrow = PackedSub16K<VnniDot, F>;
  // Panel vectors a super-block, where F::kKeepPanel (Panel says why): per group, the min or
  // offset factors and two sub-blocks' 4 quant vectors and scales.
  static constexpr int64_t kPanelVectors =
      F::kKeepPanel ? 8 * ((F::kHasMin ? 1 : 0) + (F::kOffsetShift >= 0 ? 1 : 0) + 2 * 5) : 0;

  template <Panel M, int R>
  __attribute__((noinline)) static void tile(const uint8_t* c0, const uint8_t* c1,
                                             const uint16_t* m0, const uint16_t* m1,
                                             int64_t n_blocks, const int8_t* xq, const float* xd,
                                             const int16_t* xs, float* y, int64_t y_stride,
                                             int64_t ahead, __m512i* panel) {
    constexpr int kScalesAt = F::kHasMin ? 16 : 8;  // uint16 entries before the scale bytes
    PanelCursor<M> cursor{panel};
    __m512 acc[R], accm[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[r] = accm[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n_blocks; ++b) {
      const auto* sc0 = reinterpret_cast<const uint8_t*>(m0 + kScalesAt);
      const auto* sc1 = reinterpret_cast<const uint8_t*>(m1 + kScalesAt);
      __m512i isum[R], imin[R];  // imin: q2_K's mins' sums (unused for the other types)
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) isum[r] = imin[r] = _mm512_setzero_si512();
      for (int g = 0; g < 8; ++g) {
        if (ahead != 0) {
          prefetch_ahead(c0, F::kGroupBytes, ahead);
          prefetch_ahead(c1, F::kGroupBytes, ahead);
        }
        if constexpr (F::kHasMin) {
          // Sub-blocks 2g and 2g + 1's mins (4-bit, laid out as the scales) as int16 pairs, times
          // each row's two activation sums by vpdpwssd.
          __m512i mins;
          if constexpr (PanelCursor<M>::kMakes)
            mins = join(_mm256_cvtepu8_epi16(
                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc0 + 128 + 16 * g))),
                        _mm256_cvtepu8_epi16(
                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc1 + 128 + 16 * g))));
          cursor.pass(mins);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r)
            imin[r] = dpwssd_bcast_512(imin[r], mins, xs + 16 * r + 2 * g);
        }
        const __m128i s0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc0 + 16 * g));
        const __m128i s1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc1 + 16 * g));
        if constexpr (F::kOffsetShift >= 0) {
          // The offset's share of sub-blocks 2g and 2g + 1, into the same integer sums:
          // -(scale << shift) of each output's two sub-blocks as an int16 pair (the scales' byte
          // pairs, sign-extended), times each row's two activation sums (bsums) by vpdpwssd. One
          // instruction a row and pair of sub-blocks, where the sums after the block took four.
          __m512i neg;
          if constexpr (PanelCursor<M>::kMakes)
            neg = _mm512_sub_epi16(
                _mm512_setzero_si512(),
                _mm512_slli_epi16(join(_mm256_cvtepi8_epi16(s0), _mm256_cvtepi8_epi16(s1)),
                                  F::kOffsetShift));
          cursor.pass(neg);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            isum[r] = dpwssd_bcast_512(isum[r], neg, xs + 16 * r + 2 * g);
            keep_in_register_512(isum[r]);
          }
        }
#pragma GCC unroll 2
        for (int m = 0; m < 2; ++m) {
          // The sub-block's 4 quant vectors, then its scales: byte 2j + m of each group's 16 (row
          // j's scale of sub-block m), sign-extended.
          __m512i q[4], scale;
          if constexpr (PanelCursor<M>::kMakes) {
            F::unpack(Bytes512{c0, c1}, m, q);
            const __m128i pick =
                m == 0 ? _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1)
                       : _mm_setr_epi8(1, 3, 5, 7, 9, 11, 13, 15, -1, -1, -1, -1, -1, -1, -1, -1);
            scale = join(_mm256_cvtepi8_epi32(_mm_shuffle_epi8(s0, pick)),
                         _mm256_cvtepi8_epi32(_mm_shuffle_epi8(s1, pick)));
          }
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) cursor.pass(q[i]);
          cursor.pass(scale);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            const int8_t* x = xq + 32 * g + 16 * m + 256 * r;
            __m512i dot = dpbusd_bcast_512(_mm512_setzero_si512(), q[0], x);
            dot = dpbusd_bcast_512(dot, q[1], x + 4);
            dot = dpbusd_bcast_512(dot, q[2], x + 8);
            dot = dpbusd_bcast_512(dot, q[3], x + 12);
            isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(dot, scale));
            keep_in_register_512(isum[r]);
          }
        }
        c0 += F::kGroupBytes;
        c1 += F::kGroupBytes;
      }
      const __m512 d = cvtph_ps_512(load_half_pair(m0, m1));
      // q2_K's mins' scales (unused for the other types).
      const __m512 dmin = F::kHasMin ? cvtph_ps_512(load_half_pair(m0 + 8, m1 + 8)) : d;
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        acc[r] = add_block_total(acc[r], isum[r], d, xd[r]);
        if constexpr (F::kHasMin) accm[r] = add_block_total(accm[r], imin[r], dmin, xd[r]);
        xs += 16;
      }
      xs += 16 * (kTile - R);
      m0 += F::kScaleCount;
      m1 += F::kScaleCount;
      xq += 256 * kTile;
      xd += kTile;
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      _mm512_storeu_ps(y + r * y_stride, F::kHasMin ? _mm512_sub_ps(acc[r], accm[r]) : acc[r]);
    }
  }
};

// Whether K's wide tile takes a Panel mode (WideSub16K), and the vectors a super-block it keeps
// (0: it unpacks in every row tile).
template <class K>
constexpr bool takes_panel() {
  return requires {
    K::kPanelVectors;
  };
}
template <class K>
constexpr int64_t panel_vectors() {
  if constexpr (takes_panel<K>())
    return K::kPanelVectors;
  else
    return 0;
}

// Whether K's wide tile takes activation terms: K::kTermsPerBlock int32 per row and block made
// from the row's block sums (Q8Rows' bsums) by K::make_terms.
template <class K>
constexpr bool takes_terms() {
  return requires {
    K::kTermsPerBlock;
  };
}

// K's activation terms of x (in Q8Rows' order and tiles: per tile of kTile rows, block by block,
// row by row), made once per matmul call and thread, where the tiles would make them again for
// every pair of groups. The tiles broadcast them from memory. Per block the integers are the
// same. q4_0 and q8_0's (their block sum times -8 or -128), against building them from the int16
// sum in a general register each row and block (a sign extension, a shift, the move to a vector
// register and the broadcast): median of 5 on one thread, AMD Zen 5, 2048 x 2048 at 8, 32 and 512
// rows, four to six alternations: q8_0 2-8% faster, q4_0 within 2% either way.
template <class K>
const int32_t* activation_terms(const Q8Rows& x, int64_t n_tiles, int64_t n_blocks) {
  constexpr int64_t kSums = K::Narrow::kBlock == 256 ? 16 : 1;  // bsums a row and block
  thread_local std::vector<int32_t> values;
  const int64_t row_blocks = n_tiles * kTile * n_blocks;  // whole tiles (Q8Buffer)
  const auto n = static_cast<size_t>(row_blocks * K::kTermsPerBlock);
  if (values.size() < n) values.resize(n);
  for (int64_t i = 0; i < row_blocks; ++i)
    K::make_terms(x.bsums + kSums * i, values.data() + K::kTermsPerBlock * i);
  return values.data();
}

// One row tile on groups g and g + 1 (`pair`: K's wide tile, its panel vectors as M says) or on
// group g alone (the 256-bit tile of K::Narrow). xt: the tile's activation terms where K takes
// them.
template <class K, Panel M, int R>
inline void run_wide_or_narrow(bool pair, const uint8_t* c0, const uint8_t* c1, const uint16_t* s0,
                               const uint16_t* s1, int64_t n_blocks, const int8_t* xq,
                               const float* xd, const int16_t* xs, const int32_t* xt, float* y,
                               int64_t y_stride, int64_t ahead, __m512i* panel) {
  using N = typename K::Narrow;
  if (!pair) {
    run_tile<N, R>(c0, s0, n_blocks, xq, xd, xs, y, y_stride, ahead);
  } else if constexpr (takes_panel<K>()) {
    K::template tile<M, R>(c0, c1, s0, s1, n_blocks, xq, xd, xs, y, y_stride, ahead, panel);
  } else if constexpr (N::kBlock == 256) {
    K::template tile<R>(c0, c1, s0, s1, n_blocks, xq, xd, xt, y, y_stride, ahead);
  } else {
    wide_tile<K, R>(c0, c1, s0, s1, n_blocks, xq, xd, xt, y, y_stride, ahead);
  }
}

// run_wide_or_narrow with the panel mode chosen at run time.
template <class K, int R>
inline void run_row_tile(Panel mode, bool pair, const uint8_t* c0, const uint8_t* c1,
                         const uint16_t* s0, const uint16_t* s1, int64_t n_blocks, const int8_t* xq,
                         const float* xd, const int16_t* xs, const int32_t* xt, float* y,
                         int64_t y_stride, int64_t ahead, __m512i* panel) {
  if constexpr (panel_vectors<K>() > 0) {
    if (mode == Panel::kUnpackAndKeep)
      return run_wide_or_narrow<K, Panel::kUnpackAndKeep, R>(pair, c0, c1, s0, s1, n_blocks, xq, xd,
                                                             xs, xt, y, y_stride, ahead, panel);
    if (mode == Panel::kReuse)
      return run_wide_or_narrow<K, Panel::kReuse, R>(pair, c0, c1, s0, s1, n_blocks, xq, xd, xs, xt,
                                                     y, y_stride, ahead, panel);
  }
  run_wide_or_narrow<K, Panel::kUnpack, R>(pair, c0, c1, s0, s1, n_blocks, xq, xd, xs, xt, y,
                                           y_stride, ahead, panel);
}

// run_packed<K::Narrow> with the groups taken in pairs (K's wide tile); a last odd group of the
// range runs the 256-bit tile. Same panels, prefetch rule and row tiles; where K keeps a panel
// (Panel) and a panel has 3 row tiles or more, its first tile unpacks each pair of groups for
// the others.
template <class K>
void run_packed_wide(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float*) {
  using N = typename K::Narrow;
  // Decode (one activation row) is bound by reading the weights, not by vpdpbusd, and reading two
  // groups' streams at once was slower there than one after the other: 1B Q4_K single-stream
  // decode fell from 50 to 43 tokens/s on AMD Zen 5. One row keeps the 256-bit kernel (the same
  // bits either way).
  if (a.n_rows == 1) return run_packed<N>(a, o_begin, o_end, nullptr);
  const Q8Rows& x = *a.xq;
  const int64_t n_blocks = a.n_in / N::kBlock;
  const int64_t sums_per_block = N::kBlock == 256 ? 16 : 1;
  const int64_t n_tiles = (a.n_rows + kTile - 1) / kTile;
  constexpr int64_t kPanelBytes = int64_t{256} << 10;
  const int64_t panel_tiles = std::max<int64_t>(1, kPanelBytes / (kTile * a.n_in));
  const int64_t group_chunks = n_blocks * N::kChunkBytes;
  const int64_t group_scales = n_blocks * N::kScaleCount;
  // Each thread's panel buffer, for a pair of groups' unpacked vectors.
  struct alignas(64) PanelVector {
    unsigned char bytes[64];
  };
  thread_local std::vector<PanelVector> panel_buffer;
  const auto panel_size = static_cast<size_t>(n_blocks * panel_vectors<K>());
  if (panel_buffer.size() < panel_size) panel_buffer.resize(panel_size);
  auto* panel = reinterpret_cast<__m512i*>(panel_buffer.data());
  const int32_t* terms = nullptr;
  if constexpr (takes_terms<K>()) terms = activation_terms<K>(x, n_tiles, n_blocks);
  for (int64_t p0 = 0; p0 < n_tiles; p0 += panel_tiles) {
    const int64_t p1 = std::min(n_tiles, p0 + panel_tiles);
    for (int64_t g = o_begin / 8; g < o_end / 8;) {
      const bool pair = g + 1 < o_end / 8;
      const uint8_t* c0 = a.w + g * group_chunks;
      const uint16_t* s0 = a.w_scales + g * group_scales;
      const uint8_t* c1 = c0 + group_chunks;
      const uint16_t* s1 = s0 + group_scales;
      for (int64_t t = p0; t < p1; ++t) {
        const int64_t first = t * kTile * n_blocks;  // the tile's first block index (Q8Rows)
        const int8_t* xq = x.qs + first * N::kBlock;
        const float* xd = x.d + first;
        const int16_t* xs = x.bsums + first * sums_per_block;
        const int32_t* xt = nullptr;  // the tile's activation terms, where K takes them
        if constexpr (takes_terms<K>()) xt = terms + first * K::kTermsPerBlock;
        float* y = a.y + t * kTile * a.n_out + 8 * g;
        // The next pair starts 2 groups on (where this is the last group, the request runs past
        // the range: a few lines for nothing).
        const int64_t ahead =
            prefetch_distance(t, p0, p1, a.n_rows, g == o_begin / 8, 2 * group_chunks);
        // Keeping the vectors costs their stores: a panel of 2 row tiles (8 rows) was 8% slower
        // for it, so panels of 3 and more.
        const Panel mode = p1 - p0 < 3 ? Panel::kUnpack
                           : t == p0   ? Panel::kUnpackAndKeep
                                       : Panel::kReuse;
        switch (std::min(kTile, a.n_rows - t * kTile)) {
          case 4:
            run_row_tile<K, 4>(mode, pair, c0, c1, s0, s1, n_blocks, xq, xd, xs, xt, y, a.n_out,
                               ahead, panel);
            break;
          case 3:
            run_row_tile<K, 3>(mode, pair, c0, c1, s0, s1, n_blocks, xq, xd, xs, xt, y, a.n_out,
                               ahead, panel);
            break;
          case 2:
            run_row_tile<K, 2>(mode, pair, c0, c1, s0, s1, n_blocks, xq, xd, xs, xt, y, a.n_out,
                               ahead, panel);
            break;
          default:
            run_row_tile<K, 1>(mode, pair, c0, c1, s0, s1, n_blocks, xq, xd, xs, xt, y, a.n_out,
                               ahead, panel);
            break;
        }
      }
      g += pair ? 2 : 1;
    }
  }
}

// The wide kernels where a type has one, else packed_vnni_kernels.h's.
MatmulKernel vnni_wide_packed_kernel(tensor::GgmlType type) {
  switch (type) {
    case tensor::GgmlType::kQ4_0:
      return run_packed_wide<WideQ4_0>;
    case tensor::GgmlType::kQ8_0:
      return run_packed_wide<WideQ8_0>;
    case tensor::GgmlType::kQ4_K:
      return run_packed_wide<WideScaleMinK<false>>;
    case tensor::GgmlType::kQ5_K:
      return run_packed_wide<WideScaleMinK<true>>;
    case tensor::GgmlType::kQ2_K:
      return run_packed_wide<WideSub16K<Q2Groups>>;
    case tensor::GgmlType::kQ3_K:
      return run_packed_wide<WideSub16K<Q3Groups>>;
    case tensor::GgmlType::kQ6_K:
      return run_packed_wide<WideSub16K<Q6Groups>>;
    default:
      return vnni_packed_kernel(type);
  }
}

}  // namespace
}  // namespace vesper::backend::cpu
