// AVX2 matmul kernel for q6_K weights: super-blocks of 256, sub-blocks of 16 with int8 scales,
// decoded as d * sc * (q - 32) with q = 4 low bits from ql and 2 high bits from qh.
#include "backend/cpu/gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct DecodeQ6_K {  // ql@0[128], qh@128[64], scales@192[16] int8, d@208
  static constexpr bool kIdentity = false;
  static constexpr int64_t kBlock = 256;
  static constexpr int64_t kBytes = 210;
  static void decode(const uint8_t* src, float* out) {
    const float d = load_fp16(src + 208);
    const __m256i low4 = _mm256_set1_epi32(0xF);
    const __m256i three = _mm256_set1_epi32(3);
    const __m256i thirty_two = _mm256_set1_epi32(32);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = src + 64 * h;
      const uint8_t* qh = src + 128 + 32 * h;
      for (int l = 0; l < 32; l += 8) {
        const __m256i v0 = widen_u8(ql + l);       // quarters 0 (low nibble) and 2 (high)
        const __m256i v1 = widen_u8(ql + 32 + l);  // quarters 1 and 3
        const __m256i vh = widen_u8(qh + l);       // quarter s in bits 2s, 2s + 1
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(v0, low4),
                            _mm256_slli_epi32(_mm256_and_si256(vh, three), 4)),
            _mm256_or_si256(
                _mm256_and_si256(v1, low4),
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(vh, 2), three), 4)),
            _mm256_or_si256(
                _mm256_srli_epi32(v0, 4),
                _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(vh, 4), three), 4)),
            _mm256_or_si256(_mm256_srli_epi32(v1, 4),
                            _mm256_slli_epi32(_mm256_srli_epi32(vh, 6), 4)),
        };
        for (int s = 0; s < 4; ++s) {
          const auto sc = static_cast<int8_t>(src[192 + 8 * h + 2 * s + l / 16]);
          const float ds = d * static_cast<float>(sc);  // exact; the one rounding is below
          store_scaled(_mm256_sub_epi32(q[s], thirty_two), ds, out + 128 * h + 32 * s + l);
        }
      }
    }
  }
  static void decode_tail(const uint8_t*, int64_t, float*) {}
};

}  // namespace

void matmul_q6_k_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_matmul<DecodeQ6_K>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
