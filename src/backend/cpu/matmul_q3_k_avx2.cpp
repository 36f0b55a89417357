// AVX2 matmul kernel for q3_K weights against Q8_K activations: super-blocks of 256, sub-blocks
// of 16 with signed 6-bit scales, w = d * sc * q, q = low 2 bits + 4 * third bit - 4 (-4 .. 3).
#include "backend/cpu/gemm_q8_avx2.h"

namespace vesper::backend::cpu {
namespace {

// Sub-block j's scale, unbiased (-32 .. 31), as tensor/quant_blocks.h's unpack_scale_q3_k:
// restated here because an inline function with external linkage must not be compiled with this
// file's AVX2 flags (see gemm_avx2.h).
inline int scale_q3_k(int j, const uint8_t* packed) {
  const int low = j < 8 ? packed[j] & 0xF : packed[j - 8] >> 4;
  const int high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
  return (low | (high << 4)) - 32;
}

struct KernelQ3_K {  // hmask@0[32], qs@32[64], scales@96[12], d@108
  static constexpr int64_t kBlock = 256;
  static constexpr int64_t kBytes = 110;
  static constexpr bool kHasMin = false;
  struct Unpacked {
    __m256i q[8];      // 32-element chunk k's quants, -4..3
    __m256i abs_q[8];  // |q|
    __m256i sc[8];     // chunk k's two scales: sub-block 2k in int16 lanes 0-7, 2k + 1 in 8-15
    float d;
  };
  static void unpack(const uint8_t* block, Unpacked& u) {
    u.d = load_fp16(block + 108);
    const __m256i hmask = load_256(block);  // chunk k's third bits in bit k of each byte
    const __m256i one = _mm256_set1_epi8(1);
    const __m256i three = _mm256_set1_epi8(3);
    const __m256i four = _mm256_set1_epi8(4);
    for (int n = 0; n < 2; ++n) {
      const __m256i bits = load_256(block + 32 + 32 * n);  // chunk 4n + j in bits 2j, 2j + 1
      for (int j = 0; j < 4; ++j) {
        const int k = 4 * n + j;
        // 16-bit shifts move bits across bytes; the masks keep only each byte's own bits.
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * j), three);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hmask, k), one);
        u.q[k] = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 2)), four);
        u.abs_q[k] = _mm256_abs_epi8(u.q[k]);
      }
    }
    // The 16 scales (-32 .. 31) unpacked once per block; they are not on the hot path of a
    // block's 8 x 32 quants.
    alignas(16) int8_t scales[16];
    for (int g = 0; g < 16; ++g) scales[g] = static_cast<int8_t>(scale_q3_k(g, block + 96));
    sub16_scales(_mm_load_si128(reinterpret_cast<const __m128i*>(scales)), u.sc);
  }
  // Int16 pair sums stay within 2 * 4 * 127.
  static __m256i dot(const Unpacked& u, const int8_t* xq) {
    return dot_signed_chunks(u.q, u.abs_q, u.sc, xq);
  }
  static __m128i min_dot(const Unpacked&, const int16_t*) { return _mm_setzero_si128(); }
};

}  // namespace

void matmul_q3_k_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_q8_matmul<KernelQ3_K>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
