// AVX2 kernels over 8-row packed q4_0 / q8_0 weights (backend/packed_weights.h): each 32-byte
// slice of a chunk holds 4 weights of each of 8 rows (one 32-bit lane per row), so a broadcast of
// 4 activation bytes and one maddubs serve 8 output features, and the lanes of the integer sums
// end up as the 8 rows' block sums without a horizontal reduction. The 8 rows' fp16 scales
// convert as one vector and one FMA accumulates 8 outputs, in the block-sum order of
// matmul_kernel.h, so results equal the unpacked and portable kernels bit for bit.
//
// Tiles: R activation rows x 8 outputs (R = 4 in prefill, fewer at the edge; 1 in decode). Each
// slice is loaded and unpacked once per tile and used by all R rows; each activation broadcast by
// all 8 outputs. A group's weights (n_in / 32 chunks) stay in L1/L2 while every row tile passes.
#include "backend/cpu/gemm_q8_avx2.h"

namespace vesper::backend::cpu {
namespace {

// 4 activation bytes broadcast to every 32-bit lane.
inline __m256i broadcast_4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// q4_0: stored nibbles q (0..15, the weight is q - 8) are taken unsigned by maddubs, and 8 * (the
// block's activation sum) is subtracted after: sum (q - 8) x = sum q x - 8 sum x, exact. Per row,
// the int16 pair sums stay below 8 * 2 * 15 * 127 = 30480 over the block, so they are added in
// int16 and widened once.
struct PackedQ4_0 {
  static constexpr int64_t kChunkBytes = 128;
  // isum[r] lane j = row j's exact dot with row r's block at xq + r * q_stride.
  template <int R>
  static void dot(const uint8_t* chunk, const int8_t* xq, int64_t q_stride, const int16_t* xs,
                  int64_t s_stride, __m256i* isum) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i s16[R];
    for (int r = 0; r < R; ++r) s16[r] = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i v = load_256(chunk + 32 * k);
      const __m256i lo = _mm256_and_si256(v, low4);                        // elements 8k + t
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);  // elements 8k + 4 + t
      for (int r = 0; r < R; ++r) {
        const int8_t* x = xq + r * q_stride + 8 * k;
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast_4(x)),
                                           _mm256_maddubs_epi16(hi, broadcast_4(x + 4)));
        s16[r] = _mm256_add_epi16(s16[r], p);
      }
    }
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < R; ++r)
      isum[r] = _mm256_sub_epi32(_mm256_madd_epi16(s16[r], ones),
                                 _mm256_set1_epi32(8 * xs[r * s_stride]));
  }
};

// q8_0: signed weights against signed activations, ggml's sign trick (maddubs wants one unsigned
// operand); int16 pair sums reach 2 * 128 * 127, so each slice widens to int32 at once.
struct PackedQ8_0 {
  static constexpr int64_t kChunkBytes = 256;
  template <int R>
  static void dot(const uint8_t* chunk, const int8_t* xq, int64_t q_stride, const int16_t*, int64_t,
                  __m256i* isum) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i w = load_256(chunk + 32 * k);  // elements 4k + t
      const __m256i abs_w = _mm256_sign_epi8(w, w);
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_sign_epi8(broadcast_4(xq + r * q_stride + 4 * k), w);
        isum[r] =
            _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, x), ones));
      }
    }
  }
};

// Outputs 8g .. 8g + 7 of activation rows r0 .. r0 + R - 1.
template <class K, int R>
inline void tile(const MatmulArgs& a, int64_t g, int64_t r0) {
  const Q8Rows& x = *a.xq;
  const int64_t n_blocks = a.n_in / 32;
  const int8_t* xq = x.qs + r0 * a.n_in;
  const float* xd = x.d + r0 * n_blocks;
  const int16_t* xs = x.bsums + r0 * n_blocks;
  const uint8_t* chunk = a.w + g * n_blocks * K::kChunkBytes;
  const uint16_t* sc = a.w_scales + g * n_blocks * 8;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b, chunk += K::kChunkBytes, sc += 8) {
    __m256i isum[R];
    K::template dot<R>(chunk, xq + 32 * b, a.n_in, xs + b, n_blocks, isum);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    for (int r = 0; r < R; ++r) {
      // d[j] * dx rounds as the scalar product does; one FMA per output and block.
      const __m256 scale = _mm256_mul_ps(d, _mm256_broadcast_ss(xd + r * n_blocks + b));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(a.y + (r0 + r) * a.n_out + 8 * g, acc[r]);
}

template <class K>
void run_packed(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float*) {
  for (int64_t g = o_begin / 8; g < o_end / 8; ++g) {
    int64_t r0 = 0;
    for (; r0 + 4 <= a.n_rows; r0 += 4) tile<K, 4>(a, g, r0);
    switch (a.n_rows - r0) {
      case 3:
        tile<K, 3>(a, g, r0);
        break;
      case 2:
        tile<K, 2>(a, g, r0);
        break;
      case 1:
        tile<K, 1>(a, g, r0);
        break;
      default:
        break;
    }
  }
}

}  // namespace

MatmulKernel avx2_packed_kernel(tensor::GgmlType type) {
  switch (type) {
    case tensor::GgmlType::kQ4_0:
      return run_packed<PackedQ4_0>;
    case tensor::GgmlType::kQ8_0:
      return run_packed<PackedQ8_0>;
    default:
      return nullptr;
  }
}

}  // namespace vesper::backend::cpu
