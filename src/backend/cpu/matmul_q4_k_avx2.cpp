// AVX2 matmul kernel for q4_K weights: super-blocks of 256, sub-blocks of 32 with 6-bit scale
// and min, decoded as d * sc * q - dmin * m.
#include "backend/cpu/gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct DecodeQ4_K {  // d@0, dmin@2, scales@4[12], qs@16[128]
  static constexpr bool kIdentity = false;
  static constexpr int64_t kBlock = 256;
  static constexpr int64_t kBytes = 144;
  static void decode(const uint8_t* src, float* out) {
    const float d = load_fp16(src);
    const float dmin = load_fp16(src + 2);
    const uint8_t* qs = src + 16;
    const __m256i low4 = _mm256_set1_epi32(0xF);
    for (int c = 0; c < 4; ++c) {
      int sc, m;
      scale_min_k4(2 * c, src + 4, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);  // exact
      scale_min_k4(2 * c + 1, src + 4, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; l += 8) {
        const __m256i v = widen_u8(qs + 32 * c + l);
        store_affine(_mm256_and_si256(v, low4), d1, -m1, out + 64 * c + l);
        store_affine(_mm256_srli_epi32(v, 4), d2, -m2, out + 64 * c + 32 + l);
      }
    }
  }
  static void decode_tail(const uint8_t*, int64_t, float*) {}
};

}  // namespace

void matmul_q4_k_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_matmul<DecodeQ4_K>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
