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

// KIVI codes of 8 consecutive elements as 8 bytes: 2-bit elements from 2 bytes, 4-bit from 4
// (element c at bit c * bits, little endian), through per-byte tables built at compile time (no
// static initializer runs in this file, which is compiled for AVX2 but linked into every build).
struct KiviLanes {
  uint32_t two[256];   // a byte's four 2-bit codes, one per byte
  uint16_t four[256];  // a byte's two 4-bit codes, one per byte
};
constexpr KiviLanes make_kivi_lanes() {
  KiviLanes t{};
  for (unsigned b = 0; b < 256; ++b) {
    t.two[b] = (b & 3u) | ((b >> 2) & 3u) << 8 | ((b >> 4) & 3u) << 16 | (b >> 6) << 24;
    t.four[b] = static_cast<uint16_t>((b & 15u) | (b >> 4) << 8);
  }
  return t;
}
constexpr KiviLanes kKiviLanes = make_kivi_lanes();

// Elements [c, c + 8) of a packed KIVI row as f32 codes.
inline __m256 kivi_codes8(const std::byte* row, int64_t c, int bits) {
  const auto* p = reinterpret_cast<const uint8_t*>(row);
  uint64_t v;
  if (bits == 2) {
    const uint8_t* q = p + c / 4;
    v = uint64_t{kKiviLanes.two[q[0]]} | uint64_t{kKiviLanes.two[q[1]]} << 32;
  } else {
    const uint8_t* q = p + c / 2;
    v = uint64_t{kKiviLanes.four[q[0]]} | uint64_t{kKiviLanes.four[q[1]]} << 16 |
        uint64_t{kKiviLanes.four[q[2]]} << 32 | uint64_t{kKiviLanes.four[q[3]]} << 48;
  }
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(v))));
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

// fma(code, scale, zero) for 16 codes, into o[0, 16).
inline void emit16(__m128i codes, __m256 s0, __m256 z0, __m256 s1, __m256 z1, float* o) {
  _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)), s0, z0));
  _mm256_storeu_ps(
      o + 8,
      _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))), s1, z1));
}

inline float f16_at(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);  // F16C: exact, as fp16_to_f32
}

// decode_kv_group_rows for KIVI groups, 8 elements at a time: fma(code, scale, zero) as the
// portable decoder computes it, so the values are the same bits.
void decode_kivi_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side, const std::byte* group,
                       int64_t first, int64_t n, float* out) {
  const int64_t g = spec.block_size, d = spec.head_dim, body = d / kLanes * kLanes;
  const int bits = kv_kivi_bits(dtype);
  const int64_t packed = kivi_packed_row_bytes(dtype, d);
  if (side == KvSide::kKey) {
    // Per-channel scales and zero points, widened once for the tile.
    alignas(32) float scale[512], zero[512];
    if (d > 512) return decode_kv_group_rows(spec, dtype, side, group, first, n, out);
    int64_t c0 = 0;
    for (; c0 + kLanes <= d; c0 += kLanes) {
      _mm256_store_ps(
          scale + c0,
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 2 * c0))));
      _mm256_store_ps(
          zero + c0,
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 2 * (d + c0)))));
    }
    for (; c0 < d; ++c0) {
      scale[c0] = f16_at(group + 2 * c0);
      zero[c0] = f16_at(group + 2 * (d + c0));
    }
    const std::byte* rows = group + 4 * d;
    const int64_t span = bits == 2 ? 64 : 32;  // elements unpack_codes gives at once
    const int64_t wide = d / span * span;
    for (int64_t i = 0; i < n; ++i) {
      const std::byte* row = rows + (first + i) * packed;
      float* o = out + i * d;
      for (int64_t c = 0; c < wide; c += span) {
        __m128i codes[4];
        const int k = unpack_codes(row, c, bits, codes);
        for (int j = 0; j < k; ++j) {
          const int64_t e = c + 16 * j;
          emit16(codes[j], _mm256_load_ps(scale + e), _mm256_load_ps(zero + e),
                 _mm256_load_ps(scale + e + 8), _mm256_load_ps(zero + e + 8), o + e);
        }
      }
      for (int64_t c = wide; c < body; c += kLanes)
        _mm256_storeu_ps(o + c,
                         _mm256_fmadd_ps(kivi_codes8(row, c, bits), _mm256_load_ps(scale + c),
                                         _mm256_load_ps(zero + c)));
      for (int64_t c = body; c < d; ++c) {
        const int64_t bit = c * bits;
        const auto q = static_cast<float>((static_cast<unsigned>(row[bit / 8]) >> (bit % 8)) &
                                          ((1u << bits) - 1));
        o[c] = std::fma(q, scale[c], zero[c]);
      }
    }
    return;
  }
  const int64_t width = std::min(g, d);
  const int64_t row_bytes = packed + 4 * kivi_value_channel_groups(g, d);
  for (int64_t i = 0; i < n; ++i) {
    const std::byte* row = group + (first + i) * row_bytes;
    float* o = out + i * d;
    int64_t c = 0;
    const int64_t span = bits == 2 ? 64 : 32;
    // Whole unpacks, 16 codes of one channel run at a time (runs a multiple of 16 channels).
    if (width % 16 == 0)
      for (; c + span <= d; c += span) {
        __m128i codes[4];
        const int k = unpack_codes(row, c, bits, codes);
        for (int j = 0; j < k; ++j) {
          const std::byte* meta = row + packed + 4 * ((c + 16 * j) / width);
          const __m256 s = _mm256_set1_ps(f16_at(meta)), z = _mm256_set1_ps(f16_at(meta + 2));
          emit16(codes[j], s, z, s, z, o + c + 16 * j);
        }
      }
    for (; c < body && (c % width) + kLanes <= width; c += kLanes) {
      const std::byte* meta = row + packed + 4 * (c / width);
      _mm256_storeu_ps(o + c,
                       _mm256_fmadd_ps(kivi_codes8(row, c, bits), _mm256_set1_ps(f16_at(meta)),
                                       _mm256_set1_ps(f16_at(meta + 2))));
    }
    if (c < d) {
      // A run whose width is not a multiple of 8, or the tail: the portable decoder's rows.
      alignas(32) float tmp[512];
      if (d > 512) return decode_kv_group_rows(spec, dtype, side, group, first, n, out);
      decode_kv_group_rows(spec, dtype, side, group, first + i, 1, tmp);
      std::memcpy(o + c, tmp + c, static_cast<size_t>(d - c) * sizeof(float));
    }
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

  // Rows [first, first + n) of a quantized group (decode_kv_group_rows, bit for bit); row types'
  // groups are their rows.
  static void decode_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
                           const std::byte* group, int64_t first, int64_t n, float* out) {
    if (kv_is_kivi(dtype)) return decode_kivi_group(spec, dtype, side, group, first, n, out);
    const std::byte* rows[kAttentionTile];
    const int64_t row = spec.row_bytes(dtype);
    for (int64_t i = 0; i < n; ++i) rows[i] = group + (first + i) * row;
    decode(dtype, rows, n, spec.head_dim, out);
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
