// The common part of the paged-attention walk (attention_walk.h): the Tile contract (what a kernel
// supplies: the per-tile arithmetic), the tile loaders, query pairing, key ranges (sinks + window
// gaps, Quest selections) and tree rows. The walk is the same for every ISA, so the order of
// every query's reduction is fixed here once (attention_kernel.h's contract); attention_walk_kivi.h
// walks KIVI caches on it.
//
// Everything here sits in an unnamed namespace: each kernel file includes it under its own target
// flags, and the copies must not be merged by the linker (an AVX2 copy must never serve the
// portable kernel).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "backend/cpu/attention_kernel.h"
#include "backend/kv_codec.h"
#include "backend/kv_table_layout.h"
#include "core/check.h"

namespace vesper::backend::cpu {
namespace {

// Compressed caches: each tile's rows are decoded once into scratch (32 rows of keys and of
// values, in L1) by the kernel's decoder and then serve every query and head that reaches the
// tile, so memory traffic is the compressed bytes and the decode costs once per tile, not per
// query head. f32 rows are used in place, and so are rows of any row type where a tile serves a
// single query head (tile_in_place below, when the kernel has it). KIVI groups are not decoded:
// their codes are unpacked to bytes once per tile and enter the dot products directly (kivi_tile).
//
// Tile must provide:
//   static void decode(KvDtype dtype, const std::byte* const* rows, int64_t n, int64_t head_dim,
//                      float* out);
//     out[i * head_dim ..] = decode_kv_row of rows[i], i < n (bit for bit; kv_codec.h).
//   static void tile(const float* q, const float* const* k_rows, const float* const* v_rows,
//                    int64_t nt, int64_t head_dim, float scale, float* scores, float* acc,
//                    float& run_max, float& run_sum);
//     folds keys [0, nt) of one tile (nt <= kAttentionTile) into one query head's running state
//     (acc[head_dim], run_max, run_sum); scores has room for kAttentionTile floats.
//   static void decode_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
//                            const std::byte* group, int64_t first, int64_t n, float* out);
//     rows [first, first + n) of a group's row-type side (K8V2's int8 keys), as
//     decode_kv_group_rows gives them.
//   static void finish(const float* acc, float run_sum, int64_t head_dim, float* out);
//     writes out[d] = acc[d] * (1 / run_sum).
//   static void unpack_group(const KvCacheSpec& spec, KvDtype dtype, KvSide side,
//                            const std::byte* group, int64_t first, int64_t n, uint8_t* codes,
//                            float* params);
//     codes[i * head_dim + c] = element c's code in row first + i of a KIVI group, i < n, and
//     the parameters as KiviTile lays them out (k.params or v.params).
//   static void kivi_tile(const KiviTile& t, const float* q, int64_t nt, float scale,
//                         float* scores, float* acc, float& run_max, float& run_sum);
//     tile() for a tile read quantized, its KIVI sides straight from their codes
//     (attention_kernel.h's KIVI terms).
// and may provide:
//   static void tile2(const float* const* q, const float* const* k_rows,
//                     const float* const* v_rows, int64_t nt, int64_t head_dim, float scale,
//                     float* const* acc, float* const* run_max, float* const* run_sum);
//     tile() for two query heads q[0], q[1] over the same keys [0, nt), each state (acc[i],
//     *run_max[i], *run_sum[i]) exactly as tile() leaves it;
//   static void kivi_tile2(const KiviTile& t, const float* const* q, int64_t nt, float scale,
//                          float* const* acc, float* const* run_max, float* const* run_sum);
//     kivi_tile() for two queries over the same keys, each state exactly as kivi_tile() leaves
//     it (t's per-query scratch holds two queries' worth);
//   static void tile_in_place(KvDtypes rows, int64_t head_dim, const float* q,
//                             const std::byte* const* k_rows, const std::byte* const* v_rows,
//                             int64_t nt, float scale, float* scores, float* acc,
//                             float& run_max, float& run_sum);
//     tile() over rows of the row types `rows` as they lie in the cache, each decoded as it is
//     read, to the same values as decode (KIVI's residual rows too);
//   static void tile2_in_place(KvDtypes rows, int64_t head_dim, const float* const* q,
//                              const std::byte* const* k_rows, const std::byte* const* v_rows,
//                              int64_t nt, float scale, float* const* acc,
//                              float* const* run_max, float* const* run_sum);
//     tile_in_place() for two query heads q[0], q[1] (a decode token's grouped-query heads), each
//     state exactly as tile_in_place() leaves it;
//   static int64_t in_place_heads(KvDtype dtype);
//     the most query heads for which reading a tile of `dtype` in place, once per head, costs
//     less than decoding it once: the walk reads a decode step's tiles in place when its query
//     heads per KV head are no more than this for both types.

// One tile of a group read quantized (KIVI), as Tile::kivi_tile takes it: each side either a
// KIVI group's codes, one byte per element, with its parameters as f32, unpacked once per tile
// for every query and head that reaches it; or, for a row type (K8V2's int8 keys), the decoded
// rows.
struct KiviTile {
  // One side (keys or values): a KIVI side's codes and parameters, or a row type's decoded rows.
  struct Side {
    const uint8_t* codes = nullptr;
    const float* params = nullptr;
    const float* const* rows = nullptr;
  };
  const KvCacheSpec* spec = nullptr;
  // Keys: KIVI parameters are the group's per-channel scales and zero points as f32
  // ([2][head_dim]).
  Side k;
  // Values: KIVI parameters are each row's per-run scale and zero point as f32
  // ([runs][2][kAttentionTile]: scales of run r at (2r) * kAttentionTile, zero points at
  // (2r + 1) * kAttentionTile, rows past the tile's end 0).
  Side v;
  // Per-query scratch, twice over (kivi_tile2 uses both halves; kivi_tile the first): the query's
  // 16-bit key terms [2][head_dim]; the values' per-key weights [2][runs][kAttentionTile] and
  // per-run zero terms [2][runs].
  int16_t* q16 = nullptr;
  float* weights = nullptr;
  float* zero_terms = nullptr;
};

// A work item's scratch (attention_scratch_floats), carved: the running state of
// attention_state_heads query heads, one tile's scores, and one tile's keys and values decoded to
// f32.
struct WalkScratch {
  float* run_max;  // [heads]
  float* run_sum;  // [heads]
  float* scores;   // [kAttentionTile]
  float* acc;      // [heads][head_dim]
  float* k_tile;   // [kAttentionTile][head_dim]
  float* v_tile;   // [kAttentionTile][head_dim]

  WalkScratch(float* scratch, const AttentionArgs& args) {
    const int64_t head_dim = args.cache->spec().head_dim;
    const int64_t heads = attention_state_heads(args.group, args.cache->spec().n_kv_heads);
    run_max = scratch;
    run_sum = run_max + heads;
    scores = run_sum + heads;
    acc = scores + kAttentionTile;
    k_tile = acc + heads * head_dim;
    v_tile = k_tile + kAttentionTile * head_dim;
  }

  // Resets the first `heads` states to the empty reduction.
  void reset(int64_t heads, int64_t head_dim) {
    std::fill(acc, acc + heads * head_dim, 0.0f);
    std::fill(run_max, run_max + heads, -INFINITY);
    std::fill(run_sum, run_sum + heads, 0.0f);
  }
};

// Points rows[0, nt) at a tile's rows of `dtype` (src) as f32: in place for f32, else decoded into
// `tile` ([kAttentionTile][head_dim]) by the kernel's decoder, the whole tile in one call.
template <class Tile>
void load_rows(KvDtype dtype, const std::byte* const* src, int64_t nt, int64_t head_dim,
               const float** rows, float* tile) {
  if (dtype == KvDtype::kF32) {
    for (int64_t i = 0; i < nt; ++i) rows[i] = reinterpret_cast<const float*>(src[i]);
    return;
  }
  Tile::decode(dtype, src, nt, head_dim, tile);
  for (int64_t i = 0; i < nt; ++i) rows[i] = tile + i * head_dim;
}

// A tile's keys and values as f32 rows (load_rows for each).
template <class Tile>
void load_tile(const KvCacheSpec& spec, const std::byte* const* k_src,
               const std::byte* const* v_src, int64_t nt, const float** k_rows,
               const float** v_rows, float* k_tile, float* v_tile) {
  load_rows<Tile>(spec.dtypes.k, k_src, nt, spec.head_dim, k_rows, k_tile);
  load_rows<Tile>(spec.dtypes.v, v_src, nt, spec.head_dim, v_rows, v_tile);
}

// Points k_src / v_src[0, n) at head g's K / V rows first .. first + n of a run of blocks,
// `rows_per` rows each (a table of block_size rows, or a KIVI group's residual blocks), stepping
// from block to block without a division per key (an integer division costs more than a key's
// whole dot product at small head sizes).
inline void tile_rows(const KvCache& cache, int64_t layer, int64_t g, const int32_t* blocks,
                      int64_t rows_per, int64_t first, int64_t n, const std::byte** k_src,
                      const std::byte** v_src) {
  const int64_t k_row = cache.spec().key_row_bytes(), v_row = cache.spec().value_row_bytes();
  int64_t b = first / rows_per, row = first % rows_per;
  const std::byte* k_run = cache.key_run(layer, blocks[b], g);
  const std::byte* v_run = cache.value_run(layer, blocks[b], g);
  for (int64_t i = 0; i < n; ++i) {
    k_src[i] = k_run + row * k_row;
    v_src[i] = v_run + row * v_row;
    if (++row == rows_per && i + 1 < n) {
      row = 0;
      ++b;
      k_run = cache.key_run(layer, blocks[b], g);
      v_run = cache.value_run(layer, blocks[b], g);
    }
  }
}

// Prefetches the rows of keys [begin, end) of KV head g (a tile), K and V, through the table, with
// __builtin_prefetch's temporal locality kLocality (3: into every level, prefetcht0; 2: prefetcht1,
// which leaves L1 to the demand loads).
template <int kLocality = 3>
void prefetch_tile(const KvCache& cache, int64_t layer, int64_t g, const int32_t* table,
                   int64_t begin, int64_t end) {
  const KvCacheSpec& spec = cache.spec();
  const int64_t bs = spec.block_size, k_row = spec.key_row_bytes(), v_row = spec.value_row_bytes();
  for (int64_t b = begin / bs; b * bs < end; ++b) {
    const int64_t first = std::max(b * bs, begin) - b * bs;
    const int64_t last = std::min((b + 1) * bs, end) - b * bs;
    const std::byte* kp = cache.key_run(layer, table[b], g);
    const std::byte* vp = cache.value_run(layer, table[b], g);
    for (int64_t at = first * k_row; at < last * k_row; at += 64)
      __builtin_prefetch(kp + at, 0, kLocality);
    for (int64_t at = first * v_row; at < last * v_row; at += 64)
      __builtin_prefetch(vp + at, 0, kLocality);
  }
}

// Whether a tile of rows of `rows` serving `heads` query heads is read in place (the kernel has
// tile_in_place and finds it cheaper than a decoded copy).
template <class Tile>
bool reads_in_place(KvDtypes rows, int64_t heads) {
  if constexpr (requires { &Tile::tile_in_place; })
    return heads <= std::min(Tile::in_place_heads(rows.k), Tile::in_place_heads(rows.v));
  return false;
}

// Tile::tile_in_place where the kernel has it (only called where reads_in_place holds).
template <class Tile>
void tile_in_place(KvDtypes rows, int64_t head_dim, const float* q, const std::byte* const* k_src,
                   const std::byte* const* v_src, int64_t nt, float scale, float* scores,
                   float* acc, float& run_max, float& run_sum) {
  if constexpr (requires { &Tile::tile_in_place; })
    Tile::tile_in_place(rows, head_dim, q, k_src, v_src, nt, scale, scores, acc, run_max, run_sum);
}

// Gathers the queries that reach one tile and passes them on two at a time where both take the
// same keys (every query past the tile's end: all but the causal diagonal's): pair(q, nt, acc,
// run_max, run_sum) with arrays of two, so that each key and value chunk loaded serves both;
// single(q, nt, acc, run_max, run_sum) for a query left without a partner. Each query's
// arithmetic must be the same either way. Without a pair (Pair = std::nullptr_t: the kernel has
// no two-query form) every query goes to single() as it comes. flush() before the tile changes.
template <class Single, class Pair>
class QueryPairs {
 public:
  QueryPairs(Single single, Pair pair) : single_(single), pair_(pair) {}

  void add(const float* q, int64_t nt, float* acc, float& run_max, float& run_sum) {
    if constexpr (std::is_same_v<Pair, std::nullptr_t>) {
      single_(q, nt, acc, run_max, run_sum);
    } else if (pending_ && pending_nt_ == nt) {
      q_[1] = q;
      acc_[1] = acc;
      run_max_[1] = &run_max;
      run_sum_[1] = &run_sum;
      pair_(q_, nt, acc_, run_max_, run_sum_);
      pending_ = false;
    } else {
      flush();
      pending_ = true;
      pending_nt_ = nt;
      q_[0] = q;
      acc_[0] = acc;
      run_max_[0] = &run_max;
      run_sum_[0] = &run_sum;
    }
  }

  void flush() {
    if (!pending_) return;
    single_(q_[0], pending_nt_, acc_[0], *run_max_[0], *run_sum_[0]);
    pending_ = false;
  }

 private:
  Single single_;
  Pair pair_;
  // The pair being gathered: [0] waits (pending_) for a partner with the same keys.
  bool pending_ = false;
  int64_t pending_nt_ = 0;
  const float* q_[2] = {};
  float* acc_[2] = {};
  float* run_max_[2] = {};
  float* run_sum_[2] = {};
};

// The queries of a tile of decoded rows: Tile::tile, paired through Tile::tile2 where the kernel
// has it.
template <class Tile>
auto tile_queries(const float* const* k_rows, const float* const* v_rows, int64_t head_dim,
                  float scale, float* scores) {
  auto single = [=](const float* q, int64_t nt, float* acc, float& run_max, float& run_sum) {
    Tile::tile(q, k_rows, v_rows, nt, head_dim, scale, scores, acc, run_max, run_sum);
  };
  if constexpr (requires { &Tile::tile2; }) {
    auto pair = [=](const float* const* q, int64_t nt, float* const* acc, float* const* run_max,
                    float* const* run_sum) {
      Tile::tile2(q, k_rows, v_rows, nt, head_dim, scale, acc, run_max, run_sum);
    };
    return QueryPairs(single, pair);
  } else {
    return QueryPairs(single, nullptr);
  }
}

// The queries of a tile read in place (a decode token's heads): tile_in_place, paired through
// Tile::tile2_in_place where the kernel has it.
template <class Tile>
auto in_place_queries(KvDtypes rows, int64_t head_dim, const std::byte* const* k_src,
                      const std::byte* const* v_src, float scale, float* scores) {
  auto single = [=](const float* q, int64_t nt, float* acc, float& run_max, float& run_sum) {
    tile_in_place<Tile>(rows, head_dim, q, k_src, v_src, nt, scale, scores, acc, run_max, run_sum);
  };
  if constexpr (requires { &Tile::tile2_in_place; }) {
    auto pair = [=](const float* const* q, int64_t nt, float* const* acc, float* const* run_max,
                    float* const* run_sum) {
      Tile::tile2_in_place(rows, head_dim, q, k_src, v_src, nt, scale, acc, run_max, run_sum);
    };
    return QueryPairs(single, pair);
  } else {
    return QueryPairs(single, nullptr);
  }
}

// The queries of a tile read quantized (KIVI): Tile::kivi_tile, paired through Tile::kivi_tile2
// where the kernel has it.
template <class Tile>
auto kivi_queries(const KiviTile& kt, float scale, float* scores) {
  const KiviTile* t = &kt;
  auto single = [=](const float* q, int64_t nt, float* acc, float& run_max, float& run_sum) {
    Tile::kivi_tile(*t, q, nt, scale, scores, acc, run_max, run_sum);
  };
  if constexpr (requires { &Tile::kivi_tile2; }) {
    auto pair = [=](const float* const* q, int64_t nt, float* const* acc, float* const* run_max,
                    float* const* run_sum) {
      Tile::kivi_tile2(*t, q, nt, scale, acc, run_max, run_sum);
    };
    return QueryPairs(single, pair);
  } else {
    return QueryPairs(single, nullptr);
  }
}

// The key positions a run reads through KV head g, as ranges walked in ascending order, each in
// tiles from its start: [0, max_ctx) for an ordinary run (every query clips to its own context);
// for a row with a gap (sinks + window, paged_attention.h; always a run of its own)
// [0, gap_begin) and [gap_end, its position]; for a row with a block selection (Quest) the runs
// of adjacent selected blocks, the last one cut at its position. A row's reduction thus depends on
// its position, gap or selection alone, whatever the batch.
using KeyRanges = std::vector<std::pair<int64_t, int64_t>>;

inline bool has_gap(const AttentionBatch& batch, int64_t t) {
  return batch.gap_begin != nullptr && batch.gap_begin[t] < batch.gap_end[t];
}

inline bool has_selection(const AttentionArgs& args, int64_t t) {
  if (args.sel_offsets == nullptr) return false;
  const int64_t i = t * args.cache->spec().n_kv_heads;
  return args.sel_offsets[i] < args.sel_offsets[i + 1];
}

// Whether row t is walked as a run of its own.
inline bool walks_alone(const AttentionArgs& args, int64_t t) {
  return has_gap(args.batch, t) || has_selection(args, t);
}

inline void key_ranges(const AttentionArgs& args, int64_t run_begin, int64_t run_end,
                       int64_t max_ctx, int64_t g, KeyRanges& r) {
  r.clear();
  const AttentionBatch& batch = args.batch;
  if (run_end - run_begin == 1 && has_selection(args, run_begin)) {
    const int64_t bs = args.cache->spec().block_size;
    const int64_t i = run_begin * args.cache->spec().n_kv_heads + g;
    for (int32_t k = args.sel_offsets[i]; k < args.sel_offsets[i + 1]; ++k) {
      const int64_t begin = int64_t{args.sel_blocks[k]} * bs;
      const int64_t end = std::min(begin + bs, max_ctx);
      if (!r.empty() && r.back().second == begin)
        r.back().second = end;
      else
        r.emplace_back(begin, end);
    }
  } else if (run_end - run_begin == 1 && has_gap(batch, run_begin)) {
    r.emplace_back(0, batch.gap_begin[run_begin]);
    r.emplace_back(batch.gap_end[run_begin], max_ctx);
  } else {
    r.emplace_back(0, max_ctx);
  }
}

// The slots of tree row t's path from the root, by depth (positions context.. of its sequence).
inline void tree_path(const AttentionBatch& batch, int64_t t, std::vector<int64_t>& path) {
  const int64_t first_row = batch.query_start[batch.token_seq[t]];
  const int64_t context = batch.positions[first_row];
  path.assign(static_cast<size_t>(batch.positions[t] + 1 - context), -1);
  for (int64_t row = t;; row = first_row + batch.tree_parents[row]) {
    path[static_cast<size_t>(batch.positions[row] - context)] = batch.slot_mapping[row];
    if (batch.tree_parents[row] < 0) break;
  }
}

// The rows [run_begin, run_end) of a tree sequence, one at a time: each row has keys of its own
// past the context (its ancestors' slots), so rows cannot share tiles there. Trees are a few
// rows, so this costs little; the arithmetic per row is the chain's (same tiles, same order).
template <class Tile>
void attend_tree_run(const AttentionArgs& args, int64_t run_begin, int64_t run_end, int64_t g,
                     const int32_t* table, float* scratch) {
  const KvCacheSpec& shape = args.cache->spec();
  const int64_t head_dim = shape.head_dim, bs = shape.block_size, group = args.group;
  const AttentionBatch& batch = args.batch;
  const WalkScratch ws(scratch, args);
  float *run_max = ws.run_max, *run_sum = ws.run_sum, *scores = ws.scores, *acc = ws.acc;
  float *k_tile = ws.k_tile, *v_tile = ws.v_tile;
  const std::byte* k_src[kAttentionTile];
  const std::byte* v_src[kAttentionTile];
  const float* k_rows[kAttentionTile];
  const float* v_rows[kAttentionTile];
  const int64_t k_row = shape.key_row_bytes(), v_row = shape.value_row_bytes();
  // The slots of the row's path from the root, by depth (thread-local: no allocation once warm).
  thread_local std::vector<int64_t> path;
  const int64_t context = batch.positions[batch.query_start[batch.token_seq[run_begin]]];
  for (int64_t t = run_begin; t < run_end; ++t) {
    const int64_t n_ctx = int64_t{batch.positions[t]} + 1;
    tree_path(batch, t, path);
    const float* q = args.q + (t * args.n_heads + g * group) * head_dim;
    const int64_t first = (t - run_begin) * group;
    for (int64_t j0 = 0; j0 < n_ctx; j0 += kAttentionTile) {
      const int64_t nt = std::min(kAttentionTile, n_ctx - j0);
      for (int64_t i = 0; i < nt; ++i) {
        const int64_t j = j0 + i;
        const int64_t block = j < context ? table[j / bs] : path[j - context] / bs;
        const int64_t offset = j < context ? j % bs : path[j - context] % bs;
        k_src[i] = args.cache->key_run(args.layer, block, g) + offset * k_row;
        v_src[i] = args.cache->value_run(args.layer, block, g) + offset * v_row;
      }
      load_tile<Tile>(shape, k_src, v_src, nt, k_rows, v_rows, k_tile, v_tile);
      auto queries = tile_queries<Tile>(k_rows, v_rows, head_dim, args.scale, scores);
      for (int64_t h = 0; h < group; ++h)
        queries.add(q + h * head_dim, nt, acc + (first + h) * head_dim, run_max[first + h],
                    run_sum[first + h]);
      queries.flush();
    }
  }
}

}  // namespace
}  // namespace vesper::backend::cpu
