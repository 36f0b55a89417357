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

// tree8 of eight vectors at once: lane i of the result is tree8(a[i]).
__m256 tree8x8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]);
  const __m256 t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]);
  const __m256 t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1);
  const __m256 u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Scores of keys k[0..8) against q into s[0..8): eight independent FMA chains.
void score8(const float* q, const float* const* k, int64_t head_dim, float scale, float* s) {
  __m256 a[kLanes];
  for (int i = 0; i < kLanes; ++i) a[i] = _mm256_setzero_ps();
  const int64_t body = head_dim / kLanes * kLanes;
  for (int64_t c = 0; c < body; c += kLanes) {
    const __m256 qc = _mm256_loadu_ps(q + c);
    for (int i = 0; i < kLanes; ++i) a[i] = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k[i] + c), a[i]);
  }
  __m256 sum = tree8x8(a);
  if (body != head_dim) {
    alignas(32) float tmp[kLanes];
    _mm256_store_ps(tmp, sum);
    for (int i = 0; i < kLanes; ++i)
      for (int64_t d = body; d < head_dim; ++d) tmp[i] = std::fma(q[d], k[i][d], tmp[i]);
    sum = _mm256_load_ps(tmp);
  }
  _mm256_storeu_ps(s, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
}

float score1(const float* q, const float* k, int64_t head_dim, float scale) {
  __m256 a = _mm256_setzero_ps();
  const int64_t body = head_dim / kLanes * kLanes;
  for (int64_t c = 0; c < body; c += kLanes)
    a = _mm256_fmadd_ps(_mm256_loadu_ps(q + c), _mm256_loadu_ps(k + c), a);
  float s = tree8(a);
  for (int64_t d = body; d < head_dim; ++d) s = std::fma(q[d], k[d], s);
  return s * scale;
}

// Over chunks [c, c + 8 * N): the tile's weighted values in four partial sums (key i goes to
// u[i % 4]), then acc = fma(acc, alpha, (u0 + u1) + (u2 + u3)). 4 x N independent FMA chains hide
// the FMA latency even when head_dim is a single vector.
template <int N>
void accumulate_chunks(float* acc, int64_t c, __m256 alpha, const float* e, const float* const* v,
                       int64_t n) {
  __m256 u[4][N];
  for (int r = 0; r < 4; ++r)
    for (int k = 0; k < N; ++k) u[r][k] = _mm256_setzero_ps();
  // Key i + R into partial sum R; R is a constant so the partial sums stay in registers.
  auto step = [&](int64_t i, auto R) {
    const __m256 ei = _mm256_broadcast_ss(e + i);
    for (int k = 0; k < N; ++k)
      u[R][k] = _mm256_fmadd_ps(ei, _mm256_loadu_ps(v[i] + c + 8 * k), u[R][k]);
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

// The row's f16 metadata word i (0: scale, 1: zero point) as f32, by F16C.
float row_meta(const unsigned char* meta, int i) {
  uint16_t h;
  std::memcpy(&h, meta + 2 * i, sizeof(h));
  return _cvtsh_ss(h);
}

// `rows` KV rows decoded to f32, 8 elements a vector, one type's loop over the whole tile (no
// per-row dispatch): the same values as decode_kv_row (every conversion is exact or, for int8,
// the same single fma), which also decodes the tails of head sizes that are not multiples of 8.
template <KvDtype kType>
void decode_rows(const std::byte* const* rows, int64_t n, int64_t head_dim, float* out) {
  const int64_t body = head_dim / kLanes * kLanes;
  const int64_t meta = head_dim * kv_element_bytes(kType);
  for (int64_t r = 0; r < n; ++r, out += head_dim) {
    const auto* p = reinterpret_cast<const unsigned char*>(rows[r]);
    if constexpr (kType == KvDtype::kF16) {
      for (int64_t i = 0; i < body; i += kLanes)
        _mm256_storeu_ps(
            out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i))));
    } else if constexpr (kType == KvDtype::kBF16) {
      for (int64_t i = 0; i < body; i += kLanes) {
        const __m256i w =
            _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
        _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
      }
    } else if constexpr (kType == KvDtype::kFp8E4M3 || kType == KvDtype::kFp8E5M2) {
      const __m256 scale = _mm256_set1_ps(row_meta(p + meta, 0) * kv_fp8_f16_factor(kType));
      for (int64_t i = 0; i < body; i += kLanes) {
        const __m128i b =
            _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + i)));
        // kv_fp8_to_f16_bits, 8 lanes at once.
        const __m128i h =
            kType == KvDtype::kFp8E5M2
                ? _mm_slli_epi16(b, 8)
                : _mm_or_si128(_mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x80)), 8),
                               _mm_slli_epi16(_mm_and_si128(b, _mm_set1_epi16(0x7F)), 7));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(h), scale));
      }
    } else if constexpr (kType == KvDtype::kInt8) {
      const __m256 scale = _mm256_set1_ps(row_meta(p + meta, 0));
      const __m256 zero = _mm256_set1_ps(row_meta(p + meta, 1));
      for (int64_t i = 0; i < body; i += kLanes) {
        const __m256 q = _mm256_cvtepi32_ps(
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + i))));
        _mm256_storeu_ps(out + i, _mm256_fmadd_ps(q, scale, zero));
      }
    }
    if (body < head_dim) decode_kv_row(kType, rows[r], head_dim, out, body);
  }
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

  static void tile(const float* q, const float* const* k_rows, const float* const* v_rows,
                   int64_t nt, int64_t head_dim, float scale, float* s, float* acc, float& run_max,
                   float& run_sum) {
    const int64_t body = head_dim / kLanes * kLanes;
    const int64_t full = nt / kLanes * kLanes;
    const int64_t padded = (nt + kLanes - 1) / kLanes * kLanes;
    for (int64_t i = 0; i < full; i += kLanes) score8(q, k_rows + i, head_dim, scale, s + i);
    for (int64_t i = full; i < nt; ++i) s[i] = score1(q, k_rows[i], head_dim, scale);
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

    const __m256 valpha = _mm256_set1_ps(alpha);
    int64_t c = 0;
    for (; c + 16 <= body; c += 16) accumulate_chunks<2>(acc, c, valpha, s, v_rows, nt);
    for (; c < body; c += 8) accumulate_chunks<1>(acc, c, valpha, s, v_rows, nt);
    for (int64_t d = body; d < head_dim; ++d) {
      float u[4] = {};
      for (int64_t i = 0; i < nt; ++i) u[i % 4] = std::fma(s[i], v_rows[i][d], u[i % 4]);
      acc[d] = std::fma(acc[d], alpha, (u[0] + u[1]) + (u[2] + u[3]));
    }
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
