// The per-ISA CPU paged-attention kernel interface, and the numeric contract every kernel follows.
//
// A kernel computes a range of work items; item w is (token block w / n_kv_heads, KV head
// w % n_kv_heads): batch tokens [b * kAttentionQueryBlock, (b + 1) * kAttentionQueryBlock) and the
// `group` query heads that share that KV head (grouped-query attention). Each tile of K/V rows is
// loaded once and used by the whole block and group (cpu/attention_walk.h). The caller
// (paged_attention.cpp) splits items across threads; a kernel never sees threads.
//
// Numeric contract, for one query head q at position p (keys 0..p of its sequence), D = head_dim:
//   score(j): a[l] = fma(q[8c + l], k_j[8c + l], a[l]) for chunks c < D/8 in order, a from +0;
//             s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
//             s = fma(q[i], k_j[i], s) for the D % 8 tail elements i in order; score = s * scale.
//   Keys are taken in tiles of kAttentionTile positions, [0, 32), [32, 64), ..., the last cut at
//   p + 1, whatever the block size or which step wrote them. Per tile, with m = -inf, l = 0,
//   acc = 0 before the first:
//     m' = max(m, max of the tile's scores); alpha = exp(m - m');
//     e_j = exp(score(j) - m')             (exp is cpu/vec_exp.h's exp_lane);
//     t[l] = sum over the tile's 8-key groups g, in order, of e_{32T + 8g + l} (from +0; keys
//            past the tile's end count as +0); tile_sum = the tree above over t;
//     l = fma(l, alpha, tile_sum);
//     u_r[d] = fma(e_j, v_j[d], u_r[d]) for the tile's keys j in order, r = j % 4, u_r from +0;
//     acc[d] = fma(acc[d], alpha, (u_0[d] + u_1[d]) + (u_2[d] + u_3[d])); m = m'.
//     (Four partial sums so that even a head_dim of 8 has independent FMA chains.)
//   out[d] = acc[d] * (1 / l).
// Keys and values are the values the cache's rows decode to (kv_codec.h's decode_kv_row: exact
// for f32, f16, bf16 and fp8; one fma for int8), so the contract holds for every KV type.
// KIVI (a tile of a group the query reads quantized; kv_codec.h) is computed from the codes, with
// no decoded copy of the keys or values:
//   keys (channel scales s, zero points z, codes k_j): with x_c = q[c] * s[c], m = max |x_c|,
//     q16[c] = nearbyint(x_c * (32767 / m)) clamped to +-32767 and step = m / 32767 (q16 = 0 and
//     step = 0 when m is 0; step NaN when an x_c is not finite):
//     score(j) = fma(step, float(sum_c q16[c] * k_j[c]), qz) * scale, the sum exact in int32 and
//     qz = q . z in score's order above. (q * s rounded to 16 bits: an error of at most 2^-16 of
//     the largest term, below the f16 rounding of the cached rows the codes come from.)
//   values (row j: codes v_j, per channel run r a scale sigma_jr and zero point zeta_jr): for each
//     run, w_jr = e_j * sigma_jr, and zt_r = the tree over lanes l of fma chains
//     y_l = fma(e_j, zeta_jr, y_l) over the tile's keys j = l, l + 8, ... in order; then
//     u_(j%4)[d] = fma(w_jr, float(v_j[d]), u_(j%4)[d]) over the tile's keys in order and
//     acc[d] = fma(acc[d], alpha, ((u_0[d] + u_1[d]) + (u_2[d] + u_3[d])) + zt_r), r = d's run.
//   A row type on one side (K8V2's int8 keys) follows the row rules on that side.
// Every operation of a query's result is fixed by the query's position and the shapes, so the
// result does not depend on the batch, the chunking of the prompt, the block table or threads,
// and the AVX2 and portable kernels agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/kv_cache.h"
#include "backend/paged_attention.h"

namespace vesper::backend::cpu {

// Keys per online-softmax step. Part of the numeric contract: changing it changes results.
inline constexpr int64_t kAttentionTile = 32;

// Batch tokens per work item. Not part of the numeric contract (each query's arithmetic is its
// own); it sets how many queries share each loaded K/V tile, and so how often a compressed tile
// is decoded: 16 rather than 8 made a 1,024-token f16 prefill's attention 1.2x faster (f32 1.05x;
// 32 gained no more; `vesper_microbench`'s BM_PagedAttentionPrefill).
inline constexpr int64_t kAttentionQueryBlock = 16;

// Token blocks of a batch of num_tokens tokens.
inline int64_t attention_blocks(int64_t num_tokens) {
  return (num_tokens + kAttentionQueryBlock - 1) / kAttentionQueryBlock;
}

// Work items of a batch of num_tokens tokens: each token block through each KV head.
inline int64_t attention_items(int64_t num_tokens, int64_t n_kv_heads) {
  return attention_blocks(num_tokens) * n_kv_heads;
}

// A work item: a token block through a KV head.
struct AttentionItem {
  int64_t block;
  int64_t head;
};

// Item w of a batch of n_blocks token blocks and n_kv KV heads. heads_outer false: the items of
// a token block are consecutive, its KV heads in turn (a decode token's heads are read side by
// side, attend_decode_heads); true: the items of a KV head are, its token blocks in turn (a
// prompt's blocks read the same tiles one after another, so a thread's next block finds them in
// L2).
inline AttentionItem attention_item(bool heads_outer, int64_t n_blocks, int64_t n_kv, int64_t w) {
  return heads_outer ? AttentionItem{w % n_blocks, w / n_blocks}
                     : AttentionItem{w / n_kv, w % n_kv};
}

struct AttentionArgs {
  const KvCache* cache;
  int64_t layer;
  AttentionBatch batch;
  const float* q;   // [num_tokens][n_heads][head_dim]
  int64_t n_heads;  // query heads; a multiple of the cache's n_kv_heads
  int64_t group;    // n_heads / n_kv_heads
  float scale;
  float* out;  // [num_tokens][n_heads][head_dim]
  // Distinct for every call (KIVI: groups quantized on the fly are kept per thread for the call's
  // duration, and its K/V rows do not change during it).
  uint64_t call = 0;
  // Quest (AttentionBatch::block_budget), else null: the blocks row t reads through KV head g
  // are sel_blocks[sel_offsets[t * n_kv + g] .. sel_offsets[t * n_kv + g + 1]), block positions
  // in ascending order; an empty list: every block (the row's context is within its budget). The
  // work item that walks (t, g) fills its list first (select_quest_blocks).
  const int32_t* sel_offsets = nullptr;
  int32_t* sel_blocks = nullptr;
  // The items' order (attention_item).
  bool heads_outer = false;
};

// Quest: fills row t's list of blocks through KV head g (AttentionArgs::sel_blocks): its first
// block, its own, and the others with the largest upper bound on q.k (paged_attention.h). Plain
// f32 arithmetic in one translation unit (paged_attention.cpp), so every kernel walks the same
// blocks.
void select_quest_blocks(const AttentionArgs& args, int64_t t, int64_t g);

// Computes items [begin, end). `scratch` holds attention_scratch_floats(group, head_dim,
// n_kv_heads) floats private to the calling thread.
using AttentionKernel = void (*)(const AttentionArgs& args, int64_t begin, int64_t end,
                                 float* scratch);

// Query heads whose running state a work item's scratch holds: a token block's heads of one KV
// head, or a decode token's heads of every KV head (the walk reads a decode token's KV heads
// tile by tile, side by side).
inline int64_t attention_state_heads(int64_t group, int64_t n_kv_heads) {
  return (kAttentionQueryBlock > n_kv_heads ? kAttentionQueryBlock : n_kv_heads) * group;
}

// Room for attention_state_heads' accumulators, running maxima and sums, one tile's scores, and
// one tile's keys and values decoded to f32 (caches of other types than f32).
inline size_t attention_scratch_floats(int64_t group, int64_t head_dim, int64_t n_kv_heads) {
  return static_cast<size_t>(attention_state_heads(group, n_kv_heads) * (head_dim + 2) +
                             kAttentionTile + 2 * kAttentionTile * head_dim);
}

// The portable kernel (attention_scalar.cpp).
void paged_attention_scalar(const AttentionArgs& args, int64_t begin, int64_t end, float* scratch);

// The AVX2 + FMA kernel (attention_avx2.cpp); only callable on a CPU that has them.
void paged_attention_avx2(const AttentionArgs& args, int64_t begin, int64_t end, float* scratch);

// The AVX-512 kernel (attention_avx512.cpp: the AVX2 kernel with a prompt's tiles on 512-bit
// vectors); only callable on a CPU that has AVX-512 F. Run on hosts of Isa::kAvx512Vnni.
void paged_attention_avx512(const AttentionArgs& args, int64_t begin, int64_t end, float* scratch);

}  // namespace vesper::backend::cpu
