// The AVX2 + FMA paged-attention kernel: online softmax over tiles of 32 keys, vectorised over
// head_dim for the dot products and the V accumulation, and across keys (8 per vector) for the
// scores' reduction, max and exp. It follows attention_kernel.h's numeric contract exactly, so it
// matches paged_attention_scalar bit for bit.
//
// The walk over tokens, tiles and block tables is cpu/attention_walk.h's; this file supplies the
// per-tile arithmetic. A head's accumulators stay in registers across a tile's keys.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/attention_walk.h"
#include "backend/cpu/vec_exp.h"
#include "backend/kv_codec.h"

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

// The row's f16 metadata word i (0: scale, 1: zero point) as f32, by F16C.
float row_meta(const unsigned char* meta, int i) {
  uint16_t h;
  std::memcpy(&h, meta + 2 * i, sizeof(h));
  return _cvtsh_ss(h);
}

// A tile's rows as f32 arrays (f32 cache rows in place, or rows decoded into L1).
struct F32Rows {
  const float* const* rows;
  __m256 load(int64_t i, int64_t c) const { return _mm256_loadu_ps(rows[i] + c); }
  float at(int64_t i, int64_t d) const { return rows[i][d]; }
};

// A tile's rows of kType read where they lie in the cache, each chunk of 8 elements decoded in
// registers to exactly the values decode_kv_row gives: no copy of the tile where a tile serves
// few query heads (tile_in_place), and the conversions decode_rows stores where it serves more.
template <KvDtype kType>
struct EncodedRows {
  const unsigned char* rows[kAttentionTile];
  // Per row: int8's scale and zero point; fp8's scale times kv_fp8_f16_factor.
  float scale[kAttentionTile];
  float zero[kAttentionTile];

  EncodedRows(const std::byte* const* src, int64_t n, int64_t head_dim) {
    const int64_t meta = head_dim * kv_element_bytes(kType);
    for (int64_t i = 0; i < n; ++i) {
      rows[i] = reinterpret_cast<const unsigned char*>(src[i]);
      if constexpr (kType == KvDtype::kInt8) {
        scale[i] = row_meta(rows[i] + meta, 0);
        zero[i] = row_meta(rows[i] + meta, 1);
      } else if constexpr (kType == KvDtype::kFp8E4M3 || kType == KvDtype::kFp8E5M2) {
        scale[i] = row_meta(rows[i] + meta, 0) * kv_fp8_f16_factor(kType);
      }
    }
  }

  __m256 load(int64_t i, int64_t c) const {
    const unsigned char* p = rows[i];
    if constexpr (kType == KvDtype::kF32) {
      return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + c);
    } else if constexpr (kType == KvDtype::kF16) {
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * c)));
    } else if constexpr (kType == KvDtype::kBF16) {
      const __m256i w =
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * c)));
      return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    } else if constexpr (kType == KvDtype::kFp8E4M3 || kType == KvDtype::kFp8E5M2) {
      const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + c)));
      // kv_fp8_to_f16_bits, 8 lanes at once.
      const __m128i h =
          kType == KvDtype::kFp8E5M2
              ? _mm_slli_epi16(b, 8)
              : _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                             _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7));
      return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_broadcast_ss(scale + i));
    } else {
      static_assert(kType == KvDtype::kInt8);
      const __m256 q = _mm256_cvtepi32_ps(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + c))));
      return _mm256_fmadd_ps(q, _mm256_broadcast_ss(scale + i), _mm256_broadcast_ss(zero + i));
    }
  }

  // Element d of row i (the tails of head sizes that are not multiples of 8), as decode_kv_row.
  float at(int64_t i, int64_t d) const {
    const unsigned char* p = rows[i];
    uint16_t h;
    if constexpr (kType == KvDtype::kF32) {
      float x;
      std::memcpy(&x, p + 4 * d, sizeof(x));
      return x;
    } else if constexpr (kType == KvDtype::kF16 || kType == KvDtype::kBF16) {
      std::memcpy(&h, p + 2 * d, sizeof(h));
      if constexpr (kType == KvDtype::kF16) return _cvtsh_ss(h);
      const uint32_t bits = uint32_t{h} << 16;
      float x;
      std::memcpy(&x, &bits, sizeof(x));
      return x;
    } else if constexpr (kType == KvDtype::kFp8E4M3 || kType == KvDtype::kFp8E5M2) {
      return _cvtsh_ss(kv_fp8_to_f16_bits(kType, p[d])) * scale[i];
    } else {
      return std::fma(static_cast<float>(p[d]), scale[i], zero[i]);
    }
  }
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

// `rows` KV rows decoded to f32, 8 elements a vector (EncodedRows' conversions, stored), one
// type's loop over the whole tile (no per-row dispatch): the same values as decode_kv_row (every
// conversion is exact or, for int8, the same single fma), which also decodes the tails of head
// sizes that are not multiples of 8.
template <KvDtype kType>
void decode_rows(const std::byte* const* rows, int64_t n, int64_t head_dim, float* out) {
  const EncodedRows<kType> encoded(rows, n, head_dim);
  const int64_t body = head_dim / kLanes * kLanes;
  for (int64_t r = 0; r < n; ++r, out += head_dim) {
    for (int64_t i = 0; i < body; i += kLanes) _mm256_storeu_ps(out + i, encoded.load(r, i));
    if (body < head_dim) decode_kv_row(kType, rows[r], head_dim, out, body);
  }
}

// Codes of elements [c, c + 16 * n) of a packed row (c a multiple of 64 for 2 bits, of 32 for 4),
// 16 to a vector in element order: n = 4 (2 bits) or 2 (4 bits) vectors.
inline int unpack_codes(const std::byte* row, int64_t c, int bits, __m128i* out) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c * bits / 8));
  if (bits == 2) {
    const __m128i m = _mm_set1_epi8(3);
    const __m128i a0 = _mm_and_si128(v, m), a1 = _mm_and_si128(_mm_srli_epi16(v, 2), m);
    const __m128i a2 = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    const __m128i a3 = _mm_and_si128(_mm_srli_epi16(v, 6), m);
    const __m128i lo01 = _mm_unpacklo_epi8(a0, a1), lo23 = _mm_unpacklo_epi8(a2, a3);
    const __m128i hi01 = _mm_unpackhi_epi8(a0, a1), hi23 = _mm_unpackhi_epi8(a2, a3);
    out[0] = _mm_unpacklo_epi16(lo01, lo23);
    out[1] = _mm_unpackhi_epi16(lo01, lo23);
    out[2] = _mm_unpacklo_epi16(hi01, hi23);
    out[3] = _mm_unpackhi_epi16(hi01, hi23);
    return 4;
  }
  const __m128i m = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
  out[0] = _mm_unpacklo_epi8(lo, hi);
  out[1] = _mm_unpackhi_epi8(lo, hi);
  return 2;
}

inline float f16_at(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);  // F16C: exact, as fp16_to_f32
}

// Scores of keys [0, nt) of a tile of f32 rows into s (padded with -inf to a multiple of 8).
template <class Rows>
void scores_from_rows(const float* q, const Rows& k, int64_t nt, int64_t head_dim, float scale,
                      float* s) {
  const int64_t full = nt / kLanes * kLanes;
  for (int64_t i = 0; i < full; i += kLanes) score8(q, k, i, head_dim, scale, s + i);
  for (int64_t i = full; i < nt; ++i) s[i] = score1(q, k, i, head_dim, scale);
}

// The online-softmax step over a tile's scores s[0, nt): s becomes the weights e (0 past nt, to a
// multiple of 8), and the running maximum and sum move on; returns alpha.
float fold(float* s, int64_t nt, float& run_max, float& run_sum) {
  const int64_t padded = (nt + kLanes - 1) / kLanes * kLanes;
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
  const __m256 vm = _mm256_set1_ps(m_new);
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

// codes[i * head_dim + c]: the codes of rows [first, first + n) of a KIVI group, one byte each;
// params: the group's parameters as f32, as KiviTile lays them out.
void unpack_kivi_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side, const std::byte* group,
                       int64_t first, int64_t n, uint8_t* codes, float* params) {
  const int64_t d = spec.head_dim;
  const int bits = kv_kivi_bits(dtype);
  const int64_t packed = kivi_packed_row_bytes(dtype, d);
  const int64_t runs = kivi_value_channel_groups(spec.block_size, d);
  const std::byte* rows = side == KvSide::kKey ? group + 4 * d : group;
  const int64_t stride = side == KvSide::kKey ? packed : packed + 4 * runs;
  if (side == KvSide::kKey) {
    int64_t c = 0;
    for (; c + kLanes <= 2 * d; c += kLanes)
      _mm256_storeu_ps(
          params + c,
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 2 * c))));
    for (; c < 2 * d; ++c) params[c] = f16_at(group + 2 * c);
  } else {
    for (int64_t r = 0; r < runs; ++r)
      for (int64_t i = 0; i < kAttentionTile; ++i) {
        const std::byte* meta = rows + (first + i) * stride + packed + 4 * r;
        params[2 * r * kAttentionTile + i] = i < n ? f16_at(meta) : 0.0f;
        params[(2 * r + 1) * kAttentionTile + i] = i < n ? f16_at(meta + 2) : 0.0f;
      }
  }
  const int64_t span = bits == 2 ? 64 : 32;  // elements unpack_codes gives at once
  const int64_t wide = d / span * span;
  for (int64_t i = 0; i < n; ++i) {
    const std::byte* row = rows + (first + i) * stride;
    uint8_t* o = codes + i * d;
    for (int64_t c = 0; c < wide; c += span) {
      // Stores written out by count (a loop of k stores became a memcpy call).
      __m128i v[4];
      auto* out = reinterpret_cast<__m128i*>(o + c);
      if (unpack_codes(row, c, bits, v) == 4) {
        _mm_storeu_si128(out, v[0]);
        _mm_storeu_si128(out + 1, v[1]);
        _mm_storeu_si128(out + 2, v[2]);
        _mm_storeu_si128(out + 3, v[3]);
      } else {
        _mm_storeu_si128(out, v[0]);
        _mm_storeu_si128(out + 1, v[1]);
      }
    }
    for (int64_t c = wide; c < d; ++c) o[c] = kivi_unpack_code(row, c, bits);
  }
}

// Sum of the eight int32 lanes of each of a[0..8), lane i of the result (exact).
__m256i hsum8x8_epi32(const __m256i* a) {
  const __m256i t0 = _mm256_hadd_epi32(a[0], a[1]);
  const __m256i t1 = _mm256_hadd_epi32(a[2], a[3]);
  const __m256i t2 = _mm256_hadd_epi32(a[4], a[5]);
  const __m256i t3 = _mm256_hadd_epi32(a[6], a[7]);
  const __m256i u0 = _mm256_hadd_epi32(t0, t1);
  const __m256i u1 = _mm256_hadd_epi32(t2, t3);
  return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                          _mm256_permute2x128_si256(u0, u1, 0x31));
}

// The query's 16-bit key terms against a KIVI key group (attention_kernel.h), 8 at a time: the
// portable kernel's values (the maximum is exact in any order; cvtps rounds to nearest even, as
// nearbyint does).
float key_q16(const KiviTile& t, const float* q, int16_t* q16) {
  const int64_t d = t.spec->head_dim, body = d / kLanes * kLanes;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(INFINITY);
  __m256 vmax = _mm256_setzero_ps();
  int finite = 0xff;
  for (int64_t c = 0; c < body; c += kLanes) {
    const __m256 x = _mm256_and_ps(
        _mm256_mul_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(t.k.params + c)), abs_mask);
    finite &= _mm256_movemask_ps(_mm256_cmp_ps(x, inf, _CMP_LT_OQ));
    vmax = _mm256_max_ps(vmax, x);
  }
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, vmax);
  float m = 0.0f;
  for (float l : lanes) m = std::max(m, l);
  for (int64_t c = body; c < d; ++c) {
    const float x = std::fabs(q[c] * t.k.params[c]);
    if (!(x < INFINITY)) finite = 0;
    m = std::max(m, x);
  }
  if (finite != 0xff || m == 0.0f) {
    std::fill(q16, q16 + d, int16_t{0});
    return finite == 0xff ? 0.0f : NAN;
  }
  const float inv = 32767.0f / m;
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i lo = _mm256_set1_epi32(-32767), hi = _mm256_set1_epi32(32767);
  int64_t c = 0;
  for (; c + 16 <= body; c += 16) {
    __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(
        _mm256_mul_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(t.k.params + c)), vinv));
    __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(
        _mm256_mul_ps(_mm256_loadu_ps(q + c + 8), _mm256_loadu_ps(t.k.params + c + 8)), vinv));
    a = _mm256_min_epi32(_mm256_max_epi32(a, lo), hi);
    b = _mm256_min_epi32(_mm256_max_epi32(b, lo), hi);
    // packs works within 128-bit lanes: put the 16 results back in element order.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q16 + c),
                        _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8));
  }
  for (; c < d; ++c)
    q16[c] = static_cast<int16_t>(
        std::clamp(std::nearbyint(q[c] * t.k.params[c] * inv), -32767.0f, 32767.0f));
  return m / 32767.0f;
}

// The exact integer dot product of 16-bit query terms with key i's codes (any order gives it).
int32_t kivi_key_dot(const KiviTile& t, const int16_t* q16, int64_t i) {
  const int64_t d = t.spec->head_dim, wide = d / 16 * 16;
  __m256i a = _mm256_setzero_si256();
  for (int64_t e = 0; e < wide; e += 16)
    a = _mm256_add_epi32(
        a, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q16 + e)),
                             _mm256_cvtepu8_epi16(_mm_loadu_si128(
                                 reinterpret_cast<const __m128i*>(t.k.codes + i * d + e)))));
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
  h = _mm_hadd_epi32(h, h);
  h = _mm_hadd_epi32(h, h);
  int32_t dot = _mm_cvtsi128_si32(h);
  for (int64_t e = wide; e < d; ++e) dot += int32_t{q16[e]} * t.k.codes[i * d + e];
  return dot;
}

// The query's key terms (q16, its step returned) and its dot product with the group's zero
// points, as the KIVI score of every key of the group needs them.
[[gnu::always_inline]] inline float kivi_query_terms(const KiviTile& t, const float* q,
                                                     int16_t* q16, float& qz) {
  const int64_t d = t.spec->head_dim;
  const float* zeros = t.k.params + d;
  qz = score1(q, F32Rows{&zeros}, 0, d, 1.0f);
  return key_q16(t, q, q16);
}

// The exact integer dot products of Q queries' 16-bit key terms with 8 / Q keys from i: lane
// j * (8 / Q) + k is query j's with key i + k. Each key chunk is loaded and widened once for all
// Q queries (eight accumulators either way).
template <int Q>
[[gnu::always_inline]] inline __m256i kivi_dots(const KiviTile& t, const int16_t* const* q16,
                                                int64_t i) {
  constexpr int K = kLanes / Q;
  const int64_t d = t.spec->head_dim, wide = d / 16 * 16;
  __m256i a[kLanes];
  for (int k = 0; k < kLanes; ++k) a[k] = _mm256_setzero_si256();
  for (int64_t e = 0; e < wide; e += 16) {
    __m256i qv[Q];
    for (int j = 0; j < Q; ++j)
      qv[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q16[j] + e));
    for (int k = 0; k < K; ++k) {
      const __m256i kv = _mm256_cvtepu8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(t.k.codes + (i + k) * d + e)));
      for (int j = 0; j < Q; ++j)
        a[j * K + k] = _mm256_add_epi32(a[j * K + k], _mm256_madd_epi16(qv[j], kv));
    }
  }
  __m256i dots = hsum8x8_epi32(a);
  if (wide < d) {
    alignas(32) int32_t extra[kLanes];
    for (int l = 0; l < kLanes; ++l) {
      extra[l] = 0;
      for (int64_t e = wide; e < d; ++e)
        extra[l] += int32_t{q16[l / K][e]} * t.k.codes[(i + l % K) * d + e];
    }
    dots = _mm256_add_epi32(dots, _mm256_load_si256(reinterpret_cast<const __m256i*>(extra)));
  }
  return dots;
}

// Scores of a tile's KIVI keys (attention_kernel.h) for Q queries over the same keys (t's q16
// scratch holds Q queries' terms): each query's 16-bit terms against each key's codes, an exact
// integer dot product (kivi_dots), then fma(step, dot, q . zero) * scale. The dots are exact, so
// a query's scores are the same bits whatever Q.
template <int Q>
[[gnu::always_inline]] inline void kivi_scores(const KiviTile& t, const float* const* q, int64_t nt,
                                               float scale, float* const* s) {
  constexpr int K = kLanes / Q;
  const int64_t d = t.spec->head_dim;
  const int16_t* q16[Q];
  float step[Q], qz[Q];
  alignas(32) float steps[kLanes], zs[kLanes];
  for (int j = 0; j < Q; ++j) {
    q16[j] = t.q16 + j * d;
    step[j] = kivi_query_terms(t, q[j], t.q16 + j * d, qz[j]);
    for (int k = 0; k < K; ++k) {
      steps[j * K + k] = step[j];
      zs[j * K + k] = qz[j];
    }
  }
  const __m256 vstep = _mm256_load_ps(steps), vqz = _mm256_load_ps(zs);
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + K <= nt; i += K) {
    const __m256 sc = _mm256_mul_ps(
        _mm256_fmadd_ps(vstep, _mm256_cvtepi32_ps(kivi_dots<Q>(t, q16, i)), vqz), vscale);
    if constexpr (Q == 1) {
      _mm256_storeu_ps(s[0] + i, sc);
    } else {
      static_assert(Q == 2);
      _mm_storeu_ps(s[0] + i, _mm256_castps256_ps128(sc));
      _mm_storeu_ps(s[1] + i, _mm256_extractf128_ps(sc, 1));
    }
  }
  for (; i < nt; ++i)
    for (int j = 0; j < Q; ++j)
      s[j][i] = std::fma(step[j], static_cast<float>(kivi_key_dot(t, q16[j], i)), qz[j]) * scale;
}

// Each channel run r's per-key weights (weights[r * kAttentionTile + i] = e[i] x the key's scale
// for the run) and zero term (zero_terms[r]: the weights e against the keys' zero points), over
// the keys padded to whole vectors (fold made their weights 0, and their parameters are 0).
void kivi_value_terms(const KiviTile& t, const float* e, int64_t nt, float* weights,
                      float* zero_terms) {
  const int64_t runs = kivi_value_channel_groups(t.spec->block_size, t.spec->head_dim);
  const int64_t padded = (nt + kLanes - 1) / kLanes * kLanes;
  for (int64_t r = 0; r < runs; ++r) {
    const float* scales = t.v.params + 2 * r * kAttentionTile;
    const float* zeros = scales + kAttentionTile;
    __m256 lanes = _mm256_setzero_ps();
    for (int64_t i = 0; i < padded; i += kLanes) {
      const __m256 ei = _mm256_loadu_ps(e + i);
      _mm256_storeu_ps(weights + r * kAttentionTile + i,
                       _mm256_mul_ps(ei, _mm256_loadu_ps(scales + i)));
      lanes = _mm256_fmadd_ps(ei, _mm256_loadu_ps(zeros + i), lanes);
    }
    zero_terms[r] = tree8(lanes);
  }
}

// Eight channels' codes of key i from channel c, as floats.
__m256 kivi_codes8(const uint8_t* codes, int64_t d, int64_t i, int64_t c) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i * d + c))));
}

// A tile's KIVI value codes as Rows (accumulate_partials): row j's eight channels from c,
// widened to floats.
struct KiviCodeRows {
  const uint8_t* codes;
  int64_t d;
  __m256 load(int64_t j, int64_t c) const { return kivi_codes8(codes, d, j, c); }
};

void kivi_values(const KiviTile& t, const float* e, int64_t nt, float alpha, float* acc) {
  const int64_t d = t.spec->head_dim, body = d / kLanes * kLanes;
  const int64_t width = std::min(t.spec->block_size, d);
  kivi_value_terms(t, e, nt, t.weights, t.zero_terms);
  const __m256 valpha = _mm256_set1_ps(alpha);
  auto codes8 = [&](int64_t i, int64_t c) { return kivi_codes8(t.v.codes, d, i, c); };
  // Chunks of 8 channels; a chunk lies within one run when runs are multiples of 8 (a single run
  // otherwise: width = d).
  int64_t c = 0;
  for (; c + 16 <= body && width % 8 == 0; c += 16) {
    const int64_t r0 = c / width, r1 = (c + 8) / width;
    __m256 u[4][2];
    for (auto& ur : u) ur[0] = ur[1] = _mm256_setzero_ps();
    int64_t i = 0;
    // Key k into partial sum R; R is a constant so the partial sums stay in registers.
    auto step = [&](int64_t k, auto R) {
      u[R][0] = _mm256_fmadd_ps(_mm256_broadcast_ss(t.weights + r0 * kAttentionTile + k),
                                codes8(k, c), u[R][0]);
      u[R][1] = _mm256_fmadd_ps(_mm256_broadcast_ss(t.weights + r1 * kAttentionTile + k),
                                codes8(k, c + 8), u[R][1]);
    };
    using R0 = std::integral_constant<int, 0>;
    using R1 = std::integral_constant<int, 1>;
    using R2 = std::integral_constant<int, 2>;
    using R3 = std::integral_constant<int, 3>;
    for (; i + 4 <= nt; i += 4) {
      step(i, R0{});
      step(i + 1, R1{});
      step(i + 2, R2{});
      step(i + 3, R3{});
    }
    if (i < nt) step(i, R0{});
    if (i + 1 < nt) step(i + 1, R1{});
    if (i + 2 < nt) step(i + 2, R2{});
    for (int k = 0; k < 2; ++k) {
      const __m256 pv = _mm256_add_ps(
          _mm256_add_ps(_mm256_add_ps(u[0][k], u[1][k]), _mm256_add_ps(u[2][k], u[3][k])),
          _mm256_broadcast_ss(t.zero_terms + (k == 0 ? r0 : r1)));
      _mm256_storeu_ps(acc + c + 8 * k,
                       _mm256_fmadd_ps(_mm256_loadu_ps(acc + c + 8 * k), valpha, pv));
    }
  }
  for (; c + 8 <= body && (c % width) + 8 <= width; c += 8) {
    const int64_t r0 = c / width;
    __m256 u[4];
    for (auto& ur : u) ur = _mm256_setzero_ps();
    for (int64_t i = 0; i < nt; ++i)
      u[i % 4] = _mm256_fmadd_ps(_mm256_broadcast_ss(t.weights + r0 * kAttentionTile + i),
                                 codes8(i, c), u[i % 4]);
    const __m256 pv =
        _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(u[0], u[1]), _mm256_add_ps(u[2], u[3])),
                      _mm256_broadcast_ss(t.zero_terms + r0));
    _mm256_storeu_ps(acc + c, _mm256_fmadd_ps(_mm256_loadu_ps(acc + c), valpha, pv));
  }
  for (; c < d; ++c) {
    const int64_t r = c / width;
    float u[4] = {};
    for (int64_t i = 0; i < nt; ++i)
      u[i % 4] = std::fma(t.weights[r * kAttentionTile + i],
                          static_cast<float>(t.v.codes[i * d + c]), u[i % 4]);
    acc[c] = std::fma(acc[c], alpha, ((u[0] + u[1]) + (u[2] + u[3])) + t.zero_terms[r]);
  }
}

// kivi_values for two queries over the same keys (t's second scratch half holds query 1's
// weights and zero terms), through accumulate_partials: each chunk's codes widened once for both.
// Chunks go 32 channels at a time, then 16, then 8: a chunk group
// never straddles two channel runs (several runs are each a KIVI group size wide, a multiple of
// 32; otherwise there is one run).
void kivi_values2(const KiviTile& t, const float* const* e, int64_t nt, const float* alpha,
                  float* const* acc) {
  const int64_t d = t.spec->head_dim, body = d / kLanes * kLanes;
  const int64_t width = std::min(t.spec->block_size, d);
  const int64_t runs = kivi_value_channel_groups(t.spec->block_size, d);
  float* weights[2] = {t.weights, t.weights + runs * kAttentionTile};
  float* zero_terms[2] = {t.zero_terms, t.zero_terms + runs};
  for (int q = 0; q < 2; ++q) kivi_value_terms(t, e[q], nt, weights[q], zero_terms[q]);
  auto chunks = [&](auto n_chunks, int64_t c) {
    const int64_t r = c / width;
    const float* w[2] = {weights[0] + r * kAttentionTile, weights[1] + r * kAttentionTile};
    const float z[2] = {zero_terms[0][r], zero_terms[1][r]};
    accumulate_partials<2, decltype(n_chunks)::value>(w, KiviCodeRows{t.v.codes, d}, nt, c, alpha,
                                                      acc, z);
  };
  int64_t c = 0;
  for (; c + 4 * kLanes <= body; c += 4 * kLanes) chunks(std::integral_constant<int, 4>{}, c);
  if (c + 2 * kLanes <= body) {
    chunks(std::integral_constant<int, 2>{}, c);
    c += 2 * kLanes;
  }
  if (c + kLanes <= body) {
    chunks(std::integral_constant<int, 1>{}, c);
    c += kLanes;
  }
  for (int q = 0; q < 2; ++q)
    for (int64_t ch = c; ch < d; ++ch) {
      const int64_t r = ch / width;
      float u[4] = {};
      for (int64_t i = 0; i < nt; ++i)
        u[i % 4] = std::fma(weights[q][r * kAttentionTile + i],
                            static_cast<float>(t.v.codes[i * d + ch]), u[i % 4]);
      acc[q][ch] =
          std::fma(acc[q][ch], alpha[q], ((u[0] + u[1]) + (u[2] + u[3])) + zero_terms[q][r]);
    }
}

// Calls f with the tile's n rows of `dtype` as EncodedRows (a row type; KIVI groups never come
// here).
template <class F>
void with_encoded_rows(KvDtype dtype, const std::byte* const* src, int64_t n, int64_t head_dim,
                       F&& f) {
  switch (dtype) {
    case KvDtype::kF32:
      return f(EncodedRows<KvDtype::kF32>(src, n, head_dim));
    case KvDtype::kF16:
      return f(EncodedRows<KvDtype::kF16>(src, n, head_dim));
    case KvDtype::kBF16:
      return f(EncodedRows<KvDtype::kBF16>(src, n, head_dim));
    case KvDtype::kFp8E4M3:
      return f(EncodedRows<KvDtype::kFp8E4M3>(src, n, head_dim));
    case KvDtype::kFp8E5M2:
      return f(EncodedRows<KvDtype::kFp8E5M2>(src, n, head_dim));
    case KvDtype::kInt8:
      return f(EncodedRows<KvDtype::kInt8>(src, n, head_dim));
    case KvDtype::kKivi2:
    case KvDtype::kKivi4:
      break;
  }
  VESPER_CHECK(false, "attention: %s rows are stored in groups",
               std::string(kv_dtype_name(dtype)).c_str());
}

struct Avx2Tile {
  static void decode(KvDtype dtype, const std::byte* const* rows, int64_t n, int64_t head_dim,
                     float* out) {
    switch (dtype) {
      case KvDtype::kF16:
        return decode_rows<KvDtype::kF16>(rows, n, head_dim, out);
      case KvDtype::kBF16:
        return decode_rows<KvDtype::kBF16>(rows, n, head_dim, out);
      case KvDtype::kFp8E4M3:
        return decode_rows<KvDtype::kFp8E4M3>(rows, n, head_dim, out);
      case KvDtype::kFp8E5M2:
        return decode_rows<KvDtype::kFp8E5M2>(rows, n, head_dim, out);
      case KvDtype::kInt8:
        return decode_rows<KvDtype::kInt8>(rows, n, head_dim, out);
      case KvDtype::kF32:
      case KvDtype::kKivi2:  // never a row type (the walk decodes groups)
      case KvDtype::kKivi4:
        break;
    }
    for (int64_t i = 0; i < n; ++i) decode_kv_row(dtype, rows[i], head_dim, out + i * head_dim);
  }

  // Rows [first, first + n) of a row type's group (its rows; KIVI groups go through
  // unpack_group and kivi_tile instead).
  static void decode_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
                           const std::byte* group, int64_t first, int64_t n, float* out) {
    if (kv_is_kivi(dtype)) return decode_kv_group_rows(spec, dtype, side, group, first, n, out);
    const std::byte* rows[kAttentionTile];
    const int64_t row = spec.row_bytes(dtype);
    for (int64_t i = 0; i < n; ++i) rows[i] = group + (first + i) * row;
    decode(dtype, rows, n, spec.head_dim, out);
  }

  static void tile(const float* q, const float* const* k_rows, const float* const* v_rows,
                   int64_t nt, int64_t head_dim, float scale, float* s, float* acc, float& run_max,
                   float& run_sum) {
    scores_from_rows(q, F32Rows{k_rows}, nt, head_dim, scale, s);
    const float alpha = fold(s, nt, run_max, run_sum);
    const float* e[1] = {s};
    accumulate_queries<1>(e, F32Rows{v_rows}, nt, head_dim, &alpha, &acc);
  }

  // tile() for two queries over the same keys: each key and value chunk is loaded once for both.
  static void tile2(const float* const* q, const float* const* k_rows, const float* const* v_rows,
                    int64_t nt, int64_t head_dim, float scale, float* const* acc,
                    float* const* run_max, float* const* run_sum) {
    alignas(32) float s0[kAttentionTile], s1[kAttentionTile];
    scores2_from_rows(q[0], q[1], F32Rows{k_rows}, nt, head_dim, scale, s0, s1);
    float alpha[2];
    fold2(s0, s1, nt, run_max, run_sum, alpha);
    const float* e[2] = {s0, s1};
    accumulate_queries<2>(e, F32Rows{v_rows}, nt, head_dim, alpha, acc);
  }

  // Conversions of one instruction (f16 by F16C, bf16 by a shift) cost less than a decoded
  // copy's store and reload up to 4 heads (4 x 8 KV heads at the 1B model's shape:
  // `vesper_microbench`'s BM_PagedAttentionDecode); int8's and fp8's take 3 to 6, so a copy pays
  // from the second head on.
  static int64_t in_place_heads(KvDtype dtype) {
    return dtype == KvDtype::kF32 || dtype == KvDtype::kF16 || dtype == KvDtype::kBF16 ? 4 : 1;
  }

  // tile() over rows read where they lie (EncodedRows), for a tile that serves few query heads.
  static void tile_in_place(KvDtypes rows, int64_t d, const float* q, const std::byte* const* k_src,
                            const std::byte* const* v_src, int64_t nt, float scale, float* s,
                            float* acc, float& run_max, float& run_sum) {
    with_encoded_rows(rows.k, k_src, nt, d,
                      [&](const auto& k) { scores_from_rows(q, k, nt, d, scale, s); });
    const float alpha = fold(s, nt, run_max, run_sum);
    with_encoded_rows(rows.v, v_src, nt, d,
                      [&](const auto& v) { accumulate_rows(s, v, nt, d, alpha, acc); });
  }

  // tile_in_place() for two query heads over the same rows (a grouped-query decode token): each
  // chunk read, and decoded, once for both.
  static void tile2_in_place(KvDtypes rows, int64_t d, const float* const* q,
                             const std::byte* const* k_src, const std::byte* const* v_src,
                             int64_t nt, float scale, float* const* acc, float* const* run_max,
                             float* const* run_sum) {
    alignas(32) float s0[kAttentionTile], s1[kAttentionTile];
    with_encoded_rows(rows.k, k_src, nt, d, [&](const auto& k) {
      scores2_from_rows(q[0], q[1], k, nt, d, scale, s0, s1);
    });
    float alpha[2];
    fold2(s0, s1, nt, run_max, run_sum, alpha);
    const float* e[2] = {s0, s1};
    with_encoded_rows(rows.v, v_src, nt, d,
                      [&](const auto& v) { accumulate_queries<2>(e, v, nt, d, alpha, acc); });
  }

  static void unpack_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
                           const std::byte* group, int64_t first, int64_t n, uint8_t* codes,
                           float* params) {
    unpack_kivi_group(spec, dtype, side, group, first, n, codes, params);
  }

  static void kivi_tile(const KiviTile& t, const float* q, int64_t nt, float scale, float* s,
                        float* acc, float& run_max, float& run_sum) {
    const int64_t d = t.spec->head_dim;
    if (t.k.codes != nullptr)
      kivi_scores<1>(t, &q, nt, scale, &s);
    else
      scores_from_rows(q, F32Rows{t.k.rows}, nt, d, scale, s);
    const float alpha = fold(s, nt, run_max, run_sum);
    if (t.v.codes == nullptr) return accumulate_rows(s, F32Rows{t.v.rows}, nt, d, alpha, acc);
    kivi_values(t, s, nt, alpha, acc);
  }

  // kivi_tile() for two queries over the same keys: each key's and value's codes widened once
  // for both.
  static void kivi_tile2(const KiviTile& t, const float* const* q, int64_t nt, float scale,
                         float* const* acc, float* const* run_max, float* const* run_sum) {
    const int64_t d = t.spec->head_dim;
    alignas(32) float s0[kAttentionTile], s1[kAttentionTile];
    float* s[2] = {s0, s1};
    if (t.k.codes != nullptr)
      kivi_scores<2>(t, q, nt, scale, s);
    else
      scores2_from_rows(q[0], q[1], F32Rows{t.k.rows}, nt, d, scale, s0, s1);
    float alpha[2];
    fold2(s0, s1, nt, run_max, run_sum, alpha);
    const float* e[2] = {s0, s1};
    if (t.v.codes == nullptr) return accumulate_queries<2>(e, F32Rows{t.v.rows}, nt, d, alpha, acc);
    kivi_values2(t, e, nt, alpha, acc);
  }

  static void finish(const float* acc, float run_sum, int64_t head_dim, float* out) {
    const float inv = 1.0f / run_sum;
    const __m256 vinv = _mm256_set1_ps(inv);
    int64_t d = 0;
    for (; d + kLanes <= head_dim; d += kLanes)
      _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), vinv));
    for (; d < head_dim; ++d) out[d] = acc[d] * inv;
  }
};

}  // namespace

void paged_attention_avx2(const AttentionArgs& args, int64_t begin, int64_t end, float* scratch) {
  attend_items<Avx2Tile>(args, begin, end, scratch);
}

}  // namespace vesper::backend::cpu
