// AVX2 matmul kernel for q8_0 weights: blocks of 32 decoded as d * q.
#include "backend/cpu/gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct DecodeQ8_0 {  // d@0 (fp16), qs@2[32] int8
  static constexpr bool kIdentity = false;
  static constexpr int64_t kBlock = 32;
  static constexpr int64_t kBytes = 34;
  static void decode(const uint8_t* src, float* out) {
    const float d = load_fp16(src);
    for (int g = 0; g < 4; ++g) store_scaled(widen_i8(src + 2 + 8 * g), d, out + 8 * g);
  }
  static void decode_tail(const uint8_t*, int64_t, float*) {}
};

}  // namespace

void matmul_q8_0_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_matmul<DecodeQ8_0>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
