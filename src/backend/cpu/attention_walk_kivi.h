// The paged-attention walk over KIVI caches (attention_walk.h's attend_run hands a KIVI sequence's
// runs here): per tile, a group stored quantized is read from its block, a group still held as
// residual rows is read as written, or quantized on the fly for the queries that read it
// quantized. In an unnamed namespace, as attention_walk_tiles.h explains.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "backend/cpu/attention_walk_tiles.h"

namespace vesper::backend::cpu {
namespace {

// Queries [t_begin, t_end) of one sequence (a run; state indexed from run_begin) over a KIVI
// cache (paged_attention.h's quantized_groups). For a tree row (path non-null), positions from
// `context` on are read from its path's slots. Every tile lies within one group (block_size is a
// multiple of kAttentionTile). Per tile: a group stored quantized is read from its block (codes
// unpacked, kivi_tile); a group stored as residual rows is read as written, and, for the queries
// that read it quantized, quantized once per call exactly as compaction does
// (KvCache::encode_group_units) and read as a stored one. A Quest row reads its selected groups
// only, in ascending order.
template <class Tile>
void attend_kivi_rows(const AttentionArgs& args, int64_t run_begin, int64_t t_begin, int64_t t_end,
                      int64_t g, const int32_t* table, int64_t quantized,
                      const std::vector<int64_t>* path, int64_t context, float* scratch) {
  const KvCacheSpec& spec = args.cache->spec();
  const int64_t head_dim = spec.head_dim, bs = spec.block_size, group = args.group;
  const KvTableLayout layout = KvTableLayout(spec).with_quantized(quantized);
  const int64_t per_group = layout.blocks_per_group;
  const KvDtype k_row_type = kv_row_dtype(spec.dtypes.k), v_row_type = kv_row_dtype(spec.dtypes.v);
  const KvDtypes row_types{k_row_type, v_row_type};
  bool in_place = false;  // this tile's rows are read where they lie (tile_in_place)
  const AttentionBatch& batch = args.batch;
  const WalkScratch ws(scratch, args);
  float *run_max = ws.run_max, *run_sum = ws.run_sum, *scores = ws.scores, *acc = ws.acc;
  float *k_tile = ws.k_tile, *v_tile = ws.v_tile;
  // A tile read quantized: row-type sides decoded, KIVI sides' codes unpacked, and the per-head
  // scratch of kivi_tile.
  const int64_t runs = kivi_value_channel_groups(bs, head_dim);
  struct KiviScratch {
    std::vector<float> rows;     // [2][kAttentionTile][head_dim]
    std::vector<uint8_t> codes;  // [2][kAttentionTile][head_dim]
    std::vector<int16_t> q16;    // [2][head_dim]
    // Key parameters [2][head_dim], value parameters [runs][2][kAttentionTile], weights
    // [2][runs][kAttentionTile], zero terms [2][runs].
    std::vector<float> terms;
  };
  thread_local KiviScratch ks;
  ks.rows.resize(static_cast<size_t>(2 * kAttentionTile * head_dim));
  ks.codes.resize(static_cast<size_t>(2 * kAttentionTile * head_dim));
  ks.q16.resize(static_cast<size_t>(2 * head_dim));
  ks.terms.resize(static_cast<size_t>(2 * head_dim + 4 * kAttentionTile * runs + 2 * runs));
  KiviTile kt;
  kt.spec = &spec;
  kt.q16 = ks.q16.data();
  float* k_params = ks.terms.data();
  float* v_params = k_params + 2 * head_dim;
  kt.weights = v_params + 2 * kAttentionTile * runs;
  kt.zero_terms = kt.weights + 2 * kAttentionTile * runs;
  // Groups this thread quantized on the fly during this call, by (first residual block, KV
  // head): each is quantized once per call, not once per run of queries reading it.
  struct MadeGroups {
    uint64_t call = 0;
    std::unordered_map<uint64_t, size_t> at;  // offset of the key unit; the value unit follows
    std::vector<std::byte> bytes;
  };
  thread_local MadeGroups made;
  if (made.call != args.call) {
    made.call = args.call;
    made.at.clear();
    made.bytes.clear();
  }
  const int64_t k_unit_bytes = spec.key_unit_bytes(), v_unit_bytes = spec.value_unit_bytes();
  float* qk_tile = ks.rows.data();
  float* qv_tile = qk_tile + kAttentionTile * head_dim;
  uint8_t* k_codes = ks.codes.data();
  uint8_t* v_codes = k_codes + kAttentionTile * head_dim;
  const std::byte* k_src[kAttentionTile];
  const std::byte* v_src[kAttentionTile];
  const float* k_rows[kAttentionTile];
  const float* v_rows[kAttentionTile];
  const float* qk_rows[kAttentionTile];
  const float* qv_rows[kAttentionTile];
  for (int64_t i = 0; i < kAttentionTile; ++i) {
    qk_rows[i] = qk_tile + i * head_dim;
    qv_rows[i] = qv_tile + i * head_dim;
  }
  // Sets kt up for a tile of n rows from `first` of the quantized group whose units are k_unit,
  // v_unit.
  auto load_side = [&](KvDtype dtype, KvSide side, const std::byte* unit, int64_t first, int64_t n,
                       uint8_t* codes, float* params, float* tile, const float* const* rows) {
    KiviTile::Side out;
    if (kv_is_kivi(dtype)) {
      Tile::unpack_group(spec, dtype, side, unit, first, n, codes, params);
      out.codes = codes;
      out.params = params;
    } else {
      Tile::decode_group(spec, dtype, side, unit, first, n, tile);
      out.rows = rows;
    }
    return out;
  };
  auto load_quantized = [&](const std::byte* k_unit, const std::byte* v_unit, int64_t first,
                            int64_t n) {
    kt.k = load_side(spec.dtypes.k, KvSide::kKey, k_unit, first, n, k_codes, k_params, qk_tile,
                     qk_rows);
    kt.v = load_side(spec.dtypes.v, KvSide::kValue, v_unit, first, n, v_codes, v_params, qv_tile,
                     qv_rows);
  };
  // The slot of position j's residual row.
  auto residual_slot = [&](int64_t j) -> int64_t {
    if (path != nullptr && j >= context) return (*path)[static_cast<size_t>(j - context)];
    return int64_t{table[layout.entry(j)]} * layout.rows_per_block + layout.row(j);
  };
  int64_t max_ctx = 0;
  for (int64_t t = t_begin; t < t_end; ++t)
    max_ctx = std::max(max_ctx, int64_t{batch.positions[t]} + 1);
  // [0, max_ctx), or the groups a Quest row selected (such a row is a run of its own).
  thread_local KeyRanges ranges;
  key_ranges(args, t_begin, t_end, max_ctx, g, ranges);
  for (const auto& [range_begin, range_end] : ranges)
    for (int64_t j0 = range_begin; j0 < range_end; j0 += kAttentionTile) {
      const int64_t tile_keys = std::min(kAttentionTile, range_end - j0), gi = j0 / bs;
      const bool stored_quantized = gi < quantized;
      in_place = false;
      // Whether some query of the run reads this tile quantized, and whether some reads its rows
      // as written (a prompt chunk's queries past the residual window read its older groups
      // quantized; decoding their rows as well would be wasted).
      bool read_quantized = stored_quantized, read_rows = false;
      for (int64_t t = t_begin; t < t_end && !stored_quantized; ++t) {
        if (batch.positions[t] < j0) continue;
        if (spec.kivi_quantized_tokens(batch.positions[t]) > j0)
          read_quantized = true;
        else
          read_rows = true;
      }
      if (stored_quantized) {
        // The next group's units, while this one is decoded (the hardware prefetcher does not
        // follow the block table).
        if (j0 % bs == 0 && gi + 1 < quantized && (gi + 1) * bs < range_end) {
          const std::byte* nk = args.cache->key_run(args.layer, table[gi + 1], g);
          const std::byte* nv = args.cache->value_run(args.layer, table[gi + 1], g);
          for (int64_t at = 0; at < k_unit_bytes; at += 64) __builtin_prefetch(nk + at);
          for (int64_t at = 0; at < v_unit_bytes; at += 64) __builtin_prefetch(nv + at);
        }
        load_quantized(args.cache->key_run(args.layer, table[gi], g),
                       args.cache->value_run(args.layer, table[gi], g), j0 % bs, tile_keys);
      } else {
        if (path == nullptr) {
          // The group's residual blocks in order, rows_per rows each.
          tile_rows(*args.cache, args.layer, g, layout.group_rows(table, gi), layout.rows_per_block,
                    j0 % bs, tile_keys, k_src, v_src);
        } else {
          for (int64_t i = 0; i < tile_keys; ++i) {
            const int64_t slot = residual_slot(j0 + i);
            k_src[i] = args.cache->key_row(args.layer, slot, g);
            v_src[i] = args.cache->value_row(args.layer, slot, g);
          }
        }
        // One query reading the rows as written: in place, as in attend_items.
        in_place =
            !read_quantized && t_end - t_begin == 1 && reads_in_place<Tile>(row_types, group);
        if (read_rows && !in_place) {
          load_rows<Tile>(k_row_type, k_src, tile_keys, head_dim, k_rows, k_tile);
          load_rows<Tile>(v_row_type, v_src, tile_keys, head_dim, v_rows, v_tile);
        }
        if (read_quantized) {
          const int32_t* rows = layout.group_rows(table, gi);
          const uint64_t key = static_cast<uint64_t>(rows[0]) << 24 | static_cast<uint64_t>(g);
          auto [it, fresh] = made.at.try_emplace(key, made.bytes.size());
          if (fresh) {
            made.bytes.resize(made.bytes.size() + static_cast<size_t>(k_unit_bytes + v_unit_bytes));
            std::byte* unit = made.bytes.data() + it->second;
            args.cache->encode_group_units(
                args.layer, g, std::span<const int32_t>(rows, static_cast<size_t>(per_group)), unit,
                unit + k_unit_bytes);
          }
          const std::byte* unit = made.bytes.data() + it->second;
          load_quantized(unit, unit + k_unit_bytes, j0 % bs, tile_keys);
        }
      }
      // The queries reading this tile's rows as written (decoded), two at a time.
      auto row_queries = tile_queries<Tile>(k_rows, v_rows, head_dim, args.scale, scores);
      auto quantized_queries = kivi_queries<Tile>(kt, args.scale, scores);
      for (int64_t t = t_begin; t < t_end; ++t) {
        const int64_t n_ctx = int64_t{batch.positions[t]} + 1;
        if (n_ctx <= j0) continue;
        const int64_t nt = std::min(kAttentionTile, n_ctx - j0);
        const bool quantized_here = stored_quantized || spec.kivi_quantized_tokens(n_ctx - 1) > j0;
        const float* q = args.q + (t * args.n_heads + g * group) * head_dim;
        const int64_t first = (t - run_begin) * group;
        for (int64_t h = 0; h < group; ++h)
          if (quantized_here)
            quantized_queries.add(q + h * head_dim, nt, acc + (first + h) * head_dim,
                                  run_max[first + h], run_sum[first + h]);
          else if (in_place)
            tile_in_place<Tile>(row_types, head_dim, q + h * head_dim, k_src, v_src, nt, args.scale,
                                scores, acc + (first + h) * head_dim, run_max[first + h],
                                run_sum[first + h]);
          else
            row_queries.add(q + h * head_dim, nt, acc + (first + h) * head_dim, run_max[first + h],
                            run_sum[first + h]);
      }
      row_queries.flush();
      quantized_queries.flush();
    }
}

// A run of a KIVI cache: a chain's queries share tiles; a tree's rows are walked one at a time.
template <class Tile>
void attend_kivi_run(const AttentionArgs& args, int64_t run_begin, int64_t run_end, int64_t g,
                     const int32_t* table, bool tree, float* scratch) {
  const AttentionBatch& batch = args.batch;
  const int32_t seq = batch.token_seq[run_begin];
  const int64_t quantized = batch.quantized_groups != nullptr ? batch.quantized_groups[seq] : 0;
  if (!tree) {
    attend_kivi_rows<Tile>(args, run_begin, run_begin, run_end, g, table, quantized, nullptr, 0,
                           scratch);
    return;
  }
  thread_local std::vector<int64_t> path;
  const int64_t context = batch.positions[batch.query_start[seq]];
  for (int64_t t = run_begin; t < run_end; ++t) {
    VESPER_CHECK(args.cache->spec().kivi_quantized_tokens(batch.positions[t]) <= context,
                 "KIVI: a tree row at position %d would read its own path quantized",
                 batch.positions[t]);
    tree_path(batch, t, path);
    attend_kivi_rows<Tile>(args, run_begin, t, t + 1, g, table, quantized, &path, context, scratch);
  }
}

}  // namespace
}  // namespace vesper::backend::cpu
