#include "spec/medusa_proposer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <queue>
#include <string>

namespace vesper::spec {
namespace {

// The prior: given its path so far, a head's best candidate is right about half the time, a
// little less for each head further out, and each further rank 0.4 times as often as the one
// before. kPriorWeight trials' worth: a sequence's own measurements weigh in over tens of steps
// (on stories260K, trees from a weaker prior, which follow the first few steps' noise, accepted
// fewer tokens).
double prior(int64_t head, int64_t rank) {
  return 0.5 * std::pow(0.9, static_cast<double>(head)) * std::pow(0.4, static_cast<double>(rank));
}
constexpr double kPriorWeight = 32.0;

}  // namespace

std::vector<MedusaTreeNode> best_medusa_tree(std::span<const double> acc, int64_t num_heads,
                                             int64_t max_rank, int64_t k) {
  std::vector<MedusaTreeNode> nodes;
  if (num_heads <= 0 || max_rank <= 0 || k <= 0) return nodes;
  // Candidates: (chance of the path, order pushed, parent, head, rank). A node's first child and
  // its next sibling become candidates once it is taken, so every candidate's parent is in.
  struct Candidate {
    double chance;
    int64_t order;
    int32_t parent, head, rank;
    double parent_chance;
    bool operator<(const Candidate& o) const {
      return chance != o.chance ? chance < o.chance : order > o.order;
    }
  };
  std::priority_queue<Candidate> open;
  int64_t order = 0;
  auto a = [&](int64_t head, int64_t rank) {
    return acc[static_cast<size_t>(head * max_rank + rank)];
  };
  open.push({a(0, 0), order++, -1, 0, 0, 1.0});
  while (!open.empty() && static_cast<int64_t>(nodes.size()) < k) {
    const Candidate c = open.top();
    open.pop();
    const auto index = static_cast<int32_t>(nodes.size());
    nodes.push_back({c.parent, c.head, c.rank});
    if (c.rank + 1 < max_rank)
      open.push({c.parent_chance * a(c.head, c.rank + 1), order++, c.parent, c.head, c.rank + 1,
                 c.parent_chance});
    if (c.head + 1 < num_heads)
      open.push({c.chance * a(c.head + 1, 0), order++, index, c.head + 1, 0, c.chance});
  }
  return nodes;
}

Result<std::unique_ptr<MedusaProposer>> MedusaProposer::load(const std::string& dir,
                                                             backend::Backend& backend,
                                                             int64_t n_embd, int64_t n_vocab,
                                                             tensor::GgmlType weight_type,
                                                             bool tree) {
  std::unique_ptr<MedusaProposer> p(new MedusaProposer());
  VESPER_ASSIGN_OR_RETURN(p->heads_, MedusaHeads::load(dir, backend, n_embd, n_vocab, weight_type));
  p->tree_ = tree;
  p->max_rank_ = tree ? std::min<int64_t>(8, n_vocab) : 1;
  return p;
}

std::string MedusaProposer::describe() const {
  return "Medusa heads " + heads_->path() + " (" + std::to_string(heads_->num_heads()) +
         " heads in " + std::string(tensor::type_name(heads_->weight_type())) + ", " +
         (tree_ ? "a tree" : "a chain") + " of candidates)";
}

double MedusaProposer::time_proposal(int64_t rows) {
  const std::vector<float> hidden(static_cast<size_t>(rows) * heads_->n_embd(), 0.0f);
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    heads_->top_k(hidden, rows, 1, top_);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (rep > 0) best = std::min(best, s);
  }
  return best;
}

std::vector<double> MedusaProposer::estimates(const SeqState* s) const {
  const int64_t heads = heads_->num_heads();
  std::vector<double> acc(static_cast<size_t>(heads * max_rank_));
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t r = 0; r < max_rank_; ++r) {
      const size_t i = static_cast<size_t>(h * max_rank_ + r);
      const double hits = s != nullptr && !s->hits.empty() ? static_cast<double>(s->hits[i]) : 0.0;
      const double trials =
          s != nullptr && !s->trials.empty() ? static_cast<double>(s->trials[h]) : 0.0;
      acc[i] = (hits + kPriorWeight * prior(h, r)) / (trials + kPriorWeight);
    }
  return acc;
}

std::vector<double> MedusaProposer::acceptance_estimates(kv::SeqId id) const {
  auto it = state_.find(id);
  return estimates(it == state_.end() ? nullptr : &it->second);
}

void MedusaProposer::propose(std::span<const ProposalRequest> requests,
                             const sched::SequenceMirror&, const backend::Tensor& hidden,
                             std::vector<Proposal>& out) {
  const int64_t heads = heads_->num_heads();
  out.resize(requests.size());
  for (Proposal& p : out) {
    p.tokens.clear();
    p.parents.clear();
  }
  rows_.clear();
  with_hidden_.clear();
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].hidden_row < 0 || requests[i].k <= 0) continue;
    rows_.push_back(static_cast<int32_t>(requests[i].hidden_row));
    with_hidden_.push_back(i);
  }
  if (with_hidden_.empty()) return;
  const auto n = static_cast<int64_t>(with_hidden_.size());
  heads_->top_k(hidden, rows_, max_rank_, top_);
  for (int64_t row = 0; row < n; ++row) {
    const size_t i = with_hidden_[static_cast<size_t>(row)];
    const ProposalRequest& req = requests[i];
    SeqState& s = state_[req.id];
    s.candidates.assign(top_.begin() + row * heads * max_rank_,
                        top_.begin() + (row + 1) * heads * max_rank_);
    Proposal& p = out[i];
    if (!tree_) {
      for (int64_t h = 0; h < std::min(heads, req.k); ++h)
        p.tokens.push_back(s.candidates[static_cast<size_t>(h * max_rank_)]);
      continue;
    }
    const std::vector<double> acc = estimates(&s);
    for (const MedusaTreeNode& node : best_medusa_tree(acc, heads, max_rank_, req.k)) {
      p.tokens.push_back(s.candidates[static_cast<size_t>(node.head * max_rank_ + node.rank)]);
      p.parents.push_back(node.parent);
    }
  }
}

void MedusaProposer::on_verified(kv::SeqId id, std::span<const int32_t> true_tokens, int64_t) {
  auto it = state_.find(id);
  if (it == state_.end() || it->second.candidates.empty()) return;
  SeqState& s = it->second;
  const int64_t heads = heads_->num_heads();
  if (s.trials.empty()) {
    s.trials.assign(static_cast<size_t>(heads), 0);
    s.hits.assign(static_cast<size_t>(heads * max_rank_), 0);
  }
  // Head h's candidates were for depth h + 1, whose true token is true_tokens[h].
  for (int64_t h = 0; h < std::min<int64_t>(heads, static_cast<int64_t>(true_tokens.size())); ++h) {
    ++s.trials[static_cast<size_t>(h)];
    for (int64_t r = 0; r < max_rank_; ++r)
      if (s.candidates[static_cast<size_t>(h * max_rank_ + r)] ==
          true_tokens[static_cast<size_t>(h)]) {
        ++s.hits[static_cast<size_t>(h * max_rank_ + r)];
        break;
      }
  }
  s.candidates.clear();
}

}  // namespace vesper::spec
