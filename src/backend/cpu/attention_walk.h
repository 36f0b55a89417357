// The paged-attention walk over a batch's work items (attend_items), each run of one sequence
// through one KV head (attend_run), and a decode token read in place over several KV heads side by
// side (attend_decode_heads). Its parts: attention_walk_tiles.h (the Tile contract, loaders, key
// ranges, trees) and attention_walk_kivi.h (KIVI caches).
//
// Cache use: an item is a block of up to kAttentionQueryBlock consecutive batch tokens and one KV
// head. Each tile's K/V rows (32 positions of that head) are resolved once and then used by every
// query of the block that reaches the tile, and by every query head of the group, while they sit
// in L1. Within the block, tokens of different sequences are walked separately. A decode token
// read in place (no tile to share) walks the KV heads of its block that the thread holds side
// by side, tile by tile, so its reads follow the cache's layout (attend_decode_heads).
//
// Everything here sits in an unnamed namespace: each kernel file includes it under its own target
// flags, and the copies must not be merged by the linker (an AVX2 copy must never serve the
// portable kernel).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cpu/attention_walk_kivi.h"
#include "backend/cpu/attention_walk_tiles.h"

namespace vesper::backend::cpu {
namespace {

// A run (consecutive tokens of one sequence) over KV head g: its running states (the first of
// the scratch's), its tiles, and its outputs.
template <class Tile>
void attend_run(const AttentionArgs& args, int64_t run_begin, int64_t run_end, int64_t g,
                const int32_t* table, bool tree, float* scratch) {
  const KvCacheSpec& shape = args.cache->spec();
  const int64_t head_dim = shape.head_dim, bs = shape.block_size, group = args.group;
  const AttentionBatch& batch = args.batch;
  WalkScratch ws(scratch, args);
  const std::byte* k_src[kAttentionTile];
  const std::byte* v_src[kAttentionTile];
  const float* k_rows[kAttentionTile];
  const float* v_rows[kAttentionTile];
  int64_t max_ctx = 0;
  for (int64_t t = run_begin; t < run_end; ++t)
    max_ctx = std::max(max_ctx, int64_t{batch.positions[t]} + 1);
  ws.reset((run_end - run_begin) * group, head_dim);

  const bool kivi = shape.kivi();
  thread_local KeyRanges ranges;
  key_ranges(args, run_begin, run_end, max_ctx, g, ranges);
  VESPER_CHECK(!walks_alone(args, run_begin) || (!tree && !(kivi && has_gap(batch, run_begin))),
               "a gap or a block selection in a tree row, or a gap in a KIVI cache");
  if (kivi)
    attend_kivi_run<Tile>(args, run_begin, run_end, g, table, tree, scratch);
  else if (tree)
    attend_tree_run<Tile>(args, run_begin, run_end, g, table, scratch);
  for (size_t r = 0; !tree && !kivi && r < ranges.size(); ++r)
    for (int64_t j0 = ranges[r].first, range_end = ranges[r].second; j0 < range_end;
         j0 += kAttentionTile) {
      const int64_t tile_keys = std::min(kAttentionTile, range_end - j0);
      // The next tile, for a run of one token (a decode step with grouped-query heads, from
      // memory) only: a prompt chunk's token blocks read the same tiles one after another, so
      // theirs come from L2, and prefetching lines already there (256 a tile at f32, head size 64)
      // took 9% of a 512-token prefill's attention.
      if (run_end - run_begin == 1 && j0 + kAttentionTile < range_end)
        prefetch_tile(*args.cache, args.layer, g, table, j0 + kAttentionTile,
                      std::min(j0 + 2 * kAttentionTile, range_end));
      tile_rows(*args.cache, args.layer, g, table, bs, j0, tile_keys, k_src, v_src);
      load_tile<Tile>(shape, k_src, v_src, tile_keys, k_rows, v_rows, ws.k_tile, ws.v_tile);
      auto queries = tile_queries<Tile>(k_rows, v_rows, head_dim, args.scale, ws.scores);
      for (int64_t t = run_begin; t < run_end; ++t) {
        const int64_t n_ctx = int64_t{batch.positions[t]} + 1;
        if (n_ctx <= j0) continue;  // causal: this query's keys ended in an earlier tile
        const int64_t nt = std::min(tile_keys, n_ctx - j0);
        const float* q = args.q + (t * args.n_heads + g * group) * head_dim;
        const int64_t first = (t - run_begin) * group;
        for (int64_t h = 0; h < group; ++h)
          queries.add(q + h * head_dim, nt, ws.acc + (first + h) * head_dim, ws.run_max[first + h],
                      ws.run_sum[first + h]);
      }
      queries.flush();
    }

  for (int64_t t = run_begin; t < run_end; ++t) {
    float* out = args.out + (t * args.n_heads + g * group) * head_dim;
    const int64_t first = (t - run_begin) * group;
    for (int64_t h = 0; h < group; ++h)
      Tile::finish(ws.acc + (first + h) * head_dim, ws.run_sum[first + h], head_dim,
                   out + h * head_dim);
  }
}

// One decode token t (a run of one, not a tree) over KV heads [g_begin, g_end) of a row-type
// cache read in place: tile by tile, and within a tile head after head. A block holds its heads'
// rows back to back, so the walk reads each block's heads as one sequential stream (n_kv runs of
// block_size rows) instead of one head's run per block (2 KB at f16, head size 64, 16-token
// blocks, scattered over the cache). While a head's tile is worked on, the next head's (or the
// next tile's first head's) rows are prefetched into L2 (prefetcht1): a head's tile takes a few
// hundred nanoseconds, more than a read from memory, so its rows arrive in time, and L1 is left to
// the demand loads. Into L1 (prefetcht0) the same prefetches made single-stream decode from the
// last-level cache about 1.3x slower (their bursts fill the line-fill buffers ahead of the demand
// loads); into L2, with the tile's lines read in order (read_lines_in_order), decode steps from
// memory took 5-20% less time than with the in-order reads alone (`vesper_microbench`'s
// BM_PagedAttentionDecodeLockstep and BM_PagedAttentionDecode; AMD Zen 5), and with both the 110M
// model's 32-sequence decode ran a median 12-15% faster end to end (bench/RESULTS.md, 2026-12-07
// night). Each head's reduction is attend_run's: the same tiles in the same order.
template <class Tile>
void attend_decode_heads(const AttentionArgs& args, int64_t t, int64_t g_begin, int64_t g_end,
                         const int32_t* table, float* scratch) {
  const KvCacheSpec& shape = args.cache->spec();
  const int64_t head_dim = shape.head_dim, bs = shape.block_size, group = args.group;
  WalkScratch ws(scratch, args);
  const std::byte* k_src[kAttentionTile];
  const std::byte* v_src[kAttentionTile];
  const int64_t n_ctx = int64_t{args.batch.positions[t]} + 1;
  ws.reset((g_end - g_begin) * group, head_dim);
  const float* q = args.q + t * args.n_heads * head_dim;
  thread_local KeyRanges ranges;
  // One tile of KV head g: keys [j0, j0 + nt).
  auto tile = [&](int64_t g, int64_t j0, int64_t nt) {
    tile_rows(*args.cache, args.layer, g, table, bs, j0, nt, k_src, v_src);
    const int64_t first = (g - g_begin) * group;
    // Grouped-query heads two at a time where the kernel can (Tile::tile2_in_place).
    auto queries =
        in_place_queries<Tile>(shape.dtypes, head_dim, k_src, v_src, args.scale, ws.scores);
    for (int64_t h = 0; h < group; ++h)
      queries.add(q + (g * group + h) * head_dim, nt, ws.acc + (first + h) * head_dim,
                  ws.run_max[first + h], ws.run_sum[first + h]);
    queries.flush();
  };
  if (has_selection(args, t)) {
    // Quest: each KV head its own blocks, head after head (the same tiles, in the same order, as
    // attend_run's).
    for (int64_t g = g_begin; g < g_end; ++g) {
      key_ranges(args, t, t + 1, n_ctx, g, ranges);
      for (size_t r = 0; r < ranges.size(); ++r)
        for (int64_t j0 = ranges[r].first; j0 < ranges[r].second; j0 += kAttentionTile)
          tile(g, j0, std::min(kAttentionTile, ranges[r].second - j0));
    }
  } else {
    key_ranges(args, t, t + 1, n_ctx, g_begin, ranges);  // the same for every head
    for (size_t r = 0; r < ranges.size(); ++r)
      for (int64_t j0 = ranges[r].first, end = ranges[r].second; j0 < end; j0 += kAttentionTile) {
        const int64_t nt = std::min(kAttentionTile, end - j0);
        for (int64_t g = g_begin; g < g_end; ++g) {
          if (g + 1 < g_end)
            prefetch_tile<2>(*args.cache, args.layer, g + 1, table, j0, j0 + nt);
          else if (j0 + kAttentionTile < end)
            prefetch_tile<2>(*args.cache, args.layer, g_begin, table, j0 + kAttentionTile,
                             std::min(j0 + 2 * kAttentionTile, end));
          tile(g, j0, nt);
        }
      }
  }
  for (int64_t g = g_begin; g < g_end; ++g) {
    const int64_t first = (g - g_begin) * group;
    for (int64_t h = 0; h < group; ++h)
      Tile::finish(ws.acc + (first + h) * head_dim, ws.run_sum[first + h], head_dim,
                   args.out + (t * args.n_heads + g * group + h) * head_dim);
  }
}

// Items [begin, end) in args' order (attention_item): item after item, a token block's KV heads
// that follow one another in the range together, run by run.
template <class Tile>
void attend_items(const AttentionArgs& args, int64_t begin, int64_t end, float* scratch) {
  const KvCacheSpec& shape = args.cache->spec();
  const int64_t n_kv = shape.n_kv_heads;
  const AttentionBatch& batch = args.batch;
  const int64_t n_blocks = attention_blocks(batch.num_tokens);
  for (int64_t w = begin; w < end;) {
    const AttentionItem item = attention_item(args.heads_outer, n_blocks, n_kv, w);
    const int64_t block_begin = item.block * kAttentionQueryBlock;
    const int64_t block_end = std::min(block_begin + kAttentionQueryBlock, batch.num_tokens);
    const int64_t g_begin = item.head;
    const int64_t g_end = args.heads_outer ? g_begin + 1 : std::min(n_kv, g_begin + (end - w));
    w += g_end - g_begin;
    // Quest: this item's rows' choices through its KV heads, before the walk reads them.
    for (int64_t t = block_begin; t < block_end && args.sel_offsets != nullptr; ++t)
      if (has_selection(args, t))
        for (int64_t g = g_begin; g < g_end; ++g) select_quest_blocks(args, t, g);
    for (int64_t run_begin = block_begin, run_end; run_begin < block_end; run_begin = run_end) {
      // A run: consecutive tokens of one sequence (one block table).
      const int32_t seq = batch.token_seq[run_begin];
      // A row with a gap (sinks + window) or a block selection (Quest) reads keys of its own: a
      // run of its own.
      run_end = run_begin + 1;
      if (!walks_alone(args, run_begin))
        while (run_end < block_end && batch.token_seq[run_end] == seq &&
               !walks_alone(args, run_end))
          ++run_end;
      const int32_t* table = batch.block_tables + batch.table_offsets[seq];
      const bool tree =
          batch.tree_parents != nullptr && batch.tree_parents[run_begin] != kNotInTree;
      if (run_end - run_begin == 1 && !tree && !shape.kivi() &&
          reads_in_place<Tile>(shape.dtypes, args.group)) {
        attend_decode_heads<Tile>(args, run_begin, g_begin, g_end, table, scratch);
        continue;
      }
      for (int64_t g = g_begin; g < g_end; ++g)
        attend_run<Tile>(args, run_begin, run_end, g, table, tree, scratch);
    }
  }
}

}  // namespace
}  // namespace vesper::backend::cpu
