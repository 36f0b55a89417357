// The AVX2 + FMA arithmetic of paged attention over one tile of f32 rows, as
// attention_kernel.h's numeric contract states it: scores, the online-softmax fold, and the
// weighted value sums, for one query or for two over the same keys. A Rows type (F32Rows here,
// EncodedRows in attention_avx2_tile.h, KiviCodeRows in attention_avx2_kivi.h) supplies 8
// elements of row i from channel c as `load(i, c)`, and one element as `at(i, d)` where a head size
// that is not a multiple of 8 leaves a tail.
//
// Include only from attention_avx2_tile.h (directly, or through attention_avx2_kivi.h), whose
// includers are built with -mavx2 -mfma -mf16c (or wider) and -ffp-contract=off. As in
// vec_exp.h, everything sits in an unnamed namespace, so no other file can be handed a copy built
// for AVX2.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/vec_exp.h"

namespace vesper::backend::cpu {
namespace {

constexpr int kLanes = 8;

// ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)) of one vector.
float tree8(__m256 a) {
  __m128 lo = _mm256_castps256_ps128(a);
  __m128 hi = _mm256_extractf128_ps(a, 1);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  hi = _mm_hadd_ps(hi, hi);
  hi = _mm_hadd_ps(hi, hi);
  return _mm_cvtss_f32(_mm_add_ss(lo, hi));
}

// tree8 of eight vectors at once: lane i of the result is tree8(a_i). Takes the vectors by value
// so that its callers' accumulators stay in registers (an array argument put them on the stack).
__m256 tree8x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
               __m256 a7) {
  const __m256 t0 = _mm256_hadd_ps(a0, a1);
  const __m256 t1 = _mm256_hadd_ps(a2, a3);
  const __m256 t2 = _mm256_hadd_ps(a4, a5);
  const __m256 t3 = _mm256_hadd_ps(a6, a7);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);
  const __m256 u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// v, pinned to a register: where a loaded vector feeds several FMAs, GCC folds the load into each
// of them as a memory operand, loading it once per use, and load ports bound these loops.
inline __m256 in_register(__m256 v) {
  __asm__("" : "+x"(v));
  return v;
}

// A tile's rows as f32 arrays (f32 cache rows in place, or rows decoded into L1).
struct F32Rows {
  const float* const* rows;
  __m256 load(int64_t i, int64_t c) const { return _mm256_loadu_ps(rows[i] + c); }
  float at(int64_t i, int64_t d) const { return rows[i][d]; }
};

// Scores of keys i0 .. i0 + 8 of `k` against q into s[0..8): eight independent FMA chains.
template <class Rows>
void score8(const float* q, const Rows& k, int64_t i0, int64_t head_dim, float scale, float* s) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const int64_t body = head_dim / kLanes * kLanes;
  for (int64_t c = 0; c < body; c += kLanes) {
    const __m256 qc = _mm256_loadu_ps(q + c);
    a0 = _mm256_fmadd_ps(qc, k.load(i0, c), a0);
    a1 = _mm256_fmadd_ps(qc, k.load(i0 + 1, c), a1);
    a2 = _mm256_fmadd_ps(qc, k.load(i0 + 2, c), a2);
    a3 = _mm256_fmadd_ps(qc, k.load(i0 + 3, c), a3);
    a4 = _mm256_fmadd_ps(qc, k.load(i0 + 4, c), a4);
    a5 = _mm256_fmadd_ps(qc, k.load(i0 + 5, c), a5);
    a6 = _mm256_fmadd_ps(qc, k.load(i0 + 6, c), a6);
    a7 = _mm256_fmadd_ps(qc, k.load(i0 + 7, c), a7);
  }
  __m256 sum = tree8x8(a0, a1, a2, a3, a4, a5, a6, a7);
  if (body != head_dim) {
    alignas(32) float tmp[kLanes];
    _mm256_store_ps(tmp, sum);
    for (int i = 0; i < kLanes; ++i)
      for (int64_t d = body; d < head_dim; ++d) tmp[i] = std::fma(q[d], k.at(i0 + i, d), tmp[i]);
    sum = _mm256_load_ps(tmp);
  }
  _mm256_storeu_ps(s, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
}

// Score of key i of `k` against q.
template <class Rows>
float score1(const float* q, const Rows& k, int64_t i, int64_t head_dim, float scale) {
  __m256 a = _mm256_setzero_ps();
  const int64_t body = head_dim / kLanes * kLanes;
  for (int64_t c = 0; c < body; c += kLanes)
    a = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), k.load(i, c), a);
  float s = tree8(a);
  for (int64_t d = body; d < head_dim; ++d) s = std::fma(q[d], k.at(i, d), s);
  return s * scale;
}

// Over chunks [c, c + 8 * N): the tile's weighted values in four partial sums (key i goes to
// u[i % 4]), then acc = fma(acc, alpha, (u0 + u1) + (u2 + u3)). 4 x N independent FMA chains hide
// the FMA latency even when head_dim is a single vector.
template <int N, class Rows>
void accumulate_chunks(float* acc, int64_t c, __m256 alpha, const float* e, const Rows& v,
                       int64_t n) {
  __m256 u[4][N];
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < N; ++k) u[r][k] = _mm256_setzero_ps();
  // Key i + R into partial sum R; R is a constant so the partial sums stay in registers.
  auto step = [&](int64_t i, auto R) {
    const __m256 ei = _mm256_broadcast_ss(e + i);
    for (int k = 0; k < N; ++k) u[R][k] = _mm256_fmadd_ps(ei, v.load(i, c + 8 * k), u[R][k]);
  };
  using R0 = std::integral_constant<int, 0>;
  using R1 = std::integral_constant<int, 1>;
  using R2 = std::integral_constant<int, 2>;
  using R3 = std::integral_constant<int, 3>;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    step(i, R0{});
    step(i + 1, R1{});
    step(i + 2, R2{});
    step(i + 3, R3{});
  }
  if (i < n) step(i, R0{});
  if (i + 1 < n) step(i + 1, R1{});
  if (i + 2 < n) step(i + 2, R2{});
  for (int k = 0; k < N; ++k) {
    const __m256 pv =
        _mm256_add_ps(_mm256_add_ps(u[0][k], u[1][k]), _mm256_add_ps(u[2][k], u[3][k]));
    _mm256_storeu_ps(acc + c + 8 * k, _mm256_fmadd_ps(_mm256_loadu_ps(acc + c + 8 * k), alpha, pv));
  }
}

// Scores of keys [0, nt) of a tile of f32 rows into s (padded with -inf to a multiple of 8).
template <class Rows>
void scores_from_rows(const float* q, const Rows& k, int64_t nt, int64_t head_dim, float scale,
                      float* s) {
  const int64_t full = nt / kLanes * kLanes;
  for (int64_t i = 0; i < full; i += kLanes) score8(q, k, i, head_dim, scale, s + i);
  for (int64_t i = full; i < nt; ++i) s[i] = score1(q, k, i, head_dim, scale);
}

// fold()'s first half: pads s[nt, padded) with -inf (padded: nt rounded up to 8) and moves the
// running maximum on to the tile's; returns alpha = exp(old maximum - new maximum).
float fold_max(float* s, int64_t nt, int64_t padded, float& run_max) {
  for (int64_t i = nt; i < padded; ++i) s[i] = -INFINITY;
  // The max is exact whatever the order (the sign of a zero cannot reach a result: exp(+-0)
  // is 1 either way).
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  for (int64_t i = 0; i < padded; i += kLanes) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + i));
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, vmax);
  float tile_max = lanes[0];
  for (int l = 1; l < kLanes; ++l) tile_max = std::max(tile_max, lanes[l]);
  const float m_new = std::max(run_max, tile_max);
  const float alpha = exp_lane(run_max - m_new);
  run_max = m_new;
  return alpha;
}

// The online-softmax step over a tile's scores s[0, nt): s becomes the weights e (0 past nt, to a
// multiple of 8), and the running maximum and sum move on; returns alpha.
float fold(float* s, int64_t nt, float& run_max, float& run_sum) {
  const int64_t padded = (nt + kLanes - 1) / kLanes * kLanes;
  const float alpha = fold_max(s, nt, padded, run_max);
  const __m256 vm = _mm256_set1_ps(run_max);
  __m256 vsum = _mm256_setzero_ps();
  for (int64_t i = 0; i < padded; i += kLanes) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), vm));
    _mm256_storeu_ps(s + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  run_sum = std::fma(run_sum, alpha, tree8(vsum));
  return alpha;
}

// fold() for two queries' scores over the same keys at once, their dependency chains (maximum,
// alpha, exponentials, sum) interleaved and both alphas from one vector exp: the same values as two
// fold() calls (the maximum is exact in any order; exp_avx2's lanes are exp_lane's; the sums'
// tree is tree8's). Writes alpha[0..2).
void fold2(float* s0, float* s1, int64_t nt, float* const* run_max, float* const* run_sum,
           float* alpha) {
  const int64_t padded = (nt + kLanes - 1) / kLanes * kLanes;
  for (int64_t i = nt; i < padded; ++i) s0[i] = s1[i] = -INFINITY;
  __m256 vmax0 = _mm256_set1_ps(-INFINITY), vmax1 = vmax0;
  for (int64_t i = 0; i < padded; i += kLanes) {
    vmax0 = _mm256_max_ps(vmax0, _mm256_loadu_ps(s0 + i));
    vmax1 = _mm256_max_ps(vmax1, _mm256_loadu_ps(s1 + i));
  }
  // Lanes 0-3: query 0's tile maximum, 4-7: query 1's.
  __m256 m = _mm256_max_ps(_mm256_permute2f128_ps(vmax0, vmax1, 0x20),
                           _mm256_permute2f128_ps(vmax0, vmax1, 0x31));
  m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4E));
  m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xB1));
  const __m256 old_max = _mm256_set_m128(_mm_set1_ps(*run_max[1]), _mm_set1_ps(*run_max[0]));
  // max(run_max, tile_max) as fold's std::max: the tile's maximum where it is larger.
  const __m256 m_new = _mm256_blendv_ps(old_max, m, _mm256_cmp_ps(old_max, m, _CMP_LT_OQ));
  const __m256 alphas = exp_avx2(_mm256_sub_ps(old_max, m_new));
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, m_new);
  *run_max[0] = lanes[0];
  *run_max[1] = lanes[4];
  const __m256 vm0 = _mm256_permute2f128_ps(m_new, m_new, 0x00);
  const __m256 vm1 = _mm256_permute2f128_ps(m_new, m_new, 0x11);
  __m256 vsum0 = _mm256_setzero_ps(), vsum1 = vsum0;
  for (int64_t i = 0; i < padded; i += kLanes) {
    const __m256 e0 = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s0 + i), vm0));
    const __m256 e1 = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s1 + i), vm1));
    _mm256_storeu_ps(s0 + i, e0);
    _mm256_storeu_ps(s1 + i, e1);
    vsum0 = _mm256_add_ps(vsum0, e0);
    vsum1 = _mm256_add_ps(vsum1, e1);
  }
  // tree8 of both sums: lane 0 query 0's, lane 1 query 1's.
  const __m256 t = _mm256_hadd_ps(vsum0, vsum1);
  const __m256 u = _mm256_hadd_ps(t, t);
  const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
  _mm256_store_ps(lanes, alphas);
  alpha[0] = lanes[0];
  alpha[1] = lanes[4];
  *run_sum[0] = std::fma(*run_sum[0], alpha[0], _mm_cvtss_f32(sums));
  *run_sum[1] = std::fma(*run_sum[1], alpha[1], _mm_cvtss_f32(_mm_movehdup_ps(sums)));
}

// acc = fma(acc, alpha, the tile's weighted values) over f32 rows.
template <class Rows>
void accumulate_rows(const float* e, const Rows& v, int64_t nt, int64_t head_dim, float alpha,
                     float* acc) {
  const int64_t body = head_dim / kLanes * kLanes;
  const __m256 valpha = _mm256_set1_ps(alpha);
  int64_t c = 0;
  for (; c + 16 <= body; c += 16) accumulate_chunks<2>(acc, c, valpha, e, v, nt);
  for (; c < body; c += 8) accumulate_chunks<1>(acc, c, valpha, e, v, nt);
  for (int64_t d = body; d < head_dim; ++d) {
    float u[4] = {};
    for (int64_t i = 0; i < nt; ++i) u[i % 4] = std::fma(e[i], v.at(i, d), u[i % 4]);
    acc[d] = std::fma(acc[d], alpha, (u[0] + u[1]) + (u[2] + u[3]));
  }
}

// Scores of keys i0 .. i0 + 4 of `k` against two queries at once into s0[0..4) and s1[0..4):
// each key chunk loaded once for both (6 loads for 8 FMAs where score8 needs 9), each score's
// arithmetic score8's (the tree of tree8x8 over four vectors, then the tail, then the scale).
template <class Rows>
void score2x4(const float* q0, const float* q1, const Rows& k, int64_t i0, int64_t head_dim,
              float scale, float* s0, float* s1) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  const int64_t body = head_dim / kLanes * kLanes;
  for (int64_t c = 0; c < body; c += kLanes) {
    const __m256 x = _mm256_loadu_ps(q0 + c), y = _mm256_loadu_ps(q1 + c);
    __m256 kc = in_register(k.load(i0, c));
    a0 = _mm256_fmadd_ps(x, kc, a0);
    b0 = _mm256_fmadd_ps(y, kc, b0);
    kc = in_register(k.load(i0 + 1, c));
    a1 = _mm256_fmadd_ps(x, kc, a1);
    b1 = _mm256_fmadd_ps(y, kc, b1);
    kc = in_register(k.load(i0 + 2, c));
    a2 = _mm256_fmadd_ps(x, kc, a2);
    b2 = _mm256_fmadd_ps(y, kc, b2);
    kc = in_register(k.load(i0 + 3, c));
    a3 = _mm256_fmadd_ps(x, kc, a3);
    b3 = _mm256_fmadd_ps(y, kc, b3);
  }
  // Lanes 0-3: query 0's keys, 4-7: query 1's, each ((x0 + x1) + (x2 + x3)) + ((x4 + x5) +
  // (x6 + x7)) as tree8.
  __m256 sum = tree8x8(a0, a1, a2, a3, b0, b1, b2, b3);
  if (body != head_dim) {
    alignas(32) float tmp[kLanes];
    _mm256_store_ps(tmp, sum);
    for (int i = 0; i < 4; ++i)
      for (int64_t d = body; d < head_dim; ++d) {
        tmp[i] = std::fma(q0[d], k.at(i0 + i, d), tmp[i]);
        tmp[4 + i] = std::fma(q1[d], k.at(i0 + i, d), tmp[4 + i]);
      }
    sum = _mm256_load_ps(tmp);
  }
  sum = _mm256_mul_ps(sum, _mm256_set1_ps(scale));
  _mm_storeu_ps(s0, _mm256_castps256_ps128(sum));
  _mm_storeu_ps(s1, _mm256_extractf128_ps(sum, 1));
}

// scores_from_rows for two queries against the same tile.
template <class Rows>
void scores2_from_rows(const float* q0, const float* q1, const Rows& k, int64_t nt,
                       int64_t head_dim, float scale, float* s0, float* s1) {
  const int64_t full = nt / 4 * 4;
  for (int64_t i = 0; i < full; i += 4) score2x4(q0, q1, k, i, head_dim, scale, s0 + i, s1 + i);
  for (int64_t i = full; i < nt; ++i) {
    s0[i] = score1(q0, k, i, head_dim, scale);
    s1[i] = score1(q1, k, i, head_dim, scale);
  }
}

// The weighted values of Q queries over chunks [c, c + 8 * N) of a tile, folded into their
// accumulators: acc[q] = fma(acc[q], alpha[q], (u0 + u1) + (u2 + u3)), u_r the chain over keys
// j = r, r + 4, ... < n (accumulate_chunks' sums, the contract's). One partial sum at a time, so
// that all N chunks of a key are in flight together (Q x N = 8 chains) and each value chunk loaded
// serves all Q queries: a key costs N + Q + 1 loads for Q x N FMAs, where accumulate_chunks<2>
// needs 4 for 2.
//
// KIVI values (kivi_values2) come through here too: v their codes (KiviCodeRows), e[q] query q's
// weights for the chunks' channel run, and z[q] the run's zero term, added last:
// acc[q] = fma(acc[q], alpha[q], ((u0 + u1) + (u2 + u3)) + z[q]).
template <int Q, int N, class Rows>
void accumulate_partials(const float* const* e, const Rows& v, int64_t n, int64_t c,
                         const float* alpha, float* const* acc, const float* z = nullptr) {
  alignas(32) float u[Q][4][N * kLanes];
  for (int r = 0; r < 4; ++r) {
    __m256 a[Q][N];
#pragma GCC unroll 8
    for (int q = 0; q < Q; ++q)
#pragma GCC unroll 8
      for (int k = 0; k < N; ++k) a[q][k] = _mm256_setzero_ps();
    for (int64_t j = r; j < n; j += 4) {
      __m256 ej[Q];
#pragma GCC unroll 8
      for (int q = 0; q < Q; ++q) ej[q] = _mm256_broadcast_ss(e[q] + j);
#pragma GCC unroll 8
      for (int k = 0; k < N; ++k) {
        const __m256 vk = in_register(v.load(j, c + kLanes * k));
#pragma GCC unroll 8
        for (int q = 0; q < Q; ++q) a[q][k] = _mm256_fmadd_ps(ej[q], vk, a[q][k]);
      }
    }
#pragma GCC unroll 8
    for (int q = 0; q < Q; ++q)
#pragma GCC unroll 8
      for (int k = 0; k < N; ++k) _mm256_store_ps(u[q][r] + kLanes * k, a[q][k]);
  }
#pragma GCC unroll 8
  for (int q = 0; q < Q; ++q) {
    const __m256 valpha = _mm256_set1_ps(alpha[q]);
#pragma GCC unroll 8
    for (int k = 0; k < N; ++k) {
      const int o = kLanes * k;
      __m256 pv =
          _mm256_add_ps(_mm256_add_ps(_mm256_load_ps(u[q][0] + o), _mm256_load_ps(u[q][1] + o)),
                        _mm256_add_ps(_mm256_load_ps(u[q][2] + o), _mm256_load_ps(u[q][3] + o)));
      if (z != nullptr) pv = _mm256_add_ps(pv, _mm256_set1_ps(z[q]));
      float* out = acc[q] + c + o;
      _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_loadu_ps(out), valpha, pv));
    }
  }
}

// acc[q] = fma(acc[q], alpha[q], the tile's weighted values) for Q queries over the same f32
// rows: whole chunks 8 x 8 / Q at a time (accumulate_partials), then the tail of head sizes that
// are not multiples of 8 as accumulate_rows does it.
template <int Q, class Rows>
void accumulate_queries(const float* const* e, const Rows& v, int64_t nt, int64_t head_dim,
                        const float* alpha, float* const* acc) {
  constexpr int kWide = 8 / Q;  // chunks per call: Q x kWide accumulators
  const int64_t body = head_dim / kLanes * kLanes;
  int64_t c = 0;
  for (; c + kWide * kLanes <= body; c += kWide * kLanes)
    accumulate_partials<Q, kWide>(e, v, nt, c, alpha, acc);
  if constexpr (kWide > 4)
    if (c + 4 * kLanes <= body) {
      accumulate_partials<Q, 4>(e, v, nt, c, alpha, acc);
      c += 4 * kLanes;
    }
  if (c + 2 * kLanes <= body) {
    accumulate_partials<Q, 2>(e, v, nt, c, alpha, acc);
    c += 2 * kLanes;
  }
  if (c < body) accumulate_partials<Q, 1>(e, v, nt, c, alpha, acc);
  for (int q = 0; q < Q; ++q)
    for (int64_t d = body; d < head_dim; ++d) {
      float u[4] = {};
      for (int64_t i = 0; i < nt; ++i) u[i % 4] = std::fma(e[q][i], v.at(i, d), u[i % 4]);
      acc[q][d] = std::fma(acc[q][d], alpha[q], (u[0] + u[1]) + (u[2] + u[3]));
    }
}

}  // namespace
}  // namespace vesper::backend::cpu
