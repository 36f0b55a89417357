// AVX2 matmul kernel for q5_0 weights against Q8_0 activations: blocks of 32,
// w = d * (nibble + 16 * bit - 16).
#include "backend/cpu/gemm_q8_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct LoadQ5_0 {  // d@0 (fp16), qh@2 (u32, bit j = 5th bit of element j), qs@6[16]
  static constexpr int64_t kBytes = 22;
  static __m256i load(const uint8_t* block) {
    // nibble - 16 is nibble | 0xF0 as a signed byte; a set fifth bit cancels the -16.
    const __m256i high = _mm256_andnot_si256(bytes_from_bits_32(block + 2), _mm256_set1_epi8(-16));
    return _mm256_or_si256(nibbles_32(block + 6), high);
  }
};

}  // namespace

void matmul_q5_0_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_q8_matmul<SignedBlock32<LoadQ5_0>>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
