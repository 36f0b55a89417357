// AVX2 kernels over 8-row packed q4_0 / q8_0 weights (backend/packed_weights.h): each 32-byte
// slice of a chunk holds 4 weights of each of 8 rows (one 32-bit lane per row), so a broadcast of
// 4 activation bytes and one maddubs serve 8 output features, and the lanes of the integer sums
// end up as the 8 rows' block sums without a horizontal reduction. The 8 rows' fp16 scales
// convert as one vector and one FMA accumulates 8 outputs, in the block-sum order of
// matmul_kernel.h, so results equal the unpacked and portable kernels bit for bit.
//
// Register tile: R activation rows x 8 outputs (R = 4, fewer in the last row tile; 1 in decode).
// Each slice is loaded and unpacked once per tile and used by all R rows; each activation
// broadcast serves all 8 outputs. The activations arrive quantized in tiles of 4 rows whose blocks
// alternate (Q8Rows::interleave = kPackedRowTile), so one pointer walks a tile's rows and the
// register allocator is left enough registers for the accumulators.
//
// Cache blocking: rows are taken in panels whose quantized activations fit in half of L2; within
// a panel each group of 8 outputs (n_in / 32 chunks: 3-8 KiB) stays in L1 while every row tile
// of the panel passes over it, and the weights are streamed once per panel.
#include <algorithm>

#include "backend/cpu/gemm_q8_avx2.h"

namespace vesper::backend::cpu {
namespace {

constexpr int64_t kTile = kPackedRowTile;
static_assert(kTile == 4, "run_packed dispatches tiles of 1 to 4 rows");

// Makes v opaque to the optimizer at this point, at no cost in instructions. GCC's reassociation
// otherwise turns a register tile's running sums into one wide tree of all its products, which
// keeps every product live at once and spills the tile to the stack (twice as slow).
inline void keep_in_register(__m256i& v) {
  asm("" : "+x"(v));
}

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
  // isum[r] lane j = output j's exact block dot with tile row r, whose block is at xq + 32 r and
  // whose quant sum is xs[r].
  template <int R>
  static inline void dot(const uint8_t* chunk, const int8_t* xq, const int16_t* xs,
                         __m256i (&isum)[R]) {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    __m256i s16[R];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m256i v = load_256(chunk + 32 * k);
      const __m256i lo = _mm256_and_si256(v, low4);                        // elements 8k + t
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);  // elements 8k + 4 + t
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int8_t* x = xq + 32 * r + 8 * k;
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast_4(x)),
                                           _mm256_maddubs_epi16(hi, broadcast_4(x + 4)));
        s16[r] = k == 0 ? p : _mm256_add_epi16(s16[r], p);
        keep_in_register(s16[r]);
      }
    }
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
      isum[r] = _mm256_sub_epi32(_mm256_madd_epi16(s16[r], ones), _mm256_set1_epi32(8 * xs[r]));
  }
};

// q8_0: signed weights against signed activations, ggml's sign trick (maddubs wants one unsigned
// operand); int16 pair sums reach 2 * 128 * 127, so each slice widens to int32 at once.
struct PackedQ8_0 {
  static constexpr int64_t kChunkBytes = 256;
  template <int R>
  static inline void dot(const uint8_t* chunk, const int8_t* xq, const int16_t*,
                         __m256i (&isum)[R]) {
    const __m256i ones = _mm256_set1_epi16(1);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i w = load_256(chunk + 32 * k);  // elements 4k + t
      const __m256i abs_w = _mm256_sign_epi8(w, w);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256i x = _mm256_sign_epi8(broadcast_4(xq + 32 * r + 4 * k), w);
        const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, x), ones);
        isum[r] = k == 0 ? p : _mm256_add_epi32(isum[r], p);
        keep_in_register(isum[r]);
      }
    }
  }
};

// Outputs 8g .. 8g + 7 (chunks from `chunk`, scales from `sc`) of the R rows of one activation
// tile (quants xq, scales xd, sums xs, all kTile-interleaved), written to y, y + y_stride, ...
// Not inlined into run_packed: on its own, each tile's loop gets all 16 vector registers.
template <class K, int R>
__attribute__((noinline)) void tile(const uint8_t* chunk, const uint16_t* sc, int64_t n_blocks,
                                    const int8_t* xq, const float* xd, const int16_t* xs, float* y,
                                    int64_t y_stride) {
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    __m256i isum[R];
    K::template dot<R>(chunk, xq, xs, isum);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      // d[j] * dx rounds as the scalar product does; one FMA per output and block.
      const __m256 scale = _mm256_mul_ps(d, _mm256_broadcast_ss(xd + r));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), scale, acc[r]);
    }
    chunk += K::kChunkBytes;
    sc += 8;
    xq += 32 * kTile;
    xd += kTile;
    xs += kTile;
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + r * y_stride, acc[r]);
}

template <class K>
void run_packed(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float*) {
  const Q8Rows& x = *a.xq;
  const int64_t n_blocks = a.n_in / 32;
  const int64_t n_tiles = (a.n_rows + kTile - 1) / kTile;
  constexpr int64_t kPanelBytes = int64_t{256} << 10;
  const int64_t panel_tiles = std::max<int64_t>(1, kPanelBytes / (kTile * a.n_in));
  for (int64_t p0 = 0; p0 < n_tiles; p0 += panel_tiles) {
    const int64_t p1 = std::min(n_tiles, p0 + panel_tiles);
    for (int64_t g = o_begin / 8; g < o_end / 8; ++g) {
      const uint8_t* chunk = a.w + g * n_blocks * K::kChunkBytes;
      const uint16_t* sc = a.w_scales + g * n_blocks * 8;
      for (int64_t t = p0; t < p1; ++t) {
        const int64_t first = t * kTile * n_blocks;  // the tile's first block index (Q8Rows)
        const int8_t* xq = x.qs + first * 32;
        const float* xd = x.d + first;
        const int16_t* xs = x.bsums + first;
        float* y = a.y + t * kTile * a.n_out + 8 * g;
        switch (std::min(kTile, a.n_rows - t * kTile)) {
          case 4:
            tile<K, 4>(chunk, sc, n_blocks, xq, xd, xs, y, a.n_out);
            break;
          case 3:
            tile<K, 3>(chunk, sc, n_blocks, xq, xd, xs, y, a.n_out);
            break;
          case 2:
            tile<K, 2>(chunk, sc, n_blocks, xq, xd, xs, y, a.n_out);
            break;
          default:
            tile<K, 1>(chunk, sc, n_blocks, xq, xd, xs, y, a.n_out);
            break;
        }
      }
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
