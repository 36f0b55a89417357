// The AVX2 KIVI group encoder: the f16 rows widened by F16C, each run's smallest and largest finite
// values found 8 lanes at a time, its parameters by the shared rule (kivi_run_params), the codes
// divided, clamped and rounded 8 at a time, and packed 32 at a time. Every step is the portable
// encoder's arithmetic (the same IEEE division, round to nearest even, min/max keeping the first
// of equal values), so the bytes are identical.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/kv_codec_cpu.h"
#include "backend/kv_codec.h"
#include "core/fp16.h"

namespace vesper::backend::cpu {
namespace {

constexpr int kLanes = 8;

float f16_at(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

void store_f16(std::byte* p, uint16_t h) {
  std::memcpy(p, &h, sizeof(h));
}

// Codes of 8 values with per-lane parameters: max(v, 0) turns a NaN into 0 (the second operand
// wins), min(., levels) clamps, cvtps rounds to nearest even.
__m256i codes8(__m256 x, __m256 zero, __m256 scale, __m256 levels) {
  const __m256 v = _mm256_div_ps(_mm256_sub_ps(x, zero), scale);
  const __m256 c = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), levels);
  const __m256i q = _mm256_cvtps_epi32(c);
  // scale 0: every code 0 (the quotient above is then meaningless).
  const __m256 zero_scale = _mm256_cmp_ps(scale, _mm256_setzero_ps(), _CMP_EQ_OQ);
  return _mm256_andnot_si256(_mm256_castps_si256(zero_scale), q);
}

// Stores 8 codes (int32 lanes, 0..15) as 8 bytes.
void store_codes8(__m256i q, uint8_t* out) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  const __m128i w = _mm_packs_epi32(lo, hi);
  _mm_storel_epi64(reinterpret_cast<__m128i*>(out), _mm_packus_epi16(w, w));
}

// Packs codes[0, n) of `bits` bits into a zeroed row (element c at bit c * bits).
void pack_row(const uint8_t* codes, int64_t n, int bits, std::byte* row) {
  int64_t c = 0;
  if (bits == 2) {
    const __m256i w1 = _mm256_set1_epi16(0x0401);      // bytes 1, 4: c0 + 4 c1
    const __m256i w2 = _mm256_set1_epi32(0x00100001);  // words 1, 16: + 16 (c2 + 4 c3)
    for (; c + 32 <= n; c += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + c));
      const __m256i b = _mm256_madd_epi16(_mm256_maddubs_epi16(v, w1), w2);  // 8 bytes as int32
      const __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
      const __m128i u = _mm_packus_epi16(p, p);
      std::memcpy(row + c / 4, &u, 8);
    }
  } else {
    const __m256i w1 = _mm256_set1_epi16(0x1001);  // bytes 1, 16: c0 + 16 c1
    for (; c + 32 <= n; c += 32) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + c));
      const __m256i b = _mm256_maddubs_epi16(v, w1);  // 16 bytes as int16
      const __m128i u = _mm_packus_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
      std::memcpy(row + c / 2, &u, 16);
    }
  }
  kivi_pack_codes(codes, c, n, bits, row);
}

// Per lane l < 8, the smallest and largest finite value of x[i * stride + l] over i < n, in order
// of i, as std::min / std::max keep them: min(v, lo) keeps lo unless v < lo, likewise max.
void lane_ranges(const float* x, int64_t n, int64_t stride, float* lo_out, float* hi_out) {
  const __m256 inf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 lo = inf, hi = ninf;
  for (int64_t i = 0; i < n; ++i) {
    const __m256 v = _mm256_loadu_ps(x + i * stride);
    const __m256 finite = _mm256_cmp_ps(_mm256_and_ps(v, abs_mask), inf, _CMP_LT_OQ);
    lo = _mm256_min_ps(_mm256_blendv_ps(inf, v, finite), lo);
    hi = _mm256_max_ps(_mm256_blendv_ps(ninf, v, finite), hi);
  }
  _mm256_store_ps(lo_out, lo);
  _mm256_store_ps(hi_out, hi);
}

}  // namespace

void encode_f16_row_avx2(const float* x, int64_t n, std::byte* row) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(row + 2 * i), h);
    // F16C keeps a NaN's payload; the portable rule stores a bare quiet NaN. Rare: per element.
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)) != 0)
      for (int64_t k = i; k < i + kLanes; ++k) store_f16(row + 2 * k, f32_to_fp16(x[k]));
  }
  for (; i < n; ++i) store_f16(row + 2 * i, f32_to_fp16(x[i]));
}

void encode_kivi_group_avx2(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
                            const std::byte* const* rows, std::byte* group) {
  const int64_t g = spec.block_size, d = spec.head_dim, body = d / kLanes * kLanes;
  const int bits = kv_kivi_bits(dtype), levels = (1 << bits) - 1;
  const int64_t packed = kivi_packed_row_bytes(dtype, d);
  std::memset(group, 0, static_cast<size_t>(spec.group_bytes(dtype, side)));
  thread_local std::vector<float> x;
  thread_local std::vector<uint8_t> codes;
  x.resize(static_cast<size_t>(g * d));
  codes.resize(static_cast<size_t>(g * d) + 32);
  for (int64_t i = 0; i < g; ++i) {
    float* o = x.data() + i * d;
    int64_t c = 0;
    for (; c < body; c += kLanes)
      _mm256_storeu_ps(
          o + c,
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[i] + 2 * c))));
    for (; c < d; ++c) o[c] = f16_at(rows[i] + 2 * c);
  }
  const __m256 vlevels = _mm256_set1_ps(static_cast<float>(levels));
  if (side == KvSide::kKey) {
    // Per channel over the tokens: 8 channels a vector, tokens in order within each lane.
    thread_local std::vector<KiviRunParams> params;
    params.resize(static_cast<size_t>(d));
    int64_t c = 0;
    for (; c < body; c += kLanes) {
      alignas(32) float l[kLanes], h[kLanes];
      lane_ranges(x.data() + c, g, d, l, h);
      for (int k = 0; k < kLanes; ++k) params[c + k] = kivi_run_params(l[k], h[k], levels);
    }
    for (; c < d; ++c) {
      float lo, hi;
      kivi_finite_range(x.data() + c, g, d, lo, hi);
      params[c] = kivi_run_params(lo, hi, levels);
    }
    alignas(32) float zeros[512], scales[512];
    const bool vector_codes = d <= 512;
    for (int64_t e = 0; e < d; ++e) {
      store_f16(group + 2 * e, params[e].scale_bits);
      store_f16(group + 2 * (d + e), params[e].zero_bits);
      if (vector_codes) {
        zeros[e] = params[e].zero;
        scales[e] = params[e].scale;
      }
    }
    std::byte* out_rows = group + 4 * d;
    for (int64_t i = 0; i < g; ++i) {
      uint8_t* q = codes.data() + i * d;
      int64_t e = 0;
      for (; vector_codes && e < body; e += kLanes)
        store_codes8(codes8(_mm256_loadu_ps(x.data() + i * d + e), _mm256_loadu_ps(zeros + e),
                            _mm256_loadu_ps(scales + e), vlevels),
                     q + e);
      for (; e < d; ++e) q[e] = kivi_code(x[i * d + e], params[e], levels);
      pack_row(q, d, bits, out_rows + i * packed);
    }
    return;
  }
  // Values: per token, over runs of min(G, D) channels.
  const int64_t runs = kivi_value_channel_groups(g, d);
  const int64_t row_bytes = packed + 4 * runs;
  for (int64_t i = 0; i < g; ++i) {
    std::byte* row = group + i * row_bytes;
    uint8_t* q = codes.data() + i * d;
    const float* xi = x.data() + i * d;
    for (int64_t r = 0; r < runs; ++r) {
      const int64_t c0 = r * g, n = std::min(g, d - c0), vec = n / kLanes * kLanes;
      float lo = INFINITY, hi = -INFINITY;
      if (vec > 0) {
        alignas(32) float l[kLanes], h[kLanes];
        lane_ranges(xi + c0, vec / kLanes, kLanes, l, h);
        for (int k = 0; k < kLanes; ++k) {
          lo = std::min(lo, l[k]);
          hi = std::max(hi, h[k]);
        }
        for (int64_t e = vec; e < n; ++e)
          if (std::isfinite(xi[c0 + e])) {
            lo = std::min(lo, xi[c0 + e]);
            hi = std::max(hi, xi[c0 + e]);
          }
        // Lanes reorder the elements: when an extreme is a zero, its sign is the first zero's
        // in element order, which only the sequential scan knows.
        if (lo == 0.0f || hi == 0.0f) kivi_finite_range(xi + c0, n, 1, lo, hi);
      } else {
        kivi_finite_range(xi + c0, n, 1, lo, hi);
      }
      const KiviRunParams p = kivi_run_params(lo, hi, levels);
      store_f16(row + packed + 4 * r, p.scale_bits);
      store_f16(row + packed + 4 * r + 2, p.zero_bits);
      const __m256 vz = _mm256_set1_ps(p.zero), vs = _mm256_set1_ps(p.scale);
      int64_t e = 0;
      for (; e < vec; e += kLanes)
        store_codes8(codes8(_mm256_loadu_ps(xi + c0 + e), vz, vs, vlevels), q + c0 + e);
      for (; e < n; ++e) q[c0 + e] = kivi_code(xi[c0 + e], p, levels);
    }
    pack_row(q, d, bits, row);
  }
}

}  // namespace vesper::backend::cpu
