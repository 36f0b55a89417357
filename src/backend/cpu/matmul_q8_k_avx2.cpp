// AVX2 matmul kernel for q8_K weights: super-blocks of 256 decoded as d * q with an f32 d.
// (q8_K is normally an activation format; as a weight type it is supported for completeness.)
#include "backend/cpu/gemm_avx2.h"

namespace vesper::backend::cpu {
namespace {

struct DecodeQ8_K {  // d@0 (f32), qs@4[256] int8, bsums@260[16] (unused here)
  static constexpr bool kIdentity = false;
  static constexpr int64_t kBlock = 256;
  static constexpr int64_t kBytes = 292;
  static void decode(const uint8_t* src, float* out) {
    float d;
    std::memcpy(&d, src, 4);
    for (int g = 0; g < 32; ++g) store_scaled(widen_i8(src + 4 + 8 * g), d, out + 8 * g);
  }
  static void decode_tail(const uint8_t*, int64_t, float*) {}
};

}  // namespace

void matmul_q8_k_avx2(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float* scratch) {
  run_matmul<DecodeQ8_K>(a, o_begin, o_end, scratch);
}

}  // namespace vesper::backend::cpu
