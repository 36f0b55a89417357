// DraftModelProposer: a smaller model with the target's vocabulary proposes k tokens per sequence
// by decoding k times greedily (its argmax: a one-hot q, so rejection sampling stays exact),
// batched across sequences.
//
// Its KV storage is laid out like the target's and indexed by the target's block tables (the
// same block ids, its own bytes), so it lives in the same memory plan and follows the target's
// sequences: the runner applies every plan's swaps and copy-on-write copies to it too, and an
// aborted sequence's blocks go back with the target's. Per sequence it knows how many leading
// positions hold draft K/V for the committed tokens (`valid`); before proposing it catches up on
// the rest (the tokens the target accepted, the bonus token, or a whole prompt), writing into the
// sequence's blocks. A sequence preempted by recompute, or new (it may start from cached blocks
// whose draft K/V nobody computed), starts from position 0; writing a cached block again writes
// the same values, since its tokens are the same.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "core/result.h"
#include "kv/kv_cache_manager.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace vesper::spec {

class DraftModelProposer {
 public:
  // Loads the draft at `path` on `backend`. Errors name both files when the vocabularies differ
  // (and the first token id whose text differs), or the draft file at fault.
  static Result<std::unique_ptr<DraftModelProposer>> load(const std::string& path,
                                                          backend::Backend& backend,
                                                          const tokenizer::Tokenizer& target_vocab);
  ~DraftModelProposer();

  const model::Model& model() const { return *model_; }
  model::Model& mutable_model() { return *model_; }
  // The draft's KV storage for blocks of `block_size` tokens (for the memory plan).
  backend::KvCacheSpec kv_spec(int64_t block_size, backend::KvDtypes dtypes) const {
    return model_->kv_spec(block_size, dtypes);
  }
  // Allocates the draft's device and host KV storage of `spec` (as many blocks as the target's)
  // and its activations for passes of up to `max_rows` rows.
  void allocate(const backend::KvCacheSpec& spec, int64_t num_blocks, int64_t num_swap_blocks,
                int64_t max_rows, int64_t max_seqs, int64_t max_table_entries);
  backend::KvHandle device_kv() const { return device_; }
  backend::KvHandle host_kv() const { return host_; }

  // One sequence to propose for: its committed tokens (the last one not yet computed by the
  // target), its block table (covering every position the proposals are written at: the last
  // token's and the first k - 1 proposals') and how many tokens to propose.
  struct Request {
    kv::SeqId id = 0;
    std::span<const int32_t> tokens;
    std::span<const int32_t> block_table;
    int64_t k = 0;
    // KIVI: the table's quantized groups (the target's compaction quantizes the draft's rows of
    // a group with its own, once the draft has written them: written()).
    int64_t quantized_groups = 0;
  };
  // Proposals for each request, in order (out[i] for requests[i]). Catch-up rows of all requests
  // go through one pass, at most `max_rows` of them (requests past the budget get none this
  // time); then k - 1 one-row passes.
  void propose(std::span<const Request> requests, std::vector<std::vector<int32_t>>& out);

  // After the target verified sequence `id`'s proposals: `num_accepted` of them are committed,
  // so their draft K/V (all but the last proposal's, which the draft never computed) are valid.
  void on_verified(kv::SeqId id, int64_t num_accepted);
  // Positions [0, written) of the sequence hold the draft's K/V rows: a KIVI cache may quantize
  // only groups wholly before this (the draft cannot catch up into a quantized group).
  int64_t written(kv::SeqId id) const {
    auto it = valid_.find(id);
    return it == valid_.end() ? 0 : it->second;
  }
  // The sequence's KV is gone (preempted by recompute): catch up from position 0 next time.
  void reset(kv::SeqId id) { valid_.erase(id); }
  // The sequence is finished or aborted.
  void forget(kv::SeqId id) {
    valid_.erase(id);
    proposed_.erase(id);
  }

 private:
  DraftModelProposer() = default;
  model::KvTableLayout layout_of(const Request& r) const {
    model::KvTableLayout layout = layout_;
    layout.quantized_groups = r.quantized_groups;
    return layout;
  }

  backend::Backend* backend_ = nullptr;
  std::unique_ptr<model::Model> model_;
  backend::KvHandle device_, host_;
  model::KvTableLayout layout_{16};  // the tables' geometry (the target's, KIVI included)
  int64_t max_rows_ = 0;
  // Per sequence: positions whose draft K/V match the committed tokens, and (until verified) the
  // length it had and the proposals it was given.
  std::unordered_map<kv::SeqId, int64_t> valid_;
  struct Proposed {
    int64_t length = 0;
    int64_t k = 0;
  };
  std::unordered_map<kv::SeqId, Proposed> proposed_;
  model::ForwardBatch batch_;
  std::vector<int32_t> last_;  // each request's newest token, pass by pass
};

}  // namespace vesper::spec
