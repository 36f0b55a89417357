// AVX2 matmul kernel for q4_0 weights against Q8_0 activations: blocks of 32, w = d * (q - 8).
#include "backend/cpu/gemm_q8_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct LoadQ4_0 {  // d@0 (fp16), qs@2[16]: element j low nibble, j + 16 high nibble
  static constexpr int64_t kBytes = 18;
  static __m256i load(const uint8_t* block) {
    return _mm256_sub_epi8(nibbles_32(block + 2), _mm256_set1_epi8(8));
  }
};

}  // namespace

void matmul_q4_0_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_q8_matmul<SignedBlock32<LoadQ4_0>>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
