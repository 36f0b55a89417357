// The driver of the packed-weight GEMM kernels (backend/packed_weights.h) on AVX2-class
// instruction sets: register tiles, cache panels, the block-sum accumulation. A kernel file
// (matmul_packed_avx2.cpp, matmul_packed_avx512_vnni.cpp) supplies a weight type K and uses
// run_packed<K> as its MatmulKernel:
//   static constexpr int64_t kBlock;       // elements per row per chunk: 32 or 256
//   static constexpr int64_t kChunkBytes;  // bytes of one chunk's quants
//   static constexpr int64_t kScaleCount;  // uint16 scale entries per chunk
// and either (32-element blocks, block-sum order)
//   template <int R> static void dot(const uint8_t* chunk, const int8_t* xq, const int16_t* xs,
//                                    __m256i (&isum)[R]);
//       // isum[r] lane j = output j's exact block dot with tile row r, whose block is at
//       // xq + 32 r and whose Q8_0 quant sum is xs[r]
// or, for kBlock 256 (k-quants), its own whole tile, with the signature of tile() below:
//   template <int R> static void tile(...);  // with tile()'s signature and prefetch rule
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
//
// Include it only from files compiled with at least -mavx2 -mfma -mf16c (the linkage note of
// gemm_avx2.h applies: everything here has internal linkage).
#pragma once

#include <algorithm>

#include "backend/cpu/gemm_q8_avx2.h"

namespace vesper::backend::cpu {
namespace {

constexpr int64_t kTile = kPackedRowTile;

// The first row tile of a panel streams each weight byte from memory (later tiles find it in L1):
// the hardware prefetchers alone left the packed GEMV well short of the memory bandwidth on the
// 2-core VMs this was measured on (1B Q4_0 single-stream decode: ~+15% with this; a 9-row pass
// of a 250 MB Q8_0 model, whose first tile has 4 rows: 28.5 -> 23.4 ms). Requests the cache
// lines `distance` bytes ahead of the `bytes` about to be read.
constexpr int64_t kPrefetchBytes = 2048;
inline void prefetch_ahead(const uint8_t* p, int64_t bytes, int64_t distance) {
  for (int64_t off = 0; off < bytes; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + distance + off), _MM_HINT_T0);
}

// How far ahead (bytes; 0: not at all) row tile t of a panel [p0, p1) requests weights, for the
// `first` group (or pair of groups) of a thread's range or a later one, `next` bytes on to the
// group (pair) after. Decode, and panels of more than kLookaheadTiles tiles (prefill): the
// panel's first tile streams its own weights, kPrefetchBytes ahead. Smaller panels (2 to 32
// activation rows, decode batches; and every panel of a matrix with more than 8,192 inputs, whose
// panels are that small): there the first tile's streaming stalled it while memory sat idle as
// the others ran on weights in L1, so that 8 rows took the time of the arithmetic plus that of
// the read, not the larger (`BM_PackedMatmulStreamed`: 24 layers of a 110M model's feed-forward
// weights against 1 layer that stays in cache). Each group's first tile instead requests the
// next group's weights as it reads its own, which the group before requested: the range's first
// group streams its own in its first tile and requests the next in its second (or, with one
// tile, leaves the next to the hardware prefetcher).
constexpr int64_t kLookaheadTiles = 8;
inline int64_t prefetch_distance(int64_t t, int64_t p0, int64_t p1, int64_t n_rows, bool first,
                                 int64_t next) {
  if (n_rows == 1 || p1 - p0 > kLookaheadTiles) return t == p0 ? kPrefetchBytes : 0;
  if (!first) return t == p0 ? next : 0;
  return t == p0 ? kPrefetchBytes : t == p0 + 1 ? next : 0;
}
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

// Outputs 8g .. 8g + 7 (chunks from `chunk`, scales from `sc`) of the R rows of one activation
// tile (quants xq, scales xd, sums xs, all kTile-interleaved), written to y, y + y_stride, ...
// `ahead`: how far ahead of its reads the tile requests weights (prefetch_distance; 0: none).
// Not inlined into run_packed: on its own, each tile's loop gets all 16 vector registers.
template <class K, int R>
__attribute__((noinline)) void tile(const uint8_t* chunk, const uint16_t* sc, int64_t n_blocks,
                                    const int8_t* xq, const float* xd, const int16_t* xs, float* y,
                                    int64_t y_stride, int64_t ahead) {
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b) {
    __m256i isum[R];
    if (ahead != 0) prefetch_ahead(chunk, K::kChunkBytes, ahead);
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

// One activation tile of R rows against one group of 8 outputs: the weight type's own tile
// (K::tile<R>, the 256-element k-quants) or the block-sum tile above over K::dot<R>.
template <class K, int R>
inline void run_tile(const uint8_t* chunk, const uint16_t* sc, int64_t n_blocks, const int8_t* xq,
                     const float* xd, const int16_t* xs, float* y, int64_t y_stride,
                     int64_t ahead) {
  if constexpr (K::kBlock == 256) {
    K::template tile<R>(chunk, sc, n_blocks, xq, xd, xs, y, y_stride, ahead);
  } else {
    tile<K, R>(chunk, sc, n_blocks, xq, xd, xs, y, y_stride, ahead);
  }
}

template <class K>
void run_packed(const MatmulArgs& a, int64_t o_begin, int64_t o_end, float*) {
  const Q8Rows& x = *a.xq;
  const int64_t n_blocks = a.n_in / K::kBlock;
  const int64_t sums_per_block = K::kBlock / (K::kBlock == 256 ? 16 : 32);
  const int64_t n_tiles = (a.n_rows + kTile - 1) / kTile;
  constexpr int64_t kPanelBytes = int64_t{256} << 10;
  const int64_t panel_tiles = std::max<int64_t>(1, kPanelBytes / (kTile * a.n_in));
  for (int64_t p0 = 0; p0 < n_tiles; p0 += panel_tiles) {
    const int64_t p1 = std::min(n_tiles, p0 + panel_tiles);
    for (int64_t g = o_begin / 8; g < o_end / 8; ++g) {
      const uint8_t* chunk = a.w + g * n_blocks * K::kChunkBytes;
      const uint16_t* sc = a.w_scales + g * n_blocks * K::kScaleCount;
      for (int64_t t = p0; t < p1; ++t) {
        const int64_t first = t * kTile * n_blocks;  // the tile's first block index (Q8Rows)
        const int8_t* xq = x.qs + first * K::kBlock;
        const float* xd = x.d + first;
        const int16_t* xs = x.bsums + first * sums_per_block;
        float* y = a.y + t * kTile * a.n_out + 8 * g;
        const int64_t ahead =
            prefetch_distance(t, p0, p1, a.n_rows, g == o_begin / 8, n_blocks * K::kChunkBytes);
        switch (std::min(kTile, a.n_rows - t * kTile)) {
          case 4:
            run_tile<K, 4>(chunk, sc, n_blocks, xq, xd, xs, y, a.n_out, ahead);
            break;
          case 3:
            run_tile<K, 3>(chunk, sc, n_blocks, xq, xd, xs, y, a.n_out, ahead);
            break;
          case 2:
            run_tile<K, 2>(chunk, sc, n_blocks, xq, xd, xs, y, a.n_out, ahead);
            break;
          default:
            run_tile<K, 1>(chunk, sc, n_blocks, xq, xd, xs, y, a.n_out, ahead);
            break;
        }
      }
    }
  }
}

}  // namespace
}  // namespace vesper::backend::cpu
