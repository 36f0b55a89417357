// AVX2 matmul kernel for q3_K weights: super-blocks of 256, sub-blocks of 16 with signed 6-bit
// scales, decoded as d * (sc - 32) * (low2 + 4 * high - 4).
#include "backend/cpu/gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

// Sub-block j's scale, unbiased (see tensor/quant_blocks.h; restated to keep this ISA's code to
// itself).
inline int scale_q3_k(int j, const uint8_t* packed) {
  const int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
  const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

struct DecodeQ3_K {  // hmask@0[32], qs@32[64], scales@96[12], d@108
  static constexpr bool kIdentity = false;
  static constexpr int64_t kBlock = 256;
  static constexpr int64_t kBytes = 110;
  static void decode(const uint8_t* src, float* out) {
    const float d = load_fp16(src + 108);
    const uint8_t* hmask = src;
    const uint8_t* qs = src + 32;
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i three = _mm256_set1_epi32(3);
    const __m256i four = _mm256_set1_epi32(4);
    for (int sub = 0; sub < 16; ++sub) {
      const float dl = d * static_cast<float>(scale_q3_k(sub, src + 96));  // exact
      const int h = sub / 8, s = (sub % 8) / 2, l0 = 16 * (sub % 2);
      for (int l = l0; l < l0 + 16; l += 8) {
        const __m256i low = _mm256_and_si256(shift_right(widen_u8(qs + 32 * h + l), 2 * s), three);
        const __m256i high = _mm256_and_si256(shift_right(widen_u8(hmask + l), 4 * h + s), one);
        const __m256i q = _mm256_sub_epi32(_mm256_add_epi32(low, _mm256_slli_epi32(high, 2)), four);
        store_scaled(q, dl, out + 128 * h + 32 * s + l);
      }
    }
  }
  static void decode_tail(const uint8_t*, int64_t, float*) {}
};

}  // namespace

void matmul_q3_k_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_matmul<DecodeQ3_K>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
