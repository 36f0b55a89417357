// AVX2 matmul kernel for q5_K weights against Q8_K activations: as q4_K with a fifth bit per
// quant from qh.
#include "backend/cpu/gemm_q8_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct KernelQ5_K {  // d@0, dmin@2, scales@4[12], qh@16[32], qs@48[128]
  static constexpr int64_t kBlock = 256;
  static constexpr int64_t kBytes = 176;
  static constexpr bool kHasMin = true;
  struct Unpacked {
    __m256i q[8];   // sub-block j's quants, 0..31
    __m256i sc[8];  // sub-block j's scale in every int16 lane
    __m128i mins;   // the 8 mins as int16
    float d, dmin;
  };
  static void unpack(const uint8_t* block, Unpacked& u) {
    u.d = load_fp16(block);
    u.dmin = load_fp16(block + 2);
    unpack_scales_mins_k4(block + 4, u.sc, &u.mins);
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i sixteen = _mm256_set1_epi8(16);
    const __m256i qh = load_256(block + 16);  // bit j of byte l: fifth bit of sub-block j's l
    for (int j = 0; j < 8; ++j) {
      const __m256i raw = load_256(block + 48 + 32 * (j / 2));
      const __m256i low = j % 2 == 0 ? _mm256_and_si256(raw, low4)
                                     : _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
      const __m256i high =
          _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), sixteen);
      u.q[j] = _mm256_or_si256(low, high);
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

void matmul_q5_k_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_q8_matmul<KernelQ5_K>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
