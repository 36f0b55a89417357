// AVX2 matmul kernel for q4_K weights against Q8_K activations: super-blocks of 256, sub-blocks
// of 32 with 6-bit scale and min, w = d * sc * q - dmin * m.
#include "backend/cpu/gemm_q8_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct KernelQ4_K {  // d@0, dmin@2, scales@4[12], qs@16[128]
  static constexpr int64_t kBlock = 256;
  static constexpr int64_t kBytes = 144;
  static constexpr bool kHasMin = true;
  struct Unpacked {
    __m256i q[8];   // sub-block j's quants, 0..15
    __m256i sc[8];  // sub-block j's scale in every int16 lane
    __m128i mins;   // the 8 mins as int16
    float d, dmin;
  };
  static void unpack(const uint8_t* block, Unpacked& u) {
    u.d = load_fp16(block);
    u.dmin = load_fp16(block + 2);
    unpack_scales_mins_k4(block + 4, u.sc, &u.mins);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = load_256(block + 16 + 32 * c);
      u.q[2 * c] = _mm256_and_si256(raw, low4);
      u.q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
    }
  }
  static __m256i dot(const Unpacked& u, const int8_t* xq) {
    return dot_unsigned_chunks(u.q, u.sc, xq);
  }
  // Four lanes (lane k: sub-blocks 2k and 2k + 1); the driver adds them up.
  static __m128i min_dot(const Unpacked& u, const int16_t* bsums) {
    return min_lanes_k4(u.mins, bsums);
  }
};

}  // namespace

void matmul_q4_k_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_q8_matmul<KernelQ4_K>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
