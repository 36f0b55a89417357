// The AVX-512 tile of paged attention (Avx512Tile): Avx2Tile (attention_avx2_tile.h) with the
// arithmetic of a tile of f32 rows (a prompt's tiles, decoded once per token block) on 512-bit
// vectors, where most of a prefill's attention time goes:
//   - two queries' scores side by side in one zmm register (query 0 in lanes 0-7, query 1 in
//     lanes 8-15): each key chunk is loaded once, broadcast to both halves, and one 16-lane FMA
//     does what two 8-lane FMAs did;
//   - the online-softmax fold's exponentials 16 at a time (exp_avx512);
//   - the weighted value sums over 16 channels a vector, two of the contract's four partial sums
//     at a time (so even one query keeps 8 independent FMA chains).
// Lane by lane the operations are Avx2Tile's, in the same order (each lane's FMA chain over a
// key's chunks, the same reduction tree, the same four partial sums over the keys), so the
// results are attention_kernel.h's contract, bit for bit equal to the portable kernel.
// Single-query scores, rows read in place (decode), KIVI groups and the decoding of a tile's rows
// stay Avx2Tile's; head sizes that are not a multiple of 8 take Avx2Tile's path whole.
//
// Only AVX-512 F instructions are used. Include only from attention_avx512.cpp (built with
// -mavx512f and -ffp-contract=off) or from a test that builds it on SIMDe's AVX-512 (its native
// aliases). Everything sits in an unnamed namespace, as in attention_avx2_tile.h.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/attention_avx2_tile.h"

namespace vesper::backend::cpu {
namespace {

constexpr int kLanes512 = 16;
// The largest head size whose query pair fits score_pairs' stack copy (and the largest any model
// has, twice over).
constexpr int64_t kMaxPairHeadDim = 512;

// _mm256_hadd_ps on each 256-bit half: lanes (a1 + a0, a3 + a2, b1 + b0, b3 + b2) per 128 bits,
// the operands in hadd's order.
inline __m512 hadd_halves(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0xDD), _mm512_shuffle_ps(a, b, 0x88));
}

// _mm512_shuffle_f32x4, spelled through its integer twin (the one SIMDe's native aliases have).
template <int kImm>
inline __m512 shuffle_128s(__m512 a, __m512 b) {
  return _mm512_castsi512_ps(
      _mm512_shuffle_i32x4(_mm512_castps_si512(a), _mm512_castps_si512(b), kImm));
}

// low in lanes 0-7, high in lanes 8-15.
inline __m512 join_ps(__m256 low, __m256 high) {
  return _mm512_castpd_ps(
      _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(low)), _mm256_castps_pd(high), 1));
}

// 8 floats at a in the low half, 8 at b in the high half.
inline __m512 load_pair_ps(const float* a, const float* b) {
  return join_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b));
}

// Lanes 8-15.
inline __m256 high_half(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

// 8 floats at p in both halves (one load).
inline __m512 broadcast_8(const float* p) {
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}

// Scores of keys i0 .. i0 + 8 of f32 rows against the query pair qq (chunk c: query 0's 8 lanes,
// then query 1's) into s0[0..8) and s1[0..8): per half, score2x4's arithmetic (an FMA chain per
// lane over the chunks, then tree8x8's tree, then the scale).
inline void score_pair8(const __m512* qq, int64_t chunks, const float* const* k, int64_t i0,
                        float scale, float* s0, float* s1) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t c = 0; c < chunks; ++c) {
    const __m512 q = qq[c];
    const int64_t o = kLanes * c;
    a0 = _mm512_fmadd_ps(q, broadcast_8(k[i0] + o), a0);
    a1 = _mm512_fmadd_ps(q, broadcast_8(k[i0 + 1] + o), a1);
    a2 = _mm512_fmadd_ps(q, broadcast_8(k[i0 + 2] + o), a2);
    a3 = _mm512_fmadd_ps(q, broadcast_8(k[i0 + 3] + o), a3);
    a4 = _mm512_fmadd_ps(q, broadcast_8(k[i0 + 4] + o), a4);
    a5 = _mm512_fmadd_ps(q, broadcast_8(k[i0 + 5] + o), a5);
    a6 = _mm512_fmadd_ps(q, broadcast_8(k[i0 + 6] + o), a6);
    a7 = _mm512_fmadd_ps(q, broadcast_8(k[i0 + 7] + o), a7);
  }
  // tree8x8 per half: u0's 128-bit lanes are (query 0, keys 0-3, lanes 0-3 | keys 0-3, lanes
  // 4-7 | query 1's two), u1's the same for keys 4-7.
  const __m512 u0 = hadd_halves(hadd_halves(a0, a1), hadd_halves(a2, a3));
  const __m512 u1 = hadd_halves(hadd_halves(a4, a5), hadd_halves(a6, a7));
  // tree8x8's last add (lanes 0-3 part + lanes 4-7 part): (query 0 keys 0-3, query 1 keys 0-3,
  // query 0 keys 4-7, query 1 keys 4-7).
  const __m512 low = shuffle_128s<_MM_SHUFFLE(2, 0, 2, 0)>(u0, u1);
  const __m512 high = shuffle_128s<_MM_SHUFFLE(3, 1, 3, 1)>(u0, u1);
  __m512 z = _mm512_mul_ps(_mm512_add_ps(low, high), _mm512_set1_ps(scale));
  z = shuffle_128s<_MM_SHUFFLE(3, 1, 2, 0)>(z, z);  // query 0's 8, then query 1's
  _mm256_storeu_ps(s0, _mm512_castps512_ps256(z));
  _mm256_storeu_ps(s1, high_half(z));
}

// scores2_from_rows (attention_avx2_rows.h) over f32 rows for a head size that is a multiple of
// 8, up to kMaxPairHeadDim: 8 keys at a time on zmm, the rest one by one as there.
inline void score_pairs(const float* q0, const float* q1, const float* const* k, int64_t nt,
                        int64_t head_dim, float scale, float* s0, float* s1) {
  const int64_t chunks = head_dim / kLanes;
  __m512 qq[kMaxPairHeadDim / kLanes];
  for (int64_t c = 0; c < chunks; ++c) qq[c] = load_pair_ps(q0 + kLanes * c, q1 + kLanes * c);
  const int64_t full = nt / 8 * 8;
  for (int64_t i = 0; i < full; i += 8) score_pair8(qq, chunks, k, i, scale, s0 + i, s1 + i);
  for (int64_t i = full; i < nt; ++i) {
    s0[i] = score1(q0, F32Rows{k}, i, head_dim, scale);
    s1[i] = score1(q1, F32Rows{k}, i, head_dim, scale);
  }
}

// accumulate_partials (attention_avx2_rows.h) on 16-lane chunks [c, c + 16 N) of f32 rows: the
// contract's partial sums u_r (keys j = r, r + 4, ...) two at a time, r and r + 1 interleaved, so
// that Q x N x 2 FMA chains are in flight; then acc[q] = fma(acc[q], alpha[q], (u0 + u1) +
// (u2 + u3)).
template <int Q, int N>
void accumulate_partials_512(const float* const* e, const float* const* v, int64_t n, int64_t c,
                             const float* alpha, float* const* acc) {
  alignas(64) float u[Q][4][N * kLanes512];
  for (int r = 0; r < 4; r += 2) {
    __m512 a[Q][N], b[Q][N];
#pragma GCC unroll 8
    for (int q = 0; q < Q; ++q)
#pragma GCC unroll 8
      for (int k = 0; k < N; ++k) a[q][k] = b[q][k] = _mm512_setzero_ps();
    int64_t j = r;
    for (; j + 1 < n; j += 4) {
      __m512 ej[Q], fj[Q];
#pragma GCC unroll 8
      for (int q = 0; q < Q; ++q) {
        ej[q] = _mm512_set1_ps(e[q][j]);
        fj[q] = _mm512_set1_ps(e[q][j + 1]);
      }
#pragma GCC unroll 8
      for (int k = 0; k < N; ++k) {
        const __m512 vj = _mm512_loadu_ps(v[j] + c + kLanes512 * k);
        const __m512 vj1 = _mm512_loadu_ps(v[j + 1] + c + kLanes512 * k);
#pragma GCC unroll 8
        for (int q = 0; q < Q; ++q) {
          a[q][k] = _mm512_fmadd_ps(ej[q], vj, a[q][k]);
          b[q][k] = _mm512_fmadd_ps(fj[q], vj1, b[q][k]);
        }
      }
    }
    if (j < n) {  // the last key, of partial sum r
#pragma GCC unroll 8
      for (int q = 0; q < Q; ++q) {
        const __m512 ej = _mm512_set1_ps(e[q][j]);
#pragma GCC unroll 8
        for (int k = 0; k < N; ++k)
          a[q][k] = _mm512_fmadd_ps(ej, _mm512_loadu_ps(v[j] + c + kLanes512 * k), a[q][k]);
      }
    }
#pragma GCC unroll 8
    for (int q = 0; q < Q; ++q)
#pragma GCC unroll 8
      for (int k = 0; k < N; ++k) {
        _mm512_store_ps(u[q][r] + kLanes512 * k, a[q][k]);
        _mm512_store_ps(u[q][r + 1] + kLanes512 * k, b[q][k]);
      }
  }
#pragma GCC unroll 8
  for (int q = 0; q < Q; ++q) {
    const __m512 valpha = _mm512_set1_ps(alpha[q]);
#pragma GCC unroll 8
    for (int k = 0; k < N; ++k) {
      const int o = kLanes512 * k;
      const __m512 pv =
          _mm512_add_ps(_mm512_add_ps(_mm512_load_ps(u[q][0] + o), _mm512_load_ps(u[q][1] + o)),
                        _mm512_add_ps(_mm512_load_ps(u[q][2] + o), _mm512_load_ps(u[q][3] + o)));
      float* out = acc[q] + c + o;
      _mm512_storeu_ps(out, _mm512_fmadd_ps(_mm512_loadu_ps(out), valpha, pv));
    }
  }
}

// accumulate_queries (attention_avx2_rows.h) for a head size that is a multiple of 8: 64
// channels a call, then 32, then 16, and a last 8 on AVX2.
template <int Q>
void accumulate_queries_512(const float* const* e, const float* const* v, int64_t nt,
                            int64_t head_dim, const float* alpha, float* const* acc) {
  int64_t c = 0;
  for (; c + 4 * kLanes512 <= head_dim; c += 4 * kLanes512)
    accumulate_partials_512<Q, 4>(e, v, nt, c, alpha, acc);
  if (c + 2 * kLanes512 <= head_dim) {
    accumulate_partials_512<Q, 2>(e, v, nt, c, alpha, acc);
    c += 2 * kLanes512;
  }
  if (c + kLanes512 <= head_dim) {
    accumulate_partials_512<Q, 1>(e, v, nt, c, alpha, acc);
    c += kLanes512;
  }
  if (c < head_dim) accumulate_partials<Q, 1>(e, F32Rows{v}, nt, c, alpha, acc);
}

// exp of sixteen lanes: exp_avx2's operations (cpu/vec_exp.h), so lane i equals exp_lane(x[i])
// bit for bit (_mm512_min_ps / _mm512_max_ps pick as the 256-bit ones do; the rounding is the
// same round-to-nearest-even; 2^n's exponent field is the same integer, found another way).
inline __m512 exp_avx512(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(kExpMin), _CMP_LT_OQ);
  __m512 c = _mm512_min_ps(x, _mm512_set1_ps(kExpMax));
  c = _mm512_max_ps(c, _mm512_set1_ps(kExpMin));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(c, _mm512_set1_ps(kExpLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(kExpLn2Hi), c);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(kExpLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP5));
  const __m512 r2 = _mm512_mul_ps(r, r);
  __m512 y = _mm512_fmadd_ps(p, r2, r);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
  // 2^n's bits: (n + 127) << 23. n is an integer in [-126, 127], so n + 1.5 * 2^23 is exact and
  // its low bits are n's two's complement (the integer exp_avx2's conversion gives); the
  // shift drops the rest.
  const __m512i n_low = _mm512_castps_si512(_mm512_add_ps(n, _mm512_set1_ps(12582912.0f)));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(n_low, _mm512_set1_epi32(127)), 23);
  y = _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), y);
}

// fold() (attention_avx2_rows.h) with the exponentials 16 at a time: the maximum is exact in any
// order, each lane's exp is exp_lane's, and the sum takes the 8-key groups in order on 256 bits.
inline float fold_512(float* s, int64_t nt, float& run_max, float& run_sum) {
  const int64_t padded = (nt + kLanes - 1) / kLanes * kLanes;
  const float alpha = fold_max(s, nt, padded, run_max);
  const __m512 vm = _mm512_set1_ps(run_max);
  __m256 vsum = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 2 * kLanes <= padded; i += 2 * kLanes) {
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + i), vm));
    _mm512_storeu_ps(s + i, e);
    vsum = _mm256_add_ps(vsum, _mm512_castps512_ps256(e));
    vsum = _mm256_add_ps(vsum, high_half(e));
  }
  if (i < padded) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), _mm512_castps512_ps256(vm)));
    _mm256_storeu_ps(s + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  run_sum = std::fma(run_sum, alpha, tree8(vsum));
  return alpha;
}

// fold2() (attention_avx2_rows.h) with both queries' 8-key groups side by side in one zmm
// (query 0's in the low half): the same maxima, each lane's exp exp_lane's, each query's sum over
// its groups in order in its own half, then fold2's trees.
inline void fold2_512(float* s0, float* s1, int64_t nt, float* const* run_max,
                      float* const* run_sum, float* alpha) {
  const int64_t padded = (nt + kLanes - 1) / kLanes * kLanes;
  for (int64_t i = nt; i < padded; ++i) s0[i] = s1[i] = -INFINITY;
  __m512 vmax = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < padded; i += kLanes)
    vmax = _mm512_max_ps(vmax, load_pair_ps(s0 + i, s1 + i));
  alignas(64) float lanes[2 * kLanes];
  _mm512_store_ps(lanes, vmax);
  float m[2];
  for (int q = 0; q < 2; ++q) {
    float tile_max = lanes[kLanes * q];
    for (int l = 1; l < kLanes; ++l) tile_max = std::max(tile_max, lanes[kLanes * q + l]);
    m[q] = std::max(*run_max[q], tile_max);
    alpha[q] = exp_lane(*run_max[q] - m[q]);
    *run_max[q] = m[q];
  }
  const __m512 vm = join_ps(_mm256_set1_ps(m[0]), _mm256_set1_ps(m[1]));
  __m512 vsum = _mm512_setzero_ps();
  for (int64_t i = 0; i < padded; i += kLanes) {
    const __m512 e = exp_avx512(_mm512_sub_ps(load_pair_ps(s0 + i, s1 + i), vm));
    _mm256_storeu_ps(s0 + i, _mm512_castps512_ps256(e));
    _mm256_storeu_ps(s1 + i, high_half(e));
    vsum = _mm512_add_ps(vsum, e);
  }
  *run_sum[0] = std::fma(*run_sum[0], alpha[0], tree8(_mm512_castps512_ps256(vsum)));
  *run_sum[1] = std::fma(*run_sum[1], alpha[1], tree8(high_half(vsum)));
}

struct Avx512Tile : Avx2Tile {
  static bool wide(int64_t head_dim) {
    return head_dim % kLanes == 0 && head_dim <= kMaxPairHeadDim;
  }

  static void tile(const float* q, const float* const* k_rows, const float* const* v_rows,
                   int64_t nt, int64_t head_dim, float scale, float* s, float* acc, float& run_max,
                   float& run_sum) {
    if (!wide(head_dim))
      return Avx2Tile::tile(q, k_rows, v_rows, nt, head_dim, scale, s, acc, run_max, run_sum);
    scores_from_rows(q, F32Rows{k_rows}, nt, head_dim, scale, s);
    const float alpha = fold_512(s, nt, run_max, run_sum);
    const float* e[1] = {s};
    accumulate_queries_512<1>(e, v_rows, nt, head_dim, &alpha, &acc);
  }

  static void tile2(const float* const* q, const float* const* k_rows, const float* const* v_rows,
                    int64_t nt, int64_t head_dim, float scale, float* const* acc,
                    float* const* run_max, float* const* run_sum) {
    if (!wide(head_dim))
      return Avx2Tile::tile2(q, k_rows, v_rows, nt, head_dim, scale, acc, run_max, run_sum);
    alignas(32) float s0[kAttentionTile], s1[kAttentionTile];
    score_pairs(q[0], q[1], k_rows, nt, head_dim, scale, s0, s1);
    float alpha[2];
    fold2_512(s0, s1, nt, run_max, run_sum, alpha);
    const float* e[2] = {s0, s1};
    accumulate_queries_512<2>(e, v_rows, nt, head_dim, alpha, acc);
  }
};

}  // namespace
}  // namespace vesper::backend::cpu
