// AVX2 matmul kernel for q2_K weights against Q8_K activations: super-blocks of 256, sub-blocks
// of 16 with a 4-bit scale and a 4-bit min, w = d * sc * q - dmin * m, q = 2 bits from qs.
#include "backend/cpu/gemm_q8_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct KernelQ2_K {  // scales@0[16] (scale | min << 4), qs@16[64], d@80, dmin@82
  static constexpr int64_t kBlock = 256;
  static constexpr int64_t kBytes = 84;
  static constexpr bool kHasMin = true;
  struct Unpacked {
    __m256i q[8];   // 32-element chunk k's quants, 0..3
    __m256i sc[8];  // chunk k's two scales: sub-block 2k in int16 lanes 0-7, 2k + 1 in 8-15
    __m256i mins;   // the 16 sub-block mins as int16
    float d, dmin;
  };
  static void unpack(const uint8_t* block, Unpacked& u) {
    u.d = load_fp16(block + 80);
    u.dmin = load_fp16(block + 82);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
    const __m128i low4 = _mm_set1_epi8(0x0F);
    const __m128i scales = _mm_and_si128(packed, low4);
    u.mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), low4));
    const __m256i three = _mm256_set1_epi8(3);
    for (int n = 0; n < 2; ++n) {
      const __m256i bits = load_256(block + 16 + 32 * n);  // chunk 4n + j in bits 2j, 2j + 1
      // 16-bit shifts move bits across bytes; the mask keeps only each byte's own two bits.
      for (int j = 0; j < 4; ++j)
        u.q[4 * n + j] = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * j), three);
    }
    sub16_scales(scales, u.sc);  // 0..15: the same as int8
  }
  // Quants 0..3 are maddubs' unsigned operand; its int16 pair sums stay within 2 * 3 * 128.
  static __m256i dot(const Unpacked& u, const int8_t* xq) {
    return dot_unsigned_chunks(u.q, u.sc, xq);
  }
  // The 16 mins against the activation sums of their 16 elements; the driver adds the lanes up.
  static __m128i min_dot(const Unpacked& u, const int16_t* bsums) {
    const __m256i p = _mm256_madd_epi16(u.mins, load_256(bsums));
    return _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  }
};

}  // namespace

void matmul_q2_k_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_q8_matmul<KernelQ2_K>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
