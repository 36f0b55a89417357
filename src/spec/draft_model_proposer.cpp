#include "spec/draft_model_proposer.h"

#include <algorithm>

#include "sample/sampler.h"
#include "spec/pass_timing.h"

namespace vesper::spec {

Result<std::unique_ptr<DraftModelProposer>> DraftModelProposer::load(
    const std::string& path, backend::Backend& backend, const tokenizer::Tokenizer& target_vocab) {
  std::unique_ptr<DraftModelProposer> p(new DraftModelProposer());
  p->backend_ = &backend;
  p->path_ = path;
  VESPER_ASSIGN_OR_RETURN(p->model_, model::Model::load(path, backend));
  VESPER_ASSIGN_OR_RETURN(tokenizer::Tokenizer vocab,
                          tokenizer::Tokenizer::from_gguf(p->model_->file()));
  // Proposals are token ids: they mean the same only over the same vocabulary.
  const int32_t common = std::min(vocab.n_vocab(), target_vocab.n_vocab());
  for (int32_t id = 0; id < common; ++id)
    if (vocab.piece_view(id, true) != target_vocab.piece_view(id, true))
      return make_error("--speculative-model " + path + " and the target " + target_vocab.path() +
                        " have different vocabularies: token " + std::to_string(id) + " is \"" +
                        std::string(vocab.piece_view(id, true)) + "\" in the draft and \"" +
                        std::string(target_vocab.piece_view(id, true)) + "\" in the target");
  if (vocab.n_vocab() != target_vocab.n_vocab())
    return make_error("--speculative-model " + path + " has a vocabulary of " +
                      std::to_string(vocab.n_vocab()) + " tokens but the target " +
                      target_vocab.path() + " has " + std::to_string(target_vocab.n_vocab()) +
                      " (token " + std::to_string(common) + " is in only one of them)");
  return p;
}

DraftModelProposer::~DraftModelProposer() {
  if (backend_ == nullptr) return;
  if (device_.valid()) backend_->release_kv(device_);
  if (host_.valid()) backend_->release_kv(host_);
}

std::string DraftModelProposer::describe() const {
  return "draft model " + path_ + " (" + std::to_string(model_->config().n_layer) +
         " layers, n_embd " + std::to_string(model_->config().n_embd) + ")";
}

int64_t DraftModelProposer::weight_bytes() const {
  int64_t bytes = 0;
  for (const auto& t : model_->file().tensors()) bytes += static_cast<int64_t>(t.size_bytes);
  return bytes;
}

std::optional<backend::KvCacheSpec> DraftModelProposer::companion_spec(
    const backend::KvCacheSpec& target) const {
  backend::KvCacheSpec spec = model_->kv_spec(target.block_size, target.dtypes);
  // KIVI: the draft's cache follows the target's tables, so its blocks hold as many residual rows
  // as the target's.
  spec.kivi_residual_length = target.kivi_residual_length;
  if (backend::kv_is_kivi(target.dtypes.k) || backend::kv_is_kivi(target.dtypes.v))
    spec.residual_rows = target.residual_rows_per_block();
  return spec;
}

void DraftModelProposer::allocate(const backend::KvCacheSpec& spec, int64_t num_blocks,
                                  int64_t num_swap_blocks, const model::StepCapacity& capacity) {
  layout_ = model::KvTableLayout(spec);
  max_rows_ = capacity.tokens;
  device_ = backend_->create_kv(spec, num_blocks, backend::MemoryKind::kDevice);
  host_ = backend_->create_kv(spec, num_swap_blocks, backend::MemoryKind::kHostVisible);
  model_->reserve(
      model::StepCapacity{capacity.tokens, capacity.seqs, capacity.seqs, capacity.table_entries});
}

double DraftModelProposer::time_proposal(int64_t rows) {
  return time_pass(*model_, device_, rows, layout_.block_size);
}

void DraftModelProposer::propose(std::span<const ProposalRequest> requests,
                                 const sched::SequenceMirror& mirror, const backend::Tensor&,
                                 std::vector<Proposal>& out) {
  out.resize(requests.size());
  for (Proposal& p : out) {
    p.tokens.clear();
    p.parents.clear();
  }
  requests_.clear();
  request_index_.clear();
  for (size_t i = 0; i < requests.size(); ++i) {
    const ProposalRequest& q = requests[i];
    const sched::SequenceMirror::Entry* e = mirror.find(q.id);
    if (e == nullptr || !e->resident || q.k <= 0) continue;
    const auto length = static_cast<int64_t>(e->tokens.size());
    const int64_t k = q.k;
    const model::KvTableLayout layout = layout_.with_quantized(e->quantized_groups);
    // The draft writes positions length - 1 .. length + k - 2: they must be in the table, and in
    // blocks of this sequence's own (a block still shared after a fork holds a sibling's K/V
    // there).
    if (layout.entries_for(length + k - 1) > static_cast<int64_t>(e->block_table.size())) continue;
    bool alone = true;
    for (int64_t pos = length - 1; pos <= length + k - 2 && alone; ++pos)
      alone = mirror.block_refs(e->block_table[static_cast<size_t>(layout.entry(pos))]) == 1;
    if (!alone) continue;
    requests_.push_back({q.id, e->tokens, e->block_table, k, e->quantized_groups});
    request_index_.push_back(i);
  }
  if (requests_.empty()) return;
  propose_for(requests_, proposals_);
  for (size_t j = 0; j < requests_.size(); ++j)
    out[request_index_[j]].tokens = std::move(proposals_[j].tokens);
}

void DraftModelProposer::propose_for(std::span<const Request> requests,
                                     std::vector<Proposal>& out) {
  out.assign(requests.size(), {});
  // Pass 1: every request's catch-up (its tokens without draft K/V, the newest last), one logits
  // row each; a request past the row budget catches up partly, with no proposal this time.
  batch_.clear();
  std::vector<size_t> proposing;  // requests whose newest token is in this pass
  int64_t rows = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    const auto length = static_cast<int64_t>(r.tokens.size());
    auto it = valid_.find(r.id);
    const int64_t valid = std::min(it == valid_.end() ? 0 : it->second, length - 1);
    const int64_t room = max_rows_ - rows;
    if (room <= 0) break;
    // Rows of a quantized group cannot be written (the engine keeps a KIVI group as rows until
    // the draft has written it); such a request gets no proposal.
    if (valid < r.quantized_groups * layout_.block_size) continue;
    const int64_t n = std::min(length - valid, room);
    const bool whole = n == length - valid;
    batch_.add_sequence(r.tokens.subspan(static_cast<size_t>(valid), static_cast<size_t>(n)),
                        static_cast<int32_t>(valid), r.block_table, layout_of(r), whole ? 1 : 0);
    rows += n;
    valid_[r.id] = valid + n;
    if (whole && r.k > 0) proposing.push_back(i);
  }
  if (batch_.num_tokens() == 0) return;
  std::span<const float> logits = model_->forward(batch_, device_);
  const int64_t n_vocab = model_->config().n_vocab;
  int64_t row = 0;
  int64_t max_k = 0;
  for (size_t i : proposing) {
    out[i].tokens.push_back(sample::argmax(
        logits.subspan(static_cast<size_t>(row * n_vocab), static_cast<size_t>(n_vocab))));
    ++row;
    max_k = std::max(max_k, requests[i].k);
    proposed_[requests[i].id] =
        Proposed{static_cast<int64_t>(requests[i].tokens.size()), requests[i].k};
  }
  // Passes 2..k: each proposing request feeds its newest proposal (at position length + s - 2).
  for (int64_t s = 2; s <= max_k; ++s) {
    batch_.clear();
    for (size_t i : proposing) {
      const Request& r = requests[i];
      if (r.k < s) continue;
      const auto length = static_cast<int64_t>(r.tokens.size());
      last_.assign(1, out[i].tokens.back());
      batch_.add_sequence(last_, static_cast<int32_t>(length + s - 2), r.block_table, layout_of(r),
                          1);
    }
    logits = model_->forward(batch_, device_);
    row = 0;
    for (size_t i : proposing) {
      if (requests[i].k < s) continue;
      out[i].tokens.push_back(sample::argmax(
          logits.subspan(static_cast<size_t>(row * n_vocab), static_cast<size_t>(n_vocab))));
      ++row;
    }
  }
}

void DraftModelProposer::on_verified(kv::SeqId id, std::span<const int32_t>, int64_t num_accepted) {
  auto p = proposed_.find(id);
  if (p == proposed_.end()) return;
  // The draft wrote the K/V of the last committed token and of the first k - 1 proposals.
  valid_[id] = p->second.length + std::min(num_accepted, p->second.k - 1);
  proposed_.erase(p);
}

}  // namespace vesper::spec
