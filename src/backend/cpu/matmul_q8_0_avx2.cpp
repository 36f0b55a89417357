// AVX2 matmul kernel for q8_0 weights against Q8_0 activations: blocks of 32, w = d * q.
#include "backend/cpu/gemm_q8_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct LoadQ8_0 {  // d@0 (fp16), qs@2[32] int8
  static constexpr int64_t kBytes = 34;
  static __m256i load(const uint8_t* block) { return load_256(block + 2); }
};

}  // namespace

void matmul_q8_0_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_q8_matmul<SignedBlock32<LoadQ8_0>>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
