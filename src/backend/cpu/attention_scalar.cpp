// The portable paged-attention kernel: the numeric contract of attention_kernel.h spelled out one
// lane at a time. It is the fallback on CPUs without AVX2 and the reference the AVX2 kernel must
// match bit for bit, so every step mirrors attention_avx2.cpp's arithmetic (8-lane partial
// sums, reduction trees, explicit fma) rather than being written the natural scalar way.
#include <algorithm>
#include <cmath>

#include "backend/cpu/attention_kernel.h"
#include "backend/cpu/attention_walk.h"
#include "backend/cpu/vec_exp.h"
#include "backend/kv_codec.h"

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
    const int64_t padded = (nt + kLanes - 1) / kLanes * kLanes;
    float tile_max = -INFINITY;
    for (int64_t i = 0; i < nt; ++i) {
      s[i] = score(q, k_rows[i], head_dim, scale);
      tile_max = std::max(tile_max, s[i]);
    }
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
    for (int64_t d = 0; d < head_dim; ++d) {
      float u[4] = {};
      for (int64_t i = 0; i < nt; ++i) u[i % 4] = std::fma(s[i], v_rows[i][d], u[i % 4]);
      acc[d] = std::fma(acc[d], alpha, (u[0] + u[1]) + (u[2] + u[3]));
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
