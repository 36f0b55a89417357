// AVX2 matmul kernel for q5_0 weights: blocks of 32 decoded as d * (nibble + 16 * bit - 16).
#include "backend/cpu/gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

// Bit (first + lane) of qh, moved to bit 4 of each lane.
inline __m256i fifth_bits(uint32_t qh, int first) {
  const __m256i index =
      _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(first));
  const __m256i bits = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(qh)), index), _mm256_set1_epi32(1));
  return _mm256_slli_epi32(bits, 4);
}

struct DecodeQ5_0 {  // d@0 (fp16), qh@2 (u32, bit j = 5th bit of element j), qs@6[16]
  static constexpr bool kIdentity = false;
  static constexpr int64_t kBlock = 32;
  static constexpr int64_t kBytes = 22;
  static void decode(const uint8_t* src, float* out) {
    const float d = load_fp16(src);
    uint32_t qh;
    std::memcpy(&qh, src + 2, 4);
    const __m256i sixteen = _mm256_set1_epi32(16);
    const __m256i low4 = _mm256_set1_epi32(0xF);
    for (int g = 0; g < 2; ++g) {
      const __m256i v = widen_u8(src + 6 + 8 * g);
      const __m256i q0 = _mm256_or_si256(_mm256_and_si256(v, low4), fifth_bits(qh, 8 * g));
      const __m256i q1 = _mm256_or_si256(_mm256_srli_epi32(v, 4), fifth_bits(qh, 16 + 8 * g));
      store_scaled(_mm256_sub_epi32(q0, sixteen), d, out + 8 * g);
      store_scaled(_mm256_sub_epi32(q1, sixteen), d, out + 16 + 8 * g);
    }
  }
  static void decode_tail(const uint8_t*, int64_t, float*) {}
};

}  // namespace

void matmul_q5_0_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_matmul<DecodeQ5_0>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
