// AVX2 matmul kernel for q5_K weights: as q4_K with a fifth bit per quant from qh.
#include "backend/cpu/gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct DecodeQ5_K {  // d@0, dmin@2, scales@4[12], qh@16[32], qs@48[128]
  static constexpr bool kIdentity = false;
  static constexpr int64_t kBlock = 256;
  static constexpr int64_t kBytes = 176;
  static void decode(const uint8_t* src, float* out) {
    const float d = load_fp16(src);
    const float dmin = load_fp16(src + 2);
    const uint8_t* qh = src + 16;
    const uint8_t* qs = src + 48;
    const __m256i low4 = _mm256_set1_epi32(0xF);
    const __m256i one = _mm256_set1_epi32(1);
    for (int c = 0; c < 4; ++c) {
      int sc, m;
      scale_min_k4(2 * c, src + 4, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);  // exact
      scale_min_k4(2 * c + 1, src + 4, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; l += 8) {
        const __m256i v = widen_u8(qs + 32 * c + l);
        const __m256i hv = widen_u8(qh + l);
        const __m256i h1 = _mm256_slli_epi32(_mm256_and_si256(shift_right(hv, 2 * c), one), 4);
        const __m256i h2 = _mm256_slli_epi32(_mm256_and_si256(shift_right(hv, 2 * c + 1), one), 4);
        store_affine(_mm256_or_si256(_mm256_and_si256(v, low4), h1), d1, -m1, out + 64 * c + l);
        store_affine(_mm256_or_si256(_mm256_srli_epi32(v, 4), h2), d2, -m2, out + 64 * c + 32 + l);
      }
    }
  }
  static void decode_tail(const uint8_t*, int64_t, float*) {}
};

}  // namespace

void matmul_q5_k_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_matmul<DecodeQ5_K>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
