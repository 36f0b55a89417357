// DraftModelProposer: a smaller model with the target's vocabulary proposes k tokens per sequence
// by decoding k times greedily (its argmax: a one-hot q, so rejection sampling stays exact),
// batched across sequences.
//
// Its KV storage is laid out like the target's and indexed by the target's block tables (the
// same block ids, its own bytes): a companion cache (spec/proposer.h) in the same memory plan,
// which the runner moves with every plan's swaps and copy-on-write copies, and whose blocks go
// back with the target's. Per sequence it knows how many leading positions hold draft K/V for the
// committed tokens (`valid`); before proposing it catches up on the rest (the tokens the target
// accepted, the bonus token, or a whole prompt), writing into the sequence's blocks, and only
// where the sequence holds the blocks alone (a block still shared after a fork holds a sibling's
// K/V). A sequence preempted by recompute, or new (it may start from cached blocks whose draft
// K/V nobody computed), starts from position 0; writing a cached block again writes the same
// values, since its tokens are the same.
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
#include "spec/proposer.h"
#include "tokenizer/tokenizer.h"

namespace vesper::spec {

class DraftModelProposer : public Proposer {
 public:
  // Loads the draft at `path` on `backend`. Errors name both files when the vocabularies differ
  // (and the first token id whose text differs), or the draft file at fault.
  static Result<std::unique_ptr<DraftModelProposer>> load(const std::string& path,
                                                          backend::Backend& backend,
                                                          const tokenizer::Tokenizer& target_vocab);
  ~DraftModelProposer() override;

  const model::Model& model() const { return *model_; }

  std::string describe() const override;
  Cost cost() const override { return Cost::kPassPerToken; }
  int64_t weight_bytes() const override;
  std::optional<backend::KvCacheSpec> companion_spec(
      const backend::KvCacheSpec& target) const override;
  int64_t activation_bytes(const model::StepCapacity& capacity) const override {
    return model::Model::activation_bytes(model_->config(), capacity);
  }
  // The draft writes the K/V of the last committed token and of the first k - 1 proposals, past
  // what the target computes.
  int64_t lookahead_slots(int64_t k) const override { return k; }
  void allocate(const backend::KvCacheSpec& spec, int64_t num_blocks, int64_t num_swap_blocks,
                const model::StepCapacity& capacity) override;
  std::optional<std::pair<backend::KvHandle, backend::KvHandle>> companion_storage()
      const override {
    return std::make_pair(device_, host_);
  }

  // Catch-up rows of all requests go through one pass, at most the activations' row budget of
  // them (requests past the budget get none this time); then k - 1 one-row passes. A request
  // whose proposals' positions (its last committed token's and the first k - 1 proposals') are
  // not all in blocks it holds alone gets none.
  void propose(std::span<const ProposalRequest> requests, const sched::SequenceMirror& mirror,
               const backend::Tensor& hidden, std::vector<Proposal>& out) override;
  // The proposals' draft K/V (all but the last proposal's, which the draft never computed) are
  // valid as far as they were kept.
  void on_verified(kv::SeqId id, std::span<const int32_t> committed, int64_t num_accepted) override;
  void on_kv_lost(kv::SeqId id) override { valid_.erase(id); }
  void forget(kv::SeqId id) override {
    valid_.erase(id);
    proposed_.erase(id);
  }
  // Positions [0, written) of the sequence hold the draft's K/V rows: a KIVI cache may quantize
  // only groups wholly before this (the draft cannot catch up into a quantized group).
  int64_t rows_written(kv::SeqId id) const override {
    auto it = valid_.find(id);
    return it == valid_.end() ? 0 : it->second;
  }
  double time_proposal(int64_t rows) override;

 private:
  DraftModelProposer() = default;
  // One sequence to propose for: its committed tokens (the last one not yet computed by the
  // target), its block table (covering every position the proposals are written at) and how many
  // tokens to propose.
  struct Request {
    kv::SeqId id = 0;
    std::span<const int32_t> tokens;
    std::span<const int32_t> block_table;
    int64_t k = 0;
    int64_t quantized_groups = 0;  // KIVI: the table's quantized groups
  };
  void propose_for(std::span<const Request> requests, std::vector<Proposal>& out);
  model::KvTableLayout layout_of(const Request& r) const {
    return layout_.with_quantized(r.quantized_groups);
  }

  backend::Backend* backend_ = nullptr;
  std::string path_;
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
  std::vector<Request> requests_;
  std::vector<size_t> request_index_;  // requests_[j] answers requests[request_index_[j]]
  std::vector<Proposal> proposals_;
};

}  // namespace vesper::spec
