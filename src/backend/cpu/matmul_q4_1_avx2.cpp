// AVX2 matmul kernel for q4_1 weights: blocks of 32 decoded as d * nibble + m.
#include "backend/cpu/gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct DecodeQ4_1 {  // d@0, m@2 (fp16), qs@4[16]
  static constexpr bool kIdentity = false;
  static constexpr int64_t kBlock = 32;
  static constexpr int64_t kBytes = 20;
  static void decode(const uint8_t* src, float* out) {
    const float d = load_fp16(src);
    const float m = load_fp16(src + 2);
    const __m256i low4 = _mm256_set1_epi32(0xF);
    for (int g = 0; g < 2; ++g) {
      const __m256i v = widen_u8(src + 4 + 8 * g);
      store_affine(_mm256_and_si256(v, low4), d, m, out + 8 * g);
      store_affine(_mm256_srli_epi32(v, 4), d, m, out + 16 + 8 * g);
    }
  }
  static void decode_tail(const uint8_t*, int64_t, float*) {}
};

}  // namespace

void matmul_q4_1_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_matmul<DecodeQ4_1>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
