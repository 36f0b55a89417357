// The AVX2 arithmetic of paged attention over a tile of a KIVI group (attention_kernel.h's
// contract, attention_walk_tiles.h's KiviTile): unpacking a group's 2- or 4-bit codes and
// parameters, the keys' scores as exact integer dot products of the query's 16-bit terms with the
// codes, and the values' weighted sums per channel run from the codes (through
// attention_avx2_rows.h's accumulate_partials for two queries). attention_avx2_tile.h's tile
// calls these.
//
// Include only from attention_avx2_tile.h (its flags; see attention_avx2_rows.h).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/attention_avx2_rows.h"
#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/attention_walk_tiles.h"
#include "backend/kv_codec.h"

namespace vesper::backend::cpu {
namespace {

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

}  // namespace
}  // namespace vesper::backend::cpu
