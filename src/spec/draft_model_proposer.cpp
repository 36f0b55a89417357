#include "spec/draft_model_proposer.h"

#include <algorithm>

#include "sample/sampler.h"

namespace vesper::spec {

Result<std::unique_ptr<DraftModelProposer>> DraftModelProposer::load(
    const std::string& path, backend::Backend& backend, const tokenizer::Tokenizer& target_vocab) {
  std::unique_ptr<DraftModelProposer> p(new DraftModelProposer());
  p->backend_ = &backend;
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

void DraftModelProposer::allocate(const backend::KvCacheSpec& spec, int64_t num_blocks,
                                  int64_t num_swap_blocks, int64_t max_rows, int64_t max_seqs,
                                  int64_t max_table_entries) {
  layout_ = model::KvTableLayout(spec);
  max_rows_ = max_rows;
  device_ = backend_->create_kv(spec, num_blocks, backend::MemoryKind::kDevice);
  host_ = backend_->create_kv(spec, num_swap_blocks, backend::MemoryKind::kHostVisible);
  model_->reserve(model::StepCapacity{max_rows, max_seqs, max_seqs, max_table_entries});
}

void DraftModelProposer::propose(std::span<const Request> requests,
                                 std::vector<std::vector<int32_t>>& out) {
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
    out[i].push_back(sample::argmax(
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
      last_.assign(1, out[i].back());
      batch_.add_sequence(last_, static_cast<int32_t>(length + s - 2), r.block_table, layout_of(r),
                          1);
    }
    logits = model_->forward(batch_, device_);
    row = 0;
    for (size_t i : proposing) {
      if (requests[i].k < s) continue;
      out[i].push_back(sample::argmax(
          logits.subspan(static_cast<size_t>(row * n_vocab), static_cast<size_t>(n_vocab))));
      ++row;
    }
  }
}

void DraftModelProposer::on_verified(kv::SeqId id, int64_t num_accepted) {
  auto p = proposed_.find(id);
  if (p == proposed_.end()) return;
  // The draft wrote the K/V of the last committed token and of the first k - 1 proposals.
  valid_[id] = p->second.length + std::min(num_accepted, p->second.k - 1);
  proposed_.erase(p);
}

}  // namespace vesper::spec
