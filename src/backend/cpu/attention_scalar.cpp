// The portable paged-attention kernel: the numeric contract of attention_kernel.h spelled out one
// lane at a time. It is the fallback on CPUs without AVX2 and the reference the AVX2 kernel must
// match bit for bit, so every step mirrors attention_avx2.cpp's arithmetic (8-lane partial
// sums, reduction trees, explicit fma) rather than being written the natural scalar way.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/attention_walk.h"
#include "backend/cpu/vec_exp.h"
#include "backend/kv_codec.h"
#include "core/fp16.h"

namespace vesper::backend::cpu {
namespace {

constexpr int kLanes = 8;

float tree8(const float* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

float score(const float* q, const float* k, int64_t head_dim, float scale) {
  float a[kLanes] = {};
  const int64_t body = head_dim / kLanes * kLanes;
  for (int64_t c = 0; c < body; c += kLanes)
    for (int l = 0; l < kLanes; ++l) a[l] = std::fma(q[c + l], k[c + l], a[l]);
  float s = tree8(a);
  for (int64_t i = body; i < head_dim; ++i) s = std::fma(q[i], k[i], s);
  return s * scale;
}

// The online-softmax step over a tile's scores s[0, nt): s becomes the weights e, and the running
// maximum and sum move on; returns alpha.
float fold(float* s, int64_t nt, float& run_max, float& run_sum) {
  const int64_t padded = (nt + kLanes - 1) / kLanes * kLanes;
  float tile_max = -INFINITY;
  for (int64_t i = 0; i < nt; ++i) tile_max = std::max(tile_max, s[i]);
  const float m_new = std::max(run_max, tile_max);
  const float alpha = exp_lane(run_max - m_new);
  run_max = m_new;
  float lanes[kLanes] = {};
  for (int64_t i = 0; i < padded; ++i) {
    const float e = i < nt ? exp_lane(s[i] - m_new) : 0.0f;
    s[i] = e;
    lanes[i % kLanes] = lanes[i % kLanes] + e;
  }
  run_sum = std::fma(run_sum, alpha, tree8(lanes));
  return alpha;
}

// acc = fma(acc, alpha, the tile's weighted values) over decoded rows.
void accumulate_rows(const float* e, const float* const* v_rows, int64_t nt, int64_t head_dim,
                     float alpha, float* acc) {
  for (int64_t d = 0; d < head_dim; ++d) {
    float u[4] = {};
    for (int64_t i = 0; i < nt; ++i) u[i % 4] = std::fma(e[i], v_rows[i][d], u[i % 4]);
    acc[d] = std::fma(acc[d], alpha, (u[0] + u[1]) + (u[2] + u[3]));
  }
}

float f16_at(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return fp16_to_f32(h);
}

// The query's 16-bit key terms against a KIVI key group (attention_kernel.h): q16[c] =
// q[c] * scale[c] rounded to steps of max |q[c] * scale[c]| / 32767; returns the step (0 with
// all-zero terms; NaN, terms 0, when a product is not finite).
float key_q16(const KiviTile& t, const float* q) {
  const int64_t d = t.spec->head_dim;
  float m = 0.0f;
  bool finite = true;
  for (int64_t c = 0; c < d; ++c) {
    const float x = std::fabs(q[c] * t.k.params[c]);
    finite = finite && x < INFINITY;
    m = std::max(m, x);
  }
  if (!finite || m == 0.0f) {
    std::fill(t.q16, t.q16 + d, int16_t{0});
    return finite ? 0.0f : NAN;
  }
  const float inv = 32767.0f / m;
  for (int64_t c = 0; c < d; ++c)
    t.q16[c] = static_cast<int16_t>(
        std::clamp(std::nearbyint(q[c] * t.k.params[c] * inv), -32767.0f, 32767.0f));
  return m / 32767.0f;
}

struct ScalarTile {
  static void decode(KvDtype dtype, const std::byte* const* rows, int64_t n, int64_t head_dim,
                     float* out) {
    for (int64_t i = 0; i < n; ++i) decode_kv_row(dtype, rows[i], head_dim, out + i * head_dim);
  }
  static void decode_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
                           const std::byte* group, int64_t first, int64_t n, float* out) {
    decode_kv_group_rows(spec, dtype, side, group, first, n, out);
  }

  static void tile(const float* q, const float* const* k_rows, const float* const* v_rows,
                   int64_t nt, int64_t head_dim, float scale, float* s, float* acc, float& run_max,
                   float& run_sum) {
    for (int64_t i = 0; i < nt; ++i) s[i] = score(q, k_rows[i], head_dim, scale);
    const float alpha = fold(s, nt, run_max, run_sum);
    accumulate_rows(s, v_rows, nt, head_dim, alpha, acc);
  }

  static void unpack_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
                           const std::byte* group, int64_t first, int64_t n, uint8_t* codes,
                           float* params) {
    const int64_t d = spec.head_dim;
    const int bits = kv_kivi_bits(dtype);
    const int64_t packed = kivi_packed_row_bytes(dtype, d);
    const int64_t runs = kivi_value_channel_groups(spec.block_size, d);
    const std::byte* rows = side == KvSide::kKey ? group + 4 * d : group;
    const int64_t stride = side == KvSide::kKey ? packed : packed + 4 * runs;
    for (int64_t i = 0; i < n; ++i) {
      const std::byte* row = rows + (first + i) * stride;
      for (int64_t c = 0; c < d; ++c) codes[i * d + c] = kivi_unpack_code(row, c, bits);
    }
    if (side == KvSide::kKey) {
      for (int64_t c = 0; c < 2 * d; ++c) params[c] = f16_at(group + 2 * c);
      return;
    }
    for (int64_t r = 0; r < runs; ++r)
      for (int64_t i = 0; i < kAttentionTile; ++i)
        for (int64_t j = 0; j < 2; ++j)
          params[(2 * r + j) * kAttentionTile + i] =
              i < n ? f16_at(rows + (first + i) * stride + packed + 4 * r + 2 * j) : 0.0f;
  }

  static void kivi_tile(const KiviTile& t, const float* q, int64_t nt, float scale, float* s,
                        float* acc, float& run_max, float& run_sum) {
    const int64_t d = t.spec->head_dim;
    if (t.k.codes != nullptr) {
      const float step = key_q16(t, q);
      const float qz = score(q, t.k.params + d, d, 1.0f);
      for (int64_t i = 0; i < nt; ++i) {
        int32_t dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += int32_t{t.q16[c]} * t.k.codes[i * d + c];
        s[i] = std::fma(step, static_cast<float>(dot), qz) * scale;
      }
    } else {
      for (int64_t i = 0; i < nt; ++i) s[i] = score(q, t.k.rows[i], d, scale);
    }
    const float alpha = fold(s, nt, run_max, run_sum);
    if (t.v.codes == nullptr) return accumulate_rows(s, t.v.rows, nt, d, alpha, acc);
    const int64_t width = std::min(t.spec->block_size, d);
    const int64_t runs = kivi_value_channel_groups(t.spec->block_size, d);
    // Over the keys padded to whole lanes: fold made their weights 0, and their parameters are 0.
    const int64_t padded = (nt + kLanes - 1) / kLanes * kLanes;
    for (int64_t r = 0; r < runs; ++r) {
      const float* scales = t.v.params + 2 * r * kAttentionTile;
      const float* zeros = scales + kAttentionTile;
      float lanes[kLanes] = {};
      for (int64_t i = 0; i < padded; ++i) {
        t.weights[r * kAttentionTile + i] = s[i] * scales[i];
        lanes[i % kLanes] = std::fma(s[i], zeros[i], lanes[i % kLanes]);
      }
      t.zero_terms[r] = tree8(lanes);
    }
    for (int64_t c = 0; c < d; ++c) {
      const int64_t r = c / width;
      float u[4] = {};
      for (int64_t i = 0; i < nt; ++i)
        u[i % 4] = std::fma(t.weights[r * kAttentionTile + i],
                            static_cast<float>(t.v.codes[i * d + c]), u[i % 4]);
      acc[c] = std::fma(acc[c], alpha, ((u[0] + u[1]) + (u[2] + u[3])) + t.zero_terms[r]);
    }
  }

  static void finish(const float* acc, float run_sum, int64_t head_dim, float* out) {
    const float inv = 1.0f / run_sum;
    for (int64_t d = 0; d < head_dim; ++d) out[d] = acc[d] * inv;
  }
};

}  // namespace

void paged_attention_scalar(const AttentionArgs& args, int64_t begin, int64_t end, float* scratch) {
  attend_items<ScalarTile>(args, begin, end, scratch);
}

}  // namespace vesper::backend::cpu
