// MedusaProposer: proposals from Medusa heads (spec/medusa_heads.h), as a chain or a sparse tree.
//
// The target's row at position t gave the hidden state h_t and, from it, the token x_{t+1} just
// sampled (committed, not yet computed). Head k's candidates from h_t are for x_{t+k+2}, so the
// proposals hang below x_{t+1} (the root): depth 1 comes from head 0, depth d from head d - 1.
//
// The tree: node (head, rank) takes head's rank-th best token. Among all trees of at most K
// nodes, the one kept maximises the expected number of accepted tokens, sum over nodes of the
// product of the estimated acceptance chances along the node's path (best-first search: a node's
// chance is its parent's times acc(head, rank)). acc(head, rank) is the sequence's own measured
// rate at which the true token was the head's rank-th candidate, smoothed towards a prior that
// falls with depth and rank; a sequence's tree so depends on its own history only (seeded
// requests stay reproducible whatever else runs). The hidden state is read where the target's
// forward pass left it (Model::hidden_states), in the step that sampled the token. The shape
// follows the model of Medusa's hand-tuned choice lists (more candidates near the root, where they
// are most likely to be reached) but is measured, not tuned. In chain mode, the top candidate of
// each head.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "spec/medusa_heads.h"
#include "spec/proposer.h"

namespace vesper::spec {

struct MedusaTreeNode {
  int32_t parent = -1;  // index of the parent node; -1: the root (the last committed token)
  int32_t head = 0;     // the head (depth - 1) whose candidate this is
  int32_t rank = 0;     // which of its candidates, best first
};

// acc[head * max_rank + rank]: estimated chance that the true token at the head's depth is its
// rank-th candidate. The best tree of at most `k` nodes (parents before children).
std::vector<MedusaTreeNode> best_medusa_tree(std::span<const double> acc, int64_t num_heads,
                                             int64_t max_rank, int64_t k);

class MedusaProposer : public Proposer {
 public:
  // The heads at `dir` for a target of n_embd and n_vocab whose output matrix is kept in
  // `weight_type` (MedusaHeads::load).
  static Result<std::unique_ptr<MedusaProposer>> load(const std::string& dir,
                                                      backend::Backend& backend, int64_t n_embd,
                                                      int64_t n_vocab, tensor::GgmlType weight_type,
                                                      bool tree);

  const MedusaHeads& heads() const { return *heads_; }
  MedusaHeads& heads() { return *heads_; }
  bool tree() const { return tree_; }

  std::string describe() const override;
  Cost cost() const override { return Cost::kOnePass; }
  int64_t weight_bytes() const override { return heads_->weight_bytes(); }
  // One level per head (a chain is a tree of one branch).
  int64_t max_tree_depth(int64_t k) const override { return std::min(k, heads_->num_heads()); }

  // For each request with a hidden row: its proposals (parents empty in chain mode). The heads
  // run once for all requests.
  void propose(std::span<const ProposalRequest> requests, const sched::SequenceMirror& mirror,
               const backend::Tensor& hidden, std::vector<Proposal>& out) override;

  // The tokens the target committed after the root (accepted proposals, then the token it drew):
  // the true tokens at depths 1, 2, ...
  void on_verified(kv::SeqId id, std::span<const int32_t> committed, int64_t num_accepted) override;
  void forget(kv::SeqId id) override { state_.erase(id); }
  double time_proposal(int64_t rows) override;

  // The chance estimates of a sequence (for tests): acc as best_medusa_tree reads it.
  std::vector<double> acceptance_estimates(kv::SeqId id) const;
  int64_t max_rank() const { return max_rank_; }

 private:
  MedusaProposer() = default;

  struct SeqState {
    std::vector<int32_t> candidates;  // of the last proposal: [head][rank]
    std::vector<int64_t> hits;        // [head][rank]: the true token was that candidate
    std::vector<int64_t> trials;      // [head]: the true token at its depth was known
  };
  std::vector<double> estimates(const SeqState* s) const;

  std::unique_ptr<MedusaHeads> heads_;
  bool tree_ = true;
  int64_t max_rank_ = 8;
  std::unordered_map<kv::SeqId, SeqState> state_;
  std::vector<int32_t> rows_;
  std::vector<int32_t> top_;
  std::vector<size_t> with_hidden_;
};

}  // namespace vesper::spec
