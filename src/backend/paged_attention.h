// Paged attention on the CPU over a mixed batch: prefill chunks and single-token decodes of many
// sequences in one call, reading K/V through per-sequence block tables, with no padding.
//
// Token t (at position p in sequence s) attends causally to positions 0..p of s. Its K/V must
// already be in the cache (write_kv first), so tokens of one prefill chunk see one another.
// The reduction order for a token is fixed (positions ascending), whatever the batch holds.
//
// Trees (speculative candidates verified together, as Medusa proposes them): a sequence whose
// rows carry tree parents has a context of positions 0..c-1 (c: its first row's position) read
// through its block table, and rows that attend to that context and to their own ancestors only.
// Row t at depth d (position c + d) sees, for positions c..c+d, the K/V in the slots of its
// ancestors at those depths (slot_mapping), itself last. The order of the reduction is the same
// as for a token at that position in a chain, so an accepted path's rows give exactly the bits
// plain decoding would.
#pragma once

#include <cstdint>

#include "backend/kv_cache.h"
#include "backend/kv_sparsity.h"
#include "core/thread_pool.h"

namespace vesper::backend {

// tree_parents value of rows that are not in a tree.
inline constexpr int32_t kNotInTree = -2;

struct AttentionBatch {
  int64_t num_tokens = 0;
  const int32_t* positions = nullptr;      // [num_tokens]
  const int32_t* token_seq = nullptr;      // [num_tokens] index of the token's sequence
  const int64_t* slot_mapping = nullptr;   // [num_tokens] cache slot the token's K/V go to
  const int32_t* block_tables = nullptr;   // flat; sequence s's table starts at table_offsets[s]
  const int32_t* table_offsets = nullptr;  // [num_seqs + 1]
  // Only for batches with trees (else null): [num_tokens] each row's parent as an offset among
  // its sequence's rows (-1: the root, which follows the context; kNotInTree: a row of a sequence
  // without a tree), and [num_seqs + 1] each sequence's first row.
  const int32_t* tree_parents = nullptr;
  const int32_t* query_start = nullptr;
  // KIVI caches only (else null: no group is stored quantized): [num_seqs] how many groups at the
  // front of each sequence's table are stored quantized, one block each; the table's later
  // entries hold the rows of every later group, residual_blocks_per_group() blocks per group
  // (kv_cache_spec.h). A query at position p reads the groups before
  // spec.kivi_quantized_tokens(p) quantized (those not yet stored so are quantized on the fly,
  // to the bytes storing them will give) and the rest as written, so its result depends on its
  // position alone, never on when the engine quantized which group. Every group stored quantized
  // must lie before kivi_quantized_tokens of each of the sequence's queries, and tree rows past
  // the context must lie after it.
  const int32_t* quantized_groups = nullptr;
  // Sinks + window (StreamingLLM; kv_sparsity.h), else null: [num_tokens] the positions
  // [gap_begin[t], gap_end[t]) row t does not attend (none where gap_begin >= gap_end). A row
  // with a gap attends [0, gap_begin) and [gap_end, its position], each range in tiles from its
  // start, so its result depends on its position and gap alone (the same bits in any batch);
  // the table entries wholly inside its gap are never read (they may be freed). Rows with a gap
  // are neither tree rows nor rows of a KIVI cache.
  const int32_t* gap_begin = nullptr;
  const int32_t* gap_end = nullptr;
  // Quest (query-aware block selection, Tang et al., ICML 2024), else null: [num_tokens] each
  // row's budget in tokens (0: dense). A row whose context exceeds its budget reads, through each
  // KV head, its sequence's first block, its own block (up to itself) and the
  // budget / block_size - 2 other blocks with the largest upper bound on q.k: per block, the sum
  // over the head's query heads and channels of max(q * key minimum, q * key maximum)
  // (KvCache::key_bounds), ties to the earlier block. Its blocks are walked in ascending order,
  // each run of adjacent ones in tiles from its start, so its result depends on its query and the
  // blocks' keys alone. In a KIVI cache a block is a group (block_size tokens, however many table
  // entries hold it), its bounds those of its rows as written (KvCache::key_bounds), so a choice
  // does not depend on which groups are stored quantized. Needs a cache with key bounds; rows
  // with a budget have no gap and are not tree rows.
  const int32_t* block_budget = nullptr;
};

// Stores each token's K and V rows ([num_tokens x n_kv_heads*head_dim]) into its slot, encoded
// in the cache's types (kv_codec.h). Tokens are split over the pool's threads when there are
// enough of them to pay for it; every row's bytes are the same either way.
void write_kv(KvCache& cache, int64_t layer, const AttentionBatch& batch, const float* k,
              const float* v, ThreadPool& pool);

// out[t] (n_heads x head_dim) = softmax(scale * q[t] . K) V over the token's context.
// n_heads must be a multiple of the cache's n_kv_heads (grouped-query attention). Computed with
// an online softmax over tiles of 32 key positions, in an order fixed by each token's position
// alone (cpu/attention_kernel.h has the exact contract), on the best instruction set this CPU
// has; AVX2 and portable kernels give the same bits. Allocates nothing once warmed up.
void paged_attention(const KvCache& cache, int64_t layer, const AttentionBatch& batch,
                     const float* q, int64_t n_heads, float scale, float* out, ThreadPool& pool);

}  // namespace vesper::backend
